"""``torchrun --nproc-per-node N -m cosmos3_core.generate ... --cfg-parallel --ulysses K --tp T``: one run on N ranks.

The router hands a resolved request with ``--cfg-parallel``, ``--ulysses K > 1`` or ``--tp T > 1`` to ``execute``.
Every rank joins the ``cfg`` × ``ulysses`` × ``tp`` mesh on its device (``cuda:LOCAL_RANK``, or the CPU with gloo for
``--device cpu``) and loads the checkpoint: a full replica, or with ``--tp T`` only its 1/T share of every
decoder-layer weight (``parallel/tensor.py``). A clip runs ``parallel.run.generate`` (the tile-parallel VAE decode
included). The other modes (windows, Transfer, action) run under ``--tp`` alone: rank 0 runs the mode's own CLI
runner, the others the same generation without writing (every rank takes part in every exchange). Rank 0 alone
prints progress, timings and a bad layout's ``error:`` line, and writes the files. A rank that cannot continue (a
peer died or timed out) prints one ``error:`` line and exits with status 1.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Callable

import torch
import torch.distributed as dist

from ..parallel.mesh import ParallelError, guarded, init_parallel
from ..request import Resolved
from . import common


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("more than one GPU (launch with torchrun --nproc-per-node N)")
    group.add_argument("--cfg-parallel", action="store_true",
                       help="run the two guidance branches on two ranks (needs guidance > 1)")
    group.add_argument("--ulysses", type=int, default=1,
                       help="Ulysses sequence-parallel degree: the generation tokens over K ranks (divides the heads)")
    group.add_argument("--tp", type=int, default=1,
                       help="tensor-parallel degree: every layer's weights split over T ranks, each holding 1/T "
                            "(divides the query heads; a model too large for one GPU)")
    group.add_argument("--parallel-timeout", type=float, default=600.0,
                       help="seconds a rank waits for a silent peer before the run fails (default 600)")


def wanted(args: argparse.Namespace) -> bool:
    return bool(args.cfg_parallel) or args.ulysses != 1 or args.tp != 1


def execute(args: argparse.Namespace, resolved: Resolved, runners: dict[str, Callable]) -> dict[str, float] | None:
    """Timings on rank 0; ``None`` on the other ranks (rank 0 reports). ``runners``: the CLI's runner per mode."""
    if resolved.mode != "clip" and (args.cfg_parallel or args.ulysses != 1):
        raise ValueError(f"--cfg-parallel / --ulysses run one clip on several GPUs; the {resolved.mode} mode is not "
                         "parallel that way (windows, Transfer and action modes run on one device, or under --tp "
                         "alone) — drop them.")
    from ..parallel.run import check_fast_modes

    check_fast_modes(resolved)
    try:
        return _execute(args, resolved, runners)
    except ParallelError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None


def _join(args: argparse.Namespace, resolved: Resolved):
    """The mesh; a bad layout or unequal devices is said once, by rank 0 (the others exit with the same status)."""
    config = common.checkpoint_config(args.checkpoint)
    try:
        return init_parallel(args.cfg_parallel, args.ulysses, tp=args.tp, guidance=resolved.sampling.guidance,
                             num_heads=config.num_attention_heads, num_kv_heads=config.num_key_value_heads,
                             device_type=args.device, timeout_s=args.parallel_timeout), config
    except ValueError:
        if int(os.environ.get("RANK", "0")) != 0:
            raise SystemExit(2) from None
        raise


def _execute(args: argparse.Namespace, resolved: Resolved, runners: dict[str, Callable]) -> dict[str, float] | None:
    from ..parallel.run import generate
    from ..parallel.tensor import TensorParallel

    mesh, config = _join(args, resolved)
    writer = mesh.rank == 0
    args.weight_sharding = TensorParallel(mesh.tp_mesh, config) if mesh.tp > 1 else None
    timings: dict[str, float] | None = {}
    if resolved.mode != "clip":  # --tp alone: every rank runs the mode; rank 0 writes
        timings = runners[resolved.mode](args, resolved) if writer else _generate_silently(args, resolved)
    else:
        pipe = common.load_pipeline(args, timings, sound=resolved.sampling.sound, device=mesh.device)

        def progress(step: int, total: int, _preview) -> None:
            if writer:
                common.print_progress(step, total)

        out = generate(pipe, resolved, mesh, callback=progress)
        if writer:
            common.write_outputs(args, pipe, resolved, out, timings)
    final_barrier(mesh.device)
    dist.destroy_process_group()
    return timings if writer else None


def _generate_silently(args: argparse.Namespace, resolved: Resolved) -> None:
    """A rank > 0's part of a non-clip mode: the same load and generation as rank 0's runner, nothing written."""
    from ..api import GENERATORS

    pipe = common.load_pipeline(args, {}, sound=resolved.sampling.sound)
    GENERATORS[resolved.mode](pipe, resolved, decode=False)


def final_barrier(device: torch.device) -> None:
    """Every rank waits for rank 0's file writes, so a failure there is seen by all."""
    with guarded("final barrier"):
        dist.barrier(device_ids=[device.index] if device.type == "cuda" else None)

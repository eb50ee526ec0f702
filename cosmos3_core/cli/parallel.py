"""``torchrun --nproc-per-node N -m cosmos3_core.generate ... --cfg-parallel --ulysses K``: one clip on N ranks.

The router hands a resolved clip with ``--cfg-parallel`` or ``--ulysses K > 1`` to ``run``. Every rank loads a full
replica on its device (``cuda:LOCAL_RANK``, or the CPU with gloo for ``--device cpu``), joins the ``cfg`` ×
``ulysses`` mesh and runs ``parallel.run.generate``; rank 0 alone prints progress and timings and writes the
files. A rank that cannot continue (a peer died or timed out) prints one ``error:`` line and exits with status 1.
"""

from __future__ import annotations

import argparse
import sys

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
    group.add_argument("--parallel-timeout", type=float, default=600.0,
                       help="seconds a rank waits for a silent peer before the run fails (default 600)")


def wanted(args: argparse.Namespace) -> bool:
    return bool(args.cfg_parallel) or args.ulysses != 1


def execute(args: argparse.Namespace, resolved: Resolved) -> dict[str, float] | None:
    """Timings on rank 0; ``None`` on the other ranks (rank 0 reports)."""
    if resolved.mode != "clip":
        raise ValueError(f"--cfg-parallel / --ulysses run one clip on several GPUs; the {resolved.mode} mode is not "
                         "parallel yet (windows, Transfer and action modes run on one device) — drop them.")
    from ..parallel.run import check_fast_modes

    check_fast_modes(resolved)
    try:
        return _execute(args, resolved)
    except ParallelError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None


def _execute(args: argparse.Namespace, resolved: Resolved) -> dict[str, float] | None:
    from ..parallel.run import generate

    config = common.checkpoint_config(args.checkpoint)
    mesh = init_parallel(args.cfg_parallel, args.ulysses, guidance=resolved.sampling.guidance,
                         num_heads=config.num_attention_heads, num_kv_heads=config.num_key_value_heads,
                         device_type=args.device, timeout_s=args.parallel_timeout)
    writer = mesh.rank == 0
    timings: dict[str, float] = {}
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


def final_barrier(device: torch.device) -> None:
    """Every rank waits for rank 0's file writes, so a failure there is seen by all."""
    with guarded("final barrier"):
        dist.barrier(device_ids=[device.index] if device.type == "cuda" else None)

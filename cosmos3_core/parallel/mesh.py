"""The process mesh of a multi-GPU run: ``torch.distributed`` + a 3-D ``DeviceMesh`` (``cfg`` × ``ulysses`` × ``tp``).

Launched by ``torchrun --nproc-per-node N`` (or ``--nnodes``): every rank runs the same program. The mesh has three
dimensions, named as the parallelism they carry:

* ``cfg`` (size 1 or 2): the guidance branches (cond, uncond) on different ranks — ``denoiser.py``;
* ``ulysses`` (size U): the generation tokens sharded across ranks, attention by heads — ``ulysses.py``;
* ``tp`` (size T): every decoder-layer linear sharded across ranks (Megatron-style, DTensor) — ``tensor.py``; each
  rank then holds 1/T of the layers' weights instead of a full replica.

Rank ``r`` sits at ``(r // (U·T), (r // T) % U, r % T)``: the ranks of one tensor-parallel group are neighbours
(same node, fastest links: they exchange twice per layer), then those of one Ulysses group. With both, a
tensor-parallel rank holds ``H/T`` query heads and Ulysses splits those ``U`` ways (``check_layout``).
Backend: NCCL on CUDA, gloo on CPU. Every collective runs under the process group's ``timeout``; ``guarded`` turns
a failed collective (a rank that died closes its connections; a stuck one hits the timeout) into one
``ParallelError`` that names this rank and the exchange, instead of a hang or a backend traceback.

``check_layout`` and ``check_same_devices`` are pure (no process group) so the bad-input rules are tested directly.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

DEFAULT_TIMEOUT_S = 600.0  # a collective waits this long for a silent peer (first steps may compile kernels)
_timeout_s = DEFAULT_TIMEOUT_S


class ParallelError(RuntimeError):
    """A multi-process run cannot continue (a peer rank stopped, or did not answer in time)."""


def head_degrees(num_heads: int, num_kv_heads: int) -> list[int]:
    """The degrees that split ``num_heads`` query heads cleanly: dividing them, and dividing the key/value heads
    or a multiple of them (each rank then reads one replicated key/value head)."""
    return [d for d in range(1, num_heads + 1)
            if num_heads % d == 0 and (num_kv_heads % d == 0 or d % num_kv_heads == 0)]


def check_heads(ulysses: int, num_heads: int, num_kv_heads: int, whose: str = "the model's") -> None:
    """Raise a clear ``ValueError`` unless ``ulysses`` splits the query heads and the key/value heads cleanly
    (``whose`` heads they are, in the message: the model's, or one tensor-parallel rank's)."""
    good = head_degrees(num_heads, num_kv_heads)
    if ulysses not in good:
        raise ValueError(
            f"--ulysses {ulysses}: the Ulysses degree must divide {whose} {num_heads} query heads and divide or be a "
            f"multiple of its {num_kv_heads} key/value heads; choose one of {good}."
        )


def check_tp(tp: int, num_heads: int, num_kv_heads: int) -> None:
    """Raise a clear ``ValueError`` unless the tensor-parallel degree ``tp`` splits the heads cleanly."""
    good = head_degrees(num_heads, num_kv_heads)
    if tp not in good:
        raise ValueError(
            f"--tp {tp}: the tensor-parallel degree must divide the model's {num_heads} query heads and divide or "
            f"be a multiple of its {num_kv_heads} key/value heads; choose one of {good}."
        )


def check_layout(
    world_size: int, cfg_parallel: bool, ulysses: int, *, guidance: float, num_heads: int, num_kv_heads: int,
    tp: int = 1,
) -> None:
    """The bad-input rules of a parallel run, each with one clear ``ValueError``."""
    if ulysses < 1:
        raise ValueError(f"--ulysses {ulysses}: the Ulysses degree must be at least 1.")
    if tp < 1:
        raise ValueError(f"--tp {tp}: the tensor-parallel degree must be at least 1.")
    cfg = 2 if cfg_parallel else 1
    if cfg_parallel and guidance == 1.0:
        raise ValueError(
            "--cfg-parallel: guidance 1 runs one branch (no negative prompt), so there is nothing to split; "
            "drop --cfg-parallel (use --ulysses or --tp to spread the one branch) or set a guidance above 1."
        )
    if world_size != cfg * ulysses * tp:
        degrees = f" × --tp {tp}" if tp != 1 else ""
        raise ValueError(
            f"world size {world_size}: {'--cfg-parallel (2)' if cfg_parallel else 'no --cfg-parallel (1)'} × "
            f"--ulysses {ulysses}{degrees} needs exactly {cfg * ulysses * tp} processes; launch "
            f"torchrun --nproc-per-node {cfg * ulysses * tp} or change the degrees."
        )
    check_tp(tp, num_heads, num_kv_heads)
    if tp == 1:
        check_heads(ulysses, num_heads, num_kv_heads)
    else:
        check_heads(ulysses, num_heads // tp, max(1, num_kv_heads // tp), whose=f"each --tp {tp} rank's")


def check_same_devices(devices: list[str]) -> None:
    """Every rank must run on the same kind of device: the ranks wait for each other every step (the slowest sets
    the pace), each holds a replica or an equal shard of the model (the smallest bounds the size), and different GPU
    models round differently (the ranks' copies of the latents would drift apart)."""
    if len(set(devices)) > 1:
        listing = ", ".join(f"rank {r}: {d}" for r, d in enumerate(devices))
        raise ValueError(
            f"unequal devices ({listing}); a parallel run needs the same GPU model and memory on every rank. "
            "Select identical GPUs with CUDA_VISIBLE_DEVICES."
        )


def device_description(device: torch.device) -> str:
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return f"{props.name} {props.total_memory // 2**20} MiB"
    return device.type


@dataclass(frozen=True)
class ParallelMesh:
    """This rank's place in the ``cfg`` × ``ulysses`` × ``tp`` mesh."""

    mesh: DeviceMesh
    device: torch.device

    @property
    def cfg(self) -> int:
        return self.mesh.size(0)

    @property
    def ulysses(self) -> int:
        return self.mesh.size(1)

    @property
    def tp(self) -> int:
        return self.mesh.size(2)

    @property
    def tp_mesh(self) -> DeviceMesh:
        """The 1-D mesh of this rank's tensor-parallel group (what ``tensor.TensorParallel`` shards over)."""
        return self.mesh["tp"]

    @property
    def cfg_rank(self) -> int:
        return self.mesh.get_local_rank("cfg")

    @property
    def cfg_group(self) -> dist.ProcessGroup:
        return self.mesh.get_group("cfg")

    @property
    def ulysses_group(self) -> dist.ProcessGroup:
        return self.mesh.get_group("ulysses")

    @property
    def rank(self) -> int:
        return dist.get_rank()

    @property
    def world_size(self) -> int:
        return dist.get_world_size()


def init_parallel(
    cfg_parallel: bool,
    ulysses: int,
    *,
    tp: int = 1,
    guidance: float,
    num_heads: int,
    num_kv_heads: int,
    device_type: str = "cuda",
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> ParallelMesh:
    """Join (or reuse) the default process group, check the layout and the devices, build the mesh."""
    global _timeout_s
    if not dist.is_initialized() and "WORLD_SIZE" not in os.environ:
        raise ValueError(
            "--cfg-parallel/--ulysses/--tp need one process per GPU: launch with "
            "torchrun --nproc-per-node N -m cosmos3_core.generate ..."
        )
    world = dist.get_world_size() if dist.is_initialized() else int(os.environ["WORLD_SIZE"])
    check_layout(world, cfg_parallel, ulysses, guidance=guidance, num_heads=num_heads, num_kv_heads=num_kv_heads,
                 tp=tp)
    _timeout_s = float(timeout_s)
    if device_type == "cuda":
        local = int(os.environ.get("LOCAL_RANK", 0))
        if local >= torch.cuda.device_count():
            raise ValueError(f"LOCAL_RANK {local}: only {torch.cuda.device_count()} CUDA devices are visible.")
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=timedelta(seconds=timeout_s),
                                device_id=device if device.type == "cuda" else None)
    mesh = init_device_mesh(device.type, (2 if cfg_parallel else 1, ulysses, tp),
                            mesh_dim_names=("cfg", "ulysses", "tp"))
    check_same_devices(all_gather_strings(device_description(device), device))
    return ParallelMesh(mesh, device)


def all_gather_strings(text: str, device: torch.device, group: dist.ProcessGroup | None = None) -> list[str]:
    """Every rank's ``text`` (≤ 255 UTF-8 bytes), in rank order — a tensor exchange, no pickling."""
    data = text.encode()[:255]
    buf = torch.zeros(256, dtype=torch.uint8, device=device)
    buf[0] = len(data)
    buf[1 : 1 + len(data)] = torch.tensor(list(data), dtype=torch.uint8)
    parts = [torch.empty_like(buf) for _ in range(dist.get_world_size(group))]
    with guarded("exchange of device descriptions"):
        dist.all_gather(parts, buf, group=group)
    return [bytes(p[1 : 1 + int(p[0])].tolist()).decode(errors="replace") for p in parts]


@contextmanager
def guarded(what: str):
    """Run a collective; a backend failure becomes one ``ParallelError`` saying which rank and which exchange."""
    try:
        yield
    except ParallelError:
        raise
    except RuntimeError as exc:
        rank = dist.get_rank() if dist.is_initialized() else "?"
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ParallelError(
            f"rank {rank}: {what} failed — another rank stopped or did not answer within {_timeout_s:g} s "
            f"({first[:200]}). See that rank's output; this run cannot continue, start it again."
        ) from exc

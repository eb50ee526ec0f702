"""``ParallelDenoiser``: the model's ``denoise_step`` contract, run by the ranks of a ``cfg`` × ``ulysses`` × ``tp``
mesh.

The sampling loop stays as it is (it knows no parallelism): it calls ``denoise_step(latents, timestep, text,
layout, sound=, action=)`` on this object instead of the model, and gets the same ``StepOutput`` — every branch's
velocities — on every rank. Each rank keeps its own copy of the scheduler state; since every rank receives the
same velocities, the copies stay identical. Two kinds of parallelism compose:

* **CFG-parallel** (``cfg`` = 2): cfg rank ``c`` runs branch ``c`` only (0 = cond, 1 = uncond) and holds only that
  branch's text K/V; the other branch is a ``RemoteText`` (its length, needed for the layout, and nothing else).
  One all-gather of the packed velocities per step over the ``cfg`` group rebuilds the two-branch output. A step
  that runs the cond branch alone (``guidance_interval``) runs on cfg rank 0 and is broadcast to rank 1.
* **Ulysses** (``ulysses`` = U > 1): the model's ``denoise_step`` runs with a ``SequenceParallel`` group; the text
  K/V of this rank is sharded by heads (``shard_text``).
* **Tensor parallel** (``tp`` = T > 1) lives in the model itself (its layers are sharded, ``tensor.py``): its
  ``prefill`` and ``denoise_step`` already run on this rank's heads, and Ulysses splits those heads further.

Same math as one process: the branch's layers see the same inputs; only the GEMM batch shapes differ (1 branch
instead of 2, N/U rows instead of N), which rounds at the last fp32 bit (tests/test_parallel.py bounds it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.distributed as dist

from ..model.layout import GenLayout, select_branch
from ..model.text_kv import TextKV
from ..model.transformer import Cosmos3Transformer, StepOutput
from ..runtime import RuntimeOptions
from .mesh import ParallelMesh, guarded
from .ulysses import SequenceParallel


@dataclass(frozen=True)
class RemoteText:
    """A guidance branch whose text K/V lives on another cfg rank: only its token count is known here."""

    token_ids: torch.Tensor  # [L] long, on the CPU

    @property
    def length(self) -> int:
        return int(self.token_ids.numel())

    def to(self, device=None, dtype=None) -> "RemoteText":
        return self


class ParallelDenoiser:
    """Wraps a ``Cosmos3Transformer`` (a full replica, or this rank's tensor-parallel shard) for one rank of
    ``mesh``."""

    def __init__(self, model: Cosmos3Transformer, mesh: ParallelMesh):
        self.model = model
        self.mesh = mesh
        attn = model.layers[0].self_attn  # this rank's heads: all of them, or its tensor-parallel share
        self.sequence_parallel = (
            SequenceParallel(mesh.ulysses_group, attn.num_heads, attn.num_kv_heads) if mesh.ulysses > 1 else None
        )

    # the parts of the model's interface the sampling loop reads
    @property
    def config(self):
        return self.model.config

    @property
    def dtype(self) -> torch.dtype:
        return self.model.dtype

    @property
    def device(self) -> torch.device:
        return self.model.device

    # ------------------------------------------------------------------ text
    def holds(self, branch: int) -> bool:
        """Whether this rank runs guidance branch ``branch`` (0 = cond, 1 = uncond) and so needs its text K/V."""
        return self.mesh.cfg == 1 or branch == self.mesh.cfg_rank

    def local_text(self, branch: int, token_ids: Sequence[int], prefill) -> TextKV | RemoteText:
        """The text entry of ``branch`` for this rank: ``prefill(token_ids)`` sharded by heads if this rank runs the
        branch, else a ``RemoteText`` (the text tower is not run for it here)."""
        ids = torch.as_tensor(list(token_ids), dtype=torch.long)
        if not self.holds(branch):
            return RemoteText(ids)
        kv = prefill(token_ids)
        return self.sequence_parallel.shard_text(kv) if self.sequence_parallel is not None else kv

    # ------------------------------------------------------------------ step
    @torch.no_grad()
    def denoise_step(
        self,
        latents: torch.Tensor,
        timestep: torch.Tensor,
        text: Sequence[TextKV | RemoteText],
        layout: GenLayout,
        sound: torch.Tensor | None = None,
        action: torch.Tensor | None = None,
        *,
        options: RuntimeOptions,
    ) -> StepOutput:
        sp = self.sequence_parallel
        if self.mesh.cfg == 1:
            return self.model.denoise_step(latents, timestep, text, layout, sound=sound, action=action,
                                           sequence_parallel=sp, options=options)
        branches, mine = layout.num_branches, self.mesh.cfg_rank
        if branches not in (1, 2) or len(text) != branches:
            raise ValueError(f"CFG-parallel: {len(text)} text entries for a layout of {branches} branches; "
                             "CFG-parallel runs 1 or 2 guidance branches.")
        group, items = self.mesh.cfg_group, latents.shape[0]  # batch items per branch
        if branches == 2 or mine == 0:
            out = self.model.denoise_step(latents, timestep, [text[mine]], select_branch(layout, mine), sound=sound,
                                          action=action, sequence_parallel=sp, options=options)
            flat = _pack(out)
        else:  # a cond-only step: cfg rank 0 runs it, this rank waits for the result
            flat = torch.empty(_packed_size(self.config, layout, items), dtype=self.dtype, device=latents.device)
        if branches == 1:
            with guarded("CFG-parallel broadcast of the cond velocities"):
                dist.broadcast(flat, group=group, group_src=0)
            return _unpack(flat[None], self.config, layout, items)
        parts = [torch.empty_like(flat) for _ in range(2)]
        with guarded("CFG-parallel all-gather of the branch velocities"):
            dist.all_gather(parts, flat, group=group)
        return _unpack(torch.stack(parts), self.config, layout, items)


def _field_shapes(config, layout: GenLayout, items: int) -> list[tuple[int, ...] | None]:
    """One branch's shapes of ``StepOutput``'s fields for ``items`` batch items (``None``: absent), as
    ``Cosmos3Transformer._heads`` makes them."""
    t, h, w = layout.latent_shape
    return [
        (items, config.latent_channel, t, h, w),
        (items, config.sound_dim, layout.sound_len) if layout.sound_len else None,
        (items, layout.action_len, config.action_dim) if layout.action_len else None,
    ]


def _packed_size(config, layout: GenLayout, items: int) -> int:
    return sum(math.prod(s) for s in _field_shapes(config, layout, items) if s is not None)


def _pack(out: StepOutput) -> torch.Tensor:
    """One branch's ``StepOutput`` → one flat vector (one exchange per step)."""
    fields = [out.vision, out.sound, out.action]
    return torch.cat([f.reshape(-1) for f in fields if f is not None])


def _unpack(flat: torch.Tensor, config, layout: GenLayout, items: int) -> StepOutput:
    """``[B, packed]`` → ``StepOutput`` with rows branch-major ``[branch 0 × items | branch 1 × items]``."""
    fields, start = [], 0
    for shape in _field_shapes(config, layout, items):
        if shape is None:
            fields.append(None)
            continue
        size = math.prod(shape)
        fields.append(flat[:, start : start + size].reshape(flat.shape[0] * items, *shape[1:]))
        start += size
    return StepOutput(*fields)

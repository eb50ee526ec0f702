"""``TextKV``: the per-layer text keys/values the generation tower reads, computed once per prompt.

Why this cache is exact (the argument of docs/architecture.md, checked by ``tests/test_transformer_parity.py``):
in the Cosmos3 Mixture-of-Transformers the text (understanding) tokens receive only ``embed_tokens(ids)`` — no
timestep embedding, no modality embedding — sit at positions ``0..L-1``, and attend causally to text only; no
text query ever reads a generation key. So every layer's text keys and values depend on the prompt's token ids
alone, not on the latents, the timestep, the fps, the resolution or the sound stream. diffusers recomputes them at
every step for both guidance branches; we compute them once per prompt (``Cosmos3Transformer.prefill``) and every
denoising step reads them.

The keys are stored exactly as the generation pathway consumes them: after ``norm_k`` (Nano/Super) or
``k_norm_und_for_gen`` (Edge) and after the text RoPE.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class TextKV:
    """Text K/V of one prompt. ``keys``/``values``: ``[num_layers, num_kv_heads, L, head_dim]``."""

    keys: torch.Tensor
    values: torch.Tensor
    token_ids: torch.Tensor  # [L] long, on the CPU — identifies the prompt

    @property
    def length(self) -> int:
        return self.keys.shape[2]

    @property
    def device(self) -> torch.device:
        return self.keys.device

    def to(self, device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> "TextKV":
        keys, values = self.keys.to(device=device, dtype=dtype), self.values.to(device=device, dtype=dtype)
        return TextKV(keys, values, self.token_ids)


@dataclass(frozen=True)
class TextConditioning:
    """Both guidance branches' text K/V for one prompt pair, plus the clip shape the prompts describe (what a text
    encode hands to the sampler; ``uncond`` is None on a distilled checkpoint, which has one branch)."""

    cond: TextKV
    uncond: TextKV | None
    num_frames: int
    height: int
    width: int
    fps: float
    prompt_text: str = ""
    negative_text: str = ""
    # the prompts' K/V in other FP8 modes of the text tower (NVIDIA's W8A8 steps), by the modes of its linears,
    # kept across plans only where one run owns this conditioning and its model (a long video's windows: pass {});
    # None: each plan computes them afresh (``Cosmos3Pipeline.text_in_precision``) on the model it samples
    in_precision: dict | None = field(default=None, compare=False, repr=False)

    def to(self, device: torch.device | str) -> "TextConditioning":
        cond = self.cond.to(device)
        uncond = None if self.uncond is None else cond if self.uncond is self.cond else self.uncond.to(device)
        return dataclasses.replace(self, cond=cond, uncond=uncond, in_precision=None)

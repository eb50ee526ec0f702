"""The one attention entry point of cosmos3_core.

Mirrors what diffusers 0.42.1 ``Cosmos3AttnProcessor`` runs through its ``native`` backend:
``scaled_dot_product_attention(q, k, v, is_causal=..., enable_gqa=True)`` with scale 1/√head_dim.
Grouped-query attention (32 query heads over 8 key/value heads on Nano) stays grouped: measured on an H200 with
torch 2.11 (bench/results_run2.json), SDPA's default dispatch runs ``enable_gqa`` on cuDNN attention at the same
speed as with the key/value heads expanded (720p: 57.1 vs 57.2 ms, 578 TFLOP/s; FlashAttention-2 363), so expanding
them would only cost copies and memory.

Layout: ``q`` ``[B, H, Sq, hd]``, ``k``/``v`` ``[B, KV, Sk, hd]`` → ``[B, H, Sq, hd]``. ``mask`` (boolean,
broadcastable to ``[B, H, Sq, Sk]``, True = attend) serves the reasoner's static-cache decode; with a mask on CUDA the
grouped K/V heads are expanded, since the fused SDPA kernels reject ``enable_gqa`` together with a mask.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False, mask: torch.Tensor | None = None
) -> torch.Tensor:
    groups = q.shape[1] // k.shape[1]
    if mask is not None and groups > 1 and q.is_cuda:
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        groups = 1
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=groups > 1)

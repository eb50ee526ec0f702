"""The one attention entry point of cosmos3_core.

Mirrors what diffusers 0.42.1 ``Cosmos3AttnProcessor`` runs through its ``native`` backend:
``scaled_dot_product_attention(q, k, v, is_causal=..., enable_gqa=True)`` with scale 1/√head_dim.
Grouped-query attention (32 query heads over 8 key/value heads on Nano) is handled here, once: backends that
accept ``enable_gqa`` get it; on CUDA the key/value heads are expanded so PyTorch can dispatch to cuDNN or
FlashAttention, which do not take ``enable_gqa``.

Layout: ``q`` ``[B, H, Sq, hd]``, ``k``/``v`` ``[B, KV, Sk, hd]`` → ``[B, H, Sq, hd]``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False) -> torch.Tensor:
    groups = q.shape[1] // k.shape[1]
    if groups > 1 and q.is_cuda:
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=groups > 1)

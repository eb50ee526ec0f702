"""Fast mode (approximate, opt-in): FP8 (e4m3) GEMMs for the generation tower's linear layers.

Not a reference behaviour: diffusers 0.42.1 runs bf16 (its FP8 path is a W8A16 checkpoint schedule). Here each
bias-free linear layer of the generation tower (``add_q/k/v_proj``, ``to_add_out``, ``mlp_moe_gen``) gets an FP8
copy of its weight with one scale per output channel, and each call quantizes its input with one scale per token,
then runs ``torch._scaled_mm`` (Hopper FP8 tensor cores, bf16 output). The text tower, norms, the attention core,
the modality heads and the time embedder stay bf16/fp32 (an 8-bit attention kernel of ours, INT8 scores and FP8
values in Triton, measured 1.6x *slower* than cuDNN's bf16 attention on the H200 and was dropped). Outputs differ
from exact mode at FP8 rounding level; docs/benchmark-log.md has the quality check (first-step x0 cosine, latent cosine
and PSNR of decoded frames on the same seed, calibrated against bf16 rounding alone).

``enable_fp8(model)`` swaps the modules in place (the bf16 originals are kept, so ``disable_fp8`` restores exact
mode without reloading); it needs a CUDA device with FP8 support (compute capability ≥ 8.9).
"""

from __future__ import annotations

import torch
from torch import nn

from .transformer import Cosmos3Transformer

E4M3_MAX = 448.0
_ATTN = ("add_q_proj", "add_k_proj", "add_v_proj", "to_add_out")
_MLP = ("gate_proj", "up_proj", "down_proj")


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[M, K]`` → (e4m3 ``[M, K]``, fp32 scale ``[M, 1]``) with ``x ≈ q · scale`` row by row."""
    scale = x.abs().amax(dim=1, keepdim=True).float().clamp_min(1e-12) / E4M3_MAX
    return (x.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn), scale


class Fp8Linear(nn.Module):
    """Drop-in for a bias-free ``nn.Linear``: per-output-channel FP8 weight, per-token FP8 activation."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        if linear.bias is not None:
            raise ValueError("Fp8Linear: only bias-free linear layers are converted.")
        self.original = linear
        weight, scale = quantize_rows(linear.weight.detach())
        self.register_buffer("weight_fp8", weight, persistent=False)  # [out, in] row-major
        self.register_buffer("weight_scale", scale.t().contiguous(), persistent=False)  # [1, out]

    @property
    def weight(self) -> torch.Tensor:  # callers that read .weight (dtype/device queries) see the bf16 original
        return self.original.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        m = rows.shape[0]
        if m % 16:  # FP8 tensor-core GEMMs want every dimension a multiple of 16
            rows = torch.nn.functional.pad(rows, (0, 0, 0, 16 - m % 16))
        q, scale = quantize_rows(rows)
        out = torch._scaled_mm(q, self.weight_fp8.t(), scale_a=scale, scale_b=self.weight_scale,
                               out_dtype=x.dtype, use_fast_accum=True)
        return out[:m].reshape(*x.shape[:-1], out.shape[-1])


def _targets(model: Cosmos3Transformer):
    for layer in model.layers:
        for name in _ATTN:
            yield layer.self_attn, name
        for name in _MLP:
            if hasattr(layer.mlp_moe_gen, name):
                yield layer.mlp_moe_gen, name


def enable_fp8(model: Cosmos3Transformer) -> int:
    """Swap the generation tower's linear layers for ``Fp8Linear``; returns how many were converted."""
    device = model.device
    if device.type != "cuda" or torch.cuda.get_device_capability(device) < (8, 9):
        raise ValueError("fp8 fast mode needs a CUDA GPU with FP8 tensor cores (Ada/Hopper or newer).")
    count = 0
    for parent, name in _targets(model):
        module = getattr(parent, name)
        if isinstance(module, nn.Linear):
            setattr(parent, name, Fp8Linear(module))
            count += 1
    return count


def disable_fp8(model: Cosmos3Transformer) -> None:
    """Back to exact mode: restore the bf16 modules."""
    for parent, name in _targets(model):
        module = getattr(parent, name)
        if isinstance(module, Fp8Linear):
            setattr(parent, name, module.original)

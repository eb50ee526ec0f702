"""The relative error the parity tests bound: ``rel(ours, reference) = ||ours - reference|| / ||reference||``.

The norm is the Frobenius norm over every element, computed in float64 on the CPU (so a bf16 or CUDA tensor, a numpy
array, a PIL image or a nested list all work). A reference of norm 0 divides by 1e-30 instead, so the result is
finite: 0 when both are zero, huge otherwise.
"""
from __future__ import annotations

import numpy as np
import torch


def _float64(x) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.detach().to(device="cpu", dtype=torch.float64)
    return torch.as_tensor(np.asarray(x)).double()


def rel(a, b) -> float:
    """``||a - b|| / ||b||`` in float64 (``b`` is the reference; see the module docstring)."""
    a, b = _float64(a), _float64(b)
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


__all__ = ["rel"]

"""FP8 fast mode pieces that run without a GPU: the row-wise quantizer, and the clear refusal on the CPU."""

from __future__ import annotations

import pytest
import torch

from cosmos3_core.model.fp8 import E4M3_MAX, enable_fp8, quantize_rows
from cosmos3_core.model.loader import load_transformer


def test_row_quantizer_round_trips_within_e4m3_precision():
    x = torch.randn(64, 256, generator=torch.Generator().manual_seed(0)) * torch.logspace(-3, 3, 64)[:, None]
    q, scale = quantize_rows(x)
    assert q.dtype == torch.float8_e4m3fn and scale.shape == (64, 1)
    assert torch.allclose(q.float().abs().amax(dim=1), torch.full((64,), E4M3_MAX))  # each row uses the full range
    err = (q.float() * scale - x).abs() / x.abs().amax(dim=1, keepdim=True)
    assert err.max() < 2**-4  # e4m3 keeps 3 mantissa bits
    assert err.max() > 0


def test_enable_fp8_refuses_a_cpu_model(tiny_checkpoint):
    model = load_transformer(tiny_checkpoint("edge"), dtype=torch.float32)
    with pytest.raises(ValueError, match="needs a CUDA GPU with FP8"):
        enable_fp8(model)

"""The batch-1 GEMV entry point (cosmos3_core.kernels.gemv): its Triton kernel's arithmetic against float64, run here through
Triton's CPU interpreter (``TRITON_INTERPRET=1``, in a subprocess: the switch is read when the kernel is defined),
and the route rules on a machine without CUDA. The CUDA kernel itself is checked in tests/test_gpu.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from cosmos3_core.kernels import gemv as g

ROOT = Path(__file__).resolve().parents[1]

_INTERPRETED = r"""
import json, sys, torch
from cosmos3_core.kernels import gemv as g
kernel, out = g._kernel(), []
for n, k, block_n, block_k, dtype in json.loads(sys.argv[1]):
    torch.manual_seed(n * 7 + k)
    dtype = getattr(torch, dtype)
    w, x = torch.randn(n, k, dtype=dtype), torch.randn(k, dtype=dtype)
    y = torch.full((n,), float("nan"), dtype=dtype)
    kernel[(g.triton_grid(n, block_n),)](x, w, y, n, k, w.stride(0), BLOCK_N=block_n, BLOCK_K=block_k)
    exact = w.double() @ x.double()
    out.append([float((y.double() - exact).abs().max()), float(exact.abs().max()), bool(y.isnan().any())])
print(json.dumps(out))
"""


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_interpreted_kernel_matches_float64_on_ragged_shapes(dtype):
    pytest.importorskip("triton")
    # rows and columns that are not multiples of the blocks (masked tails), a single block, several K tiles
    cases = [(37, 1100, 8, 512), (5, 64, 8, 512), (64, 2048, 4, 1024), (3, 4097, 2, 256)]
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", _INTERPRETED, str([[*c, dtype] for c in cases]).replace("'", '"')],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    import json

    # fp32 products summed in fp32: error ~ K·eps32; a half-precision output adds one rounding, at most one unit in
    # the last place of the largest output (2^-10 / 2^-7 of it; the interpreter's bf16 conversion truncates)
    rel_tol = {"float32": 1e-5, "float16": 2 ** -10, "bfloat16": 2 ** -7}[dtype]
    for (n, k, *_), (err, scale, has_nan) in zip(cases, json.loads(proc.stdout)):
        assert not has_nan, f"rows left unwritten at {n}x{k}"
        assert err <= rel_tol * scale, (n, k, err, scale)


def test_cpu_inputs_take_f_linear_bit_for_bit():
    w, x = torch.randn(48, 32, dtype=torch.bfloat16), torch.randn(1, 1, 32, dtype=torch.bfloat16)
    assert g.select_route(x, w) == "torch"
    assert torch.equal(g.gemv(x, w), F.linear(x, w))
    many = torch.randn(3, 32, dtype=torch.bfloat16)  # more than one row: always F.linear
    assert torch.equal(g.gemv(many, w), F.linear(many, w))


def test_routes_are_checked_with_a_clear_message():
    from cosmos3_core.checks import check_options
    from cosmos3_core.runtime import RuntimeOptions

    with pytest.raises(ValueError, match="gemv='fast'.*'torch' forces F.linear"):
        RuntimeOptions(gemv="fast")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="gemv='triton': the Triton GEMV cannot run here \\(no CUDA device\\)"):
            check_options(RuntimeOptions(gemv="triton"))
    assert g.select_route(torch.randn(8), torch.randn(4, 8), route="torch") == "torch"
    with pytest.raises(RuntimeError, match="'triton' cannot run"):  # forced on inputs it cannot take: no fallback
        g.select_route(torch.randn(8), torch.randn(4, 8), route="triton")

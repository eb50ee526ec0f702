"""Batch-1 projections ``y = x · Wᵀ`` (one input row, a ``[N, K]`` weight): the one GEMV entry point of the
reasoner's decode step, a Triton kernel on CUDA that streams the weight near the memory bandwidth, ``F.linear``
everywhere else.

A batch-1 decode step is a chain of matrix-vector products, each bound by reading its weight once from HBM. On an
H200 cuBLAS reads the text towers' decode weights at 1.4–4.1 TB/s of the 4.8 TB/s datasheet rate (worst on the
small square ``to_out`` and the tall-K ``down_proj``); this kernel reads them at 2.1–4.6 TB/s (per shape in
``TUNED`` below; Nano's whole decode step: 3.71 instead of 4.23 ms of GEMVs per token). Each program takes
``block_n`` whole rows of ``W`` and walks ``K`` in ``block_k``-wide coalesced tiles, multiplying in fp32 into a
``[block_n, block_k]`` register accumulator that is summed across once at the end: fp32 accumulation of bf16/fp16
products as cuBLAS does, in another (fixed, deterministic) order, and one rounding to the output dtype, so results
equal ``F.linear``'s up to that rounding (tests/test_gemv.py, tests/test_gpu.py).

Used when all of these hold, else ``F.linear``: the route (``RuntimeOptions.gemv``, carried to the kernel by the step's
``LayerWeights.route``) is ``"triton"``, or ``"auto"`` on a CUDA device of compute
capability ≥ 8.0 where Triton imports; ``x`` holds one row; ``x``/``W`` are CUDA bf16/fp16 of one dtype; ``W`` has
unit stride along ``K`` (the packed views of packed.py qualify). Forcing ``"triton"`` where it cannot run raises.
The kernel is a registered custom op (``cosmos3::gemv_<module>``) with a fake implementation, so a
``torch.compile``d decode layer keeps it in one graph and fuses the elementwise work around it; a CUDA graph
captures it like any kernel.
"""

from __future__ import annotations

import functools
import re

import torch
import torch.nn.functional as F

from .support import constant_result, import_failure, unavailable_reason

_DTYPES = (torch.bfloat16, torch.float16)


@functools.lru_cache(maxsize=None)
def _kernel():
    """The jitted Triton kernel, or the import error's text (looked up once per process)."""
    try:
        import triton
        import triton.language as tl
    except Exception as exc:  # noqa: BLE001 — any import failure means "not available", reported by reason
        return import_failure("Triton", exc)

    @triton.jit
    def gemv_rows(x_ptr, w_ptr, y_ptr, N, K, stride_wn, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        row_ok = rows < N
        cols = tl.arange(0, BLOCK_K)
        w_rows = w_ptr + rows.to(tl.int64)[:, None] * stride_wn
        acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        for k in range(0, K, BLOCK_K):
            col_ok = k + cols < K
            w = tl.load(w_rows + (k + cols)[None, :], mask=row_ok[:, None] & col_ok[None, :], other=0.0,
                        eviction_policy="evict_first")
            xk = tl.load(x_ptr + k + cols, mask=col_ok, other=0.0)
            acc += w.to(tl.float32) * xk.to(tl.float32)[None, :]
        tl.store(y_ptr + rows, tl.sum(acc, axis=1).to(y_ptr.dtype.element_ty), mask=row_ok)

    return gemv_rows


_reasons: dict[int, str] = {}


def _triton_check(major: int, minor: int) -> str:
    if major < 8:
        return f"GPU compute capability sm{major}{minor}; the kernel is tuned for sm80 and newer"
    found = _kernel()
    return found if isinstance(found, str) else ""


def triton_unavailable_reason(device: torch.device | None = None) -> str:
    """Empty if the Triton GEMV can run on the CUDA ``device`` (default: the current one), else why not."""
    return unavailable_reason(_reasons, device, _triton_check)


@constant_result
def _triton_ready(index: int) -> bool:
    """Whether the kernel can run on CUDA device ``index`` (a constant to ``torch.compile``: never graph-breaks)."""
    return not triton_unavailable_reason(torch.device("cuda", index))


# (N, K) → (block_n, block_k, num_warps): the fastest of 38 launch configurations for each decode GEMV of the three
# text towers, timed on an H200 as the decode runs them (one weight per layer back to back in a CUDA graph;
# a one-off probe, docs/benchmark-log.md "Batch-1 GEMV"). Weight bandwidth there, ours vs cuBLAS, in TB/s.
TUNED = {
    (4096, 2048): (4, 512, 4),  # Edge q/k/v packed: 2.77 vs 2.34
    (2048, 2048): (4, 1024, 8),  # Edge to_out: 2.11 vs 1.38
    (9216, 2048): (16, 256, 8),  # Edge up_proj (relu²): 3.50 vs 3.34
    (2048, 9216): (4, 1024, 8),  # Edge down_proj: 3.46 vs 2.50
    (131072, 2048): (16, 256, 4),  # Edge lm_head: 4.50 vs 4.15
    (6144, 4096): (8, 512, 4),  # Nano q/k/v packed: 3.66 vs 3.11
    (4096, 4096): (4, 2048, 4),  # Nano to_out: 3.36 vs 2.53
    (24576, 4096): (4, 2048, 4),  # Nano gate/up packed: 4.29 vs 4.06
    (4096, 12288): (4, 2048, 4),  # Nano down_proj: 4.07 vs 3.35
    (151936, 4096): (4, 2048, 4),  # Nano lm_head: 4.62 vs 4.12
    (10240, 5120): (8, 256, 4),  # Super q/k/v packed: 4.03 vs 3.79
    (5120, 8192): (2, 4096, 4),  # Super to_out: 3.95 vs 3.32
    (51200, 5120): (8, 256, 4),  # Super gate/up packed: 4.45 vs 3.99
    (5120, 25600): (8, 512, 8),  # Super down_proj: 4.27 vs 3.71
    (151936, 5120): (8, 1024, 8),  # Super lm_head: 4.57 vs 4.10
}


def launch_config(n: int, k: int) -> tuple[int, int, int]:
    """``(block_n, block_k, num_warps)`` for an ``[n, k]`` weight: the tuned entry, else whole 2,048-wide tiles of four
    rows where they divide ``K`` (best or within 1 % of it on every Nano shape) and 8 × 512 tiles (within 2 % of the
    best on every Super shape, whose ``K`` they divide) otherwise."""
    return TUNED.get((n, k)) or ((4, 2048, 4) if k % 2048 == 0 else (8, 512, 8))


# One op per copy of this module (ComfyUI imports the pack under its folder's name: see attention.py).
_OP_NAME = "cosmos3::gemv_" + re.sub(r"\W", "_", __name__)


@torch.library.custom_op(_OP_NAME, mutates_args=())
def triton_gemv(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x`` (``K`` contiguous elements) · ``weight`` ``[N, K]`` (unit stride along ``K``)ᵀ → ``[N]``."""
    n, k = weight.shape
    y = torch.empty(n, dtype=x.dtype, device=x.device)
    block_n, block_k, warps = launch_config(n, k)
    _kernel()[(triton_grid(n, block_n),)](x, weight, y, n, k, weight.stride(0), BLOCK_N=block_n, BLOCK_K=block_k,
                                           num_warps=warps)
    return y


@triton_gemv.register_fake
def _(x, weight):
    return x.new_empty(weight.shape[0])


def triton_grid(n: int, block_n: int) -> int:
    return -(-n // block_n)


def select_route(x: torch.Tensor, weight: torch.Tensor, route: str = "auto") -> str:
    """``"triton"`` or ``"torch"`` for these inputs under the ``route`` setting (``RuntimeOptions.gemv``)."""
    if route == "torch":
        return "torch"
    fits = (x.is_cuda and x.dtype in _DTYPES and weight.dtype == x.dtype and weight.device == x.device
            and weight.dim() == 2 and weight.stride(1) == 1 and x.numel() == weight.shape[1] and x.is_contiguous())
    if fits and _triton_ready(x.device.index if x.device.index is not None else 0):
        return "triton"
    if route == "triton":
        raise RuntimeError(
            f"GEMV route 'triton' cannot run a {x.dtype} {x.device.type} input of shape {tuple(x.shape)} against a "
            f"{weight.dtype} weight of shape {tuple(weight.shape)} (it needs one CUDA bf16/fp16 row and a weight with "
            "unit stride along K); use the GEMV route 'auto' or 'torch'."
        )
    return "torch"


def gemv(x: torch.Tensor, weight: torch.Tensor, route: str = "auto") -> torch.Tensor:
    """``F.linear(x, weight)`` for an ``x`` ``[..., K]`` holding one row: ``[..., N]``, on ``route``."""
    if select_route(x, weight, route) == "triton":
        return triton_gemv(x, weight).view(*x.shape[:-1], weight.shape[0])
    return F.linear(x, weight)

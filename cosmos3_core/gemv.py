"""Batch-1 projections ``y = x · Wᵀ`` (one input row, a ``[N, K]`` weight): the one GEMV entry point of the
reasoner's decode step, a Triton kernel on CUDA that streams the weight near the memory bandwidth, ``F.linear``
everywhere else.

A batch-1 decode step is a chain of matrix-vector products, each bound by reading its weight once from HBM. cuBLAS
reads the text tower's square and tall-K matrices well below the bandwidth on an H200 (BENCHMARKS.md: Nano's
``to_out`` 4096×4096 at 2.9 TB/s, ``down_proj`` 4096×12288 at 3.5 TB/s, of ≈ 4.3 TB/s that a device copy
reaches). The kernel here gives each program ``block_n`` whole rows of ``W`` and walks ``K`` in ``block_k``-wide
coalesced tiles, multiplying in fp32 into a ``[block_n, block_k]`` register accumulator that is summed across once
at the end: fp32 accumulation of bf16/fp16 products as cuBLAS does, in another (fixed, deterministic) order, and
one rounding to the output dtype. Results therefore equal ``F.linear`` up to that rounding (tests/test_gpu.py).

Used when all of these hold, else ``F.linear``: the route is ``"triton"``, or ``"auto"`` on a CUDA device of compute
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

ROUTES = ("auto", "triton", "torch")
_DTYPES = (torch.bfloat16, torch.float16)
_route = "auto"


def set_gemv_route(name: str) -> str:
    """``auto`` (the Triton kernel where it can run), ``triton`` (an error where it cannot) or ``torch``
    (always ``F.linear``). Returns the previous setting."""
    global _route
    if name not in ROUTES:
        raise ValueError(f"GEMV route {name!r} is not one of {ROUTES}; 'torch' forces F.linear.")
    if name == "triton" and triton_unavailable_reason():
        raise RuntimeError(f"GEMV route 'triton' cannot run here: {triton_unavailable_reason()}. Use 'auto' or 'torch'.")
    previous, _route = _route, name
    return previous


def gemv_route() -> str:
    return _route


@functools.lru_cache(maxsize=None)
def _kernel():
    """The jitted Triton kernel, or the import error's text (looked up once per process)."""
    try:
        import triton
        import triton.language as tl
    except Exception as exc:  # noqa: BLE001 — any import failure means "not available", reported by reason
        return f"Triton does not import ({type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''})"

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


def triton_unavailable_reason(device: torch.device | None = None) -> str:
    """Empty if the Triton GEMV can run on the CUDA ``device`` (default: the current one), else why not."""
    if not torch.cuda.is_available():
        return "no CUDA device"
    index = device.index if device is not None and device.index is not None else torch.cuda.current_device()
    if index not in _reasons:
        major, minor = torch.cuda.get_device_capability(index)
        if major < 8:
            _reasons[index] = f"GPU compute capability sm{major}{minor}; the kernel is tuned for sm80 and newer"
        else:
            found = _kernel()
            _reasons[index] = found if isinstance(found, str) else ""
    return _reasons[index]


@torch.compiler.assume_constant_result
def _triton_ready(index: int) -> bool:
    """Whether the kernel can run on CUDA device ``index`` (a constant to ``torch.compile``: never graph-breaks)."""
    return not triton_unavailable_reason(torch.device("cuda", index))


def launch_config(n: int, k: int) -> tuple[int, int, int]:
    """``(block_n, block_k, num_warps)`` for an ``[n, k]`` weight (measured on an H200: BENCHMARKS.md)."""
    return (8, 512, 4) if k <= 4096 else (4, 1024, 4)


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


def select_route(x: torch.Tensor, weight: torch.Tensor) -> str:
    """``"triton"`` or ``"torch"`` for these inputs under the current route setting."""
    if _route == "torch":
        return "torch"
    fits = (x.is_cuda and x.dtype in _DTYPES and weight.dtype == x.dtype and weight.device == x.device
            and weight.dim() == 2 and weight.stride(1) == 1 and x.numel() == weight.shape[1] and x.is_contiguous())
    if fits and _triton_ready(x.device.index if x.device.index is not None else 0):
        return "triton"
    if _route == "triton":
        raise RuntimeError(
            f"GEMV route 'triton' cannot run a {x.dtype} {x.device.type} input of shape {tuple(x.shape)} against a "
            f"{weight.dtype} weight of shape {tuple(weight.shape)} (it needs one CUDA bf16/fp16 row and a weight with "
            "unit stride along K); use set_gemv_route('auto') or 'torch'."
        )
    return "torch"


def gemv(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``F.linear(x, weight)`` for an ``x`` ``[..., K]`` holding one row: ``[..., N]``."""
    if select_route(x, weight) == "triton":
        return triton_gemv(x, weight).view(*x.shape[:-1], weight.shape[0])
    return F.linear(x, weight)

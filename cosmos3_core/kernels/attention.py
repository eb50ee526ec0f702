"""The one attention entry point of cosmos3_core: PyTorch SDPA everywhere, FlashAttention-4 where it pays.

Mirrors what diffusers 0.42.1 ``Cosmos3AttnProcessor`` runs through its ``native`` backend:
``scaled_dot_product_attention(q, k, v, is_causal=..., enable_gqa=True)`` with scale 1/√head_dim.
Grouped-query attention (32 query heads over 8 key/value heads on Nano) stays grouped: measured on an H200 with
torch 2.11 (docs/benchmark-log.md), SDPA's default dispatch runs ``enable_gqa`` on cuDNN attention at the same
speed as with the key/value heads expanded (720p: 57.1 vs 57.2 ms, 578 TFLOP/s; FlashAttention-2 363), so expanding
them would only cost copies and memory.

**FlashAttention-4** (the optional PyPI package ``flash-attn-4``, ``flash_attn.cute.flash_attn_func``; its
CuTe-DSL Hopper kernel) computes the same exact softmax attention ~1.16× faster than cuDNN on our shapes (H200,
docs/benchmark-log.md). It is used when all of these hold, else SDPA: the backend is ``"flash4"``, or ``"auto"`` with at
least ``FLASH4_MIN_QUERIES`` query tokens (the run's ``RuntimeOptions.attention``, runtime.py: the CLI's
``--attention`` / the nodes' ``attention`` input), the package imports, the tensors are CUDA bf16/fp16 on an sm90
(Hopper) GPU, ``head_dim`` is 64/96/128, the query heads are a multiple of the key/value heads and there is no ``mask``.
Forcing ``"flash4"`` where it cannot run raises (no silent fallback); ``"sdpa"`` never touches it. The call is a
registered custom op (``cosmos3::flash4_attention_<module>``) with a fake (meta) implementation, so ``torch.compile``
traces through it instead of breaking the graph at every layer.

**Causal text attention** (each prompt's prefill, generator and reasoner) runs through SDPA on CUDA with cuDNN left
out (FlashAttention-2, else the math kernel): cuDNN builds an execution plan for every new shape, and every new
prompt is a new length. Measured on an H200 (docs/benchmark-log.md, Nano, a guidance pair of ~1,400 + ~65 tokens): the
pair's prefill at a length not seen before took 0.19–0.22 s with cuDNN against 0.05–0.06 s repeated; with
FlashAttention-2 0.055–0.063 s new, 0.054 s repeated. Same exact softmax attention, another kernel's rounding.

Layout: ``q`` ``[B, H, Sq, hd]``, ``k``/``v`` ``[B, KV, Sk, hd]`` → ``[B, H, Sq, hd]``. ``mask`` (boolean,
broadcastable to ``[B, H, Sq, Sk]``, True = attend) serves the reasoner's static-cache decode.

**Decode route** (one query token with a boolean mask, backend ``auto``/``flash4``): transformers'
``eager_attention_forward`` (Qwen3-VL / Llama: ``softmax(q·kᵀ·scale + mask, fp32) → input dtype, · v``) with the
query heads viewed as ``[KV, groups]`` against the un-expanded cache instead of ``repeat_kv``'s copies: each
(head, key) product is the same, only the copy of the whole cache per layer and token (``groups``×: 4 on Nano, 2 on
Edge) disappears, and it is a handful of small kernels (two batched GEMMs and a softmax) instead of SDPA's masked
kernel (H200, docs/benchmark-log.md: batch-1 decode Nano 96.8 → 107.6 tokens/s, Edge 143 → 223). Backend
``"sdpa"`` keeps SDPA for it too: with a mask on CUDA the grouped K/V heads are then expanded, since the fused SDPA
kernels reject ``enable_gqa`` together with a mask.
"""

from __future__ import annotations

import functools
import re

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from .caches import enable_persistent_caches
from .support import constant_result, import_failure, unavailable_reason

_FLASH4_HEAD_DIMS = (64, 96, 128)
_FLASH4_DTYPES = (torch.bfloat16, torch.float16)
# "auto" takes FlashAttention-4 from this many query tokens on: below it, its per-call host cost (Python interface,
# JIT-cache lookup, launch) outweighs the faster kernel (H200: T2I's 920 tokens 58.2 vs 48.1 ms per compiled guided
# step with SDPA; 256p's 2,880 tokens 0.1539 vs 0.1569 s; 480p 0.584 vs 0.610 s; 720p 5.53 vs 6.12 s).
FLASH4_MIN_QUERIES = 2048


def flash4_available() -> bool:
    """Whether FlashAttention-4 can run on the current CUDA device: what a compiled graph of ``attention`` under
    ``auto`` bakes in besides its arguments (part of the compiled generation layer's cache key)."""
    return torch.cuda.is_available() and not flash4_unavailable_reason()


@functools.lru_cache(maxsize=None)
def _flash4_import():
    """``flash_attn.cute.flash_attn_func`` or the import error's text (looked up once per process)."""
    enable_persistent_caches()  # its kernels are JIT-compiled per configuration: keep them on disk
    try:
        from flash_attn.cute import flash_attn_func
    except Exception as exc:  # noqa: BLE001 — any import failure means "not available", reported by reason
        return import_failure("flash-attn-4", exc)
    return flash_attn_func


_reasons: dict[int, str] = {}


def _flash4_check(major: int, minor: int) -> str:
    if major != 9:
        return f"GPU compute capability sm{major}{minor}, its Hopper kernel needs sm90"
    found = _flash4_import()
    return found if isinstance(found, str) else ""


def flash4_unavailable_reason(device: torch.device | None = None) -> str:
    """Empty if FlashAttention-4 can run on the CUDA ``device`` (default: the current one), else why not."""
    return unavailable_reason(_reasons, device, _flash4_check)


@constant_result
def _flash4_ready(device_type: str, index: int) -> bool:
    """Whether the kernel can run on this device (a constant to ``torch.compile``: the check never graph-breaks)."""
    return device_type == "cuda" and not flash4_unavailable_reason(torch.device("cuda", index))


def select_route(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None = None, backend: str = "auto") -> str:
    """``"flash4"``, ``"decode"`` or ``"sdpa"`` for these inputs under the ``backend`` setting (runtime.py)."""
    if backend == "sdpa":
        return "sdpa"
    if mask is not None:
        return "decode" if q.shape[2] == 1 and mask.dtype == torch.bool and q.shape[1] % k.shape[1] == 0 else "sdpa"
    index = q.device.index if q.device.index is not None else 0
    fits = q.dtype in _FLASH4_DTYPES and q.shape[-1] in _FLASH4_HEAD_DIMS and q.shape[1] % k.shape[1] == 0
    if fits and (backend == "flash4" or q.shape[2] >= FLASH4_MIN_QUERIES) and _flash4_ready(q.device.type, index):
        return "flash4"
    if backend == "flash4":
        raise RuntimeError(
            f"attention backend 'flash4' cannot run {q.dtype} {q.device.type} inputs with head_dim {q.shape[-1]} "
            f"and {q.shape[1]}/{k.shape[1]} query/key heads (it needs CUDA bf16/fp16 on sm90, head_dim "
            f"{_FLASH4_HEAD_DIMS}); use attention 'auto' or 'sdpa'."
        )
    return "sdpa"


# SDPA kernels for causal text attention on CUDA: no per-shape plan (see the module docstring); math where flash
# cannot run (fp32, head_dim > 256).
_CAUSAL_CUDA_KERNELS = (SDPBackend.FLASH_ATTENTION, SDPBackend.MATH)


def sdpa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                   mask: torch.Tensor | None = None) -> torch.Tensor:
    groups = q.shape[1] // k.shape[1]
    if mask is not None and groups > 1 and q.is_cuda:
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        groups = 1
    if causal and mask is None and q.is_cuda and q.shape[2] == k.shape[2]:  # square: every kernel aligns it alike
        with sdpa_kernel(list(_CAUSAL_CUDA_KERNELS)):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=groups > 1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=groups > 1)


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """One query token per head against a (static) cache under a boolean ``mask``: transformers' eager attention
    arithmetic (scores in the input dtype, scaled after the product, fp32 softmax cast back, then ``· v``) with the
    ``groups = H / KV`` query heads of each key/value head batched together — no expanded copy of ``k``/``v``."""
    b, h, _, hd = q.shape
    kv, sk = k.shape[1], k.shape[2]
    groups = h // kv
    scores = torch.matmul(q.reshape(b, kv, groups, hd), k.transpose(-1, -2)) * hd ** -0.5  # [B, KV, G, Sk]
    allowed = torch.broadcast_to(mask, (b, h, 1, sk)).reshape(b, kv, groups, sk)
    scores = torch.where(allowed, scores, float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(probs, v).reshape(b, h, 1, v.shape[-1])


# One op per copy of this module: ComfyUI imports the pack under its folder's name, so a process running the CLI code
# and the node pack (the test suite does) holds two copies, and each must call its own kernel lookup.
_OP_NAME = "cosmos3::flash4_attention_" + re.sub(r"\W", "_", __name__)


@torch.library.custom_op(_OP_NAME, mutates_args=())
def flash4_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """FlashAttention-4 forward in this module's ``[B, H, S, hd]`` layout (its kernel reads ``[B, S, H, hd]``
    strided views; scale 1/√hd as SDPA; grouped-query heads native)."""
    out, _ = _flash4_import()(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=causal)
    return out.transpose(1, 2)


@flash4_attention.register_fake
def _(q, k, v, causal):
    return q.new_empty((q.shape[0], q.shape[2], q.shape[1], v.shape[-1])).transpose(1, 2)


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False, mask: torch.Tensor | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Softmax attention of ``q`` over ``k``/``v`` on the route ``backend`` (``RuntimeOptions.attention``) picks
    for these inputs. ``backend`` is an argument, never a global: a compiled caller passes it in, so each setting is
    its own graph."""
    route = select_route(q, k, mask, backend)
    if route == "flash4":
        return flash4_attention(q, k, v, causal)
    if route == "decode":
        return decode_attention(q, k, v, mask)
    return sdpa_attention(q, k, v, causal, mask)

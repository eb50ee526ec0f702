"""The CUDA libraries a first run calls, loaded ahead of it on an idle thread.

A process pays for each CUDA library route once, at its first call: the first cuBLAS GEMM creates the thread's
cuBLAS handle (cuBLASLt shares it on CUDA) and its workspace; the first cuDNN convolution or cuDNN attention loads
cuDNN's engine libraries (several hundred MB of shared objects that ``libcudnn.so`` opens only when first asked) and
creates a cuDNN handle; and CUDA loads each kernel lazily, at its first launch. A ComfyUI server's first Cosmos3 run
meets all of them in its text encode and VAE decode nodes (1.0–1.5 s and 0.6–0.8 s against 0.23 s and 0.07 s warm
on an H100 machine) — together with those nodes' first moves of the text tower (≈ 0.6 s) and the VAE to the GPU,
which a second run does not make either: what the libraries cost is the rest, at most.

``load_cuda_libraries`` makes one tiny call of each route a Cosmos3 run takes (``ROUTES``: a bf16 GEMM with and
without a bias; the VAE decoder's channels-last 3-D convolutions, 3×3×3 and 1×3×3 with its padding; grouped-query
attention with head_dim 128 through the pack's own entry point, causal as the text prefill runs it and not as the
generation layer does) on the calling thread, which then ends. torch keeps cuBLAS and cuDNN handles in per-device
pools; a thread's handles return to the pool when it ends and the next thread's first call takes them
(``DeviceThreadHandlePool``); cuBLAS workspaces are kept per (handle, stream), so the run's thread, on the same
default stream, finds the workspace too; the libraries opened are the process's. Not ahead: per-shape choices
(cuDNN's engine for a real convolution's shape, cuBLASLt's algorithm for a GEMM's) and the real shapes' own kernels,
which load at their first launch. The GPU memory it leaves is what the run's first calls would have left: the
handles' workspaces.

A ComfyUI server's preload (``caches.preload_first_run``) calls it only with ``COSMOS3_PRELOAD_CUDA_LIBRARIES=1``
until a GPU measurement shows that it pays: ``bench/probe_first_cuda_calls.py`` (each route's first call at a run's
sizes, with and without this ahead) and ``bench/lent/cuda_libraries.sh`` (a restarted server's first T2I, off and on).
"""

from __future__ import annotations

import contextlib
import logging
import time

import torch
import torch.nn.functional as F

from .attention import sdpa_attention

_log = logging.getLogger(__name__)


def _conv3d(x: torch.Tensor, kernel: tuple[int, int, int]) -> torch.Tensor:
    """The VAE decoder's convolution: channels-last 3-D, no temporal padding (the causal history is in ``x``)."""
    inputs = x.view(1, 16, 4, 8, 8).contiguous(memory_format=torch.channels_last_3d)
    weight = x.new_ones(16, 16, *kernel).contiguous(memory_format=torch.channels_last_3d)
    return F.conv3d(inputs, weight, x[0, :16], padding=(0, 1, 1))


def _attention(x: torch.Tensor, causal: bool) -> torch.Tensor:
    """Grouped-query attention as the model's layers call it: 4 query heads over 1 key/value head, head_dim 128."""
    q, kv = x.view(1, 4, 8, 128), x[:8].view(1, 1, 8, 64).repeat(1, 1, 1, 2)
    return sdpa_attention(q, kv, kv, causal=causal)


# One tiny call per route, each on a 64×64 bf16 tensor ``x`` (4,096 elements, viewed as each call's input).
ROUTES = {
    "gemm": lambda x: x @ x,
    "gemm_bias": lambda x: F.linear(x, x, x[0]),
    "vae_conv3d": lambda x: _conv3d(x, (3, 3, 3)),
    "vae_conv3d_spatial": lambda x: _conv3d(x, (1, 3, 3)),
    "attention": lambda x: _attention(x, causal=False),
    "causal_attention": lambda x: _attention(x, causal=True),
}


def load_cuda_libraries(device: torch.device) -> float:
    """``ROUTES`` called once each on ``device`` (a CUDA device; any other runs them there, as the tests do),
    synchronised; the seconds it took. Never raises: a route that fails is logged (debug) and skipped, and the
    run's own first call reports the real error."""
    start = time.perf_counter()
    cuda = torch.device(device).type == "cuda"
    try:
        with torch.no_grad(), (torch.cuda.device(device) if cuda else contextlib.nullcontext()):
            x = torch.full((64, 64), 0.01, device=device, dtype=torch.bfloat16)  # no draw from the global RNG
            for name, call in ROUTES.items():
                try:
                    call(x)
                except Exception as e:  # noqa: BLE001 — a head start only
                    _log.debug("the CUDA library route %s was not loaded ahead (%s: %s)", name, type(e).__name__, e)
            if cuda:
                torch.cuda.synchronize(device)
    except Exception as e:  # noqa: BLE001 — an error the routes left on the device surfaces here; the run reports it
        _log.debug("the CUDA libraries were not loaded ahead (%s: %s)", type(e).__name__, e)
    return time.perf_counter() - start

"""The CUDA libraries a first run calls, loaded ahead of it on an idle thread.

A process pays for each CUDA library route once, at its first call: the first cuBLAS GEMM creates the thread's
cuBLAS and cuBLASLt handles and their workspace; the first cuDNN convolution loads cuDNN's engine libraries (several
hundred MB of shared objects that ``libcudnn.so`` opens only when a convolution first asks) and creates a cuDNN
handle; the first fused attention loads its kernels' module (CUDA loads modules lazily, at a kernel's first launch).
A restarted ComfyUI server's first Cosmos3 run meets all of them (its text encode, sampler and VAE decode nodes
took 0.5–1.4 s more each than in the second run on an H100 machine, their saved graphs' load included).

``load_cuda_libraries`` makes one tiny call of each route — a bf16 GEMM with and without a bias (cuBLAS, cuBLASLt),
a bf16 3-D and 2-D convolution (cuDNN), bf16 scaled-dot-product attention (its fused kernels) — on the calling
thread, which then ends. torch keeps the handles in per-device pools that a thread's handles return to when it ends
and the next thread's first call takes from (``DeviceThreadHandlePool``), and the loaded libraries and modules are
the process's: the run's thread finds them ready. Per-shape choices (cuDNN's engine for a real convolution's
shape, cuBLASLt's algorithm for a GEMM's) are still made at that shape's first call. The GPU memory it leaves is
what the run's first calls would have left: the handles' workspaces.

A ComfyUI server's preload (``caches.preload_first_run``) calls it only with ``COSMOS3_PRELOAD_CUDA_LIBRARIES=1``
until a GPU measurement shows that it pays: ``bench/probe_first_cuda_calls.py`` (each route's first call, with and
without the ahead load) and ``bench/lent/cuda_libraries.sh`` (a restarted server's first T2I, off and on).
"""

from __future__ import annotations

import logging
import time

import torch
import torch.nn.functional as F

_log = logging.getLogger(__name__)


# One tiny call per route, each on a 64×64 bf16 tensor ``x`` (4,096 elements, viewed as each call's input).
ROUTES = {
    "cublas": lambda x: x @ x,
    "cublaslt": lambda x: F.linear(x, x, x[0]),
    "cudnn_conv3d": lambda x: F.conv3d(x.view(1, 16, 4, 8, 8), x.new_ones(16, 16, 3, 3, 3), padding=1),
    "cudnn_conv2d": lambda x: F.conv2d(x.view(1, 4, 32, 32), x.new_ones(4, 4, 3, 3), padding=1),
    "attention": lambda x: F.scaled_dot_product_attention(*(x.view(1, 2, 32, 64),) * 3),
}


def load_cuda_libraries(device: torch.device) -> float:
    """``ROUTES`` called once each on ``device`` (a CUDA device), synchronised; the seconds it took. A route that
    fails is logged (debug) and skipped: the run's own first call reports the real error."""
    start = time.perf_counter()
    with torch.no_grad(), torch.cuda.device(device):
        x = torch.randn(64, 64, device=device, dtype=torch.bfloat16)
        for name, call in ROUTES.items():
            try:
                call(x)
            except Exception as e:  # noqa: BLE001 — a head start only
                _log.debug("the CUDA library route %s was not loaded ahead (%s: %s)", name, type(e).__name__, e)
        torch.cuda.synchronize(device)
    return time.perf_counter() - start

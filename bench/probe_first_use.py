"""What each GPU library's first use costs a fresh process, on the shapes a Cosmos3 run uses.

A process's first generation pays costs no later run pays: CUDA context, cuBLAS handle and kernel modules, cuDNN's
library load and per-shape plan, Triton modules. This probe times them one by one, each the first time and again,
in a new process (nothing imported from the pack, so nothing warmed before it): bf16 GEMM (cuBLAS), generation
attention through SDPA's default dispatch (cuDNN on Hopper) at 256p's and 480p's lengths, the same through SDPA's
FlashAttention-2 kernel, causal text attention, a bf16 3D convolution (the VAE's cuDNN route), and a tiny compiled
function (Triton) — to attribute the seconds that ``bench_first_run.py`` finds in a process's first sampling outside
compilation.

    python3 bench/probe_first_use.py --out probe.json   # bench/results_probe_first_use.json holds two such processes
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

HEADS, KV_HEADS, HEAD_DIM, HIDDEN, TEXT = 32, 8, 128, 4096, 1546  # Nano's attention; the video template's prompt


def timed(fn, repeats: int = 2) -> list[float]:
    """Seconds of ``fn()`` (GPU waited for), ``repeats`` times in a row: the first use, then a warm call."""
    out = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out.append(round(time.perf_counter() - start, 4))
    return out


def generation_attention(tokens: int, backend=None):
    q = torch.randn(1, HEADS, tokens, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    kv = torch.randn(2, 1, KV_HEADS, TEXT + tokens, HEAD_DIM, device="cuda", dtype=torch.bfloat16)

    def call():
        if backend is None:
            return F.scaled_dot_product_attention(q, kv[0], kv[1], enable_gqa=True)
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(q, kv[0], kv[1], enable_gqa=True)
    return call


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    res: dict = dict(torch=torch.__version__, cudnn=torch.backends.cudnn.version())
    start = time.perf_counter()
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    res["cuda_context_s"] = round(time.perf_counter() - start, 4)
    res["device"] = torch.cuda.get_device_name()
    a = torch.randn(5760, HIDDEN, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(HIDDEN, HIDDEN, device="cuda", dtype=torch.bfloat16)
    res["gemm_bf16_s"] = timed(lambda: a @ w)
    res["gemm_bf16_new_shape_s"] = timed(lambda: a[:1840] @ w[:, :1024])
    res["sdpa_default_256p_s"] = timed(generation_attention(2880 + 197))
    res["sdpa_default_480p_s"] = timed(generation_attention(9360 + 197))
    res["sdpa_flash2_256p_s"] = timed(generation_attention(2880 + 197, SDPBackend.FLASH_ATTENTION))
    t = torch.randn(1, HEADS, 1500, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        res["sdpa_causal_text_s"] = timed(lambda: F.scaled_dot_product_attention(t, t, t, is_causal=True))
    x = torch.randn(1, 384, 4, 60, 104, device="cuda", dtype=torch.bfloat16)
    conv = torch.nn.Conv3d(384, 384, 3, padding=1).to("cuda", torch.bfloat16)
    with torch.no_grad():
        res["conv3d_bf16_s"] = timed(lambda: conv(x))
    f = torch.compile(lambda y: torch.nn.functional.silu(y) * 2 + 1)
    y = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    res["compiled_pointwise_first_s"] = timed(lambda: f(y))
    res["total_s"] = round(time.perf_counter() - start, 2)
    Path(args.out).write_text(json.dumps(res, indent=1))
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()

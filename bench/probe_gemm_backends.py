"""Probe: the generation step's GEMMs on cuBLAS, cuBLASLt and inductor's autotuned Triton templates.

Rows = both guidance branches' generation tokens (+197 sound tokens for video) of a Nano step; the seven GEMMs of a
generation layer as they run (``F.linear``, weight ``[out, in]``, bf16, fp32 accumulation): q ``4096→4096``, k/v
``4096→1024``, out ``4096→4096``, gate/up ``4096→12288``, down ``12288→4096``. Per shape and backend: best of
``--repeats`` CUDA-event timings of ``--iters`` calls, TFLOP/s, and the max abs difference from cuBLAS.

Backends: ``cublas`` (torch's default), ``cublaslt`` (``torch.backends.cuda.preferred_blas_library``),
``triton`` (``torch.compile`` with ``max_autotune`` and Triton templates only), ``triton_tma`` (the same with
``triton.enable_persistent_tma_matmul``).

    python3 bench/probe_gemm_backends.py --shapes t2i,256p --out results_probe_gemm_backends.json
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F

ROWS = {"t2i": 2 * 920, "256p": 2 * (2880 + 197), "480p": 2 * (9360 + 197), "720p": 2 * (44160 + 197)}
GEMMS = {"q": (4096, 4096), "kv": (4096, 1024), "out": (4096, 4096), "gate_up": (4096, 12288),
         "down": (12288, 4096)}  # (in, out)


def timed(fn, iters: int, repeats: int) -> float:
    for _ in range(3):
        fn()
    best = float("inf")
    for _ in range(repeats):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        stop.record()
        stop.synchronize()
        best = min(best, start.elapsed_time(stop) / iters)
    return best  # ms


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="t2i,256p")
    ap.add_argument("--backends", default="cublas,cublaslt,triton,triton_tma")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    import torch._inductor.config as ic

    res = dict(torch=torch.__version__, device=torch.cuda.get_device_name(), rows=ROWS, results={})
    for shape in args.shapes.split(","):
        m = ROWS[shape]
        for name, (k, n) in GEMMS.items():
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
            ref = F.linear(x, w)
            flop = 2 * m * n * k
            row = {}
            for backend in args.backends.split(","):
                t0 = time.perf_counter()
                try:
                    if backend in ("cublas", "cublaslt"):
                        torch.backends.cuda.preferred_blas_library(backend)
                        fn = lambda: F.linear(x, w)  # noqa: E731
                    else:
                        torch.backends.cuda.preferred_blas_library("cublas")
                        torch._dynamo.reset()
                        opts = {"max_autotune": True, "max_autotune_gemm_backends": "TRITON",
                                "triton.enable_persistent_tma_matmul": backend == "triton_tma"}
                        with ic.patch(opts):
                            compiled = torch.compile(F.linear, dynamic=False, options=opts)
                            compiled(x, w)
                        fn = lambda: compiled(x, w)  # noqa: E731
                    y = fn()
                    ms = timed(fn, args.iters, args.repeats)
                    row[backend] = dict(ms=round(ms, 4), tflops=round(flop / ms / 1e9, 1),
                                        max_abs_diff=float((y.float() - ref.float()).abs().max()),
                                        setup_s=round(time.perf_counter() - t0, 1))
                except Exception as e:  # noqa: BLE001 — a probe: record and go on
                    row[backend] = dict(error=f"{type(e).__name__}: {str(e)[:300]}")
                print(shape, name, backend, row[backend], flush=True)
            torch.backends.cuda.preferred_blas_library("cublas")
            res["results"][f"{shape}/{name}"] = dict(m=m, k=k, n=n, **row)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()

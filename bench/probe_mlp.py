"""The generation tower's SwiGLU MLP up-projection on the H200: cuBLAS + a separate SiLU·mul against one GEMM with
the gated activation in its epilogue (QuACK's ``gemm_gated``, CuTe DSL, ships with flash-attn-4).

Per shape (rows = both guidance branches' tokens of a Nano step), Nano widths (D 4096, F 12288), random bf16:

* ``cublas_split``  — ``gate_proj(x)``, ``up_proj(x)`` (two cuBLAS GEMMs, what the step runs), then ``silu(g)·u``
  compiled by inductor into one Triton kernel (as in the compiled step);
* ``cublas_packed`` — one cuBLAS GEMM over the packed ``[gate; up]`` weight, then the same SiLU·mul;
* ``quack_default`` / ``quack_tuned`` — ``gemm_gated(x, W.T, activation="swiglu", concat_layout=("B",))``, no
  pre-activation stored; ``tuned=False`` (QuACK's default tile config) / ``tuned=True`` (its autotuner; the first
  call's autotuning time is reported);
* the same with the down projection appended (whole MLP).

Times are CUDA-event means over 20 calls after warm-up; error = max |out − float64 reference| / max |reference|.

    python bench/probe_mlp.py --out bench/results_probe_mlp.json
"""

from __future__ import annotations

import argparse
import json
import time

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

from probe_step import events_ms  # noqa: E402

SHAPES = {"t2i": 1840, "256p": 2 * (2880 + 197), "480p": 2 * (9360 + 197), "720p": 2 * (44160 + 197)}
D, FF = 4096, 12288


def warm_events_ms(fn, iters: int = 20) -> float:
    fn()  # warm-up (a first call may JIT-compile or pick a kernel)
    return events_ms(fn, iters)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default="t2i,256p,480p,720p")
    args = ap.parse_args()
    res: dict = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, shapes={})
    try:
        t0 = time.perf_counter()
        from quack.gemm_interface import gemm_gated
        res["quack_import_s"] = round(time.perf_counter() - t0, 2)
    except Exception as exc:  # noqa: BLE001
        res["quack_import_error"] = f"{type(exc).__name__}: {exc}"
        gemm_gated = None
    g = torch.Generator(device="cuda").manual_seed(0)
    w = (torch.randn(2 * FF, D, device="cuda", generator=g) * D ** -0.5).bfloat16()  # [gate; up] rows
    wd = (torch.randn(D, FF, device="cuda", generator=g) * FF ** -0.5).bfloat16()
    wg, wu = w[:FF], w[FF:]
    silu_mul = torch.compile(lambda a, b: F.silu(a) * b, dynamic=False)

    for name in args.shapes.split(","):
        m = SHAPES[name]
        x = torch.randn(m, D, device="cuda", generator=g).bfloat16()
        x64 = x.double()
        g64, u64 = x64 @ w[:FF].double().t(), x64 @ w[FF:].double().t()
        ref = F.silu(g64) * u64
        scale = ref.abs().max().item()
        row: dict = dict(rows=m, tflop_up=round(2 * m * D * 2 * FF / 1e12, 3))

        def split(x=x):
            return silu_mul(F.linear(x, wg), F.linear(x, wu))

        def packed(x=x):
            gu = F.linear(x, w)
            return silu_mul(gu[:, :FF], gu[:, FF:])

        variants = {"cublas_split": split, "cublas_packed": packed}
        if gemm_gated is not None:
            for tuned in (False, True):
                key = "quack_tuned" if tuned else "quack_default"

                def q(tuned=tuned, x=x):
                    return gemm_gated(x, w.t(), activation="swiglu", concat_layout=("B",), store_preact=False,
                                      tuned=tuned)[1]
                try:
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    q()
                    torch.cuda.synchronize()
                    row[f"{key}_first_call_s"] = round(time.perf_counter() - t0, 2)
                    variants[key] = q
                except Exception as exc:  # noqa: BLE001
                    row[f"{key}_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        for key, fn in variants.items():
            out = fn()
            err = ((out.double() - ref).abs().max().item()) / scale
            ms = warm_events_ms(fn)
            ms_mlp = warm_events_ms(lambda fn=fn: F.linear(fn(), wd))
            row[key] = dict(ms=round(ms, 3), tflops=round(row["tflop_up"] / ms * 1e3, 1), rel_err=float(f"{err:.3g}"),
                            mlp_ms=round(ms_mlp, 3))
        res["shapes"][name] = row
        print(name, json.dumps(row), flush=True)
        with open(args.out, "w") as f:  # after every shape: a run cut short keeps what it measured
            json.dump(res, f, indent=1)
        del x, x64, g64, u64, ref
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

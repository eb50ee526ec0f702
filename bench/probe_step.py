"""Where one compiled guided denoising step spends its GPU time, per kernel class, on full-size random-weight Nano.

Builds our transformer only (no diffusers model), prefills a 1,500-token and a 60-token prompt (timed, eager, after
a warm-up: one prompt at a time, and the pair in one pass as the pipeline runs it; each profiled), compiles the generation layer, and for each shape times the
two-branch step (CUDA events, after two warm-up steps) and profiles three steps with torch.profiler. Kernels are
grouped by name and by class — GEMM (cuBLAS ``nvjet``/``gemm``/CUTLASS), attention (cuDNN / FlashAttention),
Triton (inductor's fused element-wise and reduction kernels), other (copies, concatenations) — with µs per step.

    python bench/probe_step.py --out bench/results_probe_step.json [--shapes t2i,256p]   (--shapes "": prefill only)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_generation import COND_TOKENS, RESOLUTIONS, UNCOND_TOKENS, build_ours  # noqa: E402


def kernel_class(name: str) -> str:
    low = name.lower()
    if "nvjet" in low or "gemm" in low or "cutlass" in low or "xmma" in low:
        return "gemm"
    if "fmha" in low or "flash" in low or "sdpa" in low or "attention" in low:
        return "attention"
    if low.startswith("triton"):
        return "triton"
    return "other"


def kernel_rows(prof, calls: int) -> list[dict]:
    """The profiled CUDA kernels, slowest first, per call of the profiled function (``calls`` of them)."""
    rows = []
    for ev in prof.key_averages():
        if ev.device_type.name != "CUDA" or ev.count == 0:
            continue
        rows.append(dict(name=ev.key[:110], cls=kernel_class(ev.key), calls_per_step=round(ev.count / calls, 1),
                         us_per_step=round(ev.device_time_total / calls, 1)))
    return sorted(rows, key=lambda r: -r["us_per_step"])


def by_class(prof, calls: int) -> dict[str, float]:
    """GPU milliseconds per kernel class per call."""
    classes: dict[str, float] = {}
    for r in kernel_rows(prof, calls):
        classes[r["cls"]] = classes.get(r["cls"], 0.0) + r["us_per_step"] / 1e3
    return {k: round(v, 2) for k, v in classes.items()}


def events_ms(fn, iters: int = 5) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default="t2i,256p")
    args = ap.parse_args()
    from torch.profiler import ProfilerActivity, profile

    from cosmos3_core.model.layout import build_layout

    model = build_ours("cuda")
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 151000, (n,), generator=g).tolist() for n in (COND_TOKENS, UNCOND_TOKENS)]
    kvs = [model.prefill(p) for p in prompts]
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(3):
        kvs = [model.prefill(p) for p in prompts]
    torch.cuda.synchronize()
    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
               "prefill_both_s": round((time.perf_counter() - t0) / 3, 4)}
    model.prefill_many(prompts)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(3):
        kvs = model.prefill_many(prompts)  # the pair in one pass, as the pipeline runs it
    torch.cuda.synchronize()
    results["prefill_pair_one_pass_s"] = round((time.perf_counter() - t0) / 3, 4)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        model.prefill_many(prompts)
        torch.cuda.synchronize()
    results["prefill_pair_gpu_ms_by_class"] = by_class(prof, 1)
    print("prefill", {k: v for k, v in results.items() if k.startswith("prefill")}, flush=True)
    for n, p in zip((COND_TOKENS, UNCOND_TOKENS), prompts):  # each prompt alone: wall time and GPU time by class
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            t0 = time.perf_counter()
            model.prefill(p)
            torch.cuda.synchronize()
            wall = time.perf_counter() - t0
        classes = by_class(prof, 1)
        results[f"prefill_{n}"] = dict(wall_ms=round(wall * 1e3, 2), gpu_ms_by_class=classes,
                                       gpu_ms_total=round(sum(classes.values()), 2))
        print(f"prefill {n} tokens", results[f"prefill_{n}"], flush=True)
    model.compile_generation_layers(True)
    for name in filter(None, args.shapes.split(",")):
        h, w, frames = RESOLUTIONS[name]
        shape = (1, 48, (frames - 1) // 4 + 1, h // 16, w // 16)
        latents = torch.randn(shape, generator=g).to("cuda")
        t = torch.tensor(900, device="cuda")
        layout = build_layout(model.config, [kv.length for kv in kvs], shape[2:], 24.0, device="cuda",
                              dtype=torch.bfloat16)
        step = lambda latents=latents, t=t, layout=layout: model.denoise_step(latents, t, kvs, layout)  # noqa: E731
        step(), step()
        torch.cuda.synchronize()
        step_ms = events_ms(step)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                step()
            torch.cuda.synchronize()
        kernels = kernel_rows(prof, 3)
        classes = by_class(prof, 3)
        results[name] = dict(step_ms=round(step_ms, 2), gpu_ms_by_class=classes,
                             gpu_ms_total=round(sum(classes.values()), 2), kernels=kernels[:30])
        print(name, {k: v for k, v in results[name].items() if k != "kernels"}, flush=True)
        for r in kernels[:16]:
            print("  ", r, flush=True)
    Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

"""Speed and memory of this pack vs diffusers 0.42.1 on full-size, random-weight Cosmos3-Nano, in one GPU run.

Both sides use the *same* weights (ours is loaded from diffusers' state dict, sharing storage), the same prompt
lengths (cond ≈ 1,500 tokens like a JSON-upsampled prompt, uncond ≈ 60) and bf16. Per resolution it times one
guided denoising step — ours: one batched two-branch ``denoise_step`` over cached text K/V; diffusers: its
pipeline's two full ``Cosmos3OmniTransformer.forward`` passes — and reports seconds, the ratio, achieved TFLOP/s
(``common.step_flops``: linear + attention core, both branches) and peak GPU memory; ``--compile`` adds the step with
``RuntimeOptions(compile=True)`` (the compiled generation layer). End to end (text prefill, 35 guided steps, VAE
decode, audio decode) runs for the shapes given with ``--e2e``, through the pipeline's stages with one
``RuntimeOptions`` per run (``encode_text`` → ``sample`` → ``decode_video`` → ``decode_sound``), both towers
resident as the CLI keeps them; with ``--compile`` a 1-step run and a 3-frame decode after the prefill warm the
compiled layer and decoder up (``compile_warmup_s``, ``vae_compile_warmup_s``: ``first_run_overhead_s``, left out of
``total_warm_s``, the table's figure; ``total_s`` includes them). diffusers' end-to-end pipeline runs for
``--e2e-diffusers`` shapes. Results go to a JSON file (BENCHMARKS.md's per-shape tables read them).

    python bench/bench_generation.py --compile --resolutions t2i,256p,480p --e2e t2i,256p,480p \
        --e2e-diffusers t2i,256p --out bench/results/generation_e2e.json
    python bench/bench_generation.py --compile --skip-reference --resolutions "" --e2e 720p \
        --out bench/results/generation_720p.json
    python bench/bench_generation.py --compile --skip-reference --resolutions "" --e2e t2i \
        --out bench/results/generation_t2i.json
    python bench/bench_generation.py --routes --resolutions t2i,256p,480p,720p --e2e-diffusers t2i,256p,480p \
        --e2e t2i,256p,480p,720p --out bench/results/generation_routes.json     # per-route steps, diffusers at 480p

``--routes`` times the step per route (``RuntimeOptions``: eager / compiled × SDPA / FlashAttention-4 where it can
run; 720p compiled only) with each route's warm-up, peak memory and velocity difference from the first route; the
end-to-end runs of that invocation then use the fastest route per shape. ``--loop 480p`` splits a compiled 35-step
loop's time: per step in the loop, the same step alone, and the GPU's busy time per step (torch.profiler).

``--gemm-fusion t2i,480p,720p`` runs only that (no model is built, no diffusers imported; seconds on a GPU): one
generation layer's GEMMs at each shape in bf16 (separate and fused q/k/v, gate/up) and in NVIDIA's FP8 layout (the
W8A8 GEMMs on a quantized input, fused with per-output-channel scales, the activation quantize, the whole W8A8 and
W8A16 forwards), with the per-layer sums and the 36-layer step: where an FP8 step's time goes, against the measured
step.

``--warm-start t2i,480p`` measures what the on-disk compile caches (cosmos3_core/kernels/caches.py) save: it runs three fresh
processes one after the other on one new, empty ``COSMOS3_CACHE_DIR`` (each a ``--probe-warmup`` of those shapes, the
third after the imports a ComfyUI server makes while it waits for its first prompt, ``--preload``)
and reports, per process and shape, the compile warm-up (first compiled step minus the steady one), the inductor /
AOT-autograd cache hits and misses and the steady compiled step. ``--tiny`` runs the same code on the CPU with a
tiny random model (a check that it runs, not a measurement):

    python bench/bench_generation.py --warm-start t2i,480p --out /tmp/warm_start.json [--tiny]
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    COND_TOKENS,
    LONG_PROMPT,
    RESOLUTIONS,
    TINY_RESOLUTIONS,
    UNCOND_TOKENS,
    build_models,
    build_tiny_ours,
    compile_stats,
    fp8_linear,
    fresh_processes,
    gib,
    make_components,
    reference_inputs,
    step_flops,
    sync,
    timed,
)
from cosmos3_core import api  # noqa: E402

COMPILE = False  # --compile: also time the torch.compile'd generation layer
SKIP_REFERENCE = False  # --skip-reference: time ours only (diffusers' numbers taken from an earlier run)
ROUTES = False  # --routes: time ours per route (eager/compiled × SDPA/FlashAttention-4)


def time_ours(step) -> tuple[float, int, dict]:
    """Eager step time and peak memory, then (``--compile``) the compiled step's warm-up and time.
    ``step(options)`` runs one guided step with those ``RuntimeOptions``."""
    from cosmos3_core.kernels.compile import prepared
    from cosmos3_core.runtime import RuntimeOptions

    torch.cuda.reset_peak_memory_stats()
    eager_s = timed(lambda: step(RuntimeOptions(compile=False)))
    peak = torch.cuda.max_memory_allocated()
    extra = {}
    if COMPILE:
        compiled = RuntimeOptions(compile=True)
        prepared()  # the compile settings, as Cosmos3Pipeline.run puts them in place for a compiled run
        start = time.perf_counter()
        step(compiled)
        sync()
        extra = dict(compile_warmup_s=round(time.perf_counter() - start, 1),
                     ours_compiled_step_s=round(timed(lambda: step(compiled)), 4))
    return eager_s, peak, extra


def route_variants(name: str) -> list[tuple[str, str, bool]]:
    """(label, attention route, compiled) to time at this shape; 720p skips the eager ones."""
    from cosmos3_core.kernels.attention import flash4_unavailable_reason

    flash4 = not flash4_unavailable_reason()
    big = name == "720p"
    out = [] if big else [("eager_sdpa", "sdpa", False)]
    out.append(("compiled_sdpa", "sdpa", True))
    if flash4:
        out += [] if big else [("eager_flash4", "flash4", False)]
        out.append(("compiled_flash4", "flash4", True))
    return out


def time_routes(step, name: str) -> dict:
    """Every route: first-call warm-up (compile, FlashAttention-4 JIT), step time, peak memory, and the relative L2
    difference of its vision velocity from the first route's (bf16 rounding level expected)."""
    from cosmos3_core.kernels.compile import prepared
    from cosmos3_core.runtime import RuntimeOptions

    iters = 2 if name == "720p" else 5
    out, reference = {}, None
    for label, attention, compiled in route_variants(name):
        options = RuntimeOptions(attention=attention, compile=compiled)
        run = lambda options=options: step(options)  # noqa: E731
        try:
            if compiled:
                prepared()
            torch.cuda.reset_peak_memory_stats()
            sync()
            start = time.perf_counter()
            first = run().vision.float()
            sync()
            warmup = time.perf_counter() - start
            seconds = timed(run, warmup=1, iters=iters)
            v = run().vision.float()
            reference = v if reference is None else reference
            out[label] = dict(step_s=round(seconds, 4), warmup_s=round(warmup, 2),
                              peak_gib=gib(torch.cuda.max_memory_allocated()),
                              rel_vs_first_variant=float(f"{((v - reference).norm() / reference.norm()).item():.2e}"),
                              first_call_rel=float(f"{((first - v).norm() / v.norm()).item():.2e}"))
        except Exception as exc:  # noqa: BLE001 — report the failing variant, keep timing the others
            out[label] = dict(error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}")
        print(name, label, out[label], flush=True)
    return out


def bench_steps(ref, ours, name: str, results: dict, device: str) -> None:
    from cosmos3_core.model.layout import build_layout

    h, w, frames = RESOLUTIONS[name]
    shape = (1, 48, (frames - 1) // 4 + 1, h // 16, w // 16)
    g = torch.Generator().manual_seed(1)
    cond = torch.randint(0, 151000, (COND_TOKENS,), generator=g).tolist()
    uncond = torch.randint(0, 151000, (UNCOND_TOKENS,), generator=g).tolist()
    latents = torch.randn(shape, generator=g).to(device)
    t = torch.tensor(900, device=device)

    sync()
    start = time.perf_counter()
    kvs = [ours.prefill(cond), ours.prefill(uncond)]
    sync()
    prefill_s = time.perf_counter() - start
    layout = build_layout(ours.config, [kv.length for kv in kvs], shape[2:], 24.0, device=device, dtype=torch.bfloat16)
    step = lambda options: ours.denoise_step(latents, t, kvs, layout, options=options)  # noqa: E731
    if ROUTES:
        compiled = dict(routes=time_routes(step, name))
        first = next(iter(compiled["routes"].values()))
        ours_s, ours_peak = first.get("step_s", float("nan")), int(first.get("peak_gib", 0) * 2**30)
    else:
        ours_s, ours_peak, compiled = time_ours(step)
    gc.collect()
    torch.cuda.empty_cache()

    ref_s, ref_peak = float("nan"), 0
    if not SKIP_REFERENCE:
        inputs = [reference_inputs(ref, ids, latents, 24.0, 900) for ids in (cond, uncond)]
        torch.cuda.reset_peak_memory_stats()
        with torch.no_grad():
            ref_s = timed(lambda: [ref(**kw) for kw in inputs], iters=1 if name == "720p" else 3)
        ref_peak = torch.cuda.max_memory_allocated()
        del inputs
    tokens = shape[2] * -(-shape[3] // 2) * -(-shape[4] // 2)
    flops = step_flops(tokens, [COND_TOKENS, UNCOND_TOKENS])
    results["steps"][name] = dict(
        height=h, width=w, frames=frames, gen_tokens=tokens, ours_step_s=round(ours_s, 4),
        diffusers_step_s=round(ref_s, 4), speedup=round(ref_s / ours_s, 3),
        ours_tflops=round(flops / ours_s / 1e12, 1), diffusers_tflops=round(flops / ref_s / 1e12, 1),
        ours_prefill_both_s=round(prefill_s, 3), ours_peak_gib=gib(ours_peak), diffusers_peak_gib=gib(ref_peak),
        **compiled,
    )
    print(name, results["steps"][name], flush=True)
    gc.collect()
    torch.cuda.empty_cache()


def bench_attention(name: str, results: dict) -> None:
    """SDPA routes for one branch's generation attention (32 query heads over 8 KV heads, [text | gen] keys)."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    h, w, frames = RESOLUTIONS[name]
    n = ((frames - 1) // 4 + 1) * -(-h // 32) * -(-w // 32)
    q = torch.randn(1, 32, n, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, 8, n + COND_TOKENS, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    flops = 4 * 32 * 128 * n * (n + COND_TOKENS)
    routes = {}
    ke, ve = k.repeat_interleave(4, dim=1), v.repeat_interleave(4, dim=1)
    for label, backend, expanded in [("cudnn_expanded", SDPBackend.CUDNN_ATTENTION, True),
                                     ("flash_expanded", SDPBackend.FLASH_ATTENTION, True),
                                     ("flash_gqa", SDPBackend.FLASH_ATTENTION, False),
                                     ("efficient_expanded", SDPBackend.EFFICIENT_ATTENTION, True),
                                     ("default_expanded", None, True), ("default_gqa", None, False)]:
        def run(expanded=expanded, backend=backend):
            kk, vv = (ke, ve) if expanded else (k, v)
            if backend is None:
                return F.scaled_dot_product_attention(q, kk, vv, enable_gqa=not expanded)
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, kk, vv, enable_gqa=not expanded)
        try:
            seconds = timed(run, warmup=2, iters=5)
            routes[label] = dict(ms=round(seconds * 1e3, 2), tflops=round(flops / seconds / 1e12, 1))
        except RuntimeError as exc:
            routes[label] = dict(error=str(exc).splitlines()[0][:120])
    results.setdefault("attention", {})[name] = routes
    print("attention", name, routes, flush=True)


_GEMM_FLOPS_OF = {  # which FLOP count each timed case does (the quantize does none)
    "bf16_qkv_separate": "qkv", "bf16_qkv_fused": "qkv", "bf16_gate_up_separate": "gate_up",
    "bf16_gate_up_fused": "gate_up", "bf16_o": "o", "bf16_down": "down", "fp8_qkv_separate": "qkv",
    "fp8_qkv_fused_rowwise": "qkv", "fp8_gate_up_separate": "gate_up", "fp8_gate_up_fused_rowwise": "gate_up",
    "fp8_o": "o", "fp8_down": "down", "w8a8_forward_all": "layer", "w8a16_forward_all": "layer"}


def _gemm_cases(m: int, d: int, f: int, kv: int, device: str):
    """``(cases, fused_check)``: the timed callables of ``bench_gemm_fusion`` for ``m`` stacked tokens and one
    layer's widths, and a function comparing the fused per-output-channel q/k/v FP8 GEMM with the separate ones."""
    from cosmos3_core.model.fp8 import fp8_matmul, quantize_activation

    g = torch.Generator(device).manual_seed(0)
    x = torch.randn(m, d, device=device, dtype=torch.bfloat16, generator=g)
    hidden = torch.randn(m, f, device=device, dtype=torch.bfloat16, generator=g)
    shapes = dict(q=(d, d), k=(kv, d), v=(kv, d), o=(d, d), gate=(f, d), up=(f, d), down=(d, f))
    bf16 = {k: torch.randn(n, kk, device=device, dtype=torch.bfloat16, generator=g) * 0.02
            for k, (n, kk) in shapes.items()}
    fp8 = {k: fp8_linear(torch.randn(n, kk, device=device, generator=g) * 0.02, 4.0)  # amax 4: a calibrated scale
           for k, (n, kk) in shapes.items()}
    scale_a = fp8["q"].input_scale
    rows_a = torch.ones(m, 1, device=device) * scale_a  # per-row activation scale: one value, as a fused call needs
    x8, hidden8 = quantize_activation(x, scale_a), quantize_activation(hidden, scale_a)
    qkv8, gu8 = (torch.cat([fp8[k].weight for k in keys]) for keys in (("q", "k", "v"), ("gate", "up")))
    qkv_rows, gu_rows = (torch.cat([fp8[k].weight_scale_b.expand(shapes[k][0]) for k in keys])[None].float()
                         for keys in (("q", "k", "v"), ("gate", "up")))
    qkv, gu = torch.cat([bf16["q"], bf16["k"], bf16["v"]]), torch.cat([bf16["gate"], bf16["up"]])
    mm, quantize = torch.nn.functional.linear, quantize_activation

    def gemm8(a8, key):  # as Fp8Linear.w8a8_with calls it
        return fp8_matmul(a8, fp8[key].weight, scale_a, fp8[key].weight_scale_b, None, torch.bfloat16)

    def rowwise(a8, w8, rows):
        return torch._scaled_mm(a8, w8.t(), scale_a=rows_a, scale_b=rows, out_dtype=torch.bfloat16,
                                use_fast_accum=True)

    cases = {
        "bf16_qkv_separate": lambda: [mm(x, bf16[k]) for k in ("q", "k", "v")],
        "bf16_qkv_fused": lambda: mm(x, qkv),
        "bf16_gate_up_separate": lambda: [mm(x, bf16[k]) for k in ("gate", "up")],
        "bf16_gate_up_fused": lambda: mm(x, gu),
        "bf16_o": lambda: mm(x, bf16["o"]),
        "bf16_down": lambda: mm(hidden, bf16["down"]),
        "fp8_qkv_separate": lambda: [gemm8(x8, k) for k in ("q", "k", "v")],
        "fp8_qkv_fused_rowwise": lambda: rowwise(x8, qkv8, qkv_rows),
        "fp8_gate_up_separate": lambda: [gemm8(x8, k) for k in ("gate", "up")],
        "fp8_gate_up_fused_rowwise": lambda: rowwise(x8, gu8, gu_rows),
        "fp8_o": lambda: gemm8(x8, "o"),
        "fp8_down": lambda: gemm8(hidden8, "down"),
        # a layer's four distinct GEMM inputs: norm1(x), the attention output, norm2(x'), the MLP's hidden
        "fp8_quantize_layer_inputs": lambda: (quantize(x, scale_a), quantize(x, scale_a), quantize(x, scale_a),
                                              quantize(hidden, scale_a)),
        "w8a8_forward_all": lambda: ([fp8[k].w8a8(x) for k in ("q", "k", "v", "o", "gate", "up")],
                                     fp8["down"].w8a8(hidden)),
        "w8a16_forward_all": lambda: ([fp8[k](x) for k in ("q", "k", "v", "o", "gate", "up")], fp8["down"](hidden)),
    }

    def fused_check() -> dict:
        separate = torch.cat([gemm8(x8, k) for k in ("q", "k", "v")], dim=-1).float()
        return dict(max_abs=float((rowwise(x8, qkv8, qkv_rows).float() - separate).abs().max()),
                    max_separate=float(separate.abs().max()))

    return cases, fused_check


def bench_gemm_fusion(name: str, results: dict, tiny: bool = False) -> None:
    """One generation layer's GEMMs at this shape (both branches' tokens stacked, as in the batched step): bf16 with
    q/k/v and gate/up separate (the checkpoint's layers) and fused (one weight concatenated at load); and NVIDIA's
    FP8 layers (``Fp8Linear``, the product's class) — the W8A8 GEMMs alone on already quantized inputs
    (``fp8_matmul``: ``torch._scaled_mm`` with per-tensor scales, as the product calls it), q/k/v and gate/up fused
    with per-output-channel weight scales (what one fused FP8 layer would need; checked equal to the separate ones),
    the activation quantize of the layer's four GEMM inputs (what a layer fusing q/k/v and gate/up would still do;
    the product quantizes once per linear, 7 times), the whole W8A8 forward of the 7 linears as they run uncompiled,
    and their W8A16 forward (the weight dequantized per call). ``layer_ms``: the per-layer sums; ``step_ms``: × 36
    layers. ``tiny``: small widths on the CPU (the script runs; not a measurement)."""
    h, w, frames = (TINY_RESOLUTIONS if tiny else RESOLUTIONS)[name]
    d, f, kv = (64, 192, 16) if tiny else (4096, 12288, 1024)
    m = 2 * ((frames - 1) // 4 + 1) * -(-h // 32) * -(-w // 32)
    cases, fused_check = _gemm_cases(m, d, f, kv, "cpu" if tiny else "cuda")
    flops = {"qkv": 2 * m * d * (d + 2 * kv), "gate_up": 4 * m * d * f, "o": 2 * m * d * d, "down": 2 * m * f * d}
    flops["layer"] = sum(flops.values())
    out = {}
    for label, fn in cases.items():
        seconds = timed(fn, warmup=3, iters=10)
        out[label] = dict(ms=round(seconds * 1e3, 3))
        if label in _GEMM_FLOPS_OF:
            out[label]["tflops"] = round(flops[_GEMM_FLOPS_OF[label]] / seconds / 1e12, 1)
    bf16_layer = sum(out[k]["ms"] for k in ("bf16_qkv_separate", "bf16_gate_up_separate", "bf16_o", "bf16_down"))
    fp8_layer = sum(out[k]["ms"] for k in ("fp8_qkv_separate", "fp8_gate_up_separate", "fp8_o", "fp8_down",
                                           "fp8_quantize_layer_inputs"))
    out["layer_ms"] = dict(bf16=round(bf16_layer, 3), fp8_gemms_and_quantize=round(fp8_layer, 3),
                           w8a8_forward=out["w8a8_forward_all"]["ms"], w8a16_forward=out["w8a16_forward_all"]["ms"])
    out["step_ms"] = {k: round(36 * v, 1) for k, v in out["layer_ms"].items()}
    out["fp8_qkv_fused_rowwise_vs_separate"] = fused_check()  # a fused FP8 layer must equal the separate GEMMs
    out["m"] = m
    results.setdefault("gemm_fusion", {})[name] = out
    print("gemm fusion", name, json.dumps(out), flush=True)


def gemm_fusion_only(args) -> None:
    """``--gemm-fusion``: only the GEMM cases (no model, no diffusers), on the GPU or with ``--tiny`` on the CPU."""
    results = dict(date=datetime.date.today().isoformat(), tiny=args.tiny, torch=torch.__version__,
                   gpu=None if args.tiny else torch.cuda.get_device_name())
    for name in args.gemm_fusion.split(","):
        bench_gemm_fusion(name, results, tiny=args.tiny)
        Path(args.out).write_text(json.dumps(results, indent=1))


def best_route(results: dict, name: str):
    """The ``RuntimeOptions`` of the fastest route measured at this shape in this run (``--routes``), else
    ``attention`` auto with ``--compile``'s setting."""
    from cosmos3_core.runtime import RuntimeOptions

    routes = results["steps"].get(name, {}).get("routes", {})
    timed_ok = {k: v["step_s"] for k, v in routes.items() if "step_s" in v}
    if not timed_ok:
        return RuntimeOptions(compile=COMPILE)
    label = min(timed_ok, key=timed_ok.get)
    return RuntimeOptions(attention="flash4" if "flash4" in label else "sdpa", compile=label.startswith("compiled"))


def bench_e2e_ours(ours, files, vae, audio, tokenizer, name: str, results: dict, device: str) -> None:
    """One warm run per stage with one ``RuntimeOptions`` (see the module docstring); both towers stay resident."""
    from cosmos3_core.pipeline import Cosmos3Pipeline
    from cosmos3_core.vae.audio import Cosmos3SoundDecoder
    from cosmos3_core.vae.video import Cosmos3VAE

    h, w, frames = RESOLUTIONS[name]
    sound = frames > 1
    options = best_route(results, name)
    pipe = Cosmos3Pipeline(files, ours, Cosmos3VAE(vae), tokenizer, Cosmos3SoundDecoder(audio))
    sampling = dict(seed=0, guidance=6.0, sound=sound)
    stages = {}
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    sync()
    t0 = time.perf_counter()
    text = pipe.encode_text(LONG_PROMPT, None, num_frames=frames, height=h, width=w, fps=24.0, options=options)
    sync()
    stages["prefill_s"] = time.perf_counter() - t0
    prefill_peak = torch.cuda.max_memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    t1 = time.perf_counter()
    if options.compiles:  # warm the compiled layer and VAE decoder up; one-offs per shape, reported apart from the total
        warm = pipe.run(api.plan(pipe, text, options=options, steps=1, **sampling))
        sync()
    stages["compile_warmup_s"] = time.perf_counter() - t1
    t1 = time.perf_counter()
    if options.compiles:  # every latent frame after the first runs compiled: three frames trace and build its graphs
        pipe.decode_video(warm.latents[:, :, :3], options=options)
        sync()
        del warm
    stages["vae_compile_warmup_s"] = time.perf_counter() - t1
    t1 = time.perf_counter()
    out = pipe.run(api.plan(pipe, text, options=options, steps=35, **sampling))
    sync()
    stages["denoise_35_steps_s"] = time.perf_counter() - t1
    t1 = time.perf_counter()
    frames_out = pipe.decode_video(out.latents, options=options)  # as `generate --compile` decodes
    sync()
    stages["vae_decode_s"] = time.perf_counter() - t1
    t1 = time.perf_counter()
    wave = pipe.decode_sound(out.sound[0], frames, 24.0) if sound else torch.zeros(1, 0)
    sync()
    stages["audio_decode_s"] = time.perf_counter() - t1
    total = time.perf_counter() - t0
    overhead = stages["compile_warmup_s"] + stages["vae_compile_warmup_s"]
    results["e2e_ours"][name] = dict(
        {k: round(v, 2) for k, v in stages.items()}, total_s=round(total, 2),
        total_warm_s=round(total - overhead, 2), first_run_overhead_s=round(overhead, 2),
        peak_prefill_gib=gib(prefill_peak), peak_generation_gib=gib(torch.cuda.max_memory_allocated()),
        cond_tokens=text.cond.length, compiled=options.compiles, attention=options.attention, sound=sound,
        uncond_tokens=text.uncond.length, frames_shape=list(frames_out.shape), audio_samples=int(wave.shape[1]),
    )
    print("e2e ours", name, results["e2e_ours"][name], flush=True)


def bench_loop(ours, files, vae, audio, tokenizer, name: str, results: dict) -> None:
    """Where a compiled 35-step sampling loop's time goes at one shape: wall time per step in the loop, the same
    step timed alone on the plan's own layout, and the GPU's busy time per step in the loop (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    from cosmos3_core.pipeline import Cosmos3Pipeline
    from cosmos3_core.runtime import RuntimeOptions
    from cosmos3_core.vae.audio import Cosmos3SoundDecoder
    from cosmos3_core.vae.video import Cosmos3VAE

    h, w, frames = RESOLUTIONS[name]
    sound = frames > 1
    options = RuntimeOptions(compile=True)
    pipe = Cosmos3Pipeline(files, ours, Cosmos3VAE(vae), tokenizer, Cosmos3SoundDecoder(audio))
    text = pipe.encode_text(LONG_PROMPT, None, num_frames=frames, height=h, width=w, fps=24.0, options=options)
    run = lambda: pipe.run(api.plan(pipe, text, options=options, seed=0, steps=35, guidance=6.0, sound=sound))  # noqa: E731
    run()  # compile + warm-up
    row = dict(loop_step_ms=round(timed(run, warmup=0, iters=2) * 1e3 / 35, 2))
    plan = api.plan(pipe, text, seed=0, steps=35, guidance=6.0, sound=sound, options=options)
    g = plan.guidance[0]
    x = {s.name: s.init for s in plan.streams}
    step = lambda: ours.denoise_step(x["vision"], plan.timesteps[0].to("cuda"), g.text, g.layout,  # noqa: E731
                                     sound=x.get("sound"), options=options)
    row["isolated_step_ms"] = round(timed(step, warmup=2, iters=10) * 1e3, 2)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        sync()
    busy = sum(ev.device_time_total for ev in prof.key_averages() if ev.device_type.name == "CUDA")
    row["gpu_busy_per_step_ms_in_loop"] = round(busy / 1e3 / 35, 2)
    results.setdefault("loop", {})[name] = row
    print("loop", name, row, flush=True)


def probe_warmup(names: list[str], out_path: str, tiny: bool = False, preload: bool = False) -> None:
    """In this (fresh) process, per shape in order: the first compiled step as a user's first run pays it (Dynamo,
    inductor or its on-disk caches, FlashAttention-4's JIT), the steady compiled step, the compile counters and
    times it added, and the compiled step's relative difference from the eager one. ``preload``: first what a
    ComfyUI server imports while it waits for its first prompt (``caches.preload_first_run``, to its end)."""
    from cosmos3_core.kernels.caches import preload_first_run, wait_for_preload
    from cosmos3_core.kernels.compile import prepared
    from cosmos3_core.model.layout import build_layout
    from cosmos3_core.runtime import RuntimeOptions

    t0 = time.perf_counter()
    if preload:
        thread = preload_first_run(compiles=True)
        wait_for_preload()
        preloaded = dict(preload_s=round(time.perf_counter() - t0, 2), preload_failed=thread.failed,
                         compile_workers_started=thread.workers_started)
        print("preload", preloaded, flush=True)
        t0 = time.perf_counter()
    device, dtype = ("cpu", torch.float32) if tiny else ("cuda", torch.bfloat16)
    ours = build_tiny_ours() if tiny else build_models(device)[1]
    vocab, lengths = (1000, (50, 10)) if tiny else (151000, (COND_TOKENS, UNCOND_TOKENS))
    g = torch.Generator().manual_seed(1)
    kvs = [ours.prefill(torch.randint(0, vocab, (n,), generator=g).tolist()) for n in lengths]
    sync()
    res = dict(setup_s=round(time.perf_counter() - t0, 1), torch=torch.__version__,
               device=torch.cuda.get_device_name() if device == "cuda" else device, shapes={},
               **(preloaded if preload else {}))
    compiled_options, eager_options = RuntimeOptions(compile=True), RuntimeOptions(compile=False)
    prepared()
    res["inductor_cache_dir"] = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    for name in names:
        h, w, frames = (TINY_RESOLUTIONS if tiny else RESOLUTIONS)[name]
        shape = (1, 48, (frames - 1) // 4 + 1, h // 16, w // 16)
        layout = build_layout(ours.config, [kv.length for kv in kvs], shape[2:], 24.0, device=device, dtype=dtype)
        latents = torch.randn(shape, generator=g).to(device)
        t = torch.tensor(900, device=device)
        step = lambda options=compiled_options, latents=latents, t=t, layout=layout: ours.denoise_step(  # noqa: E731
            latents, t, kvs, layout, options=options)
        before = compile_stats()
        start = time.perf_counter()
        step()
        sync()
        first = time.perf_counter() - start
        steady = timed(step, warmup=1, iters=3)
        after = compile_stats()
        compiled = step().vision.float()
        eager = step(eager_options).vision.float()
        res["shapes"][name] = dict(
            first_compiled_step_s=round(first, 3), compiled_step_s=round(steady, 4),
            compile_warmup_s=round(first - steady, 2),
            **{k: round(after[k] - before[k], 2) for k in after if k != "phases"},
            compile_phases_s={k: round(v - before["phases"].get(k, 0.0), 2) for k, v in after["phases"].items()
                              if v - before["phases"].get(k, 0.0) >= 0.05},
            rel_vs_eager=float(f"{((compiled - eager).norm() / eager.norm()).item():.2e}"))
        print("probe", name, res["shapes"][name], flush=True)
    Path(out_path).write_text(json.dumps(res, indent=1))


def warm_start(names: str, out_path: str, tiny: bool) -> None:
    """Three fresh ``--probe-warmup`` processes, one after the other, on one new empty cache root: a machine's
    first, a restart, and a restart after the imports a ComfyUI server makes while it waits (``--preload``)."""
    results = dict(date=datetime.date.today().isoformat(), shapes=names.split(","), tiny=tiny, processes=[])
    fresh_processes([__file__, "--probe-warmup", names] + ["--tiny"] * tiny, 3, results, out_path,
                    extra=[[], [], ["--preload"]])
    for i, run in enumerate(results["processes"], 1):
        for name, r in run["shapes"].items():
            print(f"process {i} {name}: warm-up {r['compile_warmup_s']} s, steady {r['compiled_step_s']} s, "
                  f"fxgraph hit/miss {r['fxgraph_cache_hit']}/{r['fxgraph_cache_miss']}", flush=True)


def bench_e2e_diffusers(ref, files, vae, audio, tokenizer, name: str, results: dict) -> None:
    from diffusers import Cosmos3OmniPipeline, UniPCMultistepScheduler

    h, w, frames = RESOLUTIONS[name]
    sched = UniPCMultistepScheduler.from_pretrained(files, subfolder="scheduler")
    sched = UniPCMultistepScheduler.from_config(sched.config, flow_shift=5.0, use_karras_sigmas=False)
    pipe = Cosmos3OmniPipeline(transformer=ref, text_tokenizer=tokenizer, vae=vae, scheduler=sched,
                               sound_tokenizer=audio, enable_safety_checker=False)
    pipe.set_progress_bar_config(disable=True)
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    sync()
    t0 = time.perf_counter()
    pipe(prompt=LONG_PROMPT, num_frames=frames, height=h, width=w, num_inference_steps=35, guidance_scale=6.0,
         enable_sound=frames > 1, output_type="np", generator=torch.Generator("cpu").manual_seed(0))
    sync()
    results["e2e_diffusers"][name] = dict(total_s=round(time.perf_counter() - t0, 2),
                                          peak_gib=gib(torch.cuda.max_memory_allocated()))
    print("e2e diffusers", name, results["e2e_diffusers"][name], flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True, help="results JSON")
    p.add_argument("--resolutions", default="256p,480p,720p")
    p.add_argument("--e2e", default="480p")
    p.add_argument("--e2e-diffusers", default="")
    p.add_argument("--compile", action="store_true", help="also time the compiled generation layer")
    p.add_argument("--skip-reference", action="store_true", help="do not time diffusers' step (saves device time)")
    p.add_argument("--attention", default="", help="attention backend micro-benchmark at these shapes")
    p.add_argument("--gemm-fusion", default="",
                   help="only this: one layer's GEMMs at these shapes, bf16 separate vs fused, FP8 W8A8/W8A16")
    p.add_argument("--routes", action="store_true",
                   help="time the step per route (eager/compiled x SDPA/FlashAttention-4); e2e uses the best")
    p.add_argument("--probe-warmup", default="", help="fresh-process compile warm-up at these shapes, then exit")
    p.add_argument("--preload", action="store_true",
                   help="--probe-warmup after a ComfyUI server's preload of a first run's imports")
    p.add_argument("--warm-start", default="",
                   help="two fresh --probe-warmup processes at these shapes on one new empty cache dir, then exit")
    p.add_argument("--loop", default="", help="compiled 35-step loop vs isolated step vs GPU busy time")
    p.add_argument("--tiny", action="store_true",
                   help="--probe-warmup/--warm-start/--gemm-fusion on the CPU with a tiny model (the script runs)")
    args = p.parse_args()
    if args.warm_start:
        warm_start(args.warm_start, args.out, args.tiny)
        return
    if args.gemm_fusion:
        gemm_fusion_only(args)
        return
    if args.probe_warmup:  # the product's compile settings, untouched
        torch.backends.cuda.matmul.allow_tf32 = False
        probe_warmup(args.probe_warmup.split(","), args.out, args.tiny, args.preload)
        return
    import diffusers
    import transformers

    device = "cuda"
    torch.backends.cuda.matmul.allow_tf32 = False
    results = dict(
        date=datetime.date.today().isoformat(), gpu=torch.cuda.get_device_name(), torch=torch.__version__,
        diffusers=diffusers.__version__, transformers=transformers.__version__, python=platform.python_version(),
        cond_tokens=COND_TOKENS, uncond_tokens=UNCOND_TOKENS, steps={}, e2e_ours={}, e2e_diffusers={},
    )
    global COMPILE, SKIP_REFERENCE, ROUTES
    COMPILE, SKIP_REFERENCE, ROUTES = args.compile, args.skip_reference, args.routes
    for name in filter(None, args.attention.split(",")):
        bench_attention(name, results)
        Path(args.out).write_text(json.dumps(results, indent=1))
    t0 = time.perf_counter()
    ref, ours = build_models(device)
    results["init_s"] = round(time.perf_counter() - t0, 1)
    for name in filter(None, args.resolutions.split(",")):
        bench_steps(ref, ours, name, results, device)
        Path(args.out).write_text(json.dumps(results, indent=1))
    with tempfile.TemporaryDirectory() as tmp:
        files, vae, audio, tokenizer = make_components(device, Path(tmp))
        for name in filter(None, args.e2e_diffusers.split(",")):
            bench_e2e_diffusers(ref, files, vae, audio, tokenizer, name, results)
            Path(args.out).write_text(json.dumps(results, indent=1))
        del ref  # ours keeps only the weights it uses
        gc.collect()
        torch.cuda.empty_cache()
        for name in filter(None, args.e2e.split(",")):
            bench_e2e_ours(ours, files, vae, audio, tokenizer, name, results, device)
            Path(args.out).write_text(json.dumps(results, indent=1))
        for name in filter(None, args.loop.split(",")):
            bench_loop(ours, files, vae, audio, tokenizer, name, results)
            Path(args.out).write_text(json.dumps(results, indent=1))
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

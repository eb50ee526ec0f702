"""Quality and speed of the fast modes — FP8 (NVIDIA's W8A8/W8A16 step policy), SeaCache, both — against exact bf16
on full-size, random-weight Cosmos3-Nano (one GPU; the targets are an H200's), 35 steps, CFG 6.

Per resolution and mode, one run after a warm-up run of the same mode (the "second run" of BENCHMARKS; the warm-up
compiles every graph the timed run needs: SeaCache runs the layer stack for a subset of the branches on some steps,
another graph): denoising time, peak GPU memory, the FP8 policy in effect and, for SeaCache, the contexts (branch ×
step) that reused the stack. Each run's final latents go to ``--dir``; ``--compare`` then decodes every saved latent
with the same VAE and reports, against the exact bf16 run of that resolution, the latent cosine and the decoded
frames' PSNR (what FlashRT and vLLM-Omni report).

FP8 here is the checkpoint path on stand-in weights: every decoder-layer linear of the bf16 model becomes an
``Fp8Linear`` in ModelOpt's layout — its weight rounded to e4m3 with a per-tensor scale, a static activation scale
calibrated on this prompt's text prefill and one exact guided step (max ``|input|``, ModelOpt's max calibration) —
under NVIDIA's policy (W8A16 for the first and last 3 steps, W8A8 between). **Random weights say little about real
quality**: the figures show that the modes run, what they cost and how far they move this random model, not how a
trained Nano looks; the real check is NVIDIA's fp8 revision with real prompts.

    python bench/bench_fast_modes.py --resolutions t2i,480p --warmup-steps 8 --dir /tmp/fm \
        --out bench/results/fast_modes.json
    python bench/bench_fast_modes.py --resolutions 720p --steps 10 --warmup-steps 2 --dir /tmp/fm \
        --out bench/results/fast_modes.json                 # 35-step exact/FP8 times projected from the step means
    python bench/bench_fast_modes.py --compare --resolutions t2i,480p --dir /tmp/fm --out bench/results/fast_modes.json
    python bench/bench_fast_modes.py --tiny --dir /tmp/fm_tiny --out /tmp/fm_tiny.json   # CPU: the script runs

The calls must share ``--dir`` (and a machine: the compare reads the latents the runs saved there). Every run's
record is merged into ``--out`` as it ends, so a call cut off at a time limit keeps what it measured. Each record
holds every step's time (CUDA events from the sampler's step callback: no host sync inside the run), the mean
W8A16 and W8A8 step, and under SeaCache the mean step per number of contexts computed and a fitted cost model
(``fixed_s + per_context_s × computed``); ``projection/<shape>`` reads those models at the reuse that would give
vLLM-Omni's published 1.8× (a projection, not a measurement). A fast mode's warm-up runs at least 8 steps, so it
compiles the SeaCache graph and reaches the W8A8 steps. SeaCache at few steps (10 at 720p) may reuse nothing:
each step then moves the latents past the threshold.

``--tiny``: the tiny checkpoint on the CPU, FP8 through the exact GEMM emulation (``fp8_gemm="emulate"``), eager —
a check that the script runs (measure and compare in one call), not a measurement.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    LONG_PROMPT,
    RESOLUTIONS,
    TINY_RESOLUTIONS,
    build_ours,
    fp8_linear,
    make_components,
    sync,
)
from cosmos3_core import api

MODES = ("exact", "fp8", "sea", "fp8+sea")
STEPS, GUIDANCE, THRESHOLD = 35, 6.0, 0.25
PUBLISHED_SEA_SPEEDUP = 1.8  # vLLM-Omni, SeaCache 0.25 on real Nano weights (GB200 720p: 92.9 → 51.1 s)


def calibrate(pipe, text, options, sound: bool) -> dict[str, float]:
    """Max |input| of every decoder-layer linear over this prompt's text prefill and one exact guided step (the
    last layer's text output projection and MLP never run: they get 1.0, and are never used)."""
    model, amax, hooks = pipe.transformer, {}, []
    for name, module in model.named_modules():
        if name.startswith("layers.") and isinstance(module, torch.nn.Linear):
            def hook(_m, args, name=name):
                amax[name] = max(amax.get(name, 0.0), float(args[0].detach().abs().amax()))
            hooks.append(module.register_forward_pre_hook(hook))
    try:
        model.prefill_many([kv.token_ids for kv in (text.cond, text.uncond) if kv is not None])
        pipe.run(api.plan(pipe, text, seed=0, steps=1, guidance=GUIDANCE, sound=sound, options=options))
    finally:
        for h in hooks:
            h.remove()
    return amax


def to_fp8_(model, input_amax: dict[str, float]) -> int:
    """Every decoder-layer linear replaced by an ``Fp8Linear`` in the ModelOpt layout, in place; the model then
    declares NVIDIA's policy (``model.fp8_checkpoint``)."""
    from cosmos3_core.model.precision import FIRST_LAST_N_FP8_POLICY, linear_path
    from cosmos3_core.model.weights import Fp8Checkpoint

    count = 0
    for name, module in list(model.named_modules()):
        if not (name.startswith("layers.") and type(module) is torch.nn.Linear):
            continue
        parent, attr = name.rsplit(".", 1)
        fp8 = fp8_linear(module.weight, input_amax.get(name, 1.0), module.bias)
        fp8.path = linear_path(name)
        setattr(model.get_submodule(parent), attr, fp8)
        count += 1
    model.fp8_checkpoint = Fp8Checkpoint({"quant_method": "modelopt", "quant_algo": "FP8",
                                          "runtime": {"diffusion_step_policy": FIRST_LAST_N_FP8_POLICY}})
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return count


class StepClock:
    """Each step's time inside one run, from the sampler's per-step callback: CUDA events on a GPU (no host sync
    inside the run), ``perf_counter`` on the CPU. (With a callback the loop also forms each step's x0 preview, one
    elementwise op on the latents, which the warm-up run without a callback does not.)"""

    def __init__(self, device: str):
        self.cuda = device == "cuda"
        self.marks: list = []

    def start(self) -> None:
        self.marks = [self._mark()]

    def __call__(self, _step, _total, _preview) -> None:
        self.marks.append(self._mark())

    def _mark(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self) -> list[float]:
        if self.cuda:
            return [a.elapsed_time(b) / 1000 for a, b in zip(self.marks, self.marks[1:])]
        return [b - a for a, b in zip(self.marks, self.marks[1:])]


def _mean(values: list[float]) -> float | None:
    return round(sum(values) / len(values), 4) if values else None


def step_modes(plan) -> list[str | None]:
    """Each step's FP8 mode of the generation tower (``"W8A16"`` / ``"W8A8"``), None where no FP8 layer runs."""
    return [None if p is None else p.generation for p in plan.precision]


def step_breakdown(step_s: list[float], plan) -> dict:
    """Per-step time split by what the step ran: its FP8 mode (W8A16 / W8A8) and, under SeaCache, how many of its
    contexts (branch × item) ran the layer stack; the SeaCache cost model ``step = fixed + per_context × computed``
    fitted over the steps (least squares), so a reused context's saving is read directly."""
    out = {"step_s": [round(t, 4) for t in step_s]}
    modes = step_modes(plan)
    for mode in ("W8A16", "W8A8"):
        if mode in modes:
            out[f"{mode.lower()}_step_s"] = _mean([t for t, m in zip(step_s, modes) if m == mode])
    trace = [] if plan.cache is None else plan.cache.trace
    if trace:
        computed = [sum(c for s, *_, c in trace if s == i) for i in range(len(step_s))]
        contexts = max(sum(1 for s, *_ in trace if s == i) for i in range(len(step_s)))
        out["step_s_by_contexts_computed"] = {
            str(k): _mean([t for t, c in zip(step_s, computed) if c == k]) for k in sorted(set(computed))}
        n, sx, sy = len(step_s), sum(computed), sum(step_s)
        sxx, sxy = sum(c * c for c in computed), sum(c * t for c, t in zip(computed, step_s))
        if n * sxx - sx * sx > 0:
            per_context = (n * sxy - sx * sy) / (n * sxx - sx * sx)
            out["cost_model"] = dict(fixed_s=round((sy - per_context * sx) / n, 4),
                                     per_context_s=round(per_context, 4), contexts_per_step=contexts)
    return out


def projected_35(breakdown: dict, plan) -> float | None:
    """The 35-step denoise time of a shorter run from its per-step means: exact as 35 × its mean step, FP8 as NVIDIA's
    policy at 35 steps (its W8A16 and W8A8 step means); None under SeaCache, whose reuse depends on the whole
    trajectory."""
    if plan.cache is not None:
        return None
    if plan.fp8 is None:
        return round(STEPS * sum(breakdown["step_s"]) / len(breakdown["step_s"]), 2)
    w8a8 = [m == "W8A8" for m in step_modes(plan)]
    if not any(w8a8):  # too short to reach a W8A8 step (or FP8 compute not run here): no W8A8 time to project
        return None
    if all(w8a8):
        return round(STEPS * breakdown["w8a8_step_s"], 2)
    high = w8a8.index(True) + w8a8[::-1].index(True)  # NVIDIA's policy: W8A16 for the first and last n steps
    return round((STEPS - high) * breakdown["w8a8_step_s"] + high * breakdown["w8a16_step_s"], 2)


def run_mode(pipe, text, name: str, mode: str, options, shape, args) -> dict:
    """One timed run of ``mode`` at shape ``name`` after its warm-up (``args``: ``--dir``, ``--steps``,
    ``--warmup-steps``); its final latents saved for ``compare``; the record."""
    from safetensors.torch import save_file

    from cosmos3_core.sampling.sea_cache import SeaCacheConfig

    h, w, frames = shape
    steps, warm = args.steps, args.warmup_steps
    sampling = dict(seed=0, guidance=GUIDANCE, sound=frames > 1,
                    sea_cache=SeaCacheConfig(threshold=THRESHOLD) if "sea" in mode else None)
    if warm and mode != "exact":  # 8 steps: SeaCache reuses, NVIDIA's FP8 policy runs W8A8 steps 4 and 5
        warm = max(warm, 8)
    if warm:
        pipe.run(api.plan(pipe, text, steps=warm, options=options, **sampling))
    sync()
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    plan = api.plan(pipe, text, steps=steps, options=options, **sampling)
    clock = StepClock(plan.device.type)
    t0 = time.perf_counter()
    clock.start()
    result = pipe.run(plan, callback=clock)
    sync()
    seconds = time.perf_counter() - t0
    tensors = {"latents": result.latents.float().cpu().contiguous()}
    if result.sound is not None:
        tensors["sound"] = result.sound.float().cpu().contiguous()
    save_file(tensors, str(Path(args.dir) / f"{name}-{mode}.safetensors"))
    trace = [] if plan.cache is None else plan.cache.trace
    breakdown = step_breakdown(clock.seconds(), plan)
    return dict(steps=steps, denoise_s=round(seconds, 2),
                denoise_35_steps_s=round(seconds, 2) if steps == STEPS else projected_35(breakdown, plan),
                projected=steps != STEPS, warmup_steps=warm,
                peak_gib=round(torch.cuda.max_memory_allocated() / 2**30, 1) if torch.cuda.is_available() else None,
                fp8=plan.fp8, fp8_w8a8_steps=step_modes(plan).count("W8A8"),
                reused_contexts=sum(not c for *_, c in trace) if trace else None,
                contexts=len(trace) or None, compiled=options.on(plan.device).compiles, frames=frames, height=h,
                width=w, **breakdown)


def project_reuse(runs: dict, name: str, speedup: float = PUBLISHED_SEA_SPEEDUP) -> dict | None:
    """What SeaCache would give at ``name`` if it reused as often as vLLM-Omni measured on real Nano weights
    (``speedup`` × over exact): the reuse fraction ``r`` of contexts that makes exact / SeaCache = ``speedup`` under
    the SeaCache run's cost model (``fixed + per_context × computed`` per step), then the same ``r`` under the
    FP8+SeaCache run's cost model (one line through all its steps, W8A16 and W8A8 alike). ``r`` is held to [0, 1]
    and the times are those at the held ``r``; whether SeaCache's own limits (at most ``max_consecutive_cached``
    reuses in a row, the first and last steps computed) allow that ``r`` is not checked. A projection from measured
    per-step costs, not a measurement."""
    exact, sea, both = (runs.get(f"{name}/{m}") for m in ("exact", "sea", "fp8+sea"))
    if not exact or not sea or "cost_model" not in sea:
        return None
    target = exact["denoise_35_steps_s"] / speedup / STEPS  # the mean step that gives ``speedup``
    model = sea["cost_model"]
    full = model["fixed_s"] + model["per_context_s"] * model["contexts_per_step"]
    saved_per_step = model["per_context_s"] * model["contexts_per_step"]  # all contexts reused
    reuse = min(max((full - target) / saved_per_step, 0.0), 1.0) if saved_per_step > 0 else None
    out = dict(published_speedup=speedup, reuse_fraction_needed=None if reuse is None else round(reuse, 3),
               measured_reuse_fraction=round(sea["reused_contexts"] / sea["contexts"], 3),
               sea_35_steps_s=None if reuse is None else round(STEPS * (full - saved_per_step * reuse), 2))
    if both and "cost_model" in both and reuse is not None:
        m = both["cost_model"]
        out["fp8_sea_35_steps_s"] = round(STEPS * (m["fixed_s"] + m["per_context_s"] * m["contexts_per_step"]
                                                   * (1 - reuse)), 2)
    return out


def merge(path: str | None, results: dict, section: str | None = None) -> None:
    """Merge ``results`` into the JSON at ``path`` now (a run cut off later keeps what it measured) — at its top
    level, or into its dict ``section`` (kept entries stay) — through a file beside it renamed over it: a process
    killed while writing leaves the earlier record whole."""
    if not path:
        return
    file = Path(path)
    old = json.loads(file.read_text()) if file.is_file() else {}
    if section is None:
        old.update(results)
    else:
        old[section] = {**old.get(section, {}), **results}
    partial = file.with_name(file.name + ".partial")
    partial.write_text(json.dumps(old, indent=1))
    os.replace(partial, file)


def pipeline_factory(tiny: bool, tmp: Path):
    """``(make_pipe, device)``: ``make_pipe()`` a ``Cosmos3Pipeline`` over the one model (made again after the model
    turns FP8, so that its ``info`` says so)."""
    from cosmos3_core.pipeline import Cosmos3Pipeline

    if tiny:
        from cosmos3_core.testing.tiny import build_tiny_checkpoint

        base = Cosmos3Pipeline.load(build_tiny_checkpoint(tmp / "tiny", variant="nano", sound=True, seed=0),
                                    dtype=torch.float32)
        return (lambda: Cosmos3Pipeline(base.checkpoint_dir, base.transformer, base.vae, base.tokenizer,
                                        base.sound_decoder)), "cpu"
    from cosmos3_core.vae.audio import Cosmos3SoundDecoder
    from cosmos3_core.vae.video import Cosmos3VAE

    model = build_ours("cuda")
    files, vae, audio, tokenizer = make_components("cuda", tmp)
    vae, audio = Cosmos3VAE(vae), Cosmos3SoundDecoder(audio)
    return (lambda: Cosmos3Pipeline(files, model, vae, tokenizer, audio)), "cuda"


def measure(args, make_pipe, shapes: dict, options) -> None:
    """Every bf16 mode at every resolution, then (calibrated over those resolutions) the model turned FP8 and every
    FP8 mode: one calibration for all shapes, as a checkpoint has."""
    Path(args.dir).mkdir(parents=True, exist_ok=True)
    pipe = make_pipe()
    names = args.resolutions.split(",")
    modes = [m for m in MODES if m in args.modes.split(",")]

    def encode(name):
        h, w, frames = shapes[name]
        return pipe.encode_text(LONG_PROMPT, None, num_frames=frames, height=h, width=w, fps=24.0, options=options)

    for fp8 in (False, True):
        todo = [m for m in modes if ("fp8" in m) == fp8]
        if fp8 and todo:
            amax: dict[str, float] = {}
            for name in names:  # eager: the calibration hooks stay out of the compiled graphs
                found = calibrate(pipe, encode(name), dataclasses.replace(options, compile="off"), shapes[name][2] > 1)
                amax.update({k: max(v, amax.get(k, 0.0)) for k, v in found.items()})
            merge(args.out, {"fp8_linears": to_fp8_(pipe.transformer, amax)})
            pipe = make_pipe()  # its info now says FP8; the text K/V of the W8A16 steps come from the FP8 weights
        for name in names:
            text = encode(name) if todo else None
            for mode in todo:
                record = run_mode(pipe, text, name, mode, options, shapes[name], args)
                print(name, mode, json.dumps(record), flush=True)
                merge(args.out, {f"{name}/{mode}": record})
                merge_projections(args.out, [name])


def merge_projections(path: str | None, names: list[str]) -> None:
    """``projection/<resolution>`` (``project_reuse``) from what the JSON at ``path`` holds now (its runs may come
    from several calls)."""
    if not path:
        return
    runs = json.loads(Path(path).read_text())
    found = {f"projection/{n}": proj for n in names if (proj := project_reuse(runs, n)) is not None}
    for key, proj in found.items():
        print(key, json.dumps(proj), flush=True)
    merge(path, found)


def compare(args, make_pipe, device: str) -> None:
    from safetensors.torch import load_file

    vae, out_dir = make_pipe().vae, Path(args.dir)
    for name in args.resolutions.split(","):
        exact = load_file(str(out_dir / f"{name}-exact.safetensors"))["latents"]
        exact_frames = vae.decode(exact.to(device)).float()
        for mode in MODES[1:]:
            path = out_dir / f"{name}-{mode}.safetensors"
            if not path.is_file():
                continue
            lat = load_file(str(path))["latents"]
            frames = vae.decode(lat.to(device)).float()
            mse = torch.mean((frames - exact_frames) ** 2).item()
            entry = dict(
                latent_cosine=round(torch.nn.functional.cosine_similarity(
                    lat.flatten().double(), exact.flatten().double(), dim=0).item(), 5),
                frames_psnr_db=round(10 * torch.log10(torch.tensor(1.0 / max(mse, 1e-12))).item(), 2))
            print(name, mode, entry, flush=True)
            merge(args.out, {f"{name}/{mode}": entry}, section="compare")


def machine(options) -> dict:
    """What the figures ran on: the GPU, torch, whether FlashAttention-4 could run (attention ``auto`` then takes it
    where it pays: kernels/attention.py)."""
    from cosmos3_core.kernels.attention import flash4_unavailable_reason

    cuda = torch.cuda.is_available()
    return dict(gpu=torch.cuda.get_device_name() if cuda else "cpu", torch=torch.__version__,
                flash4=bool(cuda and not flash4_unavailable_reason(torch.device("cuda"))),
                compile=options.compile, date=time.strftime("%Y-%m-%d"))


def main() -> None:
    from cosmos3_core.runtime import RuntimeOptions

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--resolutions", default="t2i,480p", help=f"comma-separated, of {', '.join(RESOLUTIONS)}")
    p.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    p.add_argument("--dir", required=True, help="where the final latents of each run go (and are compared from)")
    p.add_argument("--compile", choices=("auto", "on", "off"), default="auto",
                   help="RuntimeOptions.compile of every run (auto: compiled on CUDA, the benchmark setting)")
    p.add_argument("--steps", type=int, default=STEPS,
                   help="steps of the timed run (default 35; fewer: exact and FP8 get their 35-step time projected "
                        "from the per-step means, SeaCache its cost model only)")
    p.add_argument("--warmup-steps", type=int, default=STEPS,
                   help="steps of the warm-up run of each mode before the timed one (default: a whole first run; "
                        "a fast mode's warm-up runs at least 8, so that it compiles the SeaCache and W8A8 graphs)")
    p.add_argument("--compare", action="store_true", help="decode the saved latents; cosine and PSNR vs exact")
    p.add_argument("--tiny", action="store_true", help="tiny checkpoint on the CPU: checks the script runs")
    p.add_argument("--out", default=None, help="merge the results into this JSON file")
    args = p.parse_args()
    if not args.tiny and not torch.cuda.is_available():
        sys.exit("bench_fast_modes: needs a CUDA GPU (FP8 W8A8 needs sm 8.9+); --tiny checks the script on the CPU.")
    shapes = TINY_RESOLUTIONS if args.tiny else RESOLUTIONS
    options = RuntimeOptions(compile="off", fp8_gemm="emulate") if args.tiny else RuntimeOptions(compile=args.compile)
    merge(args.out, machine(options), section="machine")  # a later call keeps the record's notes on the machine
    with tempfile.TemporaryDirectory() as tmp:
        make_pipe, device = pipeline_factory(args.tiny, Path(tmp))
        if not args.compare:
            measure(args, make_pipe, shapes, options)
        if args.compare or args.tiny:
            compare(args, make_pipe, device)


if __name__ == "__main__":
    main()

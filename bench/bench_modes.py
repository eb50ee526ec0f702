"""Generation modes beyond a plain clip, end to end on one GPU: action modes, distilled 4-step, batches.

One script, one subcommand per mode; each writes a results JSON (BENCHMARKS.md's "Other modes" reads them) and
``--tiny`` runs the same code on a tiny random checkpoint on the CPU (a check that it runs, not a measurement):

    python bench/bench_modes.py action --mode policy --input 480x640 --chunk-size 16 --out bench/results/action_policy.json
    python bench/bench_modes.py action --mode inverse_dynamics --out bench/results/action_inverse.json
    python bench/bench_modes.py distilled --out bench/results/distilled.json
    python bench/bench_modes.py batch --out bench/results/batch.json [--batch 4] [--shapes t2i1024,256p]
    python bench/bench_modes.py action --tiny --out /tmp/action_tiny.json       # likewise distilled / batch --tiny

``action``: one action-mode generation (policy / forward dynamics / inverse dynamics) end to end, timed per stage
through the action stages of ``cosmos3_core.modes.action`` (``encode`` → ``tokenize`` → ``prefill`` → ``plan``, then
``Cosmos3Pipeline.run`` and ``decode_video``), eager.
Nano-shaped random bf16 weights (``common.NANO``, action head included) stand in for the checkpoint — the step cost
is the real one, the output is noise. The Wan2.2 VAE is full size with random weights; the tokenizer is the tiny
checkpoint's (the action caption is ~60 tokens either way). Stages: VAE encode of the conditioning frames, text
prefill (the JSON action caption), the denoising loop (30 steps, cfg 1 → one branch), VAE decode; plus peak GPU
memory and the generation token count (vision patches + actions).

``distilled``: a distilled 4-step run (the Cosmos3-Super-*-4Step fast path) at two shapes: image-to-video at 720p /
189 frames (VAE-encode the start frame, text prefill, 4 stochastic steps with one branch, VAE decode) and
text-to-image at 1024x1024. **Stand-in weights**: no Super weights exist here, so the step cost comes from a
*Nano-size* transformer with random bf16 weights (hidden 4096, 36 layers — Super is 5120 / 64 layers, so a Super
step costs ~2.7x this) and a full-size random Wan2.2 VAE; the distilled files (``modular_model_index.json`` with
``distilled_sigmas``, the stochastic FlowMatchEuler scheduler, a tokenizer) come from the tiny builder
(``cosmos3_core.testing.tiny``, ``distilled=True``). The run goes through ``api.generate`` of a
``Request`` (eager) exactly as the CLI does, so the schedule, step count (4) and guidance (1, one branch) are read
from those files by ``resolve.resolve``.

``batch``: N seeds in one run (one forward per step over N items × both branches) vs one at a time. Full-size
random-weight Nano in bf16, the same weights for diffusers 0.42.1 (its pipeline makes one sample per call: one
guided step = two ``Cosmos3OmniTransformer.forward`` passes). Per shape it times one guided denoising step for batch
1 and batch N (ours, eager and with ``RuntimeOptions(compile=True)``) and diffusers' step, and reports results/s for 35 steps plus the VAE decode
of each result (measured once per shape).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import LONG_PROMPT, NANO, WAN22_VAE, gib, random_bf16_weights  # noqa: E402
from cosmos3_core import api  # noqa: E402


# ---------------------------------------------------------------------------------------------------- action modes
def device_sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def action_full_pipeline(device: str, tmp: Path):
    """Nano-size random-weight pipeline on ``device`` (bf16), reusing common.py's builders."""
    from diffusers import Cosmos3OmniTransformer

    from common import make_components
    from cosmos3_core.config import Cosmos3Config
    from cosmos3_core.model.transformer import Cosmos3Transformer
    from cosmos3_core.pipeline import Cosmos3Pipeline
    from cosmos3_core.vae.audio import Cosmos3SoundDecoder
    from cosmos3_core.vae.video import Cosmos3VAE

    with torch.device("meta"):
        ref = Cosmos3OmniTransformer(**NANO)
    ref = random_bf16_weights(ref, device)
    with torch.device("meta"):
        ours = Cosmos3Transformer(Cosmos3Config.from_dict(NANO), skip_modules=("lm_head",))
    state = {k: v for k, v in ref.state_dict().items() if not k.startswith("lm_head")}
    ours.load_state_dict(state, strict=True, assign=True)  # shares the storage: no second copy
    del ref, state
    gc.collect()
    files, vae, audio, tokenizer = make_components(device, tmp)
    pipe = Cosmos3Pipeline(files, ours.eval().requires_grad_(False), Cosmos3VAE(vae), tokenizer,
                           Cosmos3SoundDecoder(audio))
    return pipe


def action_tiny_pipeline(tmp: Path):
    from cosmos3_core.pipeline import Cosmos3Pipeline
    from cosmos3_core.testing.tiny import build_tiny_checkpoint

    ckpt = build_tiny_checkpoint(tmp / "tiny", variant="nano", sound=False, seed=0)
    return Cosmos3Pipeline.load(ckpt, dtype=torch.float32, device="cpu")


def action_run(pipe, args, device: str) -> dict:
    from cosmos3_core import defaults
    from cosmos3_core.modes import action as act
    from cosmos3_core.modes.action import EMBODIMENT_TO_RAW_ACTION_DIM
    from cosmos3_core.request import ActionRequest
    from cosmos3_core.runtime import RuntimeOptions

    h, w = (int(v) for v in args.input.split("x"))
    rng = np.random.default_rng(0)
    frames = rng.random((args.chunk_size + 1, h, w, 3)).astype(np.float32)
    width = EMBODIMENT_TO_RAW_ACTION_DIM[args.domain]
    request = ActionRequest(
        mode=args.mode, chunk_size=args.chunk_size, domain_name=args.domain, resolution_tier=args.tier,
        raw_actions=rng.standard_normal((args.chunk_size, width)).astype(np.float32)
        if args.mode == "forward_dynamics" else None,
        image=frames[0] if args.mode != "inverse_dynamics" else None,
        video=frames if args.mode == "inverse_dynamics" else None,
    )
    stages: dict[str, float] = {}
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    device_sync(device)
    t0 = time.perf_counter()
    condition = act.encode_action_condition(pipe.vae, request, pipe.config)
    device_sync(device)
    stages["vae_encode_s"] = time.perf_counter() - t0
    t1 = time.perf_counter()
    ids = act.action_prompt_ids(pipe.tokenizer, condition, "The robot arm picks up the red cup and places it in the "
                                "bowl.", "", fps=defaults.ACTION_FPS, use_system_prompt=False)
    text = act.prefill(pipe, ids, condition, fps=defaults.ACTION_FPS, options=RuntimeOptions())
    device_sync(device)
    stages["prefill_s"] = time.perf_counter() - t1
    plan = api.plan(pipe, text, action=condition, seed=0, steps=args.steps, guidance=defaults.ACTION_GUIDANCE)
    t1 = time.perf_counter()
    result = pipe.run(plan)
    device_sync(device)
    stages[f"denoise_{args.steps}_steps_s"] = time.perf_counter() - t1
    stages["step_s"] = stages[f"denoise_{args.steps}_steps_s"] / args.steps
    t1 = time.perf_counter()
    video = pipe.decode_video(result.latents) if args.mode != "inverse_dynamics" else None
    device_sync(device)
    stages["vae_decode_s"] = time.perf_counter() - t1
    total = time.perf_counter() - t0
    out = dict(
        {k: round(v, 4) for k, v in stages.items()}, total_s=round(total, 3), mode=args.mode,
        domain_name=args.domain, chunk_size=args.chunk_size, resolution_tier=args.tier, input=args.input,
        canvas=list(condition.canvas), content=list(condition.content), latent_shape=list(condition.latent_shape),
        generation_tokens=plan.num_tokens, cond_tokens=text.cond.length,
        video_shape=None if video is None else list(video.shape),
        action_shape=list(result.action.shape), finite=bool(torch.isfinite(result.latents).all()),
    )
    if device == "cuda":
        out["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    return out


def action_main(argv: list[str]) -> None:
    from cosmos3_core import defaults
    from cosmos3_core.modes import action as act

    p = argparse.ArgumentParser(prog="bench_modes.py action", description="One action-mode generation end to end, per stage.")
    p.add_argument("--out", required=True, help="results JSON")
    p.add_argument("--mode", choices=act.ACTION_MODES, default="policy")
    p.add_argument("--domain", choices=act.DOMAINS, default=defaults.ACTION_DOMAIN)
    p.add_argument("--chunk-size", type=int, default=defaults.ACTION_CHUNK_SIZE)
    p.add_argument("--tier", type=int, choices=act.RESOLUTION_TIERS, default=defaults.ACTION_RESOLUTION_TIER)
    p.add_argument("--input", default="480x640", help="input frame size HxW (default %(default)s)")
    p.add_argument("--steps", type=int, default=defaults.ACTION_STEPS)
    p.add_argument("--tiny", action="store_true", help="tiny random checkpoint on the CPU (checks the script)")
    args = p.parse_args(argv)
    if args.tiny:
        device = "cpu"
        args.steps = min(args.steps, 2)
        args.chunk_size = min(args.chunk_size, 4)
        args.tier = 256
        args.input = "64x96" if args.input == p.get_default("input") else args.input
    else:
        if not torch.cuda.is_available():
            sys.exit("bench_modes.py action: full size needs a CUDA device; use --tiny to check the script on the CPU.")
        device = "cuda"
    with tempfile.TemporaryDirectory() as tmp, torch.no_grad():
        pipe = action_tiny_pipeline(Path(tmp)) if args.tiny else action_full_pipeline(device, Path(tmp))
        result = action_run(pipe, args, device)
    results = dict(
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        device=torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu",
        torch=torch.__version__, weights="tiny random (script check)" if args.tiny else
        "Nano-size random bf16 (transformer + Wan2.2 VAE); step cost real, output noise",
        action=result,
    )
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


# ------------------------------------------------------------------------------------------------ distilled 4-step
DISTILLED_SHAPES = {"i2v_720p_189f": (720, 1280, 189, True), "t2i_1024": (1024, 1024, 1, False)}
DISTILLED_TINY_SHAPES = {"i2v_720p_189f": (64, 96, 9, True), "t2i_1024": (64, 64, 1, False)}


def distilled_pipeline(tmp: Path, device: str, tiny: bool):
    """``Cosmos3Pipeline`` on the distilled tiny files; full-size random Nano transformer + Wan2.2 VAE unless tiny."""
    from diffusers import AutoencoderKLWan

    from cosmos3_core.config import Cosmos3Config
    from cosmos3_core.model.transformer import Cosmos3Transformer
    from cosmos3_core.pipeline import Cosmos3Pipeline
    from cosmos3_core.sampling.prompt import load_tokenizer
    from cosmos3_core.testing.tiny import build_tiny_checkpoint
    from cosmos3_core.vae.video import Cosmos3VAE

    files = build_tiny_checkpoint(tmp / "files", variant="super", seed=0, distilled=True)
    if tiny:
        return Cosmos3Pipeline.load(files, dtype=torch.float32, device=device)
    config = Cosmos3Config.from_dict(NANO)
    skip = ("lm_head", "action_proj_in", "action_proj_out", "action_modality_embed")
    with torch.device("meta"):
        model = Cosmos3Transformer(config, skip_modules=skip)
    model = random_bf16_weights(model, device)
    vae = AutoencoderKLWan(**WAN22_VAE).to(device=device, dtype=torch.bfloat16).eval().requires_grad_(False)
    return Cosmos3Pipeline(files, model, Cosmos3VAE(vae), load_tokenizer(files))


def distilled_run_shape(pipe, name: str, shape, results: dict, device: str, prompt: str) -> None:
    from cosmos3_core.api import generate
    from cosmos3_core.request import Request
    from cosmos3_core.runtime import RuntimeOptions

    h, w, frames, with_image = shape
    rng = np.random.default_rng(0)
    image = rng.random((h, w, 3), dtype=np.float32) if with_image else None
    request = Request(prompt=prompt, num_frames=frames, height=h, width=w, seed=0, image=image,
                      options=RuntimeOptions(compile=False))
    steps = []

    def on_step(step, total, _preview):
        steps.append(step)

    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    out = generate(pipe, request, callback=on_step)
    total = time.perf_counter() - start
    frames_out = out.frames
    assert steps == list(range(1, pipe.distilled.steps + 1)), steps  # really the checkpoint's fixed schedule
    assert frames_out.shape == (frames, h, w, 3) and torch.isfinite(frames_out).all()
    results["runs"][name] = dict(
        height=h, width=w, frames=frames, image_condition=with_image, steps=len(steps),
        **{f"{k}_s": round(v, 2) for k, v in out.timings.items()}, total_s=round(total, 2),
        peak_gib=gib(torch.cuda.max_memory_allocated()) if device == "cuda" else None,
    )
    print(name, results["runs"][name], flush=True)


def distilled_main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="bench_modes.py distilled", description="A distilled 4-step run end to end.")
    p.add_argument("--out", default=None, help="results JSON (default: print only)")
    p.add_argument("--shapes", default=",".join(DISTILLED_SHAPES), help=f"comma list of {list(DISTILLED_SHAPES)}")
    p.add_argument("--tiny", action="store_true", help="CPU smoke check: tiny checkpoint, tiny sizes, fp32")
    args = p.parse_args(argv)
    import diffusers

    device = "cpu" if args.tiny else "cuda"
    shapes = DISTILLED_TINY_SHAPES if args.tiny else DISTILLED_SHAPES
    torch.backends.cuda.matmul.allow_tf32 = False
    results = dict(
        date=datetime.date.today().isoformat(), torch=torch.__version__, diffusers=diffusers.__version__,
        python=platform.python_version(), gpu=torch.cuda.get_device_name() if device == "cuda" else "cpu",
        weights="tiny random (CPU smoke check)" if args.tiny else
        "random bf16, Nano-size transformer (Super is ~2.7x per step) + full Wan2.2 VAE",
        runs={},
    )
    with tempfile.TemporaryDirectory() as tmp, torch.inference_mode():
        t0 = time.perf_counter()
        pipe = distilled_pipeline(Path(tmp), device, args.tiny)
        results["init_s"] = round(time.perf_counter() - t0, 1)
        if pipe.distilled is None:
            raise SystemExit("bench_modes.py distilled: the pipeline did not recognise the distilled files")
        results["distilled_sigmas"] = list(pipe.distilled.sigmas)
        prompt = "a red robot walking on the street at night" if args.tiny else LONG_PROMPT
        for name in filter(None, args.shapes.split(",")):
            distilled_run_shape(pipe, name, shapes[name], results, device, prompt)
            if args.out:
                Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps(results, indent=1))


# --------------------------------------------------------------------------------------------------------- batches
BATCH_SHAPES = {"t2i1024": (1024, 1024, 1), "256p": (192, 320, 189)}
BATCH_STEPS = 35


def batch_timed(fn, device: str, iters: int = 3) -> float:
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / iters


def batch_main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="bench_modes.py batch", description="Batch throughput vs one at a time.")
    parser.add_argument("--out", default=None)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--shapes", default=",".join(BATCH_SHAPES))
    parser.add_argument("--tiny", action="store_true", help="CPU smoke run on a tiny checkpoint")
    args = parser.parse_args(argv)

    from cosmos3_core.kernels.compile import prepared
    from cosmos3_core.pipeline import Cosmos3Pipeline
    from cosmos3_core.runtime import RuntimeOptions

    tmp = Path(tempfile.mkdtemp())
    device = "cpu" if args.tiny else "cuda"
    ref = None
    if args.tiny:
        from cosmos3_core.testing.tiny import build_tiny_checkpoint

        pipe = Cosmos3Pipeline.load(build_tiny_checkpoint(tmp / "tiny", seed=0), dtype=torch.float32, device="cpu")
        shapes = {"tiny": (64, 96, 9)}
    else:
        from common import COND_TOKENS, LONG_PROMPT, build_models, make_components  # noqa: F401
        from cosmos3_core.vae.audio import Cosmos3SoundDecoder
        from cosmos3_core.vae.video import Cosmos3VAE

        ref, ours = build_models(device)
        files, vae, audio, tokenizer = make_components(device, tmp)
        pipe = Cosmos3Pipeline(files, ours, Cosmos3VAE(vae), tokenizer, Cosmos3SoundDecoder(audio))
        shapes = {k: BATCH_SHAPES[k] for k in args.shapes.split(",")}
    prompt = "a red robot walks down a busy city street at night " * (1 if args.tiny else 30)
    results = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "batch": args.batch,
               "steps": BATCH_STEPS, "shapes": {}}
    for name, (h, w, frames) in shapes.items():
        text = pipe.encode_text(prompt, None, num_frames=frames, height=h, width=w, fps=24.0)
        row = dict(height=h, width=w, frames=frames, cond_tokens=text.cond.length)
        for compiled in (False, True) if device == "cuda" else (False,):
            options = RuntimeOptions(compile=compiled)
            if compiled:
                prepared()  # the compile settings, as Cosmos3Pipeline.run puts them in place for a compiled run
            for n in (1, args.batch):
                plan = api.plan(pipe, text, seed=0, steps=1, guidance=6.0, batch_size=n, options=options)
                step = plan.guidance[0]
                x = plan.stream("vision").init
                t = plan.timesteps.to(plan.device)[0]
                s = batch_timed(lambda x=x, t=t, step=step, options=options: pipe.transformer.denoise_step(
                    x, t, step.text, step.layout, options=options), device)
                row[f"{'compiled' if compiled else 'eager'}_step_s_batch{n}"] = round(s, 4)
        plan = api.plan(pipe, text, seed=0, steps=1, guidance=6.0)
        latent = plan.stream("vision").init
        decode_s = batch_timed(lambda latent=latent: pipe.decode_video(latent), device, iters=1)
        row["vae_decode_s"] = round(decode_s, 3)
        best = "compiled" if device == "cuda" else "eager"
        for n in (1, args.batch):
            per_run = BATCH_STEPS * row[f"{best}_step_s_batch{n}"] + n * decode_s
            row[f"results_per_s_batch{n}"] = round(n / per_run, 3)
        if ref is not None:
            from common import reference_inputs

            ids = text.cond.token_ids.tolist()
            neg = text.uncond.token_ids.tolist()
            inputs = [reference_inputs(ref, i, latent.to(torch.bfloat16), 24.0, 900) for i in (ids, neg)]
            with torch.no_grad():
                ref_s = batch_timed(lambda inputs=inputs: [ref(**kw) for kw in inputs], device)
            row["diffusers_step_s"] = round(ref_s, 4)
            row["diffusers_results_per_s"] = round(1 / (BATCH_STEPS * ref_s + decode_s), 3)
        results["shapes"][name] = row
        print(name, row, flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))


MODES = {"action": action_main, "distilled": distilled_main, "batch": batch_main}


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in MODES:
        sys.exit(f"usage: bench_modes.py {{{','.join(MODES)}}} [options]  (see the module docstring; <mode> --help)")
    MODES[sys.argv[1]](sys.argv[2:])


if __name__ == "__main__":
    main()

"""Batch throughput: N seeds in one run (one forward per step over N items × both branches) vs one at a time.

Full-size random-weight Cosmos3-Nano in bf16 on one GPU, the same weights for diffusers 0.42.1 (its pipeline makes
one sample per call: one guided step = two ``Cosmos3OmniTransformer.forward`` passes). Per shape it times one guided
denoising step for batch 1 and batch N (ours, eager and compiled) and diffusers' step, and reports results/s for 35
steps plus the VAE decode of each result (measured once per shape).

    python bench/bench_batch.py --out bench/results_batch.json [--batch 4] [--shapes t2i1024,256p]
    python bench/bench_batch.py --tiny      # CPU smoke run on a tiny checkpoint (numbers meaningless)
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

SHAPES = {"t2i1024": (1024, 1024, 1), "256p": (192, 320, 189)}
STEPS = 35


def timed(fn, device: str, iters: int = 3) -> float:
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / iters


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--tiny", action="store_true", help="CPU smoke run on a tiny checkpoint")
    args = parser.parse_args()

    from cosmos3_core.pipeline import Cosmos3Pipeline

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
        shapes = {k: SHAPES[k] for k in args.shapes.split(",")}
    prompt = "a red robot walks down a busy city street at night " * (1 if args.tiny else 30)
    results = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "batch": args.batch,
               "steps": STEPS, "shapes": {}}
    for name, (h, w, frames) in shapes.items():
        text = pipe.encode_text(prompt, None, num_frames=frames, height=h, width=w, fps=24.0)
        row = dict(height=h, width=w, frames=frames, cond_tokens=text.cond.length)
        for compiled in (False, True) if device == "cuda" else (False,):
            for n in (1, args.batch):
                plan = pipe.plan(text, seed=0, steps=1, guidance=6.0, batch_size=n)
                pipe.transformer.compile_generation_layers(compiled)
                step = plan.guidance[0]
                x = plan.stream("vision").init
                t = plan.timesteps.to(plan.device)[0]
                s = timed(lambda x=x, t=t, step=step: pipe.transformer.denoise_step(x, t, step.text, step.layout), device)
                row[f"{'compiled' if compiled else 'eager'}_step_s_batch{n}"] = round(s, 4)
        pipe.transformer.compile_generation_layers(False)
        plan = pipe.plan(text, seed=0, steps=1, guidance=6.0)
        latent = plan.stream("vision").init
        decode_s = timed(lambda latent=latent: pipe.decode_video(latent), device, iters=1)
        row["vae_decode_s"] = round(decode_s, 3)
        best = "compiled" if device == "cuda" else "eager"
        for n in (1, args.batch):
            per_run = STEPS * row[f"{best}_step_s_batch{n}"] + n * decode_s
            row[f"results_per_s_batch{n}"] = round(n / per_run, 3)
        if ref is not None:
            from common import reference_inputs

            ids = text.cond.token_ids.tolist()
            neg = text.uncond.token_ids.tolist()
            inputs = [reference_inputs(ref, i, latent.to(torch.bfloat16), 24.0, 900) for i in (ids, neg)]
            with torch.no_grad():
                ref_s = timed(lambda inputs=inputs: [ref(**kw) for kw in inputs], device)
            row["diffusers_step_s"] = round(ref_s, 4)
            row["diffusers_results_per_s"] = round(1 / (STEPS * ref_s + decode_s), 3)
        results["shapes"][name] = row
        print(name, row, flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

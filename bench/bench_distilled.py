"""End-to-end time of a distilled 4-step run (the Cosmos3-Super-*-4Step fast path), on one GPU.

Two shapes: image-to-video at 720p / 189 frames (the -Image2Video-4Step use: VAE-encode the start frame, text
prefill, 4 stochastic steps with one branch, VAE decode) and text-to-image at 1024x1024 (-Text2Image-4Step).

**Stand-in weights.** No Super weights exist here, so the step cost comes from a *Nano-size* transformer with random
bf16 weights (hidden 4096, 36 layers — Super is 5120 / 64 layers, so a Super step costs ~2.7x this) and a full-size
random Wan2.2 VAE; the distilled files (``modular_model_index.json`` with ``distilled_sigmas``, the stochastic
FlowMatchEuler scheduler, a tokenizer) come from the tiny builder (``cosmos3_core.testing.tiny``, ``distilled=True``). The
run goes through ``Cosmos3Pipeline.generate`` exactly as the CLI does, so the schedule, step count (4) and guidance
(1, one branch) are read from those files. Random weights: the numbers are speed, not quality.

    python bench/bench_distilled.py --out bench/results_distilled.json          # H200
    python bench/bench_distilled.py --tiny                                       # CPU smoke check (seconds)
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import LONG_PROMPT, NANO, WAN22_VAE, gib, random_bf16_weights  # noqa: E402

SHAPES = {"i2v_720p_189f": (720, 1280, 189, True), "t2i_1024": (1024, 1024, 1, False)}
TINY_SHAPES = {"i2v_720p_189f": (64, 96, 9, True), "t2i_1024": (64, 64, 1, False)}


def build_pipeline(tmp: Path, device: str, tiny: bool):
    """``Cosmos3Pipeline`` on the distilled tiny files; full-size random Nano transformer + Wan2.2 VAE unless tiny."""
    from diffusers import AutoencoderKLWan

    from cosmos3_core.config import Cosmos3Config
    from cosmos3_core.pipeline import Cosmos3Pipeline
    from cosmos3_core.sampling.prompt import load_tokenizer
    from cosmos3_core.testing.tiny import build_tiny_checkpoint
    from cosmos3_core.model.transformer import Cosmos3Transformer
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


def run_shape(pipe, name: str, shape, results: dict, device: str, prompt: str) -> None:
    from cosmos3_core.pipeline import GenerationRequest

    h, w, frames, with_image = shape
    rng = np.random.default_rng(0)
    image = rng.random((h, w, 3), dtype=np.float32) if with_image else None
    request = GenerationRequest(prompt=prompt, num_frames=frames, height=h, width=w, seed=0, image=image)
    steps = []

    def on_step(step, total, _preview):
        steps.append(step)

    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    out = pipe.generate(request, callback=on_step)
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=None, help="results JSON (default: print only)")
    p.add_argument("--shapes", default=",".join(SHAPES), help=f"comma list of {list(SHAPES)}")
    p.add_argument("--tiny", action="store_true", help="CPU smoke check: tiny checkpoint, tiny sizes, fp32")
    args = p.parse_args()
    import diffusers

    device = "cpu" if args.tiny else "cuda"
    shapes = TINY_SHAPES if args.tiny else SHAPES
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
        pipe = build_pipeline(Path(tmp), device, args.tiny)
        results["init_s"] = round(time.perf_counter() - t0, 1)
        if pipe.distilled is None:
            raise SystemExit("bench_distilled: the pipeline did not recognise the distilled files")
        results["distilled_sigmas"] = list(pipe.distilled.sigmas)
        prompt = "a red robot walking on the street at night" if args.tiny else LONG_PROMPT
        for name in filter(None, args.shapes.split(",")):
            run_shape(pipe, name, shapes[name], results, device, prompt)
            if args.out:
                Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

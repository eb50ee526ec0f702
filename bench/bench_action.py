"""One action-mode generation (policy / forward dynamics / inverse dynamics) end to end, timed per stage.

Full size (default, CUDA): Nano-shaped random bf16 weights (``common.NANO``, action head included) stand in
for the checkpoint — the step cost is the real one, the output is noise. The Wan2.2 VAE is full size with random
weights; the tokenizer is the tiny checkpoint's (the action caption is ~60 tokens either way). Stages: VAE encode of
the conditioning frames, text prefill (the JSON action caption), the denoising loop (30 steps, cfg 1 → one branch),
VAE decode; plus peak GPU memory and the generation token count (vision patches + actions).

``--tiny`` runs the same code on a tiny random checkpoint on the CPU (fp32, a few steps) to check the script.

    python bench/bench_action.py --out bench/results_action.json --mode policy --input 480x640 --chunk-size 16
    python bench/bench_action.py --tiny --out /tmp/action_tiny.json
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


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def build_full_pipeline(device: str, tmp: Path):
    """Nano-size random-weight pipeline on ``device`` (bf16), reusing common.py's builders."""
    from common import NANO, make_components, random_bf16_weights
    from diffusers import Cosmos3OmniTransformer

    from cosmos3_core.vae.audio import Cosmos3SoundDecoder
    from cosmos3_core.config import Cosmos3Config
    from cosmos3_core.pipeline import Cosmos3Pipeline
    from cosmos3_core.model.transformer import Cosmos3Transformer
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


def build_tiny_pipeline(tmp: Path):
    from cosmos3_core.pipeline import Cosmos3Pipeline
    from cosmos3_core.testing.tiny import build_tiny_checkpoint

    ckpt = build_tiny_checkpoint(tmp / "tiny", variant="nano", sound=False, seed=0)
    return Cosmos3Pipeline.load(ckpt, dtype=torch.float32, device="cpu")


def run(pipe, args, device: str) -> dict:
    from cosmos3_core import defaults
    from cosmos3_core.modes.action import ActionRequest, EMBODIMENT_TO_RAW_ACTION_DIM

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
    sync(device)
    t0 = time.perf_counter()
    condition = pipe.encode_action(request, who="bench")
    sync(device)
    stages["vae_encode_s"] = time.perf_counter() - t0
    t1 = time.perf_counter()
    ids = pipe.tokenize_action(condition, "The robot arm picks up the red cup and places it in the bowl.", "",
                               fps=defaults.ACTION_FPS, use_system_prompt=False)
    text = pipe.prefill_action_prompts(ids, condition, fps=defaults.ACTION_FPS)
    sync(device)
    stages["prefill_s"] = time.perf_counter() - t1
    plan = pipe.plan_action(text, condition, seed=0, steps=args.steps, guidance=defaults.ACTION_GUIDANCE,
                            who="bench")
    t1 = time.perf_counter()
    result = pipe.run(plan)
    sync(device)
    stages[f"denoise_{args.steps}_steps_s"] = time.perf_counter() - t1
    stages["step_s"] = stages[f"denoise_{args.steps}_steps_s"] / args.steps
    t1 = time.perf_counter()
    video = pipe.decode_video(result.latents) if args.mode != "inverse_dynamics" else None
    sync(device)
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


def main() -> None:
    from cosmos3_core.modes import action as act
    from cosmos3_core import defaults

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="results JSON")
    p.add_argument("--mode", choices=act.ACTION_MODES, default="policy")
    p.add_argument("--domain", choices=act.DOMAINS, default=defaults.ACTION_DOMAIN)
    p.add_argument("--chunk-size", type=int, default=defaults.ACTION_CHUNK_SIZE)
    p.add_argument("--tier", type=int, choices=act.RESOLUTION_TIERS, default=defaults.ACTION_RESOLUTION_TIER)
    p.add_argument("--input", default="480x640", help="input frame size HxW (default %(default)s)")
    p.add_argument("--steps", type=int, default=defaults.ACTION_STEPS)
    p.add_argument("--tiny", action="store_true", help="tiny random checkpoint on the CPU (checks the script)")
    args = p.parse_args()
    if args.tiny:
        device = "cpu"
        args.steps = min(args.steps, 2)
        args.chunk_size = min(args.chunk_size, 4)
        args.tier = 256
        args.input = "64x96" if args.input == p.get_default("input") else args.input
    else:
        if not torch.cuda.is_available():
            sys.exit("bench_action.py: full size needs a CUDA device; use --tiny to check the script on the CPU.")
        device = "cuda"
    with tempfile.TemporaryDirectory() as tmp, torch.no_grad():
        pipe = build_tiny_pipeline(Path(tmp)) if args.tiny else build_full_pipeline(device, Path(tmp))
        result = run(pipe, args, device)
    results = dict(
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        device=torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu",
        torch=torch.__version__, weights="tiny random (script check)" if args.tiny else
        "Nano-size random bf16 (transformer + Wan2.2 VAE); step cost real, output noise",
        action=result,
    )
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

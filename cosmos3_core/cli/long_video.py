"""The long-video half of the generation CLI (``python -m cosmos3_core.generate``): windows and Transfer.

``generate.py`` hands over when ``--control`` or ``--frames-per-chunk`` is given. The mp4 is written window by
window as the video is generated (a Ctrl-C leaves a playable file of the finished windows); ``--latents-out``
saves every window's raw Wan2.2 latent (``video_latent_000`` …) and ``--frames-out`` the stitched float frames
before 8-bit rounding (``frames`` ``[F, H, W, 3]`` in [0, 1]), for exact comparisons and post-processing.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from .. import defaults
from ..config import DTYPES


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("long video (windows) and Transfer")
    g.add_argument("--control", action="append", default=[], metavar="KEY=FILE",
                   help="Transfer: a control video, KEY one of edge, blur, depth, seg, wsm (repeat for several; "
                        "all the same length and size); the video is as long as the controls (--num-frames caps it)")
    g.add_argument("--frames-per-chunk", type=int, default=None,
                   help=f"generate in windows of this many frames (4k+1, e.g. {defaults.NUM_FRAMES}), each seeded by "
                        "the previous window's last frames; --num-frames may then exceed one clip")
    g.add_argument("--conditional-frames", type=int, default=None,
                   help=f"frames each window takes from the previous one (default {defaults.LONG_CONDITIONAL_FRAMES}; "
                        f"Transfer {defaults.TRANSFER_CONDITIONAL_FRAMES}); with --video, its first frames seed window 1")
    g.add_argument("--control-guidance", type=float, default=defaults.CONTROL_GUIDANCE,
                   help="Transfer: strength of the controls (1 = as given; else one more pass per step)")
    g.add_argument("--frames-out", default=None, help="also save the stitched float frames (.safetensors)")


def wants_windows(args: argparse.Namespace) -> bool:
    return bool(args.control) or args.frames_per_chunk is not None


def parse_controls(items: list[str]) -> dict[str, Path]:
    from ..modes.transfer import CONTROL_KEYS

    controls = {}
    for item in items:
        key, sep, path = item.partition("=")
        if not sep or not key or not path:
            raise ValueError(f"--control {item!r}: expected KEY=FILE.mp4 with KEY one of {', '.join(CONTROL_KEYS)}, "
                             "e.g. --control edge=edges.mp4.")
        if key not in CONTROL_KEYS:
            raise ValueError(f"--control {item!r}: {key!r} is not a Cosmos3 Transfer control; use one of "
                             f"{', '.join(CONTROL_KEYS)}.")
        if key in controls:
            raise ValueError(f"--control {key} is given twice; give each control key once.")
        if not Path(path).is_file():
            raise ValueError(f"--control {key}={path}: no such file.")
        controls[key] = Path(path)
    return controls


def run_windows(args: argparse.Namespace, check_common_args) -> dict[str, float]:
    """Check, load, generate window by window into ``args.out``; returns the CLI's stage timings."""
    import torch

    from .. import media
    from ..modes.long_video import LongVideoRequest, generate_long, plan_windows
    from ..pipeline import Cosmos3Pipeline
    from ..modes.stream_decode import FrameCollector

    ckpt = check_common_args(args)
    if args.frames_per_chunk is None:
        args.frames_per_chunk = defaults.NUM_FRAMES
    from .main import check_writable
    from ..sampling.prompt import check_text

    if args.negative_prompt is not None:
        check_text(args.negative_prompt, "--negative-prompt")
    if Path(args.out).suffix.lower() != ".mp4":
        raise ValueError(f"--out {args.out}: a windowed video is written as an .mp4 file.")
    check_writable(Path(args.out), "--out")
    for flag, path in (("--latents-out", args.latents_out), ("--frames-out", args.frames_out)):
        if path is not None:
            if Path(path).suffix.lower() != ".safetensors":
                raise ValueError(f"{flag} {path}: written as a .safetensors file; give a name ending in .safetensors.")
            check_writable(Path(path), flag)
    if args.sound and not (ckpt / "sound_tokenizer").is_dir():
        raise ValueError(f"--sound: checkpoint {ckpt} has no sound_tokenizer/ (Edge has no sound); drop --sound.")
    from ..sampling.distilled import read_distilled

    if read_distilled(ckpt) is not None:
        raise ValueError(f"--checkpoint {ckpt} is a distilled checkpoint; windowed generation and Transfer need a "
                         "base (non-distilled) checkpoint for now.")
    controls = parse_controls(args.control)
    timings = dict.fromkeys(("model_load", "preprocess", "inference", "to_cpu", "encode"), 0.0)
    start = time.perf_counter()
    request = LongVideoRequest(
        prompt=args.prompt[0] if len(args.prompt) == 1 else list(args.prompt), negative_prompt=args.negative_prompt,
        num_frames=args.num_frames if (args.num_frames_given or not controls) else None,
        frames_per_chunk=args.frames_per_chunk, conditional_frames=args.conditional_frames, height=args.height,
        width=args.width, fps=args.fps, steps=args.steps, seed=args.seed,
        guidance=defaults.GUIDANCE if args.guidance is None else args.guidance,
        schedule=args.schedule, shift=args.shift, sound=args.sound,
        image=media.read_image(args.image) if args.image else None,
        video=media.read_video(args.video)[0] if args.video else None,
        controls={k: media.read_video(p)[0] for k, p in controls.items()} or None,
        control_guidance=args.control_guidance,
        guidance_interval=tuple(args.guidance_interval) if args.guidance_interval else None, compile=args.compile,
    )
    geometry, _ = plan_windows(request, "generate")  # every request check before the model loads
    timings["preprocess"] = time.perf_counter() - start
    start = time.perf_counter()
    pipe = Cosmos3Pipeline.load(args.checkpoint, dtype=DTYPES[args.dtype], device=args.device, with_sound=args.sound)
    timings["model_load"] = time.perf_counter() - start

    def progress(k: int, n: int, step: int, total: int, _preview) -> None:
        end = "\n" if step == total and k + 1 == n else ""
        print(f"\rwindow {k + 1}/{n} step {step}/{total}", end=end, file=sys.stderr, flush=True)

    latents: dict[str, torch.Tensor] = {}

    def keep_latent(k: int, lat: torch.Tensor) -> None:
        if args.latents_out:
            latents[f"video_latent_{k:03d}"] = pipe.vae.denormalize(lat).float().cpu().contiguous()

    frames = FrameCollector()
    sinks = [frames] if args.frames_out else []
    start = time.perf_counter()
    with media.VideoWriter(args.out, args.fps, args.width, args.height, audio=args.sound) as writer:
        result = generate_long(pipe, request, [writer.append, *sinks], progress=progress, latents_sink=keep_latent)
    timings["inference"] = time.perf_counter() - start
    for k, (den, dec) in enumerate(zip(result.timings["denoise"], result.timings["decode"])):
        print(f"window {k + 1}/{geometry.num_windows}: denoise {den:.2f} s, decode+write {dec:.2f} s", file=sys.stderr)
    start = time.perf_counter()
    from safetensors.torch import save_file

    if args.latents_out:
        save_file(latents, args.latents_out, metadata={"format": "raw Wan2.2 VAE latent [1,48,T,h,w] per window"})
    if args.frames_out:
        save_file({"frames": frames.frames().float().contiguous()}, args.frames_out,
                  metadata={"format": "stitched frames [F,H,W,3] float in [0,1]", "fps": str(args.fps)})
    timings["encode"] = time.perf_counter() - start
    return timings

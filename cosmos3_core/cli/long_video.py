"""The ``windows`` and ``transfer`` modes of the generation CLI: a video past one clip, or steered by controls.

The router hands over when the resolved request is windowed (``--num-frames`` above one clip without
``--one-pass``, or ``--frames-per-chunk``) or has ``--control`` videos (Transfer). The mp4 is written window by
window as the video is generated (a Ctrl-C leaves a playable file of the finished windows); ``--latents-out``
saves every window's raw Wan2.2 latent (``video_latent_000`` …) and ``--frames-out`` the stitched float frames
before 8-bit rounding (``frames`` ``[F, H, W, 3]`` in [0, 1]), for exact comparisons and post-processing.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from .. import defaults
from ..request import Resolved
from . import common


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("long video (windows) and Transfer")
    g.add_argument("--frames-per-chunk", type=int, default=None,
                   help=f"frames per window (4k+1, default {defaults.NUM_FRAMES}), each seeded by the previous "
                        "window's last frames; --num-frames may then exceed one clip")
    g.add_argument("--conditional-frames", type=int, default=None,
                   help=f"frames each window takes from the previous one (default {defaults.LONG_CONDITIONAL_FRAMES}; "
                        f"Transfer {defaults.TRANSFER_CONDITIONAL_FRAMES}); with --video, its first frames seed "
                        "window 1")
    g.add_argument("--one-pass", action="store_true",
                   help=f"sample --num-frames above {defaults.NUM_FRAMES} as one clip instead of windows (the "
                        "models were trained on clips of up to 189 frames)")
    g.add_argument("--control", action="append", default=[], metavar="KEY=FILE",
                   help="Transfer: a control video, KEY one of edge, blur, depth, seg, wsm (repeat for several; "
                        "all the same length and size); the video is as long as the controls (--num-frames caps it)")
    g.add_argument("--control-guidance", type=float, default=None,
                   help=f"Transfer: strength of the controls (default {defaults.CONTROL_GUIDANCE:g} = as given; "
                        "else one more pass per step)")
    g.add_argument("--frames-out", default=None, help="also save the decoded float frames (.safetensors)")


def check_outputs(args: argparse.Namespace, request) -> None:
    common.check_output(args.out, "--out", (".mp4",), "a windowed video is written as an .mp4 file")
    for flag, path in (("--latents-out", args.latents_out), ("--frames-out", args.frames_out)):
        common.check_output(path, flag, (".safetensors",), "written as a .safetensors file")


def execute(args: argparse.Namespace, resolved: Resolved) -> dict[str, float]:
    """Load, generate window by window into ``--out``; returns the CLI's stage timings."""
    from .. import media
    from ..modes.long_video import generate_long, stopped_writing
    from ..modes.stream_decode import FrameCollector

    timings = dict.fromkeys(("model_load", "preprocess", "inference", "to_cpu", "encode"), 0.0)
    pipe = common.load_pipeline(args, timings, sound=resolved.sampling.sound)
    geometry = resolved.windows

    def progress(k: int, n: int, step: int, total: int, _preview) -> None:
        common.status_line(f"window {k + 1}/{n} step {step}/{total}", done=step == total and k + 1 == n)

    latents: dict[str, torch.Tensor] = {}

    def keep_latent(k: int, lat: torch.Tensor) -> None:
        if args.latents_out:
            latents[f"video_latent_{k:03d}"] = pipe.vae.denormalize(lat).float().cpu().contiguous()

    frames = FrameCollector()
    sinks = [frames] if args.frames_out else []
    start = time.perf_counter()
    try:  # fragmented: a full disk leaves the windows written whole, playable
        with media.VideoWriter(args.out, resolved.fps, resolved.width, resolved.height, audio=resolved.sampling.sound,
                               fragmented=True) as writer:
            result = generate_long(pipe, resolved, [writer.append, *sinks], progress=progress, latents_sink=keep_latent)
    except media.OutputError as exc:
        raise ValueError(f"--out {exc.path}: {stopped_writing(exc, geometry)}") from None
    timings["inference"] = time.perf_counter() - start
    for k, (den, dec) in enumerate(zip(result.timings["denoise"], result.timings["decode"])):
        print(f"window {k + 1}/{geometry.num_windows}: denoise {den:.2f} s, decode+write {dec:.2f} s", file=sys.stderr)
    start = time.perf_counter()
    if args.latents_out:
        common.save_safetensors("--latents-out", args.latents_out, latents,
                                {"format": "raw Wan2.2 VAE latent [1,48,T,h,w] per window"})
    if args.frames_out:
        common.save_safetensors("--frames-out", args.frames_out, {"frames": frames.frames().float().contiguous()},
                                {"format": "stitched frames [F,H,W,3] float in [0,1]", "fps": str(resolved.fps)})
    timings["encode"] = time.perf_counter() - start
    return timings

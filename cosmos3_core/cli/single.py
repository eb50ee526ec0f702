"""The ``clip`` mode of the generation CLI: one image (``--num-frames 1``, a PNG) or one clip (an mp4, with sound
on Nano/Super), from text, an image (``--image``) or a video (``--video``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from .. import defaults
from ..modes.clip import generate_clip
from ..request import Resolved
from . import common


def check_outputs(args: argparse.Namespace, request) -> None:
    want = ".png" if request.num_frames == 1 else ".mp4"
    if not str(args.out).lower().endswith(want):
        frames = defaults.NUM_FRAMES if request.num_frames is None else request.num_frames
        raise ValueError(f"--out {args.out}: with --num-frames {frames} the output is a {want} file.")
    common.check_writable(Path(args.out), "--out")
    common.check_output(args.latents_out, "--latents-out", (".safetensors",),
                        "the latents are written as a .safetensors file")
    common.check_output(args.frames_out, "--frames-out", (".safetensors",),
                        "the frames are written as a .safetensors file")


def execute(args: argparse.Namespace, resolved: Resolved) -> dict[str, float]:
    """Load, generate (decoded while the mp4 encodes), write; returns the stage timings."""
    timings: dict[str, float] = {}
    pipe = common.load_pipeline(args, timings, sound=resolved.sampling.sound)
    out = generate_clip(pipe, resolved, callback=common.print_progress, decode=False)
    common.write_outputs(args, pipe, resolved, out, timings)
    return timings

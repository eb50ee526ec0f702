"""The ``action`` mode of the generation CLI (``--action-mode ...``): its flags and its run.

Every field of diffusers' ``CosmosActionCondition`` is a flag (``--action-mode``, ``--chunk-size``,
``--domain-name``, ``--resolution-tier``, ``--actions`` for ``raw_actions``, ``--image`` / ``--video``,
``--view-point``); ``--actions-out`` writes the predicted actions without their padding (policy, inverse dynamics),
``--latents-out`` the raw video latent. The clip shape comes from the input and the chunk size, so ``--num-frames``,
``--height`` and ``--width`` are refused with an action mode (``resolve.resolve``). An actions file written by
``--actions-out`` carries its ``domain_name``, which stands in for ``--domain-name``.
"""

from __future__ import annotations

import argparse
import time

from .. import defaults
from ..modes import action as act
from ..request import Resolved
from . import common


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("action modes (world model)")
    g.add_argument("--action-mode", choices=act.ACTION_MODES, default=None,
                   help="policy: image/video + prompt → future video + actions; forward_dynamics: image/video + "
                        "--actions → video; inverse_dynamics: --video → actions")
    g.add_argument("--actions", default=None, help="forward dynamics: actions [chunk_size, width] (.npy, .json, "
                                                   ".safetensors)")
    g.add_argument("--actions-out", default=None, help="write the predicted actions (.npy or .json)")
    g.add_argument("--chunk-size", type=int, default=defaults.ACTION_CHUNK_SIZE,
                   help="actions per chunk; the clip spans chunk_size + 1 frames (default %(default)s)")
    g.add_argument("--domain-name", default=None, metavar="EMBODIMENT",
                   help=f"embodiment (required with --action-mode unless the --actions file names it): one of "
                        f"{', '.join(act.DOMAINS)}")
    g.add_argument("--resolution-tier", type=int, choices=act.RESOLUTION_TIERS,
                   default=defaults.ACTION_RESOLUTION_TIER,
                   help="canvas tier closest to the input's native resolution (default %(default)s)")
    g.add_argument("--view-point", choices=act.VIEW_POINTS + ("none",), default=defaults.ACTION_VIEW_POINT,
                   help="camera framing sentence of the caption (default %(default)s)")


def check_flags(args: argparse.Namespace) -> None:
    """Action flags without ``--action-mode`` are refused (before any file is read)."""
    if args.action_mode is None:
        for name in ("actions", "actions_out", "domain_name"):
            if getattr(args, name) is not None:
                raise ValueError(f"--{name.replace('_', '-')} needs --action-mode (policy, forward_dynamics or "
                                 "inverse_dynamics).")
    elif len(args.prompt) > 1:
        raise ValueError(f"--prompt is given {len(args.prompt)} times; an action run takes one prompt.")


def check_outputs(args: argparse.Namespace, request) -> None:
    common.check_output(args.out, "--out", (".mp4",), "an action mode writes the generated clip as an .mp4 file")
    common.check_output(args.latents_out, "--latents-out", (".safetensors",),
                        "the latents are written as a .safetensors file")
    common.check_output(args.frames_out, "--frames-out", (".safetensors",),
                        "the frames are written as a .safetensors file")
    if args.actions_out is not None:
        if request.action.mode == "forward_dynamics":
            raise ValueError("--actions-out: forward dynamics predicts no actions (it takes them); drop --actions-out "
                             "or use policy / inverse_dynamics.")
        common.check_output(args.actions_out, "--actions-out", (".npy", ".json"),
                            "the predicted actions are written as .npy or .json")


def execute(args: argparse.Namespace, resolved: Resolved) -> dict[str, float]:
    """Load, generate, write the clip and ``--actions-out``; returns the stage timings."""
    timings: dict[str, float] = {}
    pipe = common.load_pipeline(args, timings, sound=resolved.sampling.sound)
    out = act.generate_action(pipe, resolved, callback=common.print_progress, decode=False)
    common.write_outputs(args, pipe, resolved, out, timings)  # decode + the clip and --latents-out, as for every clip
    start = time.perf_counter()
    if args.actions_out:
        with common.writing("--actions-out"):  # written whole or not at all
            act.save_actions(args.actions_out, out.actions, domain_name=resolved.action.domain_name,
                             mode=resolved.action.mode)
    timings["encode"] += time.perf_counter() - start
    return timings

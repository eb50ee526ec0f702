"""Command-line generation: ``python -m cosmos3_core.generate --checkpoint DIR --prompt TEXT --out FILE.mp4``.

One router over the modes (``request.MODES``): the flags become one ``Request`` (cli/common.py reads the input
files), ``resolve.resolve`` decides and checks the whole run before anything loads, and the resolved mode's runner
(its ``execute``) writes the result:

* ``clip`` (cli/single.py): text/image/video to video (with sound on Nano/Super) or, with ``--num-frames 1``, a PNG;
* ``windows`` / ``transfer`` (cli/long_video.py): ``--num-frames`` above one clip (189) runs as windows unless
  ``--one-pass``; ``--frames-per-chunk`` sets the window; ``--control KEY=FILE`` is Transfer; streamed to the mp4;
* ``action`` (cli/action.py): ``--action-mode policy|forward_dynamics|inverse_dynamics``;
* under ``torchrun`` with ``--cfg-parallel`` / ``--ulysses K`` / ``--tp T`` a clip runs on N ranks, and with
  ``--tp T`` alone every mode (cli/parallel.py).

Prints the stage timings ``model_load, preprocess, inference, to_cpu, encode`` as the PhyAI generation script does
(inference = denoising loop + VAE/audio decode; encode = what is left of writing the file, since an mp4 is encoded
on a worker thread while the video decodes). A user mistake exits with one ``error:`` line and status 2, never a
traceback; every argument and output path is checked before anything is loaded. Ctrl-C exits with one line and
status 130, leaving no partial output file (windows: a playable file of the finished windows).
"""

from __future__ import annotations

import argparse
import sys

from .. import defaults
from ..resolve import request_mode, resolve
from . import action, common, long_video, parallel, single


def _edge(name: str) -> str:
    """The help text's note on Cosmos3-Edge's image-to-video recipe for flag ``name``."""
    return f"; a Cosmos3-Edge checkpoint with --image: {getattr(defaults.EDGE_IMAGE_TO_VIDEO, name):g} (its recipe)"


RUNNERS = {"clip": single.execute, "windows": long_video.execute, "transfer": long_video.execute,
           "action": action.execute}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m cosmos3_core.generate", description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", required=True, help="local Cosmos3 checkpoint folder (Hub layout)")
    p.add_argument("--prompt", required=True, action="append",
                   help="what to generate; with windows it may be given once per window (in order)")
    p.add_argument("--out", required=True, help="output .mp4 (video) or .png (with --num-frames 1)")
    p.add_argument("--negative-prompt", default=None, help="default: the checkpoint's assets/negative_prompt.json")
    p.add_argument("--num-frames", type=int, default=None, help=common.DEFAULT_FRAMES_HELP)
    p.add_argument("--height", type=int, default=None, help=f"default {defaults.HEIGHT}{_edge('height')}")
    p.add_argument("--width", type=int, default=None, help=f"default {defaults.WIDTH}{_edge('width')}")
    p.add_argument("--fps", type=float, default=None,
                   help=f"default: {defaults.FPS:g} (action modes: {defaults.ACTION_FPS:g})")
    p.add_argument("--steps", type=int, default=None,
                   help=f"default: {defaults.STEPS_IMAGE} for an image, {defaults.STEPS_VIDEO} for video "
                        f"(a distilled checkpoint: its fixed schedule's length; action modes: {defaults.ACTION_STEPS})"
                        f"{_edge('steps')}")
    p.add_argument("--guidance", type=float, default=None,
                   help=f"default: {defaults.GUIDANCE:g} (a distilled checkpoint: 1, guidance is baked in; action "
                        f"modes: {defaults.ACTION_GUIDANCE:g}){_edge('guidance')}")
    p.add_argument("--seed", type=int, default=defaults.SEED)
    p.add_argument("--schedule", choices=defaults.SCHEDULES, default=defaults.SCHEDULE)
    p.add_argument("--shift", type=float, default=None,
                   help=f"default: 10 at 720p, 5 at 480p, 3 at 256p{_edge('shift')}")
    p.add_argument("--sound", action="store_true", help="generate a sound track too (Nano/Super)")
    cond = p.add_mutually_exclusive_group()
    cond.add_argument("--image", default=None, help="conditioning image (image-to-video)")
    cond.add_argument("--video", default=None, help="conditioning video (video-to-video)")
    common.add_fast_mode_arguments(p)  # --mixed-precision-*, --weight-dtype fp8_e4m3fn_fast, --sea-cache[-KNOB]
    common.add_run_options(
        p, attention_help="attention kernels: auto = FlashAttention-4 (optional flash-attn-4) on Hopper GPUs for long "
                          "sequences, else PyTorch SDPA; sdpa forces SDPA (the reference's route); flash4 requires it")
    p.add_argument("--guidance-interval", type=float, nargs=2, default=None, metavar=("LOW", "HIGH"),
                   help="speed option: run the negative branch only for timesteps in [LOW, HIGH] (0-1000); off by "
                        "default")
    p.add_argument("--latents-out", default=None, help="also save the raw video latent and sound latent (.safetensors)")
    p.add_argument("--use-system-prompt", action="store_true",
                   help="prepend the system prompt (default: the checkpoint's setting; action modes: off)")
    long_video.add_arguments(p)  # --frames-per-chunk, --conditional-frames, --one-pass, --control, ...
    parallel.add_arguments(p)  # --cfg-parallel, --ulysses, --tp, --parallel-timeout
    action.add_arguments(p)  # --action-mode and the other CosmosActionCondition fields
    return p


def run_command(args: argparse.Namespace) -> dict[str, float] | None:
    """Resolve the flags into one run (every check before any load), then the mode's runner; ``None`` on parallel
    ranks > 0 (rank 0 reports)."""
    action.check_flags(args)
    request = common.request_from_args(args)
    OUTPUT_CHECKS[request_mode(request)](args, request)  # output paths, before anything is read from the checkpoint
    common.show_run_notes()  # what resolving and planning say: the FP8 policy in effect, a short Transfer control
    resolved = resolve(request, args.checkpoint, fp8_compute=common.fp8_compute(args))  # files read after the checks
    if resolved.recipe_defaults:  # say where the values nobody typed came from
        values = ", ".join(f"{name} {value:g}" for name, value in resolved.recipe_defaults)
        print(f"{resolved.recipe}: {values} (the checkpoint's published defaults; a flag given wins)", file=sys.stderr)
    if parallel.wanted(args):
        return parallel.execute(args, resolved, RUNNERS)
    return RUNNERS[resolved.mode](args, resolved)


OUTPUT_CHECKS = {"clip": single.check_outputs, "windows": long_video.check_outputs,
                 "transfer": long_video.check_outputs, "action": action.check_outputs}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    ok, timings = common.run_reporting_user_errors(run_command, args)
    if not ok:
        return 2
    if timings is None:  # a parallel run's rank > 0: rank 0 reports
        return 0
    common.print_timings(timings, args.out)
    return 0

"""The action-mode part of ``python -m cosmos3_core.generate`` (``--action-mode ...``): its flags and its run.

Every field of diffusers' ``CosmosActionCondition`` is a flag (``--action-mode``, ``--chunk-size``,
``--domain-name``, ``--resolution-tier``, ``--actions`` for ``raw_actions``, ``--image`` / ``--video``,
``--view-point``); ``--actions-out`` writes the predicted actions without their padding (policy, inverse dynamics),
``--latents-out`` the raw video latent. The clip shape comes from the input and the chunk size, so ``--num-frames``,
``--height`` and ``--width`` are refused with an action mode.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from ..modes import action as act
from .. import defaults


def add_action_arguments(p: argparse.ArgumentParser) -> None:
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
                   help=f"embodiment (required with --action-mode): one of {', '.join(act.DOMAINS)}")
    g.add_argument("--resolution-tier", type=int, choices=act.RESOLUTION_TIERS,
                   default=defaults.ACTION_RESOLUTION_TIER,
                   help="canvas tier closest to the input's native resolution (default %(default)s)")
    g.add_argument("--view-point", choices=act.VIEW_POINTS + ("none",), default=defaults.ACTION_VIEW_POINT,
                   help="camera framing sentence of the caption (default %(default)s)")
    g.add_argument("--use-system-prompt", action="store_true", help="prepend the video system prompt (off for "
                                                                     "action modes)")


def apply_mode_defaults(args: argparse.Namespace) -> None:
    """Fill ``--fps`` (and, for an action mode, ``--guidance``) left unset with the mode's defaults: video 24 fps;
    action modes 5 fps and guidance 1. A video mode's unset guidance stays unset (generate.py decides it)."""
    action = getattr(args, "action_mode", None) is not None
    if args.fps is None:
        args.fps = defaults.ACTION_FPS if action else defaults.FPS
    if action and args.guidance is None:
        args.guidance = defaults.ACTION_GUIDANCE


def check_action_args(args: argparse.Namespace) -> None:
    """Refuse flags that do not apply to action modes, and action flags without ``--action-mode``."""
    if args.action_mode is None:
        for name in ("actions", "actions_out", "domain_name"):
            if getattr(args, name) is not None:
                raise ValueError(f"--{name.replace('_', '-')} needs --action-mode (policy, forward_dynamics or "
                                 "inverse_dynamics).")
        return
    for name, default in (("num_frames", defaults.NUM_FRAMES), ("height", defaults.HEIGHT), ("width", defaults.WIDTH)):
        if getattr(args, name) != default:
            raise ValueError(f"--{name.replace('_', '-')} does not apply with --action-mode: the clip spans "
                             "--chunk-size + 1 frames at the input's size (bucketed by --resolution-tier).")
    if args.domain_name is None:
        raise ValueError(f"--action-mode {args.action_mode} needs --domain-name (the embodiment), one of "
                         f"{list(act.DOMAINS)}.")
    if args.actions is not None and not Path(args.actions).is_file():
        raise ValueError(f"--actions {args.actions} does not exist.")
    if args.actions_out is not None:
        if Path(args.actions_out).suffix.lower() not in (".npy", ".json"):
            raise ValueError(f"--actions-out {args.actions_out}: use a .npy or .json file name.")
        if args.action_mode == "forward_dynamics":
            raise ValueError("--actions-out: forward dynamics predicts no actions (it takes them); drop --actions-out "
                             "or use policy / inverse_dynamics.")
    if Path(args.out).suffix.lower() != ".mp4":
        raise ValueError(f"--out {args.out}: an action mode writes the generated clip as an .mp4 file.")


def run_action(args: argparse.Namespace) -> dict[str, float]:
    """``generate.run`` for an action mode: check, load, generate, write; returns the stage timings."""
    from .. import media
    from ..config import DTYPES
    from .main import check_common_args, check_writable, print_progress, write_outputs
    from ..pipeline import Cosmos3Pipeline

    check_action_args(args)
    ckpt = check_common_args(args)
    for flag, path in (("--out", args.out), ("--actions-out", args.actions_out), ("--latents-out", args.latents_out)):
        if path is not None:
            check_writable(Path(path), flag)
    if args.latents_out is not None and Path(args.latents_out).suffix.lower() != ".safetensors":
        raise ValueError(f"--latents-out {args.latents_out}: the latents are written as a .safetensors file; give a "
                         "name ending in .safetensors.")
    if args.sound and not (ckpt / "sound_tokenizer").is_dir():
        raise ValueError(f"--sound: checkpoint {ckpt} has no sound_tokenizer/ (Edge has no sound); drop --sound.")
    if args.guidance_interval is not None:
        raise ValueError("--guidance-interval does not apply with --action-mode (the action models run without "
                         "guidance by default); drop it.")
    from . import parallel as parallel_cli

    if parallel_cli.wanted(args):
        raise ValueError("--cfg-parallel / --ulysses do not apply with --action-mode yet (an action run is one "
                         "short clip on one device); drop them.")
    if args.negative_prompt is not None:
        from ..sampling.prompt import check_text

        check_text(args.negative_prompt, "--negative-prompt")
    timings: dict[str, float] = {}
    start = time.perf_counter()
    pipe = Cosmos3Pipeline.load(args.checkpoint, dtype=DTYPES[args.dtype], device=args.device, with_sound=args.sound)
    timings["model_load"] = time.perf_counter() - start
    image = media.read_image(args.image) if args.image else None
    video = media.read_video(args.video)[0] if args.video else None
    raw_actions = act.load_actions(args.actions) if args.actions else None
    request = act.ActionGenerationRequest(
        action=act.ActionRequest(
            mode=args.action_mode, chunk_size=args.chunk_size, domain_name=args.domain_name,
            resolution_tier=args.resolution_tier, raw_actions=raw_actions, image=image, video=video,
            view_point=None if args.view_point == "none" else args.view_point,
        ),
        prompt=args.prompt,
        negative_prompt=defaults.ACTION_NEGATIVE_PROMPT if args.negative_prompt is None else args.negative_prompt,
        fps=args.fps, steps=args.steps, guidance=args.guidance, seed=args.seed, schedule=args.schedule,
        shift=args.shift,
        sound=args.sound, use_system_prompt=args.use_system_prompt, compile=args.compile,
    )

    out = pipe.generate_action(request, callback=print_progress, decode=False)
    write_outputs(args, pipe, out, timings)  # decode + the clip and --latents-out, as for every generation
    start = time.perf_counter()
    if args.actions_out:
        act.save_actions(args.actions_out, out.actions, domain_name=args.domain_name, mode=args.action_mode)
    timings["encode"] += time.perf_counter() - start
    return timings

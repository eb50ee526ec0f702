"""Command-line generation: ``python -m cosmos3_core.generate --checkpoint DIR --prompt TEXT --out FILE.mp4``.

Text/image/video to video (with sound on Nano/Super) or, with ``--num-frames 1``, to a PNG. With ``--control`` (Transfer)
or ``--frames-per-chunk`` the video is generated in windows and streamed to the mp4 (long_video_cli.py). Prints the stage
timings ``model_load, preprocess, inference, to_cpu, encode`` as the PhyAI generation script does (inference =
denoising loop + VAE/audio decode; encode = what is left of writing the file, since an mp4 is encoded on a worker
thread while the video decodes). A user mistake exits with one ``error:`` line and status 2, never a traceback;
every argument and output path is checked before anything is loaded. Ctrl-C exits with one line and status 130,
leaving no partial output file.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import torch

from .. import defaults
from . import long_video as long_video_cli
from .action import add_action_arguments, apply_mode_defaults, check_action_args, run_action
from ..config import DTYPES


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m cosmos3_core.generate", description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", required=True, help="local Cosmos3 checkpoint folder (Hub layout)")
    p.add_argument("--prompt", required=True, action="append",
                   help="what to generate; with windows it may be given once per window (in order)")
    p.add_argument("--out", required=True, help="output .mp4 (video) or .png (with --num-frames 1)")
    p.add_argument("--negative-prompt", default=None, help="default: the checkpoint's assets/negative_prompt.json")
    p.add_argument("--num-frames", type=int, default=None,
                   help=f"default {defaults.NUM_FRAMES}; with --control: the control videos' length (this caps it)")
    p.add_argument("--height", type=int, default=defaults.HEIGHT)
    p.add_argument("--width", type=int, default=defaults.WIDTH)
    p.add_argument("--fps", type=float, default=None,
                   help=f"default: {defaults.FPS:g} (action modes: {defaults.ACTION_FPS:g})")
    p.add_argument("--steps", type=int, default=None,
                   help=f"default: {defaults.STEPS_IMAGE} for an image, {defaults.STEPS_VIDEO} for video "
                        f"(a distilled checkpoint: its fixed schedule's length; action modes: {defaults.ACTION_STEPS})")
    p.add_argument("--guidance", type=float, default=None,
                   help=f"default: {defaults.GUIDANCE:g} (a distilled checkpoint: 1, guidance is baked in; action "
                        f"modes: {defaults.ACTION_GUIDANCE:g})")
    p.add_argument("--seed", type=int, default=defaults.SEED)
    p.add_argument("--schedule", choices=defaults.SCHEDULES, default=defaults.SCHEDULE)
    p.add_argument("--shift", type=float, default=None, help="default: 10 at 720p, 5 at 480p, 3 at 256p")
    p.add_argument("--sound", action="store_true", help="generate a sound track too (Nano/Super)")
    cond = p.add_mutually_exclusive_group()
    cond.add_argument("--image", default=None, help="conditioning image (image-to-video)")
    cond.add_argument("--video", default=None, help="conditioning video (video-to-video)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", choices=tuple(DTYPES), default="bf16")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile the generation layer and the VAE decode step (GPU; faster after warm-up)")
    p.add_argument("--attention", choices=("auto", "sdpa", "flash4"), default="auto",
                   help="attention kernels: auto = FlashAttention-4 (optional flash-attn-4) on Hopper GPUs for long "
                        "sequences, else PyTorch SDPA; sdpa forces SDPA (the reference's route)")
    p.add_argument("--guidance-interval", type=float, nargs=2, default=None, metavar=("LOW", "HIGH"),
                   help="speed option: run the negative branch only for timesteps in [LOW, HIGH] (0-1000); off by default")
    p.add_argument("--latents-out", default=None, help="also save the raw video latent and sound latent (.safetensors)")
    long_video_cli.add_arguments(p)
    from .parallel import add_arguments as add_parallel_arguments

    add_parallel_arguments(p)  # --cfg-parallel, --ulysses, --parallel-timeout
    add_action_arguments(p)  # --action-mode and the other CosmosActionCondition fields (action_cli.py)
    return p


def _request(args: argparse.Namespace, image=None, video=None):
    from ..pipeline import GenerationRequest

    return GenerationRequest(
        prompt=args.prompt[0], negative_prompt=args.negative_prompt, num_frames=args.num_frames, height=args.height,
        width=args.width, fps=args.fps, steps=args.steps, guidance=args.guidance, seed=args.seed,
        schedule=args.schedule, shift=args.shift, sound=args.sound, image=image, video=video,
        compile=args.compile, attention=args.attention, guidance_interval=tuple(args.guidance_interval) if args.guidance_interval else None,
    )


def _check_args(args: argparse.Namespace) -> None:
    from ..sampling.distilled import read_distilled
    from ..sampling.prompt import check_text

    if len(args.prompt) > 1:
        raise ValueError(f"--prompt is given {len(args.prompt)} times; one prompt per window needs windows "
                         "(--frames-per-chunk N); otherwise give --prompt once.")
    if args.conditional_frames is not None:
        raise ValueError("--conditional-frames applies to windows only; add --frames-per-chunk N (or --control for "
                         "Transfer), or drop it.")
    if args.control_guidance != defaults.CONTROL_GUIDANCE:
        raise ValueError("--control-guidance applies to Transfer only; add --control KEY=FILE, or drop it.")
    check_action_args(args)  # action flags need --action-mode
    _request(args, image=args.image, video=args.video).check("generate")  # every request check, before any load
    ckpt = check_common_args(args)
    if args.attention == "flash4":
        from ..kernels.attention import flash4_unavailable_reason

        if flash4_unavailable_reason():
            raise ValueError(f"--attention flash4: FlashAttention-4 cannot run here ({flash4_unavailable_reason()}); "
                             "use --attention auto or sdpa, or install flash-attn-4 on a Hopper (sm90) GPU.")
    if args.negative_prompt is not None:
        check_text(args.negative_prompt, "--negative-prompt")
    distilled = read_distilled(ckpt)  # a distilled checkpoint fixes steps, guidance, ...: refuse before any load
    if distilled is not None:
        distilled.check(steps=args.steps, guidance=args.guidance, shift=args.shift, schedule=args.schedule,
                        negative_prompt=args.negative_prompt, sound=args.sound, who="generate")
    if args.guidance is None:
        args.guidance = 1.0 if distilled is not None else defaults.GUIDANCE
    if args.sound and not (ckpt / "sound_tokenizer").is_dir():
        raise ValueError(f"--sound: checkpoint {ckpt} has no sound_tokenizer/ (Edge has no sound); drop --sound.")
    out = Path(args.out)
    want = ".png" if args.num_frames == 1 else ".mp4"
    if out.suffix.lower() != want:
        raise ValueError(f"--out {out}: with --num-frames {args.num_frames} the output is a {want} file.")
    check_writable(out, "--out")
    if args.latents_out is not None:
        if Path(args.latents_out).suffix.lower() != ".safetensors":
            raise ValueError(f"--latents-out {args.latents_out}: the latents are written as a .safetensors file; "
                             "give a name ending in .safetensors.")
        check_writable(Path(args.latents_out), "--latents-out")


def check_writable(path: Path, flag: str) -> None:
    """``path`` can be written: not a folder, and its nearest existing parent is a folder we can create files in
    (missing folders below it are created at write time)."""
    if path.is_dir():
        raise ValueError(f"{flag} {path} is a folder; give a file name inside it.")
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise ValueError(f"{flag} {path}: {parent} is a file, not a folder; choose another output path.")
    try:
        with tempfile.TemporaryFile(dir=parent):
            pass
    except OSError as exc:
        raise ValueError(f"{flag} {path}: cannot write in {parent} ({exc.strerror}); choose a writable folder.") from None


def check_common_args(args: argparse.Namespace) -> Path:
    """Checks shared by the package's CLIs (--prompt, --checkpoint, --device, --image/--video); returns the
    checkpoint path."""
    from ..sampling.prompt import check_text

    ckpt = Path(args.checkpoint)
    for text in [args.prompt] if isinstance(args.prompt, str) else args.prompt:  # generate: once per window
        check_text(text, "--prompt")
    if not ckpt.is_dir():
        raise ValueError(f"--checkpoint {ckpt} is not a folder; give the downloaded Cosmos3 checkpoint folder.")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is visible; use --device cpu.")
    for name in ("image", "video"):
        path = getattr(args, name)
        if path is not None and not Path(path).is_file():
            raise ValueError(f"--{name} {path} does not exist.")
    return ckpt


def run(args: argparse.Namespace) -> dict[str, float] | None:
    from ..pipeline import Cosmos3Pipeline

    args.num_frames_given = args.num_frames is not None
    if args.num_frames is None:
        args.num_frames = defaults.NUM_FRAMES
    if args.action_mode is not None:  # world-model modes: action_cli.py
        if len(args.prompt) > 1:
            raise ValueError(f"--prompt is given {len(args.prompt)} times; an action run takes one prompt.")
        args.prompt = args.prompt[0]
        return run_action(args)
    # ---- more than one GPU: torchrun ... --cfg-parallel / --ulysses K (parallel/cli.py); None on ranks > 0
    from . import parallel as parallel_cli

    if long_video_cli.wants_windows(args):  # ---- windows / Transfer (long_video_cli.py)
        if parallel_cli.wanted(args):
            raise ValueError("--cfg-parallel/--ulysses do not apply to windowed generation (--frames-per-chunk, "
                             "--control) yet; drop them.")
        return long_video_cli.run_windows(args, check_common_args)
    if parallel_cli.wanted(args):
        return parallel_cli.run_parallel(args)
    # ----
    _check_args(args)
    timings: dict[str, float] = {}
    start = time.perf_counter()
    pipe = Cosmos3Pipeline.load(args.checkpoint, dtype=DTYPES[args.dtype], device=args.device, with_sound=args.sound)
    timings["model_load"] = time.perf_counter() - start
    request = read_request(args)
    out = pipe.generate(request, callback=print_progress, decode=False)  # write_outputs decodes while it encodes
    write_outputs(args, pipe, out, timings)
    return timings


def print_progress(step: int, total: int, _preview=None) -> None:
    """The CLIs' step counter on stderr (a sampling callback)."""
    print(f"\rstep {step}/{total}", end="" if step < total else "\n", file=sys.stderr, flush=True)


def read_request(args: argparse.Namespace):
    """The request with the ``--image``/``--video`` files read."""
    from .. import media

    image = media.read_image(args.image) if args.image else None
    video = media.read_video(args.video)[0] if args.video else None
    return _request(args, image=image, video=video)


def write_outputs(args: argparse.Namespace, pipe, out, timings: dict[str, float]) -> None:
    """Write the clip (and ``--latents-out``); fills the ``preprocess, inference, to_cpu, encode`` timings.

    ``out`` not decoded yet (``generate(decode=False)``): the sound is decoded first, then the video, and an mp4
    is encoded while the video decodes — each chunk of frames goes to the encoder's thread as soon as it is on the
    host (``media.BackgroundVideoWriter``), so ``inference`` includes the decode and ``encode`` is what is left of
    the encoding after it. A decoded ``out`` (the parallel CLI) is written as it is."""
    from .. import media

    timings["preprocess"] = out.timings["preprocess"]
    timings["inference"] = out.timings["inference"] + out.timings.get("decode", 0.0)
    with _removed_if_unfinished(args.out):
        writer = None
        if out.frames is None:
            start = time.perf_counter()
            writer = decode_while_encoding(args, pipe, out)
            timings["inference"] += time.perf_counter() - start
        start = time.perf_counter()
        frames = out.frames.cpu().numpy()
        waveform = out.waveform.cpu().numpy() if out.waveform is not None else None
        timings["to_cpu"] = time.perf_counter() - start
        start = time.perf_counter()
        if writer is not None:
            writer.close()
        elif args.num_frames == 1:
            media.write_png(args.out, frames[0])
        else:
            media.write_video(args.out, frames, args.fps, audio=waveform)
    if args.latents_out:
        from safetensors.torch import save_file

        tensors = {"video_latent": pipe.vae.denormalize(out.latents).float().cpu().contiguous()}
        if out.sound_latent is not None:
            tensors["sound_latent"] = out.sound_latent.float().cpu().contiguous()
        Path(args.latents_out).parent.mkdir(parents=True, exist_ok=True)
        with _removed_if_unfinished(args.latents_out):
            save_file(tensors, args.latents_out, metadata={"format": "raw Wan2.2 VAE latent [1,48,T,h,w]"})
    if args.frames_out:
        from safetensors.torch import save_file

        with _removed_if_unfinished(args.frames_out):
            save_file({"frames": out.frames.float().cpu().contiguous()}, args.frames_out,
                      metadata={"format": "frames [F,H,W,3] float in [0,1]", "fps": str(args.fps)})
    timings["encode"] = time.perf_counter() - start


def decode_while_encoding(args: argparse.Namespace, pipe, out):
    """Decode ``out``'s sound and video into it (``out.waveform``, ``out.frames``); for an mp4, returns the
    ``BackgroundVideoWriter`` that has been encoding the frames as they decoded, still to be closed. ``None``: a PNG,
    or a decode that ran out of memory and started again tiled (its first frames were already encoded from the
    untiled attempt), whose file the caller writes from the whole clip afterwards."""
    from .. import media

    latents = out.latents
    shape = pipe.vae.decoded_shape(latents)
    if out.sound_latent is not None:  # first: the mp4 declares its audio track before any frame
        out.waveform = pipe.decode_sound(out.sound_latent, shape[0], args.fps)
    out.frames = torch.empty(shape, dtype=torch.float32)
    if args.num_frames == 1:
        pipe.vae.decode(latents, out=out.frames, compile=args.compile)
        return None
    writer = media.BackgroundVideoWriter(args.out, args.fps, shape[2], shape[1], audio=out.waveform)
    sent = 0  # frames handed to the encoder; -1 once the decode started again

    def encode_decoded(done: int, _total: int) -> None:
        nonlocal sent
        ready = pipe.vae.num_pixel_frames(done)
        if 0 <= sent < ready:
            writer.append(out.frames[sent:ready])
            sent = ready
        elif ready <= sent:
            sent = -1

    try:
        pipe.vae.decode(latents, out=out.frames, on_chunk=encode_decoded, compile=args.compile)
    except BaseException:
        writer.abort()
        raise
    if sent < 0:
        writer.abort()
        return None
    return writer


@contextmanager
def _removed_if_unfinished(path):
    """Deletes ``path`` when the block fails or is interrupted, so no half-written file is left behind."""
    try:
        yield
    except BaseException:
        Path(path).unlink(missing_ok=True)
        raise


def run_reporting_user_errors(run_fn, args: argparse.Namespace):
    """``(True, run_fn(args))``, or ``(False, None)`` after printing one ``error:`` line for a user mistake
    (bad argument, missing or damaged file) — never a traceback for those. Ctrl-C prints one line and exits with
    status 130 (the shell's convention for SIGINT). Shared by the package's CLIs."""
    from ..config import CheckpointError

    try:
        return True, run_fn(args)
    except (ValueError, FileNotFoundError, CheckpointError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return False, None
    except KeyboardInterrupt:
        print("\ninterrupted (Ctrl-C); nothing more was written.", file=sys.stderr)
        raise SystemExit(130) from None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    apply_mode_defaults(args)  # --fps / --guidance left unset: the mode's defaults (action modes: 5 fps, cfg 1)
    ok, timings = run_reporting_user_errors(run, args)
    if not ok:
        return 2
    if timings is None:  # a parallel run's rank > 0: rank 0 reports
        return 0
    for name in ("model_load", "preprocess", "inference", "to_cpu", "encode"):
        print(f"{name:>10}: {timings[name]:8.2f} s")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

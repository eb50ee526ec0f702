"""What every CLI mode shares: the arguments → ``Request`` step, the pre-load file checks, the one timed load, the
step counter, writing outputs (an mp4 encoded while the VAE decodes), and the user-error boundary.

``request_from_args`` reads the input files (image, video, control videos, actions) before anything loads, so a bad
file is reported in seconds; ``resolve.resolve`` then decides and checks the whole run, also before the load.
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import torch

from .. import defaults
from ..config import DTYPES, CheckpointError
from ..model.precision import FORMATS, OVERLAP_MODES, REASONER_POLICIES
from ..request import Request, Resolved
from ..runtime import COMPILE_MODES, RuntimeOptions
from ..sampling.sea_cache import DEFAULTS as SEA_CACHE_DEFAULTS
from ..sampling.sea_cache import SeaCacheConfig
from .interrupt import end_status_line, raise_if_interrupted, status_line


# ---------------------------------------------------------------------------------------------- arguments
def add_run_options(p: argparse.ArgumentParser, *, attention_help: str) -> None:
    """The flags of ``RuntimeOptions`` and placement shared by the generation and reasoner CLIs."""
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", choices=tuple(DTYPES), default="bf16")
    p.add_argument("--compile", nargs="?", choices=COMPILE_MODES, default="auto", const="on",
                   help="torch.compile the hot layers: auto (default) where it pays — CUDA with Triton; the VAE "
                        "decoder only from graphs already on disk — on (also bare --compile: everything, an error "
                        "where it cannot run), off")
    p.add_argument("--attention", choices=("auto", "sdpa", "flash4"), default="auto", help=attention_help)


WEIGHT_DTYPES = ("auto", "fp8_e4m3fn_fast")


def add_fast_mode_arguments(p: argparse.ArgumentParser) -> None:
    """The fast modes: an NVIDIA FP8 checkpoint's step policy (named as diffusers' ``mixed_precision_*``
    arguments), approximate FP8 compute for a bf16 checkpoint (ComfyUI's ``fp8_e4m3fn_fast``) and SeaCache (its
    ``SeaCacheConfig`` fields)."""
    g = p.add_argument_group("FP8 (NVIDIA's fp8 checkpoints: W8A8 steps, W8A16 for the first and last steps; needs a "
                             "GPU with FP8 tensor cores, sm 8.9+)")
    g.add_argument("--mixed-precision-format", choices=FORMATS, default=None,
                   help="default: the checkpoint's step policy; none: W8A8 at every step; fp8: the first/last-N "
                        "schedule even without a declared policy")
    for name, what in (("first", "first"), ("last", "last")):
        g.add_argument(f"--mixed-precision-{name}-steps", type=int, default=None, metavar="N",
                       help=f"W8A16 for the {what} N steps (default: the checkpoint's policy, 3)")
    g.add_argument("--mixed-precision-reasoner-policy", choices=REASONER_POLICIES, default=None,
                   help="the reference's reasoner path: high_precision (W8A16, NVIDIA's policy) or base_precision")
    g.add_argument("--mixed-precision-overlap", choices=OVERLAP_MODES, default=None,
                   help="a step in both windows: a16 (W8A16) or native (W8A8)")
    g.add_argument("--weight-dtype", choices=WEIGHT_DTYPES, default="auto",
                   help="fp8_e4m3fn_fast: FP8 compute for a bf16 checkpoint, its weights rounded to FP8 at load "
                        "(approximate; NVIDIA's step policy)")
    g.add_argument("--gguf", default=None, metavar="FILE",
                   help="the transformer's weights from this GGUF file (python -m cosmos3_core.gguf writes one), "
                        "kept quantized and dequantized per layer; --checkpoint gives the rest (VAE, tokenizer, "
                        "configs)")
    s = p.add_argument_group("SeaCache (reuse the layer stack on steps whose spectral indicator barely changes)")
    s.add_argument("--sea-cache", action="store_true", help="turn SeaCache on (diffusers' SeaCacheConfig defaults)")
    for name, default in SEA_CACHE_DEFAULTS.items():
        s.add_argument("--sea-cache-" + name.replace("_", "-"), dest="sea_cache_" + name, type=type(default),
                       default=None, help=f"default {default}")


def fp8_compute(args: argparse.Namespace) -> bool:
    return getattr(args, "weight_dtype", "auto") == "fp8_e4m3fn_fast"


def sea_cache_config(args: argparse.Namespace) -> SeaCacheConfig | None:
    """``--sea-cache`` and its knobs (checked by ``resolve.resolve``); a knob without ``--sea-cache`` is refused."""
    knobs = {k: getattr(args, "sea_cache_" + k) for k in SEA_CACHE_DEFAULTS
             if getattr(args, "sea_cache_" + k) is not None}
    if not args.sea_cache:
        if knobs:
            flag = "--sea-cache-" + next(iter(knobs)).replace("_", "-")
            raise ValueError(f"{flag} applies with SeaCache on; add --sea-cache, or drop it.")
        return None
    return SeaCacheConfig(**knobs)


def runtime_options(args: argparse.Namespace) -> RuntimeOptions:
    return RuntimeOptions(attention=args.attention, compile=args.compile, device_type=args.device)


def request_from_args(args: argparse.Namespace) -> Request:
    """The ``Request`` the flags describe, with its input files read (each missing or unreadable one reported by
    its flag)."""
    from .. import media

    check_input_paths(args)
    image = media.read_image(args.image) if args.image else None
    video = media.read_video(args.video)[0] if args.video else None
    controls = None
    if args.control:
        controls = {key: read_control(key, path) for key, path in parse_controls(args.control).items()}
    action = action_request(args, image, video) if args.action_mode is not None else None
    if action is not None:
        image = video = None  # the action request carries its frames
    interval = tuple(args.guidance_interval) if args.guidance_interval else None
    prompts = args.prompt if isinstance(args.prompt, str) else list(args.prompt)
    return Request(
        prompt=prompts[0] if isinstance(prompts, list) and len(prompts) == 1 else prompts,
        negative_prompt=args.negative_prompt, num_frames=args.num_frames, height=args.height, width=args.width,
        fps=args.fps, seed=args.seed, steps=args.steps, guidance=args.guidance, schedule=args.schedule,
        shift=args.shift, sound=args.sound, guidance_interval=interval,
        use_system_prompt=True if args.use_system_prompt else None, image=image, video=video,
        frames_per_chunk=args.frames_per_chunk, conditional_frames=args.conditional_frames, one_pass=args.one_pass,
        controls=controls, control_guidance=args.control_guidance, action=action, options=runtime_options(args),
        mixed_precision_format=args.mixed_precision_format,
        mixed_precision_first_steps=args.mixed_precision_first_steps,
        mixed_precision_last_steps=args.mixed_precision_last_steps,
        mixed_precision_reasoner_policy=args.mixed_precision_reasoner_policy,
        mixed_precision_overlap=args.mixed_precision_overlap, sea_cache=sea_cache_config(args),
    )


def action_request(args: argparse.Namespace, image, video):
    """The ``ActionRequest`` of ``--action-mode`` and its flags; an actions file's own ``domain_name`` (what
    ``--actions-out`` writes) fills ``--domain-name`` when that is not given, and must agree with it when it is."""
    from ..modes import action as act

    raw_actions, meta = (act.load_actions_with_metadata(args.actions) if args.actions else (None, {}))
    domain = args.domain_name
    if meta.get("domain_name") is not None:
        if domain is None:
            domain = meta["domain_name"]
        elif domain != meta["domain_name"]:
            raise ValueError(f"--domain-name {domain}: the actions file {args.actions} was recorded for "
                             f"{meta['domain_name']!r}; give --domain-name {meta['domain_name']} or other actions.")
    if domain is None:
        raise ValueError(f"--action-mode {args.action_mode} needs --domain-name (the embodiment), one of "
                         f"{list(act.DOMAINS)}.")
    return act.ActionRequest(mode=args.action_mode, chunk_size=args.chunk_size, domain_name=domain,
                             resolution_tier=args.resolution_tier, raw_actions=raw_actions, image=image, video=video,
                             view_point=None if args.view_point == "none" else args.view_point)


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
            what = "is a folder, not a video file" if Path(path).is_dir() else "does not exist"
            raise ValueError(f"--control {key}={path}: {path} {what}.")
        controls[key] = Path(path)
    return controls


# ---------------------------------------------------------------------------------------------- files
def read_control(key: str, path):
    """A ``--control KEY=FILE`` video's frames; a file that is not a video is refused naming the argument, without
    libav's errno text."""
    from .. import media

    try:
        return media.read_video(path)[0]
    except ValueError as exc:
        p = Path(path)
        why = ("it is empty (0 bytes)" if p.is_file() and p.stat().st_size == 0
               else str(exc).removeprefix("read_video: "))
        why = re.sub(r"\[Errno -?\d+\] ", "", why)
        raise ValueError(f"--control {key}={path}: not a readable video: {why}. Give an mp4 (or another video) of "
                         "the control frames.") from None


def check_input_paths(args: argparse.Namespace) -> Path:
    """``--checkpoint`` is a folder, ``--device`` exists, every input file exists; returns the checkpoint path (the
    prompts are the resolver's to check)."""
    ckpt = Path(args.checkpoint)
    if not ckpt.is_dir():
        what = "does not exist" if not ckpt.exists() else "is not a folder"
        raise ValueError(f"--checkpoint {ckpt} {what}; give the downloaded Cosmos3 checkpoint folder.")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is visible; use --device cpu.")
    for name in ("image", "video", "actions"):
        path = getattr(args, name, None)
        if path is not None and not Path(path).is_file():
            what = "is a folder, not a file" if Path(path).is_dir() else "does not exist"
            raise ValueError(f"--{name} {path} {what}.")
    return ckpt


def check_output(path: str | None, flag: str, suffixes: tuple[str, ...], what: str) -> None:
    """``path`` (when given) ends in one of ``suffixes`` and can be written."""
    if path is None:
        return
    if Path(path).suffix.lower() not in suffixes:
        raise ValueError(f"{flag} {path}: {what}; give a name ending in {' or '.join(suffixes)}.")
    check_writable(Path(path), flag)


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
        raise ValueError(f"{flag} {path}: cannot write in {parent} ({exc.strerror}); choose a writable "
                         "folder.") from None


@contextmanager
def writing(flag: str):
    """An output the disk refuses (``media.OutputError``: a full disk) is one message naming its flag."""
    from ..media import OutputError

    try:
        yield
    except OutputError as exc:
        raise ValueError(f"{flag} {exc.path}: {exc.reason}") from None


def save_safetensors(flag: str, path: str, tensors: dict, metadata: dict) -> None:
    """``--latents-out`` / ``--frames-out``: the tensors as a .safetensors file, written whole or not at all."""
    from safetensors.torch import save

    from ..media import write_file

    with writing(flag):
        write_file(path, save(tensors, metadata=metadata))


@contextmanager
def removed_if_unfinished(path):
    """Deletes ``path`` when the block fails or is interrupted, so no half-written file is left behind."""
    try:
        yield
        raise_if_interrupted()  # a Ctrl-C that Python dropped while the file was written (interrupt.py)
    except BaseException:
        Path(path).unlink(missing_ok=True)
        raise


# ---------------------------------------------------------------------------------------------- running
def load_pipeline(args: argparse.Namespace, timings: dict[str, float], *, sound: bool, device=None):
    """The one timed load of the checkpoint (``timings["model_load"]``); under ``--tp`` this rank's shard of it
    (``args.weight_sharding``, set by cli/parallel.py)."""
    from ..pipeline import Cosmos3Pipeline

    start = time.perf_counter()
    pipe = Cosmos3Pipeline.load(args.checkpoint, dtype=DTYPES[args.dtype], device=device or args.device,
                                with_sound=sound, fp8_compute=fp8_compute(args),
                                sharding=getattr(args, "weight_sharding", None), gguf_file=getattr(args, "gguf", None))
    timings["model_load"] = time.perf_counter() - start
    return pipe


class _RunNotes(logging.Handler):
    """A ``cosmos3`` log record as one line on the current stderr."""

    def emit(self, record: logging.LogRecord) -> None:
        print(record.getMessage(), file=sys.stderr)


def show_run_notes() -> None:
    """Print what the core says about a run as it plans it (the ``cosmos3`` logger: the FP8 policy in effect, or
    why an FP8 checkpoint runs W8A16 here) on stderr, one line each."""
    log = logging.getLogger("cosmos3")
    if not any(isinstance(h, _RunNotes) for h in log.handlers):
        log.addHandler(_RunNotes())
    log.setLevel(logging.INFO)


def print_progress(step: int, total: int, _preview=None) -> None:
    """The CLIs' step counter on stderr (a sampling callback)."""
    status_line(f"step {step}/{total}", done=step >= total)


def write_outputs(args: argparse.Namespace, pipe, resolved: Resolved, out, timings: dict[str, float]) -> None:
    """Write the clip (and ``--latents-out`` / ``--frames-out``); fills the ``preprocess, inference, to_cpu,
    encode`` timings.

    ``out`` not decoded yet (``decode=False``): the sound is decoded first, then the video, and an mp4 is encoded
    while the video decodes — each chunk of frames goes to the encoder's thread as soon as it is on the host
    (``media.BackgroundVideoWriter``), so ``inference`` includes the decode and ``encode`` is what is left of the
    encoding after it. A decoded ``out`` (the parallel CLI) is written as it is."""
    from .. import media

    timings["preprocess"] = out.timings["preprocess"]
    timings["inference"] = out.timings["inference"] + out.timings.get("decode", 0.0)
    with writing("--out"), removed_if_unfinished(args.out):
        writer = None
        if out.frames is None:
            start = time.perf_counter()
            writer = decode_while_encoding(args, pipe, resolved, out)
            timings["inference"] += time.perf_counter() - start
        start = time.perf_counter()
        frames = out.frames.cpu().numpy()
        waveform = out.waveform.cpu().numpy() if out.waveform is not None else None
        timings["to_cpu"] = time.perf_counter() - start
        start = time.perf_counter()
        if writer is not None:
            writer.close()
        elif resolved.num_frames == 1:
            media.write_png(args.out, frames[0])
        else:
            media.write_video(args.out, frames, resolved.fps, audio=waveform)
    if args.latents_out:
        tensors = {"video_latent": pipe.vae.denormalize(out.latents).float().cpu().contiguous()}
        if out.sound_latent is not None:
            tensors["sound_latent"] = out.sound_latent.float().cpu().contiguous()
        save_safetensors("--latents-out", args.latents_out, tensors,
                         {"format": "raw Wan2.2 VAE latent [1,48,T,h,w]"})
    if args.frames_out:
        save_safetensors("--frames-out", args.frames_out, {"frames": out.frames.float().cpu().contiguous()},
                         {"format": "frames [F,H,W,3] float in [0,1]", "fps": str(resolved.fps)})
    timings["encode"] = time.perf_counter() - start


def decode_while_encoding(args: argparse.Namespace, pipe, resolved: Resolved, out):
    """Decode ``out``'s sound and video into it (``out.waveform``, ``out.frames``); for an mp4, returns the
    ``BackgroundVideoWriter`` that has been encoding the frames as they decoded, still to be closed. ``None``: a PNG,
    or a decode that ran out of memory and started again tiled (its first frames were already encoded from the
    untiled attempt), whose file the caller writes from the whole clip afterwards."""
    from .. import media

    latents = out.latents
    shape = pipe.vae.decoded_shape(latents)
    options = resolved.options
    compile_args = dict(compile=options.on(pipe.vae.device).vae_compile, compile_backend=options.compile_backend)
    if out.sound_latent is not None:  # first: the mp4 declares its audio track before any frame
        out.waveform = pipe.decode_sound(out.sound_latent, shape[0], resolved.fps)
    out.frames = torch.empty(shape, dtype=torch.float32)
    if resolved.num_frames == 1:
        pipe.vae.decode(latents, out=out.frames, **compile_args)
        return None
    writer = media.BackgroundVideoWriter(args.out, resolved.fps, shape[2], shape[1], audio=out.waveform)
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
        pipe.vae.decode(latents, out=out.frames, on_chunk=encode_decoded, **compile_args)
    except BaseException:
        writer.abort()
        raise
    if sent < 0:
        writer.abort()
        return None
    return writer


def run_reporting_user_errors(run_fn, args: argparse.Namespace):
    """``(True, run_fn(args))``, or ``(False, None)`` after printing one ``error:`` line for a user mistake
    (bad argument, missing or damaged file) — never a traceback for those. Ctrl-C is ``KeyboardInterrupt``, also
    when Python lost its first one (``interrupt.py``; ``run_cli`` prints its line). Shared by the package's CLIs."""
    try:
        result = run_fn(args)
        raise_if_interrupted()  # before the caller prints the result
        return True, result
    except (ValueError, FileNotFoundError, CheckpointError) as exc:
        raise_if_interrupted()  # a Ctrl-C that surfaced as another error
        end_status_line()
        print(f"error: {exc}", file=sys.stderr)
        return False, None


def print_timings(timings: dict[str, float], out: str) -> None:
    for name in ("model_load", "preprocess", "inference", "to_cpu", "encode"):
        print(f"{name:>10}: {timings.get(name, 0.0):8.2f} s")
    print(f"wrote {out}")


DEFAULT_FRAMES_HELP = (f"default {defaults.NUM_FRAMES}; more than one clip ({defaults.NUM_FRAMES}) runs as windows "
                       "(--one-pass: one clip); with --control: the control videos' length (this caps it); a "
                       f"Cosmos3-Edge checkpoint with --image: {defaults.EDGE_IMAGE_TO_VIDEO.num_frames} (its recipe)")


def checkpoint_config(checkpoint: str):
    from ..config import Cosmos3Config

    return Cosmos3Config.from_checkpoint(checkpoint)

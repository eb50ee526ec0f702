"""One request for every mode, and the one place that decides a run: every default and every check, once.

A ``Request`` holds what a user can ask (the arguments of diffusers 0.42.1 ``Cosmos3OmniPipeline.__call__``, of
the modular Transfer and action pipelines and of the windowed long video, plus the per-run ``RuntimeOptions``).
``resolve(request, checkpoint)`` turns it into a ``Resolved`` run before any model work — the diffusers modular
blocks' declared ``InputParam`` defaults and their one ``check_inputs`` per block, in one function:

* **the mode** (``MODES``): ``action`` (an ``ActionRequest``), ``transfer`` (control videos), ``windows``
  (``frames_per_chunk`` given, or ``num_frames`` above one clip — ``defaults.NUM_FRAMES`` — unless ``one_pass``)
  or ``clip`` (text/image/video to image or video);
* **every default**, by mode and by what the checkpoint decides (``CheckpointInfo``, read from its files without
  loading weights): the clip (189 frames at 1280×720; action: the input's frames), fps (24; action 5), guidance (6;
  1 for a distilled checkpoint, whose guidance is baked in, and for the action models), steps (by frames: image 50
  / video 35; a distilled checkpoint's schedule length; action 30), shift (by resolution tier; action 10; none on a
  distilled schedule), the negative prompt (the checkpoint's ``assets/negative_prompt.json``; ``""`` for Transfer
  and action, as their references), the system prompt, the window geometry — and where the checkpoint publishes a
  recipe for the mode (``checkpoint_recipe``: Cosmos3-Edge image-to-video, 832×480, 121 frames, 20 steps, guidance
  6, shift 12), each of those values the request leaves unset comes from the recipe instead;
* **every check**, one ``ValueError`` per mistake naming the argument, its value and the fix: the clip shape, the
  sampling values, the distilled checkpoint's fixed values, sound support, the conditioning, the windows and
  controls, the action condition against the checkpoint, and whether the runtime options can run here;
* **the fast modes**: an FP8 checkpoint's step policy (``model.precision.resolve``: the checkpoint's declared
  ``diffusion_step_policy`` with the request's ``mixed_precision_*`` overrides, diffusers' arguments; a schedule of
  W8A8 steps on a weight-only FP8 export is refused) and SeaCache's knobs against the run's steps — and FP8 compute
  asked for explicitly (``mixed_precision_format='fp8'``, approximate FP8 compute) where the device has no FP8 GEMMs.

Messages name arguments as ``name=value``; the boundary (a node, a CLI) adds its own name in front once, so the core
never threads a caller's name through its functions. The stage-sized pieces (``resolve_clip`` for a text encode,
``resolve_sampling`` for a sampler) are what the ComfyUI nodes call, since there each stage is its own node.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from . import defaults
from .config import CheckpointError, Cosmos3Config
from .model import precision
from .model.fp8 import asked_fp8, check_fp8_compute, run_policy
from .model.loader import read_fp8_checkpoint
from .model.weights import Fp8Checkpoint
from .modes.action import ActionRequest, check_action_request
from .modes.transfer import check_control_frames, notice_short_controls, prepare_controls, transfer_window
from .modes.windows import WindowGeometry, window_geometry
from .runtime import DEFAULT, RuntimeOptions, compile_unavailable_reason
from .sampling.distilled import DistilledSchedule, read_distilled
from .sampling.plan import check_clip, check_sampling
from .sampling.prompt import check_text, default_negative_prompt, default_use_system_prompt
from .sampling.sea_cache import SeaCacheConfig, check_sea_cache
from .kernels.attention import flash4_unavailable_reason
from .kernels.gemv import triton_unavailable_reason

MODES = ("clip", "windows", "transfer", "action")


@dataclass(frozen=True)
class CheckpointInfo:
    """What a checkpoint decides about a run, read from its small files (no weights): its transformer config,
    whether it is distilled (and its schedule), whether it can make sound, its default prompts."""

    name: str
    config: Cosmos3Config
    distilled: DistilledSchedule | None
    has_sound: bool  # a sound head (config.sound_gen) and a sound_tokenizer/ to decode it
    default_negative_prompt: str
    default_use_system_prompt: bool
    native_flow_schedule: bool = False  # model_index.json's use_native_flow_schedule
    fp8: Fp8Checkpoint | None = None  # an FP8 transformer (or one loaded for approximate FP8 compute)

    @classmethod
    def read(cls, checkpoint_dir: str | Path, config: Cosmos3Config | None = None, *,
             fp8_compute: bool = False) -> "CheckpointInfo":
        """``fp8_compute``: the checkpoint as it loads for approximate FP8 compute (the CLI's
        ``--weight-dtype fp8_e4m3fn_fast``; a loaded pipeline's info says so itself)."""
        root = Path(checkpoint_dir)
        if not root.is_dir():
            raise CheckpointError(f"checkpoint folder {root} does not exist or is not a folder; give the downloaded "
                                  "Cosmos3 checkpoint folder.")
        config = config or Cosmos3Config.from_checkpoint(root)
        index = _read_model_index(root)
        distilled = read_distilled(root)
        system = default_use_system_prompt(root)
        if distilled is not None and distilled.default_use_system_prompt is not None:
            system = distilled.default_use_system_prompt  # diffusers reads it from modular_model_index.json
        return cls(name=root.name, config=config, distilled=distilled,
                   has_sound=bool(config.sound_gen) and (root / "sound_tokenizer").is_dir(),
                   default_negative_prompt=default_negative_prompt(root), default_use_system_prompt=system,
                   native_flow_schedule=bool(index.get("use_native_flow_schedule", False)),
                   fp8=read_fp8_checkpoint(root, fp8_compute))

    @property
    def has_action(self) -> bool:
        return bool(self.config.action_gen)

    @property
    def is_edge(self) -> bool:
        """Cosmos3-Edge's architecture (relu² MLP, Nemotron norms), as the reasoner and the layers tell it apart."""
        return self.config.hidden_act == "relu2"


@dataclass
class Request:
    """What a user asks for. ``None`` means "the default" (see the module docstring for who decides it)."""

    prompt: str | Sequence[str] = ""  # windows: one prompt, or one per window
    negative_prompt: str | None = None
    # the clip
    num_frames: int | None = None  # None: 189 (Transfer: the controls' length; action: chunk_size + 1)
    height: int | None = None  # None: 720 (a checkpoint recipe's; action: the input's size)
    width: int | None = None  # None: 1280 (likewise)
    fps: float | None = None
    # sampling
    seed: int = defaults.SEED
    steps: int | None = None
    guidance: float | None = None
    schedule: str = defaults.SCHEDULE
    shift: float | None = None
    sound: bool = False
    guidance_interval: tuple[float, float] | None = None
    batch_size: int = defaults.BATCH_SIZE
    use_system_prompt: bool | None = None
    # conditioning: an image (image-to-video) or a video (video-to-video; windows: its first frames seed window 1)
    image: Any = None
    video: Any = None
    condition_latent_frames: Sequence[int] = (0, 1)
    keep: str = "first"
    # long video: windows of frames_per_chunk frames, each seeded by the previous one's last conditional_frames
    frames_per_chunk: int | None = None
    conditional_frames: int | None = None
    one_pass: bool = False  # num_frames above one clip as a single pass instead of windows
    # Transfer: {edge|blur|depth|seg|wsm: frames [F, H, W, 3] in [0, 1]}
    controls: Mapping[str, Any] | None = None
    control_guidance: float = defaults.CONTROL_GUIDANCE
    control_guidance_interval: tuple[float, float] | None = None
    # action (world-model) modes
    action: ActionRequest | None = None
    # fast modes: an NVIDIA FP8 checkpoint's step policy (diffusers' mixed_precision_* arguments; None: the
    # checkpoint's policy) and SeaCache (None: off)
    mixed_precision_format: str | None = None  # none | fp8
    mixed_precision_first_steps: int | None = None
    mixed_precision_last_steps: int | None = None
    mixed_precision_reasoner_policy: str | None = None  # high_precision | base_precision
    mixed_precision_overlap: str | None = None  # a16 | native
    sea_cache: SeaCacheConfig | None = None
    # how it runs
    options: RuntimeOptions = field(default_factory=lambda: DEFAULT)


@dataclass(frozen=True)
class Sampling:
    """The sampling values of a run, every default filled and every value checked."""

    seed: int
    steps: int
    guidance: float
    schedule: str
    shift: float | None  # None: a distilled checkpoint's fixed schedule
    sound: bool
    guidance_interval: tuple[float, float] | None
    batch_size: int
    distilled: bool  # the checkpoint's few-step schedule (sampling/distilled.py) instead of UniPC
    mixed_precision: precision.MixedPrecision | None = None  # the FP8 step policy (None: the model is not FP8)
    sea_cache: SeaCacheConfig | None = None

    @property
    def use_cfg(self) -> bool:
        return self.guidance != 1.0


@dataclass(frozen=True)
class Resolved:
    """A run with nothing left to decide (``resolve``)."""

    mode: str
    prompts: tuple[str, ...]  # one, or one per window
    negative_prompt: str | None  # None: the checkpoint's default is rendered by the tokenizer step
    num_frames: int  # the whole output (windows: total frames)
    height: int
    width: int
    fps: float
    use_system_prompt: bool
    sampling: Sampling
    options: RuntimeOptions
    image: Any = None
    video: Any = None
    condition_latent_frames: tuple[int, ...] = (0, 1)
    keep: str = "first"
    windows: WindowGeometry | None = None  # windows, transfer
    controls: dict | None = None  # transfer: preprocessed control clips, canonical key order
    control_guidance: float = defaults.CONTROL_GUIDANCE
    control_guidance_interval: tuple[float, float] | None = None
    action: ActionRequest | None = None  # checked against the checkpoint
    recipe: str | None = None  # the checkpoint recipe the mode's defaults came from (``checkpoint_recipe``)
    recipe_defaults: tuple[tuple[str, Any], ...] = ()  # (name, value) the request left unset, taken from it

    @property
    def prompt(self) -> str:
        return self.prompts[0]

    @property
    def chunk_frames(self) -> int:
        """Frames of one generated clip (a window's length for windows and Transfer)."""
        return self.windows.chunk_frames if self.windows is not None else self.num_frames


# ---------------------------------------------------------------------------------------------- the resolver
def resolve(request: Request, checkpoint: CheckpointInfo | str | Path, *, fp8_compute: bool = False) -> Resolved:
    """Every default and every check of ``request`` on ``checkpoint`` (see the module docstring). Given a folder,
    the checkpoint is read only after every check that needs none of it passed (a CLI answers a bad fps at once,
    even for a folder that is not a checkpoint); ``fp8_compute``: that folder will be loaded for approximate FP8
    compute (a loaded pipeline's ``info`` says so itself)."""
    r = request
    if not isinstance(r.options, RuntimeOptions):
        raise ValueError(f"options={r.options!r} must be a RuntimeOptions.")
    check_options(r.options)
    mode = request_mode(r)
    prompts = _prompts(r.prompt, many=mode == "windows")
    if r.negative_prompt is not None:
        if not isinstance(r.negative_prompt, str):
            raise ValueError(f"negative_prompt={r.negative_prompt!r} must be a string (or unset).")
        check_text(r.negative_prompt, "negative_prompt")
    if r.image is not None and r.video is not None:
        raise ValueError("give either an image (image-to-video) or a video (video-to-video), not both.")
    interval = _check_sampling_values(r.seed, r.steps, r.guidance, r.schedule, r.shift, r.sound,
                                      r.guidance_interval, r.batch_size)
    shape = _MODE_SHAPES[mode](r)  # the mode's own checks that need no checkpoint
    if isinstance(checkpoint, CheckpointInfo):
        info = checkpoint
        if fp8_compute and not (info.fp8 is not None and info.fp8.approximate):
            raise ValueError("fp8_compute: this pipeline was loaded without approximate FP8 compute; load it with "
                             "fp8_compute=True (CLI: --weight-dtype fp8_e4m3fn_fast).")
    else:
        info = CheckpointInfo.read(checkpoint, fp8_compute=fp8_compute)
    _check_mode(info, mode)
    recipe = checkpoint_recipe(info, mode, r)
    if recipe is not None:
        shape = _MODE_SHAPES[mode](r, recipe)
    frames, height, width = shape["frames"], shape["height"], shape["width"]
    if mode == "action":
        check_action_request(r.action, info.config)
    sampling = _sampling_defaults(info, mode, num_frames=frames, height=height, width=width, seed=r.seed,
                                  steps=r.steps, guidance=r.guidance, schedule=r.schedule, shift=r.shift,
                                  sound=r.sound, guidance_interval=interval, batch_size=r.batch_size, recipe=recipe,
                                  fast={name: getattr(r, name) for name in (*precision.OVERRIDES, "sea_cache")})
    _check_fp8_device(info, sampling, r.options)
    negative = r.negative_prompt
    if mode == "clip" and info.distilled is not None and negative:
        info.distilled.check(steps=None, guidance=None, negative_prompt=negative)
    if mode == "action":
        negative = defaults.ACTION_NEGATIVE_PROMPT if negative is None else negative
        system = defaults.ACTION_USE_SYSTEM_PROMPT if r.use_system_prompt is None else bool(r.use_system_prompt)
    elif mode == "transfer":
        system = True if r.use_system_prompt is None else bool(r.use_system_prompt)  # the Transfer text step's
    else:
        system = _system_prompt(r, info)
    return Resolved(mode, prompts, negative, shape["total"], height, width, shape["fps"], system, sampling,
                    r.options, image=shape.get("image"), video=shape.get("video"),
                    condition_latent_frames=tuple(r.condition_latent_frames), keep=r.keep,
                    windows=shape.get("windows"), controls=shape.get("controls"),
                    control_guidance=float(r.control_guidance),
                    control_guidance_interval=r.control_guidance_interval, action=r.action,
                    recipe=recipe.name if recipe else None, recipe_defaults=_recipe_defaults(r, recipe))


def checkpoint_recipe(checkpoint: CheckpointInfo, mode: str, request: Request) -> defaults.ClipRecipe | None:
    """The recipe ``checkpoint`` publishes for what ``request`` asks, or ``None`` (the general defaults): Cosmos3-Edge's
    image-to-video (one clip from an image) on an Edge checkpoint that is not distilled."""
    if checkpoint.is_edge and checkpoint.distilled is None and mode == "clip" and request.image is not None:
        return defaults.EDGE_IMAGE_TO_VIDEO
    return None


def _recipe_defaults(r: Request, recipe: defaults.ClipRecipe | None) -> tuple[tuple[str, Any], ...]:
    if recipe is None:
        return ()
    names = ("width", "height", "num_frames", "steps", "guidance", "shift")
    return tuple((name, getattr(recipe, name)) for name in names if getattr(r, name) is None)


def request_mode(r: Request) -> str:
    """The mode a request asks for (see the module docstring)."""
    if r.action is not None:
        if r.controls is not None or r.frames_per_chunk is not None:
            raise ValueError("an action mode runs one clip: drop the control videos / frames_per_chunk.")
        return "action"
    if r.controls is not None:
        return "transfer"
    if r.frames_per_chunk is not None:
        return "windows"
    if isinstance(r.num_frames, int) and not isinstance(r.num_frames, bool) and r.num_frames > defaults.NUM_FRAMES:
        return "clip" if r.one_pass else "windows"
    return "clip"


def resolve_clip(prompt: str, negative_prompt: str | None, *, num_frames: int, height: int, width: int, fps: float,
                 checkpoint: CheckpointInfo, one_pass: bool = False) -> None:
    """The checks of a text encode (the clip the prompts describe): the shape, the texts, a distilled checkpoint's
    missing negative branch. A clip above one model clip needs ``one_pass`` (windows are the long-video mode)."""
    check_clip(num_frames, height, width, fps)
    if num_frames > defaults.NUM_FRAMES and not one_pass:
        raise ValueError(
            f"num_frames={num_frames} is longer than one Cosmos3 clip ({defaults.NUM_FRAMES} frames); generate it "
            "in windows (ComfyUI: Cosmos3 Long Video; CLI: windows are the default), or ask for one pass "
            "(one_pass / --one-pass) to sample it as a single clip the model was not trained for."
        )
    _check_prompt(prompt)
    if negative_prompt is not None:
        check_text(negative_prompt, "negative_prompt")
        if checkpoint.distilled is not None and negative_prompt:
            checkpoint.distilled.check(steps=None, guidance=None, negative_prompt=negative_prompt)


def resolve_sampling(checkpoint: CheckpointInfo, *, num_frames: int, height: int, width: int, mode: str = "clip",
                     seed: int = defaults.SEED, steps: int | None = None, guidance: float | None = None,
                     schedule: str | None = None, shift: float | None = None, sound: bool = False,
                     guidance_interval: tuple[float, float] | None = None,
                     batch_size: int = defaults.BATCH_SIZE, mixed_precision_format: str | None = None,
                     mixed_precision_first_steps: int | None = None, mixed_precision_last_steps: int | None = None,
                     mixed_precision_reasoner_policy: str | None = None, mixed_precision_overlap: str | None = None,
                     sea_cache: SeaCacheConfig | None = None) -> Sampling:
    """The sampling values of a clip of ``num_frames`` × ``height`` × ``width`` in ``mode`` on ``checkpoint`` (a
    sampler's stage of ``resolve``), the fast modes' included."""
    fast = dict(mixed_precision_format=mixed_precision_format, mixed_precision_first_steps=mixed_precision_first_steps,
                mixed_precision_last_steps=mixed_precision_last_steps,
                mixed_precision_reasoner_policy=mixed_precision_reasoner_policy,
                mixed_precision_overlap=mixed_precision_overlap, sea_cache=sea_cache)
    schedule = defaults.SCHEDULE if schedule is None else schedule
    _check_mode(checkpoint, mode)  # before its fixed values: a sampler's steps are not what is wrong here
    interval = _check_sampling_values(seed, steps, guidance, schedule, shift, sound, guidance_interval, batch_size)
    return _sampling_defaults(checkpoint, mode, num_frames=num_frames, height=height, width=width, seed=seed,
                              steps=steps, guidance=guidance, schedule=schedule, shift=shift, sound=sound,
                              guidance_interval=interval, batch_size=batch_size, fast=fast)


def check_options(options: RuntimeOptions) -> None:
    """Refuse runtime options that cannot run on this machine (a forced kernel that is missing), before loading."""
    if options.attention == "flash4":
        reason = flash4_unavailable_reason()
        if reason:
            raise ValueError(f"attention='flash4': FlashAttention-4 cannot run here ({reason}); use attention 'auto' "
                             "or 'sdpa' (CLI: --attention auto), or install flash-attn-4 on a Hopper (sm90) GPU.")
    if options.compile == "on" and options.compile_backend == "inductor":
        import torch

        cuda = options.device_type == "cuda" or (options.device_type is None and torch.cuda.is_available())
        reason = compile_unavailable_reason(cuda)
        if reason:
            raise ValueError(f"compile='on': torch.compile cannot run here ({reason}); use compile 'auto' or 'off' "
                             "(CLI: --compile auto), or install it.")
    if options.gemv == "triton":
        reason = triton_unavailable_reason()
        if reason:
            raise ValueError(f"gemv='triton': the Triton GEMV cannot run here ({reason}); use 'auto' or 'torch'.")


# ---------------------------------------------------------------------------------------------- sampling
def _check_mode(checkpoint: CheckpointInfo, mode: str) -> None:
    """A distilled checkpoint samples one clip on its fixed schedule: the other modes need a base checkpoint."""
    if mode != "clip" and checkpoint.distilled is not None:
        raise ValueError(f"checkpoint {checkpoint.name!r} is distilled (a fixed few-step schedule for one clip); the "
                         f"{mode} mode needs a base (non-distilled) checkpoint.")


def _check_sampling_values(seed, steps, guidance, schedule, shift, sound, guidance_interval, batch_size):
    """The sampling values on their own (no checkpoint); returns the guidance interval as a pair."""
    if guidance_interval is not None:
        guidance_interval = _pair(guidance_interval, "guidance_interval")
    check_sampling(seed=seed, steps=steps, guidance=guidance, schedule=schedule, shift=shift,
                   guidance_interval=guidance_interval, batch_size=batch_size)
    if not isinstance(sound, bool):
        raise ValueError(f"sound={sound!r} must be true or false.")
    return guidance_interval


def _sampling_defaults(checkpoint: CheckpointInfo, mode: str, *, num_frames, height, width, seed, steps, guidance,
                       schedule, shift, sound, guidance_interval, batch_size,
                       recipe: defaults.ClipRecipe | None = None, fast: dict | None = None) -> Sampling:
    """What the checkpoint and the mode decide about checked sampling values (see the module docstring)."""
    distilled = checkpoint.distilled
    if distilled is not None:
        distilled.check(steps=steps, guidance=guidance, shift=shift, schedule=schedule, sound=sound)
        if guidance_interval is not None:
            raise ValueError(f"guidance_interval={list(guidance_interval)} has no effect on distilled checkpoint "
                             f"{checkpoint.name!r} (one branch, guidance baked in); drop it.")
        return Sampling(seed, distilled.steps, 1.0, schedule, None, False, None, batch_size, True,
                        *_fast_modes(checkpoint, distilled.steps, True, **(fast or {})))
    if sound and not checkpoint.has_sound:
        raise ValueError(
            f"sound=True, but checkpoint {checkpoint.name!r} has no sound_tokenizer/ or sound head (Edge cannot "
            "generate sound); set sound to false (CLI: drop --sound) or use a Nano/Super checkpoint."
        )
    if mode == "action":
        steps = defaults.ACTION_STEPS if steps is None else steps
        guidance = defaults.ACTION_GUIDANCE if guidance is None else guidance
        shift = defaults.ACTION_SHIFT if shift is None else shift
    elif recipe is not None:
        steps = recipe.steps if steps is None else steps
        guidance = recipe.guidance if guidance is None else guidance
        shift = recipe.shift if shift is None else shift
    else:
        steps = (defaults.STEPS_VIDEO if mode != "clip" else defaults.default_steps(num_frames)) if steps is None \
            else steps
        guidance = defaults.GUIDANCE if guidance is None else guidance
        shift = defaults.default_shift(height, width) if shift is None else shift
    if guidance_interval is not None and float(guidance) == 1.0:
        raise ValueError(f"guidance_interval={list(guidance_interval)} has no effect with guidance 1 (no negative "
                         "branch to drop); drop it or raise the guidance.")
    return Sampling(int(seed), int(steps), float(guidance), schedule, float(shift), sound, guidance_interval,
                    batch_size, False, *_fast_modes(checkpoint, int(steps), False, **(fast or {})))


# ---------------------------------------------------------------------------------------------- fast modes
def _fast_modes(checkpoint: CheckpointInfo, steps: int, distilled: bool, sea_cache: SeaCacheConfig | None = None,
                **mixed_precision) -> tuple[precision.MixedPrecision | None, SeaCacheConfig | None]:
    """The FP8 step policy on ``checkpoint`` (None: it is not FP8) and the checked SeaCache knobs of a run."""
    return run_policy(checkpoint.fp8, checkpoint.name, **mixed_precision), check_sea_cache(sea_cache, steps, distilled)


def _check_fp8_device(checkpoint: CheckpointInfo, sampling: Sampling, options: RuntimeOptions) -> None:
    """FP8 compute asked for explicitly where the run's device has no FP8 GEMMs, refused before any load (the
    plan checks the device it runs on again: ``fp8.fp8_steps``)."""
    import torch

    kind = options.device_type or ("cuda" if torch.cuda.is_available() else "cpu")
    check_fp8_compute(asked_fp8(checkpoint.fp8, sampling.mixed_precision), kind, options.fp8_gemm)


# ---------------------------------------------------------------------------------------------- mode shapes
# Each mode's checks that need no checkpoint, and the clip it generates: {frames, height, width (of one generated
# clip), total (output frames), fps, ...mode parts}.
def _clip_shape(r: Request, recipe: defaults.ClipRecipe | None = None) -> dict:
    fps = defaults.FPS if r.fps is None else r.fps
    num_frames = _given(r.num_frames, recipe.num_frames if recipe else defaults.NUM_FRAMES)
    height = _given(r.height, recipe.height if recipe else defaults.HEIGHT)
    width = _given(r.width, recipe.width if recipe else defaults.WIDTH)
    check_clip(num_frames, height, width, fps)
    if (r.image is not None or r.video is not None) and num_frames == 1:
        what = "image" if r.image is not None else "video"
        raise ValueError(
            f"a conditioning {what} was given with num_frames=1 (text-to-image), where it would be ignored; "
            f"use num_frames 5 or more (4k+1) to condition a video on it, or drop the {what}."
        )
    if r.keep not in ("first", "last"):
        raise ValueError(f"keep={r.keep!r} must be 'first' or 'last'.")
    if r.conditional_frames is not None:
        raise ValueError("conditional_frames applies to windows only; set frames_per_chunk (or give control videos "
                         "for Transfer), or drop it.")
    if r.control_guidance != defaults.CONTROL_GUIDANCE:
        raise ValueError("control_guidance applies to Transfer only; give control videos, or drop it.")
    return dict(frames=num_frames, total=num_frames, height=height, width=width, fps=float(fps), image=r.image,
                video=r.video)


def _windows_shape(r: Request, recipe: defaults.ClipRecipe | None = None) -> dict:
    fps = defaults.FPS if r.fps is None else r.fps
    height, width = _given(r.height, defaults.HEIGHT), _given(r.width, defaults.WIDTH)
    chunk = defaults.NUM_FRAMES if r.frames_per_chunk is None else r.frames_per_chunk
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 5 or (chunk - 1) % 4:
        near = max(5, (chunk - 1) // 4 * 4 + 1) if isinstance(chunk, int) and not isinstance(chunk, bool) else 0
        try_ = min(near, defaults.NUM_FRAMES) if near else defaults.NUM_FRAMES
        raise ValueError(f"frames_per_chunk={chunk!r} must be 4k+1 and at least 5 (a window is one Cosmos3 clip, up "
                         f"to {defaults.NUM_FRAMES} frames); try {try_}.")
    if r.batch_size != 1:
        raise ValueError(f"batch_size={r.batch_size!r}: windowed generation and Transfer run one video at a time; "
                         "set batch_size to 1.")
    check_clip(chunk, height, width, fps)
    transfer = r.controls is not None
    cf = r.conditional_frames
    if cf is None:
        cf = defaults.TRANSFER_CONDITIONAL_FRAMES if transfer else defaults.LONG_CONDITIONAL_FRAMES
    controls = None
    if transfer:
        if r.sound:
            raise ValueError("Transfer (control videos) generates no sound; drop sound (CLI: --sound).")
        if r.image is not None:
            raise ValueError("Transfer takes a seed video, not an image; pass the image as a 1-frame video.")
        if not isinstance(r.prompt, str) and len(r.prompt) > 1:
            raise ValueError("Transfer takes one prompt for the whole video (as the reference); give one prompt.")
        control_guidance = r.control_guidance
        if not (isinstance(control_guidance, (int, float)) and not isinstance(control_guidance, bool)
                and math.isfinite(control_guidance) and 0 <= control_guidance <= defaults.MAX_GUIDANCE):
            raise ValueError(f"control_guidance={control_guidance!r} must be a number from 0 to "
                             f"{defaults.MAX_GUIDANCE:g} (1 = the controls as given).")
        if r.control_guidance_interval is not None:
            _pair(r.control_guidance_interval, "control_guidance_interval")
        controls = prepare_controls(r.controls, height, width)
        total = next(iter(controls.values())).shape[2]
        check_control_frames(total)
        if r.num_frames is not None:
            if isinstance(r.num_frames, bool) or not isinstance(r.num_frames, int) or r.num_frames < 1:
                raise ValueError(f"num_frames={r.num_frames!r} must be a positive integer (a cap on the control "
                                 "videos' length), or unset.")
            notice_short_controls(total, r.num_frames)
            total = min(total, r.num_frames)
        chunk = transfer_window(chunk, total)
    else:
        if r.control_guidance != defaults.CONTROL_GUIDANCE:
            raise ValueError("control_guidance applies to Transfer only; give control videos, or drop it.")
        total = chunk if r.num_frames is None else r.num_frames
        if isinstance(total, bool) or not isinstance(total, int) or total < 5 or (total - 1) % 4:
            fixed = max(5, (int(total) - 1) // 4 * 4 + 1) if isinstance(total, int) else defaults.NUM_FRAMES
            raise ValueError(f"num_frames={total!r} must be 4k+1 and at least 5 for a windowed video "
                             f"(e.g. 721 = 30 s at 24 fps); try {fixed}.")
        if total > defaults.MAX_LONG_FRAMES:
            raise ValueError(f"num_frames={total} is above the limit of {defaults.MAX_LONG_FRAMES} frames.")
    geometry = window_geometry(total, chunk, cf)
    prompts = 1 if isinstance(r.prompt, str) else len(r.prompt)
    if prompts not in (1, geometry.num_windows):
        raise ValueError(
            f"{prompts} prompts were given for {geometry.num_windows} windows ({geometry.total_frames} frames in "
            f"windows of {geometry.chunk_frames} overlapping by {geometry.conditional_frames}); give one prompt, "
            f"or exactly {geometry.num_windows}."
        )
    return dict(frames=chunk, total=geometry.total_frames, height=height, width=width, fps=float(fps),
                image=r.image, video=r.video, windows=geometry, controls=controls)


def _action_shape(r: Request, recipe: defaults.ClipRecipe | None = None) -> dict:
    if not isinstance(r.action, ActionRequest):
        raise ValueError(f"action={r.action!r} must be an ActionRequest (cosmos3_core.modes.action).")
    if r.num_frames is not None or r.height is not None or r.width is not None:
        raise ValueError("num_frames / height / width do not apply to an action mode: the clip spans chunk_size + 1 "
                         "frames at the input's size (bucketed by resolution_tier).")
    if r.image is not None or r.video is not None:
        raise ValueError("an action mode takes its frames in the action request (ActionRequest.image / video).")
    if r.guidance_interval is not None:
        raise ValueError("guidance_interval does not apply to an action mode (the action models run without "
                         "guidance by default); drop it.")
    fps = defaults.ACTION_FPS if r.fps is None else r.fps
    check_clip(1, defaults.VAE_SPATIAL_STRIDE, defaults.VAE_SPATIAL_STRIDE, fps)  # the fps (any frame count is fine)
    check_action_request(r.action)  # what needs no checkpoint; resolve checks it against the checkpoint's config
    return dict(frames=r.action.num_frames, total=r.action.num_frames, height=0, width=0, fps=float(fps))


_MODE_SHAPES = {"clip": _clip_shape, "windows": _windows_shape, "transfer": _windows_shape, "action": _action_shape}


# ---------------------------------------------------------------------------------------------- helpers
def _given(value, default):
    """``value`` unless unset (``None``)."""
    return default if value is None else value


def _system_prompt(r: Request, checkpoint: CheckpointInfo) -> bool:
    if r.use_system_prompt is None:
        return checkpoint.default_use_system_prompt
    if not isinstance(r.use_system_prompt, bool):
        raise ValueError(f"use_system_prompt={r.use_system_prompt!r} must be true, false or unset.")
    return r.use_system_prompt


def _check_prompt(prompt) -> None:
    if not isinstance(prompt, str):
        raise ValueError(f"prompt={prompt!r} must be a string.")
    check_text(prompt, "prompt")
    if not prompt.strip():
        raise ValueError("prompt is empty; describe what to generate (a JSON-upsampled caption works best).")


def _prompts(prompt, *, many: bool) -> tuple[str, ...]:
    if isinstance(prompt, str):
        prompts = (prompt,)
    elif many and isinstance(prompt, Sequence) and prompt and all(isinstance(p, str) for p in prompt):
        prompts = tuple(prompt)
    elif isinstance(prompt, Sequence) and not isinstance(prompt, str) and len(prompt) > 1:
        raise ValueError(f"{len(prompt)} prompts were given; one prompt per window needs windows (frames_per_chunk, "
                         "or num_frames above one clip); otherwise give one prompt.")
    elif isinstance(prompt, Sequence) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompts = (prompt[0],)
    else:
        raise ValueError(f"prompt={prompt!r} must be a string (windows: or a list of strings, one per window).")
    for i, p in enumerate(prompts, 1):
        if len(prompts) > 1 and isinstance(p, str) and not p.strip():
            raise ValueError(f"prompt {i} of {len(prompts)} (window {i}) is empty; describe what each window shows, or "
                             "give one prompt for the whole video.")
        _check_prompt(p)
    return prompts


def _pair(value, name: str) -> tuple[float, float]:
    try:
        low, high = value
    except (TypeError, ValueError):
        raise ValueError(f"{name}={value!r} must be two numbers LOW HIGH.") from None
    return (low, high)


def _read_model_index(root: Path) -> dict:
    path = root / "model_index.json"
    if not path.is_file():
        return {}
    try:
        value = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path} is not valid JSON ({exc}).") from exc
    return value if isinstance(value, dict) else {}


__all__ = ["CheckpointInfo", "MODES", "Request", "Resolved", "Sampling", "check_options", "checkpoint_recipe",
           "request_mode", "resolve", "resolve_clip", "resolve_sampling", "replace"]

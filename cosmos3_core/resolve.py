"""The resolver: the one place that decides a Cosmos3 run — every default and every user-facing check, once,
before any model work.

``resolve(request, checkpoint)`` turns a ``request.Request`` into a ``request.Resolved`` run — the diffusers 0.42.1
modular blocks' declared ``InputParam`` defaults and their one ``check_inputs`` per block, in one function:

* **the mode** (``request_mode``): ``action`` (an ``ActionRequest``), ``transfer`` (control videos), ``windows``
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
* **every check** (``checks.py``), one ``ValueError`` per mistake naming the argument, its value and the fix;
* **the fast modes**: an FP8 checkpoint's step policy (``model.precision.resolve``: the checkpoint's declared
  ``diffusion_step_policy`` with the request's ``mixed_precision_*`` overrides, diffusers' arguments; a schedule of
  W8A8 steps on a weight-only FP8 export is refused) and SeaCache's knobs against the run's steps — and FP8 compute
  asked for explicitly (``mixed_precision_format='fp8'``, approximate FP8 compute) where the device has no FP8 GEMMs.

The stage-sized pieces are what the ComfyUI nodes call, since there each stage is its own node: ``resolve_clip``
(a text encode), ``resolve_sampler`` (a sampler: its sampling values and the checks across its inputs). Messages
name arguments as ``name=value``; a boundary (a node, a CLI) adds its own name in front once. The core speaks both
boundaries' languages in its fixes ("CLI: --sound", "ComfyUI: Cosmos3 Long Video") so that one message serves both.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any, Sequence

import torch

from . import defaults
from .checks import (
    check_action_against,
    check_action_request,
    check_clip,
    check_control_frames,
    check_fps,
    check_negative_prompt,
    check_options,
    check_prompt,
    check_sampling,
    pair,
    window_geometry,
)
from .model.fp8 import asked_fp8, check_fp8_compute, run_policy
from .model.text_kv import TextConditioning
from .modes.action import ActionCondition
from .modes.transfer import prepare_controls
from .request import ActionRequest, CheckpointInfo, ConditionLatents, Request, Resolved, Sampling, SamplingRequest
from .sampling.sea_cache import check_sea_cache

_log = logging.getLogger("cosmos3")

__all__ = ["checkpoint_recipe", "request_mode", "resolve", "resolve_action", "resolve_clip", "resolve_sampler",
           "resolve_sampling"]


# ---------------------------------------------------------------------------------------------- a whole request
def resolve(request: Request, checkpoint, *, fp8_compute: bool = False) -> Resolved:
    """Every default and every check of ``request`` on ``checkpoint`` (a ``CheckpointInfo`` or a checkpoint folder).
    Given a folder, the checkpoint is read only after every check that needs none of it passed (a CLI answers a bad
    fps at once, even for a folder that is not a checkpoint); ``fp8_compute``: that folder will be loaded for
    approximate FP8 compute (a loaded pipeline's ``info`` says so itself)."""
    r = request
    check_options(r.options)
    mode = request_mode(r)
    prompts = _prompts(r.prompt, many=mode == "windows")
    check_negative_prompt(r.negative_prompt)
    if r.image is not None and r.video is not None:
        raise ValueError("give either an image (image-to-video) or a video (video-to-video), not both.")
    asked = _checked_sampling(r.sampling_request())
    shape = _MODE_SHAPES[mode](r)  # the mode's own checks that need no checkpoint
    info = _checkpoint_info(checkpoint, fp8_compute)
    _check_mode(info, mode)
    recipe = checkpoint_recipe(info, mode, r)
    if recipe is not None:
        shape = _MODE_SHAPES[mode](r, recipe)
    if mode == "action":
        check_action_against(r.action, info.config)  # the rest was checked with the mode's shape
    sampling = _sampling_defaults(info, mode, shape, asked, recipe)
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
    return Resolved(mode, prompts, negative, shape["total"], shape["height"], shape["width"], shape["fps"], system,
                    sampling, r.options, image=shape.get("image"), video=shape.get("video"),
                    condition_latent_frames=tuple(r.condition_latent_frames), keep=r.keep,
                    windows=shape.get("windows"), controls=shape.get("controls"),
                    control_guidance=float(_given(r.control_guidance, defaults.CONTROL_GUIDANCE)),
                    control_guidance_interval=r.control_guidance_interval, action=r.action,
                    recipe=recipe.name if recipe else None, recipe_defaults=_recipe_defaults(r, recipe))


def _checkpoint_info(checkpoint, fp8_compute: bool) -> CheckpointInfo:
    if not isinstance(checkpoint, CheckpointInfo):
        return CheckpointInfo.read(checkpoint, fp8_compute=fp8_compute)
    if fp8_compute and not (checkpoint.fp8 is not None and checkpoint.fp8.approximate):
        raise ValueError("fp8_compute: this pipeline was loaded without approximate FP8 compute; load it with "
                         "fp8_compute=True (CLI: --weight-dtype fp8_e4m3fn_fast).")
    return checkpoint


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
        if r.one_pass:
            raise ValueError(f"one_pass asks for one clip but frames_per_chunk={r.frames_per_chunk!r} asks for "
                             "windows of that length; drop one of them (CLI: --one-pass, --frames-per-chunk).")
        return "windows"
    if isinstance(r.num_frames, int) and not isinstance(r.num_frames, bool) and r.num_frames > defaults.NUM_FRAMES:
        return "clip" if r.one_pass else "windows"
    return "clip"


# ---------------------------------------------------------------------------------------------- stages
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
    check_prompt(prompt)
    check_negative_prompt(negative_prompt)
    if checkpoint.distilled is not None and negative_prompt:
        checkpoint.distilled.check(steps=None, guidance=None, negative_prompt=negative_prompt)


def resolve_sampling(checkpoint: CheckpointInfo, clip, asked: SamplingRequest = SamplingRequest(), *,
                     mode: str = "clip") -> Sampling:
    """The sampling values of a clip (``clip.num_frames`` × ``clip.height`` × ``clip.width``: a
    ``TextConditioning``, say) in ``mode`` on ``checkpoint`` — a sampler's stage of ``resolve``, the fast modes'
    included."""
    _check_mode(checkpoint, mode)  # before its fixed values: a sampler's steps are not what is wrong here
    shape = dict(frames=clip.num_frames, height=clip.height, width=clip.width)
    return _sampling_defaults(checkpoint, mode, shape, _checked_sampling(asked))


def resolve_sampler(checkpoint: CheckpointInfo, text: TextConditioning, asked: SamplingRequest = SamplingRequest(),
                    *, condition: ConditionLatents | None = None, action: ActionCondition | None = None) -> Sampling:
    """A sampler's stage: its sampling values (``resolve_sampling``; the action defaults with an ``action``) and the
    checks across its inputs — the text, the condition latents and the action condition must describe one clip."""
    if action is not None and condition is not None:
        raise ValueError("both a condition and an action are connected; an action mode brings its own frames "
                         "(Cosmos3 Action Condition) — disconnect the condition.")
    if condition is not None:
        _check_condition_matches(text, condition)
    if action is not None:
        _check_action_text(text, action)
        if not checkpoint.has_action:
            raise ValueError(f"an action mode needs a checkpoint trained with action_gen=True (and its action head); "
                             f"checkpoint {checkpoint.name} has none. Use a Cosmos3 checkpoint with action_gen.")
    sampling = resolve_sampling(checkpoint, text, asked, mode="clip" if action is None else "action")
    if sampling.use_cfg and text.uncond is None:
        raise ValueError(f"guidance {sampling.guidance:g} needs the negative prompt's text K/V, but the text was "
                         "encoded with one branch (a distilled checkpoint); set guidance to 1.")
    return sampling


def resolve_action(checkpoint: CheckpointInfo, request: ActionRequest, prompt: str, negative_prompt: str | None,
                   fps: float) -> None:
    """An action condition's stage (ComfyUI: Cosmos3 Action Condition): the request against the checkpoint's action
    head, the prompts and the fps its caption describes."""
    check_action_request(request, checkpoint.config)
    check_prompt(prompt)
    check_negative_prompt(negative_prompt)
    check_fps(fps)


def _check_condition_matches(text: TextConditioning, condition: ConditionLatents) -> None:
    if (condition.height, condition.width) != (text.height, text.width):
        source = "Cosmos3 First/Last Frame" if condition.num_frames is not None else "Cosmos3 VAE Encode (Condition)"
        raise ValueError(f"condition was encoded at {condition.width}x{condition.height} but the text describes "
                         f"{text.width}x{text.height}; set the same width and height on {source} and Cosmos3 Text "
                         "Encode.")
    if condition.num_frames is not None and condition.num_frames != text.num_frames:
        raise ValueError(f"condition was made for num_frames={condition.num_frames} (its last keyframe is latent "
                         f"frame {max(condition.clean_frames)}) but the text describes num_frames={text.num_frames}; "
                         "set the same num_frames on Cosmos3 First/Last Frame and Cosmos3 Text Encode.")
    _check_conditioned_clip(text.num_frames, "condition")


def _check_conditioned_clip(num_frames: int, what: str) -> None:
    """A condition needs a video to condition: one frame (text-to-image) would ignore it."""
    if num_frames == 1:
        raise ValueError(f"a {what} was given with num_frames=1 (text-to-image), where it would be ignored; use "
                         f"num_frames 5 or more (4k+1) to condition a video on it, or drop the {what}.")


def _check_action_text(text: TextConditioning, action: ActionCondition) -> None:
    """The text K/V must be the caption rendered for ``action`` (not a plain Cosmos3 Text Encode)."""
    if not action.describes(text):
        raise ValueError("the text was not encoded for this action condition (its prompt is not the action caption "
                         "of these frames); use the text output of the same Cosmos3 Action Condition.")


# ---------------------------------------------------------------------------------------------- sampling
def _check_mode(checkpoint: CheckpointInfo, mode: str) -> None:
    """A distilled checkpoint samples one clip on its fixed schedule: the other modes need a base checkpoint."""
    if mode != "clip" and checkpoint.distilled is not None:
        raise ValueError(f"checkpoint {checkpoint.name!r} is distilled (a fixed few-step schedule for one clip); the "
                         f"{mode} mode needs a base (non-distilled) checkpoint.")


def _checked_sampling(asked: SamplingRequest) -> SamplingRequest:
    """The sampling values on their own (no checkpoint); the guidance interval as a pair."""
    if asked.guidance_interval is not None:
        asked = replace(asked, guidance_interval=pair(asked.guidance_interval, "guidance_interval"))
    check_sampling(seed=asked.seed, steps=asked.steps, guidance=asked.guidance, schedule=asked.schedule,
                   shift=asked.shift, guidance_interval=asked.guidance_interval, batch_size=asked.batch_size)
    if not isinstance(asked.sound, bool):
        raise ValueError(f"sound={asked.sound!r} must be true or false.")
    return asked


def _sampling_defaults(checkpoint: CheckpointInfo, mode: str, shape: dict, asked: SamplingRequest,
                       recipe: defaults.ClipRecipe | None = None) -> Sampling:
    """What the checkpoint and the mode decide about checked sampling values (see the module docstring)."""
    distilled = checkpoint.distilled
    if distilled is not None:
        distilled.check(steps=asked.steps, guidance=asked.guidance, shift=asked.shift, schedule=asked.schedule,
                        sound=asked.sound)
        if asked.guidance_interval is not None:
            raise ValueError(f"guidance_interval={list(asked.guidance_interval)} has no effect on distilled "
                             f"checkpoint {checkpoint.name!r} (one branch, guidance baked in); drop it.")
        return Sampling(asked.seed, distilled.steps, 1.0, asked.schedule, None, False, None, asked.batch_size, True,
                        *_fast_modes(checkpoint, distilled.steps, True, asked))
    if asked.sound and not checkpoint.has_sound:
        raise ValueError(
            f"sound=True, but checkpoint {checkpoint.name!r} has no sound_tokenizer/ or sound head (Edge cannot "
            "generate sound); set sound to false (CLI: drop --sound) or use a Nano/Super checkpoint."
        )
    if mode == "action":
        steps, guidance, shift = defaults.ACTION_STEPS, defaults.ACTION_GUIDANCE, defaults.ACTION_SHIFT
    elif recipe is not None:
        steps, guidance, shift = recipe.steps, recipe.guidance, recipe.shift
    else:
        steps = defaults.STEPS_VIDEO if mode != "clip" else defaults.default_steps(shape["frames"])
        guidance, shift = defaults.GUIDANCE, defaults.default_shift(shape["height"], shape["width"])
    steps, guidance = int(_given(asked.steps, steps)), float(_given(asked.guidance, guidance))
    shift = float(_given(asked.shift, shift))
    if asked.guidance_interval is not None and guidance == 1.0:
        raise ValueError(f"guidance_interval={list(asked.guidance_interval)} has no effect with guidance 1 (no "
                         "negative branch to drop); drop it or raise the guidance.")
    return Sampling(int(asked.seed), steps, guidance, asked.schedule, shift, asked.sound, asked.guidance_interval,
                    asked.batch_size, False, *_fast_modes(checkpoint, steps, False, asked))


def _fast_modes(checkpoint: CheckpointInfo, steps: int, distilled: bool, asked: SamplingRequest) -> tuple:
    """The FP8 step policy on ``checkpoint`` (None: it is not FP8) and the checked SeaCache knobs of a run."""
    policy = run_policy(checkpoint.fp8, checkpoint.name, **asked.mixed_precision_overrides())
    return policy, check_sea_cache(asked.sea_cache, steps, distilled)


def _check_fp8_device(checkpoint: CheckpointInfo, sampling: Sampling, options) -> None:
    """FP8 compute asked for explicitly where the run's device has no FP8 GEMMs, refused before any load (the
    plan checks the device it runs on again: ``fp8.fp8_steps``)."""
    kind = options.device_type or ("cuda" if torch.cuda.is_available() else "cpu")
    check_fp8_compute(asked_fp8(checkpoint.fp8, sampling.mixed_precision), kind, options.fp8_gemm)


# ---------------------------------------------------------------------------------------------- mode shapes
# Each mode's checks that need no checkpoint, and the clip it generates: {frames, height, width (of one generated
# clip), total (output frames), fps, ...mode parts}.
def _clip_shape(r: Request, recipe: defaults.ClipRecipe | None = None) -> dict:
    fps = _given(r.fps, defaults.FPS)
    num_frames = _given(r.num_frames, recipe.num_frames if recipe else defaults.NUM_FRAMES)
    height = _given(r.height, recipe.height if recipe else defaults.HEIGHT)
    width = _given(r.width, recipe.width if recipe else defaults.WIDTH)
    check_clip(num_frames, height, width, fps)
    if r.image is not None or r.video is not None:
        _check_conditioned_clip(num_frames, "conditioning image" if r.image is not None else "conditioning video")
    if r.keep not in ("first", "last"):
        raise ValueError(f"keep={r.keep!r} must be 'first' or 'last'.")
    if r.conditional_frames is not None:
        raise ValueError("conditional_frames applies to windows only; set frames_per_chunk (or give control videos "
                         "for Transfer), or drop it.")
    _check_not_transfer(r)
    return dict(frames=num_frames, total=num_frames, height=height, width=width, fps=float(fps), image=r.image,
                video=r.video)


def _check_not_transfer(r: Request) -> None:
    if r.control_guidance is not None or r.control_guidance_interval is not None:
        raise ValueError("control_guidance applies to Transfer only; give control videos, or drop it.")


def _windows_shape(r: Request, recipe: defaults.ClipRecipe | None = None) -> dict:
    fps = _given(r.fps, defaults.FPS)
    height, width = _given(r.height, defaults.HEIGHT), _given(r.width, defaults.WIDTH)
    chunk = _given(r.frames_per_chunk, defaults.NUM_FRAMES)
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 5 or (chunk - 1) % 4:
        near = defaults.valid_frames(chunk, 5) if isinstance(chunk, int) and not isinstance(chunk, bool) else 0
        try_ = min(near, defaults.NUM_FRAMES) if near else defaults.NUM_FRAMES
        raise ValueError(f"frames_per_chunk={chunk!r} must be 4k+1 and at least 5 (a window is one Cosmos3 clip, up "
                         f"to {defaults.NUM_FRAMES} frames); try {try_}.")
    if r.batch_size != 1:
        raise ValueError(f"batch_size={r.batch_size!r}: windowed generation and Transfer run one video at a time; "
                         "set batch_size to 1.")
    check_clip(chunk, height, width, fps)
    transfer = r.controls is not None
    cf = _given(r.conditional_frames,
                defaults.TRANSFER_CONDITIONAL_FRAMES if transfer else defaults.LONG_CONDITIONAL_FRAMES)
    if transfer:
        controls, total = _transfer_controls(r, height, width)
        chunk = transfer_window(chunk, total)
    else:
        _check_not_transfer(r)
        controls, total = None, _windows_total(r, chunk)
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


def _windows_total(r: Request, chunk: int) -> int:
    total = _given(r.num_frames, chunk)
    if isinstance(total, bool) or not isinstance(total, int) or total < 5 or (total - 1) % 4:
        fixed = defaults.valid_frames(total, 5) if isinstance(total, int) else defaults.NUM_FRAMES
        raise ValueError(f"num_frames={total!r} must be 4k+1 and at least 5 for a windowed video "
                         f"(e.g. 721 = 30 s at 24 fps); try {fixed}.")
    if total > defaults.MAX_LONG_FRAMES:
        raise ValueError(f"num_frames={total} is above the limit of {defaults.MAX_LONG_FRAMES} frames.")
    return total


def _transfer_controls(r: Request, height: int, width: int) -> tuple[dict, int]:
    """Transfer's checks, its preprocessed control clips and the output's length (the controls', capped by
    ``num_frames``)."""
    if r.sound:
        raise ValueError("Transfer (control videos) generates no sound; drop sound (CLI: --sound).")
    if r.image is not None:
        raise ValueError("Transfer takes a seed video, not an image; pass the image as a 1-frame video.")
    if not isinstance(r.prompt, str) and len(r.prompt) > 1:
        raise ValueError("Transfer takes one prompt for the whole video (as the reference); give one prompt.")
    control_guidance = _given(r.control_guidance, defaults.CONTROL_GUIDANCE)
    if not (isinstance(control_guidance, (int, float)) and not isinstance(control_guidance, bool)
            and 0 <= control_guidance <= defaults.MAX_GUIDANCE):
        raise ValueError(f"control_guidance={control_guidance!r} must be a number from 0 to "
                         f"{defaults.MAX_GUIDANCE:g} (1 = the controls as given).")
    if r.control_guidance_interval is not None:
        pair(r.control_guidance_interval, "control_guidance_interval")
    controls = prepare_controls(r.controls, height, width)
    total = next(iter(controls.values())).shape[2]
    check_control_frames(total)
    if r.num_frames is not None:
        if isinstance(r.num_frames, bool) or not isinstance(r.num_frames, int) or r.num_frames < 1:
            raise ValueError(f"num_frames={r.num_frames!r} must be a positive integer (a cap on the control "
                             "videos' length), or unset.")
        _notice_short_controls(total, r.num_frames)
        total = min(total, r.num_frames)
    return controls, total


def _action_shape(r: Request, recipe: defaults.ClipRecipe | None = None) -> dict:
    if r.num_frames is not None or r.height is not None or r.width is not None:
        raise ValueError("num_frames / height / width do not apply to an action mode: the clip spans chunk_size + 1 "
                         "frames at the input's size (bucketed by resolution_tier).")
    if r.image is not None or r.video is not None:
        raise ValueError("an action mode takes its frames in the action request (ActionRequest.image / video).")
    if r.guidance_interval is not None:
        raise ValueError("guidance_interval does not apply to an action mode (the action models run without "
                         "guidance by default); drop it.")
    fps = _given(r.fps, defaults.ACTION_FPS)
    check_fps(fps)
    check_action_request(r.action)  # what needs no checkpoint; resolve checks it against the checkpoint's config
    return dict(frames=r.action.num_frames, total=r.action.num_frames, height=0, width=0, fps=float(fps))


_MODE_SHAPES = {"clip": _clip_shape, "windows": _windows_shape, "transfer": _windows_shape, "action": _action_shape}


def transfer_window(chunk: int, total: int) -> int:
    """The window of a Transfer video of ``total`` frames: never longer than the video rounded up to one clip
    (4k+1), so a 9-frame control costs one 9-frame window, not a padded 189-frame one."""
    stride = defaults.VAE_TEMPORAL_STRIDE
    return min(chunk, max(defaults.MIN_CONTROL_FRAMES, -(-(total - 1) // stride) * stride + 1))


def _notice_short_controls(control_frames: int, num_frames: int) -> None:
    """The output is as long as the controls: say so when that is shorter than the ``num_frames`` asked for."""
    if control_frames < num_frames:
        _log.warning("Transfer: the control videos have %d frames, fewer than num_frames=%d; the video will have %d "
                     "frames.", control_frames, num_frames, control_frames)


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
        check_prompt(p)
    return prompts

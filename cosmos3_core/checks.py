"""The checks of a request's values, one ``ValueError`` per mistake naming the argument, its value and the fix —
the resolver's (``resolve.py``) building blocks, and nobody else's: the layers below it hold only asserts.

Mirrors the reference's own ``check_inputs`` (diffusers 0.42.1 ``Cosmos3OmniPipeline.check_inputs``, the modular
blocks' ``check_inputs``, ``CosmosActionCondition.__post_init__`` and ``Cosmos3ActionPrepareLatentsStep``, the
Transfer setup step's chunk arguments), with the limits of ``defaults.py``:

* ``check_clip`` — the clip shape the Wan2.2 VAE takes (4k+1 frames, sides multiples of 16) and its fps;
* ``check_sampling`` — the sampling values on their own (seed, steps, guidance, schedule, shift, the guidance
  interval, the batch);
* ``check_prompt`` — a prompt is a non-empty string of valid Unicode;
* ``check_action_request`` — an action request, alone and against the checkpoint's action head;
* ``window_geometry`` — the windows' arguments, and their geometry;
* ``check_options`` — the runtime options can run on this machine (a forced kernel that is missing);
* ``check_card_memory`` — the GPU can hold what a run needs at the least (a card too small: the fix, not an OOM).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from . import defaults
from .kernels.attention import flash4_unavailable_reason
from .kernels.gemv import triton_unavailable_reason
from .request import ActionRequest, WindowGeometry
from .runtime import RuntimeOptions, compile_unavailable_reason
from .sampling.conditioning import clip_frame_size, image_as_clip
from .sampling.prompt import check_text


# ---------------------------------------------------------------------------------------------- clip + sampling
def check_clip(num_frames, height, width, fps) -> None:
    """Clip-shape rules of the Wan2.2 VAE (4×16×16) with one clear message per violation."""
    stride = defaults.VAE_SPATIAL_STRIDE
    if isinstance(num_frames, bool) or not isinstance(num_frames, int) or num_frames < 1 or (num_frames - 1) % 4:
        fixed = defaults.valid_frames(num_frames) if isinstance(num_frames, (int, float)) else 93
        raise ValueError(
            f"num_frames={num_frames!r} must be 1 (an image) or 4k+1 (video: 5, 9, …, 93, 121, 189); try {fixed}."
        )
    if num_frames > defaults.MAX_FRAMES:
        raise ValueError(f"num_frames={num_frames} is above the limit of {defaults.MAX_FRAMES} frames.")
    for name, value in (("height", height), ("width", width)):
        if isinstance(value, bool) or not isinstance(value, int) or value < stride or value % stride:
            fixed = max(stride, int(value) // stride * stride) if isinstance(value, (int, float)) else 480
            raise ValueError(f"{name}={value!r} must be a positive multiple of {stride}; try {fixed}.")
        if value > defaults.MAX_SIZE:
            raise ValueError(f"{name}={value} is above the limit of {defaults.MAX_SIZE} pixels.")
    check_fps(fps)


def check_fps(fps) -> None:
    if not (isinstance(fps, (int, float)) and math.isfinite(fps) and defaults.MIN_FPS <= fps <= defaults.MAX_FPS):
        raise ValueError(f"fps={fps!r} must be a number from {defaults.MIN_FPS:g} to {defaults.MAX_FPS:g} "
                         f"(e.g. {defaults.FPS:g}).")


def _number_in(value, low: float, high: float, *, low_open: bool = False) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            and (low < value if low_open else low <= value) and value <= high)


def check_sampling(*, seed, steps, guidance, schedule, shift, guidance_interval, batch_size) -> None:
    """Every check of the sampling arguments (values, not the clip shape), one message per mistake."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= defaults.MAX_SEED:
        raise ValueError(f"seed={seed!r} must be an integer from 0 to 2**64-1.")
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int)
                              or not 1 <= steps <= defaults.MAX_STEPS):
        raise ValueError(f"steps={steps!r} must be an integer from 1 to {defaults.MAX_STEPS} "
                         f"(the defaults: {defaults.STEPS_VIDEO} for video, {defaults.STEPS_IMAGE} for an image).")
    if guidance is not None and not _number_in(guidance, 0, defaults.MAX_GUIDANCE):
        raise ValueError(f"guidance (cfg)={guidance!r} must be a number from 0 to {defaults.MAX_GUIDANCE:g} "
                         f"(1 = no guidance; the default is {defaults.GUIDANCE:g}).")
    if schedule not in defaults.SCHEDULES:
        raise ValueError(f"schedule={schedule!r} is not one of {list(defaults.SCHEDULES)}.")
    if shift is not None and not _number_in(shift, 0, defaults.MAX_SHIFT, low_open=True):
        raise ValueError(f"shift={shift!r} must be a number above 0 and at most {defaults.MAX_SHIFT:g} "
                         "(or unset: by resolution, 720p 10, 480p 5, 256p 3).")
    if guidance_interval is not None:
        low, high = guidance_interval
        if not all(_number_in(v, -math.inf, math.inf) for v in (low, high)) or not 0 <= low <= high <= 1000:
            raise ValueError(f"guidance_interval={list(guidance_interval)!r} must be LOW HIGH with "
                             "0 <= LOW <= HIGH <= 1000 (timesteps; e.g. 800 1000 drops the negative branch late).")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) \
            or not 1 <= batch_size <= defaults.MAX_BATCH_SIZE:
        raise ValueError(f"batch_size={batch_size!r} must be an integer from 1 to {defaults.MAX_BATCH_SIZE}.")


def pair(value, name: str) -> tuple[float, float]:
    """``value`` as two numbers ``(low, high)``."""
    try:
        low, high = value
    except (TypeError, ValueError):
        raise ValueError(f"{name}={value!r} must be two numbers LOW HIGH.") from None
    return (low, high)


def check_prompt(prompt, name: str = "prompt") -> None:
    """A prompt: a non-empty string of valid Unicode."""
    if not isinstance(prompt, str):
        raise ValueError(f"{name}={prompt!r} must be a string.")
    check_text(prompt, name)
    if not prompt.strip():
        raise ValueError(f"{name} is empty; describe what to generate (a JSON-upsampled caption works best).")


def check_negative_prompt(negative_prompt) -> None:
    """A negative prompt: unset, or a string of valid Unicode (empty is fine: no negative text)."""
    if negative_prompt is None:
        return
    if not isinstance(negative_prompt, str):
        raise ValueError(f"negative_prompt={negative_prompt!r} must be a string (or unset).")
    check_text(negative_prompt, "negative_prompt")


# ---------------------------------------------------------------------------------------------- action
def check_action_request(request: ActionRequest, config=None) -> None:
    """Every check of an action request that needs no checkpoint, then, given the checkpoint's ``config``, those
    against it (``check_action_against``); raises one ``ValueError``."""
    if not isinstance(request, ActionRequest):
        raise ValueError(f"action={request!r} must be an ActionRequest (cosmos3_core.request).")
    if config is not None and not getattr(config, "action_gen", False):
        raise ValueError(NO_ACTION_HEAD)
    _check_action_fields(request)
    _check_action_frames(request)
    _check_raw_actions(request, config)
    if config is not None:
        check_action_against(request, config)


NO_ACTION_HEAD = ("this checkpoint has no action head (transformer config action_gen is false); action modes need a "
                  "Cosmos3 checkpoint trained with action_gen=True (Nano, Super or Edge releases).")


def check_action_against(request: ActionRequest, config) -> None:
    """The checks of a checked action request against the checkpoint's action head."""
    if not getattr(config, "action_gen", False):
        raise ValueError(NO_ACTION_HEAD)
    if request.raw_action_dim > config.action_dim:
        raise ValueError(f"domain_name={request.domain_name!r} has {request.raw_action_dim}-dim actions, above this "
                         f"checkpoint's action_dim={config.action_dim}; it cannot represent them — pick another "
                         "embodiment.")


def _check_action_fields(r: ActionRequest) -> None:
    if r.mode not in defaults.ACTION_MODES:
        raise ValueError(f"action_mode={r.mode!r} is not one of {list(defaults.ACTION_MODES)}.")
    if isinstance(r.chunk_size, bool) or not isinstance(r.chunk_size, int) or r.chunk_size < 1:
        raise ValueError(f"chunk_size={r.chunk_size!r} must be an integer >= 1 (the number of actions; the video "
                         "spans chunk_size + 1 frames), e.g. 16.")
    if r.chunk_size + 1 > defaults.MAX_FRAMES:
        raise ValueError(f"chunk_size={r.chunk_size} spans {r.chunk_size + 1} frames, above the limit of "
                         f"{defaults.MAX_FRAMES}; use a smaller chunk_size.")
    if r.chunk_size % defaults.VAE_TEMPORAL_STRIDE:
        raise ValueError(f"chunk_size={r.chunk_size} spans {r.chunk_size + 1} frames, but a Cosmos3 clip has 4k+1 "
                         "frames (the VAE keeps the first frame, then 4 per latent), so only "
                         f"{defaults.valid_frames(r.chunk_size + 1)} would be generated; use a multiple of 4, e.g. "
                         f"chunk_size={_valid_chunk(r.chunk_size)}.")
    if r.domain_name not in defaults.EMBODIMENT_TO_RAW_ACTION_DIM:
        extra = (" (it has a domain id but no fixed action width, so the reference refuses it too)"
                 if r.domain_name in defaults.EMBODIMENT_TO_DOMAIN_ID else "")
        raise ValueError(f"domain_name={r.domain_name!r} is not a supported embodiment{extra}; use one of "
                         f"{list(defaults.DOMAINS)}.")
    if isinstance(r.resolution_tier, bool) or r.resolution_tier not in defaults.RESOLUTION_BINS:
        raise ValueError(f"resolution_tier={r.resolution_tier!r} is not one of {list(defaults.RESOLUTION_TIERS)}; "
                         "pick the tier closest to the input's native resolution.")
    if r.view_point is not None and r.view_point not in defaults.VIEWPOINT_FRAMING:
        raise ValueError(f"view_point={r.view_point!r} is not one of {list(defaults.VIEW_POINTS)} (or None for no "
                         "framing).")


def _check_action_frames(r: ActionRequest) -> None:
    if r.image is not None and r.video is not None:
        raise ValueError("both image and video were given; pass one (image: policy / forward dynamics start "
                         "frame; video: required for inverse dynamics).")
    if r.image is None and r.video is None:
        need = "a video of chunk_size + 1 frames" if r.mode == "inverse_dynamics" else "a start image (or video)"
        raise ValueError(f"action_mode={r.mode!r} needs {need}; none was given.")
    h, w = clip_frame_size(r.video if r.video is not None else image_as_clip(r.image))
    if h < defaults.VAE_SPATIAL_STRIDE or w < defaults.VAE_SPATIAL_STRIDE:
        raise ValueError(f"the input is {w}x{h} pixels; it must be at least 16x16.")
    if r.mode != "inverse_dynamics":
        return
    if r.video is None:
        raise ValueError("action_mode='inverse_dynamics' needs a video (the frames whose actions are inferred), "
                         "got only an image; pass chunk_size + 1 frames as the video.")
    n = _num_frames(r.video)
    if n != r.chunk_size + 1:
        fix = (f"set chunk_size={n - 1} or trim" if n > 1 and (n - 1) % defaults.VAE_TEMPORAL_STRIDE == 0
               else "trim")
        raise ValueError(f"inverse dynamics reads chunk_size + 1 = {r.chunk_size + 1} frames but the video has "
                         f"{n}; {fix} the video to {r.chunk_size + 1} frames.")


def _check_raw_actions(r: ActionRequest, config=None) -> None:
    if r.mode != "forward_dynamics":
        if r.raw_actions is not None:
            raise ValueError(f"actions were given but action_mode={r.mode!r} generates them (only forward_dynamics "
                             "takes actions); drop the actions or use action_mode='forward_dynamics'.")
        return
    if r.raw_actions is None:
        raise ValueError("action_mode='forward_dynamics' needs actions (raw_actions / --actions FILE) of shape "
                         f"[chunk_size={r.chunk_size}, {r.raw_action_dim}].")
    shape = tuple(np.shape(r.raw_actions))
    if len(shape) != 2:
        raise ValueError(f"actions have shape {shape}; expected [chunk_size, raw_action_dim] = "
                         f"[{r.chunk_size}, {r.raw_action_dim}] (one row per transition).")
    if config is not None and shape[1] > config.action_dim:
        raise ValueError(f"actions are {shape[1]}-dim, above this checkpoint's action_dim={config.action_dim}; "
                         f"domain_name={r.domain_name!r} expects {r.raw_action_dim}-dim rows.")
    if shape[1] != r.raw_action_dim:
        raise ValueError(f"actions are {shape[1]}-dim but domain_name={r.domain_name!r} expects "
                         f"{r.raw_action_dim}-dim rows; pass actions of that embodiment or change domain_name.")
    if shape[0] != r.chunk_size:
        fix = (f"set chunk_size={shape[0]} or pass"
               if shape[0] > 0 and shape[0] % defaults.VAE_TEMPORAL_STRIDE == 0 else "pass")
        raise ValueError(f"{shape[0]} actions were given but chunk_size={r.chunk_size} needs exactly "
                         f"{r.chunk_size} (one per transition between the {r.chunk_size + 1} frames); {fix} "
                         f"{r.chunk_size} actions.")
    values = torch.as_tensor(np.asarray(r.raw_actions, dtype=np.float32))
    if not torch.isfinite(values).all():
        raise ValueError("actions contain NaN or infinite values; pass finite numbers.")


def _valid_chunk(chunk_size: int) -> int:
    """The nearest chunk size whose clip (chunk_size + 1 frames) is 4k+1 frames long."""
    stride = defaults.VAE_TEMPORAL_STRIDE
    return max(stride, min(round(chunk_size / stride) * stride, (defaults.MAX_FRAMES - 1) // stride * stride))


def _num_frames(video) -> int:
    if isinstance(video, (list, tuple)):
        return len(video)
    return int(video.shape[1] if video.ndim == 5 else video.shape[0])


# ---------------------------------------------------------------------------------------------- windows
def window_geometry(total_frames: int, chunk_frames: int, conditional_frames: int) -> WindowGeometry:
    """Check the window arguments (one message per mistake, naming the argument) and resolve the geometry
    (``request.WindowGeometry``)."""
    for name, value, low in (("num_frames", total_frames, 1), ("frames_per_chunk", chunk_frames, 1),
                             ("conditional_frames", conditional_frames, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name}={value!r} must be an integer >= {low}.")
    if (chunk_frames - 1) % defaults.VAE_TEMPORAL_STRIDE:
        raise ValueError(
            f"frames_per_chunk={chunk_frames} must be 4k+1 (a window is one Cosmos3 clip: 5, 9, …, 93, 121, 189); "
            f"try {defaults.valid_frames(chunk_frames)}."
        )
    if total_frames <= chunk_frames:
        return WindowGeometry(total_frames, chunk_frames, conditional_frames, chunk_frames, 1)
    if conditional_frames >= chunk_frames:
        raise ValueError(
            f"conditional_frames={conditional_frames} must be smaller than frames_per_chunk={chunk_frames} "
            "(each window must generate new frames); try conditional_frames=1 or a larger frames_per_chunk."
        )
    stride = chunk_frames - conditional_frames
    num = 1 + math.ceil((total_frames - chunk_frames) / stride)
    return WindowGeometry(total_frames, chunk_frames, conditional_frames, stride, num)


def check_control_frames(frames: int) -> None:
    """Refuse control videos too short to follow: a still image or a 1-frame clip would make a 1-frame video."""
    if frames < defaults.MIN_CONTROL_FRAMES:
        what = "1 frame (a still image?)" if frames == 1 else f"{frames} frames"
        raise ValueError(f"the control videos have {what}; Transfer follows its control videos frame by frame, and "
                         "the output is as long as they are — give control videos of at least "
                         f"{defaults.MIN_CONTROL_FRAMES} frames (e.g. a video through Load Video, or several images "
                         "as a batch).")


# ---------------------------------------------------------------------------------------------- runtime
def check_options(options: RuntimeOptions) -> None:
    """Refuse runtime options that cannot run on this machine (a forced kernel that is missing), before loading."""
    if not isinstance(options, RuntimeOptions):
        raise ValueError(f"options={options!r} must be a RuntimeOptions.")
    if options.attention == "flash4":
        reason = flash4_unavailable_reason()
        if reason:
            raise ValueError(f"attention='flash4': FlashAttention-4 cannot run here ({reason}); use attention 'auto' "
                             "or 'sdpa' (CLI: --attention auto), or install flash-attn-4 on a Hopper (sm90) GPU.")
    if options.compile == "on" and options.compile_backend == "inductor":
        cuda = options.device_type == "cuda" or (options.device_type is None and torch.cuda.is_available())
        reason = compile_unavailable_reason(cuda)
        if reason:
            raise ValueError(f"compile='on': torch.compile cannot run here ({reason}); use compile 'auto' or 'off' "
                             "(CLI: --compile auto), or install it.")
    if options.gemv == "triton":
        reason = triton_unavailable_reason()
        if reason:
            raise ValueError(f"gemv='triton': the Triton GEMV cannot run here ({reason}); use 'auto' or 'torch'.")


# ---------------------------------------------------------------------------------------------- the card
GIB = 2**30
# smaller weights, from the fastest to the smallest (README "Which weights for your card")
SMALLER_WEIGHTS = ("load smaller weights: NVIDIA's FP8 checkpoint (the repository's fp8 revision; W8A8 on sm 8.9+: "
                   "RTX 40/50, L4, L40, H100), weight_dtype fp8_e4m3fn, or a GGUF file in Load Cosmos3 "
                   "Checkpoint's gguf input (Q8_0 for 12 GiB, Q4_0 for 8 GiB cards)")
CARD_FIX = ("lower width, height or num_frames (Cosmos3 Text Encode; CLI: --height/--width/--num-frames): the "
            "step's working memory grows with the latent tokens, ≈3 GiB at 480p/93f and ≈13 GiB at 720p/189f for "
            "Nano; if the weights that stay on the GPU are the large part, " + SMALLER_WEIGHTS)
# the text tower's prefill: its working memory grows with the prompt, not the video
TEXT_CARD_FIX = SMALLER_WEIGHTS + ", or shorten the prompt"


def check_card_memory(needed: dict[str, int], card_bytes: int, card: str = "the GPU", fix: str = CARD_FIX) -> None:
    """Refuse a run whose least GPU memory — ``needed``, by part, with every streamable weight left on the CPU —
    exceeds the card's ``card_bytes``: one message naming the card size, the parts and ``fix``."""
    total = sum(needed.values())
    if total <= card_bytes:
        return
    parts = ", ".join(f"{what} {size / GIB:.1f} GiB" for what, size in needed.items() if size)
    raise ValueError(f"{card} has {card_bytes / GIB:.1f} GiB, but this run needs at least {total / GIB:.1f} GiB on it "
                     f"even with the weights streamed from the CPU ({parts}). To fit, {fix}.")


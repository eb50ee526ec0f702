"""Cosmos3 action (world-model) modes: policy, forward dynamics and inverse dynamics — everything mode-specific.

Mirrors diffusers 0.42.1's modular Cosmos3 pipeline (``modular_pipelines/cosmos/``) and the action helpers of
``pipelines/cosmos/pipeline_cosmos3_omni.py`` it calls:

* ``ActionRequest`` = ``CosmosActionCondition`` (mode, chunk_size, domain_name, resolution_tier, raw_actions,
  image | video, view_point), checked once by ``check_action_request`` (its ``__post_init__`` + the model checks of
  ``Cosmos3ActionPrepareLatentsStep`` / ``check_inputs``), every mistake one ``ValueError`` naming the argument.
* ``encode_action_condition`` = ``Cosmos3ActionVisionVaeEncoderStep`` + the action half of
  ``Cosmos3ActionPrepareLatentsStep``: ``chunk_size + 1`` frames, bucketed to the tier's canvas
  (``_ACTION_RESOLUTION_BINS``: the closest aspect ratio; downscale only, bicubic + antialias; pad right/bottom,
  reflect or replicate), VAE-encoded, the latent **cropped to the content**; which latent frames and which actions
  are clean per mode (forward dynamics: latent 0 + all actions; policy: latent 0; inverse dynamics: every latent);
  raw actions zero-padded to the model's ``action_dim``. Policy and forward dynamics use latent 0 only, so only
  frame 0 is encoded (the Wan VAE is causal in time: latent 0 sees pixel frame 0 alone).
* ``action_prompt_ids`` = ``Cosmos3ActionTextStep`` + ``tokenize_prompt(action_mode=…)``: the prompt becomes the
  structured JSON caption the model was trained on (``_build_action_json_prompt``), no metadata templates, the
  negative prompt is used raw; the caption describes ``chunk_size + 1`` frames at the canvas size.
* The output side (``Cosmos3ActionOutputStep``): the denoised actions without the zero padding (policy and inverse
  dynamics; forward dynamics predicts none).

The denoising itself is not here: the action stream goes into the plan as a ``plan.ActionInput`` and the
mode-free loop runs it; the run functions at the end chain the pipeline's stages. Nothing here imports ComfyUI.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from .. import defaults
from ..sampling.conditioning import preprocess_video
from ..sampling.plan import ActionInput
from ..sampling.prompt import DEFAULT_MAX_TOKENS, SYSTEM_PROMPT_VIDEO, PromptIds, branch_ids
from ..model.text_kv import TextConditioning
from ..runtime import DEFAULT, RuntimeOptions
from .action_files import load_actions, load_actions_with_metadata, save_actions  # noqa: F401

ACTION_MODES = ("policy", "forward_dynamics", "inverse_dynamics")


# ---------------------------------------------------------------------------------------------- reference tables
# diffusers 0.42.1 pipeline_cosmos3_omni.py ``_ACTION_RESOLUTION_BINS``: per tier, aspect ratio (h/w) → canvas (h, w).
RESOLUTION_BINS: dict[int, dict[str, tuple[int, int]]] = {
    256: {"1.0": (256, 256), "0.8": (256, 320), "1.25": (320, 256), "0.6": (192, 320),
          "1.6666666666666667": (320, 192)},
    480: {"1.0": (640, 640), "0.7391304347826086": (544, 736), "1.3529411764705883": (736, 544),
          "0.5769230769230769": (480, 832), "1.7333333333333334": (832, 480)},
    704: {"1.0": (960, 960), "0.7647058823529411": (832, 1088), "1.3076923076923077": (1088, 832),
          "0.55": (704, 1280), "1.8181818181818181": (1280, 704)},
    720: {"1.0": (960, 960), "0.7536231884057971": (832, 1104), "1.3269230769230769": (1104, 832),
          "0.5625": (720, 1280), "1.7777777777777777": (1280, 720)},
}
# ``_ACTION_VIEWPOINT_TEMPLATES``: the trained framing sentences of the caption's ``cinematography.framing``.
VIEWPOINT_FRAMING = {
    "ego_view": "This video is captured from a first-person perspective looking at the scene.",
    "third_person_view": "This video is captured from a third-person perspective looking towards the agent from the front.",
    "wrist_view": "This video is captured from a wrist-mounted camera.",
    "concat_view": "This video contains concatenated views from multiple camera perspectives.",
}
# ``_EMBODIMENT_TO_DOMAIN_ID``: the embodiment's row of the domain-aware action projections.
EMBODIMENT_TO_DOMAIN_ID = {
    "no_action": 0, "av": 1, "camera_pose": 2, "hand_pose": 3, "pusht": 4, "libero": 5, "umi": 6,
    "bridge_orig_lerobot": 7, "droid_lerobot": 8, "robomind-franka": 8, "galbot": 9, "robomind-franka-dual": 12,
    "robomind-ur": 13, "agibotworld": 15, "agibot_gear_gripper": 15, "agibot_gear_gripper_ext": 15, "fractal": 20,
}
# ``_EMBODIMENT_TO_RAW_ACTION_DIM``: the unpadded action width; domains absent here (no_action, libero) have none
# and the reference refuses them for action inference.
EMBODIMENT_TO_RAW_ACTION_DIM = {
    "av": 9, "camera_pose": 9, "pusht": 2, "umi": 10, "bridge_orig_lerobot": 10, "droid_lerobot": 10,
    "robomind-franka": 10, "robomind-franka-dual": 20, "robomind-ur": 10, "galbot": 30, "agibotworld": 29,
    "agibot_gear_gripper": 29, "agibot_gear_gripper_ext": 29, "fractal": 10, "hand_pose": 57,
}
DOMAINS = tuple(sorted(EMBODIMENT_TO_RAW_ACTION_DIM))  # the embodiments action inference supports
RESOLUTION_TIERS = tuple(RESOLUTION_BINS)
VIEW_POINTS = tuple(VIEWPOINT_FRAMING)
_ASPECT_RATIOS = ("1,1", "4,3", "3,4", "16,9", "9,16")  # the caption's aspect_ratio labels, in the reference's order


# ---------------------------------------------------------------------------------------------- request
@dataclass
class ActionRequest:
    """One action-mode run: the fields of diffusers' ``CosmosActionCondition``.

    ``raw_actions`` ``[chunk_size, raw_action_dim]`` drive forward dynamics (required there, ignored nowhere else:
    giving them to another mode is an error). ``image`` (one frame) or ``video`` (``[F, H, W, 3]`` in [0, 1], a
    uint8 array or a list of PIL frames): policy and forward dynamics start from the first frame; inverse dynamics
    reads exactly ``chunk_size + 1`` frames. ``view_point`` ``None`` drops the caption's framing field.
    """

    mode: str
    chunk_size: int
    domain_name: str
    resolution_tier: int = defaults.ACTION_RESOLUTION_TIER
    raw_actions: Any = None
    image: Any = None
    video: Any = None
    view_point: str | None = defaults.ACTION_VIEW_POINT

    @property
    def raw_action_dim(self) -> int:
        return EMBODIMENT_TO_RAW_ACTION_DIM[self.domain_name]

    @property
    def num_frames(self) -> int:
        """Pixel frames the run spans: one more than the action transitions."""
        return self.chunk_size + 1


def _bad(message: str) -> ValueError:
    return ValueError(message)


def check_action_request(request: ActionRequest, config=None) -> None:
    """Every check of an action request (and, with ``config``, against the checkpoint); raises one ``ValueError``."""
    r = request
    if config is not None and not getattr(config, "action_gen", False):
        raise _bad("this checkpoint has no action head (transformer config action_gen is false); action modes "
                        "need a Cosmos3 checkpoint trained with action_gen=True (Nano, Super or Edge releases).")
    if r.mode not in ACTION_MODES:
        raise _bad(f"action_mode={r.mode!r} is not one of {list(ACTION_MODES)}.")
    if isinstance(r.chunk_size, bool) or not isinstance(r.chunk_size, int) or r.chunk_size < 1:
        raise _bad(f"chunk_size={r.chunk_size!r} must be an integer >= 1 (the number of actions; the video "
                        "spans chunk_size + 1 frames), e.g. 16.")
    if r.chunk_size + 1 > defaults.MAX_FRAMES:
        raise _bad(f"chunk_size={r.chunk_size} spans {r.chunk_size + 1} frames, above the limit of "
                        f"{defaults.MAX_FRAMES}; use a smaller chunk_size.")
    if r.chunk_size % defaults.VAE_TEMPORAL_STRIDE:
        raise _bad(f"chunk_size={r.chunk_size} spans {r.chunk_size + 1} frames, but a Cosmos3 clip has 4k+1 frames "
                   f"(the VAE keeps the first frame, then 4 per latent), so only {_clip_frames(r.chunk_size + 1)} "
                   f"would be generated; use a multiple of 4, e.g. chunk_size={_valid_chunk(r.chunk_size)}.")
    if r.domain_name not in EMBODIMENT_TO_RAW_ACTION_DIM:
        extra = (" (it has a domain id but no fixed action width, so the reference refuses it too)"
                 if r.domain_name in EMBODIMENT_TO_DOMAIN_ID else "")
        raise _bad(f"domain_name={r.domain_name!r} is not a supported embodiment{extra}; use one of "
                        f"{list(DOMAINS)}.")
    if isinstance(r.resolution_tier, bool) or r.resolution_tier not in RESOLUTION_BINS:
        raise _bad(f"resolution_tier={r.resolution_tier!r} is not one of {list(RESOLUTION_TIERS)}; pick the "
                        "tier closest to the input's native resolution.")
    if r.view_point is not None and r.view_point not in VIEWPOINT_FRAMING:
        raise _bad(f"view_point={r.view_point!r} is not one of {list(VIEW_POINTS)} (or None for no framing).")
    if r.image is not None and r.video is not None:
        raise _bad("both image and video were given; pass one (image: policy / forward dynamics start "
                        "frame; video: required for inverse dynamics).")
    if r.image is None and r.video is None:
        need = "a video of chunk_size + 1 frames" if r.mode == "inverse_dynamics" else "a start image (or video)"
        raise _bad(f"action_mode={r.mode!r} needs {need}; none was given.")
    if r.mode == "inverse_dynamics":
        if r.video is None:
            raise _bad("action_mode='inverse_dynamics' needs a video (the frames whose actions are inferred), "
                            "got only an image; pass chunk_size + 1 frames as the video.")
        n = _num_frames(r.video)
        if n != r.chunk_size + 1:
            fix = (f"set chunk_size={n - 1} or trim" if n > 1 and (n - 1) % defaults.VAE_TEMPORAL_STRIDE == 0
                   else "trim")
            raise _bad(f"inverse dynamics reads chunk_size + 1 = {r.chunk_size + 1} frames but the video has "
                       f"{n}; {fix} the video to {r.chunk_size + 1} frames.")
    if config is not None and r.raw_action_dim > config.action_dim:
        raise _bad(f"domain_name={r.domain_name!r} has {r.raw_action_dim}-dim actions, above this checkpoint's "
                        f"action_dim={config.action_dim}; it cannot represent them — pick another embodiment.")
    if r.mode == "forward_dynamics":
        if r.raw_actions is None:
            raise _bad("action_mode='forward_dynamics' needs actions (raw_actions / --actions FILE) of shape "
                            f"[chunk_size={r.chunk_size}, {r.raw_action_dim}].")
        shape = tuple(np.shape(r.raw_actions))
        if len(shape) != 2:
            raise _bad(f"actions have shape {shape}; expected [chunk_size, raw_action_dim] = "
                            f"[{r.chunk_size}, {r.raw_action_dim}] (one row per transition).")
        if config is not None and shape[1] > config.action_dim:
            raise _bad(f"actions are {shape[1]}-dim, above this checkpoint's action_dim={config.action_dim}; "
                            f"domain_name={r.domain_name!r} expects {r.raw_action_dim}-dim rows.")
        if shape[1] != r.raw_action_dim:
            raise _bad(f"actions are {shape[1]}-dim but domain_name={r.domain_name!r} expects "
                            f"{r.raw_action_dim}-dim rows; pass actions of that embodiment or change domain_name.")
        if shape[0] != r.chunk_size:
            fix = (f"set chunk_size={shape[0]} or pass" if shape[0] > 0 and shape[0] % defaults.VAE_TEMPORAL_STRIDE == 0
                   else "pass")
            raise _bad(f"{shape[0]} actions were given but chunk_size={r.chunk_size} needs exactly "
                       f"{r.chunk_size} (one per transition between the {r.chunk_size + 1} frames); {fix} "
                       f"{r.chunk_size} actions.")
        values = torch.as_tensor(np.asarray(r.raw_actions, dtype=np.float32))
        if not torch.isfinite(values).all():
            raise _bad("actions contain NaN or infinite values; pass finite numbers.")
    elif r.raw_actions is not None:
        raise _bad(f"actions were given but action_mode={r.mode!r} generates them (only forward_dynamics "
                        "takes actions); drop the actions or use action_mode='forward_dynamics'.")


def _clip_frames(frames: int) -> int:
    """Frames an ``F``-frame clip keeps through the VAE: ``4 · ((F − 1) // 4) + 1``."""
    return (frames - 1) // defaults.VAE_TEMPORAL_STRIDE * defaults.VAE_TEMPORAL_STRIDE + 1


def _valid_chunk(chunk_size: int) -> int:
    """The nearest chunk size whose clip (chunk_size + 1 frames) is 4k+1 frames long."""
    stride = defaults.VAE_TEMPORAL_STRIDE
    return max(stride, min(round(chunk_size / stride) * stride, (defaults.MAX_FRAMES - 1) // stride * stride))


# ---------------------------------------------------------------------------------------------- geometry
def canvas_size(height: int, width: int, tier: int) -> tuple[int, int]:
    """The tier's canvas ``(h, w)`` whose aspect ratio ``h/w`` is closest (``classify_height_width_bin``)."""
    ratios = RESOLUTION_BINS[tier]
    closest = min(ratios, key=lambda ratio: abs(float(ratio) - float(height / width)))
    return ratios[closest]


def content_size(height: int, width: int, canvas: tuple[int, int]) -> tuple[int, int]:
    """Size of the frames inside the canvas: downscaled to fit (never upscaled), rounded half up."""
    scale = min(canvas[1] / width, canvas[0] / height, 1.0)
    return max(1, int(scale * height + 0.5)), max(1, int(scale * width + 0.5))


def fit_to_canvas(frames: torch.Tensor, canvas: tuple[int, int]) -> tuple[torch.Tensor, tuple[int, int]]:
    """``[1, 3, F, H, W]`` in [-1, 1] → the canvas-sized clip (content top-left, padded right/bottom) + content size.

    As ``_prepare_action_video_conditioning``: bicubic antialiased downscale, then ``reflect`` padding (``replicate``
    when the padding is at least as wide as the content, where reflection is undefined).
    """
    _, c, f, h, w = frames.shape
    ch, cw = content_size(h, w, canvas)
    x = frames.permute(0, 2, 1, 3, 4).reshape(f, c, h, w)
    if (ch, cw) != (h, w):
        x = F.interpolate(x, size=(ch, cw), mode="bicubic", align_corners=False, antialias=True)
    pad_right, pad_bottom = canvas[1] - cw, canvas[0] - ch
    if pad_right or pad_bottom:
        mode = "replicate" if pad_right >= cw or pad_bottom >= ch else "reflect"
        x = F.pad(x, (0, pad_right, 0, pad_bottom), mode=mode)
    return x.reshape(1, f, c, canvas[0], canvas[1]).permute(0, 2, 1, 3, 4), (ch, cw)


def _frame_size(clip) -> tuple[int, int]:
    """``(H, W)`` of a clip as ``preprocess_video`` reads it (PIL list, channel-last or ``[F, 3, H, W]`` array)."""
    if isinstance(clip, (list, tuple)):
        return clip[0].size[1], clip[0].size[0]
    channel_last = clip.shape[-1] == 3 or clip.shape[-3] != 3
    return (clip.shape[-3], clip.shape[-2]) if channel_last else (clip.shape[-2], clip.shape[-1])


def _num_frames(video) -> int:
    if isinstance(video, (list, tuple)):
        return len(video)
    return int(video.shape[1] if video.ndim == 5 else video.shape[0])


def _as_clip(image):
    """One image as a one-frame clip in a layout ``preprocess_video`` reads."""
    if isinstance(image, (np.ndarray, torch.Tensor)):
        if image.ndim == 3:
            return image[None]
        if image.ndim == 4 and image.shape[0] == 1:
            return image
        raise ValueError(f"image has shape {tuple(image.shape)}; pass one frame [H, W, 3] (or [1, H, W, 3]).")
    return [image]  # PIL


def source_frames(request: ActionRequest) -> torch.Tensor:
    """The input as ``[1, 3, F, H16, W16]`` in [-1, 1] (``VideoProcessor.preprocess_video``: sides floored to 16)."""
    clip = request.video if request.video is not None else _as_clip(request.image)
    h, w = _frame_size(clip)
    h16, w16 = int(h) // 16 * 16, int(w) // 16 * 16
    if h16 == 0 or w16 == 0:
        raise ValueError(f"the input is {w}x{h} pixels; it must be at least 16x16.")
    return preprocess_video(clip, h16, w16)


# ---------------------------------------------------------------------------------------------- conditioning
@dataclass(frozen=True)
class ActionCondition:
    """Everything an action-mode run is conditioned on, fixed before the text encode and the plan."""

    mode: str
    x0: torch.Tensor  # [1, 48, T, h, w] normalized latents, cropped to the content; only clean frames filled
    clean_frames: tuple[int, ...]  # clean vision latent frames
    action_values: torch.Tensor  # [chunk_size, action_dim] clean actions (raw, zero-padded); zeros where noisy
    clean_actions: tuple[int, ...]  # indexes of the given actions
    domain_id: int
    raw_action_dim: int
    num_frames: int  # chunk_size + 1
    canvas: tuple[int, int]  # (h, w) the caption describes and the VAE encoded
    content: tuple[int, int]  # (h, w) of the frames inside the canvas
    domain_name: str
    view_point: str | None

    @property
    def latent_shape(self) -> tuple[int, ...]:
        return tuple(self.x0.shape)

    @property
    def predicts_actions(self) -> bool:
        return self.mode != "forward_dynamics"

    @property
    def output_size(self) -> tuple[int, int]:
        """``(height, width)`` of the generated frames: the content, floored to whole latents."""
        return int(self.x0.shape[3]) * 16, int(self.x0.shape[4]) * 16

    def plan_input(self) -> ActionInput:
        """The action stream of the plan."""
        return ActionInput(values=self.action_values, clean=self.clean_actions, domain_id=self.domain_id,
                           raw_dim=self.raw_action_dim)

    def to(self, device) -> "ActionCondition":
        return dataclasses.replace(self, x0=self.x0.to(device))


def encode_latent_shape(request: ActionRequest, vae, config) -> tuple[int, ...]:
    """Shape of the latent the VAE encode of ``request`` produces (canvas-sized, before the crop)."""
    check_action_request(request, config)
    frames = source_frames(request)
    canvas = canvas_size(frames.shape[-2], frames.shape[-1], request.resolution_tier)
    t = (request.num_frames - 1) // vae.temporal_scale + 1 if request.mode == "inverse_dynamics" else 1
    return (1, vae.latent_channels, t, canvas[0] // vae.spatial_scale, canvas[1] // vae.spatial_scale)


def encode_action_condition(vae, request: ActionRequest, config) -> ActionCondition:
    """Check ``request``, bucket and VAE-encode its frames, and decide the clean frames and actions of its mode."""
    check_action_request(request, config)
    r = request
    frames = source_frames(r)
    canvas = canvas_size(frames.shape[-2], frames.shape[-1], r.resolution_tier)
    t_lat = (r.num_frames - 1) // vae.temporal_scale + 1
    if r.mode == "inverse_dynamics":
        clean_frames = tuple(range(t_lat))
        frames = frames[:, :, : r.num_frames]
    else:  # policy / forward dynamics: the start frame only (latent 0 sees pixel frame 0 alone)
        clean_frames = (0,)
        frames = frames[:, :, :1]
    clip, content = fit_to_canvas(frames, canvas)
    latents = vae.encode(clip)  # [1, 48, t, canvas/16]
    lh, lw = max(content[0] // vae.spatial_scale, 1), max(content[1] // vae.spatial_scale, 1)
    x0 = torch.zeros(1, latents.shape[1], t_lat, lh, lw, dtype=torch.float32, device=latents.device)
    x0[:, :, : latents.shape[2]] = latents[:, :, :t_lat, :lh, :lw].float()
    values = torch.zeros(r.chunk_size, config.action_dim, dtype=torch.float32)
    clean_actions: tuple[int, ...] = ()
    if r.mode == "forward_dynamics":
        raw = torch.as_tensor(np.asarray(r.raw_actions, dtype=np.float32))
        values[:, : raw.shape[1]] = raw
        clean_actions = tuple(range(r.chunk_size))
    return ActionCondition(
        mode=r.mode, x0=x0, clean_frames=clean_frames, action_values=values, clean_actions=clean_actions,
        domain_id=EMBODIMENT_TO_DOMAIN_ID[r.domain_name], raw_action_dim=r.raw_action_dim, num_frames=r.num_frames,
        canvas=tuple(canvas), content=tuple(content), domain_name=r.domain_name, view_point=r.view_point,
    )


# ---------------------------------------------------------------------------------------------- prompt
def action_caption(description: str, *, view_point: str | None, num_frames: int, fps: float, height: int,
                   width: int) -> str:
    """The structured JSON caption of the action model (``_build_action_json_prompt``), key order included."""
    seconds = num_frames / fps if fps > 0 else 0.0
    duration = int(seconds) if seconds >= 0 and math.isfinite(seconds) else 0
    end = round(seconds) if seconds >= 0 and math.isfinite(seconds) else 0
    minutes, secs = divmod(end, 60)
    desc = description.strip()
    if desc and not desc.endswith((".", "!", "?")):
        desc = f"{desc}."
    caption: dict[str, Any] = {}
    if view_point is not None:
        caption["cinematography"] = {"framing": VIEWPOINT_FRAMING[view_point]}
    ratio = width / height if height > 0 else 1.0
    aspect = min(_ASPECT_RATIOS, key=lambda r: abs(int(r.split(",")[0]) / int(r.split(",")[1]) - ratio))
    caption["actions"] = [{"time": f"0:00-{minutes}:{secs:02d}", "description": desc}]
    caption["duration"] = f"{duration}s"
    caption["fps"] = float(fps)
    caption["resolution"] = {"H": int(height), "W": int(width)}
    caption["aspect_ratio"] = aspect
    return json.dumps(caption)


def action_prompt_ids(tokenizer, condition: ActionCondition, prompt: str, negative_prompt: str | None, *, fps: float,
                      use_system_prompt: bool, max_tokens: int = DEFAULT_MAX_TOKENS) -> PromptIds:
    """Token ids of both branches for an action run: JSON caption (cond), the raw negative prompt (uncond)."""
    if not isinstance(prompt, str):
        raise ValueError(f"prompt must be a str, got {type(prompt).__name__}.")
    if negative_prompt is not None and not isinstance(negative_prompt, str):
        raise ValueError(f"negative_prompt must be a str or None, got {type(negative_prompt).__name__}.")
    if isinstance(fps, bool) or not isinstance(fps, (int, float)) or not math.isfinite(fps) or fps <= 0:
        raise ValueError(f"fps={fps!r} must be a positive number (the action models run at "
                         f"{defaults.ACTION_FPS:g}).")
    system = SYSTEM_PROMPT_VIDEO if use_system_prompt else None
    cond_text = action_caption(prompt, view_point=condition.view_point, num_frames=condition.num_frames, fps=fps,
                               height=condition.canvas[0], width=condition.canvas[1])
    uncond_text = negative_prompt or ""
    return branch_ids(tokenizer, cond_text, uncond_text, system, max_tokens,
                      after="the caption and chat formatting", fix="shorten it")


# ---------------------------------------------------------------------------------------------- output + files
def unpadded_actions(action_latents: torch.Tensor, condition: ActionCondition) -> torch.Tensor | None:
    """Predicted actions ``[..., chunk_size, raw_action_dim]`` (``Cosmos3ActionOutputStep``): the action latent
    without its zero padding; ``None`` for forward dynamics (it predicts none)."""
    if not condition.predicts_actions:
        return None
    return action_latents[..., : condition.raw_action_dim].detach().float().cpu()


# ---------------------------------------------------------------------------------------------- a run
# The stages of an action run over a loaded ``Cosmos3Pipeline`` (``pipe``): what the ComfyUI nodes call one by one
# (Cosmos3 Action Condition: ``encode_shape``, ``encode``, ``tokenize``, ``prefill``; the sampler: ``plan``) and
# ``generate_action`` chains for a resolved request (request.py decides its defaults: 5 fps, 30 steps, guidance 1,
# shift 10, no system prompt, an empty negative prompt).
def encode_shape(pipe, request: ActionRequest) -> tuple[int, ...]:
    """Latent shape the VAE encode of an action request produces (for a memory estimate before encoding)."""
    return encode_latent_shape(request, pipe.vae, pipe.config)


def encode(pipe, request: ActionRequest) -> ActionCondition:
    """Check an action request and encode its frames: clean latents (cropped to the content) and actions."""
    return encode_action_condition(pipe.vae, request, pipe.config)


def tokenize(pipe, condition: ActionCondition, prompt: str, negative_prompt: str | None = None, *,
             fps: float = defaults.ACTION_FPS, use_system_prompt: bool = defaults.ACTION_USE_SYSTEM_PROMPT
             ) -> PromptIds:
    """Token ids of an action run: the prompt as the JSON action caption, the negative prompt raw."""
    return action_prompt_ids(pipe.tokenizer, condition, prompt, negative_prompt, fps=fps,
                             use_system_prompt=use_system_prompt)


def prefill(pipe, ids: PromptIds, condition: ActionCondition, *, fps: float,
            options: RuntimeOptions = DEFAULT) -> TextConditioning:
    """Text K/V of an action run; its clip shape is the generated one (``chunk_size + 1`` frames at the content
    size; the caption itself describes the tier's canvas)."""
    height, width = condition.output_size
    return pipe.prefill_prompts(ids, num_frames=condition.num_frames, height=height, width=width, fps=fps,
                                options=options)


def plan(pipe, text: TextConditioning, condition: ActionCondition, sampling=None, *, device=None,
         options: RuntimeOptions = DEFAULT, **sampling_args):
    """The plan of an action run: the mode's clean latent frames and action stream. ``sampling``: resolved values
    (``request.resolve_sampling(..., mode="action")``), or the sampling arguments to resolve with the action
    defaults."""
    check_text_matches(text, condition)
    if sampling is None:
        sampling = pipe.resolve_sampling(text, "action", **sampling_args)
    return pipe.plan(text, sampling, x0=condition.x0, clean_frames=condition.clean_frames,
                     action=condition.plan_input(), device=device, options=options)


def generate_action(pipe, run, callback=None, decode: bool = True):
    """A whole action-mode run of a resolved request ``run`` (``request.Resolved``): ``output.actions`` holds the
    predicted actions without padding (policy, inverse dynamics) and ``output.action`` the padded action latent."""
    timings: dict[str, float] = {}
    with pipe.timed(timings, "preprocess"):
        condition = encode(pipe, run.action)
        ids = tokenize(pipe, condition, run.prompt, run.negative_prompt, fps=run.fps,
                       use_system_prompt=run.use_system_prompt)
        text = prefill(pipe, ids, condition, fps=run.fps, options=run.options)
        planned = plan(pipe, text, condition, run.sampling, options=run.options)
    out = pipe.run_and_decode(planned, timings, condition.num_frames, run.fps, callback=callback, decode=decode)
    out.actions = unpadded_actions(out.action, condition)
    return out


def check_text_matches(text, condition: ActionCondition) -> None:
    """The text K/V must be the caption rendered for ``condition`` (not a plain Cosmos3 Text Encode)."""
    try:
        caption = json.loads(text.prompt_text)
        ok = caption.get("resolution") == {"H": condition.canvas[0], "W": condition.canvas[1]}
    except (TypeError, ValueError, AttributeError):
        ok = False
    if not ok or text.num_frames != condition.num_frames:
        raise ValueError("the text was not encoded for this action condition (its prompt is not the action caption "
                         "of these frames); use the text output of the same Cosmos3 Action Condition.")

"""Cosmos3 action (world-model) modes: policy, forward dynamics and inverse dynamics — everything mode-specific.

Mirrors diffusers 0.42.1's modular Cosmos3 pipeline (``modular_pipelines/cosmos/``) and the action helpers of
``pipelines/cosmos/pipeline_cosmos3_omni.py`` it calls:

* The request (``request.ActionRequest`` = ``CosmosActionCondition``) and its reference tables
  (``defaults.RESOLUTION_BINS`` …) live below; the resolver checks it once (``checks.check_action_request``: its
  ``__post_init__`` + the model checks of ``Cosmos3ActionPrepareLatentsStep`` / ``check_inputs``).
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
from ..defaults import (  # noqa: F401
    ACTION_ASPECT_RATIOS,
    ACTION_MODES,
    DOMAINS,
    EMBODIMENT_TO_DOMAIN_ID,
    EMBODIMENT_TO_RAW_ACTION_DIM,
    RESOLUTION_BINS,
    RESOLUTION_TIERS,
    VIEW_POINTS,
    VIEWPOINT_FRAMING,
)
from ..model.text_kv import TextConditioning
from ..pipeline import Cosmos3Pipeline, GenerationOutput, timed
from ..request import ActionRequest, Resolved, Sampling
from ..runtime import RuntimeOptions
from ..sampling.conditioning import clip_frame_size, image_as_clip, preprocess_video
from ..sampling.plan import ActionInput, Prepare, no_prepare
from ..sampling.prompt import DEFAULT_MAX_TOKENS, SYSTEM_PROMPT_VIDEO, PromptIds, branch_ids
from .action_files import load_actions, load_actions_with_metadata, save_actions  # noqa: F401


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


def source_frames(request: ActionRequest) -> torch.Tensor:
    """The input as ``[1, 3, F, H16, W16]`` in [-1, 1] (``VideoProcessor.preprocess_video``: sides floored to 16)."""
    clip = request.video if request.video is not None else image_as_clip(request.image)
    h, w = clip_frame_size(clip)
    return preprocess_video(clip, int(h) // 16 * 16, int(w) // 16 * 16)


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

    def describes(self, text: TextConditioning) -> bool:
        """Whether ``text`` is this condition's caption (``prefill`` of its ``action_prompt_ids``), not a plain
        Cosmos3 text encode."""
        try:
            caption = json.loads(text.prompt_text)
            size = caption.get("resolution") == {"H": self.canvas[0], "W": self.canvas[1]}
        except (TypeError, ValueError, AttributeError):
            return False
        return size and text.num_frames == self.num_frames


def encode_latent_shape(request: ActionRequest, vae) -> tuple[int, ...]:
    """Shape of the latent the VAE encode of ``request`` produces (canvas-sized, before the crop), from the input's
    size alone (nothing is decoded or resized)."""
    clip = request.video if request.video is not None else image_as_clip(request.image)
    h, w = clip_frame_size(clip)
    canvas = canvas_size(int(h) // 16 * 16, int(w) // 16 * 16, request.resolution_tier)
    t = defaults.latent_frames(request.num_frames) if request.mode == "inverse_dynamics" else 1
    return (1, vae.latent_channels, t, canvas[0] // vae.spatial_scale, canvas[1] // vae.spatial_scale)


def encode_action_condition(vae, request: ActionRequest, config) -> ActionCondition:
    """Bucket and VAE-encode the frames of a checked ``request`` (``checks.check_action_request``), and decide the
    clean frames and actions of its mode."""
    r = request
    frames = source_frames(r)
    canvas = canvas_size(frames.shape[-2], frames.shape[-1], r.resolution_tier)
    t_lat = defaults.latent_frames(r.num_frames)
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
    aspect = min(ACTION_ASPECT_RATIOS, key=lambda r: abs(int(r.split(",")[0]) / int(r.split(",")[1]) - ratio))
    caption["actions"] = [{"time": f"0:00-{minutes}:{secs:02d}", "description": desc}]
    caption["duration"] = f"{duration}s"
    caption["fps"] = float(fps)
    caption["resolution"] = {"H": int(height), "W": int(width)}
    caption["aspect_ratio"] = aspect
    return json.dumps(caption)


def action_prompt_ids(tokenizer, condition: ActionCondition, prompt: str, negative_prompt: str | None, *, fps: float,
                      use_system_prompt: bool, max_tokens: int = DEFAULT_MAX_TOKENS) -> PromptIds:
    """Token ids of both branches for an action run: JSON caption (cond), the raw negative prompt (uncond)."""
    assert isinstance(prompt, str) and (negative_prompt is None or isinstance(negative_prompt, str)) and fps > 0
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
# (Cosmos3 Action Condition: ``encode_latent_shape``, ``encode_action_condition``, ``action_prompt_ids``,
# ``prefill``; the sampler: ``plan``) and ``generate_action`` chains for a resolved request (resolve.py decides its
# defaults: 5 fps, 30 steps, guidance 1, shift 10, no system prompt, an empty negative prompt).
def prefill(pipe: Cosmos3Pipeline, ids: PromptIds, condition: ActionCondition, *, fps: float,
            options: RuntimeOptions) -> TextConditioning:
    """Text K/V of an action run; its clip shape is the generated one (``chunk_size + 1`` frames at the content
    size; the caption itself describes the tier's canvas)."""
    height, width = condition.output_size
    return pipe.prefill_prompts(ids, num_frames=condition.num_frames, height=height, width=width, fps=fps,
                                options=options)


def plan(pipe: Cosmos3Pipeline, text: TextConditioning, condition: ActionCondition, sampling: Sampling, *,
         device=None, options: RuntimeOptions, prepare: Prepare = no_prepare):
    """The plan of an action run: the mode's clean latent frames and action stream, with ``sampling`` resolved for
    the action mode (``resolve.resolve_sampler(..., action=condition)``); ``prepare``: as ``Cosmos3Pipeline.plan``."""
    return pipe.plan(text, sampling, x0=condition.x0, clean_frames=condition.clean_frames,
                     action=condition.plan_input(), device=device, options=options, prepare=prepare)


def generate_action(pipe: Cosmos3Pipeline, resolved: Resolved, callback=None, decode: bool = True) -> GenerationOutput:
    """A whole action-mode run of a resolved request (mode ``action``): ``output.actions`` holds the predicted
    actions without padding (policy, inverse dynamics) and ``output.action`` the padded action latent."""
    timings: dict[str, float] = {}
    with timed(timings, "preprocess"):
        condition = encode_action_condition(pipe.vae, resolved.action, pipe.config)
        ids = action_prompt_ids(pipe.tokenizer, condition, resolved.prompt, resolved.negative_prompt,
                                fps=resolved.fps, use_system_prompt=resolved.use_system_prompt)
        text = prefill(pipe, ids, condition, fps=resolved.fps, options=resolved.options)
        planned = plan(pipe, text, condition, resolved.sampling, options=resolved.options)
    out = pipe.run_and_decode(planned, timings, condition.num_frames, resolved.fps, callback=callback, decode=decode)
    out.actions = unpadded_actions(out.action, condition)
    return out

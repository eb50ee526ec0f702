"""Cosmos3VAEEncodeCond: IMAGE → clean conditioning latents for image-to-video (one frame) or video-to-video.

Independent of the text encode (no link between them), so the two can run in either order. The target size comes
from this node's width/height, which must equal Cosmos3TextEncode's (the sampler checks it; wire both from the
same primitive to keep one source of truth).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

import comfy.model_management as mm
from comfy_api.latest import io

from ..cosmos3_core import defaults
from .types import CATEGORY, Cosmos3Condition, Cosmos3Model


@dataclass(frozen=True)
class ConditionLatents:
    x0: torch.Tensor  # [1, 48, k, h, w] normalized clean latent frames, on the intermediate device
    clean_frames: tuple[int, ...]
    height: int
    width: int
    mode: str  # "image-to-video" | "video-to-video"


class Cosmos3VAEEncodeCond(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="Cosmos3VAEEncodeCond",
            display_name="Cosmos3 VAE Encode (Condition)",
            category=CATEGORY,
            description="One image: image-to-video (latent frame 0 kept). Several frames: video-to-video (the first "
                        "or last clean_latent_frames·4−3 frames kept).",
            inputs=[
                Cosmos3Model.Input("model", tooltip="The checkpoint from Load Cosmos3 Checkpoint (its VAE encodes)."),
                io.Image.Input("image", tooltip="One frame (image-to-video) or a batch of frames (video-to-video)."),
                io.Int.Input("width", default=1280, min=16, max=4096, step=16,
                             tooltip="Must equal Cosmos3TextEncode's width."),
                io.Int.Input("height", default=720, min=16, max=4096, step=16,
                             tooltip="Must equal Cosmos3TextEncode's height."),
                io.Combo.Input("keep", options=["first", "last"], default="first",
                               tooltip="Video-to-video: condition on the start or the end of the input clip."),
                io.Int.Input("clean_latent_frames", default=2, min=1, max=64,
                             tooltip="Video-to-video: latent frames kept clean (2 = 5 pixel frames)."),
            ],
            outputs=[Cosmos3Condition.Output(display_name="condition", tooltip="Clean latent frames for the "
                                                                 "sampler's condition input.")],
        )

    @classmethod
    def execute(cls, model, image: torch.Tensor, width: int, height: int, keep: str = "first",
                clean_latent_frames: int = 2) -> io.NodeOutput:
        if not isinstance(image, torch.Tensor) or image.ndim != 4 or image.shape[-1] not in (3, 4):
            shape = tuple(image.shape) if isinstance(image, torch.Tensor) else type(image).__name__
            raise ValueError(
                f"Cosmos3VAEEncodeCond: image has shape {shape}; expected a ComfyUI IMAGE [frames, H, W, 3]."
            )
        stride = defaults.VAE_SPATIAL_STRIDE
        if width % stride or height % stride:
            raise ValueError(f"Cosmos3VAEEncodeCond: {width}x{height} is not a multiple of {stride}; use e.g. "
                             f"{width // stride * stride}x{height // stride * stride} (and the same on "
                             "Cosmos3TextEncode).")
        frames = image[..., :3]
        is_video = frames.shape[0] > 1
        pipe = model.pipeline
        model.load_vae(pipe.condition_latent_shape(is_video, clean_latent_frames, height, width))
        try:
            x0, clean = pipe.vae_encode_condition(
                image=None if is_video else frames[0], video=frames if is_video else None,
                height=height, width=width, condition_latent_frames=clean_latent_frames, keep=keep,
            )
        except ValueError as exc:
            raise ValueError(f"Cosmos3VAEEncodeCond: {exc}") from exc
        cond = ConditionLatents(x0.to(mm.intermediate_device()), tuple(clean), height, width,
                                "video-to-video" if is_video else "image-to-video")
        return io.NodeOutput(cond)

"""The sampler's ``COSMOS3_CONDITION``: clean conditioning latent frames.

* Cosmos3VAEEncodeCond: IMAGE → image-to-video (one frame) or video-to-video latents.
* Cosmos3FirstLastFrame: a start image, an optional end image and optional keyframes in between → their latent
  frames clean (``conditioning.encode_keyframes``, diffusers' ``condition_frame_indexes_vision``).

Independent of the text encode (no link between them), so they can run in either order. The target size comes
from the node's width/height (and, for keyframes, num_frames), which must equal Cosmos3TextEncode's (the sampler
checks it; wire both from the same primitive to keep one source of truth).
"""

from __future__ import annotations

import re

import comfy.model_management as mm
import torch
from comfy_api.latest import io

from ..cosmos3_core import defaults
from ..cosmos3_core.request import ConditionLatents
from ..cosmos3_core.sampling.conditioning import encode_keyframes, keyframe_indexes
from .errors import node_errors
from .types import CATEGORY, Cosmos3Condition, Cosmos3Model, frames_input, size_inputs


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
                *size_inputs("Must equal Cosmos3TextEncode's width."),
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
        with node_errors("Cosmos3VAEEncodeCond"):
            frames = _check_image_batch(image, "image", items="frames")
            stride = defaults.VAE_SPATIAL_STRIDE
            if width % stride or height % stride:
                raise ValueError(f"{width}x{height} is not a multiple of {stride}; use e.g. "
                                 f"{width // stride * stride}x{height // stride * stride} (and the same on "
                                 "Cosmos3TextEncode).")
            is_video = frames.shape[0] > 1
            pipe = model.pipeline
            model.load_vae(pipe.condition_latent_shape(is_video, clean_latent_frames, height, width))
            x0, clean = pipe.vae_encode_condition(
                image=None if is_video else frames[0], video=frames if is_video else None,
                height=height, width=width, condition_latent_frames=clean_latent_frames, keep=keep,
            )
        cond = ConditionLatents(x0.to(mm.intermediate_device()), tuple(clean), height, width,
                                "video-to-video" if is_video else "image-to-video")
        return io.NodeOutput(cond)


class Cosmos3FirstLastFrame(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="Cosmos3FirstLastFrame",
            display_name="Cosmos3 First/Last Frame (Keyframes)",
            category=CATEGORY,
            description="First + last frame to video (FLF2V) and keyframes: the start image, the end image and any "
                        "keyframes are kept at their latent frames and the sampler fills the frames between.",
            inputs=[
                Cosmos3Model.Input("model", tooltip="The checkpoint from Load Cosmos3 Checkpoint (its VAE encodes)."),
                io.Image.Input("start_image", tooltip="The first frame of the video (one image)."),
                *size_inputs("Must equal Cosmos3TextEncode's width (images are resized and center-cropped to it, as "
                             "for image-to-video).", "Must equal Cosmos3TextEncode's height."),
                frames_input("Must equal Cosmos3TextEncode's num_frames (4k+1, at least 5): the end image is the "
                             "clip's last frame.", minimum=5),
                io.Image.Input("end_image", optional=True, tooltip="The last frame of the video (one image)."),
                io.Image.Input("keyframes", optional=True,
                               tooltip="Images to keep between the start and the end, in time order (a batch: one "
                                       "keyframe per image)."),
                io.String.Input("frame_indexes", default="", optional=True,
                                tooltip="Latent frame indexes of the images in order start, keyframes…, end, as "
                                        "diffusers' condition_frame_indexes_vision counts them: latent 0 is pixel "
                                        "frame 0, latent k pixel frames 4k−3…4k, the last latent is "
                                        "(num_frames−1)/4 (47 for 189 frames). E.g. '0, 47'. Empty: spread "
                                        "evenly from the first to the last latent frame."),
            ],
            outputs=[Cosmos3Condition.Output(display_name="condition",
                                             tooltip="The keyframes' clean latent frames for the sampler's condition "
                                                     "input (with a Text Encode of the same size and num_frames).")],
        )

    @classmethod
    def execute(cls, model, start_image: torch.Tensor, width: int, height: int, num_frames: int,
                end_image: torch.Tensor | None = None, keyframes: torch.Tensor | None = None,
                frame_indexes: str = "") -> io.NodeOutput:
        with node_errors("Cosmos3FirstLastFrame"):
            images = [_one_image(start_image, "start_image")]
            if keyframes is not None:
                _check_image_batch(keyframes, "keyframes")
                images += [keyframes[i:i + 1, ..., :3] for i in range(keyframes.shape[0])]
            if end_image is not None:
                images.append(_one_image(end_image, "end_image"))
            stride = defaults.VAE_SPATIAL_STRIDE
            if width % stride or height % stride:
                raise ValueError(f"width x height = {width}x{height} is not a multiple of {stride}; use e.g. "
                                 f"{width // stride * stride}x{height // stride * stride} (and the same on "
                                 "Cosmos3TextEncode).")
            indexes = keyframe_indexes(len(images), num_frames, _parse_indexes(frame_indexes))
            pipe = model.pipeline
            clip_frames = defaults.pixel_frames(indexes[-1] + 1)
            clip_bytes = 3 * clip_frames * height * width * (4 + pipe.vae.dtype.itemsize)  # the clip, fp32 + VAE dtype
            model.load_vae(pipe.vae.latent_shape(clip_frames, height, width), extra_memory=clip_bytes)
            x0, clean = encode_keyframes(pipe.vae, images, indexes, num_frames=num_frames, height=height, width=width)
        return io.NodeOutput(ConditionLatents(x0.to(mm.intermediate_device()), tuple(clean), height, width,
                                              "keyframes", num_frames=num_frames))


def _check_image_batch(image, name: str, items: str = "images") -> torch.Tensor:
    """The RGB channels of a ComfyUI IMAGE batch [images, H, W, 3 or 4]; anything else is refused by name."""
    if not isinstance(image, torch.Tensor) or image.ndim != 4 or image.shape[-1] not in (3, 4) or not image.shape[0]:
        shape = tuple(image.shape) if isinstance(image, torch.Tensor) else type(image).__name__
        raise ValueError(f"{name} has shape {shape}; expected a ComfyUI IMAGE [{items}, H, W, 3].")
    return image[..., :3]


def _one_image(image, name: str) -> torch.Tensor:
    _check_image_batch(image, name)
    if image.shape[0] != 1:
        raise ValueError(f"{name} is a batch of {image.shape[0]} images; connect one image (e.g. through "
                         "Image From Batch), or several in-between images to keyframes.")
    return image[..., :3]


def _parse_indexes(text: str) -> list[int] | None:
    """``"0, 24, 47"`` (commas and/or spaces, optional brackets) → ints; blank → None."""
    body = (text or "").strip().strip("[]()").replace(",", " ").split()
    if not body:
        return None
    try:
        if not all(re.fullmatch(r"[+-]?\d+", v) for v in body):  # int() would read "1_0" as 10
            raise ValueError
        return [int(v) for v in body]
    except ValueError:
        raise ValueError(f"frame_indexes {text!r} is not a list of latent frame indexes such as '0, 47' "
                         "(whole numbers separated by commas); leave it empty to spread the images evenly.") from None

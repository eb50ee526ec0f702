"""Pixel-space conditioning for Cosmos3 image-to-video (I2V) and video-to-video (V2V).

Mirrors diffusers 0.42.1 ``Cosmos3OmniPipeline`` (pipelines/cosmos/pipeline_cosmos3_omni.py):

* ``preprocess_image`` = ``_preprocess_conditioning_image``: aspect-preserving resize with
  ``scale = max(W/w, H/h)`` to ``ceil(scale*h) x ceil(scale*w)`` (bilinear, antialias, on 0-255 floats), center crop
  at ``round((R - H) / 2)``, ``round().clamp(0, 255) / 127.5 - 1``. Float input is taken as [0,1] (x255), or as
  [-1,1] when it has negatives, or as 0-255 otherwise; integer input as 0-255.
* ``preprocess_video`` = ``VideoProcessor(vae_scale_factor=16, resample="bilinear").preprocess_video`` (plain
  resize, no aspect handling). For float frames ``[F,H,W,3]`` in [0,1] (the ComfyUI IMAGE layout; diffusers reads a
  numpy array in this layout) that is a *nearest* ``F.interpolate`` to (H, W) -- the ``resample`` option only
  applies to PIL input -- then ``2x - 1`` (skipped, as in diffusers, when the clip already has negative values).
  A list of PIL frames takes diffusers' PIL path (PIL bilinear resize, /255, ``2x - 1``).
* ``encode_condition`` = the clean latent frames of ``prepare_latents``, computed without the waste: the Wan VAE is
  causal in time (latent 0 sees pixel frame 0 only, latent k pixel frames <= 4k), so
  - I2V encodes the single image frame instead of the image repeated ``num_frames`` times; latent 0 is clean.
  - V2V encodes only the ``max(idx)*4+1`` kept frames (first or last of the clip, repeat-padded with the last one
    when the clip is shorter) instead of the whole padded clip; the listed latent indexes are clean.
  - ``num_frames == 1`` (text-to-image) with an image: the pipeline encodes it but marks no frame clean, i.e. the
    image is ignored; so is it here (nothing is encoded, a warning is logged).
  Noisy latent frames of ``x0`` are zeros (the sampler replaces them with noise through the mask).
* ``encode_keyframes`` = first + last frame / keyframes (FLF2V): diffusers conditions any latent frames through its
  video-to-video path (``video`` + ``condition_frame_indexes_vision``, *latent* frame indexes; latent 0 is pixel
  frame 0, latent k >= 1 pixel frames 4k-3 .. 4k). Stills become that ``video`` as vLLM-Omni's Cosmos3 FL2V recipe
  builds it in frame mode (``tools/cosmos3_fl2v``: ``[start][filler][end]``, filler = the neighbouring stills, each
  holding half of the gap), generalised to any number of keyframes: each still (``preprocess_image``, as an I2V
  image) fills the pixel frames of its latent; the frames between two keyframes show the earlier still for the
  first half of the gap and the later one for the rest; frames before the first keyframe show the first still. The
  clip ends at the last keyframe (``4·max(idx)+1`` frames: what the pipeline keeps of a video) and is encoded as a
  whole, as the pipeline encodes it; the listed latent frames are clean.
"""

from __future__ import annotations

import logging
import math
from typing import Iterable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from .. import defaults

logger = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------- image (I2V)
def _image_to_nchw(image) -> torch.Tensor:
    """PIL / numpy HWC or NHWC / torch HWC, NHWC (ComfyUI), CHW or NCHW -> [1,3,H,W] tensor, dtype kept."""
    try:
        from PIL import Image
    except ImportError:  # pragma: no cover - PIL ships with diffusers
        Image = None
    if Image is not None and isinstance(image, Image.Image):
        image = np.array(image.convert("RGB"), copy=True)
    if isinstance(image, np.ndarray):
        image = torch.from_numpy(np.ascontiguousarray(image))
        channel_last = True
    elif isinstance(image, torch.Tensor):
        channel_last = image.ndim >= 3 and (image.shape[-1] in (1, 3, 4) or image.shape[-3] not in (1, 3, 4))
    else:
        raise ValueError(f"image: expected a PIL image, numpy array or torch tensor, got {type(image).__name__}.")
    if image.ndim == 3:
        image = image.unsqueeze(0)
    if image.ndim != 4 or image.shape[0] != 1:
        raise ValueError(
            f"image: expected one image [H,W,3] or [1,H,W,3] (ComfyUI IMAGE) or [3,H,W]/[1,3,H,W], got shape "
            f"{tuple(image.shape)}; pass a single image, e.g. image[0:1]."
        )
    if channel_last:
        image = image.permute(0, 3, 1, 2)
    if image.shape[1] != 3:
        raise ValueError(
            f"image: expected 3 (RGB) channels, got {image.shape[1]} (shape {tuple(image.shape)}); convert to RGB "
            "first (drop an alpha channel with image[..., :3], repeat a grayscale one 3 times)."
        )
    return image


def preprocess_image(image, height: int, width: int) -> torch.Tensor:
    """One conditioning image -> ``[1,3,height,width]`` float32 in [-1,1] (``_preprocess_conditioning_image``)."""
    _check_size(height, width)
    image = _image_to_nchw(image)
    is_integer = not image.is_floating_point()
    image = image.to(torch.float32)
    if not is_integer:
        if image.min() < 0:
            image = (image + 1.0) * 127.5
        elif image.max() <= 1.0:
            image = image * 255.0
    src_h, src_w = image.shape[-2:]
    scale = max(width / src_w, height / src_h)
    new_h, new_w = math.ceil(scale * src_h), math.ceil(scale * src_w)
    image = F.interpolate(image, size=(new_h, new_w), mode="bilinear", align_corners=False, antialias=True)
    top, left = round((new_h - height) / 2), round((new_w - width) / 2)
    image = image[:, :, top:top + height, left:left + width]
    return image.round().clamp(0, 255) / 127.5 - 1.0


# ---------------------------------------------------------------------------------------------- video (V2V)
def preprocess_video(frames, height: int, width: int) -> torch.Tensor:
    """Conditioning clip -> ``[1,3,F,height,width]`` float32 in [-1,1], as diffusers ``VideoProcessor``.

    Accepted layouts:
      * float torch tensor or numpy array ``[F,H,W,3]`` / ``[1,F,H,W,3]`` in [0,1] (ComfyUI IMAGE batch);
        uint8 arrays are divided by 255 first (diffusers would overflow on them);
      * torch tensor ``[F,3,H,W]`` (diffusers' channel-first tensor layout), same value rules;
      * a list of PIL images (diffusers' PIL path: bilinear PIL resize).
    Like diffusers, height/width are floored to multiples of 16.
    """
    _check_size(height, width)
    height, width = height - height % 16, width - width % 16  # VideoProcessor floors to its vae_scale_factor
    if height == 0 or width == 0:
        raise ValueError(f"video: height and width must be at least 16, got {height}x{width} after flooring to 16.")
    if isinstance(frames, (list, tuple)):
        return _preprocess_pil_frames(frames, height, width)
    if isinstance(frames, np.ndarray):
        frames = torch.from_numpy(np.ascontiguousarray(frames))
        channel_last = True
    elif isinstance(frames, torch.Tensor):
        channel_last = frames.shape[-1] == 3 or frames.ndim < 4 or frames.shape[-3] != 3
    else:
        raise ValueError(f"video: expected a tensor, numpy array or list of PIL images, got {type(frames).__name__}.")
    if frames.ndim == 5 and frames.shape[0] == 1:
        frames = frames[0]
    if frames.ndim != 4:
        raise ValueError(f"video: expected frames [F,H,W,3] (ComfyUI IMAGE batch), got shape {tuple(frames.shape)}.")
    if channel_last:
        frames = frames.permute(0, 3, 1, 2)  # [F,3,H,W]
    if frames.shape[0] == 0:
        raise ValueError("video: the clip has 0 frames; pass at least one frame (e.g. a loaded video's IMAGE batch).")
    if frames.shape[1] != 3:
        raise ValueError(
            f"video: expected 3 (RGB) channels, got {frames.shape[1]} (shape {tuple(frames.shape)}); "
            "drop an alpha channel with video[..., :3]."
        )
    x = frames.float() / 255.0 if frames.dtype == torch.uint8 else frames.to(torch.float32)
    x = F.interpolate(x, size=(height, width))  # diffusers' tensor resize: default mode = nearest
    if x.min() >= 0:  # diffusers skips normalization (with a deprecation warning) for [-1,1] input
        x = 2.0 * x - 1.0
    return x.permute(1, 0, 2, 3).unsqueeze(0)  # [1,3,F,H,W]


def _preprocess_pil_frames(frames: Sequence, height: int, width: int) -> torch.Tensor:
    from PIL import Image

    if len(frames) == 0:
        raise ValueError("video: the clip has 0 frames; pass at least one frame.")
    if not all(isinstance(f, Image.Image) for f in frames):
        raise ValueError("video: a list must hold PIL images only; pass tensors as one [F,H,W,3] batch instead.")
    arr = np.stack([
        np.asarray(f.convert("RGB").resize((width, height), resample=Image.BILINEAR), dtype=np.float32) / 255.0
        for f in frames
    ])  # [F,H,W,3]
    x = torch.from_numpy(arr).permute(3, 0, 1, 2).unsqueeze(0)  # [1,3,F,H,W]
    return 2.0 * x - 1.0


# ---------------------------------------------------------------------------------------------- encode
def encode_condition(
    vae,
    *,
    image=None,
    video=None,
    num_frames: int,
    height: int,
    width: int,
    condition_latent_frames: Iterable[int] = (0, 1),
    keep: str = "first",
) -> tuple[torch.Tensor, list[int]]:
    """Clean conditioning latents for I2V / V2V -> ``(x0 [1,C,T,h,w] float32, clean_frame_indexes)``.

    ``vae`` is a ``cosmos3_core.vae.video.Cosmos3VAE``; x0 is normalized and lives on the VAE device. Only the clean
    frames are filled (others are zero). Without image and video (text-to-video) x0 is all zeros and clean = [].
    ``condition_latent_frames`` and ``keep`` ("first"/"last" end of a longer clip) only apply to ``video``.
    """
    if image is not None and video is not None:
        raise ValueError("encode_condition: pass either image (image-to-video) or video (video-to-video), not both.")
    if not isinstance(num_frames, int) or num_frames < 1:
        raise ValueError(f"encode_condition: num_frames must be an int >= 1, got {num_frames!r}.")
    s, ts = vae.spatial_scale, vae.temporal_scale
    if height % s or width % s:
        raise ValueError(
            f"encode_condition: height and width must be multiples of {s}, got {height}x{width}; "
            f"round them, e.g. to {height // s * s}x{width // s * s}."
        )
    t_lat = defaults.latent_frames(num_frames)
    x0 = torch.zeros(1, vae.latent_channels, t_lat, height // s, width // s, dtype=torch.float32, device=vae.device)

    if image is not None:
        if num_frames == 1:
            logger.warning("encode_condition: num_frames == 1 is text-to-image; the conditioning image is ignored "
                           "(as in diffusers' Cosmos3OmniPipeline).")
            return x0, []
        pixels = preprocess_image(image, height, width).unsqueeze(2)  # [1,3,1,H,W]
        x0[:, :, 0] = vae.encode(pixels)[:, :, 0]
        return x0, [0]

    if video is None:
        return x0, []

    if num_frames == 1:
        raise ValueError("encode_condition: video conditioning needs num_frames > 1 (got 1); use an image instead.")
    indexes = _check_indexes(condition_latent_frames, t_lat, num_frames)
    if keep not in ("first", "last"):
        raise ValueError(f"encode_condition: keep must be 'first' or 'last', got {keep!r}.")
    clip = preprocess_video(video, height, width)  # [1,3,Fv,H,W]
    n_keep = max(indexes) * ts + 1  # pixel frames that latent max(idx) depends on
    clip = clip[:, :, :n_keep] if keep == "first" else clip[:, :, -n_keep:]
    if clip.shape[2] < n_keep:  # short clip: repeat the last frame
        pad = clip[:, :, -1:].expand(-1, -1, n_keep - clip.shape[2], -1, -1)
        clip = torch.cat([clip, pad], dim=2)
    lat = vae.encode(clip)  # [1,C,max(idx)+1,h,w]
    for i in indexes:
        x0[:, :, i] = lat[:, :, i]
    return x0, indexes


def _check_indexes(indexes: Iterable[int], t_lat: int, num_frames: int) -> list[int]:
    if isinstance(indexes, (str, bytes)):
        raise ValueError(f"condition_latent_frames: expected a list of ints such as [0, 1], got {indexes!r}.")
    indexes = list(indexes)
    if not indexes:
        raise ValueError("condition_latent_frames: empty; list at least one latent frame index, e.g. [0, 1].")
    for i in indexes:
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or i < 0:
            raise ValueError(f"condition_latent_frames: {indexes!r} must hold non-negative ints, e.g. [0, 1].")
        if i >= t_lat:
            raise ValueError(
                f"condition_latent_frames: index {i} is outside the latent timeline (T={t_lat} latent frames for "
                f"num_frames={num_frames}); use indexes < {t_lat} or more frames."
            )
    return sorted({int(i) for i in indexes})


def _check_size(height: int, width: int) -> None:
    if not (isinstance(height, int) and isinstance(width, int) and height > 0 and width > 0):
        raise ValueError(f"height/width must be positive ints, got height={height!r}, width={width!r}.")


# ---------------------------------------------------------------------------------------------- keyframes (FLF2V)
def keyframe_indexes(count: int, num_frames: int, frame_indexes: Sequence[int] | None = None) -> list[int]:
    """Latent frame index of each of ``count`` keyframe images, in their order (start, …, end).

    ``frame_indexes`` None: spread evenly from the first latent frame to the last one (``round(i·(T−1)/(n−1))``: a
    start image alone is latent 0; start + end are ``[0, T−1]``, e.g. ``[0, 47]`` for 189 frames). Given indexes are
    latent frame indexes (diffusers' ``condition_frame_indexes_vision``), one per image, strictly increasing.
    """
    if isinstance(num_frames, bool) or not isinstance(num_frames, int) or num_frames < 5 or (num_frames - 1) % 4:
        raise ValueError(f"num_frames={num_frames!r} must be 4k+1 and at least 5 (a video: 5, 9, …, 189); "
                         "keyframes condition a video, not an image.")
    t_lat = defaults.latent_frames(num_frames)
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"at least one keyframe image is needed (the start image), got {count!r}.")
    if frame_indexes is None:
        if count > t_lat:
            raise ValueError(f"{count} keyframe images but a {num_frames}-frame clip has only {t_lat} latent "
                             f"frames; use fewer images or more frames.")
        indexes = [0] if count == 1 else [round(i * (t_lat - 1) / (count - 1)) for i in range(count)]
    else:
        if isinstance(frame_indexes, (str, bytes)):
            raise ValueError(f"frame indexes must be a list of ints such as [0, {t_lat - 1}], got "
                             f"{frame_indexes!r}.")
        indexes = list(frame_indexes)
        if len(indexes) != count:
            raise ValueError(f"{len(indexes)} frame indexes {indexes} for {count} keyframe images; give one "
                             "latent frame index per image, in the images' order (start, keyframes…, end).")
        for i in indexes:
            if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or i < 0:
                raise ValueError(f"frame indexes {indexes} must be non-negative ints (latent frame indexes, "
                                 f"e.g. [0, {t_lat - 1}]).")
            if i >= t_lat:
                raise ValueError(
                    f"frame index {i} is outside the latent timeline ({t_lat} latent frames for "
                    f"num_frames={num_frames}, indexes 0 … {t_lat - 1}); frame indexes count latent frames "
                    f"(pixel frame p is latent ceil(p/4)), not pixel frames."
                )
        indexes = [int(i) for i in indexes]
        if any(b <= a for a, b in zip(indexes, indexes[1:])):
            raise ValueError(f"frame indexes {indexes} must be strictly increasing, in the images' order "
                             "(start, keyframes…, end), each image at its own latent frame.")
    if len(indexes) >= t_lat:
        raise ValueError(
            f"the keyframes {indexes} fill all {t_lat} latent frames of a {num_frames}-frame clip; nothing "
            "would be generated. Use fewer keyframes or more frames."
        )
    return indexes


def keyframe_clip(stills: Sequence[torch.Tensor], indexes: Sequence[int], temporal_scale: int = 4) -> torch.Tensor:
    """Preprocessed stills ``[1,3,H,W]`` at strictly increasing latent ``indexes`` → the conditioning clip
    ``[1,3,ts·max(idx)+1,H,W]`` (the layout in the module docstring)."""
    ts = temporal_scale
    first = [0 if k == 0 else ts * k - ts + 1 for k in indexes]  # pixel frames of latent k: first .. ts·k
    owner = [0] * first[0]
    for i, k in enumerate(indexes):
        owner += [i] * (ts * k + 1 - first[i])
        if i + 1 < len(indexes):
            gap = first[i + 1] - (ts * k + 1)
            owner += [i] * (gap // 2) + [i + 1] * (gap - gap // 2)
    stack = torch.stack([s[0] for s in stills], dim=1)  # [3, n, H, W]
    return stack.index_select(1, torch.tensor(owner, dtype=torch.long)).unsqueeze(0)


def encode_keyframes(vae, images: Sequence, frame_indexes: Sequence[int] | None = None, *, num_frames: int,
                     height: int, width: int) -> tuple[torch.Tensor, list[int]]:
    """First + last frame / keyframe conditioning → ``(x0 [1,C,T,h,w] float32, clean latent frame indexes)``.

    ``images``: the keyframe images in time order (start, …, end), each as ``preprocess_image`` takes it (a ComfyUI
    IMAGE ``[1,H,W,3]``, PIL, numpy, tensor); ``frame_indexes``: their latent frame indexes (``keyframe_indexes``;
    None: spread evenly from the first to the last latent frame). ``x0`` spans the whole clip (``T`` latent frames)
    and lives on the VAE device; frames not listed are zero. Equals diffusers' ``Cosmos3OmniPipeline`` given the
    clip ``keyframe_clip`` builds as ``video`` and the indexes as ``condition_frame_indexes_vision``.
    """
    images = list(images)
    indexes = keyframe_indexes(len(images), num_frames, frame_indexes)
    s, ts = vae.spatial_scale, vae.temporal_scale
    if height % s or width % s:
        raise ValueError(f"height and width must be multiples of {s}, got {height}x{width}; round them, e.g. "
                         f"to {height // s * s}x{width // s * s}.")
    stills = [preprocess_image(image, height, width) for image in images]
    lat = vae.encode(keyframe_clip(stills, indexes, ts))  # [1, C, max(idx)+1, h, w]
    x0 = torch.zeros(vae.latent_shape(num_frames, height, width), dtype=torch.float32, device=lat.device)
    x0[:, :, indexes] = lat[:, :, indexes]
    return x0, indexes


def clip_frame_size(clip) -> tuple[int, int]:
    """``(H, W)`` of a clip as ``preprocess_video`` reads it (PIL list, channel-last or ``[F, 3, H, W]`` array)."""
    if isinstance(clip, (list, tuple)):
        return clip[0].size[1], clip[0].size[0]
    channel_last = clip.shape[-1] == 3 or clip.shape[-3] != 3
    return (clip.shape[-3], clip.shape[-2]) if channel_last else (clip.shape[-2], clip.shape[-1])


def image_as_clip(image):
    """One image as a one-frame clip in a layout ``preprocess_video`` reads."""
    if isinstance(image, (np.ndarray, torch.Tensor)):
        if image.ndim == 3:
            return image[None]
        if image.ndim == 4 and image.shape[0] == 1:
            return image
        raise ValueError(f"image has shape {tuple(image.shape)}; pass one frame [H, W, 3] (or [1, H, W, 3]).")
    return [image]  # PIL

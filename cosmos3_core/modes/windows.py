"""Window geometry and pixel bookkeeping of long (windowed, autoregressive) generation.

Mirrors diffusers 0.42.1 modular Cosmos3 Transfer blocks (``modular_pipelines/cosmos/``):

* the chunk geometry (``request.WindowGeometry``, resolved by ``checks.window_geometry``) is
  ``Cosmos3TransferSetupStep``'s; the last window is generated whole and the stitched clip is cut to
  ``total_frames`` (``Cosmos3TransferStitchStep``).
* ``reflect_pad`` = the setup/chunk-encode steps' time padding: reflect the clip along time, or repeat the last
  frame once it is too short to keep reflecting.
* ``seed_pixels`` = ``Cosmos3TransferChunkVaeEncoderStep``'s target seeding: the first ``n`` frames of a window are
  the previous window's last ``n`` decoded frames (window 0: the first frames of an optional input video), the rest
  repeat the last seeded frame; latent frames ``0 … (n−1)//4`` of its encoding are clean.
* ``keep_range`` = ``Cosmos3TransferDecodeChunkStep``: window 0 keeps all its frames, later windows drop the
  ``conditional_frames`` they share with the previous one.

Pixel clips here are ``[1, 3, F, H, W]`` float in [-1, 1] (what the VAE encodes). Nothing here runs a model.
"""

from __future__ import annotations

import torch

from .. import defaults
from ..request import WindowGeometry


def reflect_pad(frames: torch.Tensor, length: int) -> torch.Tensor:
    """Pad ``[1, 3, F, H, W]`` along time to ``length`` frames: reflect, then repeat the last frame when too short."""
    while frames.shape[2] < length:
        pad = min(frames.shape[2] - 1, length - frames.shape[2])
        if pad <= 0:
            last = frames[:, :, -1:].expand(-1, -1, length - frames.shape[2], -1, -1)
            return torch.cat([frames, last], dim=2)
        frames = torch.cat([frames, frames.flip(dims=[2])[:, :, :pad]], dim=2)
    return frames


def window_slice(clip: torch.Tensor, geometry: WindowGeometry, index: int) -> torch.Tensor:
    """Window ``index``'s part of a full-length clip (a control video), reflect-padded to ``chunk_frames``."""
    start = geometry.start(index)
    end = min(start + geometry.chunk_frames, geometry.total_frames)
    return reflect_pad(clip[:, :, start:end], geometry.chunk_frames)


def seed_pixels(source: torch.Tensor | None, count: int, *, from_end: bool) -> tuple[torch.Tensor | None, int]:
    """The pixels that seed a window: ``count`` frames of ``source`` ``[1, 3, F, H, W]`` (its last frames when
    ``from_end``, the previous window's tail; else its first, an input video). Returns ``(frames, n)`` with
    ``n = min(count, F)`` (``None, 0`` when nothing seeds the window). Only these frames need encoding: the VAE is
    causal in time, so the clean latents ``0 … (n−1)//4`` equal those of the reference's repeat-padded clip."""
    if source is None or count <= 0:
        return None, 0
    n = min(count, source.shape[2])
    frames = source[:, :, -n:] if from_end else source[:, :, :n]
    return frames, n


def clean_latent_frames(num_seed_frames: int) -> list[int]:
    """Latent frames fixed by ``num_seed_frames`` seeded pixel frames: ``0 … (n−1)//4`` (none for ``n = 0``)."""
    if num_seed_frames <= 0:
        return []
    return list(range(defaults.latent_frames(num_seed_frames)))

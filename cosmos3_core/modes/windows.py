"""Window geometry and pixel bookkeeping of long (windowed, autoregressive) generation.

Mirrors diffusers 0.42.1 modular Cosmos3 Transfer blocks (``modular_pipelines/cosmos/``):

* ``WindowGeometry`` = ``Cosmos3TransferSetupStep``'s chunk geometry: ``chunk_frames`` pixel frames per window
  (4k+1), ``stride = chunk_frames − conditional_frames``, ``num_windows = 1 + ceil((total − chunk) / stride)``; the
  last window is generated whole and the stitched clip is cut to ``total_frames`` (``Cosmos3TransferStitchStep``).
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

import math
from dataclasses import dataclass

import torch

from ..defaults import VAE_TEMPORAL_STRIDE


@dataclass(frozen=True)
class WindowGeometry:
    total_frames: int  # pixel frames of the stitched output
    chunk_frames: int  # pixel frames generated per window (4k+1)
    conditional_frames: int  # frames each later window takes from the previous window's tail
    stride: int  # pixel frames between window starts
    num_windows: int

    def start(self, index: int) -> int:
        """First output frame that window ``index`` covers."""
        return index * self.stride

    def keep_range(self, index: int) -> tuple[int, int]:
        """Frames ``[a, b)`` of window ``index``'s decoded clip that go to the output (overlap dropped, end cut)."""
        first = 0 if index == 0 else self.conditional_frames
        end = min(self.chunk_frames, self.total_frames - self.start(index))
        return first, max(first, end)

    def windows_within(self, frames: int) -> int:
        """How many windows lie whole in the first ``frames`` output frames."""
        return sum(1 for k in range(self.num_windows) if self.start(k) + self.keep_range(k)[1] <= frames)

    @property
    def latent_frames(self) -> int:
        return (self.chunk_frames - 1) // VAE_TEMPORAL_STRIDE + 1


def window_geometry(
    total_frames: int, chunk_frames: int, conditional_frames: int, *,
    total_name: str = "num_frames", chunk_name: str = "frames_per_chunk",
    conditional_name: str = "conditional_frames",
) -> WindowGeometry:
    """Check the window arguments (one message per mistake, naming the argument) and resolve the geometry."""
    for name, value, low in ((total_name, total_frames, 1), (chunk_name, chunk_frames, 1),
                             (conditional_name, conditional_frames, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name}={value!r} must be an integer >= {low}.")
    if (chunk_frames - 1) % VAE_TEMPORAL_STRIDE:
        fixed = math.ceil((chunk_frames - 1) / VAE_TEMPORAL_STRIDE) * VAE_TEMPORAL_STRIDE + 1
        raise ValueError(
            f"{chunk_name}={chunk_frames} must be 4k+1 (a window is one Cosmos3 clip: 5, 9, …, 93, 121, 189); "
            f"try {fixed}."
        )
    if total_frames <= chunk_frames:
        return WindowGeometry(total_frames, chunk_frames, conditional_frames, chunk_frames, 1)
    if conditional_frames >= chunk_frames:
        raise ValueError(
            f"{conditional_name}={conditional_frames} must be smaller than {chunk_name}={chunk_frames} "
            f"(each window must generate new frames); try {conditional_name}=1 or a larger {chunk_name}."
        )
    stride = chunk_frames - conditional_frames
    num = 1 + math.ceil((total_frames - chunk_frames) / stride)
    return WindowGeometry(total_frames, chunk_frames, conditional_frames, stride, num)


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
    return list(range((num_seed_frames - 1) // VAE_TEMPORAL_STRIDE + 1))

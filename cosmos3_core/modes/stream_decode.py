"""Streaming decode of long generation: each window is decoded as soon as it is committed and handed on.

Mirrors diffusers 0.42.1 modular ``Cosmos3TransferDecodeChunkStep`` + ``Cosmos3TransferStitchStep``: every window's
latent is decoded on its own (the reference decodes chunk by chunk, so no VAE context crosses a window boundary
and the stitched result is the same), window 0 keeps all its frames, later windows drop the ``conditional_frames``
they share with the previous window, and the stitched clip ends at ``total_frames``. The decoded window's last
frames are kept (and only those) to seed the next window, so host and GPU memory stay flat in the video's length.

Kept frames go to the sinks (``sink(frames [f, H, W, 3] float in [0, 1], audio [2, n] | None)``): the mp4 writer
(``media.VideoWriter.append``), a preview, or ``FrameCollector`` for callers that want the whole clip in memory.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from .windows import WindowGeometry

Sink = Callable[[torch.Tensor, "torch.Tensor | None"], None]


class StreamDecoder:
    def __init__(self, vae, geometry: WindowGeometry, sinks: Sequence[Sink] = (), *, fps: float = 24.0,
                 sample_rate: int = 48_000, **decode_kwargs):
        self.vae = vae
        self.geometry = geometry
        self.sinks = list(sinks)
        self.fps = float(fps)
        self.sample_rate = int(sample_rate)
        self.decode_kwargs = decode_kwargs
        self.tail: torch.Tensor | None = None  # [1, 3, n, H, W] in [-1, 1]: seeds the next window
        self.frames_done = 0

    def commit(self, index: int, latents: torch.Tensor, waveform: torch.Tensor | None = None) -> torch.Tensor:
        """Decode window ``index`` (normalized latents ``[1, C, T, h, w]``), hand its new frames (and the matching
        part of ``waveform`` ``[2, N]``, the window's own sound track) to the sinks; returns the frames handed on."""
        frames = self.vae.decode(latents, **self.decode_kwargs)  # [F, H, W, 3] in [0, 1], on the CPU
        first, end = self.geometry.keep_range(index)
        kept = frames[first:end]
        audio = None
        if waveform is not None:  # the samples of the kept frames' time span
            a, b = (round(i * self.sample_rate / self.fps) for i in (first, end))
            audio = waveform[:, a:b]
        n = self.geometry.conditional_frames
        if index + 1 < self.geometry.num_windows and n:
            tail = frames[-n:].to(torch.float32) * 2.0 - 1.0  # back to the VAE's [-1, 1]
            self.tail = tail.permute(3, 0, 1, 2).unsqueeze(0).contiguous()
        for sink in self.sinks:
            sink(kept, audio)
        self.frames_done += kept.shape[0]
        return kept


class FrameCollector:
    """A sink that keeps every frame (and sound sample) handed to it; ``frames()`` concatenates them."""

    def __init__(self):
        self.parts: list[torch.Tensor] = []
        self.audio: list[torch.Tensor] = []

    def __call__(self, frames: torch.Tensor, audio: torch.Tensor | None) -> None:
        self.parts.append(frames)
        if audio is not None:
            self.audio.append(audio)

    def frames(self) -> torch.Tensor:
        return torch.cat(self.parts)

    def waveform(self) -> torch.Tensor | None:
        return torch.cat(self.audio, dim=1) if self.audio else None


def preview_image(frames: torch.Tensor):
    """The last of ``frames`` ``[f, H, W, 3]`` in [0, 1] as a PIL image (a finished window's preview)."""
    from PIL import Image

    last = frames[-1].float().clamp(0, 1).mul(255).round().to(torch.uint8).cpu().numpy()
    return Image.fromarray(last)

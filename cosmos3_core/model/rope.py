"""Interleaved 3-D mRoPE for Cosmos3: position ids for every token kind, and the cos/sin tables.

Mirrors diffusers 0.42.1 ``pipeline_cosmos3_omni.get_3d_mrope_ids_text_tokens`` /
``get_3d_mrope_ids_vae_tokens`` (position ids) and ``Cosmos3VLTextRotaryEmbedding`` (tables). Positions are
built on the CPU in float32 with the reference's exact operation order, so they are bit-identical to it.

Layout of one guidance branch (as the reference builds it):

* text ``0..L-1`` on all three axes;
* the generation stream starts at ``offset = L + 15000`` (``unified_3d_mrope_temporal_modality_margin``); vision,
  sound and action all start there — they are temporal siblings, not sequential;
* vision: ``t_i = i / (fps/4) · (24/4) + offset`` with fps modulation and more than one latent frame, else
  ``i + offset``; height/width are the patch-grid indices (not offset);
* sound (25 latent fps, compression 1): ``t_j = j / 25 · 24 + offset``, h = w = 0;
* action (compression 1, base compression 4, starting at frame 1): ``t_k = (k+1) / fps · 6 + offset``.

The two guidance branches have different prompt lengths, hence different offsets: each branch gets its own table.
"""

from __future__ import annotations

import functools

import torch

from ..config import Cosmos3Config


def text_position_ids(num_tokens: int, config: Cosmos3Config) -> torch.Tensor:
    """``[3, L]`` positions of a prompt (float32 when fps modulation is on, as the reference)."""
    dtype = torch.float32 if config.enable_fps_modulation else torch.long
    return torch.arange(num_tokens, dtype=dtype).unsqueeze(0).expand(3, -1).contiguous()


def generation_offset(text_length: int, config: Cosmos3Config) -> int:
    """Temporal position where a branch's generation stream starts."""
    return text_length + config.unified_3d_mrope_temporal_modality_margin


def _grid_position_ids(
    grid_t: int,
    grid_h: int,
    grid_w: int,
    offset: int,
    config: Cosmos3Config,
    fps: float | None,
    compression: int,
    base_compression: int | None = None,
    start_frame: int = 0,
) -> torch.Tensor:
    """``[3, grid_t·grid_h·grid_w]`` positions of a (t, h, w) raster of generation tokens."""
    modulated = config.enable_fps_modulation and fps is not None and grid_t > 1
    if modulated:
        tokens_per_second = fps / compression
        base_tokens_per_second = float(config.base_fps) / (base_compression or compression)
        frames = torch.arange(grid_t, dtype=torch.float32)
        t = (frames + start_frame) / tokens_per_second * base_tokens_per_second + offset
    else:
        t = torch.arange(grid_t, dtype=torch.long) + int(offset) + start_frame
    t = t.view(-1, 1).expand(-1, grid_h * grid_w).flatten()
    h = torch.arange(grid_h, dtype=torch.long).view(1, -1, 1).expand(grid_t, -1, grid_w).flatten()
    w = torch.arange(grid_w, dtype=torch.long).view(1, 1, -1).expand(grid_t, grid_h, -1).flatten()
    if not config.unified_3d_mrope_reset_spatial_ids:
        h = h + int(offset)
        w = w + int(offset)
    return torch.stack([t.to(torch.float32), h.to(torch.float32), w.to(torch.float32)])


def vision_position_ids(
    grid: tuple[int, int, int], offset: int, fps: float, config: Cosmos3Config, temporal_compression: int = 4
) -> torch.Tensor:
    """Positions of the patchified video latent ``grid = (T, ph, pw)``."""
    return _grid_position_ids(*grid, offset, config, fps, temporal_compression)


def sound_position_ids(num_tokens: int, offset: int, config: Cosmos3Config) -> torch.Tensor:
    """Positions of the sound latent (25 tokens per second, one token per latent step)."""
    return _grid_position_ids(num_tokens, 1, 1, offset, config, float(config.sound_latent_fps), 1)


def action_position_ids(
    num_tokens: int, offset: int, fps: float, config: Cosmos3Config, temporal_compression: int = 4
) -> torch.Tensor:
    """Positions of the action chunk (one token per video frame transition, starting at frame 1)."""
    return _grid_position_ids(num_tokens, 1, 1, offset, config, fps, 1, temporal_compression, start_frame=1)


def inverse_frequencies(config: Cosmos3Config, device: torch.device | str = "cpu") -> torch.Tensor:
    """fp32 ``1 / θ^(2i/hd)``, built on the CPU and kept per device: a decode step captured as a CUDA graph
    (reasoner.py) must not copy from host memory while it is being captured."""
    return _inverse_frequencies(config.head_dim, float(config.rope_theta), str(torch.device(device)))


@functools.lru_cache(maxsize=None)
def _inverse_frequencies(hd: int, theta: float, device: str) -> torch.Tensor:
    return (1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))).to(device)


def rope_tables(
    position_ids: torch.Tensor, config: Cosmos3Config, dtype: torch.dtype, device: torch.device | str | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin ``[..., N, head_dim]`` for positions ``[..., 3, N]``, computed in fp32 and cast to ``dtype``.

    The three axes' frequencies are interleaved — index ``i`` of the half-dimension belongs to H when
    ``i % 3 == 1`` and ``i < 3·sections[1]``, to W when ``i % 3 == 2`` and ``i < 3·sections[2]``, else to T —
    and duplicated for rotate-half pairs ``(i, i + head_dim/2)``.
    """
    device = position_ids.device if device is None else device
    inv_freq = inverse_frequencies(config, device)
    pos = position_ids.to(device=device, dtype=torch.float32)
    with torch.autocast(device_type=torch.device(device).type, enabled=False):
        freqs = pos.unsqueeze(-1) * inv_freq  # [..., 3, N, hd/2]
    sections = config.rope_axes_dim
    out = freqs.select(-3, 0).clone()  # T owns everything not claimed by H or W
    for axis in (1, 2):
        idx = slice(axis, sections[axis] * 3, 3)
        out[..., idx] = freqs.select(-3, axis)[..., idx]
    emb = torch.cat([out, out], dim=-1)  # [..., N, hd]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE. ``x`` ``[..., N, heads, hd]``; ``cos``/``sin`` ``[..., N, hd]``."""
    cos = cos.unsqueeze(-2)
    sin = sin.unsqueeze(-2)
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin

"""Parallel Wan2.2 VAE decode: the spatial tiles of ``Cosmos3VAE``'s tiled decode spread across ranks.

The tiled decode (``vae.py``, which reproduces diffusers' ``AutoencoderKLWan.tiled_decode``) decodes every tile
independently — its own causal feature cache, no data from other tiles — and only the blending of the seams reads
neighbours. So tile ``k`` (in the grid's row-major order) is decoded by rank ``k mod world``; after each temporal
chunk one ``all_gather`` collects every tile's pixels on every rank and the seams are blended by the same code
as on one rank. The result is the single-rank ``decode(tile=True)`` with the same tile size and stride, exactly
(the same tensors go through the same ops; tests/test_parallel.py checks it).

Why tiles and not time chunks: the decoder is causal in time with a running cache, so a later time chunk cannot
start before the earlier ones are done. Why not the untiled decode: its mid-block attention and convolutions see
the whole frame, so a split needs halo exchanges inside diffusers' module; the tiled decode needs none. At 720p the
default 256/192 px tiles give a 4 × 7 grid (28 tiles: 14 per rank on 2 GPUs, 7 on 4).
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from ..vae.video import Cosmos3VAE, OnChunk
from .mesh import guarded


@torch.no_grad()
def decode_parallel(
    vae: Cosmos3VAE,
    latents: torch.Tensor,
    group: dist.ProcessGroup | None = None,
    *,
    chunk_latent_frames: int = 1,
    tile_sample_size: int | None = None,
    tile_sample_stride: int | None = None,
    on_chunk: OnChunk | None = None,
    out_device="cpu",
) -> torch.Tensor:
    """``vae.decode(latents, tile=True, ...)`` with the tiles spread over ``group``; frames ``[F,H,W,3]`` on every
    rank. A clip that fits one tile is decoded whole by every rank (nothing to split)."""
    if latents.ndim == 4:
        latents = latents.unsqueeze(0)
    if latents.ndim != 5 or latents.shape[:2] != (1, vae.latent_channels):
        raise ValueError(f"decode_parallel: latents must be [1,{vae.latent_channels},T,h,w], got "
                         f"{tuple(latents.shape)}.")
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    h_lat, w_lat = latents.shape[-2:]
    grid = vae.tile_grid(h_lat, w_lat, tile_sample_size, tile_sample_stride)
    if grid is None or world == 1:
        return vae.decode(latents, chunk_latent_frames=chunk_latent_frames, tile=True, on_chunk=on_chunk,
                          tile_sample_size=tile_sample_size, tile_sample_stride=tile_sample_stride,
                          out_device=out_device)
    if chunk_latent_frames < 1:
        raise ValueError(f"decode_parallel: chunk_latent_frames must be >= 1, got {chunk_latent_frames}.")
    mean, inv_std = vae.stats()
    z = latents.to(device=vae.device, dtype=vae.dtype) / inv_std + mean
    t_lat = z.shape[2]
    tiles = grid["tiles"]
    mine = tiles[rank::world]
    caches = {ij: [] for ij in mine}  # per-tile WanFrameDecoder state
    per_rank = math.ceil(len(tiles) / world)
    scale = grid["out_h"] // h_lat  # decoder-output pixels per latent pixel
    size = {ij: (min(grid["lat_h"], h_lat - ij[0]) * scale, min(grid["lat_w"], w_lat - ij[1]) * scale) for ij in tiles}
    tile_h, tile_w = size[tiles[0]]  # the first tile is a full one
    channels = int(vae.vae.config.out_channels)
    out = torch.empty(vae.num_pixel_frames(t_lat), h_lat * vae.spatial_scale, w_lat * vae.spatial_scale, 3,
                      dtype=torch.float32, device=out_device)
    frame = 0
    try:
        with torch.autocast(z.device.type, enabled=False):  # WanVAE runs without AMP
            for start in range(0, t_lat, chunk_latent_frames):
                stop = min(start + chunk_latent_frames, t_lat)
                frames = sum(1 if k == 0 else vae.temporal_scale for k in range(start, stop))
                send = torch.zeros(per_rank, 1, channels, frames, tile_h, tile_w, dtype=z.dtype, device=z.device)
                for slot, ij in enumerate(mine):
                    tile = vae.decode_tile(z, ij, start, stop, caches[ij], grid)
                    send[slot, :, :, :, : tile.shape[-2], : tile.shape[-1]] = tile
                parts = [torch.empty_like(send) for _ in range(world)]
                with guarded("parallel VAE decode: all-gather of the decoded tiles"):
                    dist.all_gather(parts, send, group=group)
                decoded = {ij: parts[k % world][k // world][..., : size[ij][0], : size[ij][1]]
                           for k, ij in enumerate(tiles)}
                pix = vae.postprocess(vae.stitch_tiles(decoded, grid))
                out[frame : frame + pix.shape[0]].copy_(pix)
                frame += pix.shape[0]
                del pix, parts, decoded, send
                if on_chunk is not None:
                    on_chunk(stop, t_lat)
    finally:
        vae.vae.clear_cache()
    return out

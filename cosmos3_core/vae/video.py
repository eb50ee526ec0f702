"""Wan2.2 video VAE for Cosmos3: normalized encode, and a chunked, cancellable, streaming decode.

Wraps diffusers 0.42.1 ``AutoencoderKLWan`` (models/autoencoders/autoencoder_kl_wan.py); the network itself is the
library's module, unchanged. What this file adds mirrors ``Cosmos3OmniPipeline`` (pipelines/cosmos/
pipeline_cosmos3_omni.py) and ``VideoProcessor.postprocess_video`` (video_processor.py):

* ``encode``: pixels ``[1,3,F,H,W]`` in [-1,1] -> ``mu = latent_dist.mode()`` -> ``(mu - mean) * inv_std``, with
  ``mean``/``inv_std = 1 / std`` built in the VAE dtype and no autocast (the pipeline's ``_encode_video``).
* ``decode``: normalized latents -> ``z / inv_std + mean`` in the VAE dtype -> decoder -> clamp [-1,1] ->
  ``(x * 0.5 + 0.5).clamp(0, 1)`` in fp32 -> frames ``[F,H,W,3]`` (the pipeline's ``output_type="np"`` path).

Why a custom decode loop: the Wan decoder is causal in time and already runs one latent frame per call, carrying
the last two time steps of every causal conv in a feature cache (the first latent frame is decoded with
``first_chunk=True`` and yields 1 pixel frame, every later one yields ``scale_factor_temporal`` = 4).
``AutoencoderKLWan._decode`` runs that loop over the whole clip and concatenates every output frame on the device
before returning. Here the same loop is driven chunk by chunk with a per-clip state we own, each chunk's pixels are
post-processed and copied straight into a preallocated output on ``out_device``, and a callback runs between chunks
(progress + cancellation by raising). Each latent frame goes through ``frame_decoder.WanFrameDecoder``: the same
network over the module's own parameters with fewer memory passes (and, with ``compile=True``, a
``torch.compile``d steady-state frame); the result equals a whole-clip ``decode`` up to float rounding.

Optional spatial tiling reproduces ``AutoencoderKLWan.tiled_decode`` (same tile grid from the module's
``tile_sample_*`` attributes set by ``enable_tiling``, same ``blend_v``/``blend_h`` seams), with one feature cache
per tile so that it can also be streamed in temporal chunks. Blending is per frame, so chunking does not change it.

diffusers internals relied on (0.42.1): the ``decoder`` submodules (see frame_decoder.py), ``post_quant_conv``,
the module-level ``unpatchify``, ``blend_v``/``blend_h``, the ``tile_sample_min_*``/``tile_sample_stride_*``
attributes, ``use_tiling``, and ``clear_cache``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable

import torch

from .. import defaults
from .frame_decoder import WanFrameDecoder

OnChunk = Callable[[int, int], None]
_log = logging.getLogger(__name__)


def load_vae(checkpoint_dir, dtype: torch.dtype = torch.float32, device="cpu") -> "Cosmos3VAE":
    """Load ``<checkpoint_dir>/vae`` (diffusers ``AutoencoderKLWan`` layout) from local files only."""
    from diffusers import AutoencoderKLWan

    vae_dir = Path(checkpoint_dir) / "vae"
    if not vae_dir.is_dir():
        raise FileNotFoundError(
            f"Cosmos3 VAE folder not found: {vae_dir}. Expected the checkpoint's 'vae/' subfolder "
            "(config.json + diffusion_pytorch_model.safetensors, as in nvidia/Cosmos3-* on the Hub)."
        )
    from ..model.loader import load_diffusers_folder

    module = load_diffusers_folder(AutoencoderKLWan, vae_dir, "Wan2.2 VAE", dtype)
    return Cosmos3VAE(module).to(device=device).eval()


class Cosmos3VAE(torch.nn.Module):
    """``AutoencoderKLWan`` plus Cosmos3 latent normalization, chunked decode and a memory estimate.

    A ``torch.nn.Module`` so a model manager can move/cast it as a whole; the wrapped module is ``self.vae``.
    """

    def __init__(self, vae: torch.nn.Module):
        super().__init__()
        self.vae = vae
        cfg = vae.config
        self.latent_channels = int(cfg.z_dim)
        self.spatial_scale = int(cfg.scale_factor_spatial)
        self.temporal_scale = int(cfg.scale_factor_temporal)
        self.patch_size = cfg.patch_size
        self._frame_decoders: dict[tuple, WanFrameDecoder] = {}  # by (compile, backend, channels_last)

    def frame_decoder(self, compile: bool | str = False, compile_backend: str = "inductor") -> WanFrameDecoder:
        """The per-latent-frame decoder over ``self.vae.decoder`` (``compile``: torch.compile'd steady state, with
        ``compile_backend``, or ``"cached"``: only the stages already on disk; one decoder per setting, kept, so its
        compiled stages are made once).

        On CUDA it keeps activations and convolution weights channels-last (frame_decoder.py): on the H200 at 720p/189f
        (bf16) that decodes in 5.61 s at an 8.4 GiB peak compiled against 6.42 s at 9.3 GiB with the default layout,
        and in 7.17 s at 7.5 GiB eager (docs/benchmark-log.md).

        Compiled on CUDA, the stages' height and width are dynamic: one compile serves every size and every tile
        (H200, docs/benchmark-log.md: 480p then 720p compiled once in 65 s against 36 + 32 s static, decoding in
        the same 1.21 / 5.60 s). On the CPU they stay static (inductor's CPU kernels lose speed with dynamic sizes)."""
        cuda = self.device.type == "cuda"
        key = (compile, compile_backend if compile else None, cuda)
        if key not in self._frame_decoders:
            self._frame_decoders[key] = WanFrameDecoder(self.vae.decoder, compile=compile, channels_last=cuda,
                                                        compile_backend=compile_backend, dynamic_size=cuda)
        return self._frame_decoders[key]

    # ------------------------------------------------------------------ properties / stats
    @property
    def dtype(self) -> torch.dtype:
        return next(self.vae.parameters()).dtype

    @property
    def device(self) -> torch.device:
        return next(self.vae.parameters()).device

    def stats(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-channel (mean, inv_std) shaped [1,C,1,1,1], built in the VAE dtype exactly like the pipeline."""
        dtype, device = self.dtype, self.device
        mean = torch.tensor(self.vae.config.latents_mean, dtype=dtype)
        inv_std = 1.0 / torch.tensor(self.vae.config.latents_std, dtype=dtype)
        return mean.to(device).view(1, -1, 1, 1, 1), inv_std.to(device).view(1, -1, 1, 1, 1)

    def normalize(self, raw: torch.Tensor) -> torch.Tensor:
        """Raw VAE latents (what ComfyUI's LATENT holds) → the normalized latents the transformer works in."""
        mean, inv_std = self.stats()
        return ((raw.to(device=mean.device, dtype=mean.dtype) - mean) * inv_std).float()

    def denormalize(self, latents: torch.Tensor) -> torch.Tensor:
        """Normalized latents → raw VAE latents ``z / inv_std + mean`` (the pipeline's decode input), float32."""
        mean, inv_std = self.stats()
        return (latents.to(device=mean.device, dtype=mean.dtype) / inv_std + mean).float()

    def latent_shape(self, num_frames: int, height: int, width: int) -> tuple[int, int, int, int, int]:
        """Latent shape ``[1, C, (F-1)//4+1, H/16, W/16]`` for a clip of ``num_frames`` x ``height`` x ``width``."""
        t = defaults.latent_frames(num_frames)
        return (1, self.latent_channels, t, height // self.spatial_scale, width // self.spatial_scale)

    def num_pixel_frames(self, latent_frames: int) -> int:
        """Pixel frames decoded from ``latent_frames`` latents: the first gives 1, each later one 4."""
        return 1 + self.temporal_scale * (latent_frames - 1) if latent_frames > 0 else 0

    def decoded_shape(self, latents: torch.Tensor) -> tuple[int, int, int, int]:
        """``(F, H, W, 3)`` of the frames ``decode`` makes from ``latents`` ``[1, C, T, h, w]``."""
        t, h, w = latents.shape[-3:]
        return self.num_pixel_frames(t), h * self.spatial_scale, w * self.spatial_scale, 3

    # ------------------------------------------------------------------ encode
    @torch.no_grad()
    def encode(self, video: torch.Tensor) -> torch.Tensor:
        """Pixels ``[1,3,F,H,W]`` in [-1,1] -> normalized latents ``[1,C,(F-1)//4+1,H/16,W/16]`` (float32).

        Same math as ``Cosmos3OmniPipeline._encode_video``: the posterior mode (no sampling), normalized with the
        per-channel mean and ``1/std`` in the VAE dtype, no autocast. Always untiled (as the pipeline).
        """
        if video.ndim != 5 or video.shape[1] != 3:
            raise ValueError(f"Cosmos3VAE.encode: video must be [B,3,F,H,W] in [-1,1], got {tuple(video.shape)}.")
        h, w = video.shape[-2:]
        if h % self.spatial_scale or w % self.spatial_scale:
            raise ValueError(
                f"Cosmos3VAE.encode: height and width must be multiples of {self.spatial_scale}, got {h}x{w}; "
                "resize or crop the input first."
            )
        was_tiling = getattr(self.vae, "use_tiling", False)
        self.vae.use_tiling = False
        try:
            with torch.autocast(self.device.type, enabled=False):  # WanVAE runs without AMP
                mu = self.vae.encode(video.to(device=self.device, dtype=self.dtype)).latent_dist.mode()
        finally:
            self.vae.use_tiling = was_tiling
        mean, inv_std = self.stats()
        return ((mu - mean) * inv_std).float()

    # ------------------------------------------------------------------ decode
    @torch.no_grad()
    def decode(
        self,
        latents: torch.Tensor,
        *,
        chunk_latent_frames: int = 1,
        tile: bool | None = None,
        tile_sample_size: int | None = None,
        tile_sample_stride: int | None = None,
        on_chunk: OnChunk | None = None,
        out_device="cpu",
        compile: bool | str = False,
        compile_backend: str = "inductor",
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Normalized latents ``[1,C,T,h,w]`` (or ``[C,T,h,w]``, any float dtype) -> frames ``[F,H,W,3]`` fp32 in [0,1].

        ``F = 1 + 4*(T-1)``, ``H = 16*h``, ``W = 16*w``. Decodes ``chunk_latent_frames`` latent frames at a time,
        copying each chunk's frames into the preallocated output on ``out_device`` and then calling
        ``on_chunk(done_latent_frames, total_latent_frames)``; an exception raised there aborts the decode (the
        VAE is left clean). ``tile=True`` uses diffusers' spatial tiling (``tile_sample_size``/``_stride`` in
        pixels, default: the module's ``enable_tiling`` values, 256/192); it only kicks in when the latent is
        larger than one tile, exactly as ``AutoencoderKLWan._decode``. ``tile=None`` (the default): an untiled decode
        that runs out of GPU memory is retried tiled (as ComfyUI's own VAE decode does), with a logged warning (a
        ``tile=False`` decode is never tiled): on a small
        card what else is resident decides, and tiling needs about half the activations (docs/benchmark-log.md).
        ``compile=True`` runs every latent frame after the first through ``torch.compile`` (``compile_backend``; the
        run's ``RuntimeOptions.vae_compile``): the first decode at a new size, or tile size, compiles for a while; later
        ones reuse it, also in later processes (kept on disk). ``compile="cached"`` uses compiled stages only where they
        are on disk already and runs the others eagerly (what ``compile="auto"`` does: compiling costs a first run more
        than it saves). ``out``: a float32 tensor of ``decoded_shape(latents)`` to decode into instead of a new one on
        ``out_device`` (frames ``[0, num_pixel_frames(done))`` of it are final when ``on_chunk(done, total)`` is called
        — until an untiled decode that ran out of memory starts again tiled, when the count starts again too).
        """
        if latents.ndim == 4:
            latents = latents.unsqueeze(0)
        if latents.ndim != 5 or latents.shape[0] != 1 or latents.shape[1] != self.latent_channels:
            raise ValueError(
                f"Cosmos3VAE.decode: latents must be [1,{self.latent_channels},T,h,w], got {tuple(latents.shape)}."
            )
        if not latents.is_floating_point():
            raise ValueError(f"Cosmos3VAE.decode: latents must be a float tensor, got {latents.dtype}.")
        if chunk_latent_frames < 1:
            raise ValueError(f"Cosmos3VAE.decode: chunk_latent_frames must be >= 1, got {chunk_latent_frames}.")
        _, _, t_lat, h_lat, w_lat = latents.shape
        mean, inv_std = self.stats()
        z = latents.to(device=self.device, dtype=self.dtype) / inv_std + mean  # raw VAE latents, VAE dtype

        shape = self.decoded_shape(latents)
        if out is None:
            out = torch.empty(shape, dtype=torch.float32, device=out_device)
        elif tuple(out.shape) != shape or out.dtype != torch.float32:
            raise ValueError(f"Cosmos3VAE.decode: out must be a float32 tensor of shape {shape} for these latents, "
                             f"got {out.dtype} {tuple(out.shape)}.")
        decoder = self.frame_decoder(compile, compile_backend)
        tile_on_oom = tile is None
        for tiled in (True,) if tile else (False, True) if tile_on_oom else (False,):
            grid = self.tile_grid(h_lat, w_lat, tile_sample_size, tile_sample_stride) if tiled else None
            try:
                self._decode_into(out, z, grid, chunk_latent_frames, on_chunk, decoder=decoder)
                return out
            except torch.OutOfMemoryError:
                if tiled or not tile_on_oom:
                    raise
            finally:
                self.vae.clear_cache()  # our caches are locals of _decode_into; this resets the module's own
            # only after an untiled attempt ran out of memory; its tensors are released by now
            _log.warning("Cosmos3VAE.decode: out of GPU memory decoding %dx%d untiled; retrying with spatial "
                         "tiles (slightly different blending at tile seams).", w_lat * self.spatial_scale,
                         h_lat * self.spatial_scale)
            if self.device.type == "cuda":
                torch.cuda.empty_cache()  # hand the failed attempt's blocks back (also to cudaMallocAsync's pool)

    def _decode_into(self, out: torch.Tensor, z: torch.Tensor, grid: dict | None, chunk: int,
                     on_chunk: OnChunk | None, *, decoder: WanFrameDecoder) -> None:
        """The chunk loop: decode, post-process and copy each chunk into ``out``, then report progress."""
        with torch.autocast(z.device.type, enabled=False):  # WanVAE runs without AMP
            self._decode_chunks(out, z, grid, chunk, on_chunk, decoder=decoder)

    def _decode_chunks(self, out: torch.Tensor, z: torch.Tensor, grid: dict | None, chunk: int,
                       on_chunk: OnChunk | None, *, decoder: WanFrameDecoder) -> None:
        t_lat = z.shape[2]
        if grid is None:
            x = self.vae.post_quant_conv(z)  # 1x1x1 conv: whole clip at once, as AutoencoderKLWan._decode
            cache = []  # WanFrameDecoder state: the causal convs' histories
        else:
            x = z  # tiled_decode applies post_quant_conv per tile and frame
            caches = {ij: [] for ij in grid["tiles"]}
        # GPU -> host output: through two pinned staging buffers, so that chunk k's frames land in ``out`` (a host
        # memcpy) while the GPU decodes chunk k+1; a chunk is reported to ``on_chunk`` once it is in ``out``.
        staged = z.is_cuda and out.device.type == "cpu"
        buffers: list[torch.Tensor] = []
        pending = None  # (first frame, frames, staging view, copy-done event, latent frames done)
        frame = 0
        for k, start in enumerate(range(0, t_lat, chunk)):
            stop = min(start + chunk, t_lat)
            if grid is None:
                pix = self._decode_frames(x, start, stop, cache, decoder)
            else:
                pix = self._decode_frames_tiled(x, start, stop, caches, grid, decoder)
            pix = self.postprocess(pix)  # [f,H,W,3] fp32 on the VAE device
            n = pix.shape[0]
            if staged:
                if len(buffers) < 2:
                    buffers.append(torch.empty((chunk * self.temporal_scale, *pix.shape[1:]), dtype=pix.dtype,
                                               pin_memory=True))
                view = buffers[k % 2][:n]
                view.copy_(pix, non_blocking=True)
                done = torch.cuda.Event()
                done.record()
                del pix
                if pending is not None:
                    self._land(out, pending, t_lat, on_chunk)
                pending = (frame, n, view, done, stop)
            else:
                out[frame:frame + n].copy_(pix)
                del pix
                if on_chunk is not None:
                    on_chunk(stop, t_lat)
            frame += n
        if pending is not None:
            self._land(out, pending, t_lat, on_chunk)

    @staticmethod
    def _land(out: torch.Tensor, pending: tuple, t_lat: int, on_chunk: OnChunk | None) -> None:
        frame, n, view, done, stop = pending
        done.synchronize()
        out[frame:frame + n].copy_(view)
        if on_chunk is not None:
            on_chunk(stop, t_lat)

    def _decode_frames(self, x: torch.Tensor, start: int, stop: int, cache: list,
                       decoder: WanFrameDecoder) -> torch.Tensor:
        """Latent frames [start, stop) through the decoder with the running cache -> [1,3,f,H,W] in [-1,1]."""
        outs = [decoder(x[:, :, i:i + 1], cache, i == 0) for i in range(start, stop)]
        return self._finish(outs[0] if len(outs) == 1 else torch.cat(outs, dim=2))

    def _finish(self, out: torch.Tensor) -> torch.Tensor:
        from diffusers.models.autoencoders.autoencoder_kl_wan import unpatchify

        if self.patch_size is not None:
            out = unpatchify(out, patch_size=self.patch_size)
        return out.clamp(-1.0, 1.0)

    @staticmethod
    def postprocess(pix: torch.Tensor) -> torch.Tensor:
        """[1,3,f,H,W] decoder output -> [f,H,W,3] fp32 in [0,1] (the pipeline casts to fp32, then denormalizes)."""
        return (pix[0].float() * 0.5 + 0.5).clamp(0, 1).permute(1, 2, 3, 0)

    # ------------------------------------------------------------------ tiling (AutoencoderKLWan.tiled_decode)
    def tile_grid(self, h_lat: int, w_lat: int, size: int | None, stride: int | None) -> dict | None:
        vae = self.vae
        size_h = size or vae.tile_sample_min_height
        size_w = size or vae.tile_sample_min_width
        stride_h = stride or vae.tile_sample_stride_height
        stride_w = stride or vae.tile_sample_stride_width
        s, p = self.spatial_scale, (self.patch_size or 1)
        if size_h % s or size_w % s or stride_h % s or stride_w % s or stride_h > size_h or stride_w > size_w:
            raise ValueError(
                f"Cosmos3VAE.decode: tile size ({size_h}x{size_w}) and stride ({stride_h}x{stride_w}) must be "
                f"multiples of {s} with stride <= size, e.g. tile_sample_size=256, tile_sample_stride=192."
            )
        lat_h, lat_w = size_h // s, size_w // s
        if not (w_lat > lat_w or h_lat > lat_h):
            return None  # fits in one tile: diffusers decodes untiled
        lat_sh, lat_sw = stride_h // s, stride_w // s
        rows, cols = list(range(0, h_lat, lat_sh)), list(range(0, w_lat, lat_sw))
        return {
            "tiles": [(i, j) for i in rows for j in cols], "rows": rows, "cols": cols,
            "lat_h": lat_h, "lat_w": lat_w,
            # seams and strides in decoder-output (patchified) pixels
            "stride_h": stride_h // p, "stride_w": stride_w // p,
            "blend_h": size_h // p - stride_h // p, "blend_w": size_w // p - stride_w // p,
            "out_h": h_lat * s // p, "out_w": w_lat * s // p,
        }

    def _decode_frames_tiled(self, z: torch.Tensor, start: int, stop: int, caches: dict, g: dict,
                             decoder: WanFrameDecoder) -> torch.Tensor:
        tiles = {ij: self.decode_tile(z, ij, start, stop, caches[ij], g, decoder) for ij in g["tiles"]}
        return self.stitch_tiles(tiles, g)

    def decode_tile(self, z: torch.Tensor, ij: tuple[int, int], start: int, stop: int, cache: list,
                     g: dict, decoder: WanFrameDecoder | None = None) -> torch.Tensor:
        """Latent frames [start, stop) of tile ``ij`` through the decoder with the tile's running cache (a list,
        ``[]`` before the tile's first frame)."""
        vae, (i, j) = self.vae, ij
        decoder = decoder or self.frame_decoder()
        outs = []
        for k in range(start, stop):
            tile = vae.post_quant_conv(z[:, :, k:k + 1, i:i + g["lat_h"], j:j + g["lat_w"]])
            outs.append(decoder(tile, cache, k == 0))
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)

    def stitch_tiles(self, tiles: dict, g: dict) -> torch.Tensor:
        """Decoded tiles (keyed by their latent corner) → blended frames, as ``AutoencoderKLWan.tiled_decode``."""
        vae = self.vae
        rows = [[tiles[(i, j)] for j in g["cols"]] for i in g["rows"]]
        result_rows = []
        for r, row in enumerate(rows):
            kept = []
            for c, tile in enumerate(row):
                if r > 0:
                    tile = vae.blend_v(rows[r - 1][c], tile, g["blend_h"])
                if c > 0:
                    tile = vae.blend_h(row[c - 1], tile, g["blend_w"])
                kept.append(tile[:, :, :, :g["stride_h"], :g["stride_w"]])
            result_rows.append(torch.cat(kept, dim=-1))
        out = torch.cat(result_rows, dim=3)[:, :, :, :g["out_h"], :g["out_w"]]
        return self._finish(out)

    # ------------------------------------------------------------------ memory
    def memory_required(self, latent_shape, dtype: torch.dtype | None = None, *, tile: bool = False,
                        tile_sample_size: int | None = None, tile_sample_stride: int | None = None,
                        chunk_latent_frames: int = 1) -> int:
        """Rough peak device bytes of ``decode`` beyond the weights, for a model manager (e.g. ComfyUI).

        The chunked decode never holds more than one latent frame's activations, so the peak does not grow with T.
        Model, per latent pixel (16x16 output pixels) and per element of ``dtype``, scaled by decoder width / 256:
        ``_ACT_ELEMS`` for the activations of the tile (or frame) being decoded plus ``_CACHE_ELEMS`` for the
        causal-conv caches of every tile (untiled: one tile = the frame; tiled: the tiles overlap, ~1.65x the
        frame), plus the chunk's output frames. Fitted on an H200, bf16, released Wan2.2 widths
        (decoder_base_dim 256), torch 2.11: 720p untiled 10.13 GiB measured (any T; diffusers' whole-clip decode
        10.17 GiB at T=3), 720p tiled 256/192 5.60 GiB, 480p 4.40 / 2.73 GiB. Rounded up by 10 %. The channels-last
        decoder on CUDA needs less (720p untiled 6.2 GiB eager, 7.1 GiB compiled, docs/benchmark-log.md): there this
        is an upper bound, kept until the other sizes are re-measured."""
        dtype = dtype or self.dtype
        itemsize = torch.empty((), dtype=dtype).element_size()
        h_lat, w_lat = int(latent_shape[-2]), int(latent_shape[-1])
        grid = self.tile_grid(h_lat, w_lat, tile_sample_size, tile_sample_stride) if tile else None
        if grid is None:
            active = cached = h_lat * w_lat
        else:
            rows = sum(min(grid["lat_h"], h_lat - i) for i in grid["rows"])
            cols = sum(min(grid["lat_w"], w_lat - j) for j in grid["cols"])
            cached, active = rows * cols, min(grid["lat_h"], h_lat) * min(grid["lat_w"], w_lat)
        px = self.spatial_scale ** 2
        width = int(self.vae.config.decoder_base_dim or self.vae.config.base_dim) / 256
        activations = (_ACT_ELEMS * active + _CACHE_ELEMS * cached) * width * px * itemsize
        # one chunk of output frames: decoder output (+unpatchified copy) and the fp32 post-processed copy
        frames = chunk_latent_frames * self.temporal_scale
        out_chunk = frames * cached * px * 3 * (2 * itemsize + 2 * 4)
        return int(1.1 * (activations + out_chunk))


# Fitted peak elements per output pixel (see Cosmos3VAE.memory_required), decoder_base_dim = 256.
_ACT_ELEMS = 4150  # activations of the tile/frame being decoded
_CACHE_ELEMS = 1750  # causal feature caches (+ chunk output) of every tile

"""Tests for cosmos3_core.vae.video against diffusers 0.42.1 (tiny random Wan2.2-geometry VAE, CPU, fp32).

Run: /root/.cache/cosmos3/venv/bin/python -m pytest -q tests/test_vae.py
"""

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from diffusers import Cosmos3OmniPipeline
from diffusers.video_processor import VideoProcessor

from cosmos3_core.config import CheckpointError
from cosmos3_core.vae.video import Cosmos3VAE, load_vae

TOL = 1e-5


@pytest.fixture(scope="module")
def ckpt(tiny_checkpoint):
    return tiny_checkpoint("nano")


@pytest.fixture(scope="module")
def vae(ckpt) -> Cosmos3VAE:
    return load_vae(ckpt)


def _pipe_like(vae: Cosmos3VAE) -> SimpleNamespace:
    """The attributes Cosmos3OmniPipeline's encode/decode code reads, built as its __init__ builds them."""
    m = vae.vae
    return SimpleNamespace(
        vae=m,
        _vae_latents_mean=torch.tensor(m.config.latents_mean, dtype=m.dtype),
        _vae_latents_inv_std=1.0 / torch.tensor(m.config.latents_std, dtype=m.dtype),
        video_processor=VideoProcessor(vae_scale_factor=16, resample="bilinear"),
    )


@torch.no_grad()
def _pipeline_decode(vae: Cosmos3VAE, latents: torch.Tensor) -> np.ndarray:
    """The tail of Cosmos3OmniPipeline.__call__ for output_type="np" (whole-clip AutoencoderKLWan.decode)."""
    p = _pipe_like(vae)
    dtype = p.vae.dtype
    mean = p._vae_latents_mean.to(dtype=dtype).view(1, -1, 1, 1, 1)
    inv_std = p._vae_latents_inv_std.to(dtype=dtype).view(1, -1, 1, 1, 1)
    z_raw = latents.to(dtype) / inv_std + mean
    decoded = p.vae.decode(z_raw).sample.to(latents.dtype)
    return p.video_processor.postprocess_video(decoded, output_type="np")[0]


def _latents(t, h=2, w=3, seed=0):
    return torch.randn(1, 48, t, h, w, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("t", [1, 3])
@pytest.mark.parametrize("chunk", [1, 2])
def test_chunked_decode_matches_whole_clip(vae, t, chunk):
    lat = _latents(t)
    ref = _pipeline_decode(vae, lat)
    calls = []
    out = vae.decode(lat, chunk_latent_frames=chunk, on_chunk=lambda d, n: calls.append((d, n)))
    assert out.dtype == torch.float32 and out.device.type == "cpu"
    assert tuple(out.shape) == ref.shape == (1 + 4 * (t - 1), 32, 48, 3)
    assert float(ref.std()) > 1e-3  # the random VAE decodes to a non-constant video
    assert np.abs(out.numpy() - ref).max() <= TOL
    assert calls == [(min(s + chunk, t), t) for s in range(0, t, chunk)]


def test_decode_accepts_bf16_and_unbatched_latents(vae):
    lat = _latents(2)
    ref = vae.decode(lat.to(torch.bfloat16).float())
    assert torch.equal(vae.decode(lat.to(torch.bfloat16)[0]), ref)


def test_tiled_chunked_decode_matches_diffusers_tiling(vae):
    lat = _latents(2, h=5, w=5, seed=1)  # 80x80 px > one 64 px tile: a 2x2 grid of tiles
    m = vae.vae
    saved = (m.use_tiling, m.tile_sample_min_height, m.tile_sample_min_width,
             m.tile_sample_stride_height, m.tile_sample_stride_width)
    try:
        m.enable_tiling(64, 64, 48, 48)
        ref = _pipeline_decode(vae, lat)
        m.use_tiling = False
        out = vae.decode(lat, chunk_latent_frames=1, tile=True)  # tile geometry from enable_tiling
    finally:
        (m.use_tiling, m.tile_sample_min_height, m.tile_sample_min_width,
         m.tile_sample_stride_height, m.tile_sample_stride_width) = saved
    assert np.abs(out.numpy() - ref).max() <= TOL
    out2 = vae.decode(lat, chunk_latent_frames=2, tile=True, tile_sample_size=64, tile_sample_stride=48)
    assert np.abs(out2.numpy() - ref).max() <= TOL
    untiled = vae.decode(lat, tile=False).numpy()
    assert np.abs(untiled - ref).max() > 1e-4  # tiling really happened


def test_encode_matches_pipeline(vae):
    x = torch.rand(1, 3, 9, 64, 96, generator=torch.Generator().manual_seed(2)) * 2 - 1
    with torch.no_grad():
        ref = Cosmos3OmniPipeline._encode_video(_pipe_like(vae), x).float()
    out = vae.encode(x)
    assert out.dtype == torch.float32 and tuple(out.shape) == (1, 48, 3, 4, 6)
    assert (out - ref).abs().max().item() <= TOL


def test_cancelled_decode_leaves_vae_clean(vae):
    lat = _latents(3, seed=3)
    ref = _pipeline_decode(vae, lat)

    def cancel(done, total):
        if done == 1:
            raise InterruptedError("cancelled")

    with pytest.raises(InterruptedError):
        vae.decode(lat, chunk_latent_frames=1, on_chunk=cancel)
    assert all(c is None for c in vae.vae._feat_map) and all(c is None for c in vae.vae._enc_feat_map)
    assert np.abs(vae.decode(lat, chunk_latent_frames=2).numpy() - ref).max() <= TOL
    assert np.abs(_pipeline_decode(vae, lat) - ref).max() == 0


def test_missing_vae_dir(tmp_path):
    with pytest.raises(FileNotFoundError, match="vae") as e:
        load_vae(tmp_path)
    assert str(tmp_path / "vae") in str(e.value)
    (tmp_path / "vae").mkdir()
    with pytest.raises(CheckpointError, match="config.json"):
        load_vae(tmp_path)


def test_bad_latents_rejected(vae):
    with pytest.raises(ValueError, match="latents must be"):
        vae.decode(torch.zeros(1, 16, 1, 4, 4))
    with pytest.raises(ValueError, match="chunk_latent_frames"):
        vae.decode(_latents(1), chunk_latent_frames=0)
    with pytest.raises(ValueError, match="multiples of 16"):
        vae.encode(torch.zeros(1, 3, 1, 60, 96))


def test_memory_required(vae):
    small = vae.memory_required((1, 48, 48, 30, 52), torch.bfloat16)
    big = vae.memory_required((1, 48, 48, 45, 80), torch.bfloat16)
    assert 0 < small < big
    assert vae.memory_required((1, 48, 1, 45, 80), torch.bfloat16) == big  # chunked: independent of T
    assert vae.memory_required((1, 48, 48, 45, 80), torch.float32) > big
    assert vae.memory_required((1, 48, 48, 45, 80), torch.bfloat16, tile=True) < big


def test_normalize_inverts_denormalize_and_matches_pipeline_decode_input(tiny_checkpoint):
    """denormalize = the pipeline's ``latents / inv_std + mean``; normalize is its inverse."""
    from cosmos3_core.vae.video import load_vae

    vae = load_vae(tiny_checkpoint("edge", seed=4))
    z = torch.randn(1, 48, 2, 3, 4, generator=torch.Generator().manual_seed(0))
    mean = torch.tensor(vae.vae.config.latents_mean).view(1, -1, 1, 1, 1)
    inv_std = 1.0 / torch.tensor(vae.vae.config.latents_std).view(1, -1, 1, 1, 1)
    raw = vae.denormalize(z)
    assert torch.allclose(raw, z / inv_std + mean, atol=1e-6)
    assert torch.allclose(vae.normalize(raw), z, atol=1e-5)


def test_untiled_decode_out_of_memory_retries_tiled(vae, monkeypatch, caplog):
    """A GPU OOM in the untiled decode is retried with spatial tiles (warned), like ComfyUI's own VAE decode; an
    OOM in a decode that was already tiled, or with the retry switched off, reaches the caller."""
    lat = _latents(2, h=5, w=5, seed=3)
    want = vae.decode(lat, tile=True, tile_sample_size=64, tile_sample_stride=48)
    real = Cosmos3VAE._decode_chunks
    calls = []

    def out_of_memory_untiled(self, out, z, grid, chunk, on_chunk, **kw):
        calls.append(grid is not None)
        if grid is None:
            raise torch.OutOfMemoryError("CUDA out of memory (injected)")
        return real(self, out, z, grid, chunk, on_chunk, **kw)

    monkeypatch.setattr(Cosmos3VAE, "_decode_chunks", out_of_memory_untiled)
    with caplog.at_level("WARNING", logger="cosmos3_core.vae.video"):
        got = vae.decode(lat, tile_sample_size=64, tile_sample_stride=48)
    assert calls == [False, True]
    assert torch.equal(got, want)
    assert "retrying with spatial tiles" in caplog.text
    with pytest.raises(torch.OutOfMemoryError):
        vae.decode(lat, tile=False)
    monkeypatch.setattr(Cosmos3VAE, "_decode_chunks",
                        lambda *a, **kw: (_ for _ in ()).throw(torch.OutOfMemoryError("injected")))
    with pytest.raises(torch.OutOfMemoryError):
        vae.decode(lat, tile=True)

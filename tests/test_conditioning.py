"""Tests for cosmos3_core.sampling.conditioning against diffusers 0.42.1 Cosmos3OmniPipeline (tiny random VAE, CPU, fp32).

The reference side runs the pipeline's own ``prepare_latents`` / ``_encode_video`` / ``_preprocess_conditioning_image``
and ``VideoProcessor`` on an object carrying just the attributes those methods read (no transformer needed).

Run: /root/.cache/cosmos3/venv/bin/python -m pytest -q tests/test_conditioning.py
"""

import numpy as np
import pytest
import torch
from diffusers import Cosmos3OmniPipeline
from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import _preprocess_conditioning_image
from diffusers.video_processor import VideoProcessor
from PIL import Image

from cosmos3_core.sampling.conditioning import encode_condition, preprocess_image, preprocess_video
from cosmos3_core.vae.video import load_vae

TOL = 1e-5
H, W = 32, 48  # 2x3 latent


class _PipelineVision:
    """Cosmos3OmniPipeline's vision conditioning methods bound to a bare VAE (attributes as in its __init__)."""

    prepare_latents = Cosmos3OmniPipeline.prepare_latents
    _encode_video = Cosmos3OmniPipeline._encode_video

    def __init__(self, vae):
        self.vae = vae
        self._vae_latents_mean = torch.tensor(vae.config.latents_mean, dtype=vae.dtype)
        self._vae_latents_inv_std = 1.0 / torch.tensor(vae.config.latents_std, dtype=vae.dtype)
        self.video_processor = VideoProcessor(vae_scale_factor=16, resample="bilinear")

    @torch.no_grad()
    def clean_latents(self, **kw):
        """(latents, clean indexes) from prepare_latents; at clean frames latents == x0 exactly (mask 1)."""
        out = self.prepare_latents(height=H, width=W, device="cpu", dtype=torch.float32,
                                   generator=torch.Generator().manual_seed(0), **kw)
        latents, mask = out[0], out[5]
        return latents, torch.nonzero(mask[:, 0, 0] > 0).flatten().tolist()


@pytest.fixture(scope="module")
def vae(tiny_checkpoint):
    return load_vae(tiny_checkpoint("nano"))


@pytest.fixture(scope="module")
def pipe(vae):
    return _PipelineVision(vae.vae)


def _rand(*shape, seed=0):
    return torch.rand(*shape, generator=torch.Generator().manual_seed(seed))


def _check(x0, clean, ref_latents, ref_clean):
    assert clean == ref_clean
    assert x0.dtype == torch.float32 and x0.shape == ref_latents.shape
    assert (x0[:, :, clean] - ref_latents[:, :, clean]).abs().max().item() <= TOL
    noisy = [i for i in range(x0.shape[2]) if i not in clean]
    assert torch.count_nonzero(x0[:, :, noisy]) == 0


# ---------------------------------------------------------------------------------------------- preprocessing
def test_preprocess_image_matches_diffusers():
    img = _rand(1, 41, 57, 3)  # ComfyUI IMAGE, non-square, needs resize + center crop (round(6.5) = 6)
    ref = _preprocess_conditioning_image(img.permute(0, 3, 1, 2), H + 16, W)
    assert tuple(ref.shape) == (1, 3, H + 16, W)
    assert torch.equal(preprocess_image(img, H + 16, W), ref)
    assert torch.equal(preprocess_image(img[0], H + 16, W), ref)  # [H,W,3]
    assert torch.equal(preprocess_image(img.permute(0, 3, 1, 2), H + 16, W), ref)  # diffusers' NCHW
    u8 = (img[0].numpy() * 255).round().astype(np.uint8)
    ref_u8 = _preprocess_conditioning_image(u8, H, W)
    assert torch.equal(preprocess_image(u8, H, W), ref_u8)
    assert torch.equal(preprocess_image(Image.fromarray(u8), H, W), ref_u8)
    assert torch.equal(preprocess_image(Image.fromarray(u8), H, W),
                       _preprocess_conditioning_image(Image.fromarray(u8), H, W))


def test_preprocess_video_matches_videoprocessor():
    vp = VideoProcessor(vae_scale_factor=16, resample="bilinear")
    frames = _rand(5, 27, 50, 3, seed=1)  # [F,H,W,3] in [0,1], needs resizing
    ref = vp.preprocess_video(frames.numpy(), height=H, width=W)
    assert tuple(ref.shape) == (1, 3, 5, H, W)
    assert torch.equal(preprocess_video(frames, H, W), ref)
    assert torch.equal(preprocess_video(frames.numpy(), H, W), ref)
    assert torch.equal(preprocess_video(frames[None], H, W), ref)  # [1,F,H,W,3]
    assert torch.equal(preprocess_video(frames.permute(0, 3, 1, 2), H, W),
                       vp.preprocess_video(frames.permute(0, 3, 1, 2), height=H, width=W))
    pil = [Image.fromarray((f.numpy() * 255).astype(np.uint8)) for f in frames]
    assert torch.equal(preprocess_video(pil, H, W), vp.preprocess_video(pil, height=H, width=W))


# ---------------------------------------------------------------------------------------------- encode
def test_i2v_matches_prepare_latents(vae, pipe):
    img = _rand(1, 41, 57, 3, seed=2)
    ref, ref_clean = pipe.clean_latents(image=img.permute(0, 3, 1, 2), num_frames=9)
    x0, clean = encode_condition(vae, image=img, num_frames=9, height=H, width=W)
    _check(x0, clean, ref, ref_clean)
    assert clean == [0]


def test_t2i_ignores_image_like_pipeline(vae, pipe):
    img = _rand(1, H, W, 3, seed=3)
    ref, ref_clean = pipe.clean_latents(image=img.permute(0, 3, 1, 2), num_frames=1)
    x0, clean = encode_condition(vae, image=img, num_frames=1, height=H, width=W)
    assert clean == ref_clean == [] and tuple(x0.shape) == tuple(ref.shape) == (1, 48, 1, 2, 3)
    assert torch.count_nonzero(x0) == 0
    x0, clean = encode_condition(vae, num_frames=9, height=H, width=W)  # t2v: nothing clean
    assert clean == [] and tuple(x0.shape) == (1, 48, 3, 2, 3) and torch.count_nonzero(x0) == 0


@pytest.mark.parametrize("n_src, keep, idx", [
    (12, "first", (0, 1)),   # longer clip, first 5 frames kept
    (3, "first", (0, 1)),    # shorter clip: repeat-pad the last frame
    (12, "last", (0, 2)),    # last 9 frames; latent 1 is not clean
    (13, "last", (1,)),      # only latent 1 clean
])
def test_v2v_matches_prepare_latents(vae, pipe, n_src, keep, idx):
    video = _rand(n_src, 24, 40, 3, seed=n_src)  # ComfyUI IMAGE batch, needs resizing
    ref, ref_clean = pipe.clean_latents(video=video.numpy(), num_frames=9, condition_frame_indexes_vision=idx,
                                        condition_video_keep=keep)
    x0, clean = encode_condition(vae, video=video, num_frames=9, height=H, width=W,
                                 condition_latent_frames=idx, keep=keep)
    _check(x0, clean, ref, ref_clean)
    assert clean == sorted(idx)


def test_invalid_inputs(vae):
    with pytest.raises(ValueError, match="image: expected 3"):
        encode_condition(vae, image=_rand(1, H, W, 4), num_frames=9, height=H, width=W)
    with pytest.raises(ValueError, match="video: the clip has 0 frames"):
        encode_condition(vae, video=torch.zeros(0, H, W, 3), num_frames=9, height=H, width=W)
    with pytest.raises(ValueError, match="condition_latent_frames: index 3 is outside"):
        encode_condition(vae, video=_rand(9, H, W, 3), num_frames=9, height=H, width=W,
                         condition_latent_frames=(0, 3))
    with pytest.raises(ValueError, match="not both"):
        encode_condition(vae, image=_rand(1, H, W, 3), video=_rand(9, H, W, 3), num_frames=9, height=H, width=W)
    with pytest.raises(ValueError, match="keep must be"):
        encode_condition(vae, video=_rand(9, H, W, 3), num_frames=9, height=H, width=W, keep="middle")
    with pytest.raises(ValueError, match="multiples of 16"):
        encode_condition(vae, image=_rand(1, H, W, 3), num_frames=9, height=40, width=W)
    with pytest.raises(ValueError, match="num_frames > 1"):
        encode_condition(vae, video=_rand(9, H, W, 3), num_frames=1, height=H, width=W)
    with pytest.raises(ValueError, match="image: expected one image"):
        preprocess_image(_rand(2, H, W, 3), H, W)

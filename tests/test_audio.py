"""Tests for cosmos3_core.vae.audio against diffusers 0.42.1 (tiny random AVAE decoder with the real strides, CPU).

Run: /root/.cache/cosmos3/venv/bin/python -m pytest -q tests/test_audio.py
"""

from types import SimpleNamespace

import pytest
import torch
from diffusers import Cosmos3AVAEAudioTokenizer, Cosmos3OmniPipeline

from cosmos3_core.vae.audio import (
    hop_from_config,
    load_sound_decoder,
    num_audio_samples,
    read_sound_config,
    sound_latent_length,
)

TOL = 1e-5


@pytest.fixture(scope="module")
def ckpt(tiny_checkpoint):
    return tiny_checkpoint("nano", sound=True)


@pytest.fixture(scope="module")
def dec(ckpt):
    return load_sound_decoder(ckpt, torch.float32, "cpu")


def _pipeline_latent_length(tokenizer, num_frames, fps):
    """Cosmos3OmniPipeline.prepare_latents' sound length, verbatim arithmetic."""
    n_audio_samples = int(num_frames / fps * tokenizer.config.sampling_rate)
    hop_size = tokenizer._hop_size
    return (n_audio_samples + hop_size - 1) // hop_size


def _diffusers_tokenizer(ckpt):
    """diffusers' own sound tokenizer from the checkpoint, as the pipeline holds it (weight norms as hooks)."""
    return Cosmos3AVAEAudioTokenizer.from_pretrained(ckpt / "sound_tokenizer", torch_dtype=torch.float32).eval()


def test_decode_matches_pipeline(dec, ckpt):
    latent = torch.randn(64, 10, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = Cosmos3OmniPipeline.decode_sound(SimpleNamespace(sound_tokenizer=_diffusers_tokenizer(ckpt)),
                                               latent).float()
    out = dec.decode(latent)
    assert out.dtype == torch.float32 and tuple(out.shape) == tuple(ref.shape) == (2, 10 * 1920)
    assert float(ref.std()) > 0 and out.abs().max() <= 1.0
    assert (out - ref).abs().max().item() <= TOL
    assert torch.equal(dec.decode(latent[None]), out)  # [1,64,Ts] accepted too


def test_weight_norms_are_folded_so_nothing_stays_behind_a_device_move(dec, ckpt):
    # diffusers' weight-norm hooks keep each conv's computed weight as a plain attribute, which Module.to leaves
    # where it is (on the GPU after a decode there, unseen by ComfyUI); folded, every tensor is a parameter
    reference = _diffusers_tokenizer(ckpt)
    plain = [k for m in reference.modules() for k, v in vars(m).items() if isinstance(v, torch.Tensor)]
    assert plain, "diffusers' tokenizer no longer keeps weight-norm weights as attributes: fold_weight_norm is moot"
    assert not [k for m in dec.modules() for k, v in vars(m).items() if isinstance(v, torch.Tensor)]
    assert not [n for n, _ in dec.named_parameters() if n.endswith(("_g", "_v"))]
    kept = sum(p.numel() for p in dec.parameters())
    assert kept < sum(p.numel() for p in reference.parameters())  # g and v become one weight
    latent = torch.randn(64, 6, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert torch.equal(dec.tokenizer.decode(latent[None]), reference.decode(latent[None]))


def test_trim_to_video_duration(dec):
    num_frames, fps = 9, 24.0
    ts = dec.sound_latent_length(num_frames, fps)
    n = dec.num_samples(num_frames, fps)
    assert (ts, n) == (10, 18000) == (_pipeline_latent_length(dec.tokenizer, num_frames, fps), 18000)
    latent = torch.randn(64, ts, generator=torch.Generator().manual_seed(1))
    full = dec.decode(latent)
    trimmed = dec.decode(latent, num_samples=n)
    assert tuple(trimmed.shape) == (2, n) and full.shape[1] == ts * 1920 > n
    assert torch.equal(trimmed, full[:, :n])


def test_latent_length_real_hop(dec):
    assert dec.hop == 1920 and dec.sampling_rate == 48000
    assert sound_latent_length(189, 24) == 197  # 7.875 s = 378000 samples / 1920 = 196.875
    assert sound_latent_length(189, 24, sampling_rate=48000, hop=1920) == 197
    assert dec.sound_latent_length(189, 24) == 197 == _pipeline_latent_length(dec.tokenizer, 189, 24)
    assert num_audio_samples(189, 24) == 378000
    for f, fps in [(1, 24), (121, 24), (93, 16), (189, 30), (5, 5)]:
        assert dec.sound_latent_length(f, fps) == _pipeline_latent_length(dec.tokenizer, f, fps)


def test_hop_from_config_without_weights(ckpt):
    cfg = read_sound_config(ckpt)
    assert hop_from_config(cfg) == 1920
    assert hop_from_config({"hop_size": 960, "dec_strides": [2, 4, 5, 6, 8]}) == 960
    assert read_sound_config(ckpt / "missing") is None


def test_missing_sound_tokenizer(tmp_path):
    with pytest.raises(FileNotFoundError, match="no sound_tokenizer/") as e:
        load_sound_decoder(tmp_path, torch.float32, "cpu")
    assert "unavailable" in str(e.value) and str(tmp_path / "sound_tokenizer") in str(e.value)


def test_bad_latent_rejected(dec):
    with pytest.raises(ValueError, match=r"\[64, Ts\]"):
        dec.decode(torch.zeros(48, 5))

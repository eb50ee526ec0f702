"""Cosmos3 sound decoding: AVAE latents ``[64, Ts]`` at 25 Hz -> 48 kHz stereo waveform.

Wraps diffusers 0.42.1 ``Cosmos3AVAEAudioTokenizer`` (models/autoencoders/autoencoder_cosmos3_audio.py; an
Oobleck-style decoder with hop = prod(dec_strides) = 2*4*5*6*8 = 1920 samples per latent step) and mirrors what
``Cosmos3OmniPipeline`` (pipelines/cosmos/pipeline_cosmos3_omni.py) does with it:

* sound latent length (``prepare_latents``): ``n = int(num_frames / fps * sampling_rate)``,
  ``Ts = ceil(n / hop)`` (integer ceil-division) -> 189 frames @ 24 fps = 7.875 s = 378000 samples -> 197.
* ``decode_sound``: ``sound_tokenizer.decode(latent[None].to(decoder dtype))`` -> ``clamp(-1, 1)`` ->
  ``[2, Ts * hop]``. The pipeline returns the full ``Ts * hop`` samples (slightly longer than the video);
  ``decode(..., num_samples=n)`` trims to the video duration.

The hop comes from the config exactly as the tokenizer computes its private ``_hop_size``: ``hop_size`` if set,
else the product of ``dec_strides``; it can therefore be read without loading any weights.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from .. import defaults

DEFAULT_SAMPLING_RATE = defaults.SOUND_SAMPLING_RATE
DEFAULT_HOP = 1920  # prod((2, 4, 5, 6, 8)), the released decoder strides


def hop_from_config(config) -> int:
    """Waveform samples per latent step, from a tokenizer config (dict or diffusers FrozenDict)."""
    hop = config.get("hop_size")
    return int(hop) if hop is not None else math.prod(config.get("dec_strides", (2, 4, 5, 6, 8)))


def num_audio_samples(num_frames: int, fps: float, sampling_rate: int = DEFAULT_SAMPLING_RATE) -> int:
    """Waveform length matching a video of ``num_frames`` at ``fps``: ``int(num_frames / fps * sampling_rate)``."""
    return int(num_frames / fps * sampling_rate)


def sound_latent_length(num_frames: int, fps: float, sampling_rate: int = DEFAULT_SAMPLING_RATE,
                        hop: int = DEFAULT_HOP) -> int:
    """Sound latent steps ``Ts = ceil(int(num_frames / fps * sampling_rate) / hop)`` (pipeline's prepare_latents)."""
    if num_frames < 1 or fps <= 0:
        raise ValueError(f"sound_latent_length: need num_frames >= 1 and fps > 0, got {num_frames} and {fps}.")
    n = num_audio_samples(num_frames, fps, sampling_rate)
    return (n + hop - 1) // hop


def read_sound_config(checkpoint_dir) -> dict | None:
    """``sound_tokenizer/config.json`` as a dict, or None when the checkpoint has no sound tokenizer (e.g. Edge)."""
    path = Path(checkpoint_dir) / "sound_tokenizer" / "config.json"
    return json.loads(path.read_text()) if path.is_file() else None


def load_sound_decoder(checkpoint_dir, dtype: torch.dtype = torch.float32, device="cpu") -> "Cosmos3SoundDecoder":
    """Load ``<checkpoint_dir>/sound_tokenizer`` (decoder weights suffice) from local files only."""
    from diffusers import Cosmos3AVAEAudioTokenizer

    sound_dir = Path(checkpoint_dir) / "sound_tokenizer"
    if not sound_dir.is_dir():
        raise FileNotFoundError(
            f"No sound tokenizer at {sound_dir}: this checkpoint has no sound_tokenizer/ folder, so sound "
            "generation is unavailable with it (e.g. Cosmos3-Edge has no sound head). Use a sound-capable "
            "checkpoint such as Cosmos3-Nano, or disable sound."
        )
    from ..model.loader import load_diffusers_folder

    module = load_diffusers_folder(Cosmos3AVAEAudioTokenizer, sound_dir, "sound tokenizer", dtype)
    return Cosmos3SoundDecoder(module).to(device=device).eval()


def fold_weight_norm(module: torch.nn.Module) -> int:
    """Replace every weight-norm hook in ``module`` by the weight it computes, as a parameter; returns how many.

    diffusers' AVAE convs use ``torch.nn.utils.weight_norm``: before each forward a hook computes ``weight = g·v/‖v‖``
    into a plain attribute, which ``Module.to`` does not move — after a decode on the GPU the computed weights stayed
    there (1.8 GiB for the released decoder, in float32) when the model manager moved the decoder back to the CPU,
    and the decode held both them and ``g``/``v``. Folded once (``remove_weight_norm``, the same ``g·v/‖v‖`` on the
    same tensors), the decode is unchanged and the weights are ordinary parameters, moved and counted like any."""
    from torch.nn.utils.weight_norm import WeightNorm

    folded = 0
    for m in module.modules():
        for hook in [h for h in m._forward_pre_hooks.values() if isinstance(h, WeightNorm)]:
            trainable = getattr(m, f"{hook.name}_v").requires_grad
            torch.nn.utils.remove_weight_norm(m, hook.name)
            getattr(m, hook.name).requires_grad_(trainable)
            folded += 1
    return folded


class Cosmos3SoundDecoder(torch.nn.Module):
    """``Cosmos3AVAEAudioTokenizer`` decode with the pipeline's dtype handling and optional trimming. The
    tokenizer's weight norms are folded into its weights (``fold_weight_norm``; in place, at the dtype it has)."""

    def __init__(self, tokenizer: torch.nn.Module):
        super().__init__()
        fold_weight_norm(tokenizer)
        self.tokenizer = tokenizer
        self.sampling_rate = int(tokenizer.config.sampling_rate)
        self.hop = hop_from_config(tokenizer.config)
        self.latent_channels = int(tokenizer.config.vocoder_input_dim)

    @property
    def dtype(self) -> torch.dtype:
        return next(self.tokenizer.decoder.parameters()).dtype

    @property
    def device(self) -> torch.device:
        return next(self.tokenizer.decoder.parameters()).device

    def sound_latent_length(self, num_frames: int, fps: float) -> int:
        """``Ts`` for a video of ``num_frames`` at ``fps`` with this tokenizer's rate and hop."""
        return sound_latent_length(num_frames, fps, self.sampling_rate, self.hop)

    def num_samples(self, num_frames: int, fps: float) -> int:
        """Waveform samples covering exactly the video duration (the ``num_samples`` to trim to)."""
        return num_audio_samples(num_frames, fps, self.sampling_rate)

    @torch.no_grad()
    def decode(self, latent: torch.Tensor, num_samples: int | None = None) -> torch.Tensor:
        """Latent ``[64, Ts]`` or ``[1, 64, Ts]`` -> waveform float32 ``[2, N]`` in [-1, 1] on the decoder device.

        ``N = Ts * hop`` (what the pipeline returns) or ``min(num_samples, Ts * hop)`` when ``num_samples`` is given.
        """
        if latent.ndim == 3:
            if latent.shape[0] != 1:
                raise ValueError(f"Cosmos3SoundDecoder.decode: batch must be 1, got latent {tuple(latent.shape)}.")
            latent = latent[0]
        if latent.ndim != 2 or latent.shape[0] != self.latent_channels:
            raise ValueError(
                f"Cosmos3SoundDecoder.decode: latent must be [{self.latent_channels}, Ts] or "
                f"[1, {self.latent_channels}, Ts], got {tuple(latent.shape)}."
            )
        if num_samples is not None and num_samples < 0:
            raise ValueError(f"Cosmos3SoundDecoder.decode: num_samples must be >= 0, got {num_samples}.")
        z = latent.unsqueeze(0).to(device=self.device, dtype=self.dtype)  # [1, C, Ts]
        wave = self.tokenizer.decode(z)[0].float()  # [audio_ch, Ts * hop], already clamped to [-1, 1]
        if num_samples is not None:
            wave = wave[:, :num_samples]
        return wave

"""Cosmos3VAEDecode (LATENT → IMAGE frames) and Cosmos3AudioDecode (sound latent → AUDIO)."""

from __future__ import annotations

import torch

import comfy.model_management as mm
import comfy.utils
from comfy_api.latest import io

from ..cosmos3_core import defaults
from .types import CATEGORY, Cosmos3Model, Cosmos3Sound


class Cosmos3VAEDecode(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="Cosmos3VAEDecode",
            display_name="Cosmos3 VAE Decode",
            category=CATEGORY,
            description="Wan2.2 VAE decode in temporal chunks (bounded memory at any clip length).",
            inputs=[
                Cosmos3Model.Input("model"),
                io.Latent.Input("samples"),
                io.Int.Input("chunk_latent_frames", default=1, min=1, max=64,
                             tooltip="Latent frames decoded per chunk (4 video frames each); more = more memory."),
                io.Boolean.Input("tiled", default=False, tooltip="Also tile spatially (for small GPUs at 720p)."),
            ],
            outputs=[io.Image.Output(display_name="images")],
        )

    @classmethod
    def execute(cls, model, samples: dict, chunk_latent_frames: int = 1, tiled: bool = False) -> io.NodeOutput:
        latents = samples.get("samples") if isinstance(samples, dict) else None
        if not isinstance(latents, torch.Tensor) or latents.ndim != 5 or latents.shape[1] != defaults.LATENT_CHANNELS:
            shape = tuple(latents.shape) if isinstance(latents, torch.Tensor) else None
            raise ValueError(
                f"Cosmos3VAEDecode: samples has shape {shape}; expected a Wan2.2 video latent "
                f"[batch, {defaults.LATENT_CHANNELS}, T, h, w] "
                "(connect the Cosmos3 sampler's latent)."
            )
        pipe = model.pipeline
        model.load_vae(latents[:1].shape)
        bar = comfy.utils.ProgressBar(latents.shape[0] * latents.shape[2])

        def on_chunk(done: int, total: int) -> None:
            mm.throw_exception_if_processing_interrupted()
            bar.update_absolute(done, total)

        frames = pipe.decode_video(pipe.vae.normalize(latents), chunk_latent_frames=chunk_latent_frames, tile=tiled,
                                   on_chunk=on_chunk, out_device=mm.intermediate_device())
        return io.NodeOutput(frames)


class Cosmos3AudioDecode(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="Cosmos3AudioDecode",
            display_name="Cosmos3 Audio Decode",
            category=CATEGORY,
            description="Sound latent → 48 kHz stereo waveform trimmed to the clip's duration.",
            inputs=[Cosmos3Model.Input("model"), Cosmos3Sound.Input("sound")],
            outputs=[io.Audio.Output(display_name="audio")],
        )

    @classmethod
    def execute(cls, model, sound) -> io.NodeOutput:
        if sound is None:
            raise ValueError("Cosmos3AudioDecode: the sampler produced no sound; set sound=true on "
                             "KSampler UniPC (Dual Tower).")
        pipe = model.pipeline
        if pipe.sound_decoder is None:
            raise ValueError(f"Cosmos3AudioDecode: checkpoint {model.name!r} has no sound_tokenizer/.")
        model.load_sound_decoder()
        waveform = pipe.decode_sound(sound.latent, sound.num_frames, sound.fps)
        return io.NodeOutput({"waveform": waveform.to(mm.intermediate_device()),  # [batch, 2, samples]
                              "sample_rate": pipe.sound_decoder.sampling_rate})

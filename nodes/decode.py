"""Cosmos3VAEDecode (LATENT → IMAGE frames) and Cosmos3AudioDecode (sound latent → AUDIO)."""

from __future__ import annotations

import comfy.model_management as mm
import comfy.utils
import torch
from comfy_api.latest import io

from ..cosmos3_core import defaults
from ..cosmos3_core.checks import check_options
from ..cosmos3_core.runtime import RuntimeOptions
from .errors import node_errors
from .types import CATEGORY, Cosmos3Model, Cosmos3Sound, compile_input


class Cosmos3VAEDecode(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="Cosmos3VAEDecode",
            display_name="Cosmos3 VAE Decode",
            category=CATEGORY,
            description="Wan2.2 VAE decode in temporal chunks (bounded memory at any clip length).",
            inputs=[
                Cosmos3Model.Input("model", tooltip="The loaded checkpoint (its Wan2.2 VAE decodes)."),
                io.Latent.Input("samples", tooltip="The sampler's latent."),
                io.Int.Input("chunk_latent_frames", default=1, min=1, max=64,
                             tooltip="Latent frames decoded per chunk (4 video frames each); more = more memory."),
                io.Boolean.Input("tiled", default=False, tooltip="Also tile spatially (for small GPUs at 720p)."),
                compile_input("the decoder's per-frame step (a one-off compile, about a minute, that serves every "
                              "resolution and is kept on disk; auto uses it once on disk; bf16 rounding differs "
                              "slightly from eager)"),
            ],
            outputs=[io.Image.Output(display_name="images", tooltip="Decoded frames (one image for text-to-image); "
                                                               "feed Create Video or Save Image.")],
        )

    @classmethod
    def execute(cls, model, samples: dict, chunk_latent_frames: int = 1, tiled: bool = False,
                compile: str = "auto") -> io.NodeOutput:
        latents = samples.get("samples") if isinstance(samples, dict) else None
        if not isinstance(latents, torch.Tensor) or latents.ndim != 5 or latents.shape[1] != defaults.LATENT_CHANNELS:
            shape = tuple(latents.shape) if isinstance(latents, torch.Tensor) else None
            raise ValueError(
                f"Cosmos3VAEDecode: samples has shape {shape}; expected a Wan2.2 video latent "
                f"[batch, {defaults.LATENT_CHANNELS}, T, h, w] "
                "(connect the Cosmos3 sampler's latent)."
            )
        options = RuntimeOptions(compile=compile)
        with node_errors("Cosmos3VAEDecode"):
            check_options(options)
        pipe = model.pipeline
        model.load_vae(latents[:1].shape)
        bar = comfy.utils.ProgressBar(latents.shape[0] * latents.shape[2])

        def on_chunk(done: int, total: int) -> None:
            mm.throw_exception_if_processing_interrupted()
            bar.update_absolute(done, total)

        frames = pipe.decode_video(pipe.vae.normalize(latents), chunk_latent_frames=chunk_latent_frames,
                                   tile=tiled or None, on_chunk=on_chunk, out_device=mm.intermediate_device(),
                                   options=options)
        return io.NodeOutput(frames)


class Cosmos3AudioDecode(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="Cosmos3AudioDecode",
            display_name="Cosmos3 Audio Decode",
            category=CATEGORY,
            description="Sound latent → 48 kHz stereo waveform trimmed to the clip's duration.",
            inputs=[Cosmos3Model.Input("model", tooltip="The loaded checkpoint (its sound decoder runs)."),
                    Cosmos3Sound.Input("sound", tooltip="The sampler's sound output (sound must be on).")],
            outputs=[io.Audio.Output(display_name="audio", tooltip="48 kHz stereo; feed Create Video's audio.")],
            hidden=[io.Hidden.prompt, io.Hidden.unique_id],
        )

    @classmethod
    def fingerprint_inputs(cls, **kwargs):
        # The fps check below reads CreateVideo's fps from the graph, which is no part of this node's cache key:
        # NaN (never equal) makes ComfyUI run this cheap decode on every queue so the check always runs.
        return float("nan")

    @classmethod
    def execute(cls, model, sound) -> io.NodeOutput:
        pipe = model.pipeline
        with node_errors("Cosmos3AudioDecode"):
            if sound is None:
                raise ValueError("the sampler produced no sound; set sound=true on Cosmos3 KSampler UniPC (Dual "
                                 "Tower).")
            _check_create_video_fps(cls.hidden.prompt, cls.hidden.unique_id, sound.fps)
            if pipe.sound_decoder is None:
                raise ValueError(f"checkpoint {model.name!r} has no sound_tokenizer/.")
        model.load_sound_decoder()
        waveform = pipe.decode_sound(sound.latent, sound.num_frames, sound.fps)
        return io.NodeOutput({"waveform": waveform.to(mm.intermediate_device()),  # [batch, 2, samples]
                              "sample_rate": pipe.sound_decoder.sampling_rate})


def _check_create_video_fps(prompt: dict | None, node_id: str | None, fps: float) -> None:
    """A CreateVideo that takes this node's audio must play the frames at the fps the sound was generated for
    (Text Encode's), else the mp4's sound covers only part of the video (or runs past it). Reads the fps that
    CreateVideo will use from the graph: a number, or a Primitive node's value (other sources are not known yet)."""
    for other_id, node in (prompt or {}).items():
        inputs = node.get("inputs", {}) if isinstance(node, dict) else {}
        audio = inputs.get("audio")
        if node.get("class_type") != "CreateVideo" or not (isinstance(audio, list) and str(audio[0]) == str(node_id)):
            continue
        value = inputs.get("fps")
        if isinstance(value, list):  # linked: follow it into a Primitive node
            source = prompt.get(str(value[0]), {})
            primitive = source.get("class_type", "").startswith("Primitive")
            value = source.get("inputs", {}).get("value") if primitive else None
        if isinstance(value, (int, float)) and not isinstance(value, bool) and abs(float(value) - fps) > 1e-3 * fps:
            raise ValueError(
                f"Cosmos3AudioDecode: CreateVideo (node {other_id}) plays the frames at {float(value):g} fps, but the "
                f"sound was generated for {fps:g} fps (Cosmos3 Text Encode), so the sound would last "
                f"{float(value) / fps:.0%} of the video. Set CreateVideo's fps to {fps:g}, or set Text Encode's fps "
                f"to {float(value):g} and generate again."
            )

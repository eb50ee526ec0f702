"""One clip: text/image/video to an image or a video (with sound on Nano/Super) — diffusers 0.42.1
``Cosmos3OmniPipeline.__call__`` end to end, over the pipeline's stages.

``generate_clip(pipe, run)`` takes a resolved request (``request.Resolved``, mode ``clip``): it encodes both
prompts (the text tower once per distinct prompt), encodes the conditioning image/video, plans, runs the loop and
decodes. It decides nothing: every default and check was settled by ``request.resolve``.
"""

from __future__ import annotations

from ..pipeline import Cosmos3Pipeline, GenerationOutput, timed
from ..sampling.loop import StepCallback


def generate_clip(pipe: Cosmos3Pipeline, run, callback: StepCallback | None = None,
                  decode: bool = True) -> GenerationOutput:
    """The clip of ``run``; ``decode=False`` leaves ``frames``/``waveform`` to the caller (the CLI decodes while it
    encodes the mp4)."""
    timings: dict[str, float] = {}
    with timed(timings, "preprocess"):
        text = pipe.encode_text(run.prompt, run.negative_prompt, num_frames=run.num_frames, height=run.height,
                                width=run.width, fps=run.fps, use_system_prompt=run.use_system_prompt,
                                options=run.options)
        x0, clean = pipe.encode_condition(text, image=run.image, video=run.video,
                                          condition_latent_frames=run.condition_latent_frames, keep=run.keep)
        plan = pipe.plan(text, run.sampling, x0=x0, clean_frames=clean, options=run.options)
    return pipe.run_and_decode(plan, timings, run.num_frames, run.fps, callback=callback, decode=decode)

"""One clip: text/image/video to an image or a video (with sound on Nano/Super) — diffusers 0.42.1
``Cosmos3OmniPipeline.__call__`` end to end, over the pipeline's stages.

``generate_clip(pipe, resolved)`` takes a resolved request (``request.Resolved``, mode ``clip``): it encodes both
prompts (the text tower once per distinct prompt), encodes the conditioning image/video, plans, runs the loop and
decodes. It decides nothing: every default and check was settled by ``resolve.resolve``.
"""

from __future__ import annotations

from ..pipeline import Cosmos3Pipeline, GenerationOutput, timed
from ..request import Resolved
from ..sampling.loop import StepCallback


def generate_clip(pipe: Cosmos3Pipeline, resolved: Resolved, callback: StepCallback | None = None,
                  decode: bool = True) -> GenerationOutput:
    """The clip of ``resolved``; ``decode=False`` leaves ``frames``/``waveform`` to the caller (the CLI decodes while
    it encodes the mp4)."""
    r, timings = resolved, {}
    with timed(timings, "preprocess"):
        text = pipe.encode_text(r.prompt, r.negative_prompt, num_frames=r.num_frames, height=r.height, width=r.width,
                                fps=r.fps, use_system_prompt=r.use_system_prompt, options=r.options)
        x0, clean = pipe.encode_condition(text, image=r.image, video=r.video,
                                          condition_latent_frames=r.condition_latent_frames, keep=r.keep)
        plan = pipe.plan(text, r.sampling, x0=x0, clean_frames=clean, options=r.options)
    return pipe.run_and_decode(plan, timings, r.num_frames, r.fps, callback=callback, decode=decode)

"""One generation on every rank of a ``cfg`` × ``ulysses`` mesh: the pipeline's stages with the parallel pieces.

Mirrors ``Cosmos3Pipeline.generate`` stage by stage; only three things differ:

1. text: each rank tokenizes both prompts (cheap, the layout needs both lengths) but runs the text tower only for
   the branch it denoises, and keeps only its heads of that K/V (``ParallelDenoiser.local_text``);
2. sampling: the pipeline's plan, run with a ``ParallelDenoiser`` in place of the model;
3. decode: the tiled VAE decode spread over all ranks (``vae.decode_parallel``); the sound decode (small) runs on
   every rank.

Every rank returns the same ``GenerationOutput``; the caller writes files on rank 0 only.
"""

from __future__ import annotations

import dataclasses

import time

import torch

from ..pipeline import Cosmos3Pipeline, GenerationOutput, GenerationRequest, TextConditioning
from ..sampling.loop import StepCallback
from .denoiser import ParallelDenoiser
from .mesh import ParallelMesh
from .vae import decode_parallel


def encode_text_local(pipe: Cosmos3Pipeline, denoiser: ParallelDenoiser, request: GenerationRequest) -> TextConditioning:
    r = request
    ids = pipe.tokenize(r.prompt, r.negative_prompt, num_frames=r.num_frames, height=r.height, width=r.width,
                        fps=r.fps, use_system_prompt=r.use_system_prompt)
    cond = denoiser.local_text(0, ids.cond, pipe._prefill)
    uncond = denoiser.local_text(1, ids.uncond, pipe._prefill) if r.guidance != 1.0 else None
    return TextConditioning(cond, uncond, r.num_frames, r.height, r.width, float(r.fps), ids.cond_text,
                            ids.uncond_text)


def generate(
    pipe: Cosmos3Pipeline,
    request: GenerationRequest,
    mesh: ParallelMesh,
    *,
    callback: StepCallback | None = None,
    decode: bool = True,
    tile_sample_size: int | None = None,
    tile_sample_stride: int | None = None,
) -> GenerationOutput:
    """``Cosmos3Pipeline.generate`` on this rank (the same stages, checks and plan)."""
    r = request
    r.check()
    if r.guidance is None:  # the checkpoint's default (1 for a distilled checkpoint), decided before the branches
        r = dataclasses.replace(r, guidance=pipe.default_guidance)
    if mesh.cfg == 2 and r.guidance == 1.0:
        raise ValueError("--cfg-parallel: guidance 1 runs one branch; drop --cfg-parallel or set a guidance above 1.")
    denoiser = ParallelDenoiser(pipe.transformer, mesh)
    timings: dict[str, float] = {}
    start = _now()
    text = encode_text_local(pipe, denoiser, r)
    x0, clean = pipe.encode_condition(text, image=r.image, video=r.video,
                                      condition_latent_frames=r.condition_latent_frames, keep=r.keep)
    plan = pipe.plan(text, seed=r.seed, steps=r.steps, guidance=r.guidance, schedule=r.schedule, shift=r.shift,
                     sound=r.sound, x0=x0, clean_frames=clean, guidance_interval=r.guidance_interval, who="generate")
    timings["preprocess"] = _now() - start
    start = _now()
    result = pipe.run(plan, callback=callback, compile=r.compile, denoiser=denoiser)
    timings["inference"] = _now() - start
    frames = waveform = None
    sound = None if result.sound is None else result.sound[0]  # one item: a request has no batch
    if decode:
        start = _now()
        frames = decode_parallel(pipe.vae, result.latents, tile_sample_size=tile_sample_size,
                                 tile_sample_stride=tile_sample_stride)
        if sound is not None:
            waveform = pipe.decode_sound(sound, r.num_frames, r.fps)
        timings["decode"] = _now() - start
    action = None if result.action is None else result.action[0]
    return GenerationOutput(result.latents, sound, frames, waveform, timings, action)


def _now() -> float:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter()

"""One generation on every rank of a ``cfg`` × ``ulysses`` × ``tp`` mesh: the pipeline's stages with the parallel
pieces.

Mirrors ``modes.clip.generate_clip`` stage by stage; only three things differ:

1. text: each rank tokenizes both prompts (cheap, the layout needs both lengths) but runs the text tower only for
   the branch it denoises, and keeps only its heads of that K/V (``ParallelDenoiser.local_text``);
2. sampling: the pipeline's plan, run with a ``ParallelDenoiser`` in place of the model;
3. decode: the tiled VAE decode spread over all ranks (``vae.decode_parallel``); the sound decode (small) runs on
   every rank.

Every rank returns the same ``GenerationOutput``; the caller writes files on rank 0 only.
"""

from __future__ import annotations

import time

import torch

from ..model.text_kv import TextConditioning
from ..pipeline import Cosmos3Pipeline, GenerationOutput
from ..request import Resolved
from ..sampling.loop import StepCallback
from .denoiser import ParallelDenoiser
from .mesh import ParallelMesh
from .vae import decode_parallel


def check_fast_modes(resolved: Resolved) -> None:
    """The fast modes a parallel run cannot take yet, refused before any load: SeaCache (its contexts live with the
    whole batch of branches on one device, and a skipped layer stack must be skipped by every rank alike) and FP8
    W8A8 steps (each rank holds its own share of the text K/V, which those steps would need recomputed in their
    own precision)."""
    if resolved.sampling.sea_cache is not None:
        raise ValueError("sea_cache: SeaCache runs on one GPU; --cfg-parallel / --ulysses / --tp do not take it yet — "
                         "drop --sea-cache or the parallel flags.")
    policy = resolved.sampling.mixed_precision
    if policy is not None and any(name != "W8A16" for name in policy.schedule(resolved.sampling.steps)):
        raise ValueError("this FP8 checkpoint's W8A8 steps do not run under --cfg-parallel / --ulysses / --tp yet "
                         "(each rank keeps its share of the text K/V, which a W8A8 step would recompute); run it on "
                         "one GPU, or load a bf16 checkpoint for the parallel run.")


def encode_text_local(pipe: Cosmos3Pipeline, denoiser: ParallelDenoiser, resolved: Resolved) -> TextConditioning:
    r = resolved
    ids = pipe.tokenize(r.prompt, r.negative_prompt, num_frames=r.num_frames, height=r.height, width=r.width,
                        fps=r.fps, use_system_prompt=r.use_system_prompt)
    prefill = lambda token_ids: pipe.prefill(token_ids, resolved.options)  # noqa: E731
    cond = denoiser.local_text(0, ids.cond, prefill)
    uncond = denoiser.local_text(1, ids.uncond, prefill) if resolved.sampling.use_cfg else None
    return TextConditioning(cond, uncond, r.num_frames, r.height, r.width, float(r.fps), ids.cond_text,
                            ids.uncond_text)


def generate(
    pipe: Cosmos3Pipeline,
    resolved: Resolved,
    mesh: ParallelMesh,
    *,
    callback: StepCallback | None = None,
    decode: bool = True,
    tile_sample_size: int | None = None,
    tile_sample_stride: int | None = None,
) -> GenerationOutput:
    """``modes.clip.generate_clip`` of the resolved request (``request.Resolved``, mode ``clip``) on this
    rank: the same stages and plan, with the parallel pieces."""
    if resolved.mode != "clip":
        raise ValueError(f"--cfg-parallel / --ulysses run one clip; the {resolved.mode} mode is not parallel that way "
                         "(under --tp alone every rank runs the mode itself on its shard) — drop them.")
    check_fast_modes(resolved)
    if mesh.cfg == 2 and not resolved.sampling.use_cfg:
        raise ValueError("--cfg-parallel: guidance 1 runs one branch; drop --cfg-parallel or set a guidance above 1.")
    denoiser = ParallelDenoiser(pipe.transformer, mesh)
    timings: dict[str, float] = {}
    start = _now()
    text = encode_text_local(pipe, denoiser, resolved)
    x0, clean = pipe.encode_condition(text, image=resolved.image, video=resolved.video,
                                      condition_latent_frames=resolved.condition_latent_frames, keep=resolved.keep)
    plan = pipe.plan(text, resolved.sampling, x0=x0, clean_frames=clean, options=resolved.options)
    timings["preprocess"] = _now() - start
    start = _now()
    result = pipe.run(plan, callback=callback, denoiser=denoiser)
    timings["inference"] = _now() - start
    frames = waveform = None
    sound = None if result.sound is None else result.sound[0]  # one item: a request has no batch
    if decode:
        start = _now()
        frames = decode_parallel(pipe.vae, result.latents, tile_sample_size=tile_sample_size,
                                 tile_sample_stride=tile_sample_stride)
        if sound is not None:
            waveform = pipe.decode_sound(sound, resolved.num_frames, resolved.fps)
        timings["decode"] = _now() - start
    action = None if result.action is None else result.action[0]
    return GenerationOutput(result.latents, sound, frames, waveform, timings, action)


def _now() -> float:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter()

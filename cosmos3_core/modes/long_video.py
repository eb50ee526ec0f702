"""Long video: generation past one clip as a chain of windows, each a ``SamplePlan``, decoded as a stream.

Two modes share one chunk geometry and one tail seeding (windows.py, mirroring diffusers 0.42.1 modular Cosmos3
Transfer's chunk loop ``Cosmos3TransferChunkDenoiseStep``):

* **Transfer** (``controls`` given): every window is steered by its slice of the control videos (transfer.py);
  this is the reference's chunk loop, tested against it chunk by chunk.
* **Windowed text/image-to-video** (no controls; diffusers has no reference for it): every window is an ordinary
  T2V/I2V plan of ``frames_per_chunk`` frames (``Cosmos3Pipeline.plan``) whose first latent frames are clean — the
  previous window's decoded tail, encoded — exactly as Transfer seeds its chunks. Window 0 is today's single-clip
  generation (text, or an image for I2V). The prompt templates describe one window; each distinct prompt's text K/V
  is computed once and every window reuses it (``prompts`` may give one prompt per window).

One CPU generator seeded once draws every window's noise in order (as the reference's chunk loop does), so window 0
equals a single-clip run with the same seed. Each window is decoded as soon as it is denoised and handed to the
sinks (stream_decode.py); only the last decoded tail is kept, so memory does not grow with the video's length.

Sound (windowed T2V/I2V with ``sound``): each window generates its own sound track with its frames; the model has
no clean-sound conditioning (nor does the reference), so a window's sound does not continue the previous one's —
the tracks are cut at the window seams like the frames (the overlap dropped). Transfer generates no sound.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from ..model.text_kv import TextConditioning, TextKV
from ..pipeline import Cosmos3Pipeline
from ..request import Resolved, WindowGeometry
from ..runtime import RuntimeOptions
from ..sampling.conditioning import preprocess_image, preprocess_video
from ..sampling.plan import PlanInputs, Prepare, SamplePlan, no_prepare
from .stream_decode import Sink, StreamDecoder
from .transfer import control_latents, make_transfer_plan, pad_controls, transfer_prompt_ids
from .windows import clean_latent_frames, seed_pixels

# progress(window, num_windows, step, steps, x0_preview)
WindowProgress = Callable[[int, int, int, int, torch.Tensor], None]
LatentSink = Callable[[int, torch.Tensor], None]


@dataclass
class LongVideoResult:
    geometry: WindowGeometry
    frames_written: int
    timings: dict[str, list[float]] = field(default_factory=dict)  # per window: "denoise", "decode"


class _TextCache:
    """Text K/V per distinct token-id list, and one ``TextConditioning`` per distinct prompt pair, which keeps the
    pair's K/V in other FP8 modes for every window (one run, one model): the text tower runs once per distinct
    prompt of the whole video, and once per distinct pair and FP8 mode."""

    def __init__(self, pipe: Cosmos3Pipeline, prepare: Prepare, options: RuntimeOptions):
        self.pipe, self.prepare, self.options, self.cache, self.pairs = pipe, prepare, options, {}, {}

    def __call__(self, ids: list[int]) -> TextKV:
        key = tuple(ids)
        if key not in self.cache:
            self.prepare("text", len(ids))
            self.cache[key] = self.pipe.prefill(ids, self.options)
        return self.cache[key]

    def conditioning(self, cond: list[int], uncond: list[int] | None, r: Resolved, *texts: str) -> TextConditioning:
        """The pair's conditioning for a window of ``r`` (``texts``: the prompts as words, for the log)."""
        key = (tuple(cond), None if uncond is None else tuple(uncond))
        if key not in self.pairs:
            self.pairs[key] = TextConditioning(self(cond), None if uncond is None else self(uncond),
                                               r.windows.chunk_frames, r.height, r.width, float(r.fps), *texts,
                                               in_precision={})
        return self.pairs[key]


@dataclass
class _Windows:
    """What every window of one long-video run shares."""

    pipe: Cosmos3Pipeline
    resolved: Resolved
    text_kv: _TextCache
    latent_shape: tuple[int, ...]
    device: torch.device
    generator: torch.Generator  # one CPU generator, seeded once, draws every window's noise in order
    controls: dict | None  # Transfer: the control clips, padded to whole windows
    prompts: list[str]  # one per window


def generate_long(
    pipe: Cosmos3Pipeline, resolved: Resolved, sinks: Sequence[Sink] = (), *,
    progress: WindowProgress | None = None, latents_sink: LatentSink | None = None,
    device: torch.device | str | None = None, prepare: Prepare = no_prepare, **decode_kwargs,
) -> LongVideoResult:
    """Generate ``resolved`` (mode ``windows`` or ``transfer``) window by window; every window's new frames (and
    sound) go to ``sinks`` once decoded.

    ``progress(window, windows, step, steps, preview)`` runs after every step (it may raise to cancel: the windows
    already handed to the sinks stay there); ``latents_sink(window, latents)`` receives each window's final
    normalized latent ``[1, 48, T, h, w]``."""
    geometry, options = resolved.windows, resolved.options
    w = _Windows(pipe, resolved, _TextCache(pipe, prepare, options),
                 tuple(pipe.vae.latent_shape(geometry.chunk_frames, resolved.height, resolved.width)),
                 torch.device(device) if device is not None else pipe.transformer.device,
                 torch.Generator("cpu").manual_seed(int(resolved.sampling.seed)),
                 pad_controls(resolved.controls, geometry) if resolved.controls is not None else None,
                 list(resolved.prompts) * (geometry.num_windows if len(resolved.prompts) == 1 else 1))
    first_seed = (preprocess_video(resolved.video, resolved.height, resolved.width)
                  if resolved.video is not None else None)
    decode_kwargs.setdefault("compile", options.on(pipe.vae.device).vae_compile)
    decode_kwargs.setdefault("compile_backend", options.compile_backend)
    decoder = StreamDecoder(pipe.vae, geometry, sinks, fps=resolved.fps, **decode_kwargs)
    timings: dict[str, list[float]] = {"denoise": [], "decode": []}

    for k in range(geometry.num_windows):
        start = time.perf_counter()
        prepare("vae", w.latent_shape)
        x0, clean = _window_seed(w, k, decoder.tail if k > 0 else first_seed)

        def on_step(step: int, total: int, preview, _k=k) -> None:
            if progress is not None:
                progress(_k, geometry.num_windows, step, total, preview)

        plan = _transfer_plan(w, k, x0, clean) if w.controls is not None else _window_plan(w, k, x0, clean)
        prepare("generation", plan)
        result = pipe.run(plan, callback=on_step)
        timings["denoise"].append(time.perf_counter() - start)
        start = time.perf_counter()
        if latents_sink is not None:
            latents_sink(k, result.latents)
        waveform = None
        if result.sound is not None:
            prepare("sound", None)
            waveform = pipe.decode_sound(result.sound[0], geometry.chunk_frames, resolved.fps)  # one item
        prepare("vae", w.latent_shape)
        decoder.commit(k, result.latents, waveform)
        timings["decode"].append(time.perf_counter() - start)
    return LongVideoResult(geometry, decoder.frames_done, timings)


def _window_seed(w: _Windows, k: int, source: torch.Tensor | None) -> tuple[torch.Tensor | None, list[int]]:
    """Clean latents of window ``k``'s seed: the previous window's decoded tail (``source``), or for window 0 the
    optional image (latent 0) or the first frames of the optional video."""
    r = w.resolved
    if k == 0 and r.image is not None:
        return w.pipe.vae.encode(preprocess_image(r.image, r.height, r.width).unsqueeze(2)), [0]
    pixels, n = seed_pixels(source, r.windows.conditional_frames, from_end=k > 0)
    return (None if pixels is None else w.pipe.vae.encode(pixels)), clean_latent_frames(n)


def _window_plan(w: _Windows, k: int, x0, clean: list[int]) -> SamplePlan:
    """Window ``k`` of a windowed text/image-to-video: an ordinary clip plan whose first latent frames are clean."""
    r, pipe, chunk = w.resolved, w.pipe, w.resolved.windows.chunk_frames
    ids = pipe.tokenize(w.prompts[k], r.negative_prompt, num_frames=chunk, height=r.height, width=r.width,
                        fps=r.fps, use_system_prompt=r.use_system_prompt)
    text = w.text_kv.conditioning(ids.cond, ids.uncond if r.sampling.use_cfg else None, r, ids.cond_text,
                                  ids.uncond_text)
    return pipe.plan(text, r.sampling, generator=w.generator, x0=x0, clean_frames=clean, device=w.device,
                     options=r.options, prepare=w.text_kv.prepare)


def _transfer_plan(w: _Windows, k: int, x0, clean: list[int]) -> SamplePlan:
    """Window ``k`` of a Transfer video: the reference's chunk, steered by its slice of the control videos."""
    r, pipe, sampling, options = w.resolved, w.pipe, w.resolved.sampling, w.resolved.options
    ids = transfer_prompt_ids(pipe.tokenizer, w.prompts[k], r.negative_prompt, use_system_prompt=r.use_system_prompt)
    text = w.text_kv.conditioning(ids.cond, ids.uncond, r)
    # Cosmos3TransferSetTimestepsStep sets the scheduler's own timesteps: a checkpoint's use_native_flow_schedule
    # does not reach Transfer in the reference (diffusers 0.42.1 modular_pipelines/cosmos/before_denoise.py)
    stepper = pipe.stepper(sampling, native_flow_schedule=False)
    inputs = PlanInputs(text.cond, text.uncond, w.latent_shape, r.fps, stepper, sampling.guidance, options,
                        guidance_interval=sampling.guidance_interval, x0=x0, clean_frames=tuple(clean),
                        device=w.device, dtype=pipe.transformer.dtype,
                        fast=pipe.fast_modes(text, sampling, len(stepper.timesteps), w.device, options,
                                             w.text_kv.prepare))
    plan = make_transfer_plan(pipe.config, inputs, prefix=control_latents(pipe.vae, w.controls, r.windows, k),
                              generator=w.generator, control_guidance=r.control_guidance,
                              control_guidance_interval=r.control_guidance_interval)
    pipe.check_memory(plan.memory_required, plan.num_tokens, plan.device)
    return plan


def stopped_writing(error, geometry: WindowGeometry) -> str:
    """What a streamed write the disk refused (``media.OutputError`` from a ``fragmented`` ``VideoWriter`` sink)
    left of a windowed video, in a sentence: the run stopped at that write, the file keeps its whole fragments."""
    kept = error.frames_kept
    if kept:
        whole = geometry.windows_within(kept)
        left = (f"{error.path.name} keeps the first {kept} of {geometry.total_frames} frames ({whole} of "
                f"{geometry.num_windows} windows whole) and plays")
    else:
        left = "no window reached the disk whole, so no file was left"
    return f"{error.cause}: generation stopped at the first failed write; {left}; {error.fix}."

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
from typing import Any, Callable, Sequence

import torch

from ..model.text_kv import TextConditioning, TextKV
from ..pipeline import Cosmos3Pipeline
from ..sampling.conditioning import preprocess_image, preprocess_video
from ..sampling.schedulers import make_scheduler, make_stepper
from .stream_decode import Sink, StreamDecoder
from .transfer import control_latents, make_transfer_plan, pad_controls, transfer_prompt_ids
from .windows import WindowGeometry, clean_latent_frames, seed_pixels

# progress(window, num_windows, step, steps, x0_preview)
WindowProgress = Callable[[int, int, int, int, torch.Tensor], None]
LatentSink = Callable[[int, torch.Tensor], None]
# prepare(part, need) before each use of a model part: ("text", token count), ("generation", plan),
# ("vae", latent shape), ("sound", None) — a model manager loads the part there (ComfyUI); default: nothing
Prepare = Callable[[str, Any], None]


def _no_prepare(part: str, need: Any) -> None:
    return None


@dataclass
class LongVideoResult:
    geometry: WindowGeometry
    frames_written: int
    timings: dict[str, list[float]] = field(default_factory=dict)  # per window: "denoise", "decode"


class _TextCache:
    """Text K/V per distinct token-id list: the text tower runs once per distinct prompt of the whole video."""

    def __init__(self, pipe: Cosmos3Pipeline, prepare: Prepare, options):
        self.pipe, self.prepare, self.options, self.cache = pipe, prepare, options, {}

    def __call__(self, ids: list[int]) -> TextKV:
        key = tuple(ids)
        if key not in self.cache:
            self.prepare("text", len(ids))
            self.cache[key] = self.pipe.prefill(ids, self.options)
        return self.cache[key]


def generate_long(
    pipe: Cosmos3Pipeline, run, sinks: Sequence[Sink] = (), *, progress: WindowProgress | None = None,
    latents_sink: LatentSink | None = None, device: torch.device | str | None = None,
    prepare: Prepare = _no_prepare, **decode_kwargs,
) -> LongVideoResult:
    """Generate the resolved request ``run`` (``request.Resolved``, mode ``windows`` or ``transfer``) window by
    window; every window's new frames (and sound) go to ``sinks`` once decoded.

    ``progress(window, windows, step, steps, preview)`` runs after every step (it may raise to cancel: the windows
    already handed to the sinks stay there); ``latents_sink(window, latents)`` receives each window's final
    normalized latent ``[1, 48, T, h, w]``."""
    geometry, sampling, options = run.windows, run.sampling, run.options
    device = torch.device(device) if device is not None else pipe.transformer.device
    prompts = list(run.prompts) * (geometry.num_windows if len(run.prompts) == 1 else 1)
    text_kv = _TextCache(pipe, prepare, options)
    chunk = geometry.chunk_frames
    latent_shape = pipe.vae.latent_shape(chunk, run.height, run.width)
    controls = pad_controls(run.controls, geometry) if run.controls is not None else None
    first_seed = preprocess_video(run.video, run.height, run.width) if run.video is not None else None
    generator = torch.Generator("cpu").manual_seed(int(sampling.seed))
    decode_kwargs.setdefault("compile", options.on(pipe.vae.device).vae_compile)
    decode_kwargs.setdefault("compile_backend", options.compile_backend)
    decoder = StreamDecoder(pipe.vae, geometry, sinks, fps=run.fps, **decode_kwargs)
    timings: dict[str, list[float]] = {"denoise": [], "decode": []}

    for k in range(geometry.num_windows):
        start = time.perf_counter()
        prepare("vae", latent_shape)
        # clean latents of the window's seed: the previous tail, or the optional image / video for window 0
        if k == 0 and run.image is not None:
            x0 = pipe.vae.encode(preprocess_image(run.image, run.height, run.width).unsqueeze(2))
            clean = [0]
        else:
            source, from_end = (decoder.tail, True) if k > 0 else (first_seed, False)
            pixels, n = seed_pixels(source, geometry.conditional_frames, from_end=from_end)
            x0 = None if pixels is None else pipe.vae.encode(pixels)
            clean = clean_latent_frames(n)

        def on_step(step: int, total: int, preview, _k=k) -> None:
            if progress is not None:
                progress(_k, geometry.num_windows, step, total, preview)

        if controls is not None:
            ids = transfer_prompt_ids(pipe.tokenizer, prompts[k], run.negative_prompt,
                                      use_system_prompt=run.use_system_prompt)
            scheduler = make_scheduler(pipe.scheduler_config, sampling.steps, schedule=sampling.schedule,
                                       shift=sampling.shift)
            cond, uncond = text_kv(ids.cond), text_kv(ids.uncond)
            text = TextConditioning(cond, uncond, chunk, run.height, run.width, float(run.fps))
            plan = make_transfer_plan(
                pipe.config, cond=cond, uncond=uncond,
                prefix=control_latents(pipe.vae, controls, geometry, k), latent_shape=latent_shape, fps=run.fps,
                generator=generator, stepper=make_stepper(scheduler), x0=x0, clean_frames=clean,
                guidance=sampling.guidance, control_guidance=run.control_guidance,
                guidance_interval=sampling.guidance_interval,
                control_guidance_interval=run.control_guidance_interval, device=device,
                dtype=pipe.transformer.dtype, options=options,
                **pipe.fast_modes(text, sampling, len(scheduler.timesteps), device, options),
            )
            pipe.check_memory(plan.memory_required, plan.num_tokens, plan.device)
        else:
            ids = pipe.tokenize(prompts[k], run.negative_prompt, num_frames=chunk, height=run.height,
                                width=run.width, fps=run.fps, use_system_prompt=run.use_system_prompt)
            uncond = text_kv(ids.uncond) if sampling.use_cfg else None
            text = TextConditioning(text_kv(ids.cond), uncond, chunk, run.height, run.width, float(run.fps),
                                    ids.cond_text, ids.uncond_text)
            plan = pipe.plan(text, sampling, generator=generator, x0=x0, clean_frames=clean, device=device,
                             options=options)
        prepare("generation", plan)
        result = pipe.run(plan, callback=on_step)
        timings["denoise"].append(time.perf_counter() - start)
        start = time.perf_counter()
        if latents_sink is not None:
            latents_sink(k, result.latents)
        waveform = None
        if result.sound is not None:
            prepare("sound", None)
            waveform = pipe.decode_sound(result.sound[0], chunk, run.fps)  # [1, 64, Ts]: one item
        prepare("vae", latent_shape)
        decoder.commit(k, result.latents, waveform)
        timings["decode"].append(time.perf_counter() - start)
    return LongVideoResult(geometry, decoder.frames_done, timings)


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

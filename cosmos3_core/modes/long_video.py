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

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import torch

from .. import defaults
from ..sampling.conditioning import preprocess_image, preprocess_video
from ..pipeline import TextConditioning
from ..sampling.plan import check_clip, check_sampling
from ..sampling.schedulers import make_scheduler, make_stepper
from .stream_decode import Sink, StreamDecoder
from ..model.text_kv import TextKV
from .transfer import control_latents, make_transfer_plan, pad_controls, prepare_controls, transfer_prompt_ids
from .windows import WindowGeometry, clean_latent_frames, seed_pixels, window_geometry

# progress(window, num_windows, step, steps, x0_preview)
WindowProgress = Callable[[int, int, int, int, torch.Tensor], None]
LatentSink = Callable[[int, torch.Tensor], None]
# prepare(part, need) before each use of a model part: ("text", token count), ("generation", plan),
# ("vae", latent shape), ("sound", None) — a model manager loads the part there (ComfyUI); default: nothing
Prepare = Callable[[str, Any], None]


def _no_prepare(part: str, need: Any) -> None:
    return None


@dataclass
class LongVideoRequest:
    prompt: str | Sequence[str]  # one prompt, or one per window
    negative_prompt: str | None = None  # None → the checkpoint's default (T2V), "" (Transfer, as the reference)
    num_frames: int | None = None  # total output frames; Transfer: None = the controls' length (else a cap)
    frames_per_chunk: int = defaults.NUM_FRAMES
    conditional_frames: int | None = None  # None → defaults.LONG_CONDITIONAL_FRAMES / TRANSFER_CONDITIONAL_FRAMES
    height: int = defaults.HEIGHT
    width: int = defaults.WIDTH
    fps: float = defaults.FPS
    steps: int | None = None
    guidance: float = defaults.GUIDANCE
    seed: int = defaults.SEED
    schedule: str = defaults.SCHEDULE
    shift: float | None = None
    sound: bool = False
    image: Any = None  # I2V: seeds window 0 (latent 0), as single-clip I2V
    video: Any = None  # [F, H, W, 3]: its first conditional_frames frames seed window 0
    controls: Mapping[str, Any] | None = None  # Transfer: {edge|blur|depth|seg|wsm: [F, H, W, 3] in [0, 1]}
    control_guidance: float = defaults.CONTROL_GUIDANCE
    guidance_interval: tuple[float, float] | None = None
    control_guidance_interval: tuple[float, float] | None = None
    use_system_prompt: bool | None = None
    compile: bool = False

    @property
    def is_transfer(self) -> bool:
        return self.controls is not None


@dataclass
class LongVideoResult:
    geometry: WindowGeometry
    frames_written: int
    timings: dict[str, list[float]] = field(default_factory=dict)  # per window: "denoise", "decode"


def plan_windows(req: LongVideoRequest, who: str = "generate") -> tuple[WindowGeometry, dict | None]:
    """Check the request (one message per mistake) and resolve the geometry (and the preprocessed controls)."""
    check_sampling(seed=req.seed, steps=req.steps, guidance=req.guidance, schedule=req.schedule, shift=req.shift,
                   guidance_interval=req.guidance_interval, batch_size=1, who=who)
    if req.image is not None and req.video is not None:
        raise ValueError(f"{who}: give either an image (seeds window 1 as image-to-video) or a video (its first "
                         "frames seed window 1), not both.")
    cf = req.conditional_frames
    if cf is None:
        cf = defaults.TRANSFER_CONDITIONAL_FRAMES if req.is_transfer else defaults.LONG_CONDITIONAL_FRAMES
    controls = None
    if req.is_transfer:
        if req.sound:
            raise ValueError(f"{who}: Transfer (control videos) generates no sound; drop sound (CLI: --sound).")
        if req.image is not None:
            raise ValueError(f"{who}: Transfer takes a seed video, not an image; pass the image as a 1-frame video.")
        controls = prepare_controls(req.controls, req.height, req.width, who=who)
        total = next(iter(controls.values())).shape[2]
        if req.num_frames is not None:
            if isinstance(req.num_frames, bool) or not isinstance(req.num_frames, int) or req.num_frames < 1:
                raise ValueError(f"{who}: num_frames={req.num_frames!r} must be a positive integer (a cap on the "
                                 "control videos' length), or unset.")
            total = min(total, req.num_frames)
    else:
        total = req.num_frames if req.num_frames is not None else req.frames_per_chunk
        if isinstance(total, bool) or not isinstance(total, int) or total < 5 or (total - 1) % 4:
            fixed = max(5, (int(total) - 1) // 4 * 4 + 1) if isinstance(total, int) else 189
            raise ValueError(f"{who}: num_frames={total!r} must be 4k+1 and at least 5 for a windowed video "
                             f"(e.g. 721 = 30 s at 24 fps); try {fixed}.")
        if total > defaults.MAX_LONG_FRAMES:
            raise ValueError(f"{who}: num_frames={total} is above the limit of {defaults.MAX_LONG_FRAMES} frames.")
    geometry = window_geometry(total, req.frames_per_chunk, cf, who=who)
    if req.frames_per_chunk < 5:
        raise ValueError(f"{who}: frames_per_chunk={req.frames_per_chunk} is an image; windows need 5 or more frames "
                         f"(4k+1, up to {defaults.NUM_FRAMES}).")
    check_clip(req.frames_per_chunk, req.height, req.width, req.fps, who)
    prompts = [req.prompt] if isinstance(req.prompt, str) else list(req.prompt)
    if not prompts or not all(isinstance(p, str) for p in prompts):
        raise ValueError(f"{who}: prompt must be a string or a list of strings (one per window).")
    if len(prompts) not in (1, geometry.num_windows):
        raise ValueError(
            f"{who}: {len(prompts)} prompts were given for {geometry.num_windows} windows ({geometry.total_frames} "
            f"frames in windows of {geometry.chunk_frames} overlapping by {geometry.conditional_frames}); give one "
            f"prompt, or exactly {geometry.num_windows}."
        )
    if req.is_transfer and len(prompts) > 1:
        raise ValueError(f"{who}: Transfer takes one prompt for the whole video (as the reference); give one prompt.")
    return geometry, controls


class _TextCache:
    """Text K/V per distinct token-id list: the text tower runs once per distinct prompt of the whole video."""

    def __init__(self, pipe, prepare: Prepare):
        self.pipe, self.prepare, self.cache = pipe, prepare, {}

    def __call__(self, ids: list[int]) -> TextKV:
        key = tuple(ids)
        if key not in self.cache:
            self.prepare("text", len(ids))
            self.cache[key] = self.pipe._prefill(ids)
        return self.cache[key]


def generate_long(
    pipe, req: LongVideoRequest, sinks: Sequence[Sink] = (), *, progress: WindowProgress | None = None,
    latents_sink: LatentSink | None = None, device: torch.device | str | None = None, who: str = "generate",
    prepare: Prepare = _no_prepare, **decode_kwargs,
) -> LongVideoResult:
    """Generate ``req`` window by window; every window's new frames (and sound) go to ``sinks`` once decoded.

    ``progress(window, windows, step, steps, preview)`` runs after every step (it may raise to cancel: the windows
    already handed to the sinks stay there); ``latents_sink(window, latents)`` receives each window's final
    normalized latent ``[1, 48, T, h, w]``."""
    import time

    geometry, controls = plan_windows(req, who)
    device = torch.device(device) if device is not None else pipe.transformer.device
    prompts = [req.prompt] * geometry.num_windows if isinstance(req.prompt, str) else list(req.prompt)
    if len(prompts) == 1:
        prompts = prompts * geometry.num_windows
    text_kv = _TextCache(pipe, prepare)
    steps = req.steps or defaults.STEPS_VIDEO
    shift = req.shift if req.shift is not None else defaults.default_shift(req.height, req.width)
    chunk = geometry.chunk_frames
    latent_shape = pipe.vae.latent_shape(chunk, req.height, req.width)
    if controls is not None:
        controls = pad_controls(controls, geometry)
    first_seed = None
    if req.video is not None:
        first_seed = preprocess_video(req.video, req.height, req.width)
    generator = torch.Generator("cpu").manual_seed(int(req.seed))
    decoder = StreamDecoder(pipe.vae, geometry, sinks, fps=req.fps, **decode_kwargs)
    timings: dict[str, list[float]] = {"denoise": [], "decode": []}

    for k in range(geometry.num_windows):
        start = time.perf_counter()
        prepare("vae", latent_shape)
        # clean latents of the window's seed: the previous tail, or the optional image / video for window 0
        if k == 0 and req.image is not None:
            x0 = pipe.vae.encode(preprocess_image(req.image, req.height, req.width).unsqueeze(2))
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
            negative = req.negative_prompt
            ids = transfer_prompt_ids(pipe.tokenizer, prompts[k], negative, who=who,
                                      use_system_prompt=True if req.use_system_prompt is None else req.use_system_prompt)
            scheduler = make_scheduler(pipe.scheduler_config, steps, schedule=req.schedule, shift=shift)
            plan = make_transfer_plan(
                pipe.config, cond=text_kv(ids.cond), uncond=text_kv(ids.uncond),
                prefix=control_latents(pipe.vae, controls, geometry, k), latent_shape=latent_shape, fps=req.fps,
                generator=generator, stepper=make_stepper(scheduler), x0=x0, clean_frames=clean,
                guidance=float(req.guidance), control_guidance=float(req.control_guidance),
                guidance_interval=req.guidance_interval, control_guidance_interval=req.control_guidance_interval,
                device=device, dtype=pipe.transformer.dtype,
            )
            pipe._check_memory(plan.memory_required, plan.num_tokens, plan.device, who)
        else:
            ids = pipe.tokenize(prompts[k], req.negative_prompt, num_frames=chunk, height=req.height, width=req.width,
                                fps=req.fps, use_system_prompt=req.use_system_prompt)
            uncond = text_kv(ids.uncond) if req.guidance != 1.0 else None
            text = TextConditioning(text_kv(ids.cond), uncond, chunk, req.height, req.width, float(req.fps),
                                    ids.cond_text, ids.uncond_text)
            plan = pipe.plan(text, seed=req.seed, generator=generator, steps=steps, guidance=req.guidance,
                             schedule=req.schedule, shift=shift, sound=req.sound, x0=x0, clean_frames=clean,
                             guidance_interval=req.guidance_interval, device=device, who=who)
        prepare("generation", plan)
        result = pipe.run(plan, callback=on_step, compile=req.compile)
        timings["denoise"].append(time.perf_counter() - start)
        start = time.perf_counter()
        if latents_sink is not None:
            latents_sink(k, result.latents)
        waveform = None
        if result.sound is not None:
            prepare("sound", None)
            waveform = pipe.decode_sound(result.sound[0], chunk, req.fps)  # [1, 64, Ts]: one item
        prepare("vae", latent_shape)
        decoder.commit(k, result.latents, waveform)
        timings["decode"].append(time.perf_counter() - start)
    return LongVideoResult(geometry, decoder.frames_done, timings)

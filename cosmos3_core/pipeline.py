"""Cosmos3 generation end to end: T2I, T2V, I2V, V2V and T2AV/I2AV on one loaded checkpoint.

The stages mirror diffusers 0.42.1 ``Cosmos3OmniPipeline.__call__`` and are exposed one by one, because the
ComfyUI nodes run them as separate nodes (so ComfyUI's cache can skip the text tower when only the seed changes):

1. ``encode_text``      — prompt templates + chat template (prompt.py), then ``prefill`` once per distinct prompt;
2. ``encode_condition`` — I2V / V2V pixels → clean latent frames (conditioning.py);
3. ``plan``             — every decision and check of the sampling run, once (plan.py);
   ``run``              — the mode-free loop over the plan (sampling.py);
4. ``decode_video`` / ``decode_sound`` — chunked Wan2.2 VAE decode, AVAE decode trimmed to the clip (vae.py, audio.py).

``generate`` chains them for the CLI and tests. Nothing here imports ComfyUI.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch

from . import defaults
from .modes import action as action_mod
from .modes.action import ActionCondition, ActionGenerationRequest, ActionRequest
from .kernels.attention import BACKENDS, set_attention_backend
from .vae.audio import Cosmos3SoundDecoder, load_sound_decoder, num_audio_samples, sound_latent_length
from .sampling.conditioning import encode_condition
from .config import CheckpointError, Cosmos3Config
from .sampling.distilled import DistilledSchedule, read_distilled
from .model.loader import load_transformer
from .sampling.plan import ActionInput, SamplePlan, check_clip, check_sampling, generation_tokens, make_plan
from .sampling.prompt import PromptIds, default_negative_prompt, default_use_system_prompt, encode_prompts, load_tokenizer
from .sampling.loop import SampleResult, StepCallback, run
from .sampling.schedulers import load_scheduler_config, make_scheduler, make_stepper
from .model.text_kv import TextKV
from .model.towers import step_memory_required
from .model.transformer import Cosmos3Transformer
from .vae.video import Cosmos3VAE, load_vae


@dataclass(frozen=True)
class TextConditioning:
    """Both guidance branches' text K/V for one prompt pair, plus the clip shape the prompts describe."""

    cond: TextKV
    uncond: TextKV | None
    num_frames: int
    height: int
    width: int
    fps: float
    prompt_text: str = ""
    negative_text: str = ""

    def to(self, device: torch.device | str) -> "TextConditioning":
        uncond = None if self.uncond is None else self.cond.to(device) if self.uncond is self.cond else self.uncond.to(device)
        return dataclasses.replace(self, cond=self.cond.to(device), uncond=uncond)


@dataclass
class GenerationRequest:
    prompt: str
    negative_prompt: str | None = None  # None → the checkpoint's assets/negative_prompt.json, else ""
    num_frames: int = defaults.NUM_FRAMES
    height: int = defaults.HEIGHT
    width: int = defaults.WIDTH
    fps: float = defaults.FPS
    steps: int | None = None  # None → defaults.default_steps (50 for images, 35 for video), or a distilled schedule's
    guidance: float | None = None  # None → defaults.GUIDANCE, or 1 for a distilled checkpoint
    seed: int = defaults.SEED
    schedule: str = defaults.SCHEDULE
    shift: float | None = None  # None → defaults.default_shift (by resolution tier)
    sound: bool = False
    image: Any = None  # I2V: [H,W,3] float in [0,1] (or uint8 / PIL)
    video: Any = None  # V2V: [F,H,W,3] float in [0,1]
    condition_latent_frames: Sequence[int] = (0, 1)
    keep: str = "first"
    use_system_prompt: bool | None = None
    guidance_interval: tuple[float, float] | None = None
    compile: bool = False
    attention: str = "auto"  # attention.BACKENDS: auto | sdpa (the reference's route) | flash4

    def check(self, who: str = "generate") -> None:
        """Every check of the request that needs no model: the clip, the sampling values, the conditioning."""
        check_clip(self.num_frames, self.height, self.width, self.fps, who)
        if self.attention not in BACKENDS:
            raise ValueError(f"{who}: attention={self.attention!r} is not one of {BACKENDS}; 'sdpa' forces PyTorch SDPA.")
        check_sampling(seed=self.seed, steps=self.steps, guidance=self.guidance, schedule=self.schedule,
                       shift=self.shift, guidance_interval=self.guidance_interval, batch_size=1, who=who)
        if self.image is not None and self.video is not None:
            raise ValueError(f"{who}: give either an image (image-to-video) or a video (video-to-video), not both.")
        if (self.image is not None or self.video is not None) and self.num_frames == 1:
            what = "image" if self.image is not None else "video"
            raise ValueError(
                f"{who}: a conditioning {what} was given with num_frames=1 (text-to-image), where it would be "
                f"ignored; use num_frames 5 or more (4k+1) to condition a video on it, or drop the {what}."
            )


@dataclass
class GenerationOutput:
    latents: torch.Tensor  # [1, 48, T, h, w] normalized (as the sampler works)
    sound_latent: torch.Tensor | None  # [64, Ts]
    frames: torch.Tensor | None  # [F, H, W, 3] float in [0, 1]
    waveform: torch.Tensor | None  # [2, N] at 48 kHz, trimmed to the clip
    timings: dict[str, float] = field(default_factory=dict)
    action: torch.Tensor | None = None  # [Ta, action_dim] padded action latent
    actions: torch.Tensor | None = None  # [Ta, raw_action_dim] predicted actions (policy, inverse dynamics)


class Cosmos3Pipeline:
    """One loaded checkpoint: transformer, Wan2.2 VAE, sound decoder (Nano/Super), tokenizer, scheduler config."""

    def __init__(
        self,
        checkpoint_dir: str | Path,
        transformer: Cosmos3Transformer,
        vae: Cosmos3VAE,
        tokenizer,
        sound_decoder: Cosmos3SoundDecoder | None = None,
    ):
        self.checkpoint_dir = Path(checkpoint_dir)
        self.transformer = transformer
        self.vae = vae
        self.tokenizer = tokenizer
        self.sound_decoder = sound_decoder
        self.scheduler_config = load_scheduler_config(self.checkpoint_dir)
        index = _read_model_index(self.checkpoint_dir)
        self.native_flow_schedule = bool(index.get("use_native_flow_schedule", False))
        self.default_use_system_prompt = default_use_system_prompt(self.checkpoint_dir)
        self.default_negative_prompt = default_negative_prompt(self.checkpoint_dir)
        # a distilled (few-step) checkpoint: its fixed schedule, guidance baked in (distilled.py); else None
        self.distilled: DistilledSchedule | None = read_distilled(self.checkpoint_dir)
        if self.distilled is not None and self.distilled.default_use_system_prompt is not None:
            self.default_use_system_prompt = self.distilled.default_use_system_prompt  # diffusers reads it there
        self.prefill_count = 0  # text-tower runs since load (tests and the ComfyUI cache check read it)

    @classmethod
    def load(
        cls,
        checkpoint_dir: str | Path,
        *,
        dtype: torch.dtype = torch.bfloat16,
        device: torch.device | str = "cpu",
        vae_dtype: torch.dtype | None = None,
        with_sound: bool = True,
        linear: type[torch.nn.Linear] = torch.nn.Linear,
        storage_dtype: torch.dtype | None = None,
        scaled_linear: type[torch.nn.Linear] | None = None,
    ) -> "Cosmos3Pipeline":
        """``storage_dtype``/``scaled_linear``: how the transformer's linear weights are stored (``weights.py``).

        Nothing runs beside the reads: a thread importing the compiler's modules meanwhile (``caches.preload_compiler``)
        holds the GIL in Python for seconds, and the reading thread then waits up to the interpreter's switch interval
        (5 ms) every time it takes the GIL back — after each tensor read and copy — so the load grew by about what the
        imports cost (measured in docs/benchmark-log.md)."""
        root = Path(checkpoint_dir)
        if not root.is_dir():
            raise CheckpointError(f"checkpoint folder {root} does not exist.")
        config = Cosmos3Config.from_checkpoint(root)
        # the small parts first: a damaged one is reported before minutes of reading the transformer's weights
        load_scheduler_config(root)
        tokenizer = load_tokenizer(root)
        vae = load_vae(root, dtype=vae_dtype or dtype, device=device)
        sound = None
        if with_sound and config.sound_gen and (root / "sound_tokenizer").is_dir():
            sound = load_sound_decoder(root, dtype=torch.float32, device=device)
        transformer = load_transformer(
            root, dtype=dtype, device=device, skip_modules=("lm_head",), config=config, linear=linear,
            storage_dtype=storage_dtype, **({"scaled_linear": scaled_linear} if scaled_linear else {}),
        )
        return cls(root, transformer, vae, tokenizer, sound)

    @property
    def config(self) -> Cosmos3Config:
        return self.transformer.config

    @property
    def supports_sound(self) -> bool:
        return self.config.sound_gen and self.sound_decoder is not None

    @property
    def is_distilled(self) -> bool:
        return self.distilled is not None

    @property
    def default_guidance(self) -> float:
        """The guidance scale a run gets when none is given: 1 on a distilled checkpoint (baked in)."""
        return 1.0 if self.distilled is not None else defaults.GUIDANCE

    # ------------------------------------------------------------------ 1. text
    def encode_text(
        self,
        prompt: str,
        negative_prompt: str | None = None,
        *,
        num_frames: int,
        height: int,
        width: int,
        fps: float,
        use_system_prompt: bool | None = None,
        who: str = "encode_text",
    ) -> TextConditioning:
        """Render both prompts as trained and run the text tower once per distinct prompt."""
        ids = self.tokenize(
            prompt, negative_prompt, num_frames=num_frames, height=height, width=width, fps=fps,
            use_system_prompt=use_system_prompt, who=who,
        )
        return self.prefill_prompts(ids, num_frames=num_frames, height=height, width=width, fps=fps)

    def tokenize(
        self, prompt: str, negative_prompt: str | None = None, *, num_frames: int, height: int, width: int,
        fps: float, use_system_prompt: bool | None = None, who: str = "encode_text",
    ) -> PromptIds:
        """Token ids of both branches (templates + chat template); ``None`` negative → the checkpoint default.

        A distilled checkpoint has no negative branch (``Cosmos3DistilledTextEncoderStep``): a negative prompt is
        refused and the unused uncond ids are those of an empty prompt, as the reference builds them."""
        check_clip(num_frames, height, width, fps, who)
        if self.distilled is not None:
            self.distilled.check(steps=None, guidance=None, negative_prompt=negative_prompt, who=who)
            negative_prompt = ""
        if negative_prompt is None:
            negative_prompt = self.default_negative_prompt
        if use_system_prompt is None:
            use_system_prompt = self.default_use_system_prompt
        return encode_prompts(
            self.tokenizer, prompt, negative_prompt, num_frames=num_frames, height=height, width=width, fps=fps,
            use_system_prompt=use_system_prompt,
        )

    def prefill_prompts(self, ids: PromptIds, *, num_frames: int, height: int, width: int, fps: float) -> TextConditioning:
        """Both branches' text K/V from one text-tower pass over the distinct prompts (a distilled checkpoint has
        one branch: its uncond K/V would never be used)."""
        one_branch = self.distilled is not None or ids.uncond == ids.cond
        kvs = self._prefill_many([ids.cond] if one_branch else [ids.cond, ids.uncond])
        uncond = None if self.distilled is not None else kvs[-1]
        return TextConditioning(kvs[0], uncond, num_frames, height, width, float(fps), ids.cond_text, ids.uncond_text)

    def _prefill(self, ids: list[int]) -> TextKV:
        return self._prefill_many([ids])[0]

    def _prefill_many(self, prompts: list[list[int]]) -> list[TextKV]:
        self.prefill_count += len(prompts)
        return self.transformer.prefill_many(prompts)

    # ------------------------------------------------------------------ 2. conditioning
    def encode_condition(
        self, text: TextConditioning, *, image=None, video=None, condition_latent_frames=(0, 1), keep="first"
    ) -> tuple[torch.Tensor | None, list[int]]:
        """Clean latents for the clip ``text`` describes (``None, []`` for T2V/T2I: nothing to encode)."""
        if image is None and video is None:
            return None, []
        return self.vae_encode_condition(
            image=image, video=video, height=text.height, width=text.width,
            condition_latent_frames=condition_latent_frames, keep=keep,
        )

    def vae_encode_condition(
        self, *, image=None, video=None, height: int, width: int, condition_latent_frames=(0, 1), keep="first"
    ) -> tuple[torch.Tensor, list[int]]:
        """Encode only the clean frames: ``x0`` ``[1, 48, max(clean)+1, h, w]`` (normalized) and their indexes.

        Independent of the clip length (the VAE is causal in time), so it can run before the text encode.
        """
        indexes = self.condition_frames(video is not None, condition_latent_frames)
        num_frames = defaults.pixel_frames(max(indexes) + 1) if video is not None else 5
        x0, clean = encode_condition(
            self.vae, image=image, video=video, num_frames=num_frames, height=height, width=width,
            condition_latent_frames=indexes, keep=keep,
        )
        return x0[:, :, : max(clean) + 1], list(clean)

    @staticmethod
    def condition_frames(is_video: bool, condition_latent_frames: Sequence[int] | int) -> tuple[int, ...]:
        """Latent frames a condition keeps clean: latent 0 for an image; for a video the given indexes (or, given a
        count ``k``, the first ``k``)."""
        if not is_video:
            return (0,)
        if isinstance(condition_latent_frames, int):
            return tuple(range(condition_latent_frames))
        return tuple(condition_latent_frames)

    def condition_latent_shape(self, is_video: bool, condition_latent_frames, height: int, width: int) -> tuple:
        """Shape of the latent ``vae_encode_condition`` produces (for a memory estimate before encoding)."""
        indexes = self.condition_frames(is_video, condition_latent_frames)
        return self.vae.latent_shape(defaults.pixel_frames(max(indexes) + 1), height, width)

    # ------------------------------------------------------------------ 3. sampling
    def plan(
        self,
        text: TextConditioning,
        *,
        seed: int = defaults.SEED,
        generator: torch.Generator | None = None,
        steps: int | None = None,
        guidance: float | None = None,
        schedule: str = defaults.SCHEDULE,
        shift: float | None = None,
        sound: bool = False,
        x0: torch.Tensor | None = None,
        clean_frames: Sequence[int] = (),
        guidance_interval: tuple[float, float] | None = None,
        action: ActionInput | None = None,
        batch_size: int = defaults.BATCH_SIZE,
        device: torch.device | str | None = None,
        who: str = "sample",
    ) -> SamplePlan:
        """Decide the whole run (plan.py) after checking every argument; nothing is computed on the model yet.

        ``device``: where the run's latents live (default: where the generation tower runs now); a caller that moves
        the tower afterwards (ComfyUI's model management) passes the device it will run on. ``steps``/``guidance``
        ``None``: the checkpoint's defaults (a distilled checkpoint: its schedule's length and 1, and nothing else).
        ``generator``: draw the noise from it instead of a fresh generator seeded with ``seed`` (a long video's
        windows share one, as the reference's chunk loop).
        """
        check_sampling(seed=seed, steps=steps, guidance=guidance, schedule=schedule, shift=shift,
                       guidance_interval=guidance_interval, batch_size=batch_size, who=who)
        if self.distilled is not None:
            self.distilled.check(steps=steps, guidance=guidance, shift=shift, schedule=schedule, sound=sound, who=who)
        guidance = self.default_guidance if guidance is None else guidance
        if sound and not self.supports_sound:
            raise ValueError(
                f"{who}: sound=True, but checkpoint {self.checkpoint_dir.name} has no sound_tokenizer/ or sound head "
                "(Edge cannot generate sound); set sound to false (CLI: drop --sound) or use a Nano/Super checkpoint."
            )
        if action is not None and not self.transformer.has_action:
            raise ValueError(
                f"{who}: an action mode needs a checkpoint trained with action_gen=True (and its action head); "
                f"checkpoint {self.checkpoint_dir.name} has none. Use a Cosmos3 checkpoint with action_gen."
            )
        if x0 is not None and text.num_frames == 1:
            raise ValueError(
                f"{who}: a condition was given but num_frames is 1 (text-to-image), where it would be ignored; "
                "use 5 or more frames (4k+1) for image/video-to-video."
            )
        latent_shape = self.vae.latent_shape(text.num_frames, text.height, text.width)
        clean_frames = [i for i in clean_frames if i < latent_shape[2]] if x0 is not None else []
        sound_len = sound_latent_length(text.num_frames, text.fps) if sound else 0
        action_len = 0 if action is None else int(action.values.shape[0])
        num_tokens = generation_tokens(self.config, latent_shape, sound_len, action_len)
        lengths = [text.cond.length] + ([text.uncond.length] if guidance != 1.0 and text.uncond is not None else [])
        device = torch.device(device or self.transformer.device)
        self._check_memory(step_memory_required(self.config, num_tokens, lengths * batch_size, self.transformer.dtype),
                           num_tokens, device, who)
        generators = None if generator is None else [generator]
        if generator is not None and (self.distilled is not None or batch_size != 1):
            raise ValueError(f"{who}: a shared noise generator (long video windows) needs batch_size 1 and a "
                             "non-distilled checkpoint; long video with distilled checkpoints is not supported yet.")
        if self.distilled is not None:  # the checkpoint's sigmas; SDE steps from the noise's generators; re-anchor
            stepper, generators = self.distilled.make_stepper(seed, batch_size)
        else:
            scheduler = make_scheduler(
                self.scheduler_config, steps or defaults.default_steps(text.num_frames), schedule=schedule,
                shift=shift if shift is not None else defaults.default_shift(text.height, text.width),
                native_flow_schedule=self.native_flow_schedule,
            )
            stepper = make_stepper(scheduler)
        return make_plan(
            self.config, cond=text.cond, uncond=text.uncond, latent_shape=latent_shape, fps=text.fps, seed=seed,
            guidance=float(guidance), vision_stepper=stepper, x0=x0, clean_frames=clean_frames,
            sound_len=sound_len, action=action, guidance_interval=guidance_interval, batch_size=batch_size,
            reanchor_vision=self.distilled is not None, generators=generators, device=device,
            dtype=self.transformer.dtype, who=who,
        )

    @staticmethod
    def _check_memory(need: int, num_tokens: int, device: torch.device, who: str) -> None:
        """Refuse a run whose step activations alone exceed the device's memory (never a raw allocator error after
        minutes of work). Weights are left out: a tower that does not fit streams them (ComfyUI's lowvram path)."""
        if device.type == "cuda":
            capacity = torch.cuda.get_device_properties(device).total_memory
        elif device.type == "cpu" and hasattr(os, "sysconf"):
            capacity = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        else:
            return
        if need > capacity:
            raise ValueError(
                f"{who}: one denoising step of this clip ({num_tokens:,} generation tokens) needs about "
                f"{need / 2**30:.1f} GiB on {device}, which has {capacity / 2**30:.1f} GiB; lower width/height or "
                "num_frames (e.g. 1280x720 with 189 frames, or 832x480 with 93)."
            )

    def run(self, plan: SamplePlan, callback: StepCallback | None = None, compile: bool = False,
            attention: str = "auto", denoiser=None) -> SampleResult:
        """Denoise ``plan``; ``compile`` uses the torch.compile'd generation layer (faster after a one-off warm-up);
        ``attention`` picks the kernel route for this run (attention.py: ``auto`` | ``sdpa`` | ``flash4``).
        ``denoiser``: runs the steps instead of the transformer, with its ``denoise_step`` contract (parallel/)."""
        self.transformer.compile_generation_layers(compile)
        previous = set_attention_backend(attention)
        try:
            x = run(plan, denoiser or self.transformer, callback)
        finally:
            set_attention_backend(previous)
        return SampleResult(latents=x["vision"], sound=x.get("sound"), action=x.get("action"))

    def sample(self, text: TextConditioning, *, callback: StepCallback | None = None, compile: bool = False,
               attention: str = "auto", **plan_args) -> SampleResult:
        """``plan`` then ``run``."""
        return self.run(self.plan(text, **plan_args), callback=callback, compile=compile, attention=attention)

    # ------------------------------------------------------------------ 4. decode
    def decode_video(self, latents: torch.Tensor, on_chunk=None, **kwargs) -> torch.Tensor:
        """``[N, 48, T, h, w]`` → frames ``[N·F, H, W, 3]`` (items one after another; ComfyUI's IMAGE batch);
        ``on_chunk(done, total)`` counts latent frames over the whole batch."""
        n, t = latents.shape[0], latents.shape[2]
        frames = []
        for k, item in enumerate(latents):
            progress = None if on_chunk is None else (lambda done, _t, k=k: on_chunk(k * t + done, n * t))
            frames.append(self.vae.decode(item[None], on_chunk=progress, **kwargs))
        return torch.cat(frames)

    def decode_sound(self, sound_latent: torch.Tensor, num_frames: int, fps: float) -> torch.Tensor:
        """``[N, 64, Ts]`` (or ``[64, Ts]``) → waveforms ``[N, 2, S]`` (``[2, S]``) trimmed to the clip."""
        if self.sound_decoder is None:
            raise ValueError(f"checkpoint {self.checkpoint_dir.name} has no sound_tokenizer/; no sound to decode.")
        n = num_audio_samples(num_frames, fps)
        if sound_latent.ndim == 2:
            return self.sound_decoder.decode(sound_latent, num_samples=n).float().cpu()
        return torch.stack([self.sound_decoder.decode(item, num_samples=n).float().cpu() for item in sound_latent])

    # ------------------------------------------------------------------ all stages
    def generate(
        self, request: GenerationRequest, callback: StepCallback | None = None, decode: bool = True
    ) -> GenerationOutput:
        r = request
        r.check()
        if self.distilled is not None:  # fail before any model work (the plan checks the same again)
            self.distilled.check(steps=r.steps, guidance=r.guidance, shift=r.shift, schedule=r.schedule,
                                 negative_prompt=r.negative_prompt, sound=r.sound, who="generate")
        timings: dict[str, float] = {}
        with _timed(timings, "preprocess"):
            text = self.encode_text(
                r.prompt, r.negative_prompt, num_frames=r.num_frames, height=r.height, width=r.width, fps=r.fps,
                use_system_prompt=r.use_system_prompt, who="generate",
            )
            x0, clean = self.encode_condition(
                text, image=r.image, video=r.video, condition_latent_frames=r.condition_latent_frames, keep=r.keep
            )
            plan = self.plan(
                text, seed=r.seed, steps=r.steps, guidance=r.guidance, schedule=r.schedule, shift=r.shift,
                sound=r.sound, x0=x0, clean_frames=clean, guidance_interval=r.guidance_interval, who="generate",
            )
        return self._run_and_decode(plan, timings, r.num_frames, r.fps, callback=callback, compile=r.compile,
                                    attention=r.attention, decode=decode)

    def _run_and_decode(self, plan: SamplePlan, timings: dict[str, float], num_frames: int, fps: float, *,
                        callback: StepCallback | None, compile: bool, attention: str = "auto",
                        decode: bool = True) -> GenerationOutput:
        """The stages after planning that every whole run shares: denoise, then decode the video and sound."""
        with _timed(timings, "inference"):
            result = self.run(plan, callback=callback, compile=compile, attention=attention)
        frames = waveform = None
        if decode:
            with _timed(timings, "decode"):
                frames = self.decode_video(result.latents, compile=compile)  # compile: VAE frames too
                if result.sound is not None:
                    waveform = self.decode_sound(result.sound[0], num_frames, fps)
        sound = None if result.sound is None else result.sound[0]
        action = None if result.action is None else result.action[0]
        return GenerationOutput(result.latents, sound, frames, waveform, timings, action)


    # ------------------------------------------------------------------ action modes (action.py decides)
    def action_encode_shape(self, request: ActionRequest, who: str = "action") -> tuple[int, ...]:
        """Latent shape the VAE encode of an action request produces (for a memory estimate before encoding)."""
        return action_mod.encode_latent_shape(request, self.vae, self.config, who)

    def encode_action(self, request: ActionRequest, who: str = "action") -> ActionCondition:
        """Check an action request and encode its frames: clean latents (cropped to the content) and actions."""
        return action_mod.encode_action_condition(self.vae, request, self.config, who)

    def tokenize_action(self, condition: ActionCondition, prompt: str, negative_prompt: str | None = None, *,
                        fps: float = defaults.ACTION_FPS, use_system_prompt: bool = defaults.ACTION_USE_SYSTEM_PROMPT,
                        who: str = "action") -> PromptIds:
        """Token ids of an action run: the prompt as the JSON action caption, the negative prompt raw."""
        try:
            return action_mod.action_prompt_ids(self.tokenizer, condition, prompt, negative_prompt, fps=fps,
                                                use_system_prompt=use_system_prompt)
        except ValueError as exc:
            raise ValueError(f"{who}: {exc}") from exc

    def prefill_action_prompts(self, ids: PromptIds, condition: ActionCondition, *, fps: float) -> TextConditioning:
        """Text K/V of an action run; its clip shape is the generated one (``chunk_size + 1`` frames at the
        content size; the caption itself describes the tier's canvas)."""
        height, width = condition.output_size
        return self.prefill_prompts(ids, num_frames=condition.num_frames, height=height, width=width, fps=fps)

    def plan_action(self, text: TextConditioning, condition: ActionCondition, *, seed: int = defaults.SEED,
                    steps: int | None = None, guidance: float = defaults.ACTION_GUIDANCE,
                    schedule: str = defaults.ACTION_SCHEDULE, shift: float | None = None, sound: bool = False,
                    batch_size: int = defaults.BATCH_SIZE, device=None, who: str = "action") -> SamplePlan:
        """The plan of an action run: the mode's clean latent frames and action stream, the action defaults."""
        action_mod.check_text_matches(text, condition, who)
        return self.plan(
            text, seed=seed, steps=steps or defaults.ACTION_STEPS, guidance=guidance, schedule=schedule,
            shift=shift if shift is not None else defaults.ACTION_SHIFT, sound=sound, x0=condition.x0,
            clean_frames=condition.clean_frames, action=condition.plan_input(), batch_size=batch_size, device=device,
            who=who,
        )

    def generate_action(self, request: ActionGenerationRequest, callback: StepCallback | None = None,
                        decode: bool = True) -> GenerationOutput:
        """A whole action-mode run; ``output.actions`` holds the predicted actions without padding (policy,
        inverse dynamics) and ``output.action`` the padded action latent."""
        r = request
        timings: dict[str, float] = {}
        with _timed(timings, "preprocess"):
            condition = self.encode_action(r.action, who="generate")
            ids = self.tokenize_action(condition, r.prompt, r.negative_prompt, fps=r.fps,
                                       use_system_prompt=r.use_system_prompt, who="generate")
            text = self.prefill_action_prompts(ids, condition, fps=r.fps)
            plan = self.plan_action(text, condition, seed=r.seed, steps=r.steps, guidance=r.guidance,
                                    schedule=r.schedule, shift=r.shift, sound=r.sound, who="generate")
        out = self._run_and_decode(plan, timings, condition.num_frames, r.fps, callback=callback, compile=r.compile,
                                   decode=decode)
        out.actions = action_mod.unpadded_actions(out.action, condition)
        return out


def _read_model_index(root: Path) -> dict:
    path = root / "model_index.json"
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path} is not valid JSON ({exc}).") from exc


@contextmanager
def _timed(timings: dict[str, float], name: str):
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    try:
        yield
    finally:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        timings[name] = timings.get(name, 0.0) + time.perf_counter() - start

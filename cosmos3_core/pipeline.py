"""Cosmos3 generation stages on one loaded checkpoint: T2I, T2V, I2V, V2V and T2AV/I2AV, and the parts every mode
builds on.

The stages mirror diffusers 0.42.1 ``Cosmos3OmniPipeline.__call__`` and are exposed one by one, because the
ComfyUI nodes run them as separate nodes (so ComfyUI's cache can skip the text tower when only the seed changes):

1. ``encode_text``      — prompt templates + chat template (sampling/prompt.py), then ``prefill`` once per distinct
   prompt;
2. ``encode_condition`` — I2V / V2V pixels → clean latent frames (sampling/conditioning.py);
3. ``plan``             — the run's ``SamplePlan`` from resolved sampling values (resolve.py decides them;
   sampling/plan.py assembles); ``run`` — the mode-free loop over the plan (sampling/loop.py);
4. ``decode_video`` / ``decode_sound`` — chunked Wan2.2 VAE decode, AVAE decode trimmed to the clip (vae/).

The stages decide nothing: ``resolve.resolve`` does, once, before any model work (the nodes call its stage-sized
pieces), and the stages take only its resolved values (their own asserts guard invariants, not user input). The
modes (modes/) chain the stages; ``api.generate`` runs a whole ``Request``. Nothing here imports ComfyUI.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import torch

from . import defaults
from .config import CheckpointError, Cosmos3Config
from .kernels.compile import prepared
from .model.fp8 import fp8_steps
from .model.loader import LinearOps, load_transformer
from .model.precision import W8A16, StepPrecision
from .model.text_kv import TextConditioning, TextKV
from .model.towers import step_memory_required
from .model.transformer import Cosmos3Transformer
from .request import CheckpointInfo, Sampling
from .runtime import DEFAULT, RuntimeOptions
from .sampling.conditioning import encode_condition
from .sampling.loop import SampleResult, StepCallback, run
from .sampling.plan import (
    ActionInput,
    FastModes,
    PlanInputs,
    Prepare,
    SamplePlan,
    generation_tokens,
    make_plan,
    no_prepare,
)
from .sampling.prompt import PromptIds, encode_prompts, load_tokenizer
from .sampling.schedulers import Stepper, load_scheduler_config, make_scheduler, make_stepper
from .vae.audio import Cosmos3SoundDecoder, load_sound_decoder, num_audio_samples, sound_latent_length
from .vae.video import Cosmos3VAE, load_vae

__all__ = ["Cosmos3Pipeline", "GenerationOutput", "TextConditioning"]

_log = logging.getLogger("cosmos3")


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
        info = CheckpointInfo.read(self.checkpoint_dir, transformer.config)
        # what this loaded pipeline can do: sound needs the decoder actually loaded; FP8 is what the model holds
        self.info = dataclasses.replace(info, has_sound=info.has_sound and sound_decoder is not None,
                                        fp8=transformer.fp8_checkpoint)
        self.prefill_count = 0  # text-tower runs since load (tests and the ComfyUI cache check read it)

    @classmethod
    def load(
        cls,
        checkpoint_dir: str | Path,
        *,
        dtype: torch.dtype = torch.bfloat16,
        device: torch.device | str = "cpu",
        with_sound: bool = True,
        ops: LinearOps = LinearOps(),
        storage_dtype: torch.dtype | None = None,
        fp8_compute: bool = False,
        sharding=None,
        gguf_file: str | Path | None = None,
        pinned_staging: bool = True,
    ) -> "Cosmos3Pipeline":
        """``ops``: the transformer's linear-layer classes (``model.loader.LinearOps``, a host's seam);
        ``storage_dtype``: how the transformer's linear weights are stored (``weights.py``);
        ``fp8_compute``: approximate FP8 compute for a bf16 checkpoint (the CLI's ``--weight-dtype fp8_e4m3fn_fast``,
        ``model/fp8.py``); ``sharding``: this rank's part of a tensor-parallel load (``model.loader.WeightSharding``,
        ``parallel.tensor.TensorParallel``); ``gguf_file``: the transformer's weights from a GGUF file, the rest of the
        checkpoint from ``checkpoint_dir`` (``model/gguf_file.py``), its linear layers ``ops.quantized_linear``;
        ``pinned_staging``: a load to a GPU moves the transformer's tensors through pinned buffers
        (``kernels.host_copy``; off: ``Tensor.to``).

        Nothing runs beside the reads: a thread importing the compiler's modules meanwhile (``caches.CompilerPreload``)
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
        vae = load_vae(root, dtype=dtype, device=device)
        sound = None
        if with_sound and config.sound_gen and (root / "sound_tokenizer").is_dir():
            sound = load_sound_decoder(root, dtype=torch.float32, device=device)
        transformer = load_transformer(
            root, dtype=dtype, device=device, skip_modules=("lm_head",), ops=ops,
            storage_dtype=storage_dtype, fp8_compute=fp8_compute, sharding=sharding, gguf_file=gguf_file,
            pinned_staging=pinned_staging,
        )
        return cls(root, transformer, vae, tokenizer, sound)

    @property
    def config(self) -> Cosmos3Config:
        return self.transformer.config

    @property
    def distilled(self):
        """The distilled checkpoint's fixed schedule (sampling/distilled.py), else None."""
        return self.info.distilled

    # ------------------------------------------------------------------ 1. text
    def encode_text(self, prompt: str, negative_prompt: str | None = None, *, num_frames: int, height: int,
                    width: int, fps: float, use_system_prompt: bool | None = None,
                    options: RuntimeOptions = DEFAULT) -> TextConditioning:
        """Render both prompts as trained and run the text tower once per distinct prompt (inputs checked by
        ``resolve.resolve_clip``)."""
        ids = self.tokenize(prompt, negative_prompt, num_frames=num_frames, height=height, width=width, fps=fps,
                            use_system_prompt=use_system_prompt)
        return self.prefill_prompts(ids, num_frames=num_frames, height=height, width=width, fps=fps, options=options)

    def tokenize(self, prompt: str, negative_prompt: str | None = None, *, num_frames: int, height: int, width: int,
                 fps: float, use_system_prompt: bool | None = None) -> PromptIds:
        """Token ids of both branches (templates + chat template); ``None`` negative → the checkpoint default,
        ``None`` system prompt → the checkpoint's setting.

        A distilled checkpoint has no negative branch (``Cosmos3DistilledTextEncoderStep``): the unused uncond ids
        are those of an empty prompt, as the reference builds them (``resolve_clip`` refuses a negative prompt)."""
        if self.distilled is not None:
            negative_prompt = ""
        if negative_prompt is None:
            negative_prompt = self.info.default_negative_prompt
        if use_system_prompt is None:
            use_system_prompt = self.info.default_use_system_prompt
        return encode_prompts(
            self.tokenizer, prompt, negative_prompt, num_frames=num_frames, height=height, width=width, fps=fps,
            use_system_prompt=use_system_prompt,
        )

    def prefill_prompts(self, ids: PromptIds, *, num_frames: int, height: int, width: int, fps: float,
                        options: RuntimeOptions) -> TextConditioning:
        """Both branches' text K/V from one text-tower pass over the distinct prompts (a distilled checkpoint has
        one branch: its uncond K/V would never be used)."""
        one_branch = self.distilled is not None or ids.uncond == ids.cond
        kvs = self.prefill_many([ids.cond] if one_branch else [ids.cond, ids.uncond], options)
        uncond = None if self.distilled is not None else kvs[-1]
        return TextConditioning(kvs[0], uncond, num_frames, height, width, float(fps), ids.cond_text, ids.uncond_text)

    def prefill(self, ids: list[int], options: RuntimeOptions) -> TextKV:
        """One prompt's text K/V (the text tower once)."""
        return self.prefill_many([ids], options)[0]

    def prefill_many(self, prompts: list[list[int]], options: RuntimeOptions) -> list[TextKV]:
        """Several prompts' text K/V in one text-tower pass."""
        self.prefill_count += len(prompts)
        return self.transformer.prefill_many(prompts, options.attention)

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
    def plan(self, text: TextConditioning, sampling: Sampling, *, options: RuntimeOptions,
             x0: torch.Tensor | None = None, clean_frames: Sequence[int] = (), action: ActionInput | None = None,
             generator: torch.Generator | None = None, device: torch.device | str | None = None,
             prepare: Prepare = no_prepare) -> SamplePlan:
        """The ``SamplePlan`` of a run with resolved ``sampling`` (``resolve.resolve_sampler``); nothing is computed
        on the model yet.

        ``device``: where the run's latents live (default: where the generation tower runs now); a caller that moves
        the tower afterwards (ComfyUI's model management) passes the device it will run on. ``generator``: draw the
        noise from it instead of a fresh generator seeded with ``seed`` (a long video's windows share one, as the
        reference's chunk loop). ``options``: the run's kernels, carried by the plan. ``prepare(part, need)``: a
        model manager's hook (ComfyUI's), called before the plan runs the text tower (``"text"``, its token count:
        NVIDIA's FP8 policy re-runs it in the W8A8 steps' modes)."""
        assert not sampling.use_cfg or text.uncond is not None, "resolve_sampler refuses guidance without uncond"
        assert action is None or self.transformer.has_action, "resolve_sampler refuses a checkpoint without actions"
        assert generator is None or not (sampling.distilled or sampling.batch_size != 1)
        latent_shape = self.vae.latent_shape(text.num_frames, text.height, text.width)
        clean_frames = [i for i in clean_frames if i < latent_shape[2]] if x0 is not None else []
        sound_len = sound_latent_length(text.num_frames, text.fps) if sampling.sound else 0
        action_len = 0 if action is None else int(action.values.shape[0])
        num_tokens = generation_tokens(self.config, latent_shape, sound_len, action_len)
        lengths = [text.cond.length] + ([text.uncond.length] if sampling.use_cfg else [])
        device = torch.device(device or self.transformer.device)
        options = options.on(device)  # compile="auto" depends on the run's device
        self.check_memory(step_memory_required(self.config, num_tokens, lengths * sampling.batch_size,
                                               self.transformer.dtype), num_tokens, device)
        if sampling.distilled:  # the checkpoint's sigmas; SDE steps from the noise's generators; re-anchor
            stepper, generators = self.distilled.make_stepper(sampling.seed, sampling.batch_size)
        else:
            stepper = self.stepper(sampling, native_flow_schedule=self.info.native_flow_schedule)
            generators = None if generator is None else [generator]
        inputs = PlanInputs(
            text.cond, text.uncond, tuple(latent_shape), text.fps, stepper, sampling.guidance, options,
            guidance_interval=sampling.guidance_interval, x0=x0, clean_frames=tuple(clean_frames), device=device,
            dtype=self.transformer.dtype, fast=self.fast_modes(text, sampling, len(stepper.timesteps), device, options,
                                                                     prepare),
        )
        return make_plan(self.config, inputs, seed=sampling.seed, batch_size=sampling.batch_size,
                         sound_len=sound_len, action=action, reanchor_vision=sampling.distilled,
                         generators=generators)

    def stepper(self, sampling: Sampling, *, native_flow_schedule: bool) -> Stepper:
        """A fresh UniPC stepper of ``sampling``'s schedule on this checkpoint's scheduler config;
        ``native_flow_schedule``: the checkpoint's ``use_native_flow_schedule`` sigmas (``Cosmos3SetTimestepsStep``;
        Transfer's ``Cosmos3TransferSetTimestepsStep`` never uses them)."""
        scheduler = make_scheduler(self.scheduler_config, sampling.steps, schedule=sampling.schedule,
                                   shift=sampling.shift, native_flow_schedule=native_flow_schedule)
        return make_stepper(scheduler)

    def fast_modes(self, text: TextConditioning, sampling: Sampling, steps: int, device: torch.device,
                   options: RuntimeOptions, prepare: Prepare = no_prepare) -> FastModes:
        """The plan's fast modes for a run of ``steps`` on ``device``: each step's FP8 modes on the loaded layers
        (``fp8.fp8_steps``; a notice is logged where the checkpoint's W8A8 steps cannot run) with the text K/V in
        those modes, and the run's SeaCache. ``prepare``: as in ``plan``."""
        fp8 = fp8_steps(self.transformer, sampling.mixed_precision, steps, device, options.fp8_gemm)
        if fp8 is None:
            return FastModes(sea_cache=sampling.sea_cache)
        (_log.warning if fp8.fallback else _log.info)("FP8: %s", fp8.note)
        if fp8.modes is None:
            return FastModes(sea_cache=sampling.sea_cache, fp8=fp8.note)
        with_uncond = sampling.use_cfg and text.uncond is not None
        return FastModes(fp8.modes, self.text_in_precision(text, options, prepare, with_uncond), sampling.sea_cache,
                         fp8.note)

    def text_in_precision(self, text: TextConditioning, options: RuntimeOptions, prepare: Prepare = no_prepare,
                          with_uncond: bool = True):
        """``modes → (cond, uncond)`` text K/V computed in the FP8 modes ``modes`` (the reference re-runs the text
        tower in each step's modes): the text tower's linears are the reference's "generation" (``to_q/k/v/out``)
        and "reasoner" (``mlp``) paths; their W8A16 modes are the conditioning as encoded, other modes re-run the
        tower from the prompts' token ids (the negative one only ``with_uncond``; else its K/V is None), after
        ``prepare("text", tokens)``, once per modes for this plan — or for as long as ``text.in_precision`` keeps
        them (a long video's windows), left on the tower's device."""
        done = text.in_precision if text.in_precision is not None else {}

        def text_for(modes: StepPrecision):
            tower = (modes.generation, modes.reasoner)
            if tower == (W8A16, W8A16):
                return text.cond, text.uncond if with_uncond else None
            if (tower, with_uncond) not in done:
                ids = [text.cond.token_ids] + ([text.uncond.token_ids] if with_uncond else [])
                prepare("text", sum(len(i) for i in ids))
                self.prefill_count += len(ids)
                kvs = self.transformer.prefill_many(ids, options.attention, modes)
                done[(tower, with_uncond)] = (kvs[0], kvs[1] if with_uncond else None)
            return done[(tower, with_uncond)]

        return text_for

    @staticmethod
    def check_memory(need: int, num_tokens: int, device: torch.device) -> None:
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
                f"one denoising step of this clip ({num_tokens:,} generation tokens) needs about "
                f"{need / 2**30:.1f} GiB on {device}, which has {capacity / 2**30:.1f} GiB; lower width/height or "
                "num_frames (e.g. 1280x720 with 189 frames, or 832x480 with 93)."
            )

    def run(self, plan: SamplePlan, callback: StepCallback | None = None, denoiser=None) -> SampleResult:
        """Denoise ``plan`` with the kernels its ``options`` name. ``denoiser``: runs the steps instead of the
        transformer, with its ``denoise_step`` contract (``sampling.loop.Denoiser``: parallel/), SeaCache aside."""
        if denoiser is not None and plan.cache is not None:
            raise ValueError("sea_cache: SeaCache runs on one GPU; the guidance split over two GPUs and torchrun "
                             "parallelism do not take it yet — turn sea_cache off there, or run on one GPU.")
        if plan.options.compiles:
            prepared()  # the compile settings in this run's context (kernels/compile.py)
        x = run(plan, denoiser or self.transformer, callback)
        return SampleResult(latents=x["vision"], sound=x.get("sound"), action=x.get("action"))

    # ------------------------------------------------------------------ 4. decode
    def decode_video(self, latents: torch.Tensor, *, options: RuntimeOptions = DEFAULT, on_chunk=None,
                     **kwargs) -> torch.Tensor:
        """``[N, 48, T, h, w]`` → frames ``[N·F, H, W, 3]`` (items one after another; ComfyUI's IMAGE batch);
        ``on_chunk(done, total)`` counts latent frames over the whole batch; ``options.vae_compile``: the compiled
        steady-state frame decoder (runtime.py)."""
        n, t = latents.shape[0], latents.shape[2]
        kwargs.setdefault("compile", options.on(self.vae.device).vae_compile)
        kwargs.setdefault("compile_backend", options.compile_backend)
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

    def run_and_decode(self, plan: SamplePlan, timings: dict[str, float], num_frames: int, fps: float, *,
                       callback: StepCallback | None, decode: bool = True) -> GenerationOutput:
        """The stages after planning that every whole run shares: denoise, then decode the video and sound."""
        with timed(timings, "inference"):
            result = self.run(plan, callback=callback)
        frames = waveform = None
        if decode:
            with timed(timings, "decode"):
                frames = self.decode_video(result.latents, options=plan.options)
                if result.sound is not None:
                    waveform = self.decode_sound(result.sound[0], num_frames, fps)
        sound = None if result.sound is None else result.sound[0]
        action = None if result.action is None else result.action[0]
        return GenerationOutput(result.latents, sound, frames, waveform, timings, action)


@contextmanager
def timed(timings: dict[str, float], name: str):
    """Adds the block's wall time (device work included) to ``timings[name]``."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    try:
        yield
    finally:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        timings[name] = timings.get(name, 0.0) + time.perf_counter() - start

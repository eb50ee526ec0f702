"""The one place that decides a Cosmos3 sampling run: ``SamplePlan``.

Everything a run needs is fixed here, before the first step, and every check of a sampling request happens here
once: the latent shape of every stream (vision, sound, action), each stream's starting values (seeded noise mixed
with its clean conditioning), its update rule (a stepper over a diffusers scheduler) and what is re-anchored after
each step, the guidance branches of each step (text K/V, token layout, how their velocities combine), the
timesteps and the memory one step needs. ``sampling.run`` then only iterates; it knows no modes.

What is decided follows diffusers 0.42.1 ``Cosmos3OmniPipeline.__call__`` (steps 4–7) and, for the action stream,
the modular ``Cosmos3ActionPrepareLatentsStep`` / ``Cosmos3ActionLoopSchedulerStep``:

* sampling state in fp32; noise from one seeded CPU ``torch.Generator`` (device independent) drawn in the order
  vision ``[1, 48, T, h, w]``, sound ``[1, 64, Ts]``, action ``[1, Ta, action_dim]``; a batch of ``N`` items
  (ComfyUI's ``batch_size``) runs seeds ``seed … seed+N−1``, each item drawn from its own generator, stacked with
  the guidance branches into one forward (rows ``[cond × N | uncond × N]``);
* ``latents = mask·x0 + (1−mask)·noise`` per stream (clean latent frames, clean actions);
* one UniPC scheduler for vision and a deep copy each for sound and action (own history, same sigmas) — or, for a
  distilled checkpoint (``distilled.py``), the checkpoint's stochastic FlowMatchEuler stepper drawing from the
  noise's generator, with the conditioned frames re-anchored after every step; the action
  channels beyond the raw action dimension are zero at the start and after every step; a stream with nothing
  noisy (inverse dynamics' actions) is never stepped;
* CFG ``v = v_u + g·(v_c − v_u)`` for every stream; ``guidance == 1`` runs the cond branch alone; an optional
  ``guidance_interval`` (a speed option, not the reference) drops the uncond branch for timesteps outside
  ``[low, high]``.

Transfer windows (``transfer.py``) build the same ``SamplePlan`` with more branches and their nested combine; a
long video is one plan per window (``long_video.py``). A plan holds stateful schedulers: it is run once.

The fast modes are decided here too, per step, and reach the model through ``SamplePlan.step_options``: each
``Guidance`` carries its step's FP8 modes (``precision``, a ``model.precision.StepPrecision`` key, with the text
K/V computed in those modes) and its branch names (the reference's cache contexts); a run with SeaCache holds its
``sea_cache.SeaCache`` (``cache``: fresh contexts, one plan per run or window), which the model's step consults.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from .. import defaults
from ..config import Cosmos3Config
from ..model.layout import GenLayout, build_layout, patch_grid, select_branch
from .schedulers import Stepper
from .sea_cache import CacheStep, SeaCache, SeaCacheConfig
from ..model.text_kv import TextKV
from ..model.towers import step_memory_required
from ..runtime import DEFAULT, RuntimeOptions


# ---------------------------------------------------------------------------------------------- request checks
def check_clip(num_frames, height, width, fps) -> None:
    """Clip-shape rules of the Wan2.2 VAE (4×16×16) with one clear message per violation."""
    stride = defaults.VAE_SPATIAL_STRIDE
    if isinstance(num_frames, bool) or not isinstance(num_frames, int) or num_frames < 1 or (num_frames - 1) % 4:
        fixed = max(1, (int(num_frames) - 1) // 4 * 4 + 1) if isinstance(num_frames, (int, float)) else 93
        raise ValueError(
            f"num_frames={num_frames!r} must be 1 (an image) or 4k+1 (video: 5, 9, …, 93, 121, 189); try {fixed}."
        )
    if num_frames > defaults.MAX_FRAMES:
        raise ValueError(f"num_frames={num_frames} is above the limit of {defaults.MAX_FRAMES} frames.")
    for name, value in (("height", height), ("width", width)):
        if isinstance(value, bool) or not isinstance(value, int) or value < stride or value % stride:
            fixed = max(stride, int(value) // stride * stride) if isinstance(value, (int, float)) else 480
            raise ValueError(f"{name}={value!r} must be a positive multiple of {stride}; try {fixed}.")
        if value > defaults.MAX_SIZE:
            raise ValueError(f"{name}={value} is above the limit of {defaults.MAX_SIZE} pixels.")
    if not (isinstance(fps, (int, float)) and math.isfinite(fps) and defaults.MIN_FPS <= fps <= defaults.MAX_FPS):
        raise ValueError(f"fps={fps!r} must be a number from {defaults.MIN_FPS:g} to {defaults.MAX_FPS:g} "
                         f"(e.g. {defaults.FPS:g}).")


def check_sampling(*, seed, steps, guidance, schedule, shift, guidance_interval, batch_size) -> None:
    """Every check of the sampling arguments (values, not the clip shape), one message per mistake."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= defaults.MAX_SEED:
        raise ValueError(f"seed={seed!r} must be an integer from 0 to 2**64-1.")
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= defaults.MAX_STEPS):
        raise ValueError(f"steps={steps!r} must be an integer from 1 to {defaults.MAX_STEPS} "
                         f"(the defaults: {defaults.STEPS_VIDEO} for video, {defaults.STEPS_IMAGE} for an image).")
    if guidance is not None and not (isinstance(guidance, (int, float)) and math.isfinite(guidance) and 0 <= guidance <= defaults.MAX_GUIDANCE):
        raise ValueError(f"guidance (cfg)={guidance!r} must be a number from 0 to {defaults.MAX_GUIDANCE:g} "
                         f"(1 = no guidance; the default is {defaults.GUIDANCE:g}).")
    if schedule not in defaults.SCHEDULES:
        raise ValueError(f"schedule={schedule!r} is not one of {list(defaults.SCHEDULES)}.")
    if shift is not None and not (isinstance(shift, (int, float)) and math.isfinite(shift) and 0 < shift <= defaults.MAX_SHIFT):
        raise ValueError(f"shift={shift!r} must be a number above 0 and at most {defaults.MAX_SHIFT:g} "
                         "(or unset: by resolution, 720p 10, 480p 5, 256p 3).")
    if guidance_interval is not None:
        low, high = guidance_interval
        if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in (low, high)) or not 0 <= low <= high <= 1000:
            raise ValueError(f"guidance_interval={list(guidance_interval)!r} must be LOW HIGH with "
                             "0 <= LOW <= HIGH <= 1000 (timesteps; e.g. 800 1000 drops the negative branch late).")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or not 1 <= batch_size <= defaults.MAX_BATCH_SIZE:
        raise ValueError(f"batch_size={batch_size!r} must be an integer from 1 to {defaults.MAX_BATCH_SIZE}.")


# ---------------------------------------------------------------------------------------------- plan parts
@dataclass(frozen=True)
class ActionInput:
    """The action stream of a world-model run (prepared by ``action.py``)."""

    values: torch.Tensor  # [Ta, action_dim] clean actions (raw actions zero-padded); zeros where noisy
    clean: tuple[int, ...]  # indexes of the given (clean) actions
    domain_id: int  # embodiment domain of the action head
    raw_dim: int | None  # channels at and beyond raw_dim stay zero


@dataclass
class Stream:
    """One denoised latent stream: its starting values, its update rule and what is re-anchored after each step."""

    name: str  # the transformer stream it feeds: "vision" | "sound" | "action"
    init: torch.Tensor  # [N, ...] fp32, on the run's device
    stepper: Stepper | None  # None: nothing noisy, never stepped
    anchor: torch.Tensor | None = None  # clean values written back after every step where anchor_mask is 1
    anchor_mask: torch.Tensor | None = None

    def step(self, velocity: torch.Tensor, index: int, latents: torch.Tensor) -> torch.Tensor:
        latents = self.stepper.step(velocity, index, latents)
        if self.anchor is not None:
            latents = self.anchor_mask * self.anchor + (1.0 - self.anchor_mask) * latents
        return latents


@dataclass(frozen=True)
class Guidance:
    """The branches of one step: their text K/V and token layout, and how their velocities combine."""

    text: tuple[TextKV, ...]
    layout: GenLayout
    combine: Callable[[torch.Tensor], torch.Tensor]  # [B·N, ...] branch-major → [N, ...]
    precision: str | None = None  # the step's FP8 modes (StepPrecision key); None: every linear's forward
    names: tuple[str, ...] = ()  # the branches' cache-context names ("cond", "uncond"; Transfer "cond_no_control")


def cfg_combine(guidance: float) -> Callable[[torch.Tensor], torch.Tensor]:
    """``v_u + g·(v_c − v_u)`` over rows ``[cond × N | uncond × N]`` (the reference's order of operations)."""
    def combine(v: torch.Tensor) -> torch.Tensor:
        cond, uncond = v.view(2, -1, *v.shape[1:]).unbind(0)
        return uncond + guidance * (cond - uncond)
    return combine


def single_branch(v: torch.Tensor) -> torch.Tensor:
    return v


@dataclass
class SamplePlan:
    streams: tuple[Stream, ...]
    guidance: tuple[Guidance, ...]  # one per step (steps share the few distinct objects)
    sigmas: torch.Tensor  # [steps + 1] on the CPU (preview: x0 = x − σ·v)
    timesteps: torch.Tensor  # [steps] int64 on the CPU
    device: torch.device
    memory_required: int  # bytes one step needs beyond the generation tower's weights
    num_tokens: int  # generation tokens of one branch
    batch_size: int = 1
    options: RuntimeOptions = DEFAULT  # the run's kernels (runtime.py), handed to the model's step
    cache: SeaCache | None = None  # SeaCache of this run (its contexts start empty)
    noisy_vision: bool = True  # whether the vision target has a noisy frame (SeaCache's indicator needs one)
    fp8: str | None = None  # the FP8 policy in effect, or why W8A16 (one line for the log and the nodes)

    @property
    def steps(self) -> int:
        return len(self.guidance)

    @property
    def precision(self) -> tuple[str | None, ...]:
        """The FP8 modes of every step."""
        return tuple(g.precision for g in self.guidance)

    def step_options(self, i: int) -> dict:
        """The keyword arguments step ``i`` passes to ``denoise_step`` beyond the tensors: the run's options, and
        its FP8 modes and SeaCache view where it has them (so a denoiser with the basic contract runs a plain run)."""
        g, options = self.guidance[i], {"options": self.options}
        if g.precision is not None:
            options["precision"] = g.precision
        if self.cache is not None:
            names = g.names or ("cond", "uncond")[: len(g.text)]
            options["cache"] = CacheStep(self.cache, i, float(self.sigmas[i]), self.steps, names, self.noisy_vision)
        return options

    def stream(self, name: str) -> Stream | None:
        return next((s for s in self.streams if s.name == name), None)


# ---------------------------------------------------------------------------------------------- building
def generation_tokens(config: Cosmos3Config, latent_shape: Sequence[int], sound_len: int = 0, action_len: int = 0) -> int:
    """Generation-stream tokens of one branch: 2×2 vision patches of every latent frame, then sound, then action."""
    t, ph, pw = patch_grid(latent_shape[2:], config.latent_patch_size)
    return t * ph * pw + sound_len + action_len


def initial_noise(seed: int, shapes: Sequence[Sequence[int]], generator: torch.Generator | None = None
                  ) -> list[torch.Tensor]:
    """Seeded fp32 noise drawn in the given order from one CPU generator — device independent. ``generator``: draw
    from this one (already seeded) instead, e.g. the one a stochastic stepper then continues from."""
    generator = generator if generator is not None else torch.Generator("cpu").manual_seed(int(seed))
    return [torch.randn(tuple(shape), generator=generator, dtype=torch.float32) for shape in shapes]


def make_plan(
    config: Cosmos3Config,
    *,
    cond: TextKV,
    uncond: TextKV | None,
    latent_shape: Sequence[int],
    fps: float,
    seed: int,
    guidance: float,
    vision_stepper: Stepper,
    x0: torch.Tensor | None = None,
    clean_frames: Sequence[int] = (),
    sound_len: int = 0,
    action: ActionInput | None = None,
    guidance_interval: tuple[float, float] | None = None,
    reanchor_vision: bool = False,
    batch_size: int = 1,
    generators: Sequence[torch.Generator] | None = None,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    options: RuntimeOptions = DEFAULT,
    step_precision: Sequence[str] | None = None,
    text_for: Callable[[str], tuple[TextKV, TextKV | None]] | None = None,
    sea_cache: SeaCacheConfig | None = None,
    fp8: str | None = None,
) -> SamplePlan:
    """Assemble the plan of one run from checked arguments (see ``Cosmos3Pipeline.plan`` for the user-facing checks).

    ``generators``: per batch item, the seeded CPU generator of its initial noise when the vision stepper draws from
    it too (a stochastic scheduler: diffusers' distilled pipeline passes one generator to both, noise first).
    ``step_precision``: per step, the FP8 modes (``model.precision.StepPrecision`` key), with ``text_for(key)``
    the (cond, uncond) text K/V computed in those modes; ``sea_cache``: run with SeaCache (checked by the caller);
    ``fp8``: the policy's line for the log."""
    device = torch.device(device)
    use_cfg = guidance != 1.0
    if use_cfg and uncond is None:
        raise ValueError(f"guidance != 1 needs the negative prompt's text K/V (uncond).")
    t_lat = int(latent_shape[2])
    clean_frames = sorted({int(i) for i in clean_frames})
    actions_noisy = action is not None and len(set(action.clean)) < int(action.values.shape[0])
    if clean_frames and len(clean_frames) >= t_lat and not actions_noisy:  # inverse dynamics: only actions are noisy
        raise ValueError(
            f"the condition keeps {len(clean_frames)} clean latent frames but a "
            f"{defaults.pixel_frames(t_lat)}-frame clip has only {t_lat}; nothing would be generated (the prompt and "
            "seed would be ignored). Lower clean_latent_frames (CLI: condition on a shorter clip) or raise num_frames."
        )
    branches = [kv.to(device) for kv in ([cond, uncond] if use_cfg else [cond])]
    action_len = 0 if action is None else int(action.values.shape[0])
    layout = build_layout(
        config, [kv.length for kv in branches], latent_shape[2:], fps, clean_frames=clean_frames,
        sound_len=sound_len, action_len=action_len, clean_actions=() if action is None else action.clean,
        domain_id=None if action is None else action.domain_id, device=device, dtype=dtype,
    )

    # starting values: noise in the reference order, mixed with each stream's clean values; batch item k is the
    # single run of seed + k (its own generator, wrapping past 2**64-1 like torch seeds), so every item equals its
    # own single run
    shapes = [tuple(latent_shape)]
    if sound_len:
        shapes.append((1, config.sound_dim, sound_len))
    if action is not None:
        shapes.append((1, *action.values.shape))
    per_item = [initial_noise((seed + k) % (defaults.MAX_SEED + 1), shapes,
                              None if generators is None else generators[k]) for k in range(batch_size)]
    noise = [torch.cat(parts) for parts in zip(*per_item)]  # each [N, ...]
    streams = [vision_stream(latent_shape, noise[0], vision_stepper, x0=x0, clean_frames=clean_frames,
                             reanchor=reanchor_vision, device=device)]
    if sound_len:
        streams.append(Stream("sound", noise[1].to(device), vision_stepper.fork()))
    if action is not None:
        streams.append(_action_stream(action, noise[-1], vision_stepper, device))

    timesteps = vision_stepper.timesteps.cpu()
    precisions = list(step_precision) if step_precision is not None else [None] * len(timesteps)
    if len(precisions) != len(timesteps):
        raise ValueError(f"{len(precisions)} step precisions for {len(timesteps)} steps.")
    cond_layout = select_branch(layout, 0) if use_cfg else layout
    made: dict[tuple[bool, str | None], Guidance] = {}

    def step_guidance(with_uncond: bool, precision: str | None) -> Guidance:
        if (with_uncond, precision) not in made:
            text = branches if text_for is None or precision is None else [
                kv.to(device) for kv in text_for(precision) if kv is not None][: len(branches)]
            made[(with_uncond, precision)] = (
                Guidance(tuple(text), layout, cfg_combine(float(guidance)), precision, ("cond", "uncond"))
                if with_uncond else Guidance(tuple(text[:1]), cond_layout, single_branch, precision, ("cond",)))
        return made[(with_uncond, precision)]

    per_step = tuple(step_guidance(use_cfg and _in_interval(int(t), guidance_interval), p)
                     for t, p in zip(timesteps, precisions))
    num_tokens = layout.num_tokens
    return SamplePlan(
        streams=tuple(streams), guidance=per_step, sigmas=vision_stepper.sigmas.cpu(), timesteps=timesteps,
        device=device, num_tokens=num_tokens, batch_size=batch_size, options=options,
        memory_required=step_memory_required(config, num_tokens, list(layout.text_lengths) * batch_size, dtype),
        cache=None if sea_cache is None else SeaCache(sea_cache), noisy_vision=len(clean_frames) < t_lat, fp8=fp8,
    )


def vision_stream(latent_shape: Sequence[int], noise: torch.Tensor, stepper: Stepper, *,
                  x0: torch.Tensor | None = None, clean_frames: Sequence[int] = (), reanchor: bool = False,
                  device: torch.device | str = "cpu") -> Stream:
    """The video latent stream: ``mask·x0 + (1−mask)·noise`` with the clean conditioning frames of ``x0`` (which may
    hold only the leading latent frames), re-anchored to them after every step when ``reanchor`` (a stochastic
    scheduler re-noises every position)."""
    t_lat = int(latent_shape[2])
    clean_frames = list(clean_frames)
    mask = torch.zeros(t_lat, 1, 1)
    mask[clean_frames] = 1.0
    clean = torch.zeros(tuple(latent_shape))
    if x0 is not None:
        if x0.shape[2] <= max(clean_frames, default=-1) or tuple(x0.shape[3:]) != tuple(latent_shape[3:]):
            raise ValueError(
                f"conditioning latents {tuple(x0.shape)} do not cover clean frames {clean_frames} of a latent "
                f"{tuple(latent_shape)}; encode the condition at the clip's width and height."
            )
        frames = min(x0.shape[2], t_lat)
        clean[:, :, :frames] = x0[:, :, :frames].detach().float().cpu()
    init = (mask * clean + (1.0 - mask) * noise).to(device)
    anchor = dict(anchor=clean.to(device), anchor_mask=mask.to(device)) if reanchor and clean_frames else {}
    return Stream("vision", init, stepper, **anchor)


def _action_stream(action: ActionInput, noise: torch.Tensor, stepper: Stepper, device) -> Stream:
    ta = action.values.shape[0]
    mask = torch.zeros(ta, 1)
    mask[list(action.clean)] = 1.0
    init = mask * action.values.float() + (1.0 - mask) * noise  # [N, Ta, action_dim]
    if action.raw_dim is not None:
        init[..., action.raw_dim:] = 0
    frozen = len(set(action.clean)) >= ta
    fork = None if frozen else stepper.fork(keep_channels=action.raw_dim)
    return Stream("action", init.to(device), fork)


def _in_interval(t: int, interval: tuple[float, float] | None) -> bool:
    if interval is None:
        return True
    low, high = interval
    return low <= t <= high

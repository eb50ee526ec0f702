"""The plan of a Cosmos3 sampling run (``SamplePlan``), assembled from resolved values (``resolve.py`` decides
them).

Everything a run needs is fixed here, before the first step: the latent shape of every stream (vision, sound, action),
each stream's starting values (seeded noise mixed with its clean conditioning), its update rule (a stepper over a
diffusers scheduler) and what is re-anchored after each step, the guidance branches of each step (text K/V, token
layout, how their velocities combine), the timesteps and the memory one step needs. ``sampling.run`` then only iterates;
it knows no modes.

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

The fast modes (``FastModes``) are laid out here per step and reach the model through ``SamplePlan.step_options``:
each ``Guidance`` carries its step's FP8 modes (``precision``, a ``model.precision.StepPrecision``, with the text
K/V computed in those modes) and its branch names (the reference's cache contexts); a run with SeaCache holds its
``sea_cache.SeaCache`` (``cache``: fresh contexts, one plan per run or window), which the model's step consults.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from .. import defaults
from ..config import Cosmos3Config
from ..model.layout import ActionTokens, GenLayout, build_layout, patch_grid, select_branch
from ..model.precision import StepPrecision
from ..model.text_kv import TextKV
from ..model.towers import step_memory_required
from ..runtime import RuntimeOptions
from .schedulers import Stepper
from .sea_cache import CacheStep, SeaCache, SeaCacheConfig


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
    precision: StepPrecision | None = None  # the step's FP8 modes; None: every linear's forward
    names: tuple[str, ...] = ()  # the branches' cache-context names ("cond", "uncond"; Transfer "cond_no_control")


TextFor = Callable[[StepPrecision], tuple[TextKV, TextKV | None]]
# prepare(part, need) before each use of a model part: ("text", token count), ("generation", plan),
# ("vae", latent shape), ("sound", None) — a model manager loads the part there (ComfyUI); default: nothing
Prepare = Callable[[str, Any], None]


def no_prepare(part: str, need: Any) -> None:
    return None


class TextOnDevice:
    """The text K/V a plan holds on its device: each distinct ``TextKV`` — the branches' (``sources``) and those
    ``FastModes.text_for`` computes in other FP8 modes — moved there once, however many steps share it;
    ``extra_bytes``: what it holds beyond the branches' K/V (which ``step_memory_required`` counts), whether or not
    it was there before the plan (room a run needs on the card; for a model manager's load, K/V already on the GPU
    are counted twice — on the safe side, as the branches' are)."""

    def __init__(self, device: torch.device | str, sources: Sequence[TextKV]):
        self.device = device
        self.moved: dict[int, tuple[TextKV, TextKV]] = {}  # id(source) → (source, on the device)
        self.branches = [self(kv) for kv in sources]
        self._branch_ids = {id(kv) for kv in sources}

    def __call__(self, kv: TextKV) -> TextKV:
        if id(kv) not in self.moved:
            self.moved[id(kv)] = (kv, kv.to(self.device))
        return self.moved[id(kv)][1]

    @property
    def extra_bytes(self) -> int:
        return sum(kv.keys.nbytes + kv.values.nbytes for key, (_, kv) in self.moved.items()
                   if key not in self._branch_ids)


@dataclass(frozen=True)
class FastModes:
    """The fast modes of a run, laid out per step (``Cosmos3Pipeline.fast_modes``): ``step_precision[i]`` the FP8
    modes of step ``i`` (``None``: every linear's forward at every step) with ``text_for(modes)`` the (cond, uncond)
    text K/V computed in those modes; ``sea_cache`` the checked SeaCache knobs (``None``: off); ``fp8`` the FP8
    policy in effect, or why W8A16, in one line for the log and the nodes."""

    step_precision: tuple[StepPrecision, ...] | None = None
    text_for: TextFor | None = None
    sea_cache: SeaCacheConfig | None = None
    fp8: str | None = None


@dataclass(frozen=True)
class PlanInputs:
    """What every plan is built from (``make_plan``; Transfer's ``make_transfer_plan``): the branches' text K/V,
    the clip's latent shape and fps, the vision stepper, the guidance, the clean conditioning, where it runs and
    its fast modes. ``x0`` may hold only the leading latent frames; only ``clean_frames`` of it are read."""

    cond: TextKV
    uncond: TextKV | None
    latent_shape: tuple[int, ...]  # [N=1, 48, T, h, w]
    fps: float
    stepper: Stepper
    guidance: float
    options: RuntimeOptions  # the run's kernels (runtime.py), handed to the model's step
    guidance_interval: tuple[float, float] | None = None
    x0: torch.Tensor | None = None
    clean_frames: tuple[int, ...] = ()
    device: torch.device = torch.device("cpu")
    dtype: torch.dtype = torch.float32
    fast: FastModes = FastModes()

    @property
    def latent_frames(self) -> int:
        return int(self.latent_shape[2])


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
    options: RuntimeOptions  # the run's kernels (runtime.py), handed to the model's step
    batch_size: int = 1
    cache: SeaCache | None = None  # SeaCache of this run (its contexts start empty)
    noisy_vision: bool = True  # whether the vision target has a noisy frame (SeaCache's indicator needs one)
    fp8: str | None = None  # the FP8 policy in effect, or why W8A16 (one line for the log and the nodes)

    @property
    def steps(self) -> int:
        return len(self.guidance)

    @property
    def precision(self) -> tuple[StepPrecision | None, ...]:
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
def generation_tokens(config: Cosmos3Config, latent_shape: Sequence[int], sound_len: int = 0,
                      action_len: int = 0) -> int:
    """Generation-stream tokens of one branch: 2×2 vision patches of every latent frame, then sound, then action."""
    t, ph, pw = patch_grid(latent_shape[2:], config.latent_patch_size)
    return t * ph * pw + sound_len + action_len


def initial_noise(seed: int, shapes: Sequence[Sequence[int]], generator: torch.Generator | None = None
                  ) -> list[torch.Tensor]:
    """Seeded fp32 noise drawn in the given order from one CPU generator — device independent. ``generator``: draw
    from this one (already seeded) instead, e.g. the one a stochastic stepper then continues from."""
    generator = generator if generator is not None else torch.Generator("cpu").manual_seed(int(seed))
    return [torch.randn(tuple(shape), generator=generator, dtype=torch.float32) for shape in shapes]


def make_plan(config: Cosmos3Config, inputs: PlanInputs, *, seed: int, batch_size: int = 1, sound_len: int = 0,
              action: ActionInput | None = None, reanchor_vision: bool = False,
              generators: Sequence[torch.Generator] | None = None) -> SamplePlan:
    """Assemble the plan of one run from resolved values (``Cosmos3Pipeline.plan``).

    ``generators``: per batch item, the seeded CPU generator of its initial noise when the vision stepper draws from
    it too (a stochastic scheduler: diffusers' distilled pipeline passes one generator to both, noise first);
    ``reanchor_vision``: write the clean frames back after every step (such a stepper re-noises every position)."""
    i = inputs
    use_cfg = i.guidance != 1.0
    assert not use_cfg or i.uncond is not None, "guidance != 1 needs the uncond text K/V (resolve_sampler)"
    clean_frames = sorted({int(f) for f in i.clean_frames})
    actions_noisy = action is not None and len(set(action.clean)) < int(action.values.shape[0])
    if clean_frames and len(clean_frames) >= i.latent_frames and not actions_noisy:  # inverse dynamics: actions
        raise ValueError(
            f"the condition keeps {len(clean_frames)} clean latent frames but a "
            f"{defaults.pixel_frames(i.latent_frames)}-frame clip has only {i.latent_frames}; nothing would be "
            "generated (the prompt and seed would be ignored). Lower clean_latent_frames (CLI: condition on a "
            "shorter clip) or raise num_frames."
        )
    texts = TextOnDevice(i.device, [i.cond, i.uncond] if use_cfg else [i.cond])
    branches = texts.branches
    tokens = None if action is None else ActionTokens(int(action.values.shape[0]), tuple(action.clean),
                                                      action.domain_id)
    layout = build_layout(config, [kv.length for kv in branches], i.latent_shape[2:], i.fps,
                          clean_frames=clean_frames, sound_len=sound_len, action=tokens, device=i.device,
                          dtype=i.dtype)
    streams = _initial_streams(config, i, clean_frames, seed=seed, batch_size=batch_size, sound_len=sound_len,
                               action=action, reanchor_vision=reanchor_vision, generators=generators)
    timesteps = i.stepper.timesteps.cpu()
    per_step = _per_step_guidance(i, texts, layout, timesteps)
    return SamplePlan(
        streams=streams, guidance=per_step, sigmas=i.stepper.sigmas.cpu(), timesteps=timesteps, device=i.device,
        num_tokens=layout.num_tokens, batch_size=batch_size, options=i.options,
        memory_required=step_memory_required(config, layout.num_tokens, list(layout.text_lengths) * batch_size,
                                             i.dtype) + texts.extra_bytes,
        cache=None if i.fast.sea_cache is None else SeaCache(i.fast.sea_cache),
        noisy_vision=len(clean_frames) < i.latent_frames, fp8=i.fast.fp8,
    )


def _initial_streams(config: Cosmos3Config, i: PlanInputs, clean_frames: list[int], *, seed: int, batch_size: int,
                     sound_len: int, action: ActionInput | None, reanchor_vision: bool,
                     generators: Sequence[torch.Generator] | None) -> tuple[Stream, ...]:
    """Every stream's starting values: noise in the reference order, mixed with each stream's clean values; batch
    item k is the single run of seed + k (its own generator, wrapping past 2**64-1 like torch seeds), so every item
    equals its own single run."""
    shapes = [tuple(i.latent_shape)]
    if sound_len:
        shapes.append((1, config.sound_dim, sound_len))
    if action is not None:
        shapes.append((1, *action.values.shape))
    per_item = [initial_noise((seed + k) % (defaults.MAX_SEED + 1), shapes,
                              None if generators is None else generators[k]) for k in range(batch_size)]
    noise = [torch.cat(parts) for parts in zip(*per_item)]  # each [N, ...]
    streams = [vision_stream(i.latent_shape, noise[0], i.stepper, x0=i.x0, clean_frames=clean_frames,
                             reanchor=reanchor_vision, device=i.device)]
    if sound_len:
        streams.append(Stream("sound", noise[1].to(i.device), i.stepper.fork()))
    if action is not None:
        streams.append(_action_stream(action, noise[-1], i.stepper, i.device))
    return tuple(streams)


def _per_step_guidance(i: PlanInputs, texts: TextOnDevice, layout: GenLayout,
                       timesteps: torch.Tensor) -> tuple[Guidance, ...]:
    """Each step's branches: both (CFG) inside the guidance interval, the cond branch alone outside it; in the
    step's FP8 modes, with the text K/V computed in them. Steps share the few distinct ``Guidance`` objects."""
    branches = texts.branches
    use_cfg = len(branches) == 2
    modes = i.fast.step_precision if i.fast.step_precision is not None else (None,) * len(timesteps)
    assert len(modes) == len(timesteps), (len(modes), len(timesteps))
    cond_layout = select_branch(layout, 0) if use_cfg else layout
    made: dict[tuple[bool, StepPrecision | None], Guidance] = {}

    def step_guidance(with_uncond: bool, precision: StepPrecision | None) -> Guidance:
        if (with_uncond, precision) not in made:
            text = branches if i.fast.text_for is None or precision is None else [
                texts(kv) for kv in i.fast.text_for(precision)[: len(branches)]]
            made[(with_uncond, precision)] = (
                Guidance(tuple(text), layout, cfg_combine(float(i.guidance)), precision, ("cond", "uncond"))
                if with_uncond else Guidance(tuple(text[:1]), cond_layout, single_branch, precision, ("cond",)))
        return made[(with_uncond, precision)]

    return tuple(step_guidance(use_cfg and in_interval(int(t), i.guidance_interval), p)
                 for t, p in zip(timesteps, modes))


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


def in_interval(t: int, interval: tuple[float, float] | None) -> bool:
    """Whether timestep ``t`` lies in ``[low, high]`` (no interval: always)."""
    return interval is None or float(interval[0]) <= float(t) <= float(interval[1])

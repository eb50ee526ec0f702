"""Transfer: video generation steered by control videos (edge / blur / depth / seg / wsm), one window at a time.

Mirrors diffusers 0.42.1 modular Cosmos3 Transfer blocks (``modular_pipelines/cosmos/``):

* ``transfer_prompt_ids`` = ``Cosmos3TransferTextStep``: the prompt verbatim (no duration/resolution templates) under
  the Transfer system prompt, ``[eos, <|vision_start|>]`` appended; a missing negative prompt is ``""``.
* ``prepare_controls`` = ``Cosmos3TransferSetupStep``: every control video preprocessed like ``VideoProcessor.
  preprocess_video`` (conditioning.py) in the canonical key order, the output length taken from the controls
  (optionally capped), then reflect-padded along time to at least one window.
* ``control_latents`` = the control half of ``Cosmos3TransferChunkVaeEncoderStep``: each control's window slice,
  reflect-padded to a full window, VAE-encoded; they become the layout's prefix (``Cosmos3TransferPackSequenceStep``
  packs ``[ctrl_1 … ctrl_n, target]`` at one mRoPE offset).
* ``make_transfer_plan`` = ``Cosmos3TransferPrepareLatentsStep`` + ``Cosmos3TransferSetTimestepsStep`` +
  ``Cosmos3TransferLoopDenoiser`` + ``Cosmos3TransferLoopSchedulerStep`` as one ``SamplePlan``: noise from the run's
  one generator (chunk after chunk), the seeded target frames clean and re-pinned after every step, a fresh UniPC
  schedule per window (``set_timesteps(steps)``, no native-flow sigmas), and per step up to three branches —
  ``cond_full`` (prompt + controls), ``cond_no_control`` (prompt, controls hidden) when the control scale is active
  and not 1, ``uncond_full`` (negative prompt + controls) when text guidance is active and above 1 — combined as the
  reference does: ``control = v_nc + c·(v_full − v_nc)``, ``v = v_uncond + g·(control − v_uncond)``. The three run as
  one batched step (``layout.prefix_hidden``), each interval-gated as the reference.
"""

from __future__ import annotations

from typing import Callable, Mapping

import torch

from ..model.layout import Prefix, build_layout
from ..model.towers import step_memory_required
from ..request import WindowGeometry
from ..sampling.conditioning import preprocess_video
from ..sampling.plan import Guidance, PlanInputs, SamplePlan, TextOnDevice, in_interval, initial_noise, vision_stream
from ..sampling.prompt import PromptIds, _chat_ids, _special_ids
from ..sampling.sea_cache import SeaCache
from .windows import reflect_pad, window_slice

CONTROL_KEYS = ("edge", "blur", "depth", "seg", "wsm")  # the reference's canonical hint order
SYSTEM_PROMPT_TRANSFER = (
    "You are a helpful assistant that generates images or videos following the user's instructions"
    " and control signals (edge maps, blur, depth, or segmentation)."
)


def transfer_prompt_ids(tokenizer, prompt: str, negative_prompt: str | None, *,
                        use_system_prompt: bool = True) -> PromptIds:
    """Token ids of both branches as ``Cosmos3TransferTextStep`` builds them."""
    assert isinstance(prompt, str) and prompt.strip(), "resolve checks the prompt"
    eos, vision_start = _special_ids(tokenizer)
    system = SYSTEM_PROMPT_TRANSFER if use_system_prompt else None
    negative = negative_prompt or ""
    cond = _chat_ids(tokenizer, prompt, system) + [eos, vision_start]
    uncond = _chat_ids(tokenizer, negative, system) + [eos, vision_start]
    return PromptIds(cond=cond, uncond=uncond, cond_text=prompt, uncond_text=negative)


def prepare_controls(controls: Mapping[str, object], height: int, width: int, *,
                     arg: str = "control") -> dict[str, torch.Tensor]:
    """Control clips (``[F, H, W, 3]`` in [0, 1], any size) → ``{key: [1, 3, F, height, width]}`` in [-1, 1], in the
    canonical key order. Every clip must be a known key, and all must have the same length and size."""
    if not isinstance(controls, Mapping) or not controls:
        raise ValueError(f"no control video given; pass at least one {arg} (keys {', '.join(CONTROL_KEYS)}), "
                         f"e.g. {arg} edge=edges.mp4.")
    unknown = [k for k in controls if k not in CONTROL_KEYS]
    if unknown:
        raise ValueError(f"{arg} key {unknown[0]!r} is not a Cosmos3 Transfer control; use one of "
                         f"{', '.join(CONTROL_KEYS)}.")
    shapes = {}
    for key in [k for k in CONTROL_KEYS if k in controls]:  # canonical order: messages name the same pair each time
        clip = controls[key]
        shape = tuple(getattr(clip, "shape", ()))
        if len(shape) != 4 or shape[-1] != 3 or shape[0] < 1:
            raise ValueError(f"{arg} {key} has shape {shape}; expected frames [F, H, W, 3] (a video or a "
                             "ComfyUI IMAGE batch).")
        shapes[key] = shape
    first = next(iter(shapes))
    for key, shape in shapes.items():
        if shape[0] != shapes[first][0]:
            raise ValueError(f"{arg} {key} has {shape[0]} frames but {arg} {first} has {shapes[first][0]}; "
                             "all control videos must have the same length (trim them to the same frames).")
        if shape[1:3] != shapes[first][1:3]:
            raise ValueError(f"{arg} {key} is {shape[2]}x{shape[1]} but {arg} {first} is "
                             f"{shapes[first][2]}x{shapes[first][1]}; all control videos must have the same size "
                             "(resize them to the same width and height).")
    return {key: preprocess_video(controls[key], height, width) for key in CONTROL_KEYS if key in controls}


def pad_controls(controls: dict[str, torch.Tensor], geometry: WindowGeometry) -> dict[str, torch.Tensor]:
    """Reflect-pad every control to at least one window (the setup step's padding)."""
    length = max(geometry.total_frames, geometry.chunk_frames)
    return {key: reflect_pad(clip, length) for key, clip in controls.items()}


def control_latents(vae, controls: dict[str, torch.Tensor], geometry: WindowGeometry, index: int) -> torch.Tensor:
    """Clean latents of window ``index``'s control slices, ``[n, C, T, h, w]`` in the canonical key order."""
    return torch.cat([vae.encode(window_slice(clip, geometry, index)) for clip in controls.values()])


def transfer_combine(guidance: float, control: float, *, with_control: bool, with_text: bool
                     ) -> Callable[[torch.Tensor], torch.Tensor]:
    """The reference's nested guidance over branch rows ``[full | no_control? | uncond?]`` (branch-major)."""
    branches = 1 + with_control + with_text

    def combine(v: torch.Tensor) -> torch.Tensor:
        rows = v.view(branches, -1, *v.shape[1:]).unbind(0)
        full = rows[0]
        if with_control and with_text:
            control_cond = rows[1] + control * (full - rows[1])
            return rows[2] + guidance * (control_cond - rows[2])
        if with_control:
            return rows[1] + control * (full - rows[1])
        if with_text:
            return rows[1] + guidance * (full - rows[1])
        return full

    return combine


def make_transfer_plan(config, inputs: PlanInputs, *, prefix: torch.Tensor, generator: torch.Generator,
                       control_guidance: float, control_guidance_interval: tuple[float, float] | None = None
                       ) -> SamplePlan:
    """One Transfer window as a plan. ``prefix`` ``[n, C, T, h, w]`` the window's control latents; ``inputs.x0`` the
    encoded seed frames (only ``clean_frames`` read); noise is drawn from ``generator`` (the run's, continued). The
    branches are the reference's cache contexts ``cond``, ``cond_no_control``, ``uncond``."""
    i, device = inputs, inputs.device
    assert i.uncond is not None
    (noise,) = initial_noise(0, [i.latent_shape], generator)
    stream = vision_stream(i.latent_shape, noise, i.stepper, x0=i.x0 if i.clean_frames else None,
                           clean_frames=i.clean_frames, reanchor=True, device=device)
    texts = TextOnDevice(device, [i.cond, i.uncond])
    (cond, uncond), prefix = texts.branches, prefix.to(device)
    layouts: dict[tuple, Guidance] = {}
    steps = []
    timesteps = i.stepper.timesteps.cpu().tolist()
    modes = i.fast.step_precision if i.fast.step_precision is not None else (None,) * len(timesteps)
    for t, precision in zip(timesteps, modes):
        g = i.guidance if in_interval(t, i.guidance_interval) else 1.0
        c = control_guidance if in_interval(t, control_guidance_interval) else 1.0
        key = (c != 1.0, g > 1.0, precision)
        if key not in layouts:
            c_kv, u_kv = (cond, uncond) if precision is None else (
                None if kv is None else texts(kv) for kv in i.fast.text_for(precision))
            text = [c_kv] + [c_kv] * key[0] + [u_kv] * key[1]
            names = ("cond",) + ("cond_no_control",) * key[0] + ("uncond",) * key[1]
            hidden = (False,) + (True,) * key[0] + (False,) * key[1]
            layout = build_layout(config, [kv.length for kv in text], i.latent_shape[2:], i.fps,
                                  clean_frames=i.clean_frames, prefix=Prefix(prefix, hidden if key[0] else ()),
                                  device=device, dtype=i.dtype)
            layouts[key] = Guidance(tuple(text), layout, transfer_combine(
                float(i.guidance), float(control_guidance), with_control=key[0], with_text=key[1]), precision, names)
        steps.append(layouts[key])
    widest = max(layouts.values(), key=lambda gd: len(gd.text))
    num_tokens = widest.layout.num_tokens
    return SamplePlan(
        streams=(stream,), guidance=tuple(steps), sigmas=i.stepper.sigmas.cpu(),
        timesteps=i.stepper.timesteps.cpu(), device=device, num_tokens=num_tokens, options=i.options,
        memory_required=step_memory_required(config, num_tokens, list(widest.layout.text_lengths), i.dtype)
        + texts.extra_bytes,
        cache=None if i.fast.sea_cache is None else SeaCache(i.fast.sea_cache),
        noisy_vision=len(set(i.clean_frames)) < i.latent_frames, fp8=i.fast.fp8,
    )

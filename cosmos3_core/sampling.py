"""The denoising loop: UniPC flow sampling with both guidance branches in one batched step.

Mirrors the loop of diffusers 0.42.1 ``Cosmos3OmniPipeline.__call__`` (steps 4–7) and uses diffusers'
``UniPCMultistepScheduler`` itself for the update rule (flow prediction, bh2, order 2). Differences, all exact:

* the text tower is not re-run: the branches' ``TextKV`` come from ``Cosmos3Transformer.prefill``;
* cond and uncond run as **one** ``denoise_step`` with a batch of 2 (diffusers runs two passes);
* ``guidance == 1`` runs one branch; an optional ``guidance_interval`` (a speed option, off by default, *not*
  what the reference does) drops the uncond branch for timesteps outside ``[low, high]``.

Everything else follows the reference: fp32 sampling state; noise from one seeded CPU ``torch.Generator`` drawn
vision ``[1, 48, T, h, w]`` first, then sound ``[64, Ts]``; ``latents = mask·x0 + (1−mask)·noise``; CFG
``v = v_u + g·(v_c − v_u)`` for vision and sound; a separate scheduler state (deep copy) for the sound latent.

Progress leaves the loop only through ``callback(step, total, x0_preview)``; a callback may raise to cancel.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch
from diffusers import UniPCMultistepScheduler

from .config import CheckpointError
from .layout import build_layout, select_branch
from .text_kv import TextKV
from .transformer import Cosmos3Transformer

StepCallback = Callable[[int, int, torch.Tensor], None]

SCHEDULES = ("flow_shift", "karras")


def default_steps(num_frames: int) -> int:
    """Per-mode defaults of the reference docs: image 50, video 35."""
    return 50 if num_frames == 1 else 35


def default_shift(height: int, width: int) -> float:
    """Training flow shift of the resolution tier: 720p → 10, 480p → 5, 256p → 3."""
    short = min(height, width)
    return 10.0 if short >= 704 else 5.0 if short >= 448 else 3.0


def load_scheduler_config(checkpoint_dir: str | Path) -> dict:
    path = Path(checkpoint_dir) / "scheduler" / "scheduler_config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: a Cosmos3 checkpoint holds scheduler/scheduler_config.json.")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path} is not readable JSON ({exc}); download the checkpoint's scheduler/ folder again.") from exc
    if not isinstance(config, dict):
        raise CheckpointError(f"{path} holds a JSON {type(config).__name__}, not the UniPC scheduler settings object; "
                         "download the checkpoint's scheduler/ folder again.")
    return config


def make_scheduler(
    scheduler_config: dict,
    steps: int,
    *,
    schedule: str = "flow_shift",
    shift: float = 5.0,
    native_flow_schedule: bool = False,
) -> UniPCMultistepScheduler:
    """A ready UniPC scheduler: ``karras`` = the released config as is; ``flow_shift`` = Karras off, ``flow_shift``.

    ``native_flow_schedule`` (the checkpoint's ``use_native_flow_schedule``) passes the sigmas
    ``linspace(1 − 1/1000, 0, N+1)[:-1]`` exactly as the reference pipeline does (ignored under Karras).
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule={schedule!r} is not one of {SCHEDULES}.")
    if steps < 1:
        raise ValueError(f"steps={steps} must be at least 1.")
    scheduler = UniPCMultistepScheduler.from_config(scheduler_config)
    if schedule == "flow_shift":
        if not shift > 0:
            raise ValueError(f"shift={shift} must be positive.")
        scheduler = UniPCMultistepScheduler.from_config(scheduler.config, flow_shift=float(shift), use_karras_sigmas=False)
    if native_flow_schedule:
        n_train = scheduler.config.num_train_timesteps
        scheduler.set_timesteps(steps, sigmas=np.linspace(1.0 - 1.0 / n_train, 0.0, steps + 1)[:-1])
    else:
        scheduler.set_timesteps(steps)
    return scheduler


@dataclass(frozen=True)
class SampleResult:
    latents: torch.Tensor  # [1, 48, T, h, w] normalized video latent, fp32
    sound: torch.Tensor | None  # [64, Ts] sound latent, fp32


def initial_noise(
    seed: int, latent_shape: Sequence[int], sound_shape: Sequence[int] | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Seeded fp32 noise in the reference order (vision, then sound) from a CPU generator — device independent."""
    generator = torch.Generator("cpu").manual_seed(int(seed))
    vision = torch.randn(tuple(latent_shape), generator=generator, dtype=torch.float32)
    sound = torch.randn(tuple(sound_shape), generator=generator, dtype=torch.float32) if sound_shape else None
    return vision, sound


def sample(
    model: Cosmos3Transformer,
    cond: TextKV,
    uncond: TextKV | None,
    scheduler: UniPCMultistepScheduler,
    *,
    latent_shape: Sequence[int],
    fps: float,
    seed: int,
    guidance: float = 6.0,
    x0: torch.Tensor | None = None,
    clean_frames: Sequence[int] = (),
    sound_len: int = 0,
    guidance_interval: tuple[float, float] | None = None,
    callback: StepCallback | None = None,
) -> SampleResult:
    """Denoise a video (+ sound) latent. ``x0`` holds the clean conditioning latents (only ``clean_frames`` read)."""
    device = model.device
    cfg = model.config
    use_cfg = guidance != 1.0
    if use_cfg and uncond is None:
        raise ValueError("sample: guidance != 1 needs the negative prompt's text K/V (uncond).")
    if sound_len and not cfg.sound_gen:
        raise ValueError("sample: this checkpoint has no sound head; generate without sound.")
    branches = [cond, uncond] if use_cfg else [cond]
    branches = [kv.to(device) for kv in branches]
    layout = build_layout(
        cfg, [kv.length for kv in branches], latent_shape[2:], fps,
        clean_frames=clean_frames, sound_len=sound_len, device=device, dtype=model.dtype,
    )
    cond_only = select_branch(layout, 0)

    noise, sound = initial_noise(seed, latent_shape, (cfg.sound_dim, sound_len) if sound_len else None)
    mask = torch.zeros(latent_shape[2], 1, 1)
    mask[list(clean_frames)] = 1.0
    clean = torch.zeros(latent_shape)
    if x0 is not None:  # x0 may hold only the leading (clean) latent frames
        if x0.shape[2] <= max(clean_frames, default=-1) or x0.shape[3:] != tuple(latent_shape[3:]):
            raise ValueError(
                f"sample: conditioning latents {tuple(x0.shape)} do not cover clean frames {list(clean_frames)} "
                f"of a latent {tuple(latent_shape)}; encode the condition at the clip's width and height."
            )
        frames = min(x0.shape[2], latent_shape[2])
        clean[:, :, :frames] = x0[:, :, :frames].detach().float().cpu()
    latents = (mask * clean + (1.0 - mask) * noise).to(device)
    sound = sound.to(device) if sound is not None else None
    sound_scheduler = copy.deepcopy(scheduler) if sound is not None else None

    timesteps = scheduler.timesteps
    on_device = timesteps.to(device)
    total = len(timesteps)
    for i in range(total):
        t = timesteps[i]
        with_uncond = use_cfg and _in_interval(t, guidance_interval)
        active = branches if with_uncond else branches[:1]
        out = model.denoise_step(latents, on_device[i], active, layout if with_uncond else cond_only, sound=sound)
        v = out.vision.float()
        v = v[1:2] + guidance * (v[0:1] - v[1:2]) if with_uncond else v[0:1]
        preview = latents - scheduler.sigmas[i].to(device) * v if callback is not None else None  # x0 = x − σ·v
        latents = scheduler.step(v.unsqueeze(0), t, latents.unsqueeze(0), return_dict=False)[0].squeeze(0)
        if sound is not None:
            s = out.sound.float()
            s = s[1] + guidance * (s[0] - s[1]) if with_uncond else s[0]
            sound = sound_scheduler.step(s.unsqueeze(0), t, sound.unsqueeze(0), return_dict=False)[0].squeeze(0)
        if callback is not None:
            callback(i + 1, total, preview)
    return SampleResult(latents=latents, sound=sound)


def _in_interval(t: torch.Tensor, interval: tuple[float, float] | None) -> bool:
    if interval is None:
        return True
    low, high = interval
    return low <= int(t) <= high

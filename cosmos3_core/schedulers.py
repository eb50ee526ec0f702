"""Noise schedules and the per-stream update rule ("stepper") of a Cosmos3 run.

The update rules are diffusers' own scheduler classes (the reference's arithmetic, not a re-implementation):

* ``make_scheduler`` — the ``UniPCMultistepScheduler`` of diffusers 0.42.1 ``Cosmos3OmniPipeline``: the checkpoint's
  ``scheduler/scheduler_config.json`` as released (``karras``), or Karras off with a ``flow_shift`` (the docs' video
  setting); a checkpoint with ``use_native_flow_schedule`` passes ``sigmas = linspace(1 − 1/1000, 0, N+1)[:-1]``
  exactly as the pipeline does (ignored under Karras).
* ``SchedulerStepper`` — one stream's state: the scheduler (each stream owns a deep copy, as the reference's sound and
  action schedulers), optional zeroing of trailing channels after each step (the action stream's padding beyond the
  raw action dimension) and an optional extra ``step`` keyword (a seeded generator for stochastic schedulers).

A stepper is stateful (UniPC keeps a history): it serves one run.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import torch
from diffusers import UniPCMultistepScheduler

from .config import CheckpointError
from .defaults import SCHEDULES


def load_scheduler_config(checkpoint_dir: str | Path) -> dict:
    path = Path(checkpoint_dir) / "scheduler" / "scheduler_config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: a Cosmos3 checkpoint holds scheduler/scheduler_config.json.")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path} is not readable JSON ({exc}); download the checkpoint's scheduler/ folder "
                              "again.") from exc
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
    """A ready UniPC scheduler: ``karras`` = the released config as is; ``flow_shift`` = Karras off, ``flow_shift``."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule={schedule!r} is not one of {SCHEDULES}.")
    scheduler = UniPCMultistepScheduler.from_config(scheduler_config)
    if schedule == "flow_shift":
        scheduler = UniPCMultistepScheduler.from_config(scheduler.config, flow_shift=float(shift), use_karras_sigmas=False)
    if native_flow_schedule:
        n_train = scheduler.config.num_train_timesteps
        scheduler.set_timesteps(steps, sigmas=np.linspace(1.0 - 1.0 / n_train, 0.0, steps + 1)[:-1])
    else:
        scheduler.set_timesteps(steps)
    return scheduler


class SchedulerStepper:
    """Advances one stream with a diffusers scheduler: ``step(velocity, index, latents) -> latents``."""

    def __init__(self, scheduler, *, keep_channels: int | None = None, step_kwargs: dict | None = None):
        self.scheduler = scheduler
        self.keep_channels = keep_channels  # channels at and beyond this index are re-zeroed after every step
        self.step_kwargs = step_kwargs or {}

    def fork(self, **changes) -> "SchedulerStepper":
        """An independent stepper over a deep copy of this one's scheduler (own history, same sigmas)."""
        kwargs = {"keep_channels": self.keep_channels, "step_kwargs": self.step_kwargs} | changes
        return SchedulerStepper(copy.deepcopy(self.scheduler), **kwargs)

    @property
    def timesteps(self) -> torch.Tensor:
        return self.scheduler.timesteps

    @property
    def sigmas(self) -> torch.Tensor:
        return self.scheduler.sigmas

    def step(self, velocity: torch.Tensor, index: int, latents: torch.Tensor) -> torch.Tensor:
        t = self.scheduler.timesteps[index]
        out = self.scheduler.step(velocity.unsqueeze(0), t, latents.unsqueeze(0), return_dict=False, **self.step_kwargs)
        out = out[0].squeeze(0)
        if self.keep_channels is not None:
            out[..., self.keep_channels:] = 0
        return out


class ItemSteppers:
    """One stepper per batch item, each advancing its own row of the latents ``[N, ...]`` — for a stochastic
    scheduler that draws from each item's own generator (the distilled steps), so every item equals its single run."""

    def __init__(self, steppers: list[SchedulerStepper]):
        self.steppers = list(steppers)

    def fork(self, **changes) -> "ItemSteppers":
        return ItemSteppers([s.fork(**changes) for s in self.steppers])

    @property
    def timesteps(self) -> torch.Tensor:
        return self.steppers[0].timesteps

    @property
    def sigmas(self) -> torch.Tensor:
        return self.steppers[0].sigmas

    def step(self, velocity: torch.Tensor, index: int, latents: torch.Tensor) -> torch.Tensor:
        return torch.cat([s.step(velocity[k:k + 1], index, latents[k:k + 1]) for k, s in enumerate(self.steppers)])

"""Noise schedules and the per-stream update rule ("stepper") of a Cosmos3 run.

The update rules are diffusers' own scheduler classes (the reference's arithmetic, not a re-implementation):

* ``make_scheduler`` — the ``UniPCMultistepScheduler`` of diffusers 0.42.1 ``Cosmos3OmniPipeline``: the checkpoint's
  ``scheduler/scheduler_config.json`` as released (``karras``), or Karras off with a ``flow_shift`` (the docs' video
  setting); a checkpoint with ``use_native_flow_schedule`` passes ``sigmas = linspace(1 − 1/1000, 0, N+1)[:-1]``
  exactly as the pipeline does (ignored under Karras).
* ``SchedulerStepper`` — one stream's state: the scheduler (each stream owns a deep copy, as the reference's sound and
  action schedulers), optional zeroing of trailing channels after each step (the action stream's padding beyond the
  raw action dimension) and an optional extra ``step`` keyword (a seeded generator for stochastic schedulers).

* ``LinearStepper`` — the same UniPC update as ``SchedulerStepper``, applied as a fixed linear combination of the
  last few latents and velocities. UniPC (without thresholding) is linear in its inputs: each new latent is a sum of
  the current and earlier latents and velocities with coefficients that depend only on the sigma schedule. Those
  coefficients are read off the diffusers scheduler itself, by stepping a copy of it once on the CPU in float64 with
  one-hot "symbol" vectors (latent 0 and velocity i as unit vectors), then expressed over the shortest window of
  recent latents/velocities that reproduces every step exactly (least squares, residual checked). A run then costs a
  handful of fused multiply-adds per step on the device and no host synchronisation — diffusers' step launches
  dozens of scalar kernels, copies sigmas from the host and solves a small linear system on the device every step.
  Equal to ``SchedulerStepper`` up to fp32 rounding (tests/test_schedulers.py); ``make_stepper`` picks it wherever
  the scheduler qualifies (UniPC, no thresholding), else ``SchedulerStepper``.

A stepper is stateful (UniPC keeps a history): it serves one run.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..config import CheckpointError
from ..defaults import SCHEDULES

if TYPE_CHECKING:  # diffusers imports with the first scheduler made, not with the package
    from diffusers import UniPCMultistepScheduler


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
    from diffusers import UniPCMultistepScheduler

    scheduler = UniPCMultistepScheduler.from_config(scheduler_config)
    if schedule == "flow_shift":
        scheduler = UniPCMultistepScheduler.from_config(scheduler.config, flow_shift=float(shift),
                                                        use_karras_sigmas=False)
    if native_flow_schedule:
        n_train = scheduler.config.num_train_timesteps
        scheduler.set_timesteps(steps, sigmas=np.linspace(1.0 - 1.0 / n_train, 0.0, steps + 1)[:-1])
    else:
        scheduler.set_timesteps(steps)
    return scheduler


class _ScheduleOf:
    """The timesteps and sigmas of the diffusers scheduler a stepper holds in ``self.scheduler``, and the re-zeroing
    of ``keep_channels`` and beyond (a stream's padding) after every step."""

    scheduler: object
    keep_channels: int | None

    def _rezero(self, out: torch.Tensor) -> torch.Tensor:
        if self.keep_channels is not None:
            out[..., self.keep_channels:] = 0
        return out

    @property
    def timesteps(self) -> torch.Tensor:
        return self.scheduler.timesteps

    @property
    def sigmas(self) -> torch.Tensor:
        return self.scheduler.sigmas


class SchedulerStepper(_ScheduleOf):
    """Advances one stream with a diffusers scheduler: ``step(velocity, index, latents) -> latents``."""

    def __init__(self, scheduler, *, keep_channels: int | None = None, step_kwargs: dict | None = None):
        self.scheduler = scheduler
        self.keep_channels = keep_channels  # channels at and beyond this index are re-zeroed after every step
        self.step_kwargs = step_kwargs or {}

    def fork(self, **changes) -> "SchedulerStepper":
        """An independent stepper over a deep copy of this one's scheduler (own history, same sigmas)."""
        kwargs = {"keep_channels": self.keep_channels, "step_kwargs": self.step_kwargs} | changes
        return SchedulerStepper(copy.deepcopy(self.scheduler), **kwargs)

    def step(self, velocity: torch.Tensor, index: int, latents: torch.Tensor) -> torch.Tensor:
        t = self.scheduler.timesteps[index]
        out = self.scheduler.step(velocity.unsqueeze(0), t, latents.unsqueeze(0), return_dict=False, **self.step_kwargs)
        return self._rezero(out[0].squeeze(0))


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


def make_stepper(scheduler, *, keep_channels: int | None = None) -> "SchedulerStepper | LinearStepper":
    """The stepper of a deterministic run: ``LinearStepper`` for UniPC without thresholding, else
    ``SchedulerStepper``."""
    from diffusers import UniPCMultistepScheduler

    if isinstance(scheduler, UniPCMultistepScheduler) and not scheduler.config.get("thresholding", False):
        return LinearStepper(scheduler, keep_channels=keep_channels)
    return SchedulerStepper(scheduler, keep_channels=keep_channels)


class LinearStepTable:
    """Per step ``i``: ``x[i+1] = sum_l a[i][l] * x[i-l] + sum_l b[i][l] * v[i-l]`` over ``window`` recent entries."""

    RESIDUAL = 1e-9  # relative least-squares residual accepted as "exact" (float64 symbols)

    def __init__(self, scheduler):
        sched = copy.deepcopy(scheduler)
        n = len(sched.timesteps)
        eye = torch.eye(n + 1, dtype=torch.float64)
        xs, vs = [eye[0:1]], []  # latent i and velocity i as coefficient rows over the symbols
        for i, t in enumerate(sched.timesteps):
            vs.append(eye[i + 1:i + 2])
            out = sched.step(vs[-1], t, xs[-1], return_dict=False)[0]
            if out.dtype != torch.float64 or out.shape != (1, n + 1):
                raise TypeError(f"{type(scheduler).__name__}.step did not keep float64 symbols: not linear-replayable")
            xs.append(out)
        self.window, self.steps = 1, []
        for i in range(n):
            for window in range(self.window, i + 2):
                coefs = self._fit(xs, vs, xs[i + 1], i, window)
                if coefs is not None:
                    break
            else:
                raise ValueError(f"{type(scheduler).__name__} step {i} is not a linear combination of its inputs.")
            self.window = max(self.window, window)
            self.steps.append(coefs)

    @classmethod
    def _fit(cls, xs, vs, target, i: int, window: int):
        lags = range(min(window, i + 1))
        basis = torch.cat([xs[i - lag] for lag in lags] + [vs[i - lag] for lag in lags]).T  # [n+1, 2·lags]
        sol = torch.linalg.lstsq(basis, target.T, driver="gelsd").solution[:, 0]
        if torch.linalg.vector_norm(basis @ sol - target[0]) > cls.RESIDUAL * torch.linalg.vector_norm(target):
            return None
        k = len(lags)
        return ([(lag, float(sol[lag])) for lag in lags if sol[lag] != 0.0],
                [(lag, float(sol[k + lag])) for lag in lags if sol[k + lag] != 0.0])


class LinearStepper(_ScheduleOf):
    """UniPC's update as precomputed linear combinations (module docstring): ``step(velocity, index, latents)``."""

    def __init__(self, scheduler, *, keep_channels: int | None = None, table: LinearStepTable | None = None):
        self.scheduler = scheduler  # its timesteps/sigmas; never stepped itself
        self.keep_channels = keep_channels
        self.table = table if table is not None else LinearStepTable(scheduler)
        self._x: list[torch.Tensor] = []  # most recent first
        self._v: list[torch.Tensor] = []
        self._done = 0

    def fork(self, **changes) -> "LinearStepper":
        unknown = set(changes) - {"keep_channels"}
        if unknown:
            raise TypeError(f"LinearStepper.fork does not take {sorted(unknown)}")
        return LinearStepper(self.scheduler, keep_channels=changes.get("keep_channels", self.keep_channels),
                             table=self.table)

    def step(self, velocity: torch.Tensor, index: int, latents: torch.Tensor) -> torch.Tensor:
        if index != self._done:
            raise RuntimeError(f"LinearStepper: step {index} after {self._done} steps; a stepper serves one run, in "
                               "order.")
        self._x.insert(0, latents)
        self._v.insert(0, velocity.to(latents.dtype))
        a, b = self.table.steps[index]
        out = None
        for history, terms in ((self._x, a), (self._v, b)):
            for lag, coef in terms:
                out = history[lag] * coef if out is None else out.add_(history[lag], alpha=coef)
        del self._x[self.table.window:], self._v[self.table.window:]
        self._done = index + 1
        return self._rezero(out)


Stepper = SchedulerStepper | LinearStepper | ItemSteppers  # what a plan's stream advances with

"""``LinearStepper`` (UniPC replayed as precomputed linear combinations) against diffusers 0.42.1's own
``UniPCMultistepScheduler.step`` driven directly, on the released scheduler config and the schedules the pack offers.
The reference side here is the library's scheduler object stepped as ``Cosmos3OmniPipeline`` steps it; no code of
ours computes the expected values."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler, UniPCMultistepScheduler

from cosmos3_core.sampling.schedulers import LinearStepper, SchedulerStepper, make_scheduler, make_stepper
from cosmos3_core.testing.tiny import SCHEDULER_CONFIG


def reference_scheduler(steps: int, schedule: str, shift: float, native: bool) -> UniPCMultistepScheduler:
    """Built the way diffusers' Cosmos3OmniPipeline builds it (flow_shift: Karras off + flow_shift; native flow
    schedule: explicit sigmas linspace(1 − 1/1000, 0, N+1)[:-1])."""
    scheduler = UniPCMultistepScheduler.from_config(SCHEDULER_CONFIG)
    if schedule == "flow_shift":
        scheduler = UniPCMultistepScheduler.from_config(scheduler.config, use_karras_sigmas=False, flow_shift=shift)
    if native:
        scheduler.set_timesteps(steps, sigmas=np.linspace(1.0 - 1.0 / 1000, 0.0, steps + 1)[:-1])
    else:
        scheduler.set_timesteps(steps)
    return scheduler


def run_both(steps, schedule="karras", shift=5.0, native=False, shape=(2, 48, 3, 4, 5), keep=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    x0 = torch.randn(shape, generator=g)
    velocities = [torch.randn(shape, generator=g) for _ in range(steps)]
    ref = reference_scheduler(steps, schedule, shift, native)
    ours = make_stepper(make_scheduler(SCHEDULER_CONFIG, steps, schedule=schedule, shift=shift,
                                       native_flow_schedule=native), keep_channels=keep)
    assert isinstance(ours, LinearStepper)
    torch.testing.assert_close(ours.timesteps, ref.timesteps, rtol=0, atol=0)
    xr, xo = x0.clone(), x0.clone()
    for i, (t, v) in enumerate(zip(ref.timesteps, velocities)):
        xr = ref.step(v.unsqueeze(0), t, xr.unsqueeze(0), return_dict=False)[0].squeeze(0)
        if keep is not None:
            xr[..., keep:] = 0
        xo = ours.step(v, i, xo)
    return xr, xo


@pytest.mark.parametrize("steps", [1, 2, 3, 4, 10, 35])
@pytest.mark.parametrize("schedule,native", [("karras", False), ("flow_shift", False), ("flow_shift", True)])
def test_linear_stepper_equals_diffusers_unipc(steps, schedule, native):
    xr, xo = run_both(steps, schedule, native=native)
    assert torch.isfinite(xr).all()
    torch.testing.assert_close(xo, xr, rtol=1e-5, atol=2e-5)


def test_zeroed_channels_and_forks_are_independent():
    xr, xo = run_both(12, "flow_shift", shift=10.0, shape=(1, 16, 64), keep=7)
    assert (xo[..., 7:] == 0).all()
    torch.testing.assert_close(xo, xr, rtol=1e-5, atol=2e-5)
    base = make_stepper(make_scheduler(SCHEDULER_CONFIG, 5))
    a, b = base.fork(), base.fork(keep_channels=2)
    x = torch.ones(1, 4)
    xa = a.step(torch.zeros(1, 4), 0, x)
    xb = b.step(torch.full((1, 4), 3.0), 0, x)  # interleaved: b's history must not leak into a
    xb = b.step(torch.full((1, 4), -2.0), 1, xb)
    assert (xb[..., 2:] == 0).all()
    torch.testing.assert_close(a.step(torch.zeros(1, 4), 1, xa), run_zero_velocity(x, 2))


def run_zero_velocity(x, steps):
    ref = reference_scheduler(5, "karras", 5.0, False)
    for t in ref.timesteps[:steps]:
        x = ref.step(torch.zeros_like(x).unsqueeze(0), t, x.unsqueeze(0), return_dict=False)[0].squeeze(0)
    return x


def test_steps_out_of_order_are_refused():
    stepper = make_stepper(make_scheduler(SCHEDULER_CONFIG, 4))
    x = torch.zeros(1, 3)
    stepper.step(x, 0, x)
    with pytest.raises(RuntimeError, match="step 2 after 1 steps"):
        stepper.step(x, 2, x)


def test_non_linear_or_stochastic_schedulers_keep_the_library_step():
    thresholded = UniPCMultistepScheduler.from_config(SCHEDULER_CONFIG, thresholding=True)
    thresholded.set_timesteps(4)
    assert isinstance(make_stepper(thresholded), SchedulerStepper)
    euler = FlowMatchEulerDiscreteScheduler()
    euler.set_timesteps(4)
    assert isinstance(make_stepper(euler), SchedulerStepper)

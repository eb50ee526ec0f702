"""The denoising loop: iterate a ``SamplePlan`` (plan.py). It knows no modes.

Each step: one ``denoise_step`` of the model for the step's guidance branches (all branches as one batch, the text
K/V cached), the branches' velocities combined per stream, each stream advanced by its stepper (and re-anchored
where its plan says so), then ``callback(step, total, x0_preview)`` — the only way progress leaves the loop; a
callback may raise to cancel. Mirrors the loop of diffusers 0.42.1 ``Cosmos3OmniPipeline.__call__`` (step 7) and
of the modular ``Cosmos3DenoiseLoopWrapper``; what differs (batched branches, cached text K/V) is exact.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from .plan import SamplePlan

StepCallback = Callable[[int, int, torch.Tensor], None]


@dataclass(frozen=True)
class SampleResult:
    latents: torch.Tensor  # [N, 48, T, h, w] normalized video latents, fp32
    sound: torch.Tensor | None  # [N, 64, Ts] sound latents, fp32
    action: torch.Tensor | None = None  # [N, Ta, action_dim] action latents (padded), fp32


def run(plan: SamplePlan, model, callback: StepCallback | None = None) -> dict[str, torch.Tensor]:
    """Denoise every stream of ``plan`` with ``model.denoise_step``; returns the final values by stream name."""
    x = {s.name: s.init for s in plan.streams}
    on_device = plan.timesteps.to(plan.device)
    total = plan.steps
    for i, guidance in enumerate(plan.guidance):
        out = model.denoise_step(
            x["vision"], on_device[i], guidance.text, guidance.layout, sound=x.get("sound"), action=x.get("action")
        )
        preview = None
        for stream in plan.streams:
            if stream.stepper is None:
                continue
            v = guidance.combine(getattr(out, stream.name).float())
            if callback is not None and stream.name == "vision":
                preview = x["vision"] - float(plan.sigmas[i]) * v  # x0 = x − σ·v (σ a host float: no copy, no sync)
            x[stream.name] = stream.step(v, i, x[stream.name])
        if callback is not None:
            callback(i + 1, total, preview)
    return x

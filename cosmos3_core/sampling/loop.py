"""The denoising loop: iterate a ``SamplePlan`` (plan.py). It knows no modes.

Each step: one ``denoise_step`` of the model for the step's guidance branches (all branches as one batch, the text
K/V cached; the plan's per-step options — the run's ``RuntimeOptions``, FP8 modes, SeaCache — passed through
unread, ``SamplePlan.step_options``), the branches' velocities combined per stream, each stream advanced by its
stepper (and re-anchored where its plan says so), then ``callback(step, total, x0_preview)`` — the only way progress
leaves the loop; a callback may raise to cancel. Mirrors the loop of diffusers 0.42.1 ``Cosmos3OmniPipeline.__call__``
(step 7) and of the modular ``Cosmos3DenoiseLoopWrapper``; what differs (batched branches, cached text K/V) is exact.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

import torch

from .plan import SamplePlan

StepCallback = Callable[[int, int, torch.Tensor], None]


class Denoiser(Protocol):
    """What the loop runs each step: ``Cosmos3Transformer`` (model/transformer.py), and the parallel denoisers that
    keep its contract (parallel/denoiser.py across ranks, parallel/devices.py across two local GPUs). One pass for
    ``len(text)`` guidance branches × the batch, rows branch-major; ``options`` the run's ``RuntimeOptions``;
    ``precision`` the step's FP8 modes and ``cache`` its SeaCache view, given only to runs that have them."""

    config: Any
    dtype: torch.dtype
    device: torch.device

    def denoise_step(self, latents: torch.Tensor, timestep: torch.Tensor, text: Sequence[Any], layout: Any,
                     sound: torch.Tensor | None = None, action: torch.Tensor | None = None, *,
                     options: Any, precision: Any = None, cache: Any = None) -> Any: ...


@dataclass(frozen=True)
class SampleResult:
    latents: torch.Tensor  # [N, 48, T, h, w] normalized video latents, fp32
    sound: torch.Tensor | None  # [N, 64, Ts] sound latents, fp32
    action: torch.Tensor | None = None  # [N, Ta, action_dim] action latents (padded), fp32


def run(plan: SamplePlan, model: Denoiser, callback: StepCallback | None = None) -> dict[str, torch.Tensor]:
    """Denoise every stream of ``plan`` with ``model.denoise_step``; returns the final values by stream name."""
    x = {s.name: s.init for s in plan.streams}
    on_device = plan.timesteps.to(plan.device)
    total = plan.steps
    for i, guidance in enumerate(plan.guidance):
        out = model.denoise_step(x["vision"], on_device[i], guidance.text, guidance.layout, sound=x.get("sound"),
                                 action=x.get("action"), **plan.step_options(i))
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

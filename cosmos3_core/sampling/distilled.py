"""Distilled few-step Cosmos3 checkpoints (NVIDIA's Cosmos3-Super-Text2Image-4Step, -Image2Video-4Step).

Mirrors diffusers 0.42.1 ``Cosmos3DistilledModularPipeline`` (modular_pipelines/cosmos/):

* **Recognition** (``modular_pipeline.py`` + ``ModularPipeline.__init__``): diffusers picks the pipeline
  class from ``_class_name`` of the checkpoint's ``modular_model_index.json`` and its blocks from
  ``_blocks_class_name`` (a name that is not a diffusers blocks class with blocks falls back to the pipeline
  class's default blocks; no ``_blocks_class_name`` at all is an error there too). A checkpoint is distilled when
  that resolves to ``Cosmos3DistilledBlocks``. Its configs ``distilled_sigmas`` (and ``default_use_system_prompt``)
  come from the same file; without ``modular_model_index.json`` diffusers builds the base Omni pipeline, so the
  checkpoint is not distilled.
* **Schedule** (``Cosmos3DistilledSetTimestepsStep``): the checkpoint's ``scheduler/`` (a
  ``FlowMatchEulerDiscreteScheduler``; diffusers' class itself is used, it is the reference's update rule) with
  ``set_timesteps(sigmas=distilled_sigmas)``. The step count is ``len(distilled_sigmas)`` and guidance is baked
  into the weights (one branch, scale 1): another step count or scale is an error, never overridden.
* **Step** (``Cosmos3DistilledVisionLoopSchedulerStep``): ``scheduler.step(v, t, x, generator=...)`` — with the
  checkpoint's ``stochastic_sampling`` this is the SDE step ``(1−σ')·(x − σ·v) + σ'·ε`` that draws ``ε`` from the
  *same* generator as the initial noise, after it (a CPU generator: device-independent). ``make_stepper`` returns
  that generator for the plan to draw the initial noise from (per batch item: seed + k, each item with its own
  scheduler, so it equals its single run); the plan re-anchors conditioned latent frames after every step,
  ``mask·x0 + (1−mask)·x``.
* **Text** (``Cosmos3DistilledTextEncoderStep``): the prompt is rendered exactly as for the base model; there is
  no negative prompt (the reference builds an unused empty one), so only the conditional K/V is computed.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from .. import defaults
from ..config import CheckpointError
from .schedulers import ItemSteppers, SchedulerStepper

if TYPE_CHECKING:  # diffusers imports where a distilled checkpoint is used, not with the package
    from diffusers import FlowMatchEulerDiscreteScheduler

MODULAR_INDEX = "modular_model_index.json"
DISTILLED_BLOCKS = "Cosmos3DistilledBlocks"
# ModularPipeline subclasses' ``default_blocks_name`` (used when ``_blocks_class_name`` names no blocks class)
_DEFAULT_BLOCKS = {"Cosmos3DistilledModularPipeline": DISTILLED_BLOCKS,
                   "Cosmos3OmniModularPipeline": "Cosmos3OmniBlocks"}
SCHEDULER_CLASS = "FlowMatchEulerDiscreteScheduler"


@dataclass(frozen=True)
class DistilledSchedule:
    """The fixed sampling schedule of a distilled checkpoint, as read from its files."""

    sigmas: tuple[float, ...]
    scheduler_config: dict
    default_use_system_prompt: bool | None  # from modular_model_index.json (None: not declared there)
    name: str  # the checkpoint folder's name, for messages

    @property
    def steps(self) -> int:
        return len(self.sigmas)

    def check(self, *, steps: int | None, guidance: float | None, shift: float | None = None,
              schedule: str = defaults.SCHEDULE, negative_prompt: str | None = None, sound: bool = False) -> None:
        """Refuse, with one clear message, every request value this checkpoint fixes (never overridden silently):
        another step count, guidance ≠ 1, a shift, the karras schedule, a negative prompt, sound. ``None``
        means "not given". Messages name the node input first and the CLI flag in parentheses."""
        head = f"{{}}, but checkpoint {self.name!r} is distilled"
        fixed = f"samples on a fixed schedule (distilled_sigmas in {MODULAR_INDEX})"
        if steps is not None and steps != self.steps:
            raise ValueError(
                head.format(f"steps={steps}") + f" with a fixed {self.steps}-step schedule (distilled_sigmas in "
                f"{MODULAR_INDEX}); set steps to {self.steps} (CLI: --steps {self.steps}, or leave it out)."
            )
        if guidance is not None and guidance != 1.0:
            raise ValueError(
                head.format(f"guidance (cfg)={guidance:g}") + ": guidance is baked into its weights (one branch); "
                "set cfg to 1 (CLI: --guidance 1, or leave it out)."
            )
        if shift is not None:
            raise ValueError(head.format(f"shift={shift:g}") + f": it {fixed}, which takes no shift; set shift to 0 "
                             "(CLI: drop --shift).")
        if schedule != defaults.SCHEDULE:
            raise ValueError(head.format(f"schedule={schedule}") + f": it {fixed}; set schedule to flow_shift "
                             "(CLI: drop --schedule).")
        if negative_prompt:
            raise ValueError(
                head.format("negative_prompt is set") + ": guidance is baked into its weights and there is no "
                "negative branch; clear negative_prompt (CLI: drop --negative-prompt)."
            )
        if sound:
            raise ValueError(
                head.format("sound=True") + " and generates vision only (diffusers' distilled pipeline has no sound "
                "stream); set sound to false (CLI: drop --sound)."
            )

    def make_scheduler(self, device: torch.device | str | None = None) -> FlowMatchEulerDiscreteScheduler:
        """The checkpoint's scheduler on the distilled sigmas (``Cosmos3DistilledSetTimestepsStep``)."""
        from diffusers import FlowMatchEulerDiscreteScheduler

        scheduler = FlowMatchEulerDiscreteScheduler.from_config(self.scheduler_config)
        scheduler.set_timesteps(sigmas=list(self.sigmas), device=device)
        return scheduler

    def make_stepper(self, seed: int, batch_size: int = 1) -> tuple[SchedulerStepper | ItemSteppers,
                                                                     list[torch.Generator]]:
        """The vision stepper of one run and the seeded CPU generator of each batch item (item k: seed + k), which
        must also draw that item's initial noise (first) — the reference passes one generator to the noise draw and
        to every scheduler step. A batch steps each item with its own scheduler and generator, so every item
        equals its own single run."""
        generators = [torch.Generator("cpu").manual_seed((int(seed) + k) % (defaults.MAX_SEED + 1))
                      for k in range(batch_size)]
        steppers = [SchedulerStepper(self.make_scheduler(), step_kwargs={"generator": g}) for g in generators]
        return (steppers[0] if batch_size == 1 else ItemSteppers(steppers)), generators


def read_distilled(checkpoint_dir: str | Path) -> DistilledSchedule | None:
    """``DistilledSchedule`` if ``checkpoint_dir`` is a distilled checkpoint (see module docstring), else ``None``."""
    root = Path(checkpoint_dir)
    path = root / MODULAR_INDEX
    if not path.is_file():
        return None
    index = _read_json(path)
    blocks = index.get("_blocks_class_name")
    if blocks is None:  # diffusers cannot build a pipeline from this file at all
        raise CheckpointError(f"{path}: no _blocks_class_name; fetch modular_model_index.json of the checkpoint again.")
    import diffusers

    if not getattr(getattr(diffusers, str(blocks), None), "block_classes", None):
        blocks = _DEFAULT_BLOCKS.get(index.get("_class_name"))
    if blocks != DISTILLED_BLOCKS:
        return None
    sigmas = index.get("distilled_sigmas")
    if not sigmas:
        raise CheckpointError(
            f"{path}: names the distilled pipeline ({blocks}) but has no distilled_sigmas; the download is "
            "incomplete or the file was edited — fetch modular_model_index.json of the checkpoint again."
        )
    if not isinstance(sigmas, list) or not all(
        isinstance(s, (int, float)) and not isinstance(s, bool) and math.isfinite(s) and 0.0 <= s <= 1.0
        for s in sigmas
    ):
        raise CheckpointError(f"{path}: distilled_sigmas={sigmas!r} must be a list of numbers in [0, 1].")
    scheduler_path = root / "scheduler" / "scheduler_config.json"
    if not scheduler_path.is_file():
        raise CheckpointError(f"{scheduler_path} not found: a distilled Cosmos3 checkpoint holds scheduler/.")
    scheduler_config = _read_json(scheduler_path)
    if scheduler_config.get("_class_name") != SCHEDULER_CLASS:
        raise CheckpointError(
            f"{scheduler_path}: a distilled Cosmos3 checkpoint samples with {SCHEDULER_CLASS}, but this file "
            f"describes {scheduler_config.get('_class_name')!r}; the scheduler/ folder belongs to another checkpoint."
        )
    flag = index.get("default_use_system_prompt")
    return DistilledSchedule(
        sigmas=tuple(float(s) for s in sigmas),
        scheduler_config=scheduler_config,
        default_use_system_prompt=flag if isinstance(flag, bool) else None,
        name=root.name,
    )


def _read_json(path: Path) -> dict:
    try:
        value = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path} is not readable JSON ({exc}).") from exc
    if not isinstance(value, dict):
        raise CheckpointError(f"{path} must hold a JSON object.")
    return value

"""SeaCache: on steps whose spectral indicator barely changed, the generation tower's layer stack is replaced by a
predicted residual.

Mirrors diffusers 0.42.1 ``hooks/sea_cache.py`` with its Cosmos3 adapter (``SeaCacheConfig``,
``SeaCacheSharedState.resolve_gate``, ``SeaCacheRootHook.prepare_decoder_stack`` / ``_record_full_execution``,
``_apply_sea_filter``, ``_prepare_cosmos3_raw_vision_metadata``) as ``Cosmos3OmniPipeline`` drives it: one cache
context per guidance branch per step (``"cond"``, ``"uncond"``; Transfer adds ``"cond_no_control"``), each with
its own trajectory state. Here every (branch, batch item) pair is one context — a batch item is one reference run.

* **Indicator** of a step: the vision latents the model is called with (the target, its clean conditioning frames
  included; separate clean items such as Transfer's control latents are not), in the model dtype, filtered in fp32
  by the SEA response for the step's sigma (``sea_filter``: a per-axis Wiener-like gain on the FFT over (T, H, W),
  normalised to unit mean, with the clean-signal power prior ``|f|^-power_exp``), cast back to the model dtype.
* **Gate** of a context: ``distance = mean|cur − prev| / (mean|prev| + 1e-16)``, accumulated over cached steps; the
  stack runs when the sum reaches ``threshold``, on the first ``retention_steps`` and last ``cache_end_steps``
  steps, on a context's first observation, after ``max_consecutive_cached`` reuses (0: no limit), and on any step
  not adjacent to the context's previous one (its trajectory resets: a branch that skipped steps, a new window).
* **Residual** at the stack boundary of the reference's Cosmos3 adapter: ``norm_moe_gen(layers(x)) − x``, ``x`` the
  embedded generation tokens. ``residual_order`` 0 reuses the latest one; 1 extrapolates linearly from the last
  two full executions by step index. A hit with no history computes instead. A cached step's output is
  ``x + residual``.

``SeaCache`` holds one run's states (a new run, e.g. a long video's next window, starts fresh, as a new reference
call does); ``decide`` returns which contexts compute this step. The decision needs the indicator distances on the
host: one device→host copy per step, only while SeaCache is on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch

DEFAULTS = dict(threshold=0.25, residual_order=1, retention_steps=1, cache_end_steps=1, max_consecutive_cached=2,
                power_exp=3.0)
MIN_STEPS = 8  # below this a run has too few steps to reuse (the distilled 4-step models)


@dataclass(frozen=True)
class SeaCacheConfig:
    """diffusers' ``SeaCacheConfig`` knobs; ``check`` refuses what the reference rejects, naming the input
    (``sea_cache_<knob>``; CLI ``--sea-cache-<knob>``)."""

    threshold: float = 0.25
    residual_order: int = 1
    retention_steps: int = 1
    cache_end_steps: int = 1
    max_consecutive_cached: int = 2
    power_exp: float = 3.0

    def check(self) -> "SeaCacheConfig":
        def bad(name, value, rule, example):
            raise ValueError(f"sea_cache_{name}={value!r} {rule} (e.g. {example}; the default is {DEFAULTS[name]}; "
                             f"CLI: --sea-cache-{name.replace('_', '-')}).")

        t = self.threshold
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            bad("threshold", t, "must be a non-negative number (larger reuses more steps)", "0.25")
        if self.residual_order not in (0, 1) or isinstance(self.residual_order, bool):
            bad("residual_order", self.residual_order, "must be 0 (reuse the last residual) or 1 (extrapolate)", 1)
        for name in ("retention_steps", "cache_end_steps", "max_consecutive_cached"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                bad(name, v, "must be a non-negative integer", DEFAULTS[name])
        p = self.power_exp
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not math.isfinite(p) or p <= 0:
            bad("power_exp", p, "must be a positive number", "3.0")
        return self

    def check_steps(self, steps: int, distilled: bool = False) -> None:
        """Refuse a run with too few steps to reuse any (a distilled 4-step checkpoint)."""
        if distilled or steps < MIN_STEPS:
            what = "a distilled few-step checkpoint" if distilled else f"a {steps}-step run"
            raise ValueError(
                f"sea_cache: SeaCache reuses steps of a long schedule; {what} has too few steps ({steps}, SeaCache "
                f"needs at least {MIN_STEPS}) — every step would be retained or would carry the whole trajectory. "
                "Turn sea_cache off for it (CLI: drop --sea-cache; distilled models are already fast), or use 35 "
                "steps.")


def check_sea_cache(config: SeaCacheConfig | None, steps: int, distilled: bool = False) -> SeaCacheConfig | None:
    """A run's SeaCache setting checked: off (None), or knobs the reference accepts for a run of ``steps``."""
    if config is None:
        return None
    if not isinstance(config, SeaCacheConfig):
        raise ValueError(f"sea_cache={config!r} must be a SeaCacheConfig (cosmos3_core.sampling.sea_cache) or None "
                         "(off).")
    config.check().check_steps(steps, distilled)
    return config


def sea_filter(latent: torch.Tensor, sigma: float, power_exp: float) -> torch.Tensor:
    """``latent`` ``[C, T, H, W]`` → the SEA-filtered indicator ``[T, H, W, C]`` in ``latent``'s dtype (the
    reference's ``_apply_sea_filter(latent.movedim(0, -1), sigma, power_exp)``)."""
    hidden = latent.movedim(0, -1)
    dtype = hidden.dtype
    hidden = hidden.contiguous().float()
    dims = (0, 1, 2)
    spectrum = torch.fft.fftn(hidden, dim=dims)
    sigma = max(1e-6, min(1.0 - 1e-6, sigma))
    signal, noise = 1.0 - sigma, sigma
    gain = None
    for axis in dims:
        freqs = torch.fft.fftfreq(hidden.shape[axis], device=hidden.device, dtype=torch.float32)
        clean = 1.0 / (freqs.abs().pow(power_exp) + 1e-16)
        axis_gain = signal * clean / (signal**2 * clean + noise**2 + 1e-16)
        shape = [1] * hidden.ndim
        shape[axis] = axis_gain.shape[0]
        gain = axis_gain.reshape(shape) if gain is None else gain * axis_gain.reshape(shape)
    mean = gain.mean()
    if torch.isfinite(mean) and mean > 0:
        gain = gain / mean
    return torch.fft.ifftn(spectrum * gain, dim=dims).real.to(dtype)


@dataclass
class ContextState:
    """One cache context's trajectory (the reference's ``SeaCacheContextState`` minus per-call scratch)."""

    history: list = field(default_factory=list)  # [(step, residual)], the last residual_order + 1 full executions
    gate_key: tuple[int, float] | None = None
    gate_should_compute: bool = True
    previous_indicator: torch.Tensor | None = None
    accumulated_distance: float = 0.0
    consecutive_cached: int = 0

    def reset_trajectory(self) -> None:
        self.history, self.gate_key, self.gate_should_compute = [], None, True
        self.previous_indicator, self.accumulated_distance, self.consecutive_cached = None, 0.0, 0


@dataclass(frozen=True)
class Decision:
    """One context's outcome for a step: compute the stack (and ``record`` its residual), or reuse ``residual``."""

    compute: bool
    residual: torch.Tensor | None = None
    record: bool = True


class SeaCache:
    """One run's SeaCache contexts, keyed ``(branch name, batch item)``."""

    def __init__(self, config: SeaCacheConfig):
        self.config = config
        self.states: dict[tuple[str, int], ContextState] = {}
        self.trace: list[tuple[int, str, int, bool]] = []  # (step, branch, item, computed): tests and logs read it

    def indicators(self, latents: torch.Tensor, noisy: bool, sigma: float, dtype: torch.dtype) -> list | None:
        """Per batch item, the step's indicator (None: no noisy vision frame, the reference runs in full)."""
        if not noisy:
            return None
        return [sea_filter(item.to(dtype), sigma, self.config.power_exp).detach() for item in latents]

    def decide(self, step: int, sigma: float, num_steps: int, branches: tuple[str, ...],
               indicators: list | None, items: int = 1) -> list[Decision]:
        """Decisions for every context of the step, rows branch-major as the batched step's rows."""
        cfg = self.config
        items = items if indicators is None else len(indicators)
        keys = [(name, k) for name in branches for k in range(items)]
        if indicators is None:  # the reference's fail-open call: no gate, no state change, nothing recorded
            self.trace.extend((step, name, k, True) for name, k in keys)
            return [Decision(True, record=False) for _ in keys]
        kinds, pending = [], []
        for key in keys:  # the gate of resolve_gate, up to the distance
            state = self.states.setdefault(key, ContextState())
            ind = indicators[key[1]]
            if state.gate_key == (step, sigma):
                kinds.append(("repeat", False))
                continue
            non_adjacent = state.gate_key is not None and step != state.gate_key[0] + 1
            if non_adjacent:
                state.reset_trajectory()
            is_max = bool(cfg.max_consecutive_cached and state.consecutive_cached >= cfg.max_consecutive_cached)
            prev = state.previous_indicator
            if (non_adjacent or step < cfg.retention_steps or step >= num_steps - cfg.cache_end_steps
                    or prev is None or is_max):
                kinds.append(("forced", is_max))
            elif ind.shape != prev.shape or ind.device != prev.device or ind.dtype != prev.dtype:
                kinds.append(("invalid", is_max))
            else:
                kinds.append(("distance", is_max))
                pending.append(key)
        distances = {}
        if pending:  # every context's distance in one device→host copy
            terms = []
            for key in pending:
                cur, prev = indicators[key[1]].float(), self.states[key].previous_indicator.float()
                terms.append((cur - prev).abs().mean() / (prev.abs().mean() + 1e-16))
            distances = dict(zip(pending, torch.stack(terms).cpu().tolist()))
        out = []
        for key, (kind, is_max) in zip(keys, kinds):
            state = self.states[key]
            if kind == "repeat":
                gate = state.gate_should_compute
            else:
                candidate = 0.0
                if kind == "distance":
                    d = distances[key]
                    candidate = state.accumulated_distance + d
                    gate = not math.isfinite(d) or candidate >= cfg.threshold
                else:
                    gate = True
                gate = gate or is_max
                state.accumulated_distance = 0.0 if gate else candidate
                state.gate_key, state.gate_should_compute = (step, sigma), gate
                state.previous_indicator = indicators[key[1]]
            compute, residual = gate, None
            if not compute:  # prepare_decoder_stack: a hit needs a residual history
                residual = self._predicted(state, step)
                compute = residual is None
            if compute and not gate:
                state.accumulated_distance, state.gate_should_compute = 0.0, True
            if not compute:
                state.consecutive_cached += 1
            self.trace.append((step, key[0], key[1], compute))
            out.append(Decision(compute, residual))
        return out

    def _predicted(self, state: ContextState, step: int) -> torch.Tensor | None:
        if not state.history:
            return None
        history = state.history[-(self.config.residual_order + 1):]
        latest_step, latest = history[-1]
        if self.config.residual_order == 1 and len(history) >= 2:
            previous_step, previous = history[-2]
            if latest_step != previous_step:
                scale = (step - latest_step) / (latest_step - previous_step)
                return latest + (latest - previous) * scale
        return latest

    def record(self, step: int, branch: str, item: int, residual: torch.Tensor) -> None:
        """A full execution of one context: its residual ``norm_moe_gen(layers(x)) − x``."""
        state = self.states[(branch, item)]
        state.consecutive_cached = 0
        state.history.append((step, residual.detach().clone()))
        state.history = state.history[-(self.config.residual_order + 1):]


@dataclass
class CacheStep:
    """One step's view of a run's ``SeaCache``, handed to ``denoise_step`` (it is the model's ``StepCache``): the
    step, its sigma, the branch names of the step's rows (``Guidance.names``) and whether the vision target has
    noisy frames (decided by the plan, so the step reads no device flag)."""

    cache: SeaCache
    step: int
    sigma: float
    num_steps: int
    branches: tuple[str, ...]
    noisy: bool = True

    def run_stack(self, latents: torch.Tensor, target: torch.Tensor, stack: Callable[[list[int]], torch.Tensor],
                  num_branches: int, dtype: torch.dtype) -> torch.Tensor:
        """Every row's layer-stack output over ``target`` ``[B·N, tokens, D]`` (rows branch-major): the stack runs
        (``stack(branches)``) for the branches with a row that computes, and only those rows' residuals
        ``norm_moe_gen(layers(x)) − x`` are recorded; a reused row is ``x + residual``. ``latents``
        ``[N, C, T, h, w]`` give the indicator."""
        items = latents.shape[0]
        assert target.shape[0] == num_branches * items == len(self.branches) * items
        indicators = self.cache.indicators(latents, self.noisy, self.sigma, dtype)
        decisions = self.cache.decide(self.step, self.sigma, self.num_steps, self.branches, indicators, items=items)
        run = [j for j in range(num_branches) if any(d.compute for d in decisions[j * items:(j + 1) * items])]
        out = target.clone()
        if run:
            rows = [j * items + k for j in run for k in range(items)]
            computed = stack(run)
            for r, row in enumerate(rows):
                if decisions[row].compute:
                    out[row] = computed[r]
                    if decisions[row].record:
                        name, item = self.branches[row // items], row % items
                        self.cache.record(self.step, name, item, out[row] - target[row])
        for row, d in enumerate(decisions):
            if not d.compute:
                out[row] = target[row] + d.residual
        return out

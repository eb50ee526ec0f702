"""SeaCache's indicator, gate and residual prediction (cosmos3_core/sampling/sea_cache.py) == diffusers 0.42.1's hook.

The reference is driven through its own Cosmos3 stack-boundary hook (``SeaCacheRootHook.prepare_decoder_stack`` /
``record_decoder_stack`` / ``post_forward``, one ``cache_context`` per branch) on scripted trajectories: latents
that change by varied amounts, a branch that drops out for some steps (guidance interval), two batch items (two
reference runs). Ours sees the same inputs; the compute/reuse decision of every context at every step and the
reused residual must be identical, for several knob settings. The SEA filter is compared bit for bit, and every
knob the reference rejects is rejected here with a message naming it.
"""

from __future__ import annotations

import pytest
import torch
from diffusers.hooks.hooks import CacheContext, StateManager
from diffusers.hooks.sea_cache import SeaCacheConfig as RefConfig
from diffusers.hooks.sea_cache import (
    SeaCacheContextState,
    SeaCacheRootHook,
    SeaCacheSharedState,
    _apply_sea_filter,
    _SeaCacheForwardMetadata,
)

from cosmos3_core.sampling.sea_cache import SeaCache, SeaCacheConfig, check_sea_cache, sea_filter

SHAPE = (6, 3, 4, 6)  # latent [C, T, h, w]
TOKENS, DIM = 10, 8


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("sigma", [0.0, 1e-9, 0.3, 0.97, 1.0])
def test_sea_filter_is_the_references(dtype, sigma):
    latent = torch.randn(SHAPE, generator=torch.Generator().manual_seed(1)).to(dtype)
    for power in (3.0, 1.5):
        assert torch.equal(sea_filter(latent, sigma, power), _apply_sea_filter(latent.movedim(0, -1), sigma, power))


class Reference:
    """diffusers' SeaCache root hook driven as Cosmos3OmniPipeline drives it, minus the model."""

    def __init__(self, config: RefConfig):
        self.manager = StateManager(SeaCacheContextState)
        self.shared = SeaCacheSharedState()
        self.hook = SeaCacheRootHook(config, self.manager, self.shared, raw_vision_callback=None,
                                     use_stack_boundary=True)
        self.module = torch.nn.Module()
        self.module.layers = torch.nn.ModuleList([torch.nn.Linear(2, 2)])

    def step(self, context, step, sigma, num_steps, latent, gen_in, full_output):
        self.manager.set_context(CacheContext(context, step_index=step, sigma=sigma, num_inference_steps=num_steps))
        self.manager.get_state().reset_forward()
        self.shared.forward_metadata = _SeaCacheForwardMetadata(step, sigma, num_steps, raw_vision=[latent])
        und = torch.zeros(3, DIM)
        _, gen, compute = self.hook.prepare_decoder_stack(self.module, und, gen_in)
        if compute:
            self.hook.record_decoder_stack(self.module, und + 1, full_output)
            gen = full_output
        self.hook.post_forward(self.module, None)
        self.manager.set_context(None)
        return compute, gen


def trajectory(num_steps, seed):
    """Latents whose step-to-step change varies (tiny, large, tiny…), plus per-step stack inputs and outputs."""
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(SHAPE, generator=g)
    moves = [0.002, 0.3, 0.001, 0.004, 0.5, 0.002, 0.002, 0.002, 0.003, 0.8, 0.001, 0.001]
    latents, x = [], base
    for i in range(num_steps):
        x = x + moves[i % len(moves)] * torch.randn(SHAPE, generator=g)
        latents.append(x.clone())
    gen_in = [torch.randn(TOKENS, DIM, generator=g) for _ in range(num_steps)]
    gen_out = [torch.randn(TOKENS, DIM, generator=g) for _ in range(num_steps)]
    return latents, gen_in, gen_out


KNOBS = [
    {},
    dict(residual_order=0),
    dict(max_consecutive_cached=0),
    dict(max_consecutive_cached=1, threshold=0.5),
    dict(threshold=0.0),
    dict(threshold=1e9, retention_steps=3, cache_end_steps=0),
    dict(threshold=0.05, retention_steps=0, cache_end_steps=2),
]


@pytest.mark.parametrize("knobs", KNOBS, ids=[str(k) or "defaults" for k in KNOBS])
def test_decisions_and_residuals_equal_the_reference_hook(knobs):
    steps, sigmas = 14, torch.linspace(0.999, 0.05, 14).tolist()
    uncond_active = [i < 4 or i > 8 for i in range(steps)]  # a branch out for steps 4–8: its trajectory resets
    items = [trajectory(steps, seed) for seed in (3, 4)]
    refs = [Reference(RefConfig(**knobs)) for _ in items]  # one reference run per batch item
    ours = SeaCache(SeaCacheConfig(**knobs).check())
    reused = 0
    for i in range(steps):
        branches = ("cond", "uncond") if uncond_active[i] else ("cond",)
        ind = ours.indicators(torch.stack([it[0][i] for it in items]), True, sigmas[i], torch.float32)
        decisions = ours.decide(i, sigmas[i], steps, branches, ind)
        for row, (name, k) in enumerate((n, k) for n in branches for k in range(len(items))):
            latents, gen_in, gen_out = items[k]
            offset = 0.0 if name == "cond" else 0.5  # the branches' stack values differ
            want_compute, want_gen = refs[k].step(name, i, sigmas[i], steps, latents[i], gen_in[i] + offset,
                                                  gen_out[i] - offset)
            got = decisions[row]
            assert got.compute == want_compute, (i, name, k)
            if got.compute:
                ours.record(i, name, k, (gen_out[i] - offset) - (gen_in[i] + offset))
            else:
                assert torch.equal(gen_in[i] + offset + got.residual, want_gen), (i, name, k)
                reused += 1
    if knobs.get("threshold", 0.25) not in (0.0,) and knobs.get("retention_steps", 1) < 3:
        assert reused > 0  # the trajectories do exercise reuse


def test_no_noisy_vision_always_computes_and_records_nothing():
    cache = SeaCache(SeaCacheConfig())
    for i in range(5):
        decisions = cache.decide(i, 0.5, 10, ("cond", "uncond"), None, items=2)
        assert [d.compute for d in decisions] == [True] * 4 and not any(d.record for d in decisions)
    assert cache.states == {}


@pytest.mark.parametrize("name, value", [
    ("threshold", -0.1), ("threshold", float("nan")), ("threshold", float("inf")), ("residual_order", 2),
    ("retention_steps", -1), ("cache_end_steps", -2), ("max_consecutive_cached", -1),
    ("max_consecutive_cached", True), ("max_consecutive_cached", 1.5), ("power_exp", 0.0), ("power_exp", -1.0),
])
def test_knobs_the_reference_rejects_are_rejected_by_name(name, value):
    with pytest.raises(ValueError):
        RefConfig(**{name: value})
    with pytest.raises(ValueError) as info:
        SeaCacheConfig(**{name: value}).check()
    message = str(info.value)
    flag = "--sea-cache-" + name.replace("_", "-")
    assert message.startswith(f"sea_cache_{name}={value!r} ") and f"CLI: {flag}" in message and "default" in message


def test_too_few_steps_is_refused():
    with pytest.raises(ValueError, match="distilled few-step checkpoint"):
        SeaCacheConfig().check_steps(4, distilled=True)
    with pytest.raises(ValueError, match="a 4-step run"):
        SeaCacheConfig().check_steps(4)
    SeaCacheConfig().check_steps(35)
    with pytest.raises(ValueError, match=r"sea_cache=0\.25 must be a SeaCacheConfig"):
        check_sea_cache(0.25, 35)

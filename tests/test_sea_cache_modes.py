"""SeaCache in the modes diffusers 0.42.1 runs through its modular pipeline — Transfer's chunk loop and the action
modes — == the modular ``Cosmos3OmniBlocks`` pipeline with ``transformer.enable_cache(SeaCacheConfig)`` (fp32, CPU).

The reference names its cache contexts per pass (Transfer: ``cond``, ``cond_no_control``, ``uncond``; action:
``cond``, ``uncond``) and runs them one after the other; which ran the layer stack is read by counting its first
decoder layer's calls per context. Ours runs each window (chunk) as a plan of its own with a fresh SeaCache, the
branches batched: the same (chunk, step, context) decisions and the same latents (1e-4, as the plain parity tests).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from diffusers import SeaCacheConfig as RefConfig
from diffusers import UniPCMultistepScheduler
from diffusers.modular_pipelines.cosmos.modular_blocks_cosmos3 import Cosmos3OmniBlocks
from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import CosmosActionCondition
from test_transfer_parity import (  # noqa: F401
    NEGATIVE,
    PROMPT,
    SEED,
    SHIFT,
    H,
    checkpoint,
    control_clip,
    ours,
    reference,
    run_reference,
)

from cosmos3_core.api import generate
from cosmos3_core.modes.long_video import generate_long
from cosmos3_core.pipeline import Cosmos3Pipeline
from cosmos3_core.request import ActionRequest, Request
from cosmos3_core.resolve import resolve
from cosmos3_core.sampling.sea_cache import SeaCacheConfig
from support.compare import rel

STEPS = 8
KNOBS = dict(threshold=0.6)


def record_decisions(transformer, contexts_of_step):
    """Hooks on the reference: ``ran[(call's step, context)] = the stack ran``; ``contexts_of_step`` gives the
    contexts the reference calls at each step, in order. Returns (ran, remove)."""
    calls, ran = [], {}

    def on_call(module, args, kwargs):
        step = len(calls) // len(contexts_of_step)
        calls.append((step, contexts_of_step[len(calls) % len(contexts_of_step)]))
        ran[calls[-1]] = False

    handles = [transformer.register_forward_pre_hook(on_call, with_kwargs=True),
               transformer.layers[0].register_forward_pre_hook(lambda *a: ran.__setitem__(calls[-1], True))]
    return ran, lambda: [h.remove() for h in handles]


def test_transfer_chunks_reuse_like_the_reference(ours, reference, monkeypatch):  # noqa: F811
    controls = {"edge": control_clip(8, 9)}
    contexts = ("cond", "cond_no_control", "uncond")
    reference.transformer.enable_cache(RefConfig(**KNOBS))
    ran, remove = record_decisions(reference.transformer, contexts)
    try:
        _frames, ref_chunks, _ = run_reference(
            reference, monkeypatch, controls, num_video_frames_per_chunk=5, num_conditional_frames=1,
            num_inference_steps=STEPS, guidance_scale=4.0, control_guidance=1.5)
    finally:
        remove()
        reference.transformer.disable_cache()
    plans, latents = [], []
    run = resolve(Request(prompt=PROMPT, negative_prompt=NEGATIVE, controls=controls, frames_per_chunk=5,
                          conditional_frames=1, height=H, width=48, steps=STEPS, guidance=4.0, control_guidance=1.5,
                          seed=SEED, schedule="flow_shift", shift=SHIFT, sea_cache=SeaCacheConfig(**KNOBS)), ours.info)
    generate_long(ours, run, latents_sink=lambda k, lat: latents.append(lat.clone()),
                  prepare=lambda part, need: plans.append(need) if part == "generation" else None)
    assert len(plans) == len(ref_chunks) == 2
    for k, plan in enumerate(plans):
        want = {(step - k * STEPS, name): v for (step, name), v in ran.items() if k * STEPS <= step < (k + 1) * STEPS}
        mine = {(step, branch): computed for step, branch, _, computed in plan.cache.trace}
        assert mine == want, k
        assert not all(want.values())  # the case exercises reuse
        assert rel(latents[k], ref_chunks[k]) <= 1e-4


@pytest.fixture(scope="module")
def action_checkpoint(tiny_checkpoint):
    return tiny_checkpoint("nano", sound=True, seed=5)


@pytest.fixture(scope="module")
def action_ours(action_checkpoint):
    return Cosmos3Pipeline.load(action_checkpoint, dtype=torch.float32, device="cpu")


@pytest.fixture(scope="module")
def action_reference(action_checkpoint):
    pipe = Cosmos3OmniBlocks().init_pipeline(str(action_checkpoint))
    pipe.load_components(torch_dtype=torch.float32)
    pipe.disable_safety_checker()
    pipe.scheduler = UniPCMultistepScheduler.from_config(pipe.scheduler.config, flow_shift=10.0, use_karras_sigmas=False)
    return pipe


@pytest.mark.parametrize("mode, guidance, sound", [("policy", 3.0, True), ("inverse_dynamics", 3.0, False)])
def test_action_modes_reuse_like_the_reference(action_ours, action_reference, mode, guidance, sound):
    """Policy: the vision target is noisy, contexts reuse as the reference's. Inverse dynamics: every vision latent is
    clean, so there is no indicator and both run the stack at every step (the reference's fail-open call)."""
    chunk = 4
    clip = np.random.default_rng(1).random((chunk + 1, 72, 100, 3)).astype(np.float32)
    kw = dict(mode=mode, chunk_size=chunk, domain_name="bridge_orig_lerobot", resolution_tier=256)
    kw.update(video=clip) if mode == "inverse_dynamics" else kw.update(image=clip[0])
    contexts = ("cond", "uncond")
    action_reference.transformer.enable_cache(RefConfig(**KNOBS))
    ran, remove = record_decisions(action_reference.transformer, contexts)
    try:
        ref = action_reference(prompt="robot arm picks up the red cup", negative_prompt="blurry static",
                               action=CosmosActionCondition(**kw), fps=5.0, num_inference_steps=STEPS,
                               guidance_scale=guidance, enable_sound=sound, use_system_prompt=False,
                               generator=torch.Generator("cpu").manual_seed(SEED), output_type="latent")
    finally:
        remove()
        action_reference.transformer.disable_cache()
    plans = []
    real = action_ours.run
    action_ours.run = lambda plan, *a, **k: plans.append(plan) or real(plan, *a, **k)
    try:
        out = generate(action_ours, Request(action=ActionRequest(**kw), prompt="robot arm picks up the red cup",
                                            negative_prompt="blurry static", steps=STEPS, guidance=guidance,
                                            seed=SEED, sound=sound, sea_cache=SeaCacheConfig(**KNOBS)), decode=False)
    finally:
        del action_ours.run
    (plan,) = plans
    mine = {(step, branch): computed for step, branch, _, computed in plan.cache.trace}
    assert mine == ran
    assert all(ran.values()) == (mode == "inverse_dynamics")
    assert rel(out.latents, ref.values["latents"]) <= 1e-4
    assert rel(out.action, ref.values["action_latents"]) <= 1e-4

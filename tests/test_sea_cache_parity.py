"""SeaCache generation == diffusers 0.42.1 ``Cosmos3OmniPipeline`` with ``transformer.enable_cache(SeaCacheConfig)``,
on the tiny checkpoint, fp32 on the CPU: the same (step, branch) contexts reuse their residual, and the final latents
and sound agree as in the plain parity tests (1e-4: fp32 summation order; the gate's distances then differ by
~1e-7, far from any threshold here).

The reference runs each guidance branch in its own ``cache_context``; ours runs both branches as one batch and
decides per branch (and per batch item: a batch of two is two reference runs with seeds ``s`` and ``s + 1``). Which
contexts ran the stack is read from the reference by counting its first decoder layer's calls per context. A whole
request (``api.generate``) with ``sea_cache`` runs the same steps as the staged plan; a Transfer window
names its branches as the reference's contexts.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from diffusers import Cosmos3OmniPipeline, UniPCMultistepScheduler
from diffusers import SeaCacheConfig as RefConfig
from PIL import Image

from cosmos3_core import api
from cosmos3_core.api import generate
from cosmos3_core.pipeline import Cosmos3Pipeline
from cosmos3_core.request import Request
from cosmos3_core.sampling.sea_cache import SeaCacheConfig
from support.compare import rel

H, W, F, STEPS, SEED = 64, 96, 9, 12, 2024
PROMPT = "a red robot walking on the street at night"
NEGATIVE = "blurry low quality video"


@pytest.fixture(scope="module")
def checkpoint(tiny_checkpoint):
    return tiny_checkpoint("nano", sound=True, seed=7)


@pytest.fixture(scope="module")
def ours(checkpoint):
    return Cosmos3Pipeline.load(checkpoint, dtype=torch.float32, device="cpu")


def reference_run(checkpoint, knobs, seed, **kwargs):
    """The reference with SeaCache; returns its output and {(step, context): stack ran}."""
    pipe = Cosmos3OmniPipeline.from_pretrained(checkpoint, enable_safety_checker=False, torch_dtype=torch.float32)
    pipe.scheduler = UniPCMultistepScheduler.from_config(pipe.scheduler.config, flow_shift=3.0,
                                                         use_karras_sigmas=False)
    pipe.transformer.enable_cache(RefConfig(**knobs))
    calls, ran = [], {}
    guided = kwargs.get("guidance_scale", 6.0) != 1.0

    def on_call(module, args, kwargs_):
        step, ctx = divmod(len(calls), 2 if guided else 1)
        calls.append((step, ("cond", "uncond")[ctx]))
        ran[calls[-1]] = False

    pipe.transformer.register_forward_pre_hook(on_call, with_kwargs=True)
    pipe.transformer.layers[0].register_forward_pre_hook(lambda *a: ran.__setitem__(calls[-1], True))
    out = pipe(prompt=PROMPT, negative_prompt=NEGATIVE, height=H, width=W, fps=24.0, num_inference_steps=STEPS,
               generator=torch.Generator("cpu").manual_seed(seed), output_type="latent", **kwargs)
    return out, ran


def _image(seed: int) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (80, 100, 3), dtype=np.uint8))


CASES = {
    "t2v": (dict(num_frames=F), dict(threshold=0.6)),
    "t2av-order0": (dict(num_frames=F, enable_sound=True), dict(threshold=0.6, residual_order=0)),
    "i2v-unlimited": (dict(num_frames=F, image="image"), dict(threshold=0.4, max_consecutive_cached=0)),
    "t2v-retain": (dict(num_frames=F), dict(threshold=1.0, retention_steps=3, cache_end_steps=2)),
    "t2i-guidance1": (dict(num_frames=1, guidance_scale=1.0), dict(threshold=0.6)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_same_steps_reused_and_same_outputs_as_the_reference(checkpoint, ours, case):
    args, knobs = CASES[case]
    args = dict(args)
    if args.get("image") == "image":
        args["image"] = _image(3)
    ref, ran = reference_run(checkpoint, knobs, SEED, **args)
    guidance = args.get("guidance_scale", 6.0)
    sound, sea = args.get("enable_sound", False), SeaCacheConfig(**knobs)
    text = ours.encode_text(PROMPT, NEGATIVE, num_frames=args["num_frames"], height=H, width=W, fps=24.0)
    x0, clean = ours.encode_condition(text, image=args.get("image"))
    plan = api.plan(ours, text, seed=SEED, steps=STEPS, guidance=guidance, schedule="flow_shift", shift=3.0,
                     sound=sound, x0=x0, clean_frames=clean, sea_cache=sea)
    result = ours.run(plan)
    mine = {(step, branch): computed for step, branch, item, computed in plan.cache.trace}
    assert mine == ran, case
    assert not all(ran.values()), "the case must exercise reuse"
    assert rel(result.latents, ref.video) <= 1e-4, case
    if sound:
        wave = ours.decode_sound(result.sound[0], F, 24.0)
        assert rel(wave, ref.sound[:, : wave.shape[1]]) <= 1e-4
    if case == "t2v":  # the whole request, resolved once: the same run
        whole = generate(ours, Request(prompt=PROMPT, negative_prompt=NEGATIVE, num_frames=F, height=H, width=W,
                                       fps=24.0, steps=STEPS, guidance=guidance, seed=SEED, schedule="flow_shift",
                                       shift=3.0, sea_cache=sea), decode=False)
        assert torch.equal(whole.latents, result.latents)


def test_batch_items_decide_as_separate_reference_runs(checkpoint, ours):
    knobs = dict(threshold=0.6)
    refs = [reference_run(checkpoint, knobs, SEED + k, num_frames=F) for k in range(2)]
    text = ours.encode_text(PROMPT, NEGATIVE, num_frames=F, height=H, width=W, fps=24.0)
    plan = api.plan(ours, text, seed=SEED, steps=STEPS, guidance=6.0, schedule="flow_shift", shift=3.0, batch_size=2,
                     sea_cache=SeaCacheConfig(**knobs))
    result = ours.run(plan)
    for k, (ref, ran) in enumerate(refs):
        mine = {(step, branch): computed for step, branch, item, computed in plan.cache.trace if item == k}
        assert mine == ran
        assert rel(result.latents[k:k + 1], ref.video) <= 1e-4


def test_a_branch_outside_the_guidance_interval_restarts_its_trajectory(ours):
    """Our guidance interval drops the uncond branch for late steps; when it is back (an interval in the middle)
    its context is non-adjacent and computes, as a reference context that skipped steps does."""
    text = ours.encode_text(PROMPT, NEGATIVE, num_frames=F, height=H, width=W, fps=24.0)
    plan = api.plan(ours, text, seed=1, steps=STEPS, guidance=6.0, schedule="flow_shift", shift=3.0,
                     guidance_interval=(0, 900), sea_cache=SeaCacheConfig(threshold=10.0))
    ours.run(plan)
    uncond = [(s, c) for s, b, _, c in plan.cache.trace if b == "uncond"]
    first = uncond[0][0]
    assert first > 0 and uncond[0][1] is True  # its first observation computes
    cond = {s: c for s, b, _, c in plan.cache.trace if b == "cond"}
    assert not all(cond.values())


@pytest.mark.parametrize("transfer", [False, True], ids=["windows", "transfer"])
def test_every_window_has_contexts_of_its_own(ours, transfer):
    """Each long-video window is a run of its own (as each reference call is): a fresh SeaCache whose contexts
    start computing; Transfer's branches are the reference's three contexts."""
    from cosmos3_core.modes.long_video import generate_long
    from cosmos3_core.resolve import resolve

    extra = dict(num_frames=13)
    if transfer:
        edges = np.random.default_rng(5).random((13, 32, 48, 3), dtype=np.float32)
        extra = dict(controls={"edge": edges}, control_guidance=2.0)
    run = resolve(Request(prompt=PROMPT, negative_prompt=NEGATIVE, height=32, width=48, steps=STEPS, seed=3,
                          frames_per_chunk=9, conditional_frames=1, shift=3.0,
                          sea_cache=SeaCacheConfig(threshold=0.6), **extra), ours.info)
    plans = []
    generate_long(ours, run, prepare=lambda part, need: plans.append(need) if part == "generation" else None)
    assert len(plans) == run.windows.num_windows == 2
    assert plans[0].cache is not plans[1].cache
    names = ("cond", "cond_no_control", "uncond") if transfer else ("cond", "uncond")
    for plan in plans:
        first = [(branch, computed) for step, branch, _, computed in plan.cache.trace if step == 0]
        assert first == [(name, True) for name in names]  # a fresh trajectory: every context computes
        assert not all(c for *_, c in plan.cache.trace)  # and later steps reuse

"""The plan assembles a resolved run (the resolver checks the request and decides it); the loop knows no modes.

Request checks are asserted on their messages (argument, value, fix); the decisions on what the plan holds
(branches per step, streams, anchors) for a tiny checkpoint. Numerical parity of the decided runs with diffusers is
in test_generation_parity.py.
"""

from __future__ import annotations

import ast
import math
from pathlib import Path

import pytest
import torch

from cosmos3_core import api, defaults
from cosmos3_core.checks import check_clip, check_sampling
from cosmos3_core.pipeline import Cosmos3Pipeline
from cosmos3_core.request import Request
from cosmos3_core.resolve import resolve
from support.compare import rel

CORE = Path(__file__).resolve().parent.parent / "cosmos3_core"


@pytest.fixture(scope="module")
def pipe(tiny_checkpoint):
    ckpt = tiny_checkpoint("nano", sound=True, seed=3)
    return Cosmos3Pipeline.load(ckpt, dtype=torch.float32, device="cpu")


@pytest.fixture(scope="module")
def text(pipe):
    return pipe.encode_text("a red car on the street", "blurry", num_frames=9, height=64, width=96, fps=24.0)


def _sampling(**overrides):
    args = dict(seed=1, steps=4, guidance=6.0, schedule="flow_shift", shift=None, guidance_interval=None,
                batch_size=1)
    args.update(overrides)
    check_sampling(**args)


@pytest.mark.parametrize("overrides, needles", [
    (dict(steps=0), ["steps=0", "from 1 to"]),
    (dict(guidance=math.nan), ["guidance (cfg)=nan", "from 0 to"]),
    (dict(guidance=math.inf), ["guidance (cfg)=inf"]),
    (dict(seed=2**64), ["seed=18446744073709551616", "2**64-1"]),
    (dict(seed=-1), ["seed=-1"]),
    (dict(shift=0.0), ["shift=0.0", "above 0"]),
    (dict(schedule="euler"), ["schedule='euler'", "flow_shift"]),
    (dict(guidance_interval=(900, 100)), ["guidance_interval=[900, 100]", "LOW <= HIGH"]),
    (dict(batch_size=0), ["batch_size=0"]),
])
def test_sampling_checks_name_value_and_fix(overrides, needles):
    with pytest.raises(ValueError) as e:
        _sampling(**overrides)
    msg = str(e.value)
    assert msg.startswith(needles[0].split("=")[0])  # the message opens with the argument it is about
    for needle in needles:
        assert needle in msg, (needle, msg)


def test_good_sampling_arguments_pass():
    _sampling()
    _sampling(steps=None, guidance=1.0, shift=10.0, guidance_interval=(800, 1000), seed=2**64 - 1)


@pytest.mark.parametrize("args, needle", [
    ((10, 64, 96, 24.0), "num_frames=10"),
    ((defaults.MAX_FRAMES + 4, 64, 96, 24.0), "above the limit"),
    ((9, 100, 96, 24.0), "height=100"),
    ((9, 64, defaults.MAX_SIZE + 16, 24.0), "above the limit"),
    ((9, 64, 96, 1e-9 * 0), "fps=0.0"),
    ((9, 64, 96, math.nan), "fps=nan"),
])
def test_clip_checks(args, needle):
    with pytest.raises(ValueError) as e:
        check_clip(*args)
    assert needle in str(e.value)


def test_image_with_one_frame_is_refused_not_ignored(pipe):
    with pytest.raises(ValueError, match="num_frames=1 .*would be ignored"):
        resolve(Request(prompt="x", num_frames=1, height=64, width=96, image=torch.zeros(64, 96, 3)), pipe.info)


def test_plan_decides_branches_streams_and_interval(pipe, text):
    plan = api.plan(pipe, text, seed=1, steps=4, guidance=6.0, sound=True, guidance_interval=(990, 1000))
    assert [s.name for s in plan.streams] == ["vision", "sound"]
    assert plan.stream("vision").init.shape == (1, 48, 3, 4, 6)
    branches = [len(g.text) for g in plan.guidance]
    in_interval = [990 <= int(t) <= 1000 for t in plan.timesteps]
    assert branches == [2 if inside else 1 for inside in in_interval] and 1 in branches and 2 in branches
    one = api.plan(pipe, text, seed=1, steps=3, guidance=1.0)
    assert all(len(g.text) == 1 for g in one.guidance) and one.steps == 3
    assert api.plan(pipe, text, seed=1).steps == defaults.STEPS_VIDEO


def test_plan_refuses_conditions_that_would_be_ignored(pipe, text):
    x0 = torch.zeros(1, 48, 3, 4, 6)
    with pytest.raises(ValueError, match="3 clean latent frames.*nothing would be generated"):
        api.plan(pipe, text, seed=1, steps=2, x0=x0, clean_frames=[0, 1, 2])
    image_text = pipe.encode_text("a car", None, num_frames=1, height=64, width=96, fps=24.0)
    with pytest.raises(ValueError, match="num_frames is 1"):
        api.plan(pipe, image_text, seed=1, steps=2, x0=x0[:, :, :1], clean_frames=[0])


def test_plan_refuses_a_step_larger_than_the_machine(pipe):
    big = pipe.encode_text("a car", "", num_frames=defaults.MAX_FRAMES, height=defaults.MAX_SIZE,
                           width=defaults.MAX_SIZE, fps=24.0)
    with pytest.raises(ValueError, match="GiB on cpu.*lower width/height or num_frames"):
        api.plan(pipe, big, seed=1, steps=2)


def test_loop_imports_no_model_or_layout():
    """sampling/loop.py iterates a plan: it must not build layouts, noise or schedulers itself."""
    tree = ast.parse((CORE / "sampling" / "loop.py").read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported <= {"__future__", "dataclasses", "typing", "plan"}, imported


def test_batch_items_equal_their_single_runs(pipe, text):
    """batch_size N runs seeds seed..seed+N-1 stacked with both guidance branches in one forward; each item is its
    own single run up to fp32 rounding (GEMM blocking depends on the batch size, so not bit-identical)."""
    calls = []
    real = pipe.transformer.denoise_step

    def counting(latents, *args, **kwargs):
        calls.append(latents.shape[0])
        return real(latents, *args, **kwargs)

    pipe.transformer.denoise_step = counting
    try:
        both = pipe.run(api.plan(pipe, text, seed=5, steps=2, sound=True, batch_size=3))
    finally:
        del pipe.transformer.denoise_step
    assert calls == [3, 3]  # one forward per step for all items (and both branches)
    assert both.latents.shape == (3, 48, 3, 4, 6) and both.sound.shape[0] == 3
    singles = [pipe.run(api.plan(pipe, text, seed=5 + k, steps=2, sound=True)) for k in range(3)]
    for k, one in enumerate(singles):
        assert rel(both.latents[k], one.latents[0]) <= 1e-5
        assert rel(both.sound[k], one.sound[0]) <= 1e-5
    assert rel(singles[0].latents, singles[1].latents) > 0.1  # the items really differ
    frames = pipe.decode_video(both.latents[:2])
    assert frames.shape == (2 * 9, 64, 96, 3)
    assert rel(frames[9:], pipe.decode_video(both.latents[1:2])) <= 1e-6

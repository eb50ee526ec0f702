"""Distilled 4-step checkpoints == diffusers 0.42.1 ``Cosmos3DistilledModularPipeline`` on a tiny checkpoint.

The tiny checkpoint is Super-shaped (8/1 heads: Super's 8:1 GQA, query width 1.6x the hidden size) in the
distilled layout (``modular_model_index.json`` with ``distilled_sigmas``, a stochastic FlowMatchEuler scheduler).
fp32 on the CPU, same CPU generator on both sides: the reference draws the initial noise and every step's SDE noise
from it, so the latents only match if ours draws the same numbers in the same order.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from diffusers import ModularPipeline
from PIL import Image

from cosmos3_core import api
from cosmos3_core.config import CheckpointError
from cosmos3_core.sampling.distilled import read_distilled
from cosmos3_core.testing.tiny import DISTILLED_SIGMAS
from support.compare import rel

H, W, SEED = 64, 96, 1234
PROMPT = "a red robot walking on the street at night"


@pytest.fixture(scope="module")
def checkpoint(tiny_checkpoint):
    return tiny_checkpoint("super", seed=5, distilled=True)


def _reference_blocks(path) -> tuple[str, list | None]:
    pipe = ModularPipeline.from_pretrained(str(path))
    return type(pipe._blocks).__name__, getattr(pipe.config, "distilled_sigmas", None)


def _variant(checkpoint, tmp_path, edit):
    """A copy of the checkpoint's small files (weights symlinked) with ``modular_model_index.json`` edited."""
    out = tmp_path / "variant"
    shutil.copytree(checkpoint, out, symlinks=True, ignore=shutil.ignore_patterns("*.safetensors"))
    for src in checkpoint.rglob("*.safetensors"):
        (out / src.relative_to(checkpoint)).symlink_to(src)
    path = out / "modular_model_index.json"
    index = json.loads(path.read_text())
    edited = edit(index)
    if edited is None:
        path.unlink()
    else:
        path.write_text(json.dumps(edited))
    return out


RECOGNITION = {
    "as_shipped": lambda i: i,
    "omni_class": lambda i: {**i, "_class_name": "Cosmos3OmniModularPipeline"},  # the blocks decide
    "unknown_blocks": lambda i: {**i, "_blocks_class_name": "SequentialPipelineBlocks"},  # -> class default
    "unknown_blocks_omni": lambda i: {**i, "_blocks_class_name": "NoSuchBlocks",
                                      "_class_name": "Cosmos3OmniModularPipeline"},
    "omni_blocks": lambda i: {**i, "_blocks_class_name": "Cosmos3OmniBlocks"},
    "no_modular_index": lambda i: None,
    "other_sigmas": lambda i: {**i, "distilled_sigmas": [1.0, 0.75, 0.5]},
}


@pytest.mark.parametrize("case", sorted(RECOGNITION))
def test_recognised_exactly_as_diffusers_does(checkpoint, tmp_path, case):
    """``read_distilled`` says distilled iff diffusers builds the distilled blocks, with the same sigmas."""
    path = _variant(checkpoint, tmp_path, RECOGNITION[case])
    blocks, ref_sigmas = _reference_blocks(path)
    ours = read_distilled(path)
    assert (ours is not None) == (blocks == "Cosmos3DistilledBlocks"), (case, blocks)
    if ours is not None:
        assert list(ours.sigmas) == [float(s) for s in ref_sigmas]
        assert ours.steps == len(ref_sigmas)
    assert (case in ("as_shipped", "omni_class", "unknown_blocks", "other_sigmas")) == (ours is not None)


@pytest.mark.parametrize("key", ["distilled_sigmas", "_blocks_class_name"])
def test_distilled_index_without_key_is_a_clear_error(checkpoint, tmp_path, key):
    """diffusers fails on these files too (no schedule / no blocks); ours says which key is missing."""
    path = _variant(checkpoint, tmp_path, lambda i: {k: v for k, v in i.items() if k != key})
    with pytest.raises(CheckpointError, match=f"no {key}"):
        read_distilled(path)


def test_schedule_is_the_checkpoints(checkpoint):
    schedule = read_distilled(checkpoint)
    assert list(schedule.sigmas) == DISTILLED_SIGMAS and schedule.steps == 4
    scheduler = schedule.make_scheduler()
    assert scheduler.config.stochastic_sampling
    assert torch.equal(scheduler.sigmas, torch.tensor(DISTILLED_SIGMAS + [0.0]))


# ---------------------------------------------------------------------------------------------- generation parity
@pytest.fixture(scope="module")
def ours(checkpoint):
    from cosmos3_core.pipeline import Cosmos3Pipeline

    pipe = Cosmos3Pipeline.load(checkpoint, dtype=torch.float32, device="cpu")
    cfg = pipe.config
    assert cfg.q_width != cfg.hidden_size and cfg.num_attention_heads // cfg.num_key_value_heads == 8  # Super's shape
    return pipe


@pytest.fixture(scope="module")
def reference(checkpoint):
    pipe = ModularPipeline.from_pretrained(str(checkpoint))
    assert type(pipe).__name__ == "Cosmos3DistilledModularPipeline"
    pipe.load_components(torch_dtype=torch.float32)
    pipe.disable_safety_checker()
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _image() -> Image.Image:
    return Image.fromarray(np.random.default_rng(1).integers(0, 256, (80, 100, 3), dtype=np.uint8))


@pytest.mark.parametrize("mode, frames, with_image", [("t2i", 1, False), ("t2v", 9, False), ("i2v", 9, True)])
def test_latents_match_distilled_reference(ours, reference, mode, frames, with_image):
    """Steps and guidance unset on both sides: each takes them from the checkpoint (4 steps, one branch)."""
    from cosmos3_core.api import generate
    from cosmos3_core.request import Request

    image = _image() if with_image else None
    ref = reference(prompt=PROMPT, num_frames=frames, height=H, width=W, image=image,
                    generator=torch.Generator("cpu").manual_seed(SEED), output_type="latent").get("videos")
    seen = []
    out = generate(ours, Request(prompt=PROMPT, num_frames=frames, height=H, width=W, seed=SEED, image=image),
                        callback=lambda step, total, _: seen.append((step, total)), decode=False)
    assert seen == [(i, 4) for i in range(1, 5)]
    assert out.latents.shape == ref.shape
    assert rel(out.latents, ref) <= 1e-4
    if with_image:  # the conditioned frame is re-anchored after every stochastic step: it stays the clean latent
        x0, _ = ours.encode_condition(ours.encode_text(PROMPT, num_frames=frames, height=H, width=W, fps=24.0),
                                      image=image)
        assert torch.equal(out.latents[:, :, 0], x0[:, :, 0].float())


def test_seed_changes_the_stochastic_steps(ours):
    """The SDE steps draw from the seeded generator: the same seed repeats exactly, another seed differs."""
    from cosmos3_core.api import generate
    from cosmos3_core.request import Request

    def run(seed):
        return generate(ours, Request(prompt=PROMPT, num_frames=1, height=H, width=W, seed=seed),
                             decode=False).latents

    a, b, c = run(3), run(3), run(4)
    assert torch.equal(a, b) and rel(a, c) > 0.1


def test_batch_items_equal_their_single_runs(ours):
    """A batch steps each item with its own scheduler and generator (seed + k): item k is the single run of seed + k
    (up to fp32 GEMM rounding of the batched forward), not one generator shared across items."""
    text = ours.encode_text(PROMPT, num_frames=9, height=H, width=W, fps=24.0)
    both = ours.run(api.plan(ours, text, seed=11, batch_size=2))
    assert both.latents.shape == (2, 48, 3, 4, 6)
    for k in range(2):
        assert rel(both.latents[k], ours.run(api.plan(ours, text, seed=11 + k)).latents[0]) <= 1e-5


def test_only_the_conditional_prompt_is_prefilled(ours):
    before = ours.prefill_count
    text = ours.encode_text(PROMPT, num_frames=1, height=H, width=W, fps=24.0)
    assert ours.prefill_count == before + 1 and text.uncond is None


@pytest.mark.parametrize("change, needles", [
    (dict(steps=8), ["steps=8", "fixed 4-step schedule", "set steps to 4"]),
    (dict(guidance=6.0), ["guidance (cfg)=6", "baked into", "set cfg to 1"]),
    (dict(shift=5.0), ["shift=5", "fixed schedule", "set shift to 0"]),
    (dict(schedule="karras"), ["schedule=karras", "fixed schedule", "set schedule to flow_shift"]),
    (dict(negative_prompt="blurry"), ["negative_prompt is set", "no negative branch", "clear negative_prompt"]),
    (dict(sound=True), ["sound=True", "vision only", "set sound to false"]),
])
def test_library_refuses_what_a_distilled_checkpoint_fixes(ours, change, needles):
    from cosmos3_core.api import generate
    from cosmos3_core.request import Request

    request = Request(prompt=PROMPT, num_frames=1, height=H, width=W, **change)
    before = ours.prefill_count
    with pytest.raises(ValueError) as e:
        generate(ours, request, decode=False)
    assert repr(ours.distilled.name) in str(e.value)
    for needle in needles:
        assert needle in str(e.value)
    assert ours.prefill_count == before  # refused before any model work
    text = ours.encode_text(PROMPT, num_frames=1, height=H, width=W, fps=24.0)
    with pytest.raises(ValueError, match="set steps to 4"):  # the plan's resolver checks too (the nodes' path)
        api.plan(ours, text, steps=8)
    assert api.plan(ours, text).steps == 4


# ---------------------------------------------------------------------------------------------- CLI
def _cli(*args: str):
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    return subprocess.run([sys.executable, "-m", "cosmos3_core.generate", *args], capture_output=True, text=True,
                          env=env, timeout=300)


CLI_BASE = ["--prompt", "a red car on a street", "--height", "64", "--width", "96", "--device", "cpu", "--dtype", "fp32"]


def test_cli_runs_a_distilled_checkpoint_with_its_schedule(checkpoint, tmp_path):
    png = tmp_path / "t2i.png"
    r = _cli("--checkpoint", str(checkpoint), *CLI_BASE, "--num-frames", "1", "--out", str(png))
    assert r.returncode == 0, r.stderr
    assert "step 4/4" in r.stderr  # the checkpoint's 4-step schedule, with no --steps given
    assert Image.open(png).size == (96, 64)


@pytest.mark.parametrize("extra, needles", [
    (["--steps", "8"], ["steps=8", "fixed 4-step schedule", "distilled_sigmas", "--steps 4"]),
    (["--guidance", "6"], ["guidance (cfg)=6", "baked into", "--guidance 1"]),
    (["--negative-prompt", "blurry"], ["negative_prompt", "no negative branch", "drop --negative-prompt"]),
])
def test_cli_refuses_what_a_distilled_checkpoint_fixes(checkpoint, tmp_path, extra, needles):
    r = _cli("--checkpoint", str(checkpoint), *CLI_BASE, "--num-frames", "9", "--out", str(tmp_path / "o.mp4"), *extra)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and r.stderr.count("error:") == 1, r.stderr
    for needle in needles:
        assert needle in r.stderr, (needle, r.stderr)


# ---------------------------------------------------------------------------------------------- nodes (real host)
# (the two distilled workflows themselves run in test_nodes.py / test_server.py, as every shipped workflow;
# ``host`` is the shared fixture of tests/support/fixtures.py)
def _distilled_graph(mode: str, **kw) -> dict:
    from test_workflows import TINY_DISTILLED, load_api, shrink_api, tiny_checkpoint_for

    api = load_api(mode)
    assert tiny_checkpoint_for(api) == TINY_DISTILLED
    return shrink_api(api, prefix=f"cosmos3_tests/{mode}", **kw)


def _run(host, graph):
    from support import comfy_host

    success, outputs, messages = host.run(graph, extra_data={"client_id": "cosmos3-tests"})
    return success, outputs, messages, comfy_host


SAMPLER = "Cosmos3KSamplerUniPCDualTower"


@pytest.mark.comfy
@pytest.mark.parametrize("node, name, value, needles", [
    (SAMPLER, "steps", 35, ["steps=35", "fixed 4-step schedule", "set steps to 4"]),
    (SAMPLER, "cfg", 6.0, ["guidance (cfg)=6", "baked into", "set cfg to 1"]),
    (SAMPLER, "shift", 5.0, ["shift=5", "fixed schedule", "set shift to 0"]),
    (SAMPLER, "schedule", "karras", ["schedule=karras", "fixed schedule", "set schedule to flow_shift"]),
    (SAMPLER, "sound", True, ["sound=True", "vision only", "set sound to false"]),
    ("Cosmos3TextEncode", "negative_prompt", "blurry", ["negative_prompt", "no negative branch",
                                                        "clear negative_prompt"]),
])
def test_node_refuses_what_a_distilled_checkpoint_fixes(host, node, name, value, needles):
    from test_workflows import TINY_DISTILLED, check_outputs

    graph = _distilled_graph("distilled_t2i")
    (nid,) = [n for n, v in graph.items() if v["class_type"] == node]
    graph[nid]["inputs"][name] = value
    success, _, messages, _ = _run(host, graph)
    assert not success
    (err,) = [d for e, d in messages if e == "execution_error"]
    msg = err["exception_message"]
    assert err["node_type"] == node and msg.startswith(node), err
    assert TINY_DISTILLED in msg, msg
    for needle in needles:
        assert needle in msg, (needle, msg)
    ok_graph = _distilled_graph("distilled_t2i", seed=9)  # the next run works
    success, outputs, messages, comfy_host = _run(host, ok_graph)
    assert success, comfy_host._execution_error_text(messages)
    check_outputs(host.base_dir, "t2i", ok_graph, outputs)

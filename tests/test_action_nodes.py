"""The action-mode nodes in the real in-process ComfyUI 0.3.75 host: the three shipped action workflows run shrunk and
write their files; the policy workflow's saved actions equal diffusers 0.42.1's modular pipeline on the same tiny
checkpoint, image and seed; bad inputs name the node and the fix, and the next run still works.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image
from test_nodes import assert_next_run_succeeds, error_of, run

from support import comfy_host
from support.compare import rel
from test_workflows import ACTION_WORKFLOWS, TEST_IMAGE, TINY_NANO, check_mp4, load_api, nodes_of, shrink_api

pytestmark = pytest.mark.comfy  # ``host``: the shared fixture (tests/support/fixtures.py)


def saved_files(host, outputs: dict, node_id: str, key: str):
    items = outputs[node_id][key]
    return [host.base_dir / "output" / i["subfolder"] / i["filename"] for i in items]


def test_action_nodes_registered(host):
    for node_id in ("Cosmos3ActionCondition", "Cosmos3SaveActions", "Cosmos3LoadActions"):
        assert node_id in host.node_class_mappings
    sampler = host.node_class_mappings["Cosmos3KSamplerUniPCDualTower"].GET_NODE_INFO_V1()
    optional = sampler["input_order"]["optional"]
    # appended after the inputs that existed before it: old graphs keep their slots
    assert optional[: optional.index("action") + 1] == ["condition", "compile", "batch_size", "action"], optional
    assert sampler["output"] == ["LATENT", "COSMOS3_SOUND", "COSMOS3_ACTIONS"]


@pytest.mark.parametrize("mode", ACTION_WORKFLOWS)
def test_action_workflow_runs_and_writes_files(host, mode):
    graph = shrink_api(load_api(mode), prefix=f"cosmos3_tests/{mode}")
    success, outputs, messages, _ = run(host, graph)
    assert success, comfy_host._execution_error_text(messages)
    for sid in nodes_of(graph, "SaveVideo"):  # 120x80 test image → 112x80 (floored to 16), fits the 256 canvas
        (video,) = saved_files(host, outputs, sid, "images")
        check_mp4(video, 112, 80, 5, 5.0, audio=False)
    saves = nodes_of(graph, "Cosmos3SaveActions")
    assert len(saves) == (0 if mode == "action_forward_dynamics" else 1)
    for sid in saves:
        (path,) = saved_files(host, outputs, sid, "actions")
        saved = json.loads(path.read_text())
        chunk = graph[nodes_of(graph, "Cosmos3ActionCondition")[0]]["inputs"]["chunk_size"]
        assert saved["mode"] == mode.removeprefix("action_") and saved["domain_name"] == "bridge_orig_lerobot"
        assert np.asarray(saved["actions"]).shape == (chunk, 10) and np.isfinite(saved["actions"]).all()


def test_policy_node_actions_match_reference(host):
    """Node path == Cosmos3OmniModularPipeline(action=CosmosActionCondition(mode="policy", ...)), fp32, same seed."""
    from diffusers import UniPCMultistepScheduler
    from diffusers.modular_pipelines.cosmos.modular_blocks_cosmos3 import Cosmos3OmniBlocks
    from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import CosmosActionCondition

    graph = shrink_api(load_api("action_policy"), prefix="cosmos3_tests/policy_parity", seed=123, steps=2)
    (ac,) = nodes_of(graph, "Cosmos3ActionCondition")
    a = graph[ac]["inputs"]
    success, outputs, messages, _ = run(host, graph)
    assert success, comfy_host._execution_error_text(messages)
    (path,) = saved_files(host, outputs, nodes_of(graph, "Cosmos3SaveActions")[0], "actions")
    ours = torch.tensor(json.loads(path.read_text())["actions"])

    ref = Cosmos3OmniBlocks().init_pipeline(str(host.base_dir / "models" / "diffusers" / TINY_NANO))
    ref.load_components(torch_dtype=torch.float32)
    ref.disable_safety_checker()
    ref.scheduler = UniPCMultistepScheduler.from_config(ref.scheduler.config, flow_shift=10.0, use_karras_sigmas=False)
    image = np.asarray(Image.open(host.base_dir / "input" / TEST_IMAGE).convert("RGB"), dtype=np.float32) / 255.0
    out = ref(prompt=a["prompt"], negative_prompt=a["negative_prompt"], fps=a["fps"], num_inference_steps=2,
              guidance_scale=1.0, use_system_prompt=False, generator=torch.Generator("cpu").manual_seed(123),
              output_type="latent", action=CosmosActionCondition(
                  mode="policy", chunk_size=a["chunk_size"], domain_name=a["domain_name"],
                  resolution_tier=int(a["resolution_tier"]), image=image, view_point=a["view_point"]))
    (ref_actions,) = out.values["action"]
    assert ours.shape == ref_actions.shape
    assert rel(ours, ref_actions) <= 1e-4


def _expect(host, graph, node_type, *needles):
    success, _, messages, _ = run(host, graph)
    assert not success, f"expected {node_type} to fail"
    err = error_of(messages)
    msg = err["exception_message"]
    assert err["node_type"] == node_type and msg.startswith(node_type), err
    for needle in needles:
        assert needle in msg, f"{needle!r} not in {msg!r}"
    return msg


def test_bad_action_inputs_through_nodes(host):
    ident = shrink_api(load_api("action_inverse_dynamics"))
    (ac,) = nodes_of(ident, "Cosmos3ActionCondition")
    ident[ac]["inputs"]["chunk_size"] = 8
    _expect(host, ident, "Cosmos3ActionCondition", "video has 13", "chunk_size=12")

    fwd = shrink_api(load_api("action_forward_dynamics"))
    (ac,) = nodes_of(fwd, "Cosmos3ActionCondition")
    del fwd[ac]["inputs"]["actions"]
    _expect(host, fwd, "Cosmos3ActionCondition", "forward_dynamics", "needs actions")

    fwd = shrink_api(load_api("action_forward_dynamics"))
    fwd[ac]["inputs"]["domain_name"] = "droid_lerobot"  # the test actions say bridge_orig_lerobot
    _expect(host, fwd, "Cosmos3ActionCondition", "bridge_orig_lerobot", "droid_lerobot")

    # forward dynamics predicts no actions: a Save Actions wired to its sampler says so
    fwd = shrink_api(load_api("action_forward_dynamics"))
    (ks,) = nodes_of(fwd, "Cosmos3KSamplerUniPCDualTower")
    fwd["90"] = {"class_type": "Cosmos3SaveActions",
                 "inputs": {"actions": [ks, 2], "filename_prefix": "cosmos3_tests/none", "format": "json"}}
    _expect(host, fwd, "Cosmos3SaveActions", "predicted no actions")

    # a plain Cosmos3 Text Encode into an action run
    pol = shrink_api(load_api("action_policy"))
    (ks,) = nodes_of(pol, "Cosmos3KSamplerUniPCDualTower")
    pol["91"] = {"class_type": "Cosmos3TextEncode", "inputs": {
        "model": ["1", 0], "prompt": "a robot", "negative_prompt": "", "width": 112, "height": 80, "num_frames": 5,
        "fps": 5.0}}
    pol[ks]["inputs"]["text"] = ["91", 0]
    _expect(host, pol, "Cosmos3KSamplerUniPCDualTower", "not encoded for this action condition")
    assert_next_run_succeeds(host)


def test_load_actions_bad_file(host, tmp_path):
    bad = host.base_dir / "input" / "cosmos3_bad_actions.json"
    bad.write_text('{"actions": [[1, 2], [3]]}')
    try:
        fwd = shrink_api(load_api("action_forward_dynamics"))
        (la,) = nodes_of(fwd, "Cosmos3LoadActions")
        fwd[la]["inputs"]["file"] = bad.name
        _expect(host, fwd, "Cosmos3LoadActions", "cosmos3_bad_actions.json", "row 2 has 1 values but row 1 has 2")
    finally:
        bad.unlink()
    assert_next_run_succeeds(host)

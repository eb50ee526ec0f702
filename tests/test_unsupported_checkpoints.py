"""The Cosmos3 checkpoints diffusers 0.42.1 cannot run are refused by name, before anything loads.

Cosmos3-Nano-Sim-Transfer, -Sim-Bimanual, -Sim-Auto and -Transfer-Auto keep the Cosmos3 tensor names, so without a
check the pack would load them and sample them as the bidirectional models they are not. Their export contracts
mark them in ``transformer/config.json`` (the keys vLLM-Omni's and SGLang's loaders for them read): the causal Sim
envelope ``cosmos3_nano_sim_bimanual`` (formerly ``cosmos_dreams``) whose ``conditioning.mode`` tells Sim-Transfer
(``control_video``) from Sim-Bimanual, ``cosmos3_nano_sim_auto``, and Transfer-Auto's ``backbone_type:
cosmos3_multiview`` with its ``multiview`` block. Each tiny checkpoint below is the tiny Nano with that block added,
in the shape those contracts give it; the library, the CLI and the ComfyUI loader each answer with one message
naming the model.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_nodes import _expect_error, host, t2i_graph  # noqa: F401  (host: the in-process ComfyUI of the node tests)

from cosmos3_core.config import CheckpointError, Cosmos3Config
from cosmos3_core.request import CheckpointInfo, Request
from cosmos3_core.resolve import resolve

ROOT = Path(__file__).resolve().parents[1]

_SIM = {"schema_version": 1, "attention_mode": "three_way", "chunk_size": 4, "base_fps": 24.0,
        "video_temporal_causal": True, "window_frames": 96, "sink_frames": 0,
        "fixed_step_sampler_config": {"num_train_timesteps": 1000, "sample_type": "sde",
                                      "t_list": [1.0, 0.9375, 0.8333333333333334, 0.625]}}
_CAMERAS = ["camera_front_wide_120fov", "camera_cross_right_120fov", "camera_rear_right_70fov"]
LAYOUTS = {
    "Cosmos3-Nano-Sim-Transfer": {"cosmos3_nano_sim_bimanual": _SIM | {"conditioning": {
        "mode": "control_video", "hints": ["edge", "blur", "depth", "seg"], "no_eviction": True,
        "transfer_control_attention_mode": "causal_control_with_rgb_history"}}},
    "Cosmos3-Nano-Sim-Transfer (legacy export)": {"cosmos_dreams": _SIM | {"conditioning": {"mode": "control_video"}}},
    "Cosmos3-Nano-Sim-Bimanual": {"cosmos3_nano_sim_bimanual": _SIM | {"conditioning": {"mode": "action"}}},
    "Cosmos3-Nano-Sim-Auto": {"cosmos3_nano_sim_auto": {"schema_version": 1, "cameras": _CAMERAS}},
    "Cosmos3-Nano-Transfer-Auto": {"backbone_type": "cosmos3_multiview", "multiview": {
        "cameras": _CAMERAS, "cross_view_past_window_seconds": 0.4,
        "rig_view_embedding": {"num_embeddings": 4, "camera_ids": {c: i for i, c in enumerate(_CAMERAS)},
                               "lidar_id": 3},
        "inference_defaults": {"resolution": "480", "fps": 30.0, "num_steps": 35, "guidance": 6.0, "shift": 10.0}}},
}


def _mark(checkpoint: Path, block: dict) -> Path:
    config = checkpoint / "transformer" / "config.json"
    config.write_text(json.dumps(json.loads(config.read_text()) | block, indent=2))
    return checkpoint


@pytest.fixture(scope="module")
def marked(tiny_checkpoint, tmp_path_factory):
    """{model: a copy of the tiny Nano carrying that model's export block}."""
    source = tiny_checkpoint("nano", sound=True, seed=0)
    out = {}
    for i, (model, block) in enumerate(LAYOUTS.items()):
        folder = tmp_path_factory.mktemp(f"unsupported{i}") / "checkpoint"
        shutil.copytree(source, folder)
        out[model] = _mark(folder, block)
    return out


@pytest.mark.parametrize("model", list(LAYOUTS))
def test_the_library_refuses_it_by_name(marked, model, tiny_checkpoint):
    name = model.split(" (")[0]
    for read in (Cosmos3Config.from_checkpoint, CheckpointInfo.read,
                 lambda c: resolve(Request(prompt="a car", num_frames=1), c)):
        with pytest.raises(CheckpointError, match=f"^{marked[model]}: this is {name}, .*diffusers 0.42.1 has no "
                                                  "pipeline for it.*cosmos-framework or vLLM-Omni"):
            read(marked[model])
    assert Cosmos3Config.from_checkpoint(tiny_checkpoint("nano", sound=True, seed=0)).hidden_size == 256


def test_sim_transfer_and_bimanual_are_told_apart(marked):
    messages = {}
    for model in ("Cosmos3-Nano-Sim-Transfer", "Cosmos3-Nano-Sim-Bimanual"):
        with pytest.raises(CheckpointError) as err:
            Cosmos3Config.from_checkpoint(marked[model])
        messages[model] = str(err.value)
    assert "one control video" in messages["Cosmos3-Nano-Sim-Transfer"]
    assert "robot actions" in messages["Cosmos3-Nano-Sim-Bimanual"]
    assert all("chunk by chunk" in m and "4-step" in m for m in messages.values())


def test_the_cli_answers_with_one_line(marked, tmp_path):
    ckpt = marked["Cosmos3-Nano-Sim-Transfer"]
    r = subprocess.run([sys.executable, "-m", "cosmos3_core.generate", "--checkpoint", str(ckpt), "--prompt", "a car",
                        "--device", "cpu", "--out", str(tmp_path / "o.mp4")], capture_output=True, text=True,
                       timeout=300, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 2, r.stderr[-2000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {ckpt}: this is Cosmos3-Nano-Sim-Transfer, "), r.stderr
    assert not (tmp_path / "o.mp4").exists()


@pytest.mark.comfy
def test_loader_node_names_the_model(host, marked):
    folder = host.base_dir / "models" / "diffusers" / "cosmos3-transfer-auto"
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(marked["Cosmos3-Nano-Transfer-Auto"], folder)
    try:
        _expect_error(host, t2i_graph(checkpoint=folder.name), "Cosmos3Loader", "'cosmos3-transfer-auto'",
                      "this is Cosmos3-Nano-Transfer-Auto, a multi-camera driving model", "vLLM-Omni")
    finally:
        shutil.rmtree(folder, ignore_errors=True)

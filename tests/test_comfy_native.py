"""ComfyUI-native behaviour of the pack in the real in-process ComfyUI 0.3.75 host (no mocks).

* every input and every output of every pack node has a tooltip (what /object_info serves to the frontend);
* ComfyUI's log and memory manager name each loaded part ("Requested to load Cosmos3GenerationTower", not "Module");
* the loader's ``weight_dtype`` (fp8 storage, bf16/fp32 compute through comfy.ops) runs a workflow end to end, old
  saved loader values keep working, and bad values are refused with one clear message;
* ``Cosmos3 LoRA Loader`` patches the generation tower through ComfyUI's ModelPatcher: strength 0 equals no LoRA,
  changing the strength does not reload the checkpoint, two LoRAs stack, bad files are refused clearly.
"""
from __future__ import annotations

import logging

import pytest

import comfy_host
from test_workflows import ensure_tiny_checkpoints, load_api, node_info, shrink_api, write_test_inputs

pytestmark = pytest.mark.comfy


@pytest.fixture(scope="module")
def host():
    h = comfy_host.get_executor()
    h.assert_pack_loaded()
    ensure_tiny_checkpoints(h.base_dir / "models" / "diffusers")
    write_test_inputs(h.base_dir / "input")
    return h


def test_every_input_and_output_has_a_tooltip(host):
    missing = []
    ids = host.pack_node_ids()
    assert "Cosmos3Loader" in ids, ids
    for node_id in ids:
        info = node_info(host, node_id)
        for group in ("required", "optional"):
            for name, spec in info["input"].get(group, {}).items():
                opts = spec[1] if len(spec) > 1 else {}
                if not (opts or {}).get("tooltip"):
                    missing.append(f"{node_id}.{name}")
        tips = info.get("output_tooltips") or [None] * len(info["output"])
        for name, tip in zip(info["output_name"], tips):
            if not tip:
                missing.append(f"{node_id} -> {name}")
    assert not missing, f"inputs/outputs without a tooltip: {missing}"


def test_comfyui_names_each_loaded_part(host, caplog):
    graph = shrink_api(load_api("t2av"), prefix="cosmos3_native/names", prompt_suffix=" (names)")
    with caplog.at_level(logging.INFO):
        outputs = host.run_ok(graph, fresh=True)
    assert outputs
    loaded = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Requested to load")]
    for part in ("Cosmos3TextTower", "Cosmos3GenerationTower", "Cosmos3WanVAE", "Cosmos3SoundDecoder"):
        assert f"Requested to load {part}" in loaded, loaded
    assert "Requested to load Module" not in loaded, loaded

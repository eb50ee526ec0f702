"""ComfyUI-native behaviour of the pack in the real in-process ComfyUI 0.3.75 host (no mocks).

* every input and every output of every pack node has a tooltip (what /object_info serves to the frontend);
* ComfyUI's log and memory manager name each loaded part ("Requested to load Cosmos3GenerationTower", not "Module");
* the loader's ``weight_dtype`` (fp8 storage, bf16/fp32 compute through comfy.ops) runs a workflow end to end, old
  saved loader values keep working, and bad values are refused with one clear message;
* ``Cosmos3 LoRA Loader`` patches the generation tower through ComfyUI's ModelPatcher: strength 0 equals no LoRA,
  changing the strength does not reload the checkpoint, two LoRAs stack, bad files are refused clearly;
* the Templates thumbnails follow the contract of the bundled frontend (1.32.9): a custom pack's card is built from
  the file name alone with ``mediaSubtype: "jpg"`` and its picture URL is ``/api/workflow_templates/<pack>/<name>.jpg``
  (no ``-1`` suffix, no index.json), so each UI workflow has a JPEG of the same name beside it.
"""
from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

from test_workflows import ALL_WORKFLOWS, load_api, node_info, shrink_api, thumbnail_path

pytestmark = pytest.mark.comfy  # ``host``: the shared fixture (tests/support/fixtures.py)


def test_every_input_and_output_has_a_tooltip(host):
    missing = []
    ids = host.pack_node_ids()
    assert "Cosmos3Loader" in ids and "Cosmos3LoraLoader" in ids, ids
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


def test_each_template_has_the_thumbnail_the_frontend_asks_for():
    import comfyui_frontend_package as frontend  # ComfyUI 0.3.75 requirements: the frontend it serves (1.32.9)
    bundle = "".join(p.read_text(errors="replace") for p in (Path(frontend.__file__).parent / "static").rglob("*.js")
                     if "getTemplateThumbnailUrl" in p.read_text(errors="replace"))
    # how the frontend lists a pack's templates: from the names in /api/workflow_templates, always as a jpg image
    assert re.search(r'\{name:\w+,mediaType:"image",mediaSubtype:"jpg",description:\w+,sourceModule:\w+\}', bundle)
    # where it fetches the picture: apiURL(`/workflow_templates/${module}/${name}`) + (suffix only for "default") + .ext
    assert re.search(r'apiURL\(`/workflow_templates/\$\{\w+\}/\$\{\w+\.name\}`\),'
                     r'\w+=\w+==="default"&&\w+\?`-\$\{\w+\}`:""'
                     r';return`\$\{\w+\}\$\{\w+\}\.\$\{\w+\.mediaSubtype\}`', bundle)
    for mode in ALL_WORKFLOWS:
        jpg = thumbnail_path(mode)
        assert jpg.is_file() and jpg.read_bytes()[:3] == b"\xff\xd8\xff", f"{jpg}: missing or not a JPEG"


# -------------------------------------------------------------------------------------------- weight dtype

def _loader_graph(**loader_inputs) -> dict:
    g = shrink_api(load_api("t2i"), prefix="cosmos3_native/weights", prompt_suffix=" (weights)")
    (loader,) = [k for k, v in g.items() if v["class_type"] == "Cosmos3Loader"]
    g[loader]["inputs"].update(loader_inputs)
    return g


def _error(messages) -> str:
    errs = [d for e, d in messages if e == "execution_error"]
    assert errs, messages
    assert errs[0]["node_type"] == "Cosmos3Loader", errs[0]
    return errs[0]["exception_message"]


def test_fp8_weight_dtype_runs_a_workflow_with_half_the_memory(host):
    import torch

    from cosmos3_core.model.weights import FP8_DTYPES

    cls = host.node_class_mappings["Cosmos3Loader"]
    bf16 = cls.execute(checkpoint="cosmos3-tiny-nano", dtype="fp32", device="cpu", weight_dtype="bf16").result[0]
    fp8 = cls.execute(checkpoint="cosmos3-tiny-nano", dtype="fp32", device="cpu", weight_dtype="fp8_e4m3fn").result[0]
    tower = fp8.generation_patcher.model
    linears = [m for m in tower.modules() if isinstance(m, torch.nn.Linear) and m.weight.dtype in FP8_DTYPES]
    assert linears and all(getattr(m, "comfy_cast_weights", False) for m in linears)  # ComfyUI's cast path
    def linear_bytes(handle):
        return sum(m.weight.numel() * m.weight.element_size() for m in handle.generation_patcher.model.modules()
                   if isinstance(m, torch.nn.Linear) and m.weight.dtype != torch.float32)  # fp32: time embedder

    assert linear_bytes(fp8) * 2 == linear_bytes(bf16)
    # what ComfyUI's memory manager counts (the tiny model's fp32 norms/embeddings dilute the linear halving)
    assert fp8.generation_patcher.model_size() < bf16.generation_patcher.model_size()
    outputs = host.run_ok(_loader_graph(weight_dtype="fp8_e4m3fn"), fresh=True)
    assert outputs


def test_old_saved_loader_values_still_work(host):
    """A workflow saved before weight_dtype existed (three loader values) validates and runs."""
    g = _loader_graph()
    (loader,) = [k for k, v in g.items() if v["class_type"] == "Cosmos3Loader"]
    assert "weight_dtype" not in g[loader]["inputs"]
    assert host.run_ok(g, fresh=True)


def test_nvidia_fp8_checkpoint_through_the_loader(host, tmp_path):
    from test_weights import read_state, write_modelopt

    root = host.base_dir / "models" / "diffusers"
    write_modelopt(root / "cosmos3-tiny-nano", root / "cosmos3-tiny-nano-fp8", full=True)
    try:
        h = host.node_class_mappings["Cosmos3Loader"].execute(checkpoint="cosmos3-tiny-nano-fp8", dtype="fp32",
                                                              device="cpu").result[0]
        scaled = [m for m in h.generation_patcher.model.modules() if hasattr(m, "scale_weight")
                  and getattr(m, "weight", None) is not None and m.weight.dtype == torch_fp8()]
        assert scaled and all(float(m.scale_weight) != 1.0 for m in scaled)
        assert host.run_ok(_loader_graph(checkpoint="cosmos3-tiny-nano-fp8"), fresh=True)
        # bad input: an FP8 weight whose scale is missing
        state = read_state(root / "cosmos3-tiny-nano-fp8")
        victim = next(k for k in state if k.endswith("layers.0.self_attn.add_k_proj.weight_quantizer._scale"))
        del state[victim]
        from test_weights import write_state

        write_state(root / "cosmos3-tiny-nano-fp8", state)
        ok, _, messages = host.run(_loader_graph(checkpoint="cosmos3-tiny-nano-fp8"), fresh=True)
        assert not ok
        msg = _error(messages)
        assert msg.startswith("Cosmos3Loader:") and "add_k_proj.weight" in msg and "download" in msg, msg
    finally:
        import shutil

        shutil.rmtree(root / "cosmos3-tiny-nano-fp8", ignore_errors=True)


def torch_fp8():
    import torch

    return torch.float8_e4m3fn


def test_fp8_on_a_device_without_fp8_support_is_refused(host, monkeypatch):
    import comfy.model_management as mm

    # ComfyUI's own answer for Apple MPS / DirectML, where FP8 tensors cannot be cast; this CPU machine has none
    monkeypatch.setattr(mm, "supports_cast", lambda device, dtype: dtype not in (mm.torch.float8_e4m3fn,
                                                                                   mm.torch.float8_e5m2))
    ok, _, messages = host.run(_loader_graph(weight_dtype="fp8_e5m2"), fresh=True)
    assert not ok
    msg = _error(messages)
    assert "weight_dtype 'fp8_e5m2' is not supported" in msg and "bf16 or fp16" in msg, msg
    monkeypatch.undo()
    assert host.run_ok(_loader_graph(weight_dtype="fp8_e5m2"), fresh=True)  # the next run works

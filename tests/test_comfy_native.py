"""ComfyUI-native behaviour of the pack in the real in-process ComfyUI 0.3.75 host (no mocks).

* every input and every output of every pack node has a tooltip (what /object_info serves to the frontend);
* ComfyUI's log and memory manager name each loaded part ("Requested to load Cosmos3GenerationTower", not "Module");
* the loader's ``weight_dtype`` (fp8 storage, bf16/fp32 compute through comfy.ops) runs a workflow end to end, old
  saved loader values keep working, and bad values are refused with one clear message;
* ``Cosmos3 LoRA Loader`` patches the generation tower through ComfyUI's ModelPatcher: strength 0 equals no LoRA,
  changing the strength does not reload the checkpoint, two LoRAs stack, bad files are refused clearly;
* every INT input the frontend steps (``step`` > 1) offers exactly its valid values on the canvas: the frontend
  snaps a typed number to ``min + k·step`` inside ``[min, max]``, and that grid is the set of values the core accepts
  (tests/test_canvas.py types them through both frontends);
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


# -------------------------------------------------------------------------------------------- stepped INT widgets

def _valid_values(host):
    """(node, input) -> whether the core accepts a value there: its own checks decide (the frontend's grid must
    match them, not the other way round)."""
    import numpy as np

    from cosmos3_core.checks import check_action_request, check_clip
    from cosmos3_core.request import ActionRequest, CheckpointInfo, Request
    from cosmos3_core.resolve import resolve
    from cosmos3_core.sampling.conditioning import keyframe_indexes

    info = CheckpointInfo.read(host.base_dir / "models" / "diffusers" / "cosmos3-tiny-nano")

    def accepts(check):
        def ok(v):
            try:
                check(v)
            except ValueError:
                return False
            return True
        return ok

    def windows(**kw):
        return lambda v: resolve(Request(prompt="a fox", height=64, width=96, **{k: (v if a is None else a)
                                                                                 for k, a in kw.items()}), info)

    size = {"width": accepts(lambda v: check_clip(1, 64, v, 24.0)),
            "height": accepts(lambda v: check_clip(1, v, 96, 24.0))}
    return {
        **{(node, name): rule for node in ("Cosmos3TextEncode", "Cosmos3VAEEncodeCond", "Cosmos3FirstLastFrame",
                                           "Cosmos3LongVideo") for name, rule in size.items()},
        ("Cosmos3TextEncode", "num_frames"): accepts(lambda v: check_clip(v, 64, 96, 24.0)),
        ("Cosmos3FirstLastFrame", "num_frames"): accepts(lambda v: keyframe_indexes(1, v)),
        ("Cosmos3LongVideo", "num_frames"): accepts(windows(num_frames=None, frames_per_chunk=9)),
        ("Cosmos3LongVideo", "frames_per_chunk"): accepts(windows(frames_per_chunk=None)),
        ("Cosmos3ActionCondition", "chunk_size"): accepts(lambda v: check_action_request(ActionRequest(
            mode="policy", chunk_size=v, domain_name="bridge_orig_lerobot", image=np.zeros((64, 96, 3), np.float32)))),
    }


def test_stepped_int_widgets_offer_exactly_the_valid_values(host):
    """The frontend's INT widget (1.32.9 and 1.58.1: ``useIntWidget``'s ``onValueChange``) turns a typed ``v`` into
    ``round((v − o) / step)·step + o`` with ``o = min % step``, clamped to ``[min, max]``; so the values a user can
    put on the canvas are the grid ``min, min + step, …``. For every stepped INT input of every pack node that grid
    must be the values the core accepts: near ``min`` and near ``max``, on and off the grid."""
    rules = _valid_values(host)
    seen = set()
    for node_id in host.pack_node_ids():
        for group in ("required", "optional"):
            for name, spec in node_info(host, node_id)["input"].get(group, {}).items():
                opts = spec[1] if len(spec) > 1 else {}
                if spec[0] != "INT" or (opts.get("step") or 1) == 1:
                    continue
                lo, hi, step = opts["min"], opts["max"], opts["step"]
                assert (node_id, name) in rules, f"{node_id}.{name} (step {step}): add its valid values to this test"
                seen.add((node_id, name))
                assert (hi - lo) % step == 0, f"{node_id}.{name}: max {hi} is off the grid {lo} + k·{step}"
                valid = rules[(node_id, name)]
                for v in [*range(max(1, lo - 2 * step), lo + 3 * step + 1), *range(hi - 3 * step, hi + 1)]:
                    on_grid = lo <= v <= hi and (v - lo) % step == 0
                    canvas, core = ("offers", "refuses") if on_grid else ("cannot give", "accepts")
                    assert on_grid == valid(v), (f"{node_id}.{name}={v}: the canvas {canvas} it but the core {core} "
                                                 f"it (min {lo}, step {step}, max {hi})")
    assert seen == set(rules), f"no stepped INT input any more: {set(rules) - seen}"


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

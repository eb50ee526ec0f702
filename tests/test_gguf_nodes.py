"""GGUF weights through the ComfyUI nodes (real ComfyUI 0.3.75 host): Load Cosmos3 Checkpoint lists the ``.gguf`` files
of ``models/diffusion_models`` and ``models/unet``, loads one with the checkpoint folder for the rest, and computes
exactly as the core's GGUF model — fully loaded or streamed layer by layer (ComfyUI's partial load); the LoRA node
patches it on top of the blocks (strength 0 and the unpatched model bit for bit as before); bad GGUF input is one
message naming the node, the value and the fix.
"""

from __future__ import annotations

import shutil
import uuid

import pytest
import torch
from test_lora import write_lora
from test_transformer_parity import ours_step

from cosmos3_core.model.gguf_write import write_gguf
from cosmos3_core.model.loader import load_transformer
from support.compare import rel
from test_workflows import TINY_NANO, load_api, shrink_api

GGUF = "cosmos3-test-nano-q8.gguf"


@pytest.fixture(scope="module")
def gguf_setup(host):
    models = host.base_dir / "models"
    (models / "diffusion_models").mkdir(parents=True, exist_ok=True)
    (models / "unet").mkdir(parents=True, exist_ok=True)
    checkpoint = models / "diffusers" / TINY_NANO
    write_gguf(checkpoint, models / "diffusion_models" / GGUF, "Q8_0")
    write_gguf(checkpoint, models / "unet" / "cosmos3-test-nano-q4.gguf", "Q4_0")
    core = load_transformer(checkpoint, dtype=torch.float32, skip_modules=("lm_head",),
                            gguf_file=models / "diffusion_models" / GGUF)
    loras = models / "loras"
    loras.mkdir(parents=True, exist_ok=True)
    shapes = {n: (m.out_features, m.in_features) for n, m in core.named_modules() if isinstance(m, torch.nn.Linear)}
    write_lora(loras / "cosmos3_gguf_test.safetensors", shapes, rank=4, alpha=8.0, seed=3)
    return core, loras


def step_inputs():
    g = torch.Generator().manual_seed(8)
    return [torch.randint(0, 100, (15,), generator=g).tolist()], torch.randn(1, 48, 2, 4, 6, generator=g), 700, 24.0, \
        (), torch.randn(64, 5, generator=g)


def node_step(handle, lowvram: bool = False):
    """Our step after ComfyUI loads (and patches) both towers of ``handle`` — fully, or with every layer streamed
    (a partial load with no room: ComfyUI's lowvram path)."""
    import comfy.model_management as mm

    mm.unload_all_models()
    patchers = [handle.text_patcher, handle.generation_patcher]
    if lowvram:
        for p in patchers:
            p.patch_model(device_to=p.load_device, lowvram_model_memory=1)
    else:
        mm.load_models_gpu(patchers)
    try:
        out = ours_step(handle.pipeline.transformer, *step_inputs())
    finally:
        if lowvram:
            for p in patchers:
                p.unpatch_model(device_to=p.offload_device)
    return out.vision[0], out.sound[0]


def load(host, **kw):
    loader = host.node_class_mappings["Cosmos3Loader"]
    return loader.execute(checkpoint=TINY_NANO, dtype="fp32", device="cpu", **kw).result[0]


def test_the_loader_lists_gguf_files_of_both_folders(host, gguf_setup):
    schema = host.node_class_mappings["Cosmos3Loader"].define_schema()
    (gguf_input,) = [i for i in schema.inputs if i.id == "gguf"]
    assert gguf_input.options[0] == "none" and {GGUF, "cosmos3-test-nano-q4.gguf"} <= set(gguf_input.options)


def test_a_gguf_loads_through_the_node_and_equals_the_core(host, gguf_setup):
    core, _ = gguf_setup
    handle = load(host, gguf=GGUF)
    layer = handle.pipeline.transformer.layers[1].self_attn.add_q_proj
    assert type(layer).__name__ == "StreamingGgufLinear" and layer.weight.dtype == torch.uint8
    ref = ours_step(core, *step_inputs())
    for lowvram in (False, True):
        v, s = node_step(handle, lowvram)
        assert torch.equal(v, ref.vision[0]) and torch.equal(s, ref.sound[0]), lowvram


def test_lora_patches_a_gguf_model_on_top_of_its_blocks(host, gguf_setup):
    from cosmos3_core.model.lora import merge_lora, read_lora

    core, loras = gguf_setup
    node = host.node_class_mappings["Cosmos3LoraLoader"]
    base = load(host, gguf=GGUF)
    plain = node_step(base)
    blocks = base.pipeline.transformer.layers[0].mlp_moe_gen.up_proj.weight.clone()
    patched = node.execute(model=base, lora_name="cosmos3_gguf_test.safetensors", strength=0.8).result[0]
    full, streamed = node_step(patched), node_step(patched, lowvram=True)
    assert torch.equal(base.pipeline.transformer.layers[0].mlp_moe_gen.up_proj.weight, blocks)
    assert torch.equal(full[0], streamed[0]) and torch.equal(full[1], streamed[1])
    shapes = {n: (m.out_features, m.in_features) for n, m in core.named_modules() if isinstance(m, torch.nn.Linear)}
    merge_lora(core, read_lora(loras / "cosmos3_gguf_test.safetensors", shapes), 0.8)
    try:
        ref = ours_step(core, *step_inputs())
    finally:
        for m in core.modules():
            if getattr(m, "patches", None):
                m.patches.clear()
    assert rel(full[0], plain[0]) > 1e-3  # the LoRA changes the output
    assert rel(full[0], ref.vision[0]) <= 1e-5 and rel(full[1], ref.sound[0]) <= 1e-5
    zero = node.execute(model=base, lora_name="cosmos3_gguf_test.safetensors", strength=0.0).result[0]
    for v, p in zip(node_step(zero), plain):
        assert torch.equal(v, p)
    for v, p in zip(node_step(base), plain):  # the patch left with its clone
        assert torch.equal(v, p)


def gguf_graph(gguf: str, **loader_inputs) -> dict:
    g = shrink_api(load_api("t2v"), prefix="cosmos3_gguf/t2v", prompt_suffix=" (gguf)")
    (loader,) = [k for k, v in g.items() if v["class_type"] == "Cosmos3Loader"]
    g[loader]["inputs"].update(gguf=gguf, **loader_inputs)
    return g


def test_a_workflow_runs_from_a_gguf(host, gguf_setup):
    assert host.run_ok(gguf_graph("cosmos3-test-nano-q4.gguf"))


def test_bad_gguf_input_names_node_value_and_fix(host, gguf_setup, tmp_path):
    models = host.base_dir / "models" / "diffusion_models"
    (models / "cosmos3-test-broken.gguf").write_bytes((models / GGUF).read_bytes()[:5000])
    cases = {("cosmos3-test-broken.gguf", "auto"): "is damaged or truncated",
             (GGUF, "fp8_e4m3fn"): "weight_dtype 'fp8_e4m3fn' does not apply to a GGUF file",
             ("nowhere.gguf", "auto"): "gguf file 'nowhere.gguf' was not found in"}
    for (name, weight_dtype), words in cases.items():
        ok, _, messages = host.run(gguf_graph(name, weight_dtype=weight_dtype), prompt_id=str(uuid.uuid4()))
        assert not ok
        err = next(d for e, d in messages if e == "execution_error")
        assert err["node_type"] == "Cosmos3Loader" and err["exception_message"].startswith("Cosmos3Loader: "), err
        assert words in err["exception_message"], err["exception_message"]
    edge = host.base_dir / "models" / "diffusers" / "cosmos3-tiny-edge"
    with pytest.raises(ValueError, match=r"Cosmos3Loader: checkpoint 'cosmos3-tiny-edge' with gguf .* was converted "
                                         r"from another Cosmos3 model"):
        host.node_class_mappings["Cosmos3Loader"].execute(checkpoint=edge.name, dtype="fp32", device="cpu", gguf=GGUF)
    assert host.run_ok(gguf_graph(GGUF))  # the next run works


def test_a_gguf_input_naming_a_folder_says_so_and_lists_the_gguf_files_inside(host, gguf_setup):
    """A ``gguf`` value naming a folder of models/diffusion_models (or models/unet) — a Hub download kept as its
    folder, a name typed by hand — is said to be a folder, not a .gguf file, with the fix: the .gguf files inside it
    as the gguf list names them (the first four), or, with none there, where to put one; a name listed there loads."""
    models = host.base_dir / "models"
    folder = models / "diffusion_models" / "cosmos3-test-folder"
    (folder / "more").mkdir(parents=True, exist_ok=True)
    if not (folder / "nano-q8.gguf").is_symlink():
        (folder / "nano-q8.gguf").symlink_to(models / "diffusion_models" / GGUF)
    for name in ("z-other.gguf", "more/q2.gguf", "more/q3.gguf", "more/q4.gguf"):  # never loaded: names only
        (folder / name).write_bytes(b"GGUF")
    (folder / "README.md").write_text("not a weight file")
    empty = models / "unet" / "cosmos3-test-empty"
    empty.mkdir(exist_ok=True)
    (empty / "notes.txt").write_text("no .gguf here")
    try:
        _check_the_folder_messages(host, models, folder, empty)
    finally:  # the host's model folders are shared by later tests' gguf lists
        shutil.rmtree(folder)
        shutil.rmtree(empty)


def _check_the_folder_messages(host, models, folder, empty):

    ok, _, messages = host.run(gguf_graph("cosmos3-test-folder"), prompt_id=str(uuid.uuid4()))
    err = next(d for e, d in messages if e == "execution_error")
    assert not ok and err["node_type"] == "Cosmos3Loader", err
    inside = ", ".join(f"'cosmos3-test-folder/{n}'" for n in ("nano-q8.gguf", "z-other.gguf", "more/q2.gguf",
                                                               "more/q3.gguf"))
    want = (f"Cosmos3Loader: gguf 'cosmos3-test-folder' is a folder ({folder}), not a .gguf file; pick the .gguf "
            f"file inside it: {inside}, … (press r to refresh if it is not listed).")
    assert err["exception_message"].rstrip("\n") == want, err["exception_message"]  # ComfyUI adds a newline
    loader = host.node_class_mappings["Cosmos3Loader"]
    with pytest.raises(ValueError) as refused:  # a trailing separator names the same folder
        loader.execute(checkpoint=TINY_NANO, dtype="fp32", device="cpu", gguf="cosmos3-test-folder/")
    assert str(refused.value) == want.replace("gguf 'cosmos3-test-folder'", "gguf 'cosmos3-test-folder/'")
    with pytest.raises(ValueError) as refused:
        loader.execute(checkpoint=TINY_NANO, dtype="fp32", device="cpu", gguf="cosmos3-test-empty")
    assert str(refused.value) == (
        f"Cosmos3Loader: gguf 'cosmos3-test-empty' is a folder ({empty}), not a .gguf file, and it holds no .gguf "
        f"file; put the .gguf file in it or in {models / 'unet'} (python -m cosmos3_core.gguf writes one from a "
        "checkpoint), press r to refresh, then pick the file — or set gguf to none.")

    (gguf_input,) = [i for i in loader.define_schema().inputs if i.id == "gguf"]
    assert "cosmos3-test-folder/nano-q8.gguf" in gguf_input.options  # the fix: the name listed, picked, loads
    handle = load(host, gguf="cosmos3-test-folder/nano-q8.gguf")
    assert type(handle.pipeline.transformer.layers[1].self_attn.add_q_proj).__name__ == "StreamingGgufLinear"

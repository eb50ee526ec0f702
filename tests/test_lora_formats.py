"""LoRA files as trainers write them: LyCORIS LoKr (SimpleTuner's Cosmos3 format) and LoHa, kohya ``lora_unet_``
LoRA, PEFT LoRA under other prefixes — stacked and mixed — through the Cosmos3LoraLoader node in the real ComfyUI
0.3.75 host (ComfyUI's weight adapters compute the deltas) and through the core (``merge_lora``).

Reference: PyPI's ``lycoris-lora`` (4.1.3) loads each tiny test file by itself (``create_lycoris_from_weights``, its
own key parsing, module matching and scale rules) onto diffusers 0.42.1's ``Cosmos3OmniTransformer`` and runs its
forward; Tucker cores on linear layers (which LyCORIS only writes for convolutions, so cannot load) are rebuilt
with LyCORIS's ``rebuild_tucker`` and merged by the LyCORIS formula; PEFT LoRA goes through diffusers'
``load_lora_adapter``. Our output (fp32) is within 1e-5 relative error of the reference's, vision and sound.
The files are random tensors in the trainers' key layouts, written here.

Bad input: strength NaN/inf, NaN/inf tensors and alphas, alpha as a string/list/NaN in the metadata or
``adapter_config.json``, formats we do not read (named), keys for layers the checkpoint lacks. FP8-stored weights
(``weight_dtype=fp8_e4m3fn`` and a ModelOpt FP8 checkpoint) with a LoRA at strength 0 give exactly the FP8 model's
output (a zero patch through ComfyUI would re-round the FP8 weights stochastically: shown too).
"""

from __future__ import annotations

import copy
import json
import math
import shutil
import uuid

import pytest
import torch
from safetensors.torch import load_file, save_file
from test_lora import inputs, lora_graph, ours_with, reference, write_lora
from test_transformer_parity import ours_step

from cosmos3_core.model.lora import LoraError, check_strength, linear_shapes, merge_lora, read_lora
from support.compare import rel

TOL = 1e-5
CKPT = "cosmos3-tiny-nano"


def flat(module: str) -> str:
    return module.replace(".", "_")


def _rand(g, *shape, std=0.1):
    return torch.randn(*shape, generator=g) * std


def write_lokr(path, shapes, seed=0):
    """A LyCORIS LoKr file as SimpleTuner saves it (``lycoris_<layer>.lokr_*`` + ``alpha``), one layout per layer:
    full W1 and W2 (SimpleTuner's default; alpha is ignored), W2 factorised (rank 4, alpha 8), both sides
    factorised (rank 4, alpha 2), and alpha 0 (= rank). Both towers are hit."""
    g = torch.Generator().manual_seed(seed)
    sd = {}
    spec = {  # layer: (layout, w1 rows, w1 cols, rank, alpha)
        "layers.0.self_attn.add_q_proj": ("full", 8, 8, None, 1.0),
        "layers.1.mlp_moe_gen.down_proj": ("w2", 8, 8, 4, 8.0),
        "layers.0.self_attn.to_q": ("both", 16, 16, 4, 2.0),
        "layers.1.mlp.up_proj": ("w2", 8, 8, 4, 0.0),
        "proj_in": ("full", 8, 8, None, 1.0),
    }
    for module, (layout, a, c, r, alpha) in spec.items():
        out_f, in_f = shapes[module]
        b, d = out_f // a, in_f // c
        k = f"lycoris_{flat(module)}"
        if layout == "both":
            sd[f"{k}.lokr_w1_a"], sd[f"{k}.lokr_w1_b"] = _rand(g, a, r, std=0.3), _rand(g, r, c, std=0.3)
        else:
            sd[f"{k}.lokr_w1"] = _rand(g, a, c)
        if layout == "full":
            sd[f"{k}.lokr_w2"] = _rand(g, b, d)
        else:
            sd[f"{k}.lokr_w2_a"], sd[f"{k}.lokr_w2_b"] = _rand(g, b, r, std=0.2), _rand(g, r, d, std=0.2)
        sd[f"{k}.alpha"] = torch.tensor(alpha)
    save_file(sd, str(path))
    return path


def write_loha(path, shapes, seed=0, rank=4):
    """A LyCORIS LoHa file (``lycoris_<layer>.hada_w{1,2}_{a,b}`` + ``alpha``; one layer with alpha 0 = rank)."""
    g = torch.Generator().manual_seed(seed)
    sd = {}
    for module, alpha in (("layers.0.mlp.gate_proj", 2.0), ("layers.1.self_attn.add_v_proj", 8.0),
                          ("layers.0.self_attn.to_add_out", 0.0), ("layers.1.self_attn.to_k", 4.0)):
        out_f, in_f = shapes[module]
        k = f"lycoris_{flat(module)}"
        sd[f"{k}.hada_w1_a"], sd[f"{k}.hada_w1_b"] = _rand(g, out_f, rank, std=0.3), _rand(g, rank, in_f, std=0.3)
        sd[f"{k}.hada_w2_a"], sd[f"{k}.hada_w2_b"] = _rand(g, out_f, rank, std=0.3), _rand(g, rank, in_f, std=0.3)
        sd[f"{k}.alpha"] = torch.tensor(alpha)
    save_file(sd, str(path))
    return path


def write_kohya(path, shapes, seed=0, rank=4):
    """A kohya-style LoRA (``lora_unet_<layer>.lora_down.weight`` / ``lora_up.weight`` + ``alpha``)."""
    g = torch.Generator().manual_seed(seed)
    sd = {}
    for module, alpha in (("layers.0.self_attn.add_k_proj", 2.0), ("layers.1.mlp_moe_gen.gate_proj", 8.0),
                          ("layers.1.self_attn.to_v", 1.0)):
        out_f, in_f = shapes[module]
        k = f"lora_unet_{flat(module)}"
        sd[f"{k}.lora_down.weight"], sd[f"{k}.lora_up.weight"] = _rand(g, rank, in_f), _rand(g, out_f, rank)
        sd[f"{k}.alpha"] = torch.tensor(alpha)
    save_file(sd, str(path))
    return path


def write_tucker(path, shapes, seed=0, rank=3):
    """Tucker cores on linear layers (``lokr_t2`` / ``hada_t1``+``hada_t2``, ``[r, r, 1, 1]`` as conv-style tools
    save them, or ``[r, r]``): what LyCORIS itself only writes for kernels > 1."""
    g = torch.Generator().manual_seed(seed)
    sd = {}
    m = "layers.0.self_attn.add_v_proj"  # LoKr: W1 [8, 8] ⊗ Tucker W2
    out_f, in_f = shapes[m]
    k = f"lycoris_{flat(m)}"
    sd[f"{k}.lokr_w1"] = _rand(g, 8, 8)
    sd[f"{k}.lokr_t2"] = _rand(g, rank, rank, 1, 1, std=0.5)
    sd[f"{k}.lokr_w2_a"], sd[f"{k}.lokr_w2_b"] = _rand(g, rank, out_f // 8, std=0.3), _rand(g, rank, in_f // 8, std=0.3)
    sd[f"{k}.alpha"] = torch.tensor(6.0)
    m = "layers.1.mlp.down_proj"  # LoHa with Tucker cores
    out_f, in_f = shapes[m]
    k = f"lycoris_{flat(m)}"
    for i in (1, 2):
        sd[f"{k}.hada_t{i}"] = _rand(g, rank, rank, std=0.5)
        sd[f"{k}.hada_w{i}_a"], sd[f"{k}.hada_w{i}_b"] = _rand(g, rank, out_f, std=0.3), _rand(g, rank, in_f, std=0.3)
    sd[f"{k}.alpha"] = torch.tensor(1.5)
    save_file(sd, str(path))
    return path


# -------------------------------------------------------------------------------------------- the reference

def lycoris_apply(model, path, multiplier: float, prefix: str = "lycoris") -> int:
    """LyCORIS (PyPI lycoris-lora) loads ``path`` onto ``model`` (diffusers) and wraps its layers' forwards; returns
    how many layers it took."""
    from lycoris import LycorisNetwork, create_lycoris_from_weights

    old = LycorisNetwork.LORA_PREFIX
    LycorisNetwork.LORA_PREFIX = prefix
    try:
        net, _ = create_lycoris_from_weights(multiplier, str(path), model)
    finally:
        LycorisNetwork.LORA_PREFIX = old
    net.apply_to()
    modules = {k.split(".")[0] for k in load_file(str(path))}
    assert len(net.loras) == len(modules), (len(net.loras), sorted(modules))
    return len(net.loras)


@torch.no_grad()
def tucker_merge(model, path, multiplier: float) -> None:
    """The LyCORIS formulas for the Tucker file, merged into diffusers' weights: ΔW = (α/r)·kron(W1, W2) with
    W2 = rebuild_tucker(t2, w2_a, w2_b), and (α/r)·rebuild_tucker(t1, …) ⊙ rebuild_tucker(t2, …)."""
    from lycoris.functional.general import rebuild_tucker

    sd = load_file(str(path))
    for name, layer in model.named_modules():
        k = f"lycoris_{flat(name)}"
        if f"{k}.lokr_t2" in sd:
            t = sd[f"{k}.lokr_t2"]
            w2 = rebuild_tucker(t, sd[f"{k}.lokr_w2_a"], sd[f"{k}.lokr_w2_b"]).reshape(
                sd[f"{k}.lokr_w2_a"].shape[1], sd[f"{k}.lokr_w2_b"].shape[1])
            dw = torch.kron(sd[f"{k}.lokr_w1"], w2) * (float(sd[f"{k}.alpha"]) / t.shape[0])
        elif f"{k}.hada_t1" in sd:
            w = [rebuild_tucker(sd[f"{k}.hada_t{i}"], sd[f"{k}.hada_w{i}_a"], sd[f"{k}.hada_w{i}_b"]) for i in (1, 2)]
            dw = w[0] * w[1] * (float(sd[f"{k}.alpha"]) / sd[f"{k}.hada_w1_b"].shape[0])
        else:
            continue
        layer.weight += multiplier * dw


@pytest.fixture(scope="module")
def setup(host):
    from diffusers import Cosmos3OmniTransformer

    ckpt = host.base_dir / "models" / "diffusers" / CKPT
    loras = host.base_dir / "models" / "loras"
    loras.mkdir(parents=True, exist_ok=True)
    ref = Cosmos3OmniTransformer.from_pretrained(ckpt, subfolder="transformer", torch_dtype=torch.float32).eval()
    shapes = linear_shapes(ref)
    files = {
        "lokr": write_lokr(loras / "cosmos3_fmt_lokr.safetensors", shapes, seed=1),
        "loha": write_loha(loras / "cosmos3_fmt_loha.safetensors", shapes, seed=2),
        "kohya": write_kohya(loras / "cosmos3_fmt_kohya.safetensors", shapes, seed=3),
        "tucker": write_tucker(loras / "cosmos3_fmt_tucker.safetensors", shapes, seed=4),
        "peft": write_lora(loras / "cosmos3_fmt_peft.safetensors", shapes, rank=4, alpha=8.0, seed=5),
    }
    base = host.node_class_mappings["Cosmos3Loader"].execute(checkpoint=CKPT, dtype="fp32", device="cpu").result[0]
    return {"ref": ref, "ckpt": ckpt, "loras": loras, "shapes": shapes, "files": files, "base": base}


def reference_with(setup, stack):
    """The reference output for ``stack`` = [(kind, strength), ...] on a fresh copy of diffusers' model."""
    ref = copy.deepcopy(setup["ref"])
    peft = [(k, s) for k, s in stack if k == "peft"]
    for kind, strength in stack:  # LyCORIS first: PEFT then wraps the LyCORIS-patched layers
        path = setup["files"][kind]
        if kind in ("lokr", "loha"):
            lycoris_apply(ref, path, strength)
        elif kind == "kohya":
            lycoris_apply(ref, path, strength, prefix="lora_unet")
        elif kind == "tucker":
            tucker_merge(ref, path, strength)
    if peft:
        ref.load_lora_adapter(str(setup["loras"]), weight_name=setup["files"]["peft"].name, adapter_name="p")
        ref.set_adapters(["p"], weights=[peft[0][1]])
    return reference(ref)


def node_chain(host, setup, stack):
    node = host.node_class_mappings["Cosmos3LoraLoader"]
    handle = setup["base"]
    for kind, strength in stack:
        handle = node.execute(model=handle, lora_name=setup["files"][kind].name, strength=strength).result[0]
    return handle


def core_with(setup, stack):
    from cosmos3_core.model.loader import load_transformer

    model = load_transformer(setup["ckpt"], dtype=torch.float32)
    shapes = linear_shapes(model)
    for kind, strength in stack:
        merge_lora(model, read_lora(setup["files"][kind], shapes), strength)
    ids, latents, sound = inputs()
    out = ours_step(model, [ids], latents, 600, 24.0, (), sound)
    return out.vision[0], out.sound[0]


STACKS = {
    "lokr": [("lokr", 1.0)],
    "loha": [("loha", 0.8)],
    "kohya": [("kohya", 1.3)],
    "tucker": [("tucker", 1.0)],
    "mixed": [("lokr", 0.7), ("peft", -0.5), ("loha", 1.2), ("kohya", 0.9)],
}


@pytest.mark.parametrize("case", sorted(STACKS))
def test_node_and_core_match_lycoris(host, setup, case):
    stack = STACKS[case]
    ref_v, ref_s = reference_with(setup, stack)
    plain_v, _ = reference(setup["ref"])
    assert rel(ref_v, plain_v) > 1e-3  # the adapters change the output
    v, s = ours_with(host, node_chain(host, setup, stack))
    assert rel(v, ref_v) <= TOL and rel(s, ref_s) <= TOL, (rel(v, ref_v), rel(s, ref_s))
    cv, cs = core_with(setup, stack)
    assert rel(cv, ref_v) <= TOL and rel(cs, ref_s) <= TOL, (rel(cv, ref_v), rel(cs, ref_s))


def test_host_without_weight_adapters_gets_the_cores_deltas(host, setup, monkeypatch):
    """A ComfyUI without ``comfy.weight_adapter``'s classes (older hosts): the core computes ΔW, ComfyUI adds it."""
    import comfy.weight_adapter as wa

    for cls in ("LoRAAdapter", "LoKrAdapter", "LoHaAdapter"):
        monkeypatch.delattr(wa, cls)
    stack = STACKS["mixed"]
    handle = node_chain(host, setup, stack)
    kinds = {type(p[-1][1]).__name__ for p in handle.generation_patcher.patches.values()}
    assert kinds == {"tuple"}, kinds  # ("diff", (ΔW,)) patches, no adapter objects
    monkeypatch.undo()
    v, s = ours_with(host, handle)
    ref_v, ref_s = reference_with(setup, stack)
    assert rel(v, ref_v) <= TOL and rel(s, ref_s) <= TOL


def test_comfy_computes_the_deltas_through_its_adapters(host, setup):
    handle = node_chain(host, setup, STACKS["mixed"])
    names = {type(p[1]).__name__ for ps in [*handle.generation_patcher.patches.values(),
                                            *handle.text_patcher.patches.values()] for p in ps}
    assert names == {"LoRAAdapter", "LoKrAdapter", "LoHaAdapter"}, names


def test_trainer_prefixes_match_diffusers(host, setup, tmp_path):
    """PEFT LoRA keys under ``diffusion_model.``, ``base_model.model.``, bare, with ``.default`` or kohya-dotted
    ``lora_down``/``lora_up`` names: the same LoRA as diffusers' ``transformer.`` file."""
    sd = load_file(str(setup["files"]["peft"]))
    meta = {"lora_adapter_metadata": json.dumps({"transformer.r": 4, "transformer.lora_alpha": 8.0})}
    ref = copy.deepcopy(setup["ref"])
    ref.load_lora_adapter(str(setup["loras"]), weight_name=setup["files"]["peft"].name, adapter_name="p")
    ref.set_adapters(["p"], weights=[0.6])
    ref_v, ref_s = reference(ref)
    node = host.node_class_mappings["Cosmos3LoraLoader"]
    variants = {
        "diffusion_model": lambda k: "diffusion_model." + k[len("transformer."):],
        "base_model": lambda k: "base_model.model." + k[len("transformer."):],
        "bare_default": lambda k: k[len("transformer."):].replace(".weight", ".default.weight"),
        "lycoris_dotted": lambda k: "transformer." + k[len("transformer."):].replace(".lora_A.", ".lora_down.")
                                                                          .replace(".lora_B.", ".lora_up."),
    }
    for name, rename in variants.items():
        fname = f"cosmos3_fmt_prefix_{name}.safetensors"
        save_file({rename(k): v for k, v in sd.items()}, str(setup["loras"] / fname), metadata=meta)
        v, s = ours_with(host, node.execute(model=setup["base"], lora_name=fname, strength=0.6).result[0])
        assert rel(v, ref_v) <= TOL and rel(s, ref_s) <= TOL, name


def test_chained_loaders_in_a_graph(host, setup):
    """Three Cosmos3 LoRA Loader nodes (LoKr, PEFT, LoHa) chained in one graph run through ComfyUI's executor."""
    g = lora_graph(1.0, setup["files"]["lokr"].name)
    g["91"] = {"class_type": "Cosmos3LoraLoader",
               "inputs": {"model": ["90", 0], "lora_name": setup["files"]["peft"].name, "strength": 0.5}}
    g["92"] = {"class_type": "Cosmos3LoraLoader",
               "inputs": {"model": ["91", 0], "lora_name": setup["files"]["loha"].name, "strength": -0.7}}
    for nid, n in g.items():
        if nid not in ("90", "91", "92") and n["inputs"].get("model") == ["90", 0]:
            n["inputs"]["model"] = ["92", 0]
    assert host.run_ok(g, prompt_id=str(uuid.uuid4()))


# -------------------------------------------------------------------------------------------- bad input

def test_strength_nan_or_inf_is_one_clear_message(host, setup):
    node = host.node_class_mappings["Cosmos3LoraLoader"]
    for bad in (math.nan, math.inf, -math.inf):
        with pytest.raises(ValueError, match=r"^Cosmos3LoraLoader: strength is (nan|inf|-inf); it must be a finite "
                                             r"number .* Set strength between -10 and 10"):
            node.execute(model=setup["base"], lora_name=setup["files"]["lokr"].name, strength=bad)
    with pytest.raises(LoraError, match="strength is nan"):
        check_strength(math.nan)
    ok, _, messages = host.run(lora_graph(math.nan, setup["files"]["lokr"].name), prompt_id=str(uuid.uuid4()))
    assert not ok
    err = next(d for e, d in messages if e == "execution_error")
    assert err["node_type"] == "Cosmos3LoraLoader" and "strength is nan" in err["exception_message"], err


def _refused(setup, sd, match, name="bad.safetensors", metadata=None, folder=None):
    path = (folder or setup["loras"]) / name
    save_file(sd, str(path), metadata=metadata)
    with pytest.raises(LoraError, match=match):
        read_lora(path, setup["shapes"])
    return path


def test_non_finite_tensors_and_alphas_are_refused(setup):
    sd = load_file(str(setup["files"]["lokr"]))
    key = "lycoris_layers_1_mlp_moe_gen_down_proj.lokr_w2_b"
    for value in (math.nan, math.inf):
        bad = dict(sd)
        bad[key] = bad[key].clone()
        bad[key][0, 0] = value
        _refused(setup, bad, rf"LoRA nan.safetensors: tensor {key} holds 1 NaN/inf values", name="nan.safetensors")
    bad = dict(sd, **{"lycoris_proj_in.alpha": torch.tensor(math.nan)})
    _refused(setup, bad, r"tensor lycoris_proj_in.alpha holds 1 NaN/inf")
    peft = load_file(str(setup["files"]["peft"]))
    for alpha, shown in ((math.nan, "nan"), ("16", "'16' \\(str\\)"), ([8, 8], "\\[8, 8\\] \\(list\\)"),
                         (True, "True \\(bool\\)")):
        meta = {"lora_adapter_metadata": json.dumps({"transformer.r": 4, "transformer.lora_alpha": alpha})}
        _refused(setup, peft, rf"LoRA bad.safetensors: lora_alpha in its lora_adapter_metadata is {shown}.*must be "
                              "a positive finite number", metadata=meta)
    meta = {"lora_adapter_metadata": json.dumps({"transformer.r": "4", "transformer.lora_alpha": 8})}
    _refused(setup, peft, r"r in its lora_adapter_metadata is '4' \(str\); it must be a positive integer", metadata=meta)
    meta = {"lora_adapter_metadata": json.dumps({"transformer.lora_alpha": 8, "transformer.alpha_pattern": {"x": "a"}})}
    _refused(setup, peft, r"alpha_pattern\['x'\] in its lora_adapter_metadata is 'a'", metadata=meta)


def test_peft_adapter_config_beside_the_file(host, setup):
    """PEFT's save_pretrained folder: ``adapter_model.safetensors`` (no metadata) + ``adapter_config.json`` with its
    lora_alpha — read, and a bad value there is one clear message."""
    folder = setup["loras"] / "cosmos3_fmt_peft_folder"
    folder.mkdir(exist_ok=True)
    sd = {"base_model.model." + k[len("transformer."):]: v for k, v in load_file(str(setup["files"]["peft"])).items()}
    save_file(sd, str(folder / "adapter_model.safetensors"))
    cfg = {"peft_type": "LORA", "r": 4, "lora_alpha": 8.0, "target_modules": ["to_q"]}
    (folder / "adapter_config.json").write_text(json.dumps(cfg))
    patches = read_lora(folder / "adapter_model.safetensors", setup["shapes"])
    assert {p.scale for p in patches.values()} == {2.0}
    for field, value, match in (("lora_alpha", "8", r"lora_alpha in its adapter_config.json is '8' \(str\)"),
                                ("lora_alpha", [8], r"lora_alpha in its adapter_config.json is \[8\] \(list\)"),
                                ("peft_type", "LOKR", r"is a PEFT LOKR adapter \(adapter_config.json\)")):
        (folder / "adapter_config.json").write_text(json.dumps({**cfg, field: value}))
        with pytest.raises(LoraError, match=match):
            read_lora(folder / "adapter_model.safetensors", setup["shapes"])
    (folder / "adapter_config.json").write_text(json.dumps({**cfg, "lora_alpha": "8"}))
    name = "cosmos3_fmt_peft_folder/adapter_model.safetensors"
    with pytest.raises(ValueError, match=r"^Cosmos3LoraLoader: LoRA adapter_model.safetensors: lora_alpha in its "
                                         r"adapter_config.json is '8' \(str\); it must be a positive finite number"):
        host.node_class_mappings["Cosmos3LoraLoader"].execute(model=setup["base"], lora_name=name, strength=1.0)
    shutil.rmtree(folder)


UNKNOWN_FORMATS = {
    "oft_blocks": "OFT/BOFT", "oft_r": "OFT \\(PEFT", "boft_R": "BOFT \\(PEFT", "a1.weight": "GLoRA",
    "on_input": "IA3", "dora_scale": "DoRA", "lora_magnitude_vector": "DoRA", "diff": "full weight difference",
    "w_norm": "norm-layer tuning", "lora_mid.weight": "LoCon Tucker",
}


@pytest.mark.parametrize("suffix", sorted(UNKNOWN_FORMATS))
def test_unsupported_formats_are_refused_by_name(setup, suffix):
    sd = dict(load_file(str(setup["files"]["lokr"])), **{f"lycoris_proj_in.{suffix}": torch.ones(4, 4)})
    _refused(setup, sd, rf"LoRA bad.safetensors is in a format Cosmos3 LoRA Loader does not read: "
                        rf"{UNKNOWN_FORMATS[suffix]}.*e.g. lycoris_proj_in.{suffix}.*Supported: LoRA .*LoKr.*LoHa")


def test_damaged_and_foreign_files_are_refused(setup):
    shapes = setup["shapes"]
    sd = load_file(str(setup["files"]["lokr"]))
    k = "lycoris_layers_0_self_attn_add_q_proj"
    _refused(setup, {kk: v for kk, v in sd.items() if kk != f"{k}.lokr_w1"},
             rf"{flat('layers.0.self_attn.add_q_proj')} needs lokr_w1 or both lokr_w1_a and lokr_w1_b")
    _refused(setup, dict(sd, **{f"{k}.hada_w1_a": torch.zeros(2, 2)}), "mixes loha and lokr tensors")
    bad = dict(sd, **{"lycoris_layers_1_mlp_moe_gen_down_proj.lokr_w2_b": torch.zeros(5, 48)})
    _refused(setup, bad, r"rank mismatch at layers_1_mlp_moe_gen_down_proj: .*lokr_w2_a is \[b, r\]")
    other = {f"lycoris_down_blocks_{i}_attn_to_q.lokr_w1": torch.zeros(2, 2) for i in range(5)}
    _refused(setup, {**sd, **other}, r"does not fit this checkpoint: 5 of its 10 modules are not Cosmos3 linear "
                                     r"layers \(e.g. \['down_blocks_0_attn_to_q', 'down_blocks_1_attn_to_q', "
                                     r"'down_blocks_2_attn_to_q'\]\); it was trained for another model")
    m = "layers.0.self_attn.to_k"
    out_f, in_f = shapes[m]
    _refused(setup, {f"lycoris_{flat(m)}.lokr_w1": torch.zeros(8, 8),
                     f"lycoris_{flat(m)}.lokr_w2": torch.zeros(out_f // 8, 2 * in_f // 8)},
             rf"{m} is \[{out_f}, {in_f}\] in this checkpoint but the lokr patch gives \[{out_f}, {2 * in_f}\].*"
             "another Cosmos3 size")
    _refused(setup, {"some.weight": torch.zeros(2)}, r"1 keys are in no LoRA layout this loader reads")


# -------------------------------------------------------------------------------------------- FP8 + strength 0

@pytest.mark.parametrize("storage", ["fp8_e4m3fn", "modelopt"])
def test_fp8_model_with_lora_at_strength_zero_is_the_fp8_model(host, setup, storage):
    import comfy.model_management as mm
    from test_weights import write_modelopt

    loader = host.node_class_mappings["Cosmos3Loader"]
    node = host.node_class_mappings["Cosmos3LoraLoader"]
    root = host.base_dir / "models" / "diffusers"
    name = CKPT
    if storage == "modelopt":
        name = "cosmos3-tiny-nano-fp8-lora"
        write_modelopt(root / CKPT, root / name, full=True)
    try:
        kwargs = {"weight_dtype": "fp8_e4m3fn"} if storage != "modelopt" else {}
        base = loader.execute(checkpoint=name, dtype="fp32", device="cpu", **kwargs).result[0]
        fp8 = [m for m in base.generation_patcher.model.modules()
               if isinstance(m, torch.nn.Linear) and m.weight.dtype == torch.float8_e4m3fn]
        assert fp8
        plain = ours_with(host, base)
        for kind in ("lokr", "peft"):
            zero = node.execute(model=base, lora_name=setup["files"][kind].name, strength=0.0).result[0]
            v, s = ours_with(host, zero)
            assert torch.equal(v, plain[0]) and torch.equal(s, plain[1]), kind
        one = node.execute(model=base, lora_name=setup["files"]["lokr"].name, strength=1.0).result[0]
        assert rel(ours_with(host, one)[0], plain[0]) > 1e-3
        # the cause of the old 4.5/255: a zero patch still goes through ComfyUI's re-rounding to FP8 (stochastic, for
        # FP8 storage); the pack's ModelOpt layers re-quantize a patched weight with its own amax / 448, which for a
        # zero patch gives back the weights and scales as loaded here (so the node's skip of strength 0 is what
        # keeps FP8 storage exact)
        patched = one.generation_patcher.clone()
        patched.patches = {}
        patched.add_patches({k: p[0][1] for k, p in one.generation_patcher.patches.items()}, 0.0)
        mm.load_models_gpu([base.text_patcher, patched])
        ids, latents, sound = inputs()
        rounded = ours_step(base.pipeline.transformer, [ids], latents, 600, 24.0, (), sound).vision[0]
        assert torch.equal(rounded, plain[0]) == (storage == "modelopt")
        assert torch.equal(ours_with(host, base)[0], plain[0])  # ComfyUI restores the FP8 weights
    finally:
        if storage == "modelopt":
            shutil.rmtree(root / name, ignore_errors=True)


def test_core_merge_at_zero_and_bad_strength(setup):
    from cosmos3_core.model.loader import load_transformer

    model = load_transformer(setup["ckpt"], dtype=torch.float32, storage_dtype=torch.float8_e4m3fn)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    patches = read_lora(setup["files"]["lokr"], linear_shapes(model))
    merge_lora(model, patches, 0.0)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    with pytest.raises(LoraError, match="strength is inf"):
        merge_lora(model, patches, math.inf)

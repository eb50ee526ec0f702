"""Cosmos3 LoRA: the core reader (cosmos3_core.model.lora) and the Cosmos3LoraLoader node in the real ComfyUI 0.3.75 host.

Parity: a tiny PEFT LoRA file (lora_A/lora_B on layers of both towers, lora_alpha ≠ r in its
``lora_adapter_metadata``) applied by our node through ComfyUI's ModelPatcher gives the output of diffusers 0.42.1's
``Cosmos3OmniTransformer`` after ``load_lora_adapter`` on the same tiny checkpoint (fp32, ≤ 1e-5), for one LoRA and
for two stacked LoRAs at different strengths (diffusers ``set_adapters`` weights); strength 0 and a model without the
LoRA give exactly the un-patched output (ComfyUI restores the weights); a new strength re-runs only the LoRA node
(the loader stays cached). Bad input: unknown keys, rank mismatch, wrong shape, corrupt file, DoRA.
"""

from __future__ import annotations

import json
import uuid

import pytest
import torch
from safetensors.torch import save_file
from test_transformer_parity import ours_step, reference_step

from cosmos3_core.model.lora import LoraError, read_lora
from support.compare import rel
from test_workflows import load_api, shrink_api

TARGETS = ("layers.0.self_attn.add_q_proj", "layers.1.self_attn.add_v_proj", "layers.0.self_attn.to_add_out",
           "layers.1.mlp_moe_gen.down_proj", "layers.0.self_attn.to_k", "layers.1.mlp.up_proj", "proj_in")


def linear_shapes(model) -> dict[str, tuple[int, int]]:
    return {n: tuple(m.weight.shape) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}


def write_lora(path, shapes, targets=TARGETS, rank=4, alpha=8.0, seed=0, extra=None, metadata=True):
    """A PEFT-format LoRA file as diffusers saves one (``transformer.`` prefix, LoraConfig fields in metadata)."""
    g = torch.Generator().manual_seed(seed)
    sd = {}
    for m in targets:
        out_f, in_f = shapes[m]
        sd[f"transformer.{m}.lora_A.weight"] = torch.randn(rank, in_f, generator=g) * 0.05
        sd[f"transformer.{m}.lora_B.weight"] = torch.randn(out_f, rank, generator=g) * 0.05
    sd.update(extra or {})
    meta = {"lora_adapter_metadata": json.dumps({"transformer.r": rank, "transformer.lora_alpha": alpha,
                                                 "transformer.target_modules": list(targets)})}
    save_file(sd, str(path), metadata=meta if metadata else None)
    return path


# -------------------------------------------------------------------------------------------- core reader

@pytest.fixture(scope="module")
def shapes(tiny_checkpoint):
    from cosmos3_core.model.loader import load_transformer

    path = tiny_checkpoint("nano", seed=0)
    return linear_shapes(load_transformer(path, dtype=torch.float32))


def test_reader_scales_and_fits(shapes, tmp_path):
    lora = read_lora(write_lora(tmp_path / "a.safetensors", shapes, rank=4, alpha=8.0), shapes)
    assert sorted(lora) == sorted(TARGETS)
    assert all(p.kind == "lora" and p.tensors["down"].shape[0] == 4 and p.scale == 2.0 for p in lora.values())
    plain = read_lora(write_lora(tmp_path / "b.safetensors", shapes, metadata=False), shapes)
    assert all(p.scale == 1.0 for p in plain.values())  # PEFT's lora_alpha = r when nothing says otherwise


def test_lora_for_another_model_is_refused(shapes, tmp_path):
    other = {"down_blocks.0.attentions.0.proj_in": (320, 320), **shapes}
    path = write_lora(tmp_path / "sdxl.safetensors", other, targets=("down_blocks.0.attentions.0.proj_in",))
    with pytest.raises(LoraError, match=r"sdxl.safetensors does not fit this checkpoint: 1 of its 1 modules.*"
                                        r"down_blocks.0.attentions.0.proj_in.*another model"):
        read_lora(path, shapes)


def test_rank_mismatch_and_wrong_size_are_refused(shapes, tmp_path):
    m = TARGETS[0]
    out_f, in_f = shapes[m]
    bad = tmp_path / "rank.safetensors"
    save_file({f"transformer.{m}.lora_A.weight": torch.zeros(4, in_f),
               f"transformer.{m}.lora_B.weight": torch.zeros(out_f, 8)}, str(bad))
    with pytest.raises(LoraError, match=rf"rank mismatch at {m}: down \(4, {in_f}\), up \({out_f}, 8\)"):
        read_lora(bad, shapes)
    wrong = write_lora(tmp_path / "edge.safetensors", {**shapes, m: (out_f, in_f * 2)}, targets=(m,))
    with pytest.raises(LoraError, match=rf"{m} is \[{out_f}, {in_f}\] in this checkpoint.*another Cosmos3 size"):
        read_lora(wrong, shapes)


def test_corrupt_and_unsupported_files_are_refused(shapes, tmp_path):
    good = write_lora(tmp_path / "good.safetensors", shapes)
    corrupt = tmp_path / "corrupt.safetensors"
    corrupt.write_bytes(good.read_bytes()[: len(good.read_bytes()) // 2])
    with pytest.raises(LoraError, match="corrupt.safetensors cannot be read .*download it again"):
        read_lora(corrupt, shapes)
    dora = write_lora(tmp_path / "dora.safetensors", shapes, targets=TARGETS[:1],
                      extra={f"transformer.{TARGETS[0]}.lora_magnitude_vector": torch.ones(3)})
    with pytest.raises(LoraError, match="DoRA"):
        read_lora(dora, shapes)
    half = tmp_path / "half.safetensors"
    save_file({f"transformer.{TARGETS[0]}.lora_A.weight": torch.zeros(4, shapes[TARGETS[0]][1])}, str(half))
    with pytest.raises(LoraError, match=rf"{TARGETS[0]} has no lora_B/lora_up weight; the file is incomplete"):
        read_lora(half, shapes)


# -------------------------------------------------------------------------------------------- node + ComfyUI
# ``host``: the shared fixture (tests/support/fixtures.py)

@pytest.fixture(scope="module")
def lora_setup(host):
    from diffusers import Cosmos3OmniTransformer

    ckpt = host.base_dir / "models" / "diffusers" / "cosmos3-tiny-nano"
    loras = host.base_dir / "models" / "loras"
    loras.mkdir(parents=True, exist_ok=True)
    ref = Cosmos3OmniTransformer.from_pretrained(ckpt, subfolder="transformer", torch_dtype=torch.float32).eval()
    shapes = linear_shapes(ref)
    write_lora(loras / "cosmos3_test_a.safetensors", shapes, rank=4, alpha=8.0, seed=1)
    write_lora(loras / "cosmos3_test_b.safetensors", shapes, targets=TARGETS[:3] + TARGETS[5:], rank=2, alpha=2.0,
               seed=2)
    return ref, loras


def inputs():
    g = torch.Generator().manual_seed(4)
    ids = torch.randint(0, 128, (19,), generator=g).tolist()
    return ids, torch.randn(1, 48, 2, 4, 6, generator=g), torch.randn(64, 7, generator=g)


def ours_with(host, handle):
    """Our step after ComfyUI loads (and patches) both towers of ``handle``."""
    import comfy.model_management as mm

    mm.load_models_gpu([handle.text_patcher, handle.generation_patcher])
    ids, latents, sound = inputs()
    out = ours_step(handle.pipeline.transformer, [ids], latents, 600, 24.0, (), sound)
    return out.vision[0], out.sound[0]


def reference(ref):
    ids, latents, sound = inputs()
    v, s, _ = reference_step(ref, ids, latents, 600, 24.0, (), sound)
    return v[0][0], s[0]


def test_lora_node_matches_diffusers_load_lora_adapter(host, lora_setup):
    ref, _ = lora_setup
    loader = host.node_class_mappings["Cosmos3Loader"]
    node = host.node_class_mappings["Cosmos3LoraLoader"]
    base = loader.execute(checkpoint="cosmos3-tiny-nano", dtype="fp32", device="cpu").result[0]
    plain_v, plain_s = ours_with(host, base)
    ref_plain_v, ref_plain_s = reference(ref)
    assert rel(plain_v, ref_plain_v) <= 1e-5

    one = node.execute(model=base, lora_name="cosmos3_test_a.safetensors", strength=1.0).result[0]
    assert one.pipeline is base.pipeline  # the same weights: nothing was read again
    v, s = ours_with(host, one)
    # the documented call (folder + weight_name): diffusers then reads the file's lora_adapter_metadata (alpha)
    ref.load_lora_adapter(str(lora_setup[1]), weight_name="cosmos3_test_a.safetensors", adapter_name="a")
    try:
        ref_v, ref_s = reference(ref)
        assert rel(ref_v, ref_plain_v) > 1e-3  # the LoRA changes the output (both towers are hit)
        assert rel(v, ref_v) <= 1e-5 and rel(s, ref_s) <= 1e-5

        stacked = node.execute(model=node.execute(model=base, lora_name="cosmos3_test_a.safetensors",
                                                  strength=0.7).result[0],
                               lora_name="cosmos3_test_b.safetensors", strength=-1.5).result[0]
        v2, s2 = ours_with(host, stacked)
        ref.load_lora_adapter(str(lora_setup[1]), weight_name="cosmos3_test_b.safetensors", adapter_name="b")
        ref.set_adapters(["a", "b"], weights=[0.7, -1.5])
        ref_v2, ref_s2 = reference(ref)
        assert rel(v2, ref_v2) <= 1e-5 and rel(s2, ref_s2) <= 1e-5
    finally:
        ref.delete_adapters([n for n in ("a", "b") if n in getattr(ref, "peft_config", {})])

    zero = node.execute(model=base, lora_name="cosmos3_test_a.safetensors", strength=0.0).result[0]
    v0, s0 = ours_with(host, zero)
    assert torch.equal(v0, plain_v) and torch.equal(s0, plain_s)
    again_v, again_s = ours_with(host, base)  # ComfyUI restored the original weights
    assert torch.equal(again_v, plain_v) and torch.equal(again_s, plain_s)


def lora_graph(strength: float, lora: str = "cosmos3_test_a.safetensors") -> dict:
    g = shrink_api(load_api("t2v"), prefix="cosmos3_lora/t2v", prompt_suffix=" (lora)")
    (loader,) = [k for k, v in g.items() if v["class_type"] == "Cosmos3Loader"]
    g["90"] = {"class_type": "Cosmos3LoraLoader",
               "inputs": {"model": [loader, 0], "lora_name": lora, "strength": strength}}
    for nid, node in g.items():
        if nid != "90" and node["inputs"].get("model") == [loader, 0]:
            node["inputs"]["model"] = ["90", 0]
    return g


def test_new_strength_reruns_only_the_lora_node(host, lora_setup):
    from test_nodes import run

    assert run(host, lora_graph(1.0))[0]
    ok, outputs, messages, rec = run(host, lora_graph(0.25))
    assert ok, messages
    (loader,) = [k for k, v in lora_graph(0).items() if v["class_type"] == "Cosmos3Loader"]
    cached = [n for e, d in messages if e == "execution_cached" for n in d["nodes"]]
    assert loader in cached and "90" in rec.executing(), (cached, rec.executing())


def test_bad_lora_through_the_node_names_node_file_and_fix(host, lora_setup):
    _, loras = lora_setup
    save_file({"transformer.unet.mid.lora_A.weight": torch.zeros(2, 8),
               "transformer.unet.mid.lora_B.weight": torch.zeros(8, 2)}, str(loras / "cosmos3_test_other.safetensors"))
    (loras / "cosmos3_test_broken.safetensors").write_bytes(b"not a safetensors file" * 10)
    for name, fix in (("cosmos3_test_other.safetensors", "another model"),
                      ("cosmos3_test_broken.safetensors", "download it again")):
        ok, _, messages = host.run(lora_graph(1.0, name), prompt_id=str(uuid.uuid4()))
        assert not ok
        err = next(d for e, d in messages if e == "execution_error")
        assert err["node_type"] == "Cosmos3LoraLoader", err
        msg = err["exception_message"]
        assert msg.startswith("Cosmos3LoraLoader: LoRA " + name) and fix in msg, msg
    assert host.run_ok(lora_graph(1.0))  # the next run works


def test_lora_on_fp8_stored_weights_runs(host, lora_setup):
    """ComfyUI patches FP8-stored weights too (it computes the patch in fp32 and rounds back to FP8); strength 0
    on FP8 is tests/test_lora_formats.py's."""
    g = lora_graph(1.0)
    (loader,) = [k for k, v in g.items() if v["class_type"] == "Cosmos3Loader"]
    g[loader]["inputs"]["weight_dtype"] = "fp8_e4m3fn"
    assert host.run_ok(g)

"""GGUF weights: our dequantization equals the ``gguf`` package's bit for bit, the converter writes what its docstring
says, a GGUF load computes exactly with the dequantized weights and stays near the fp32 checkpoint, LoRA adds on top,
and every broken or foreign file is one ``CheckpointError`` naming the file and the fix.

The reference is the ``gguf`` package (``gguf.quants.quantize`` / ``dequantize``, ``GGUFWriter``); K-quant test blocks
(which ``gguf`` cannot quantize) are random bytes with finite fp16 scales, the only constraint of the format.
"""

from __future__ import annotations

import json
import struct

import gguf
import numpy as np
import pytest
import torch
from test_transformer_parity import ours_step

from cosmos3_core.config import CheckpointError
from cosmos3_core.model.gguf_file import ARCHITECTURE, CONFIG_KEY, read_gguf
from cosmos3_core.model.gguf_quants import BY_NAME, QUANTIZED, dequantize
from cosmos3_core.model.gguf_write import write_gguf
from cosmos3_core.model.loader import load_transformer
from support.compare import rel

T = gguf.GGMLQuantizationType
WRITTEN = ("Q8_0", "Q5_1", "Q5_0", "Q4_1", "Q4_0")
K_QUANTS = ("Q4_K", "Q5_K", "Q6_K")
# byte offsets of the fp16 scale fields of one block, per type (ggml-common.h)
HALF_FIELDS = {"Q8_0": (0,), "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q4_K": (0, 2),
               "Q5_K": (0, 2), "Q6_K": (208,)}


def random_blocks(kind: str, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """``[rows, cols / block · type_size]`` random bytes of type ``kind`` whose fp16 scales are finite, small."""
    qt = BY_NAME[kind]
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(rows * cols // qt.block, qt.type_size), dtype=np.uint8)
    for at in HALF_FIELDS[kind]:
        blocks[:, at:at + 2] = (rng.uniform(-1e-3, 1e-3, blocks.shape[0]).astype(np.float16)
                                .view(np.uint8).reshape(-1, 2))
    return blocks.reshape(rows, -1)


def ours(data: np.ndarray, kind: str, shape) -> np.ndarray:
    return dequantize(torch.from_numpy(np.ascontiguousarray(data)).view(torch.uint8), BY_NAME[kind], shape).numpy()


@pytest.mark.parametrize("kind", WRITTEN)
def test_dequantize_equals_gguf_on_gguf_quantized_weights(kind):
    values = np.random.default_rng(1).standard_normal((48, 256)).astype(np.float32) * 0.05
    values[3, :32] = 0.0  # an all-zero block (scale 0)
    q = gguf.quants.quantize(values, T[kind])
    reference = gguf.quants.dequantize(q, T[kind])
    assert np.array_equal(ours(q, kind, values.shape), reference)
    assert np.abs(reference - values).max() < 0.05  # the reference really reconstructs the weights


@pytest.mark.parametrize("kind", (*K_QUANTS, *WRITTEN))
def test_dequantize_equals_gguf_on_any_block_bytes(kind):
    data = random_blocks(kind, 6, 512, seed=2)
    reference = gguf.quants.dequantize(data, T[kind])
    got = ours(data, kind, reference.shape)
    assert np.isfinite(reference).all() and np.array_equal(got, reference)


def test_plain_types_read_as_stored():
    values = np.random.default_rng(3).standard_normal((4, 8)).astype(np.float32)
    for kind, data in (("F32", values), ("F16", values.astype(np.float16)),
                       ("BF16", gguf.quants.quantize(values, T.BF16))):
        raw = np.ascontiguousarray(data).view(np.uint8)
        assert np.array_equal(ours(raw, kind, values.shape), gguf.quants.dequantize(data, T[kind]))


# -------------------------------------------------------------------------------------------------- files

@pytest.fixture(scope="module")
def nano(tiny_checkpoint):
    return tiny_checkpoint("nano", seed=0)  # the one the node tests copy (sound: the builder's default for Nano)


@pytest.fixture(scope="module")
def q8_file(nano, tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "nano-q8.gguf"
    write_gguf(nano, path, "Q8_0")
    return path


def test_converter_writes_the_documented_types_and_metadata(nano, q8_file):
    f = read_gguf(q8_file)
    assert f.architecture == ARCHITECTURE and f.name == nano.name
    assert f.config == json.loads((nano / "transformer" / "config.json").read_text())
    assert "lm_head.weight" not in f.tensors
    kinds = {name: t.qtype.name for name, t in f.tensors.items()}
    assert kinds["layers.0.self_attn.to_q.weight"] == "Q8_0" and kinds["layers.1.mlp_moe_gen.down_proj.weight"] == "Q8_0"
    assert kinds["layers.0.input_layernorm.weight"] == "F32"  # 1-D
    assert kinds["embed_tokens.weight"] == "F32" and kinds["time_embedder.linear_1.weight"] == "F32"  # fp32 source
    assert {k for name, k in kinds.items() if name.startswith("layers.") and "proj" in name} == {"Q8_0"}
    raw = gguf.GGUFReader(str(q8_file))
    assert raw.get_field(CONFIG_KEY) is not None and raw.get_field("general.file_type").contents() == 7


def _contents(path) -> tuple[dict, dict]:
    """A GGUF file as the ``gguf`` package's reader sees it: its metadata, and each tensor's (type, shape, bytes)."""
    reader = gguf.GGUFReader(str(path))
    fields = {key: field.contents() for key, field in reader.fields.items()}
    tensors = {t.name: (t.tensor_type, tuple(t.shape), np.array(t.data)) for t in reader.tensors}
    return fields, tensors


def test_the_converter_takes_the_transformer_folder_itself(nano, q8_file, tmp_path, capsys):
    """``--checkpoint <ckpt>/transformer`` (which the config check accepts) writes the file that ``<ckpt>`` writes:
    the same metadata (the checkpoint's name included) and the same tensors, type, shape and bytes."""
    from cosmos3_core.cli.gguf import main

    out = tmp_path / "from-transformer.gguf"
    assert main(["--checkpoint", str(nano / "transformer"), "--type", "Q8_0", "--out", str(out)]) == 0, \
        capsys.readouterr().err
    fields, tensors = _contents(out)
    ref_fields, ref_tensors = _contents(q8_file)
    assert fields == ref_fields and fields["general.name"] == nano.name
    assert sorted(tensors) == sorted(ref_tensors) and len(tensors) > 60
    for name, (kind, shape, data) in tensors.items():
        ref_kind, ref_shape, ref_data = ref_tensors[name]
        assert (kind, shape) == (ref_kind, ref_shape) and np.array_equal(data, ref_data), name
    assert {kind for kind, _, _ in tensors.values()} == {T.Q8_0, T.F32}


def test_a_gguf_load_computes_with_the_dequantized_weights(nano, q8_file):
    """The GGUF model equals, bit for bit, the fp32 model whose linear weights are gguf's dequantization of the file;
    and stays within 3e-2 (relative) of the fp32 checkpoint at Q8_0."""
    quant = load_transformer(nano, dtype=torch.float32, skip_modules=("lm_head",), gguf_file=q8_file)
    dense = load_transformer(nano, dtype=torch.float32, skip_modules=("lm_head",))
    exact = load_transformer(nano, dtype=torch.float32, skip_modules=("lm_head",))
    reader = gguf.GGUFReader(str(q8_file))
    with torch.no_grad():
        for t in reader.tensors:
            if t.tensor_type == T.Q8_0:
                w = exact.get_submodule(t.name[: -len(".weight")]).weight
                w.copy_(torch.from_numpy(gguf.quants.dequantize(t.data, T.Q8_0)))
    layer = quant.layers[0].mlp_moe_gen.up_proj
    assert layer.weight.dtype == torch.uint8 and layer.qtype.name == "Q8_0"  # kept quantized in memory
    g = torch.Generator().manual_seed(5)
    args = ([torch.randint(0, 100, (13,), generator=g).tolist()], torch.randn(1, 48, 2, 4, 6, generator=g), 600, 24.0,
            (), torch.randn(64, 5, generator=g))
    q_out, e_out, d_out = (ours_step(m, *args) for m in (quant, exact, dense))
    assert torch.equal(q_out.vision[0], e_out.vision[0]) and torch.equal(q_out.sound[0], e_out.sound[0])
    assert 0 < rel(q_out.vision[0], d_out.vision[0]) <= 3e-2


def test_generation_from_a_q8_0_gguf_stays_closer_to_fp32_than_bf16(nano, q8_file):
    """A whole T2AV run (3 steps) from the Q8_0 GGUF (fp32 compute, the rest of the checkpoint from the Hub folder)
    is within 2e-2 (relative) of the fp32 checkpoint's run — closer than the bf16 checkpoint's run is (measured on
    this tiny random checkpoint: Q8_0 1.1e-2, bf16 2.1e-2; Q4_0 1.8e-1, which random weights make its worst case)."""
    from cosmos3_core.api import generate
    from cosmos3_core.pipeline import Cosmos3Pipeline
    from cosmos3_core.request import Request

    request = Request(prompt="a red robot", height=64, width=96, num_frames=9, steps=3, seed=5, sound=True)
    runs = {name: generate(Cosmos3Pipeline.load(nano, **kw), request, decode=False) for name, kw in (
        ("fp32", dict(dtype=torch.float32)), ("bf16", dict(dtype=torch.bfloat16)),
        ("q8", dict(dtype=torch.float32, gguf_file=q8_file)))}
    ref = runs["fp32"]
    q8 = rel(runs["q8"].latents, ref.latents)
    assert q8 <= 2e-2 and rel(runs["q8"].sound_latent, ref.sound_latent) <= 2e-2
    assert q8 < rel(runs["bf16"].latents.float(), ref.latents)


def test_lora_adds_on_top_of_quantized_weights(nano, q8_file):
    from cosmos3_core.model.lora import LoraPatch, merge_lora

    quant = load_transformer(nano, dtype=torch.float32, skip_modules=("lm_head",), gguf_file=q8_file)
    exact = load_transformer(nano, dtype=torch.float32, skip_modules=("lm_head",))
    with torch.no_grad():
        for name, m in quant.named_modules():
            if getattr(m, "qtype", None) is not None:
                exact.get_submodule(name).weight.copy_(m.dense_weight())
    g = torch.Generator().manual_seed(6)
    name = "layers.1.mlp_moe_gen.up_proj"
    out_f, in_f = exact.get_submodule(name).weight.shape
    patch = LoraPatch("lora", {"up": torch.randn(out_f, 2, generator=g), "down": torch.randn(2, in_f, generator=g)},
                      0.5, "test")
    before = quant.get_submodule(name).weight.clone()
    merge_lora(quant, {name: patch}, 0.8)
    merge_lora(exact, {name: patch}, 0.8)
    assert torch.equal(quant.get_submodule(name).weight, before)  # the blocks are untouched
    x = torch.randn(3, in_f, generator=g)
    assert torch.equal(quant.get_submodule(name)(x), exact.get_submodule(name)(x))


def test_k_quant_gguf_loads_and_runs(nano, tmp_path):
    """A file as llama.cpp's quantize writes them: K-quants where rows are whole 256-blocks, Q8_0 elsewhere, the rest
    F32, without this pack's metadata beyond the architecture; the text tower from the Hub folder."""
    path = tmp_path / "nano-k.gguf"
    dense = load_transformer(nano, dtype=torch.float32, skip_modules=("lm_head",))
    w = gguf.GGUFWriter(str(path), ARCHITECTURE)
    written = {}
    for i, (name, p) in enumerate(sorted(dense.state_dict().items())):
        if "mlp." in name or "self_attn.to_" in name and "add" not in name:
            continue  # left to the Hub folder's safetensors
        if name.startswith("layers.") and p.ndim == 2:
            kind = K_QUANTS[i % 3] if p.shape[1] % 256 == 0 else "Q8_0"
            data = random_blocks(kind, p.shape[0], p.shape[1], seed=i)
            w.add_tensor(name, data, raw_dtype=T[kind])
            written[name] = gguf.quants.dequantize(data, T[kind])
        else:
            w.add_tensor(name, p.numpy())
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    model = load_transformer(nano, dtype=torch.float32, skip_modules=("lm_head",), gguf_file=path)
    kinds = {m.qtype.name for m in model.modules() if getattr(m, "qtype", None) is not None}
    assert kinds == {*K_QUANTS, "Q8_0"}
    for name, values in written.items():
        assert np.array_equal(model.get_submodule(name[:-7]).dense_weight().numpy(), values), name
    assert torch.equal(model.layers[0].mlp.up_proj.weight, dense.layers[0].mlp.up_proj.weight)  # from safetensors
    g = torch.Generator().manual_seed(5)
    out = ours_step(model, [torch.randint(0, 100, (9,), generator=g).tolist()], torch.randn(1, 48, 1, 4, 6), 500,
                    24.0, ())
    assert torch.isfinite(out.vision[0]).all()


# ---------------------------------------------------------------------------------------------- bad input

def _load(nano, path):
    return load_transformer(nano, dtype=torch.float32, skip_modules=("lm_head",), gguf_file=path)


def test_truncated_and_corrupt_files_are_one_message(nano, q8_file, tmp_path):
    data = q8_file.read_bytes()
    cases = {"truncated.gguf": data[: len(data) * 2 // 3], "header.gguf": data[:100], "magic.gguf": b"GGUX" + data[4:],
             "empty.gguf": b""}
    for name, content in cases.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(CheckpointError, match=rf"GGUF file .*{name} is damaged or truncated .*download or "
                                                  r"convert it again"):
            _load(nano, tmp_path / name)
    with pytest.raises(CheckpointError, match="does not exist"):
        _load(nano, tmp_path / "missing.gguf")
    with pytest.raises(CheckpointError, match=r"is a folder, not a \.gguf file; give the \.gguf file's own path "
                                              r"\(in it: empty\.gguf, header\.gguf, magic\.gguf, truncated\.gguf\)"):
        _load(nano, tmp_path)


def _retype(path, dest, tensor: str, type_id: int):
    """A copy of ``path`` whose tensor ``tensor`` is declared as GGML type ``type_id`` (tensor-info bytes edited)."""
    data = bytearray(path.read_bytes())
    key = struct.pack("<Q", len(tensor)) + tensor.encode()
    at = data.index(key) + len(key)
    n_dims = struct.unpack_from("<I", data, at)[0]
    struct.pack_into("<I", data, at + 4 + 8 * n_dims, type_id)
    dest.write_bytes(bytes(data))
    return dest


def test_unknown_and_unsupported_quant_types_are_named(nano, q8_file, tmp_path):
    with pytest.raises(CheckpointError, match=r"uses quantization type id 99 \(unknown to the gguf package\).*"
                                              r"re-quantize"):
        _load(nano, _retype(q8_file, tmp_path / "unknown.gguf", "layers.0.mlp.up_proj.weight", 99))
    path = tmp_path / "q2k.gguf"
    w = gguf.GGUFWriter(str(path), ARCHITECTURE)
    w.add_tensor("layers.0.mlp.up_proj.weight", np.zeros((384, 256 // 256 * 84), np.uint8), raw_dtype=T.Q2_K)
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    with pytest.raises(CheckpointError, match=r"quantization type Q2_K \(tensor 'layers.0.mlp.up_proj.weight'\), "
                                              r"which this pack cannot dequantize \(it reads Q4_0.*Q6_K"):
        _load(nano, path)
    assert set(QUANTIZED) == {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"}


def test_a_gguf_of_another_model_is_refused_by_name(nano, q8_file, tiny_checkpoint, tmp_path):
    path = tmp_path / "wan.gguf"
    w = gguf.GGUFWriter(str(path), "wan")
    w.add_name("Wan2.1-T2V-14B")
    w.add_tensor("blocks.0.self_attn.q.weight", np.zeros((32, 32), np.float32))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    with pytest.raises(CheckpointError, match=r"is a GGUF of 'wan' \(Wan2.1-T2V-14B\), not of a Cosmos3 transformer"):
        _load(nano, path)
    edge = tiny_checkpoint("edge", seed=0)
    with pytest.raises(CheckpointError, match=r"was converted from another Cosmos3 model \(nano\) than the checkpoint "
                                              r"folder .*edge \(.*hidden_act silu vs relu2.*pick the checkpoint folder"):
        load_transformer(edge, dtype=torch.float32, gguf_file=q8_file)


def _dense_as_gguf(nano, path, prefix: str) -> int:
    """A GGUF of architecture ``cosmos3`` holding nano's weights (F32) under another tool's names (``prefix`` +
    the checkpoint key, as ComfyUI's single-file checkpoints name them); returns how many tensors it holds."""
    dense = load_transformer(nano, dtype=torch.float32, skip_modules=("lm_head",))
    w = gguf.GGUFWriter(str(path), ARCHITECTURE)
    for name, p in sorted(dense.state_dict().items()):
        w.add_tensor(prefix + name, p.numpy())
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    return len(dense.state_dict())


def test_a_cosmos3_gguf_with_foreign_tensor_names_names_the_gguf(nano, tmp_path):
    """The file is blamed, not the checkpoint folder: its name, the unexpected names (counted, a few shown) and the
    fix. Loaded with a folder whose transformer/ holds only config.json, the names it leaves missing are counted."""
    path = tmp_path / "comfy-named.gguf"
    n = _dense_as_gguf(nano, path, "model.diffusion_model.")
    fix = r"convert the Hub checkpoint with python -m cosmos3_core\.gguf .*or pick the GGUF made for this model\."
    with pytest.raises(CheckpointError, match=rf"^GGUF file {path}: its tensor names are not those of the Cosmos3 "
                                              rf"transformer that {nano}/transformer/config\.json describes — {n} "
                                              rf"unexpected \(e\.g\. \['model\.diffusion_model\.[^)]*\)\. .*{fix}") as e:
        _load(nano, path)
    assert "missing" not in str(e.value)  # the folder's safetensors hold every weight the model needs
    configs_only = tmp_path / "configs-only"
    (configs_only / "transformer").mkdir(parents=True)
    (configs_only / "transformer" / "config.json").write_bytes((nano / "transformer" / "config.json").read_bytes())
    with pytest.raises(CheckpointError, match=rf"^GGUF file {path}: .* {n} unexpected .*, {n} missing from both the "
                                              r"GGUF and the checkpoint folder \(e\.g\. \['action_modality_embed'.*" + fix):
        load_transformer(configs_only, dtype=torch.float32, skip_modules=("lm_head",), gguf_file=path)


def test_foreign_safetensors_names_still_blame_the_checkpoint_folder(tiny_checkpoint, q8_file):
    """A key the model lacks in transformer/'s safetensors is the folder's fault, with or without a GGUF."""
    from safetensors.torch import save_file

    ckpt = tiny_checkpoint("nano", seed=0, copy=True)
    folder = ckpt / "transformer"
    save_file({"model.diffusion_model.extra.weight": torch.zeros(2, 2)}, str(folder / "extra.safetensors"))
    index = json.loads((folder / "diffusion_pytorch_model.safetensors.index.json").read_text())
    index["weight_map"]["model.diffusion_model.extra.weight"] = "extra.safetensors"
    (folder / "diffusion_pytorch_model.safetensors.index.json").write_text(json.dumps(index))
    for gguf_file in (None, q8_file):
        with pytest.raises(CheckpointError, match=rf"^{folder}: weights do not match config\.json — 0 missing .*1 "
                                                  r"unexpected \(e\.g\. \['model\.diffusion_model\.extra\.weight'\]\)"):
            load_transformer(ckpt, dtype=torch.float32, skip_modules=("lm_head",), gguf_file=gguf_file)


def test_the_converter_command_line(nano, tmp_path, tiny_checkpoint):
    from cosmos3_core.cli.gguf import main

    out = tmp_path / "x.gguf"
    assert main(["--checkpoint", str(nano), "--type", "Q4_0", "--out", str(out)]) == 0
    assert {t.qtype.name for t in read_gguf(out).tensors.values()} == {"Q4_0", "F32"}
    assert main(["--checkpoint", str(nano), "--type", "Q4_0", "--out", str(out)]) == 2  # exists
    fp8 = tmp_path / "fp8"
    from cosmos3_core.testing.fp8 import build_fp8_checkpoint

    build_fp8_checkpoint(nano, fp8)
    assert main(["--checkpoint", str(fp8), "--type", "Q8_0", "--out", str(tmp_path / "y.gguf")]) == 2
    assert not (tmp_path / "y.gguf").exists() and not (tmp_path / "y.gguf.part").exists()


def test_the_converter_names_a_missing_out_folder(nano, tmp_path, capsys):
    """``--out`` in a folder that does not exist (or under a file) is one ``error:`` line naming --out, the path and
    the fix; nothing is written, no folder is created."""
    from cosmos3_core.cli.gguf import main

    out = tmp_path / "no" / "such" / "x.gguf"
    assert main(["--checkpoint", str(nano), "--type", "Q8_0", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == (f"error: --out {out}: the folder {out.parent} does not exist; create that folder first, or give a "
                   "path in an existing folder.\n")
    assert not (tmp_path / "no").exists()
    (tmp_path / "file").write_text("")
    under_file = tmp_path / "file" / "x.gguf"
    assert main(["--checkpoint", str(nano), "--type", "Q8_0", "--out", str(under_file)]) == 2
    assert capsys.readouterr().err == (f"error: --out {under_file}: {tmp_path / 'file'} is a file, not a folder; "
                                       "choose another output path.\n")

"""Config parsing and checkpoint loading: value sets of the three families, key coverage, and clear errors."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from diffusers import Cosmos3OmniTransformer

from cosmos3_core.config import CheckpointError, Cosmos3Config
from cosmos3_core.model.loader import INDEX_FILE, load_transformer
from cosmos3_core.model.transformer import Cosmos3Transformer

SUPER = dict(hidden_size=5120, intermediate_size=25600, num_hidden_layers=64, num_attention_heads=64,
             num_key_value_heads=8, vocab_size=151936, sound_gen=True, sound_dim=64, action_gen=True, action_dim=64,
             rope_scaling={"mrope_interleaved": True, "mrope_section": [24, 20, 20], "rope_type": "default"})
EDGE = dict(hidden_size=2048, intermediate_size=9216, num_hidden_layers=28, num_attention_heads=16,
            num_key_value_heads=8, vocab_size=131072, hidden_act="relu2", qk_norm_for_text=False,
            use_und_k_norm_for_gen=True, rms_norm_eps=1e-5, rope_theta=1e8, rope_axes_dim=[24, 20, 20],
            action_gen=True, action_dim=64, backbone_type="nemotron")


@pytest.fixture(scope="module")
def nano_dir(tiny_checkpoint):
    return tiny_checkpoint("nano", seed=1)


@pytest.mark.parametrize("values", [SUPER, EDGE], ids=["super", "edge"])
def test_full_size_families_have_the_reference_key_set_and_shapes(values):
    """Built on meta, our module tree has exactly diffusers' parameter names and shapes for Super and Edge."""
    ours_cfg = Cosmos3Config.from_dict(values)
    with torch.device("meta"):
        ours = Cosmos3Transformer(ours_cfg)
        ref = Cosmos3OmniTransformer(**{k: v for k, v in values.items() if k != "backbone_type"})
    ours_shapes = {k: tuple(v.shape) for k, v in ours.state_dict().items()}
    ref_shapes = {k: tuple(v.shape) for k, v in ref.state_dict().items()}
    assert ours_shapes == ref_shapes


def test_config_reads_nano_values_and_ignores_legacy_keys(nano_dir):
    raw = json.loads((nano_dir / "transformer" / "config.json").read_text())
    assert "model_type" in raw  # the builder writes legacy keys like the Hub files
    cfg = Cosmos3Config.from_checkpoint(nano_dir)
    assert cfg.rope_axes_dim == (24, 20, 20) and cfg.norm_kind == "qwen" and cfg.sound_gen
    edge = Cosmos3Config.from_dict(EDGE)
    assert edge.norm_kind == "nemotron" and edge.q_width == 2048 and not edge.qk_norm_for_text
    assert Cosmos3Config.from_dict(SUPER).q_width == 8192  # query width ≠ hidden size


def test_missing_required_key_names_file_and_key(nano_dir, tmp_path):
    ckpt = shutil.copytree(nano_dir, tmp_path / "ckpt")
    path = ckpt / "transformer" / "config.json"
    raw = json.loads(path.read_text())
    del raw["num_hidden_layers"]
    path.write_text(json.dumps(raw))
    with pytest.raises(CheckpointError, match=r"config\.json: required key 'num_hidden_layers' is missing"):
        Cosmos3Config.from_checkpoint(ckpt)


def test_config_of_another_model_is_refused(nano_dir, tmp_path):
    ckpt = shutil.copytree(nano_dir, tmp_path / "ckpt")
    shutil.copy(ckpt / "vae" / "config.json", ckpt / "transformer" / "config.json")
    with pytest.raises(CheckpointError, match="AutoencoderKLWan.*another model"):
        load_transformer(ckpt, dtype=torch.float32)


def test_weights_of_another_size_are_refused(nano_dir, tmp_path):
    ckpt = shutil.copytree(nano_dir, tmp_path / "ckpt")
    path = ckpt / "transformer" / "config.json"
    raw = json.loads(path.read_text())
    raw["intermediate_size"] = 512
    path.write_text(json.dumps(raw))
    with pytest.raises(CheckpointError, match="shape .* different models"):
        load_transformer(ckpt, dtype=torch.float32)


def test_missing_shard_is_named(nano_dir, tmp_path):
    ckpt = shutil.copytree(nano_dir, tmp_path / "ckpt")
    index = json.loads((ckpt / "transformer" / INDEX_FILE).read_text())
    shard = sorted(set(index["weight_map"].values()))[1]
    (ckpt / "transformer" / shard).unlink()
    with pytest.raises(CheckpointError, match=f"{shard}.*missing"):
        load_transformer(ckpt, dtype=torch.float32)


def test_truncated_shard_is_reported_as_damaged(nano_dir, tmp_path):
    ckpt = shutil.copytree(nano_dir, tmp_path / "ckpt")
    index = json.loads((ckpt / "transformer" / INDEX_FILE).read_text())
    shard = ckpt / "transformer" / sorted(set(index["weight_map"].values()))[0]
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="damaged or truncated"):
        load_transformer(ckpt, dtype=torch.float32)


def test_missing_transformer_folder(tmp_path):
    with pytest.raises(CheckpointError, match="transformer/config.json"):
        load_transformer(tmp_path, dtype=torch.float32)


def test_dtype_and_skip_list(nano_dir):
    model = load_transformer(nano_dir, dtype=torch.bfloat16, skip_modules=("lm_head",))
    assert model.lm_head is None
    assert model.proj_in.weight.dtype == torch.bfloat16
    assert model.time_embedder.linear_1.weight.dtype == torch.float32  # KEEP_FP32
    assert model.layers[0].self_attn.add_q_proj.weight.device.type == "cpu"
    with pytest.raises(ValueError, match="not skippable"):
        load_transformer(nano_dir, skip_modules=("layers",))


def test_bf16_model_runs_a_step(nano_dir):
    """Smoke check of the mixed-precision path (bf16 weights, fp32 time embedder) — numbers are checked in fp32."""
    from cosmos3_core.model.layout import build_layout

    model = load_transformer(nano_dir, dtype=torch.bfloat16)
    kv = model.prefill([1, 2, 3, 4, 5])
    assert kv.keys.dtype == torch.bfloat16
    layout = build_layout(model.config, [kv.length], (2, 4, 4), 24.0, dtype=torch.bfloat16)
    out = model.denoise_step(torch.randn(1, 48, 2, 4, 4), torch.tensor(900), [kv], layout)
    assert out.vision.dtype == torch.bfloat16 and torch.isfinite(out.vision.float()).all()


@pytest.fixture(scope="module")
def bf16_nano_dir(tmp_path_factory):
    """A tiny Nano whose transformer is stored in bf16, as the released checkpoints (testing/fullsize.py's writer)."""
    from cosmos3_core.testing.fullsize import write_random_checkpoint

    return write_random_checkpoint(tmp_path_factory.mktemp("nano-bf16") / "ckpt", "nano", tiny=True, log=lambda _: None)


@pytest.mark.parametrize("stored", ["fp32", "bf16"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_pipeline_load_equals_diffusers_from_pretrained_bit_for_bit(nano_dir, bf16_nano_dir, stored, dtype):
    """Every tensor ``Cosmos3Pipeline.load`` holds (transformer, VAE, sound decoder) has the dtype, shape and bits of
    the same tensor in diffusers' ``Cosmos3OmniPipeline.from_pretrained(torch_dtype=...)`` of the same folder
    (``time_embedder`` fp32 in both); only ``lm_head`` is left out (generation never reads it). The sound decoder
    always computes in fp32 (``load_sound_decoder``), where diffusers casts it to ``torch_dtype`` too, and holds
    each weight-normed conv's weight as torch's weight norm computes it from the file's ``g`` and ``v``
    (``fold_weight_norm``): its reference is diffusers' fp32 tokenizer of the folder, the weights through torch's
    own ``WeightNorm.compute_weight``."""
    from diffusers import Cosmos3AVAEAudioTokenizer, Cosmos3OmniPipeline
    from torch.nn.utils.weight_norm import WeightNorm

    from cosmos3_core.pipeline import Cosmos3Pipeline

    ckpt = nano_dir if stored == "fp32" else bf16_nano_dir
    ours = Cosmos3Pipeline.load(ckpt, dtype=dtype, device="cpu")
    ref = Cosmos3OmniPipeline.from_pretrained(str(ckpt), torch_dtype=dtype, enable_safety_checker=False)
    sound = Cosmos3AVAEAudioTokenizer.from_pretrained(ckpt / "sound_tokenizer", torch_dtype=torch.float32)
    sound_state = {**sound.state_dict(), **{f"{n}.{h.name}": h.compute_weight(m) for n, m in sound.named_modules()
                                            for h in m._forward_pre_hooks.values() if isinstance(h, WeightNorm)}}
    pairs = [(ours.transformer, ref.transformer.state_dict()), (ours.vae.vae, ref.vae.state_dict()),
             (ours.sound_decoder.tokenizer, sound_state)]
    for mine, b in pairs:
        a = mine.state_dict()
        extra = {k for k in set(b) - set(a) if not k.endswith(("weight_g", "weight_v"))}
        assert set(a) <= set(b) and all(k.startswith("lm_head.") for k in extra), (sorted(set(a) - set(b)), extra)
        for k, v in a.items():
            w = b[k]
            assert v.dtype == w.dtype and v.shape == w.shape and torch.equal(v, w), (type(mine).__name__, k, v.dtype, w.dtype)
    assert ours.transformer.time_embedder.linear_1.weight.dtype == torch.float32
    assert ours.sound_decoder.dtype == torch.float32 and ours.vae.dtype == dtype


def test_vae_and_sound_decoder_are_built_from_their_safetensors_and_decode_as_diffusers(nano_dir, monkeypatch, caplog):
    """``load_vae`` / ``load_sound_decoder`` never call diffusers' ``from_pretrained`` (whose load without
    ``accelerate`` builds the module with random weights first and warns twice per checkpoint), warn about nothing
    (``torch.nn.utils.weight_norm``'s deprecation included), leave no tensor on the ``meta`` device, and decode a
    latent exactly as the modules ``from_pretrained`` builds (diffusers' own ``decode`` on both)."""
    import warnings

    from diffusers import AutoencoderKLWan, Cosmos3AVAEAudioTokenizer
    from diffusers.models.modeling_utils import ModelMixin

    from cosmos3_core.vae.audio import load_sound_decoder
    from cosmos3_core.vae.video import load_vae

    refs = {"vae": AutoencoderKLWan.from_pretrained(nano_dir / "vae"),
            "sound": Cosmos3AVAEAudioTokenizer.from_pretrained(nano_dir / "sound_tokenizer")}

    def refuse(*args, **kwargs):
        raise AssertionError("from_pretrained was called")

    monkeypatch.setattr(ModelMixin, "from_pretrained", classmethod(refuse))
    with warnings.catch_warnings(record=True) as seen, caplog.at_level("WARNING"):
        warnings.simplefilter("always")
        mine = {"vae": load_vae(nano_dir).vae, "sound": load_sound_decoder(nano_dir).tokenizer}
    assert not [str(w.message) for w in seen] and not caplog.records, ([str(w.message) for w in seen], caplog.text)
    for module in mine.values():
        assert not module.training
        assert all(t.device.type == "cpu" for t in [*module.parameters(), *module.buffers()])
    g = torch.Generator().manual_seed(0)
    latent = torch.randn(1, 48, 2, 4, 6, generator=g)
    sound = torch.randn(1, 64, 5, generator=g)
    with torch.no_grad():
        assert torch.equal(mine["vae"].decode(latent).sample, refs["vae"].decode(latent).sample)
        assert torch.equal(mine["sound"].decode(sound), refs["sound"].decode(sound))

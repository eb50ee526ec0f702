"""Tiny random-weight checkpoint builder (cosmos3_core.testing.tiny) loads through diffusers/transformers and runs.

Run: /root/.cache/cosmos3/venv/bin/python -m pytest -q tests/test_tiny_checkpoint.py
"""

import json

import pytest
import torch
from safetensors.torch import load_file

from cosmos3_core.testing.tiny import SCHEDULER_CONFIG, build_tiny_checkpoint, main

diffusers = pytest.importorskip("diffusers")
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def nano_dir(tiny_checkpoint):
    return tiny_checkpoint("nano", sound=True, seed=0)


@pytest.fixture(scope="module")
def edge_dir(tiny_checkpoint):
    return tiny_checkpoint("edge", seed=0)


def _state_dict(ckpt):
    index = json.loads((ckpt / "transformer" / "diffusion_pytorch_model.safetensors.index.json").read_text())
    sd = {}
    for shard in sorted(set(index["weight_map"].values())):
        sd.update(load_file(ckpt / "transformer" / shard))
    assert set(sd) == set(index["weight_map"])
    return sd


def _load_pipe(ckpt):
    return diffusers.Cosmos3OmniPipeline.from_pretrained(ckpt, enable_safety_checker=False)


def test_pipeline_loads_nano_with_sound(nano_dir):
    pipe = _load_pipe(nano_dir)
    assert isinstance(pipe.sound_tokenizer, diffusers.Cosmos3AVAEAudioTokenizer)
    assert pipe.safety_checker is None
    assert pipe.config.default_use_system_prompt is True and pipe.config.use_native_flow_schedule is False
    assert pipe.transformer.config.sound_gen and pipe.transformer.config.sound_dim == 64
    assert list(pipe.transformer.config.rope_axes_dim) == [24, 20, 20]  # derived from rope_scaling
    assert pipe.transformer.dtype == torch.float32


def test_pipeline_loads_edge_without_sound(edge_dir):
    pipe = _load_pipe(edge_dir)
    assert pipe.sound_tokenizer is None
    assert not (edge_dir / "sound_tokenizer").exists()
    assert pipe.config.default_use_system_prompt is False and pipe.config.use_native_flow_schedule is True
    cfg = pipe.transformer.config
    assert cfg.hidden_act == "relu2" and cfg.use_und_k_norm_for_gen and not cfg.qk_norm_for_text
    assert not cfg.sound_gen and cfg.sound_dim is None


@pytest.mark.parametrize("variant", ["nano", "edge"])
def test_components_load_individually(variant, nano_dir, edge_dir):
    ckpt = nano_dir if variant == "nano" else edge_dir
    raw = json.loads((ckpt / "transformer" / "config.json").read_text())
    assert raw["model_type"] == "cosmos3" and raw["use_moe"] is True  # legacy keys must be ignored
    tr = diffusers.Cosmos3OmniTransformer.from_pretrained(ckpt, subfolder="transformer")
    assert tr.config.head_dim == 128 and tr.config.vocab_size % 64 == 0 and tr.config.vocab_size >= 128
    vae = diffusers.AutoencoderKLWan.from_pretrained(ckpt, subfolder="vae")
    assert len(vae.config.latents_mean) == 48 and len(vae.config.latents_std) == 48
    sched = diffusers.UniPCMultistepScheduler.from_pretrained(ckpt, subfolder="scheduler")
    for key, value in SCHEDULER_CONFIG.items():
        if not key.startswith("_"):
            assert sched.config[key] == value, key
    neg = json.loads((ckpt / "assets" / "negative_prompt.json").read_text())
    assert isinstance(neg, dict) and json.dumps(neg)
    if variant == "nano":
        st = diffusers.Cosmos3AVAEAudioTokenizer.from_pretrained(ckpt, subfolder="sound_tokenizer")
        assert st._hop_size == 1920 and st.config.sampling_rate == 48000
        audio = st.decode(torch.randn(1, 64, 5, generator=torch.Generator().manual_seed(0)))
        assert audio.shape == (1, 2, 5 * 1920) and audio.std() > 0


def test_vae_decodes_non_constant(nano_dir):
    vae = diffusers.AutoencoderKLWan.from_pretrained(nano_dir, subfolder="vae")
    with torch.no_grad():
        video = vae.decode(torch.randn(1, 48, 2, 2, 3, generator=torch.Generator().manual_seed(0))).sample
    assert video.shape == (1, 3, 5, 32, 48)
    assert video.std() > 1e-3 and video.std(dim=(3, 4)).min() > 1e-4


def test_text_tokenizer(nano_dir):
    tok_cfg = json.loads((nano_dir / "text_tokenizer" / "tokenizer_config.json").read_text())
    assert tok_cfg["tokenizer_class"] == "PreTrainedTokenizerFast"
    tok = transformers.AutoTokenizer.from_pretrained(nano_dir / "text_tokenizer")
    unk = tok.unk_token_id
    for special in ("<|vision_start|>", "<|im_start|>", "<|im_end|>", "<|endoftext|>"):
        assert tok.convert_tokens_to_ids(special) != unk
    assert tok.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>")
    msgs = [{"role": "system", "content": "You are a helpful assistant who will generate videos from a give prompt."},
            {"role": "user", "content": "a red robot. The video is 0.4 seconds long and is of 24 FPS."}]
    enc = tok.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True, add_vision_id=False,
                                  return_dict=True)
    tokens = tok.convert_ids_to_tokens(enc.input_ids)
    assert tokens[:2] == ["<|im_start|>", "system"] and tokens[-2:] == ["<|im_start|>", "assistant"]
    assert unk not in enc.input_ids[:17]  # the whole system prompt is in-vocabulary
    pipe_tf = json.loads((nano_dir / "transformer" / "config.json").read_text())
    assert len(tok) <= pipe_tf["vocab_size"]


def test_state_dict_keys_and_random_weights(nano_dir, edge_dir):
    index = json.loads((nano_dir / "transformer" / "diffusion_pytorch_model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) >= 2
    nano, edge = _state_dict(nano_dir), _state_dict(edge_dir)
    for sd in (nano, edge):
        assert "layers.0.self_attn.add_q_proj.weight" in sd and "action_proj_in.fc.weight" in sd
        assert all(v.dtype == torch.float32 for v in sd.values())
        norms = [k for k in sd if "norm" in k and sd[k].ndim == 1]
        assert norms and not any(torch.all(sd[k] == 1) for k in norms), "an RMSNorm weight is all ones"
        assert sd["action_modality_embed"].abs().min() > 0
    assert "layers.0.self_attn.k_norm_und_for_gen.weight" in edge
    assert "layers.0.self_attn.k_norm_und_for_gen.weight" not in nano
    assert "layers.0.self_attn.norm_q.weight" in nano and "layers.0.self_attn.norm_q.weight" not in edge
    assert "layers.0.mlp.gate_proj.weight" in nano and "layers.0.mlp.gate_proj.weight" not in edge
    assert "audio_proj_in.weight" in nano and nano["audio_modality_embed"].abs().min() > 0
    assert not any(k.startswith("audio_") for k in edge)
    assert nano["layers.0.self_attn.add_q_proj.weight"].shape == (4 * 128, 256)
    assert nano["layers.0.self_attn.add_k_proj.weight"].shape == (2 * 128, 256)


def _weight_bytes(ckpt):
    return {p.relative_to(ckpt).as_posix(): p.read_bytes() for p in sorted(ckpt.rglob("*.safetensors"))}


def test_deterministic(nano_dir, tmp_path):
    again = build_tiny_checkpoint(tmp_path / "again", variant="nano", seed=0)
    assert _weight_bytes(again) == _weight_bytes(nano_dir)
    other = _weight_bytes(build_tiny_checkpoint(tmp_path / "other", variant="nano", seed=1))
    base = _weight_bytes(nano_dir)
    assert other.keys() == base.keys()
    assert all(other[k] != base[k] for k in base if k.startswith("transformer/"))


def test_edge_with_sound_raises(tmp_path):
    with pytest.raises(ValueError, match="Edge has no sound head"):
        build_tiny_checkpoint(tmp_path / "bad", variant="edge", sound=True)
    with pytest.raises(ValueError, match="Edge has no sound head"):
        main(["--out", str(tmp_path / "bad2"), "--variant", "edge", "--sound"])


def test_cli(tmp_path):
    main(["--out", str(tmp_path / "cli"), "--variant", "edge", "--seed", "3"])
    index = json.loads((tmp_path / "cli" / "model_index.json").read_text())
    assert index["sound_tokenizer"] == [None, None] and index["use_native_flow_schedule"] is True


@pytest.mark.parametrize("variant", ["nano", "edge"])
def test_end_to_end_latent(variant, nano_dir, edge_dir):
    pipe = _load_pipe(nano_dir if variant == "nano" else edge_dir)
    pipe.set_progress_bar_config(disable=True)
    sound = variant == "nano"
    out = pipe(prompt="a red robot walking on the street", negative_prompt=None, height=64, width=96,
               num_frames=9, num_inference_steps=2, guidance_scale=6.0, enable_sound=sound,
               generator=torch.Generator().manual_seed(0), output_type="latent")
    latents = out.video
    assert tuple(latents.shape) == (1, 48, 3, 4, 6)
    assert torch.isfinite(latents).all() and latents.std() > 0
    if sound:  # Ts = ceil(int(9/24*48000)/1920) = 10 latent steps -> 19200 samples, stereo
        assert tuple(out.sound.shape) == (2, 19200) and torch.isfinite(out.sound).all()
    else:
        assert out.sound is None

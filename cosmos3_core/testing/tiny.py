"""Tiny random-weight Cosmos3 checkpoint builder (a test fixture, never a model).

``build_tiny_checkpoint(out_dir, variant="nano"|"edge"|"super", sound=None, seed=0, distilled=False)`` (or
``python -m cosmos3_core.tiny --out DIR [--variant nano|edge|super] [--sound/--no-sound] [--seed N] [--distilled]``)
writes a complete folder in the Hugging Face Hub layout of ``nvidia/Cosmos3-Nano`` (Edge: ``-Edge``)::

    model_index.json                   Cosmos3OmniPipeline components + default_use_system_prompt /
                                       use_native_flow_schedule / enable_safety_checker flags
    transformer/config.json            Cosmos3OmniTransformer config + legacy Hub keys (model_type, use_moe)
    transformer/diffusion_pytorch_model-0000K-of-0000N.safetensors + ...safetensors.index.json  (sharded)
    vae/config.json + diffusion_pytorch_model.safetensors          AutoencoderKLWan, Wan2.2 geometry, tiny widths
    sound_tokenizer/config.json + diffusion_pytorch_model.safetensors  Cosmos3AVAEAudioTokenizer (Nano only);
                                       decoder-only weights like the Hub (encoder_enabled=false)
    text_tokenizer/tokenizer.json, tokenizer_config.json, chat_template.jinja   WordLevel vocab + Qwen chat template
    scheduler/scheduler_config.json    the released UniPC Karras config, verbatim (SCHEDULER_CONFIG)
    assets/negative_prompt.json        a small structured negative (see below)

The layout is defined by diffusers 0.42.1 ``Cosmos3OmniPipeline`` (pipelines/cosmos/pipeline_cosmos3_omni.py),
``Cosmos3OmniTransformer`` (models/transformers/transformer_cosmos3.py), ``AutoencoderKLWan``
(models/autoencoders/autoencoder_kl_wan.py), ``Cosmos3AVAEAudioTokenizer``
(models/autoencoders/autoencoder_cosmos3_audio.py), ``UniPCMultistepScheduler`` and transformers'
``PreTrainedTokenizerFast``. Every component is written with its own ``save_pretrained`` so that file names
and config keys are exactly what those classes read back.

Transformer: real per-head geometry (head_dim 128, mRoPE [24,20,20], GQA 4/2, 48-ch latents, patch 2) at
hidden 256 x 2 layers. Every parameter is overwritten with seeded random values (diffusers' default init has
RMSNorm weights of exactly 1 and zero modality embeddings, which would hide bugs). Weights are fp32 because
the tests run in fp32; the released checkpoints are bf16.

``assets/negative_prompt.json`` is a JSON object (NVIDIA's real file is a much longer structured "bad video"
caption). Consumers pass the whole object re-serialized, ``json.dumps(json.load(f))``, as ``negative_prompt``,
the way diffusers' examples/cosmos3 ``_load_json_caption`` and cosmos-framework's ``negative_prompt_file`` do.

``variant="super"``: Super's config *shape* at tiny size — the q/kv head ratio 8:1 of Super's 64/8 heads and a
query width 1.6x the hidden size (Super: 64·128 = 8192 vs 5120; tiny: 8·128 = 1024 vs 640), Nano's norms and
RoPE. The MLP is narrower than Super's 5x (2x) to keep the file small.

``distilled=True`` writes the layout of NVIDIA's few-step checkpoints (Cosmos3-Super-Text2Image-4Step,
-Image2Video-4Step) as diffusers 0.42.1 ``Cosmos3DistilledModularPipeline`` reads it: a ``modular_model_index.json``
naming that pipeline class and ``Cosmos3DistilledBlocks``, with the configs ``is_distilled`` and
``distilled_sigmas`` (``DISTILLED_SIGMAS`` below), each component's loading spec, and a
``FlowMatchEulerDiscreteScheduler`` with ``stochastic_sampling`` (the SDE re-noising step) in ``scheduler/``. The
sigma values are the four the adsridhar/ComfyUI fork ships for these checkpoints — the real files were
not available here; the parity tests only need *a* fixed schedule read from the files.

Deterministic: the same seed gives byte-identical safetensors (global RNG is forked for default inits).
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib

import torch

_SPECIAL_TOKENS = ["<unk>", "<|endoftext|>", "<|im_start|>", "<|im_end|>",
                   "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
# Whitespace pre-tokenizer splits on \w+|[^\w\s]+: "1.0" -> 1 . 0, but "24" and "720x1280" stay whole
# (unknown words map to <unk>, which is fine for a random model).
_WORDS = (
    # system prompts (the "give" typo is the trained text) + prompt templates, §9
    "You are a helpful assistant who will generate videos images from give prompt . "
    "The video is not seconds long and of FPS This image resolution "
    "system user assistant 0 1 2 3 4 5 6 7 8 9 10 12 16 24 25 30 "
    # JSON captions (action prompts, negative prompt)
    "{ } [ ] : , \" {\" \": \", \"} \"}, [{\" }] "
    "cinematography framing actions time description duration fps H W aspect_ratio "
    # common prompt words
    "the an in on at with and to its over under through near cat dog robot arm person man woman "
    "car street city road walking running driving flying sitting picks up cup table kitchen "
    "red blue green white black small large bright dark sunny night rain snow water ocean forest "
    "camera slowly moves close shot wide view scene light background "
    "blurry low quality distorted static flickering grainy pixelated jerky"
).split()

_NEGATIVE_PROMPT = {
    "summary": "blurry low quality distorted video",
    "artifacts": ["flickering", "grainy", "pixelated"],
    "motion": "static jerky",
}

_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Released Nano scheduler config (as cosmos-framework's diffusers converter writes it), written verbatim.
SCHEDULER_CONFIG = {
    "_class_name": "UniPCMultistepScheduler", "_diffusers_version": "0.42.1",
    "num_train_timesteps": 1000, "prediction_type": "flow_prediction", "use_flow_sigmas": True,
    "use_karras_sigmas": True, "sigma_max": 200.0, "sigma_min": 0.147, "flow_shift": 1.0,
    "solver_order": 2, "solver_type": "bh2", "predict_x0": True, "lower_order_final": True,
    "final_sigmas_type": "zero", "timestep_spacing": "linspace",
}
# Distilled (4-step) layout: the scheduler the distilled blocks expect and the fixed schedule (see docstring).
DISTILLED_SIGMAS = [1.0, 0.9375, 0.8333, 0.625]
DISTILLED_SCHEDULER_CONFIG = {
    "_class_name": "FlowMatchEulerDiscreteScheduler", "_diffusers_version": "0.42.1",
    "num_train_timesteps": 1000, "shift": 1.0, "use_dynamic_shifting": False, "stochastic_sampling": True,
}
DISTILLED_PIPELINE_CLASS = "Cosmos3DistilledModularPipeline"
DISTILLED_BLOCKS_CLASS = "Cosmos3DistilledBlocks"
_LEGACY_TRANSFORMER_KEYS = {"model_type": "cosmos3", "use_moe": True}  # carried by Hub configs, ignored by loaders
_SHARDS = 3  # target shard count for the transformer


def _write_json(path: pathlib.Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2) + "\n")


def transformer_config(variant: str, sound: bool, vocab_size: int, action: bool = True) -> dict:
    """Cosmos3OmniTransformer kwargs: Nano/Edge-shaped hidden 256 (Super-shaped: 640, 8/1 heads), 2 layers,
    real per-head geometry."""
    cfg = dict(
        attention_bias=False, head_dim=128, hidden_size=256, intermediate_size=384,
        num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
        latent_channel=48, latent_patch_size=2, patch_latent_dim=192, base_fps=24, enable_fps_modulation=True,
        unified_3d_mrope_reset_spatial_ids=True, unified_3d_mrope_temporal_modality_margin=15000,
        timestep_scale=0.001, vocab_size=vocab_size, sound_latent_fps=25.0,
        action_gen=action, action_dim=64 if action else None, num_embodiment_domains=32,
        sound_gen=sound, sound_dim=64 if sound else None,
    )
    if variant == "super":  # Super's shape: 64/8 heads -> 8/1, q width 1.6x hidden as 8192 vs 5120
        cfg.update(hidden_size=640, intermediate_size=1280, num_attention_heads=8, num_key_value_heads=1)
    if variant in ("nano", "super"):
        cfg.update(hidden_act="silu", qk_norm_for_text=True, use_und_k_norm_for_gen=False, rms_norm_eps=1e-6,
                   rope_theta=5e6, rope_axes_dim=None,
                   rope_scaling={"mrope_interleaved": True, "mrope_section": [24, 20, 20], "rope_type": "default"})
    else:
        cfg.update(hidden_act="relu2", qk_norm_for_text=False, use_und_k_norm_for_gen=True, rms_norm_eps=1e-5,
                   rope_theta=1e8, rope_axes_dim=[24, 20, 20], rope_scaling=None)
    return cfg


def build_text_tokenizer(out_dir: pathlib.Path) -> int:
    """Write an offline WordLevel tokenizer with a Qwen-style chat template; return its vocab size."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab: dict[str, int] = {}
    for tok in _SPECIAL_TOKENS + _WORDS:
        vocab.setdefault(tok, len(vocab))
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", eos_token="<|im_end|>",
                                  pad_token="<|endoftext|>", additional_special_tokens=_SPECIAL_TOKENS[1:])
    tok.chat_template = _CHAT_TEMPLATE
    tok.save_pretrained(out_dir)
    # transformers 5 writes "TokenizersBackend"; use the class name the Hub configs carry (Edge converter).
    cfg_path = out_dir / "tokenizer_config.json"
    _write_json(cfg_path, {**json.loads(cfg_path.read_text()), "tokenizer_class": "PreTrainedTokenizerFast"})
    return len(vocab)


@torch.no_grad()
def randomize_transformer_(model: torch.nn.Module, gen: torch.Generator) -> None:
    """Overwrite every parameter in registration order with seeded values (see module docstring)."""
    from diffusers.models.transformers.transformer_cosmos3 import DomainAwareLinear

    domain_fan_in = {f"{n}.fc.weight": m.input_size for n, m in model.named_modules()
                     if isinstance(m, DomainAwareLinear)}
    for name, p in model.named_parameters():
        z = torch.randn(p.shape, generator=gen, dtype=torch.float32)
        if name == "embed_tokens.weight":
            new = z
        elif name.endswith("modality_embed"):
            new = 0.1 * z
        elif "norm" in name and p.ndim == 1:  # every RMSNorm / per-head q/k norm weight
            new = 1.0 + 0.1 * z
        elif name in domain_fan_in:  # DomainAwareLinear fc: [domains, in*out], used as x @ W[in, out]
            new = z / math.sqrt(domain_fan_in[name])
        elif name.endswith(".bias") or name.endswith(".bias.weight"):
            new = 0.02 * z
        elif p.ndim == 2:  # nn.Linear [out, in]
            new = z / math.sqrt(p.shape[1])
        else:
            raise RuntimeError(f"randomize_transformer_: no rule for parameter {name} {tuple(p.shape)}")
        p.copy_(new)


def _build_vae(seed: int, gen: torch.Generator):
    from diffusers import AutoencoderKLWan

    latents_mean = (0.2 * torch.randn(48, generator=gen)).tolist()
    latents_std = (0.5 + torch.rand(48, generator=gen)).tolist()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        vae = AutoencoderKLWan(
            base_dim=8, decoder_base_dim=16, z_dim=48, dim_mult=[1, 2, 4, 4], num_res_blocks=1, attn_scales=[],
            temperal_downsample=[False, True, True], is_residual=True, in_channels=12, out_channels=12,
            patch_size=2, scale_factor_spatial=16, scale_factor_temporal=4,
            latents_mean=latents_mean, latents_std=latents_std)
    # Default init is checked to decode random latents to a non-constant video (tests assert it); if a
    # diffusers change ever made it degenerate, add seeded noise here.
    return vae.eval()


def _build_sound_tokenizer(seed: int):
    from diffusers import Cosmos3AVAEAudioTokenizer

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        # Real strides (dec_strides 2,4,5,6,8 => hop 1920 at 48 kHz => 25 latent fps); decoder-only as on the Hub.
        st = Cosmos3AVAEAudioTokenizer(vocoder_input_dim=64, dec_dim=4, enc_dim=4, enc_latent_dim=128,
                                       encoder_enabled=False)
    assert st._hop_size == 1920 and st.config.sampling_rate == 48000
    return st.eval()


def build_tiny_checkpoint(out_dir, variant: str = "nano", sound: bool | None = None,
                          seed: int = 0, distilled: bool = False, action: bool = True) -> pathlib.Path:
    """Write a tiny random Cosmos3 checkpoint folder (Hub layout) to ``out_dir`` and return its path.

    ``action=False`` leaves out the action head (``action_gen`` false), as a checkpoint without world-model modes."""
    from diffusers import Cosmos3OmniTransformer

    if variant not in ("nano", "edge", "super"):
        raise ValueError(f"build_tiny_checkpoint: variant must be 'nano', 'edge' or 'super', got {variant!r}.")
    if sound is None:
        sound = variant in ("nano", "super") and not distilled
    if sound and variant == "edge":
        raise ValueError("build_tiny_checkpoint: Cosmos3-Edge has no sound head; use sound=False "
                         "(or --no-sound) with variant='edge'.")
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)

    # text tokenizer first: its size fixes the transformer vocab (multiple of 64, >= 128)
    n_vocab = build_text_tokenizer(out / "text_tokenizer")
    vocab_size = max(128, -(-n_vocab // 64) * 64)

    cfg = transformer_config(variant, sound, vocab_size, action)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Cosmos3OmniTransformer(**cfg)  # fp32; the released checkpoints are bf16
    randomize_transformer_(model, gen)
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    largest = max(p.numel() * p.element_size() for p in model.parameters())
    model.save_pretrained(out / "transformer", max_shard_size=max(largest, total // _SHARDS))
    cfg_path = out / "transformer" / "config.json"
    saved = json.loads(cfg_path.read_text())
    if cfg["rope_scaling"] is not None:  # Hub Nano config carries only rope_scaling (diffusers derives the axes)
        saved.pop("rope_axes_dim", None)
    _write_json(cfg_path, {**saved, **_LEGACY_TRANSFORMER_KEYS})

    _build_vae(seed, gen).save_pretrained(out / "vae")
    if sound:
        _build_sound_tokenizer(seed).save_pretrained(out / "sound_tokenizer")
    scheduler_config = DISTILLED_SCHEDULER_CONFIG if distilled else SCHEDULER_CONFIG
    _write_json(out / "scheduler" / "scheduler_config.json", scheduler_config)
    _write_json(out / "assets" / "negative_prompt.json", _NEGATIVE_PROMPT)
    components = {
        "scheduler": ["diffusers", scheduler_config["_class_name"]],
        "sound_tokenizer": ["diffusers", "Cosmos3AVAEAudioTokenizer"] if sound else [None, None],
        "text_tokenizer": ["transformers", "PreTrainedTokenizerFast"],
        "transformer": ["diffusers", "Cosmos3OmniTransformer"],
        "vae": ["diffusers", "AutoencoderKLWan"],
    }
    flags = {
        "default_use_system_prompt": variant != "edge",
        "enable_safety_checker": False,
        "use_native_flow_schedule": variant == "edge",
    }
    _write_json(out / "model_index.json", {
        "_class_name": "Cosmos3OmniPipeline", "_diffusers_version": "0.42.1", **flags,
        "safety_checker": [None, None], **components,
    })
    if distilled:
        _write_json(out / "modular_model_index.json", _modular_model_index(flags, components))
    return out


def _modular_model_index(flags: dict, components: dict) -> dict:
    """``modular_model_index.json`` of a distilled checkpoint: pipeline/blocks class, configs, loading specs.

    Each component is ``[library, class, spec]`` with the spec pointing at the Hub repo, as a downloaded copy keeps
    it (diffusers loads the files from the local folder when they are present)."""
    index = {
        "_class_name": DISTILLED_PIPELINE_CLASS, "_diffusers_version": "0.42.1",
        "_blocks_class_name": DISTILLED_BLOCKS_CLASS,
        "default_use_system_prompt": flags["default_use_system_prompt"],
        "enable_safety_checker": flags["enable_safety_checker"],
        "is_distilled": True, "distilled_sigmas": list(DISTILLED_SIGMAS),
    }
    for name, (library, class_name) in components.items():
        if library is None or name == "sound_tokenizer":  # the distilled blocks use no sound tokenizer
            continue
        index[name] = [library, class_name, {
            "pretrained_model_name_or_path": "nvidia/Cosmos3-Super-Text2Image-4Step", "subfolder": name,
            "variant": None, "revision": None, "type_hint": [library, class_name]}]
    return index


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m cosmos3_core.tiny", description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="output checkpoint folder")
    ap.add_argument("--variant", choices=["nano", "edge", "super"], default="nano")
    ap.add_argument("--sound", action=argparse.BooleanOptionalAction, default=None,
                    help="sound head + sound_tokenizer (default: on for nano, off for edge)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--distilled", action="store_true", help="few-step distilled layout (modular_model_index.json)")
    args = ap.parse_args(argv)
    path = build_tiny_checkpoint(args.out, variant=args.variant, sound=args.sound, seed=args.seed,
                                 distilled=args.distilled)
    print(f"wrote tiny Cosmos3-{args.variant} checkpoint to {path}")


if __name__ == "__main__":
    main()

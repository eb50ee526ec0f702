"""Reasoner parts of the tiny random-weight Cosmos3 checkpoint (a test fixture, never a model).

``add_reasoner_parts(checkpoint_dir, variant="nano"|"edge", seed=0)`` extends a folder written by
``cosmos3_core.testing.tiny.build_tiny_checkpoint`` with what transformers' reasoner classes read from the dual-use repo
(docs/architecture.md, "Checkpoint folder")::

    config.json                     Cosmos3OmniConfig (Nano) / Cosmos3EdgeConfig (Edge): text tower = the
                                    transformer's understanding tower, vision tower tiny
    model.safetensors.index.json    reasoner keys -> transformer/<shard> (flat diffusers names) and
                                    vision_encoder/model.safetensors; no generation-tower key is listed
    generation_config.json          eos ids (<|im_end|>, <|endoftext|>)
    model_index.json                (Nano) + ``"vision_encoder": ["transformers", "Qwen3VLVisionModel"]`` as on the Hub
    vision_encoder/config.json + model.safetensors
        nano: ``Qwen3VLVisionModel`` saved by itself — flat keys ``patch_embed.* pos_embed.* blocks.* merger.*
              deepstack_merger_list.*`` (what ``conversion_mapping["cosmos3_omni"]`` re-targets to ``model.visual.*``)
        edge: ``model.visual.*`` + ``model.projector.*`` (Cosmos3EdgeVisionModel + Cosmos3EdgePatchMerger, the
              names ``Cosmos3EdgeForConditionalGeneration`` uses natively); config.json = the full
              Cosmos3EdgeConfig (the projector needs the text width)
    tokenizer.json, tokenizer_config.json, chat_template.jinja, processor_config.json
                                    ``Qwen3VLProcessor`` (Qwen2VL image + Qwen3VL video processors) /
                                    ``Cosmos3EdgeProcessor``, so ``AutoProcessor.from_pretrained(root)`` works
                                    like on the Hub; the tokenizer is ``text_tokenizer/``'s with a multimodal chat
                                    template (text-only rendering unchanged)

How the flat ``transformer/`` keys reach transformers' modules is transformers' own business:
``conversion_mapping.py`` renames ``layers.`` / ``embed_tokens.`` / ``norm.`` to ``model.language_model.*`` and
``to_q/to_k/to_v/to_out`` (+ ``norm_q/norm_k`` Nano, ``mlp.up_proj/down_proj -> fc1/fc2`` Edge), and the
classes' ``_keys_to_ignore_on_load_unexpected`` drop the generation tower. Vision sizes are tiny (hidden 64,
2-3 blocks); the processors keep the real patch 16 / merge 2 geometry with small pixel budgets so tests stay fast.
Every vision parameter is overwritten with seeded values (default inits have unit norms / zero biases).
"""

from __future__ import annotations

import json
import math
import pathlib

import torch

_NEEDED_TOKENS = ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|vision_start|>", "<|vision_end|>",
                  "<|image_pad|>", "<|video_pad|>")

# Qwen3-VL-style multimodal chat template; a plain-string message renders exactly as the tiny text template.
MULTIMODAL_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for item in message['content'] %}"
    "{% if item['type'] == 'image' %}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{% elif item['type'] == 'video' %}{{ '<|vision_start|><|video_pad|><|vision_end|>' }}"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Small pixel budgets (real geometry: patch 16, merge 2 -> 32-pixel blocks).
_IMAGE_SIZE = {"shortest_edge": 32 * 32 * 2, "longest_edge": 32 * 32 * 12}
_VIDEO_SIZE = {"shortest_edge": 32 * 32 * 2, "longest_edge": 32 * 32 * 24}


def _write_json(path: pathlib.Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2) + "\n")


@torch.no_grad()
def _randomize_(module: torch.nn.Module, gen: torch.Generator) -> None:
    """Seeded values for every parameter: norms ~1, biases small, weights ~1/sqrt(fan_in)."""
    for name, p in module.named_parameters():
        z = torch.randn(p.shape, generator=gen, dtype=torch.float32)
        if p.ndim == 1 and ("norm" in name or "layer_norm" in name) and name.endswith("weight"):
            new = 1.0 + 0.1 * z
        elif name.endswith("bias"):
            new = 0.02 * z
        elif "pos_embed" in name or "position_embedding" in name:
            new = 0.5 * z
        elif p.ndim >= 2:
            new = z / math.sqrt(p[0].numel())
        else:
            raise RuntimeError(f"tiny_reasoner: no init rule for {name} {tuple(p.shape)}")
        p.copy_(new)


def _token_ids(tok) -> dict[str, int]:
    ids = {t: tok.convert_tokens_to_ids(t) for t in _NEEDED_TOKENS}
    missing = [t for t, i in ids.items() if i is None or i == tok.unk_token_id]
    if missing:
        raise ValueError(f"add_reasoner_parts: text_tokenizer/ lacks the special tokens {missing}.")
    return ids


def _text_config(variant: str, tcfg: dict, ids: dict[str, int]) -> dict:
    common = dict(vocab_size=tcfg["vocab_size"], hidden_size=tcfg["hidden_size"],
                  intermediate_size=tcfg["intermediate_size"], num_hidden_layers=tcfg["num_hidden_layers"],
                  num_attention_heads=tcfg["num_attention_heads"], num_key_value_heads=tcfg["num_key_value_heads"],
                  head_dim=tcfg["head_dim"], rms_norm_eps=tcfg["rms_norm_eps"], attention_bias=False,
                  pad_token_id=ids["<|endoftext|>"])
    sections = (tcfg.get("rope_scaling") or {}).get("mrope_section") or tcfg.get("rope_axes_dim") or [24, 20, 20]
    rope = {"rope_type": "default", "rope_theta": float(tcfg["rope_theta"]), "mrope_section": list(sections)}
    if variant == "nano":
        rope["mrope_interleaved"] = True
        return dict(common, hidden_act="silu", rope_parameters=rope, max_position_embeddings=32768)
    return dict(common, hidden_act="relu2", rope_parameters=rope, max_position_embeddings=32768,
                eos_token_id=ids["<|im_end|>"], bos_token_id=None)


def _save_processor(root: pathlib.Path, variant: str, tok_dir: pathlib.Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tok_dir), local_files_only=True)
    if variant == "nano":
        from transformers import Qwen2VLImageProcessor, Qwen3VLProcessor, Qwen3VLVideoProcessor

        mean = std = [0.5, 0.5, 0.5]
        image = Qwen2VLImageProcessor(patch_size=16, temporal_patch_size=2, merge_size=2, size=_IMAGE_SIZE,
                                      image_mean=mean, image_std=std)
        video = Qwen3VLVideoProcessor(patch_size=16, temporal_patch_size=2, merge_size=2, size=_VIDEO_SIZE,
                                      image_mean=mean, image_std=std, fps=2, min_frames=4, max_frames=8,
                                      cap_pixels_per_frame=False)
        proc = Qwen3VLProcessor(image_processor=image, tokenizer=tok, video_processor=video,
                                chat_template=MULTIMODAL_CHAT_TEMPLATE)
    else:
        from transformers import Cosmos3EdgeImageProcessor, Cosmos3EdgeProcessor, Cosmos3EdgeVideoProcessor

        image = Cosmos3EdgeImageProcessor(size=_IMAGE_SIZE)
        video = Cosmos3EdgeVideoProcessor(size=_VIDEO_SIZE, fps=2, min_frames=4, max_frames=8)
        proc = Cosmos3EdgeProcessor(image_processor=image, tokenizer=tok, video_processor=video,
                                    chat_template=MULTIMODAL_CHAT_TEMPLATE)
    proc.save_pretrained(str(root))
    cfg_path = root / "tokenizer_config.json"
    if cfg_path.is_file():  # transformers 5 writes "TokenizersBackend"; keep the Hub class name
        _write_json(cfg_path, {**json.loads(cfg_path.read_text()), "tokenizer_class": "PreTrainedTokenizerFast"})


def add_reasoner_parts(checkpoint_dir, variant: str = "nano", seed: int = 0) -> pathlib.Path:
    """Add ``vision_encoder/``, the root reasoner config/index and processor files to a tiny checkpoint."""
    from safetensors import safe_open
    from safetensors.torch import save_file
    from transformers import AutoTokenizer, GenerationConfig

    if variant not in ("nano", "edge"):
        raise ValueError(f"add_reasoner_parts: variant must be 'nano' or 'edge', got {variant!r}.")
    root = pathlib.Path(checkpoint_dir)
    tcfg = json.loads((root / "transformer" / "config.json").read_text())
    if (tcfg["hidden_act"] == "relu2") != (variant == "edge"):
        raise ValueError(f"add_reasoner_parts: {root} holds a {tcfg['hidden_act']} transformer, not {variant}.")
    tok = AutoTokenizer.from_pretrained(str(root / "text_tokenizer"), local_files_only=True)
    ids = _token_ids(tok)
    gen = torch.Generator().manual_seed(seed + 1000)
    text = _text_config(variant, tcfg, ids)
    token_fields = dict(image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
                        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
                        tie_word_embeddings=False)
    venc = root / "vision_encoder"
    venc.mkdir(parents=True, exist_ok=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if variant == "nano":
            from transformers import Cosmos3OmniConfig, Qwen3VLVisionConfig, Qwen3VLVisionModel

            vcfg = Qwen3VLVisionConfig(depth=3, hidden_size=64, intermediate_size=128, num_heads=4,
                                       hidden_act="gelu_pytorch_tanh", patch_size=16, spatial_merge_size=2,
                                       temporal_patch_size=2, out_hidden_size=tcfg["hidden_size"],
                                       num_position_embeddings=64, deepstack_visual_indexes=[0, 1])
            vision = Qwen3VLVisionModel(vcfg).eval()
            _randomize_(vision, gen)
            vision.save_pretrained(str(venc))
            config = Cosmos3OmniConfig(text_config=text, vision_config=vcfg.to_dict(), **token_fields)
            config.architectures = ["Cosmos3OmniForConditionalGeneration"]
        else:
            from transformers import Cosmos3EdgeConfig, Cosmos3EdgeForConditionalGeneration

            vision_cfg = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                              num_patches=16, patch_size=16, spatial_merge_size=2, num_channels=3,
                              hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6)
            config = Cosmos3EdgeConfig(text_config=text, vision_config=vision_cfg, projector_hidden_size=96,
                                       **token_fields)
            config.architectures = ["Cosmos3EdgeForConditionalGeneration"]
            with torch.device("meta"):
                full = Cosmos3EdgeForConditionalGeneration(config)
            parts = torch.nn.ModuleDict({"visual": full.model.visual, "projector": full.model.projector})
            parts.to_empty(device="cpu")
            _randomize_(parts, gen)
            state = {f"model.{k}": v.contiguous() for k, v in parts.state_dict().items()}
            save_file(state, str(venc / "model.safetensors"), metadata={"format": "pt"})
            _write_json(venc / "config.json", config.to_dict())
    config.save_pretrained(str(root))

    # Root index: reasoner keys only (the generation tower is not the reasoner's).
    tindex = json.loads((root / "transformer" / "diffusion_pytorch_model.safetensors.index.json").read_text())
    gen_markers = ("add_", "to_add_out", "norm_added", "moe_gen", "k_norm_und_for_gen")
    weight_map = {}
    for name, shard in tindex["weight_map"].items():
        top = name.split(".")[0]
        if top in ("embed_tokens", "norm", "lm_head") or (top == "layers" and not any(m in name for m in gen_markers)):
            weight_map[name] = f"transformer/{shard}"
    with safe_open(str(venc / "model.safetensors"), framework="pt") as f:
        for name in f.keys():
            weight_map[name] = "vision_encoder/model.safetensors"
    total = sum((root / p).stat().st_size for p in set(weight_map.values()))
    _write_json(root / "model.safetensors.index.json",
                {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))})
    GenerationConfig(eos_token_id=[ids["<|im_end|>"], ids["<|endoftext|>"]], pad_token_id=ids["<|endoftext|>"],
                     do_sample=False).save_pretrained(str(root))
    _save_processor(root, variant, root / "text_tokenizer")
    if variant == "nano":  # the Hub's Nano model_index lists the ViT (diffusers ignores the entry)
        index_path = root / "model_index.json"
        index = json.loads(index_path.read_text())
        _write_json(index_path, {**index, "vision_encoder": ["transformers", "Qwen3VLVisionModel"]})
    return root


def build_tiny_reasoner_checkpoint(out_dir, variant: str = "nano", seed: int = 0) -> pathlib.Path:
    """``build_tiny_checkpoint`` + ``add_reasoner_parts`` (sound only for Nano, as the real repos)."""
    from .tiny import build_tiny_checkpoint

    path = build_tiny_checkpoint(out_dir, variant=variant, seed=seed)
    return add_reasoner_parts(path, variant=variant, seed=seed)


__all__ = ["add_reasoner_parts", "build_tiny_reasoner_checkpoint", "MULTIMODAL_CHAT_TEMPLATE"]

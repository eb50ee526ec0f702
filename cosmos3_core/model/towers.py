"""The two towers of a loaded ``Cosmos3Transformer`` as separate modules, and memory estimates for a model manager.

A Cosmos3 checkpoint holds two full weight sets per layer (docs/architecture.md): the understanding (text) tower —
``embed_tokens``, ``to_q/to_k/to_v/to_out``, ``norm_q/norm_k``, ``k_norm_und_for_gen``, ``mlp``,
``input_layernorm``, ``post_attention_layernorm``, ``norm``, ``lm_head`` — and the generation tower — the
``add_*`` projections, ``to_add_out``, ``norm_added_*``, ``mlp_moe_gen``, the ``*_moe_gen`` norms,
``norm_moe_gen`` and the modality heads. The text tower runs once per prompt (``prefill``); the generation tower
every step. ``tower_module`` returns a view module that *shares* the parameters of one tower, so a model manager
(ComfyUI's ``ModelPatcher``) can keep the generation tower on the GPU and let the text tower go back to the CPU
once its K/V exists — about half of the transformer's weights (Nano: 13.9 of 28.3 GiB bf16).

Moving a view with ``.to()`` replaces ``param.data`` in place, so the full model sees the move. Loose parameters
(``audio_modality_embed``, ``action_modality_embed``) are wrapped in a leaf module so per-module loaders move them.
"""

from __future__ import annotations

import torch
from torch import nn

from ..config import Cosmos3Config
from .transformer import Cosmos3Transformer

_TEXT_ATTN = ("to_q", "to_k", "to_v", "to_out", "norm_q", "norm_k", "k_norm_und_for_gen")
_GEN_ATTN = ("add_q_proj", "add_k_proj", "add_v_proj", "to_add_out", "norm_added_q", "norm_added_k")
_TEXT_LAYER = ("mlp", "input_layernorm", "post_attention_layernorm")
_GEN_LAYER = ("mlp_moe_gen", "input_layernorm_moe_gen", "post_attention_layernorm_moe_gen")
_TEXT_TOP = ("embed_tokens", "norm", "lm_head")
_GEN_TOP = ("norm_moe_gen", "proj_in", "proj_out", "time_embedder", "audio_proj_in", "audio_proj_out",
            "action_proj_in", "action_proj_out")
_GEN_LOOSE = ("audio_modality_embed", "action_modality_embed")

TOWERS = ("text", "generation")


class _Loose(nn.Module):
    """Leaf holder for parameters that sit directly on the transformer."""


def tower_module(model: Cosmos3Transformer, tower: str) -> nn.Module:
    """An ``nn.Module`` sharing exactly the parameters of ``tower`` ("text" or "generation")."""
    if tower not in TOWERS:
        raise ValueError(f"tower={tower!r}; choose one of {TOWERS}.")
    text = tower == "text"
    view = nn.Module()
    for name in _TEXT_TOP if text else _GEN_TOP:
        module = getattr(model, name, None)
        if module is not None:
            view.add_module(name, module)
    layers = nn.ModuleList()
    for layer in model.layers:
        part = nn.Module()
        for name in _TEXT_LAYER if text else _GEN_LAYER:
            part.add_module(name, getattr(layer, name))
        attn = nn.Module()
        for name in _TEXT_ATTN if text else _GEN_ATTN:
            module = getattr(layer.self_attn, name)
            if module is not None:
                attn.add_module(name, module)
        part.add_module("self_attn", attn)
        layers.append(part)
    view.add_module("layers", layers)
    if not text:
        loose = _Loose()
        for name in _GEN_LOOSE:
            if isinstance(getattr(model, name, None), nn.Parameter):
                loose.register_parameter(name, getattr(model, name))
        view.add_module("loose", loose)
    return view


def text_kv_bytes(config: Cosmos3Config, text_length: int, dtype: torch.dtype) -> int:
    """Size of one prompt's ``TextKV`` (keys + values of every layer)."""
    elem = torch.empty((), dtype=dtype).element_size()
    return 2 * config.num_hidden_layers * config.kv_width * text_length * elem


def prefill_memory_required(config: Cosmos3Config, text_length: int, dtype: torch.dtype) -> int:
    """Working memory of ``prefill`` beyond the text tower's weights: activations of one layer plus the K/V."""
    elem = torch.empty((), dtype=dtype).element_size()
    per_token = 4 * config.hidden_size + 2 * config.q_width + 3 * config.intermediate_size
    return text_length * per_token * elem + text_kv_bytes(config, text_length, dtype)


def step_memory_required(
    config: Cosmos3Config, num_tokens: int, text_lengths: list[int] | tuple[int, ...], dtype: torch.dtype
) -> int:
    """Working memory of one ``denoise_step`` beyond the generation tower's weights, with 10 % headroom.

    Per branch and token: the residual stream, its norm and the layer output (3·D), q/k/v and the attention
    output (2·q + 2·kv), the MLP's gate/up/activation/product (4·F); plus one branch's concatenated [text | gen] K/V
    for attention, the rope tables and every layer's text K/V. Checked on an H200 (Nano, bf16, both branches,
    torch 2.11): measured 2.73 GiB at 480p/93f and 11.6 GiB at 720p/189f beyond the weights; this gives 3.0 and
    13.4 (the older 3·F/2·D model gave 2.2 and 9.6, and a simulated 16 GiB card ran out of memory on it).
    """
    elem = torch.empty((), dtype=dtype).element_size()
    b = len(text_lengths)
    per_token = 3 * config.hidden_size + 2 * config.q_width + 2 * config.kv_width + 4 * config.intermediate_size
    activations = b * num_tokens * per_token * elem
    branch_kv = 2 * (num_tokens + max(text_lengths)) * config.kv_width * elem
    rope = 2 * b * num_tokens * config.head_dim * elem
    text = sum(text_kv_bytes(config, n, dtype) for n in text_lengths)
    return int(1.1 * (activations + branch_kv + rope + text))

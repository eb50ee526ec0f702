"""The text/generation tower views partition the transformer's parameters, and moving a view moves the model."""

from __future__ import annotations

import torch

from cosmos3_core.model.loader import load_transformer
from cosmos3_core.model.towers import step_memory_required, tower_module


def test_towers_partition_parameters_and_share_storage(tiny_checkpoint):
    for variant in ("nano", "edge"):
        model = load_transformer(tiny_checkpoint(variant), dtype=torch.float32)
        text, gen = tower_module(model, "text"), tower_module(model, "generation")
        ids = lambda m: {id(p) for p in m.parameters()}  # noqa: E731
        assert ids(text).isdisjoint(ids(gen))
        assert ids(text) | ids(gen) == ids(model)  # every parameter belongs to exactly one tower
        text.to(torch.float64)  # a move of the view is a move of the model's own parameters
        assert model.embed_tokens.weight.dtype == torch.float64
        assert model.layers[0].self_attn.to_q.weight.dtype == torch.float64
        assert model.layers[0].self_attn.add_q_proj.weight.dtype == torch.float32
        # ComfyUI's ModelPatcher moves parameters module by module and skips a module holding parameters of its
        # own *and* children (the loose modality embeddings must sit in a leaf): parameters only at leaves.
        for view in (text, gen):
            for module in view.modules():
                own = list(module.parameters(recurse=False))
                assert not own or not list(module.children()), type(module).__name__


def test_step_memory_estimate_grows_with_tokens_and_branches():
    from cosmos3_core.config import Cosmos3Config

    cfg = Cosmos3Config()
    one = step_memory_required(cfg, 9360, [200], torch.bfloat16)
    two = step_memory_required(cfg, 9360, [200, 50], torch.bfloat16)
    big = step_memory_required(cfg, 44160, [200, 50], torch.bfloat16)
    assert one < two < big
    assert 5 * 2**30 < big < 20 * 2**30  # 720p/189f with guidance: a few GiB of activations, not tens

"""Every tensor a loaded pipeline computes with is a parameter or a buffer of its modules, before and after runs.

ComfyUI's model manager moves a model with ``Module.to`` and counts it by its parameters and buffers; a tensor a module
keeps as a plain attribute (diffusers' ``weight_norm`` hooks write each conv's computed weight so) is neither moved
nor counted: after a run on the GPU it stays there, unseen, when the model is unloaded. Tiny Nano checkpoint, CPU.
"""

from __future__ import annotations

import torch

from cosmos3_core import api
from cosmos3_core.pipeline import Cosmos3Pipeline
from cosmos3_core.request import Request


def _loose_tensors(pipe: Cosmos3Pipeline) -> list[str]:
    """``part:module.attribute`` of every tensor (or list of tensors) held outside parameters and buffers."""
    loose = []
    for part, root in (("transformer", pipe.transformer), ("vae", pipe.vae), ("sound", pipe.sound_decoder)):
        for name, module in root.named_modules():
            for key, value in vars(module).items():
                values = value if isinstance(value, (list, tuple)) else (value,)
                if any(isinstance(v, torch.Tensor) for v in values):
                    loose.append(f"{part}:{name}.{key}")
    return loose


def test_no_module_keeps_a_tensor_the_model_manager_would_not_move(tiny_checkpoint):
    pipe = Cosmos3Pipeline.load(tiny_checkpoint("nano", sound=True), dtype=torch.float32, device="cpu")
    assert _loose_tensors(pipe) == []
    shape = dict(num_frames=9, height=64, width=96, steps=2)
    api.generate(pipe, Request(prompt="a red ball rolls", sound=True, **shape))
    api.generate(pipe, Request(prompt="a red ball rolls", image=torch.rand(64, 96, 3), **shape))
    assert _loose_tensors(pipe) == []

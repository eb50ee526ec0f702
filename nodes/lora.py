"""Cosmos3LoraLoader: COSMOS3_MODEL + a LoRA file (models/loras) + strength → COSMOS3_MODEL with the LoRA patched in.

Glue only: ``cosmos3_core.model.lora`` reads and checks the file (LoRA, LyCORIS LoKr and LoHa, the usual trainer
prefixes) and maps it onto the checkpoint's linear layers; here each layer's patch becomes a ComfyUI weight patch
on clones of the handle's tower ModelPatchers — the generation tower's, and the text tower's for layers of the
understanding tower. Where the host has ComfyUI's weight adapters (``comfy.weight_adapter``: ``LoRAAdapter``,
``LoKrAdapter``, ``LoHaAdapter``) ComfyUI computes the deltas from the factors, in its own patch format (its scale
is ``alpha / dim``, so the core's scale is handed over as ``alpha = scale · dim``); a host without one gets the
core's ``s · ΔW`` as a plain ``diff`` patch. ComfyUI applies the patches when it loads a tower (merged into the
weights, or per call for streamed layers) and restores the original weights from its backup when another clone
loads, so a new strength re-patches without reading the checkpoint again, and LoRA loaders in a chain stack.

Strength 0 adds no patch at all: ComfyUI re-rounds every patched weight to its storage dtype (stochastically, for
FP8), so even a zero patch would move FP8-stored weights.
"""

from __future__ import annotations

import dataclasses
import os

import comfy.utils
import folder_paths
import torch
from comfy_api.latest import io

from ..cosmos3_core.model.lora import LoraError, LoraPatch, check_patch, check_strength, read_lora
from .errors import node_errors
from .types import CATEGORY, Cosmos3Model

NODE = "Cosmos3LoraLoader"
NONE_FOUND = "(no LoRA in models/loras)"


def _adapter_classes() -> dict:
    """kind → the host's weight-adapter class, for the kinds this host has."""
    try:
        import comfy.weight_adapter as wa
    except ImportError:
        return {}
    names = {"lora": "LoRAAdapter", "lokr": "LoKrAdapter", "loha": "LoHaAdapter"}
    return {kind: getattr(wa, cls) for kind, cls in names.items() if hasattr(wa, cls)}


def _core4(t: torch.Tensor | None) -> torch.Tensor | None:
    """A Tucker core as ComfyUI's adapters contract it (``[r, r, k, k]``; a linear layer's is ``1 × 1``)."""
    return None if t is None else t.reshape(*t.shape, 1, 1)


def comfy_patch(patch: LoraPatch, adapters: dict):
    """The ComfyUI patch for one layer: its weight adapter where the host has one, else ``("diff", (s·ΔW,))``."""
    cls, t = adapters.get(patch.kind), patch.tensors
    if cls is None:
        return ("diff", (patch.delta(),))
    if patch.kind == "lora":  # ComfyUI: W += strength · (alpha / rows of down) · up @ down
        return cls(set(), (t["up"], t["down"], patch.scale * t["down"].shape[0], None, None, None))
    if patch.kind == "loha":  # ComfyUI: alpha / rows of w1_b
        return cls(set(), (t["w1_a"], t["w1_b"], patch.scale * t["w1_b"].shape[0], t["w2_a"], t["w2_b"],
                           _core4(t.get("t1")), _core4(t.get("t2")), None))
    # LoKr — ComfyUI: alpha / rows of w2_b when W2 is factorised, else of w1_b, else scale 1 (alpha unused)
    if "t2" in t:  # ComfyUI's Tucker W2 is non-contiguous and its kron fails on it (logged, weight left as is):
        w2 = patch.scale * patch.factor(2)  # hand it the rebuilt W2 with the scale folded in
        return cls(set(), (t.get("w1"), w2, None, t.get("w1_a"), t.get("w1_b"), None, None, None, None))
    dim = t["w2_b"].shape[0] if "w2_b" in t else t["w1_b"].shape[0] if "w1_b" in t else None
    alpha = None if dim is None else patch.scale * dim  # both sides full: the core's scale is 1 too
    return cls(set(), (t.get("w1"), t.get("w2"), alpha, t.get("w1_a"), t.get("w1_b"), t.get("w2_a"), t.get("w2_b"),
                       None, None))


def _linear_layers(patcher) -> dict[str, tuple[str, tuple[int, int]]]:
    """module name (checkpoint naming) → (patch key, (out, in)) for the linear layers a tower patcher manages."""
    out = {}
    for name, module in patcher.model.named_modules():
        if name.startswith("inner.") and isinstance(module, torch.nn.Linear):
            out[name[len("inner."):]] = (f"{name}.weight", (module.out_features, module.in_features))
    return out


class Cosmos3LoraLoader(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        names = folder_paths.get_filename_list("loras") or [NONE_FOUND]
        return io.Schema(
            node_id=NODE,
            display_name="Cosmos3 LoRA Loader",
            category=CATEGORY,
            description="Applies a Cosmos3 LoRA — PEFT/diffusers or kohya LoRA, LyCORIS LoKr (SimpleTuner) or LoHa — "
                        "to the model's weights through ComfyUI's patches; chain several to stack them.",
            inputs=[
                Cosmos3Model.Input("model", tooltip="The loaded checkpoint (or the output of another LoRA loader)."),
                io.Combo.Input("lora_name", options=names,
                               tooltip="A LoRA/LoKr/LoHa safetensors file under models/loras, trained for this "
                                       "Cosmos3 size."),
                io.Float.Input("strength", default=1.0, min=-10.0, max=10.0, step=0.01,
                               tooltip="How strongly the LoRA applies; 0 = off. Changing it does not reload the "
                                       "checkpoint."),
            ],
            outputs=[Cosmos3Model.Output(display_name="model", tooltip="The checkpoint with the LoRA patched in.")],
        )

    @classmethod
    def execute(cls, model, lora_name: str, strength: float = 1.0) -> io.NodeOutput:
        text, gen = model.text_patcher.clone(), model.generation_patcher.clone()
        targets = {**{m: (text, *v) for m, v in _linear_layers(text).items()},
                   **{m: (gen, *v) for m, v in _linear_layers(gen).items()}}
        with node_errors(NODE):
            try:
                strength = check_strength(strength)
            except LoraError as exc:
                raise ValueError(f"{exc} Set strength between -10 and 10.") from exc
            path = _lora_file(lora_name)
            lora = read_lora(path, {m: shape for m, (_, _, shape) in targets.items()})
            if strength == 0.0:  # checked, and off: the model exactly as it came in
                return io.NodeOutput(model)
            # a change that overflows the compute dtype or dwarfs its weight would wreck the output silently
            for module, patch in lora.items():
                patcher, key, _ = targets[module]
                layer = comfy.utils.get_attr(patcher.model, key.rsplit(".", 1)[0])
                scale = getattr(layer, "scale_weight", None)  # an NVIDIA FP8 checkpoint: weight · scale is the weight
                weight = layer.weight if scale is None else layer.weight.float() * scale.float()
                check_patch(patch, weight, module, os.path.basename(path), strength, model.dtype)
        adapters = _adapter_classes()
        patches = {text: {}, gen: {}}
        for module, patch in lora.items():
            patcher, key, _ = targets[module]
            patches[patcher][key] = comfy_patch(patch, adapters)
        for patcher, patch in patches.items():
            if patch:
                patcher.add_patches(patch, strength)
        return io.NodeOutput(dataclasses.replace(model, text_patcher=text, generation_patcher=gen))


def _lora_file(lora_name: str) -> str:
    """The file ``lora_name`` stands for under ComfyUI's loras folders; a folder or a missing name is refused."""
    path = folder_paths.get_full_path("loras", lora_name)
    if path is not None:
        return path
    folder = next((p for base in folder_paths.get_folder_paths("loras")
                   if os.path.isdir(p := os.path.join(base, lora_name))), None)
    if folder is not None:
        raise ValueError(f"lora_name {lora_name!r} is a folder ({folder}), not a LoRA file; pick the .safetensors "
                         "file inside it, or rename the folder.")
    raise ValueError(f"LoRA {lora_name!r} was not found; put the .safetensors file under "
                     f"{', '.join(folder_paths.get_folder_paths('loras'))} and refresh.")

"""Cosmos3LoraLoader: COSMOS3_MODEL + a LoRA file (models/loras) + strength → COSMOS3_MODEL with the LoRA patched in.

Glue only: ``cosmos3_core.model.lora`` reads and checks the file; here its pairs become ComfyUI weight patches
(``comfy.weight_adapter.LoRAAdapter``) on clones of the handle's tower ModelPatchers — the generation tower's, and
the text tower's for pairs on understanding-tower layers. ComfyUI applies them when it loads a tower (merged into the
weights, or per call for streamed layers) and restores the original weights from its backup when another clone loads,
so a new strength re-patches without reading the checkpoint again, and LoRA loaders in a chain stack their patches.
"""

from __future__ import annotations

import dataclasses

import folder_paths
from comfy.weight_adapter import LoRAAdapter
from comfy_api.latest import io

from ..cosmos3_core.model.lora import LoraError, check_fits, read_lora
from .types import CATEGORY, Cosmos3Model

NONE_FOUND = "(no LoRA in models/loras)"


def _linear_shapes(patcher) -> dict[str, tuple[str, tuple[int, ...]]]:
    """module name (checkpoint naming) → (patch key, weight shape) for the 2-D weights a patcher manages."""
    out = {}
    for key, tensor in patcher.model.state_dict(keep_vars=True).items():
        if key.startswith("inner.") and key.endswith(".weight") and tensor.ndim == 2:
            out[key[len("inner."):-len(".weight")]] = (key, tuple(tensor.shape))
    return out


class Cosmos3LoraLoader(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        names = folder_paths.get_filename_list("loras") or [NONE_FOUND]
        return io.Schema(
            node_id="Cosmos3LoraLoader",
            display_name="Cosmos3 LoRA Loader",
            category=CATEGORY,
            description="Applies a PEFT-format Cosmos3 LoRA (as diffusers' load_lora_adapter reads it) to the "
                        "model's weights through ComfyUI's patches; chain several to stack them.",
            inputs=[
                Cosmos3Model.Input("model", tooltip="The loaded checkpoint (or the output of another LoRA loader)."),
                io.Combo.Input("lora_name", options=names,
                               tooltip="A LoRA safetensors file under models/loras, trained for this Cosmos3 size."),
                io.Float.Input("strength", default=1.0, min=-10.0, max=10.0, step=0.01,
                               tooltip="How strongly the LoRA applies; 0 = off. Changing it does not reload the "
                                       "checkpoint."),
            ],
            outputs=[Cosmos3Model.Output(display_name="model", tooltip="The checkpoint with the LoRA patched in.")],
        )

    @classmethod
    def execute(cls, model, lora_name: str, strength: float = 1.0) -> io.NodeOutput:
        path = folder_paths.get_full_path("loras", lora_name)
        if path is None:
            raise ValueError(f"Cosmos3LoraLoader: LoRA {lora_name!r} was not found; put the .safetensors file under "
                             f"{', '.join(folder_paths.get_folder_paths('loras'))} and refresh.")
        text, gen = model.text_patcher.clone(), model.generation_patcher.clone()
        targets = {**{m: (text, *v) for m, v in _linear_shapes(text).items()},
                   **{m: (gen, *v) for m, v in _linear_shapes(gen).items()}}
        try:
            lora = read_lora(path)
            check_fits(lora, {m: shape for m, (_, _, shape) in targets.items()}, lora_name)
        except LoraError as exc:
            raise ValueError(f"Cosmos3LoraLoader: {exc}") from exc
        patches = {text: {}, gen: {}}
        for module, pair in lora.items():
            patcher, key, _ = targets[module]
            # ComfyUI's LoRA patch: W += strength · (alpha / r) · up @ down, so alpha = scale · r
            weights = (pair.up, pair.down, pair.scale * pair.rank, None, None, None)
            patches[patcher][key] = LoRAAdapter(set(), weights)
        for patcher, patch in patches.items():
            if patch:
                patcher.add_patches(patch, float(strength))
        return io.NodeOutput(dataclasses.replace(model, text_patcher=text, generation_patcher=gen))

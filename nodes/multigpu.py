"""Cosmos3GuidanceOnTwoGPUs: run the negative guidance branch on a second local GPU (one replica per device).

Glue only: returns the model handle with a second device set; the sampler then runs the two guidance branches
through ``cosmos3_core.parallel.devices.BranchDevices`` (cond on the model's GPU, uncond on the second one, both
at once). Same outputs as one GPU; the speed-up was never measured (no machine with two GPUs was available, see
README "More than one GPU"). The replica of the generation tower on the second GPU (Nano: ≈14 GiB bf16) is built
on the first guided sampling and stays there while the handle lives; ComfyUI's model management does not see it.
"""

from __future__ import annotations

import torch
from comfy_api.latest import io

from .errors import node_errors
from .types import CATEGORY, Cosmos3Model


class Cosmos3GuidanceOnTwoGPUs(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="Cosmos3GuidanceOnTwoGPUs",
            display_name="Cosmos3 Guidance on Two GPUs",
            category=CATEGORY,
            description="Runs the negative-prompt branch of classifier-free guidance on a second GPU of this "
                        "machine, at the same time as the positive branch on the model's GPU. Same result as one "
                        "GPU; needs two identical GPUs and cfg above 1.",
            inputs=[
                Cosmos3Model.Input("model", tooltip="The loaded checkpoint (on the first GPU)."),
                io.Int.Input("second_gpu", default=1, min=0, max=63,
                             tooltip="CUDA index of the GPU for the negative branch (not the model's own GPU)."),
            ],
            outputs=[Cosmos3Model.Output(display_name="model",
                                         tooltip="The same model, guidance split over two GPUs.")],
        )

    @classmethod
    def execute(cls, model, second_gpu: int) -> io.NodeOutput:
        first = model.generation_patcher.load_device
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        with node_errors("Cosmos3GuidanceOnTwoGPUs"):
            if first.type != "cuda":
                raise ValueError(f"the model runs on {first}, not a GPU; this node needs two local GPUs (remove it, "
                                 "or load the model on a GPU).")
            if second_gpu >= count:
                raise ValueError(f"second_gpu={second_gpu}, but this machine has {count} GPU(s) (indexes "
                                 f"0–{count - 1}); choose another GPU.")
            if second_gpu == (first.index or 0):
                raise ValueError(f"second_gpu={second_gpu} is the model's own GPU; choose a different one.")
        return io.NodeOutput(model.with_branch_devices(torch.device("cuda", second_gpu)))

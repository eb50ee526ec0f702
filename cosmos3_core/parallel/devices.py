"""The two guidance branches on two local devices of one process (ComfyUI's "one model replica per device").

ComfyUI runs one Python process, so ``torch.distributed`` ranks do not fit there. ``BranchDevices`` keeps the
``denoise_step`` contract of the model (like ``ParallelDenoiser``): branch 0 (cond) runs on the model's own device,
branch 1 (uncond) on a replica of the generation tower on a second device, each with its own text K/V. The step
does no host sync, so the kernels of both branches are queued back to back and the two GPUs run concurrently;
branch 1's velocities are copied back to the first device (one copy per step) and stacked as the model would.

The replica holds only the generation tower (the text tower's parameters become ``meta`` tensors in it: the text
K/V comes cached from the first device). Same math as one device running the branches one after the other
(batch 1 each); the batched single-device step rounds its GEMMs differently at the last fp32 bit.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Sequence

import torch

from ..model.layout import GenLayout, select_branch
from ..model.precision import StepPrecision
from ..model.text_kv import TextKV
from ..model.towers import tower_module
from ..model.transformer import Cosmos3Transformer, StepOutput
from ..runtime import RuntimeOptions
from .mesh import check_same_devices, device_description


def replicate_generation_tower(model: Cosmos3Transformer, device: torch.device | str) -> Cosmos3Transformer:
    """A copy of ``model`` whose generation tower lives on ``device``; its text tower is left out (``meta``)."""
    device = torch.device(device)
    memo = {}
    for p in tower_module(model, "text").parameters():
        memo[id(p)] = torch.nn.Parameter(torch.empty_like(p, device="meta"), requires_grad=False)
    for p in tower_module(model, "generation").parameters():
        memo[id(p)] = torch.nn.Parameter(p.detach().to(device, copy=True), requires_grad=False)
    replica = copy.deepcopy(model, memo)
    for module in replica.modules():
        for name, buf in module.named_buffers(recurse=False):
            if buf is not None and buf.device.type != "meta":
                module._buffers[name] = buf.to(device)
    replica.execution_device = device
    return replica


class BranchDevices:
    """``denoise_step`` with branch ``j`` on ``devices[j]`` (``devices[0]`` is where ``model`` runs)."""

    def __init__(self, model: Cosmos3Transformer, devices: Sequence[torch.device | str]):
        devices = [torch.device(d) for d in devices]
        if len(devices) != 2:
            raise ValueError(f"BranchDevices: the two guidance branches need two devices, got {len(devices)}.")
        if devices[0].type == "cuda" and devices[0] == devices[1]:
            raise ValueError(f"BranchDevices: both branches on {devices[0]}; choose a second GPU.")
        for d in devices:
            if d.type == "cuda" and (d.index or 0) >= torch.cuda.device_count():
                raise ValueError(f"BranchDevices: {d} does not exist ({torch.cuda.device_count()} CUDA devices).")
        check_same_devices([device_description(d) for d in devices])
        self.model = model
        self.devices = devices
        self.replicas = [model, replicate_generation_tower(model, devices[1])]
        self._moved: dict[tuple[int, str], tuple] = {}  # (branch, what) → (source, its copy on the branch's device)

    @property
    def config(self):
        return self.model.config

    @property
    def dtype(self) -> torch.dtype:
        return self.model.dtype

    @property
    def device(self) -> torch.device:
        return self.model.device

    def _on_device(self, branch: int, what: str, source, move):
        """``move(source)``, kept while ``source`` stays the same object: the text K/V and the layout move once per
        run, not every step (only the latest copy is kept, so a finished run's copies are freed)."""
        hit = self._moved.get((branch, what))
        if hit is None or hit[0] is not source:
            self._moved[(branch, what)] = None  # free the previous copy first
            hit = self._moved[(branch, what)] = (source, move(source))
        return hit[1]

    @torch.no_grad()
    def denoise_step(
        self,
        latents: torch.Tensor,
        timestep: torch.Tensor,
        text: Sequence[TextKV],
        layout: GenLayout,
        sound: torch.Tensor | None = None,
        action: torch.Tensor | None = None,
        *,
        options: RuntimeOptions,
        precision: StepPrecision | None = None,
    ) -> StepOutput:
        if layout.num_branches == 1:  # a cond-only step (guidance 1, or outside the guidance interval)
            return self.model.denoise_step(latents, timestep, text, layout, sound=sound, action=action,
                                           options=options, precision=precision)
        if layout.num_branches != 2 or len(text) != 2:
            raise ValueError(f"BranchDevices: {len(text)} text entries for {layout.num_branches} branches; "
                             "it runs the two guidance branches.")
        outs = []
        for j, (replica, device) in enumerate(zip(self.replicas, self.devices)):
            kv = self._on_device(j, "text", text[j], lambda t, d=device: t.to(d))
            lay = self._on_device(j, "layout", layout, lambda lo, d=device, j=j: _layout_to(select_branch(lo, j), d))

            def move(x, d=device):
                return None if x is None else x.to(d, non_blocking=True)

            outs.append(replica.denoise_step(move(latents), timestep.to(device), [kv], lay, sound=move(sound),
                                             action=move(action), options=options, precision=precision))
        home = self.devices[0]
        fields = []
        for name in ("vision", "sound", "action"):
            a, b = getattr(outs[0], name), getattr(outs[1], name)
            fields.append(None if a is None else torch.cat([a, b.to(home)]))
        return StepOutput(*fields)


def _layout_to(layout: GenLayout, device: torch.device) -> GenLayout:
    moved = {f.name: getattr(layout, f.name).to(device) for f in dataclasses.fields(layout)
             if isinstance(getattr(layout, f.name), torch.Tensor)}
    return dataclasses.replace(layout, **moved)

"""The ``COSMOS3_MODEL`` handle: one loaded checkpoint under ComfyUI's model management.

Glue only (no tensor math). The core pipeline (``cosmos3_core.pipeline.Cosmos3Pipeline``) is loaded on the
offload device; ComfyUI ``ModelPatcher``s wrap four pieces so ``load_models_gpu`` can move them and evict other
models when VRAM is short, with a memory estimate for the work about to run:

* the text tower (``towers.tower_module(..., "text")``) — loaded for ``Cosmos3TextEncode`` only; once the prompt's
  K/V exists ComfyUI is free to send it back to the CPU when the generation tower needs the room;
* the generation tower — loaded for the sampler;
* the Wan2.2 VAE and the sound decoder — loaded for encode/decode.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import comfy.model_management as mm
import comfy.model_patcher
import comfy.ops
import torch

from ..cosmos3_core.model.loader import read_fp8_checkpoint
from ..cosmos3_core.model.towers import prefill_memory_required, tower_module
from ..cosmos3_core.pipeline import Cosmos3Pipeline


def _unstreamable_tensors(patcher: comfy.model_patcher.ModelPatcher):
    """(module, "parameter" | "buffer", name, tensor) for the tower's tensors that cannot stream and are not on the
    patcher's load device: those of modules without ``comfy_cast_weights`` (RMSNorm weights, embeddings, the loose
    modality parameters — a few KB to MB each)."""
    device = patcher.load_device
    for module in patcher.model.modules():
        if hasattr(module, "comfy_cast_weights"):
            continue
        for name, param in module.named_parameters(recurse=False):
            if param.device != device:
                yield module, "parameter", name, param
        for name, buf in module.named_buffers(recurse=False):
            if buf is not None and buf.device != device:
                yield module, "buffer", name, buf


def _place_unstreamable(patcher: comfy.model_patcher.ModelPatcher) -> None:
    """ComfyUI's partial ("lowvram") load leaves a module that does not fit its budget on the offload device; only
    ``comfy.ops`` layers can then stream their weights per call. The core's other modules cannot, so their own
    tensors follow the tower to the load device (in place: the model and the tower view share the Parameter
    objects; ComfyUI's unload moves the whole tower back)."""
    device = patcher.load_device
    for module, kind, name, tensor in list(_unstreamable_tensors(patcher)):
        if kind == "parameter":
            tensor.data = tensor.data.to(device)
        else:
            module._buffers[name] = tensor.to(device)


_SCALED_FP8_LINEAR: list[type] = []


class StreamingLinear(comfy.ops.disable_weight_init.Linear):
    """ComfyUI's weight-streaming Linear, defined at a module's top level: a compiled generation layer is saved to
    disk whole (kernels/precompiled.py) with the classes of its modules, and torch saves only top-level classes
    (``comfy.ops.disable_weight_init.Linear`` is nested in a class), so with ComfyUI's own class every new server
    process would trace and compile the layer again."""


class CastStreamingLinear(comfy.ops.manual_cast.Linear):
    """ComfyUI's cast-at-each-call Linear (weights stored in another dtype), at top level for the same reason."""


def _scaled_fp8_linear() -> type:
    """ComfyUI's scaled-FP8 linear layer (``scale_weight`` · weight, cast to the compute dtype at each call)."""
    if not _SCALED_FP8_LINEAR:  # built once: the factory logs a line per call
        _SCALED_FP8_LINEAR.append(comfy.ops.scaled_fp8_ops(fp8_matrix_mult=False, scale_input=False).Linear)
    return _SCALED_FP8_LINEAR[0]


def _load(patcher: comfy.model_patcher.ModelPatcher, memory_required: int = 0) -> None:
    """``load_models_gpu`` with room for the work ahead, then whatever of the model cannot stream joins it (the VAE
    and sound decoder are diffusers modules: if ComfyUI ever loads them partially, all of their layers move)."""
    mm.load_models_gpu([patcher], memory_required=memory_required)
    _place_unstreamable(patcher)


class Cosmos3TextTower(torch.nn.Module):
    """Holder of the understanding (text) tower's parameters, named for ComfyUI's log and memory manager."""


class Cosmos3GenerationTower(torch.nn.Module):
    """Holder of the generation tower's parameters (the part LoRAs patch)."""


class Cosmos3WanVAE(torch.nn.Module):
    """Holder of the checkpoint's Wan2.2 VAE."""


class Cosmos3SoundDecoder(torch.nn.Module):
    """Holder of the checkpoint's sound decoder."""


@dataclass
class Cosmos3ModelHandle:
    name: str
    path: Path
    dtype: torch.dtype
    pipeline: Cosmos3Pipeline
    text_patcher: comfy.model_patcher.ModelPatcher
    generation_patcher: comfy.model_patcher.ModelPatcher
    vae_patcher: comfy.model_patcher.ModelPatcher
    sound_patcher: comfy.model_patcher.ModelPatcher | None
    _reasoner: object | None = field(default=None, repr=False, compare=False)
    # Cosmos3GuidanceOnTwoGPUs (nodes/multigpu.py): (model's GPU, second GPU) and the BranchDevices built for them
    branch_devices: tuple[torch.device, torch.device] | None = None
    _branch_split: object | None = field(default=None, repr=False, compare=False)

    @classmethod
    def load(cls, name: str, path: Path, dtype: torch.dtype, device_choice: str,
             storage_dtype: torch.dtype | None = None) -> "Cosmos3ModelHandle":
        # ComfyUI's Linear: when a tower does not fit in VRAM, ModelPatcher loads it partially and these layers
        # stream their weights from the offload device at each call (weight streaming, "lowvram"). Weights stored
        # in another dtype than the compute dtype (fp8, or an NVIDIA FP8 checkpoint's weight + scale) go through
        # ComfyUI's cast-weight layers, which cast at each call and stream the same way.
        # ComfyUI's scaled-FP8 layers only for an NVIDIA FP8 checkpoint (asking ComfyUI for them logs a line).
        cast = storage_dtype is not None and storage_dtype != dtype
        linear = CastStreamingLinear if cast else StreamingLinear
        scaled = _scaled_fp8_linear() if read_fp8_checkpoint(path) is not None else None
        pipe = Cosmos3Pipeline.load(path, dtype=dtype, device=mm.unet_offload_device(), linear=linear,
                                    storage_dtype=storage_dtype, scaled_linear=scaled)
        return cls.from_pipeline(name, path, dtype, pipe, device_choice)

    @classmethod
    def from_pipeline(cls, name: str, path: Path, dtype: torch.dtype, pipe: Cosmos3Pipeline,
                      device_choice: str = "default") -> "Cosmos3ModelHandle":
        """Wrap a pipeline already on the offload device (its transformer built with ``comfy.ops`` Linear)."""
        offload = mm.unet_offload_device()
        load_device = mm.get_torch_device() if device_choice == "default" else torch.device("cpu")
        model = pipe.transformer

        def patcher(holder_cls, module, device, offload_device):
            # ModelPatcher writes `.device` on the module it manages; give it a holder so the core modules'
            # read-only `device` properties stay intact. The holder shares the module's parameters, and its class
            # name is what ComfyUI's log and memory manager show ("Requested to load Cosmos3GenerationTower").
            holder = holder_cls()
            holder.add_module("inner", module)
            return comfy.model_patcher.ModelPatcher(holder, load_device=device, offload_device=offload_device)

        vae_device = mm.vae_device() if device_choice == "default" else torch.device("cpu")
        sound = (patcher(Cosmos3SoundDecoder, pipe.sound_decoder, vae_device, mm.vae_offload_device())
                 if pipe.sound_decoder else None)
        return cls(
            name=name, path=path, dtype=dtype, pipeline=pipe,
            text_patcher=patcher(Cosmos3TextTower, tower_module(model, "text"), load_device, offload),
            generation_patcher=patcher(Cosmos3GenerationTower, tower_module(model, "generation"), load_device,
                                       offload),
            vae_patcher=patcher(Cosmos3WanVAE, pipe.vae, vae_device, mm.vae_offload_device()),
            sound_patcher=sound,
        )

    # ------------------------------------------------------------------ placement
    def load_text_tower(self, text_length: int) -> None:
        _load(self.text_patcher, prefill_memory_required(self.pipeline.config, text_length, self.dtype))

    @property
    def generation_device(self) -> torch.device:
        """Where the generation tower runs once loaded (a run's latents are planned there)."""
        return self.generation_patcher.load_device

    def load_generation_tower(self, memory_required: int) -> None:
        _load(self.generation_patcher, memory_required)
        # a partially loaded tower may leave proj_in streaming from the CPU: say where the work runs
        self.pipeline.transformer.execution_device = self.generation_patcher.load_device

    def load_vae(self, latent_shape, extra_memory: int = 0) -> None:
        """Load the VAE with room for a decode of ``latent_shape`` plus ``extra_memory`` bytes (an encode's clip)."""
        _load(self.vae_patcher, self.pipeline.vae.memory_required(latent_shape) + int(extra_memory))

    def load_sound_decoder(self) -> None:
        if self.sound_patcher is not None:
            _load(self.sound_patcher)

    def with_branch_devices(self, second: torch.device) -> "Cosmos3ModelHandle":
        """This handle, with the negative guidance branch on ``second`` (the same loaded pipeline and patchers)."""
        return dataclasses.replace(self, branch_devices=(self.generation_patcher.load_device, second),
                                   _branch_split=None)

    def branch_denoiser(self):
        """``BranchDevices`` over the transformer when a second GPU is set (its replica built on first use), else
        ``None``: what the sampler hands to ``Cosmos3Pipeline.run`` as the denoiser of a guided run."""
        if self.branch_devices is None:
            return None
        if self._branch_split is None:
            from ..cosmos3_core.parallel.devices import BranchDevices

            self._branch_split = BranchDevices(self.pipeline.transformer, self.branch_devices)
        return self._branch_split

    def get_reasoner(self):
        """The checkpoint's ``cosmos3_core.reasoner.reasoner.Cosmos3Reasoner`` over this handle's transformer (no
        second copy of the text weights), built on first use and cached here; its processor and ``lm_head`` are read
        from ``self.path`` then, the vision encoder on the first image/video."""
        if self._reasoner is None:
            from ..cosmos3_core.reasoner.reasoner import Cosmos3Reasoner
            from ..cosmos3_core.reasoner.vision import load_processor

            self._reasoner = Cosmos3Reasoner(self.pipeline.transformer, load_processor(self.path),
                                             checkpoint_dir=self.path)
        return self._reasoner

    def __repr__(self) -> str:  # shown in ComfyUI's debug output
        return f"Cosmos3ModelHandle({self.name!r}, {self.dtype})"

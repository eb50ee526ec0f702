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

import collections
import contextlib
import dataclasses
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import comfy.model_management as mm
import comfy.model_patcher
import comfy.ops
import comfy.utils
import torch

from ..cosmos3_core.checks import CARD_FIX, TEXT_CARD_FIX, check_card_memory
from ..cosmos3_core.kernels.host_copy import StagedCopier, staging_to
from ..cosmos3_core.model.fp8 import Fp8Linear, quantize_weight
from ..cosmos3_core.model.gguf_quants import GgufLinear
from ..cosmos3_core.model.loader import LinearOps
from ..cosmos3_core.model.towers import prefill_memory_required, tower_module
from ..cosmos3_core.model.weights import cast_linear, linear_call_workspace
from ..cosmos3_core.pipeline import Cosmos3Pipeline

_log = logging.getLogger(__name__)


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
    objects; ComfyUI's unload moves the whole tower back), unpinned first (``_unpin_unstreamable``)."""
    device = patcher.load_device
    tensors = list(_unstreamable_tensors(patcher))
    _unpin_unstreamable(patcher, tensors)
    for module, kind, name, tensor in tensors:
        if kind == "parameter":
            tensor.data = tensor.data.to(device)
        else:
            module._buffers[name] = tensor.to(device)


def _unpin_unstreamable(patcher: comfy.model_patcher.ModelPatcher, tensors: list) -> int:
    """Unpin, through ComfyUI's own bookkeeping (``ModelPatcher.unpin_weight``), each of the unstreamable
    ``tensors`` (``_unstreamable_tensors``' entries) it pinned on the host; returns how many. ComfyUI's partial
    unload pins (``cudaHostRegister``) each parameter it leaves on the host, the smallest modules first; storage
    freed while still registered leaves CUDA a stale registration, and a later host→GPU copy from that reused memory
    fails with "CUDA error: invalid argument" (seen on a simulated 32 GiB card, Super FP8, after the text tower was
    partly unloaded)."""
    params = dict(patcher.model.named_parameters())
    keys = {id(param): key for key, param in params.items()}
    unpinned = [keys[id(t)] for *_, t in tensors if keys.get(id(t)) in patcher.pinned]
    for key in unpinned:
        patcher.unpin_weight(key)
    still = [key for key in unpinned if params[key].is_pinned()]
    if still:  # moved while registered, its freed storage would break a later copy: stop here instead
        raise RuntimeError(f"Cosmos3: ComfyUI could not unpin {len(still)} host weights ({still[0]}, ...) before "
                           "they move to the GPU. Restart ComfyUI with --disable-pinned-memory.")
    if unpinned:
        _log.info("Cosmos3: %d parameters ComfyUI had pinned on the host unpinned before they move to %s",
                  len(unpinned), patcher.load_device)
    return len(unpinned)


_Backup = collections.namedtuple("Dimension", ["weight", "inplace_update"])  # ModelPatcher.backup's entries


class _OwnHostState:
    """``comfy.ops`` layer state held by each layer from the start: ``comfy_cast_weights`` (its class's value),
    ``weight_function`` and ``bias_function`` (empty lists of its own). ComfyUI's unpatch after a partial load
    writes them onto the layer (``wipe_lowvram_weight``); a compiled generation layer guards on whether the layer's
    ``__dict__`` holds them, so a layer that started with only its class's values had every compiled graph made
    again after a small-card episode, and the graph kept on disk replaced by that variant."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.comfy_cast_weights = type(self).comfy_cast_weights
        self.weight_function = []
        self.bias_function = []


class StreamingLinear(_OwnHostState, comfy.ops.disable_weight_init.Linear):
    """ComfyUI's weight-streaming Linear, defined at a module's top level: a compiled generation layer is saved to
    disk whole (kernels/precompiled.py) with the classes of its modules, and torch saves only top-level classes
    (``comfy.ops.disable_weight_init.Linear`` is nested in a class), so with ComfyUI's own class every new server
    process would trace and compile the layer again."""


class CastStreamingLinear(_OwnHostState, comfy.ops.manual_cast.Linear):
    """ComfyUI's cast-at-each-call Linear (weights stored in another dtype), at top level for the same reason."""


class StreamingGgufLinear(_OwnHostState, GgufLinear, comfy.ops.CastWeightBiasOp):
    """The core's GGUF linear (``gguf_quants.GgufLinear``: GGML blocks dequantized at each call) as a ComfyUI layer:
    its bytes stream from the offload device when the tower is partially loaded (``comfy_cast_weights``), and
    ComfyUI's weight patches (LoRA) apply to the dequantized float32 weight at each call (``weight_function``,
    set by ``Cosmos3Patcher``: the blocks themselves are never patched)."""

    def reset_parameters(self):
        return None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        comfy.ops.run_every_op()
        non_blocking = mm.device_supports_non_blocking(x.device)
        weight = mm.cast_to(self.weight, None, x.device, non_blocking=non_blocking)
        bias = None if self.bias is None else mm.cast_to(self.bias, None, x.device, non_blocking=non_blocking)
        return self.forward_with(x, weight, bias, self.weight_function)


class StreamingFp8Linear(_OwnHostState, Fp8Linear, comfy.ops.CastWeightBiasOp):
    """The core's FP8 linear (``fp8.Fp8Linear``: an NVIDIA ModelOpt FP8 layer, or a bf16 checkpoint's weight
    quantized at load for ``fp8_e4m3fn_fast``) as a ComfyUI layer, so that its W8A16 and W8A8 forwards (the step
    policy picks, ``fp8.run_linear``) also run with ComfyUI's streaming and LoRA.

    Streamed (a partially loaded tower): the FP8 weight, bias and scales are copied to the input's device at each
    call. LoRA: a weight patched by ComfyUI gets a new FP8 scale — merged at load (``convert_weight`` dequantizes with
    the layer's scale, ComfyUI adds the patch in float32, ``set_weight`` rounds the result to e4m3 with its own
    ``amax / 448``, as ModelOpt calibrates a weight; ``Cosmos3Patcher`` keeps the old scales to restore), or, for a
    streamed layer, at each call (the patched float32 weight re-quantized the same way). No patch, no change: the
    forwards are the core's, on the same tensors."""

    def reset_parameters(self):
        return None

    def _streamed(self, x: torch.Tensor):
        """(weight, bias, scale_weight, scale_b) on ``x``'s device, a ComfyUI weight patch applied."""
        non_blocking = mm.device_supports_non_blocking(x.device)
        move = lambda t: None if t is None else mm.cast_to(t, None, x.device, non_blocking=non_blocking)  # noqa: E731
        weight, bias = move(self.weight), move(self.bias)
        if self.weight_function:
            dense = weight
            for fn in self.weight_function:  # LowVramPatch: convert_weight, the patch, set_weight(return_weight)
                dense = fn(dense)
            if weight.dtype != torch.float8_e4m3fn:  # a layer the checkpoint keeps unquantized (scale 1)
                return dense, bias, move(self.scale_weight), None
            weight, scale = quantize_weight(dense)
            return weight, bias, scale, scale
        return weight, bias, move(self.scale_weight), move(self.weight_scale_b)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        comfy.ops.run_every_op()
        weight, bias, scale, _ = self._streamed(x)
        return cast_linear(x, weight, scale, bias)

    def w8a8(self, x: torch.Tensor) -> torch.Tensor:
        comfy.ops.run_every_op()
        weight, bias, _, scale_b = self._streamed(x)
        return self.w8a8_with(x, weight, bias, self.activation_scale(x).to(x.device), scale_b)

    def convert_weight(self, weight: torch.Tensor, inplace: bool = False, **kwargs) -> torch.Tensor:
        scale = self.scale_weight.to(device=weight.device, dtype=torch.float32)
        if inplace and weight.dtype == torch.float32:
            weight *= scale
            return weight
        return weight.to(torch.float32) * scale

    def set_weight(self, weight: torch.Tensor, inplace_update: bool = False, seed=None, return_weight: bool = False,
                   **kwargs):
        if return_weight:  # a streamed call: forward re-quantizes the patched float32 weight itself
            return weight
        if self.weight.dtype != torch.float8_e4m3fn:  # a layer the checkpoint keeps unquantized (scale 1)
            weight = weight.to(self.weight.dtype)
            if inplace_update:
                self.weight.data.copy_(weight)
            else:
                self.weight = torch.nn.Parameter(weight, requires_grad=False)
            return None
        w8, scale = quantize_weight(weight)
        self.weight = torch.nn.Parameter(w8, requires_grad=False)
        self.scale_weight = torch.nn.Parameter(scale.to(weight.device), requires_grad=False)
        if self.w8a8_weight_scale is not None:
            self.w8a8_weight_scale = torch.nn.Parameter(scale.to(weight.device), requires_grad=False)


FP8_SCALES = ("scale_weight", "w8a8_weight_scale")


def staging_copier(device_to) -> StagedCopier | None:
    """The pinned staging a load to ``device_to`` moves its weights through: a CUDA device while ComfyUI's pinned
    memory is on (``--disable-pinned-memory`` turns both off), else none (ComfyUI's ``Module.to``)."""
    return staging_to(device_to, pinned_memory_on())


def pinned_memory_on() -> bool:
    """Whether ComfyUI uses pinned host memory (``--disable-pinned-memory`` turns it off): the pack's pinned
    staging follows it."""
    return mm.MAX_PINNED_MEMORY > 0


class Cosmos3Patcher(comfy.model_patcher.ModelPatcher):
    """ComfyUI's ``ModelPatcher`` for the pack's towers. A patched GGUF layer keeps its blocks: the patch is handed
    to the layer as a per-call weight function (as ComfyUI does for streamed layers) instead of being merged; the
    unpatch drops it. Every other weight patches as ComfyUI patches it. The unpatched weights a load moves whole to
    a GPU go through pinned staging buffers (``kernels.host_copy``), not ComfyUI's pageable ``Module.to``, where
    the model's holder says ``stage_weights``: the two towers (faster so on an H100; the VAE's many small tensors
    were slower, so it keeps ``Module.to``: BENCHMARKS, "A restarted server's towers through pinned staging"). Off
    where ComfyUI's pinned memory is off (``--disable-pinned-memory``)."""

    _copier: StagedCopier | None = None  # set for the length of one ``load``

    def load(self, device_to=None, lowvram_model_memory=0, force_patch_weights=False, full_load=False):
        staged = getattr(self.model, "stage_weights", False)  # the towers' holders: where staging was measured to pay
        copier, start = staging_copier(device_to) if staged else None, time.perf_counter()
        self._copier = copier
        try:
            with copier or contextlib.nullcontext():  # waits for the copies; after a failed load, its error stands
                super().load(device_to, lowvram_model_memory=lowvram_model_memory,
                             force_patch_weights=force_patch_weights, full_load=full_load)
        finally:
            self._copier = None
        if copier is not None and copier.staged_bytes:
            _log.info("Cosmos3: %s: %.2f GiB of weights moved to %s through pinned staging; load %.2f s",
                      type(self.model).__name__, copier.staged_bytes / 2**30, device_to, time.perf_counter() - start)

    def patch_weight_to_device(self, key, device_to=None, inplace_update=False):
        if key not in self.patches:  # ComfyUI's load calls this for each weight it moves whole, then Module.to
            if self._copier is not None and device_to is not None:
                param = comfy.utils.get_attr(self.model, key)
                if isinstance(param, torch.nn.Parameter):
                    param.data = self._copier.copy(param.data)
            return
        layer = self._layer(key)
        if key in self.patches and getattr(layer, "qtype", None) is not None and key.endswith(".weight"):
            layer.weight_function = [comfy.model_patcher.LowVramPatch(key, self.patches)]
            return
        if key in self.patches and isinstance(layer, StreamingFp8Linear) and key.endswith(".weight"):
            prefix = key[: -len("weight")]
            for name in FP8_SCALES:  # the patched weight gets new scales (set_weight): keep these to restore
                value = getattr(layer, name)
                if value is not None and prefix + name not in self.backup:
                    self.backup[prefix + name] = _Backup(value, False)
        super().patch_weight_to_device(key, device_to=device_to, inplace_update=inplace_update)

    def unpatch_model(self, device_to=None, unpatch_weights=True):
        super().unpatch_model(device_to=device_to, unpatch_weights=unpatch_weights)
        if unpatch_weights:
            for m in self.model.modules():
                if getattr(m, "qtype", None) is not None:
                    m.weight_function = []

    def _layer(self, key: str):
        name = key.rpartition(".")[0]
        try:
            return self.model.get_submodule(name)
        except AttributeError:
            return None


def card_memory(device: torch.device) -> tuple[int, str] | None:
    """(total bytes, name) of the GPU ``device`` as ComfyUI counts it (its ``--reserve-vram`` aside); None for the
    CPU, whose memory is not a card's."""
    if device.type == "cpu":
        return None
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    return mm.get_total_memory(device), f"{device} ({name})"


def _load(patcher: comfy.model_patcher.ModelPatcher, memory_required: int = 0) -> None:
    """``load_models_gpu`` with room for the work ahead, then whatever of the model cannot stream joins it (the VAE
    and sound decoder are diffusers modules: if ComfyUI ever loads them partially, all of their layers move)."""
    mm.load_models_gpu([patcher], memory_required=memory_required)
    _discard_pinning_error(patcher.load_device)
    _place_unstreamable(patcher)


# what a failed cudaHostRegister leaves pending: cudaErrorInvalidValue, cudaErrorHostMemoryAlreadyRegistered
_PINNING_ERRORS = ("invalid argument", "already mapped", "already registered")


def _discard_pinning_error(device: torch.device) -> None:
    """ComfyUI 0.3.75 pins the weights a partial load leaves on the host with a raw ``cudaHostRegister`` and treats
    a refusal as "not pinned" — but CUDA keeps that error pending, and torch's next checked call on the device would
    raise it as its own (ComfyUI issue 11335; later releases discard it, PR 10738). A checked launch here takes a
    pending pinning error, drops it and says so; any other CUDA error is raised. (The "invalid argument" once seen
    on a simulated 32 GiB card was not this: it was storage freed while registered, ``_unpin_unstreamable``.)"""
    if device.type != "cuda":
        return
    try:
        torch.zeros(1, device=device).add_(1)
    except getattr(torch, "AcceleratorError", RuntimeError) as exc:  # torch < 2.8: a RuntimeError
        if not any(words in str(exc) for words in _PINNING_ERRORS):
            raise
        _log.warning("Cosmos3: dropped the CUDA error ComfyUI's refused weight pinning left pending (%s); those "
                     "weights stream unpinned.", str(exc).splitlines()[0][:200])


class Cosmos3TextTower(torch.nn.Module):
    """Holder of the understanding (text) tower's parameters, named for ComfyUI's log and memory manager."""

    stage_weights = True  # its loads to a GPU go through pinned staging (Cosmos3Patcher)


class Cosmos3GenerationTower(torch.nn.Module):
    """Holder of the generation tower's parameters (the part LoRAs patch)."""

    stage_weights = True


class Cosmos3WanVAE(torch.nn.Module):
    """Holder of the checkpoint's Wan2.2 VAE."""


class Cosmos3SoundDecoder(torch.nn.Module):
    """Holder of the checkpoint's sound decoder."""


class LeastMemory(NamedTuple):
    """What a tower's run needs on its GPU at the least: its ``working`` memory, the tensors that cannot stream
    (``fixed``: norms, embeddings, the loose parameters) and room for the layers ComfyUI streams in at a time
    (``streamed_layer``: the largest one, once per copy stream and once in use)."""

    working: int
    fixed: int
    streamed_layer: int

    def by_part(self) -> dict[str, int]:
        """The parts in words, for the card-too-small message (``checks.check_card_memory``)."""
        return {"working memory": self.working, "weights that cannot stream": self.fixed,
                "the largest streamed layer": self.streamed_layer}


def least_memory(patcher, working: int) -> LeastMemory:
    """The ``LeastMemory`` of the tower ``patcher`` holds, for a run of ``working`` bytes of work."""
    fixed = streamed = 0
    for module in patcher.model.modules():
        size = sum(t.numel() * t.element_size() for t in (*module.parameters(recurse=False),
                                                           *module.buffers(recurse=False)))
        if hasattr(module, "comfy_cast_weights"):
            streamed = max(streamed, size)
        else:
            fixed += size
    return LeastMemory(working, fixed, streamed * (mm.NUM_STREAMS + 1))


def streaming_ops(cast: bool) -> LinearOps:
    """The linear-layer classes the loader builds (top-level, so a compiled layer is saved with them): ComfyUI's
    streaming Linear (``cast``: its cast-at-each-call one, for weights stored in another dtype), the FP8 and the GGUF
    layers."""
    return LinearOps(linear=CastStreamingLinear if cast else StreamingLinear, scaled_linear=StreamingFp8Linear,
                     quantized_linear=StreamingGgufLinear)


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
             storage_dtype: torch.dtype | None = None, gguf_file: Path | None = None,
             fp8_compute: bool = False) -> "Cosmos3ModelHandle":
        # ComfyUI's Linear: when a tower does not fit in VRAM, ModelPatcher loads it partially and these layers
        # stream their weights from the offload device at each call (weight streaming, "lowvram"). Weights stored
        # in another dtype than the compute dtype (fp8, or an NVIDIA FP8 checkpoint's weight + scale) go through
        # ComfyUI's cast-weight layers, which cast at each call and stream the same way.
        # An NVIDIA FP8 checkpoint kept in FP8, or a bf16 one loaded for FP8 compute (fp8_compute, ComfyUI's
        # fp8_e4m3fn_fast): the core's FP8 layers (W8A16 and W8A8 per the step policy) as ComfyUI layers.
        # A GGUF file: every linear layer keeps its GGML blocks and streams them (StreamingGgufLinear); the rest of
        # the checkpoint comes from the folder.
        ops = streaming_ops(cast=storage_dtype is not None and storage_dtype != dtype)
        # The offload device is the GPU under --gpu-only / --highvram: the load's pinned staging follows ComfyUI's
        # pinned-memory switch as the patcher's does.
        pipe = Cosmos3Pipeline.load(path, dtype=dtype, device=mm.unet_offload_device(), ops=ops,
                                    storage_dtype=storage_dtype, fp8_compute=fp8_compute, gguf_file=gguf_file,
                                    pinned_staging=pinned_memory_on())
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
            return Cosmos3Patcher(holder, load_device=device, offload_device=offload_device)

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
        working = (prefill_memory_required(self.pipeline.config, text_length, self.dtype)
                   + linear_call_workspace(self.text_patcher.model, self.dtype))
        self._load_tower(self.text_patcher, working, TEXT_CARD_FIX)

    def _load_tower(self, patcher, working: int, fix: str = CARD_FIX) -> None:
        """Load a tower with room for ``working`` bytes of work and, should ComfyUI load it partially, for the layers
        it streams in at a time; a card too small for that: one message with the fix, before any CUDA
        out-of-memory error."""
        need = least_memory(patcher, working)
        card = card_memory(patcher.load_device)
        if card is not None:
            check_card_memory(need.by_part(), *card, fix=fix)
        _load(patcher, working + need.streamed_layer)

    @property
    def generation_device(self) -> torch.device:
        """Where the generation tower runs once loaded (a run's latents are planned there)."""
        return self.generation_patcher.load_device

    def load_generation_tower(self, memory_required: int) -> None:
        # room beside the step for the dense weight a quantized layer builds at each call (GGUF, FP8, a cast weight)
        working = memory_required + linear_call_workspace(self.generation_patcher.model, self.dtype)
        self._load_tower(self.generation_patcher, working)
        # a partially loaded tower may leave proj_in streaming from the CPU: say where the work runs
        self.pipeline.transformer.execution_device = self.generation_patcher.load_device

    def prepare(self, part: str, need) -> None:
        """The core's model-manager hook (``sampling.plan.Prepare``): load ``part`` with room for ``need`` before the
        core uses it — ``"text"`` (token count), ``"generation"`` (a plan), ``"vae"`` (latent shape), ``"sound"``."""
        if part == "text":
            self.load_text_tower(text_length=need)
        elif part == "generation":
            self.load_generation_tower(need.memory_required)
        elif part == "vae":
            self.load_vae(need)
        elif part == "sound":
            self.load_sound_decoder()

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

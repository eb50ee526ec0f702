"""Weight storage dtypes for the transformer's linear layers, and NVIDIA's FP8 (ModelOpt) checkpoint layout.

Storage vs compute: a linear layer may keep its weight in a narrower dtype than the one it computes in
(``bf16 | fp16 | fp8_e4m3fn | fp8_e5m2`` storage, bf16 or fp32 compute). Each call casts the weight to the input's
dtype — and multiplies it by a tensorwise ``scale_weight`` when the checkpoint has one — then runs a plain
``F.linear``. Norms, embeddings and the fp32 modules (``layers.KEEP_FP32``) keep the compute dtype. ``CastLinear``
is the core's layer for that; a host passes its own (ComfyUI: ``comfy.ops.manual_cast.Linear`` and
``comfy.ops.scaled_fp8_ops().Linear``, which cast the same way and can also stream from the offload device).

ModelOpt FP8 layout (learned from diffusers 0.42.1 ``quantizers/modelopt`` and ``pipelines/cosmos/mixed_precision.py``,
NVIDIA's ``revision="fp8"`` Cosmos3 checkpoints): ``transformer/config.json`` carries ``quantization_config``
(``quant_method: "modelopt"``, ``quant_type``/``quant_algo`` FP8); each quantized linear ``X`` stores
``X.weight`` as ``float8_e4m3fn`` ``[out, in]`` with one fp32 scale ``X.weight_quantizer._scale`` (the dense weight is
``weight.to(dtype) * scale``, diffusers' ``_w8a16_linear``), plus ModelOpt's calibration buffers
``X.weight_quantizer._amax`` and ``X.input_quantizer._amax`` (the scales of its W8A8 path: ``fp8.Fp8Linear`` reads
them; with any other layer class they are dropped). ModelOpt's Hugging Face export names the scales ``X.weight_scale`` /
``X.input_scale``; both spellings are read. An FP8 weight without a scale is an error, never a silent scale of 1.

``fp8_checkpoint`` reads what a run's FP8 step policy needs from the names and config alone (no weights): the
declared ``quantization_config`` and the quantized layers that carry no activation scale (no W8A8 forward). A bf16
checkpoint loaded for approximate FP8 compute (``fp8_compute``) declares NVIDIA's first/last-3 policy
(``APPROXIMATE_FP8_CONFIG``); an NVIDIA FP8 checkpoint asked for it is refused (it is FP8 already).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..config import CheckpointError
from .precision import FIRST_LAST_N_FP8_POLICY, linear_path

STORAGE_DTYPES = {
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp8_e4m3fn": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
}
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
E4M3_MAX = 448.0

WEIGHT_SCALE_SUFFIXES = (".weight_quantizer._scale", ".weight_scale")
INPUT_SCALE_SUFFIXES = (".input_quantizer._amax", ".input_scale")  # amax, or ModelOpt's HF export's amax / 448
AMAX_SUFFIX = ".weight_quantizer._amax"
# calibration tensors of ModelOpt's W8A8 path: never parameters (the loader gives Fp8Linear layers theirs)
DROPPED_SUFFIXES = (".input_quantizer._amax", ".input_scale", ".output_quantizer._amax", ".input_quantizer._scale",
                    ".output_quantizer._scale", AMAX_SUFFIX)


class CastLinear(nn.Linear):
    """``nn.Linear`` computing in its input's dtype whatever its weight's storage dtype.

    ``scale_weight`` (fp32 scalar, 1 unless the checkpoint is ModelOpt FP8) multiplies the cast weight."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None):
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.scale_weight = nn.Parameter(torch.ones((), device=device, dtype=torch.float32), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cast_linear(x, self.weight, self.scale_weight, self.bias)


def linear_call_workspace(model: nn.Module, dtype: torch.dtype) -> int:
    """The most memory one linear call of ``model`` adds while it runs in ``dtype``, beyond its stored weight, its
    input and its output: the dense weight it builds before the product. A layer that says its own
    (``call_workspace_bytes``: ``GgufLinear``'s dequantized weight) counts that; a layer storing another dtype (an FP8
    or cast weight: ``cast_linear``'s cast and its product with the scale) two weights in ``dtype``; a
    ``CastLinear`` storing ``dtype`` one (the product with the scale). A host reserves it beside a run's working
    memory: the largest layer's, as layers run one at a time."""
    elem = torch.empty((), dtype=dtype).element_size()
    most = 0
    for m in model.modules():
        if hasattr(m, "call_workspace_bytes"):
            most = max(most, m.call_workspace_bytes(dtype))
        elif isinstance(m, nn.Linear) and (m.weight.dtype != dtype or isinstance(m, CastLinear)):
            copies = 2 if m.weight.dtype != dtype else 1
            most = max(most, copies * m.in_features * m.out_features * elem)
    return most


def cast_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear`` of ``x`` with ``weight`` cast to ``x``'s dtype and multiplied by its ``scale`` in that dtype
    (diffusers' ``_w8a16_linear``: an FP8 checkpoint's W8A16 forward)."""
    weight = weight.to(x.dtype) * scale.to(x.dtype)
    return F.linear(x, weight, None if bias is None else bias.to(x.dtype))


def is_modelopt_fp8(config_values: dict, names: set[str] | list[str]) -> bool:
    """True for a transformer folder in the ModelOpt FP8 layout (by its config or by its scale keys)."""
    q = config_values.get("quantization_config") or {}
    method = str(q.get("quant_method", "")).lower()
    algo = str(q.get("quant_algo") or q.get("quant_type") or "").upper()
    if method == "modelopt" or "FP8" in algo:
        return True
    return any(n.endswith(WEIGHT_SCALE_SUFFIXES) for n in names)


# What a bf16 checkpoint loaded with fp8_compute declares: FP8 weights (rounded at load, dynamic activation scales)
# under NVIDIA's step policy.
APPROXIMATE_FP8_CONFIG = {"quant_method": "modelopt", "quant_algo": "FP8",
                          "runtime": {"diffusion_step_policy": FIRST_LAST_N_FP8_POLICY}}


@dataclass(frozen=True)
class Fp8Checkpoint:
    """A transformer's FP8 layout as a run sees it: ``quantization_config`` (declared in ``config.json``; ``{}``
    when only the weights' scale keys show ModelOpt FP8), ``approximate`` (FP8 computed from a bf16 checkpoint) and
    ``weight_only``: the quantized decoder-layer linears without an activation scale (no W8A8 forward)."""

    quantization_config: dict
    approximate: bool = False
    weight_only: tuple[str, ...] = ()


def fp8_checkpoint(config_values: dict, names, *, fp8_compute: bool = False, where: str = "transformer"
                   ) -> Fp8Checkpoint | None:
    """The ``Fp8Checkpoint`` of a transformer folder from its ``config.json`` values and tensor names (None: not
    FP8, nor loaded for approximate FP8 compute)."""
    names = set(names)
    modelopt = is_modelopt_fp8(config_values, names)
    if fp8_compute:
        if modelopt:
            raise CheckpointError(f"{where}: the checkpoint is already NVIDIA FP8 (ModelOpt); load it as it is "
                                  "(weight_dtype auto) — fp8_e4m3fn_fast is FP8 compute for a bf16 checkpoint.")
        return Fp8Checkpoint(APPROXIMATE_FP8_CONFIG, approximate=True)
    if not modelopt:
        return None
    quantized = {n[: -len(suffix)] for n in names for suffix in WEIGHT_SCALE_SUFFIXES if n.endswith(suffix)}
    weight_only = sorted(x for x in quantized if linear_path(x) is not None
                         and not any(x + suffix in names for suffix in INPUT_SCALE_SUFFIXES))
    return Fp8Checkpoint(dict(config_values.get("quantization_config") or {}), weight_only=tuple(weight_only))


def scale_key(weight_name: str, names) -> str | None:
    """The checkpoint key holding the tensorwise scale of ``<X>.weight``, if any."""
    prefix = weight_name[: -len(".weight")]
    for suffix in WEIGHT_SCALE_SUFFIXES:
        if prefix + suffix in names:
            return prefix + suffix
    return None


def is_dropped(name: str) -> bool:
    return name.endswith(DROPPED_SUFFIXES)


def read_scale(name: str, scale: torch.Tensor, where: str) -> torch.Tensor:
    if scale.numel() != 1:
        raise CheckpointError(f"{where}: {name} has {scale.numel()} values; only tensorwise (one value) ModelOpt FP8 "
                              "scales are supported.")
    return scale.reshape(()).float()


def missing_scale_error(weight_name: str, dtype: torch.dtype, where: str) -> CheckpointError:
    prefix = weight_name[: -len(".weight")]
    return CheckpointError(
        f"{where}: {weight_name} is stored as {str(dtype).replace('torch.', '')} but its scale "
        f"({prefix}.weight_quantizer._scale or {prefix}.weight_scale) is missing; the FP8 checkpoint is incomplete "
        "or was not written by NVIDIA ModelOpt — download the transformer/ folder of the fp8 revision again."
    )


def stored_linear_weight(
    weight: torch.Tensor, scale: torch.Tensor | None, compute_dtype: torch.dtype, storage: torch.dtype | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(stored weight, fp32 scale) of one linear layer.

    ``storage`` None keeps what the checkpoint stores when it is FP8 with a scale (the ModelOpt weights as published),
    else the compute dtype. Any other storage dequantizes (``weight.float() · scale``) and rounds once to it."""
    one = torch.ones((), dtype=torch.float32)
    if scale is not None and weight.dtype in FP8_DTYPES and storage in (None, weight.dtype):
        return weight, scale
    dense = weight.float() * scale if scale is not None else weight
    return dense.to(storage or compute_dtype), one


def check_storage_device(storage: torch.dtype | None, device: torch.device | str) -> None:
    """Refuse a storage dtype the device cannot hold or cast (e.g. FP8 on Apple MPS)."""
    if storage is None:
        return
    try:
        probe = torch.ones(2, dtype=torch.float32, device=device).to(storage)
        probe.to(torch.float32)
    except (RuntimeError, TypeError, NotImplementedError, AssertionError) as exc:
        name = next((k for k, v in STORAGE_DTYPES.items() if v == storage), str(storage))
        raise ValueError(f"weight dtype {name} is not supported on device {device} ({exc}); choose bf16 or fp16.") \
            from exc

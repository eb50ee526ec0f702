"""FP8 linear layers: the W8A16 and W8A8 forwards of an NVIDIA ModelOpt FP8 checkpoint, per-tensor quantization of a
bf16 checkpoint's weights at load (approximate FP8 compute, opt-in), and which forward each step of a run takes.

``Fp8Linear`` holds what the checkpoint stores for one quantized linear ``X`` (the layout of a restored ModelOpt
``RealQuantLinear``): ``X.weight`` e4m3 ``[out, in]``, ``X.weight_quantizer._scale`` (``scale_weight``, fp32),
``X.weight_quantizer._amax`` and ``X.input_quantizer._amax`` (calibrated activation range). ModelOpt's Hugging Face
export names the scales ``X.weight_scale`` / ``X.input_scale`` (= amax / 448); both spellings load (loader.py).

* **W8A16** (``forward``, what the step policy calls high precision): diffusers 0.42.1 ``_w8a16_linear`` —
  ``F.linear(x, weight.to(x.dtype) · scale_weight.to(x.dtype), bias)``.
* **W8A8** (``w8a8``): ModelOpt's restored real-quant forward (``backends/fp8_per_tensor_gemm.py``,
  ``fp8_per_tensor_gemm``): ``scale_a = input_amax / 448``, ``scale_b = weight_amax / 448`` (``scale_of_amax``:
  rounded as that division rounds on the GPU); the activation is
  ``(x / scale_a).clamp(±448) → e4m3`` (the reference's ``_to_fp8``, compiled on CUDA as there); then
  ``torch._scaled_mm(x8, w8ᵀ, scale_a, scale_b, bias, out_dtype=x.dtype, use_fast_accum=True)`` on a CUDA GPU with
  FP8 tensor cores (sm ≥ 8.9), the bias added afterwards for fp32 outputs. On the CPU ``emulated_scaled_mm``
  computes the same product exactly from the FP8-rounded values (``(x8 · w8ᵀ) · scale_a·scale_b + bias`` in fp32):
  a numerical reference for tests (``RuntimeOptions(fp8_gemm="emulate")``), not a fast path.
* **Approximate FP8 compute** (a bf16 checkpoint loaded with ``fp8_compute``, ComfyUI's ``fp8_e4m3fn_fast``):
  ``quantize_weight`` rounds each weight once with one per-tensor scale (``amax / 448``, ModelOpt's max calibration
  of a weight); with no calibrated activation range the W8A8 forward gives each token its own scale, its amax over
  the features / 448 rounded up to a power of two (``token_scales``, on the device: no host sync), so a token's
  output does not depend on what else is in the batch (other items, the other guidance branch, another GPU's
  share): ``per_token_matmul``, ModelOpt's per-tensor GEMM (``_fp8_gemm_impl``) with each token's scale. Not a
  reference behaviour: outputs differ from the bf16 checkpoint at FP8 rounding level; everywhere this mode is
  offered it is labelled approximate.

``fp8_steps`` turns a run's resolved policy (``precision.MixedPrecision``) into each step's modes on the loaded
layers and the run's device: W8A8 where the GPU has FP8 GEMMs, else W8A16 at every step with one notice — unless
FP8 compute was asked for explicitly (``mixed_precision_format='fp8'``, or the approximate mode), which is refused
(``check_fp8_compute``): never a silent change of precision.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..runtime import compile_unavailable_reason
from .precision import W8A8, MixedPrecision, StepPrecision, resolve
from .weights import E4M3_MAX, CastLinear, Fp8Checkpoint

FP8_MIN_CAPABILITY = (8, 9)


def device_fp8_problem(device: torch.device | str) -> str | None:
    """Why ``device`` cannot run real FP8 GEMMs (None when it can), in words for an error message."""
    device = torch.device(device)
    if device.type != "cuda":
        return f"{device.type} has no FP8 GEMMs"
    if not torch.cuda.is_available():
        return "CUDA is not available"
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) < FP8_MIN_CAPABILITY:
        return (f"{torch.cuda.get_device_name(device)} is sm {major}.{minor}; FP8 tensor cores need sm 8.9 or newer "
                "(Ada, Hopper, Blackwell)")
    return None


def fp8_gemm_available(device: torch.device | str) -> bool:
    return device_fp8_problem(device) is None


def check_fp8_compute(asked: str | None, device: torch.device | str, gemm: str = "auto",
                      problem: str | None = None) -> None:
    """Refuse FP8 compute asked for explicitly (``asked`` names how) where W8A8 cannot run: on ``device`` (unless
    ``gemm='emulate'``), or for the given ``problem``."""
    if asked is None:
        return
    problem = problem or (None if gemm == "emulate" else device_fp8_problem(device))
    if problem:
        raise ValueError(
            f"{asked} needs real FP8 GEMMs, but {problem}. Leave mixed_precision_format unset and load the "
            "checkpoint with weight_dtype auto here (an FP8 checkpoint then runs W8A16: weights dequantized to the "
            "compute dtype), or run on a GPU with FP8 tensor cores (sm 8.9+).")


_INV_E4M3_MAX = float(torch.tensor(1.0) / E4M3_MAX)  # 1/448 rounded to fp32, as a CUDA division by 448 uses it


def scale_of_amax(amax: torch.Tensor) -> torch.Tensor:
    """A calibrated range's per-tensor FP8 scale (``scale_a`` / ``scale_b``): ModelOpt's ``amax.float() / 448.0``
    as the reference's W8A8 path computes it, on a CUDA GPU, where torch divides by a Python number by multiplying
    with its fp32 reciprocal (``BinaryDivTrueKernel.cu``). Computed so on every device: the CPU's exact division
    differs by one ulp for about half the values, which would move the GPU's W8A8 GEMMs off the reference's."""
    return amax.float() * _INV_E4M3_MAX


def _to_fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """ModelOpt's ``_to_fp8``, the same expression (with a per-tensor scale the division rounds to ``x``'s dtype
    first, as the reference's eager and CPU-compiled code; on CUDA ``quantize_activation`` compiles it as the
    reference does; a per-token ``[..., 1]`` scale divides in fp32, exactly: ``token_scales``)."""
    return (x / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


_COMPILED_TO_FP8: list = []


def quantize_activation(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``x`` → e4m3 with the per-tensor ``scale``; on CUDA through ``torch.compile(dynamic=True)`` as the reference
    (one fused kernel, the reference's rounding of the division) where Inductor can compile, else eagerly; inside
    a compiled layer, traced in place."""
    if x.is_cuda and not torch.compiler.is_compiling() and not compile_unavailable_reason(True):
        if not _COMPILED_TO_FP8:
            _COMPILED_TO_FP8.append(torch.compile(_to_fp8, dynamic=True))
        return _COMPILED_TO_FP8[0](x, scale)
    return _to_fp8(x, scale)


def emulated_scaled_mm(a8: torch.Tensor, b8_t: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                       bias: torch.Tensor | None, out_dtype: torch.dtype) -> torch.Tensor:
    """``torch._scaled_mm(a8, b8_t, scale_a, scale_b, bias, out_dtype)`` computed from the FP8 values in fp32:
    every product of two e4m3 values is exact in fp32, the sums round as an fp32 GEMM does."""
    out = (a8.float() @ b8_t.float()) * (scale_a.float() * scale_b.float())
    if bias is not None:
        out = out + bias.float()
    return out.to(out_dtype)


_TINY = torch.finfo(torch.float32).tiny
_UNIT: dict[torch.device, torch.Tensor] = {}


def token_scales(x: torch.Tensor) -> torch.Tensor:
    """The approximate mode's activation scales: each token's own range, ``amax / 448`` over its features, rounded
    up to a power of two (as MXFP8's shared exponents), fp32, ``[..., 1]``. A power of two makes dividing by it and
    multiplying the GEMM's rows back by it exact in any float dtype, so the FP8 values and the product do not depend
    on the dtype the division runs in; the largest value of a token then lands in [224, 448]."""
    amax = x.detach().abs().amax(dim=-1, keepdim=True).float().clamp_min(_TINY * E4M3_MAX)
    return torch.exp2(torch.ceil(torch.log2(amax / E4M3_MAX)))


def per_token_matmul(x: torch.Tensor, w8: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                     bias: torch.Tensor | None) -> torch.Tensor:
    """``x @ w8ᵀ`` in FP8 with one power-of-two scale per token (``scale_a`` ``[..., 1]``, ``token_scales``) and
    the per-tensor ``scale_b``: the per-tensor FP8 GEMM (``fp8_matmul``) with a unit activation scale, its rows then
    multiplied by their own scales in place (exact: powers of two) and the bias added — in bf16 as the per-tensor
    path writes it (fp16 and fp32 inputs: in fp32, where a row's unscaled values cannot overflow). ``x [..., K]`` →
    ``[M, N]``; each row depends on its own token only."""
    x8 = quantize_activation(x, scale_a).reshape(-1, x.shape[-1])
    unit = _UNIT.get(x8.device)
    if unit is None:
        unit = _UNIT.setdefault(x8.device, torch.ones((), dtype=torch.float32, device=x8.device))
    out = fp8_matmul(x8, w8, unit, scale_b, None, x.dtype if x.dtype == torch.bfloat16 else torch.float32)
    out.mul_(scale_a.reshape(-1, 1))
    if bias is not None:
        out.add_(bias)
    return out.to(x.dtype)


def fp8_matmul(x8: torch.Tensor, w8: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
               bias: torch.Tensor | None, out_dtype: torch.dtype) -> torch.Tensor:
    """``x8 [M, K] @ w8ᵀ`` (``w8`` ``[N, K]``) scaled, with ``bias``, as ModelOpt's ``_fp8_gemm_impl`` calls it."""
    if x8.is_cuda:
        fused_bias = bias if out_dtype != torch.float32 else None
        out = torch._scaled_mm(x8, w8.t(), scale_a=scale_a, scale_b=scale_b, bias=fused_bias, out_dtype=out_dtype,
                               use_fast_accum=True)
        if bias is not None and fused_bias is None:
            out = out + bias
        return out
    return emulated_scaled_mm(x8, w8.t(), scale_a, scale_b, bias, out_dtype)


class Fp8Linear(CastLinear):
    """A ModelOpt FP8 linear layer: ``forward`` is W8A16, ``w8a8`` the checkpoint's W8A8 forward.

    ``input_scale`` (``scale_a``, fp32 scalar) is None when the checkpoint calibrated no activation range (W8A8 then
    needs ``dynamic_input``, the approximate mode); ``w8a8_weight_scale`` is ``scale_b``. Both are non-persistent
    buffers (the loader sets them from the checkpoint's quantizer tensors). ``path`` is the reference's class of
    this linear (``precision.linear_path``), set by the loader."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None):
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.register_buffer("input_scale", None, persistent=False)
        self.register_buffer("w8a8_weight_scale", None, persistent=False)
        self.path: str | None = None
        self.dynamic_input = False

    @property
    def has_w8a8(self) -> bool:
        return self.weight.dtype == torch.float8_e4m3fn and (self.input_scale is not None or self.dynamic_input)

    def activation_scale(self, x: torch.Tensor) -> torch.Tensor:
        """``scale_a`` of the W8A8 forward on ``x``: the calibrated per-tensor one, or each token's own
        (``token_scales``: the approximate mode)."""
        if self.input_scale is not None:
            return self.input_scale
        if self.dynamic_input:
            return token_scales(x)
        raise ValueError("Fp8Linear: this layer has no activation scale (input_quantizer._amax); it runs W8A16 only.")

    @property
    def weight_scale_b(self) -> torch.Tensor:
        """``scale_b`` of the W8A8 forward: the checkpoint's ``weight_quantizer._amax`` / 448, else ``scale_weight``."""
        return self.w8a8_weight_scale if self.w8a8_weight_scale is not None else self.scale_weight

    def w8a8(self, x: torch.Tensor) -> torch.Tensor:
        return self.w8a8_with(x, self.weight, self.bias, self.activation_scale(x), self.weight_scale_b)

    @staticmethod
    def w8a8_with(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, scale_a: torch.Tensor,
                  scale_b: torch.Tensor) -> torch.Tensor:
        """The W8A8 forward with these tensors (a layer's own, or copies a host streamed to ``x``'s device); a
        ``scale_a`` shaped as ``x`` but for its last dimension (``[..., 1]``) is per token (``per_token_matmul``),
        any other per tensor."""
        shape = x.shape
        bias = None if bias is None else bias.to(x.dtype)
        if scale_a.dim() == 0 or scale_a.shape[:-1] != shape[:-1]:
            x8 = quantize_activation(x, scale_a).reshape(-1, shape[-1])
            out = fp8_matmul(x8, weight, scale_a, scale_b, bias, x.dtype)
        else:
            out = per_token_matmul(x, weight, scale_a, scale_b, bias)
        return out.reshape(*shape[:-1], out.shape[-1])


def run_linear(module: nn.Module, x: torch.Tensor, precision: StepPrecision | None) -> torch.Tensor:
    """``module(x)``, or the W8A8 forward where ``precision`` (the step's ``precision.StepPrecision``) asks it of this
    FP8 linear's path. A layer without activation scales (a weight-only FP8 checkpoint) has no W8A8 forward: its
    native path is W8A16, as ModelOpt runs it (a schedule of W8A8 steps on such a checkpoint is refused when the
    request is resolved)."""
    if precision is None or not isinstance(module, Fp8Linear):
        return module(x)
    return module.w8a8(x) if precision.mode_of(module.path) == W8A8 and module.has_w8a8 else module(x)


def quantize_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 weight, fp32 scale) with one per-tensor scale ``amax / 448``, rounded once from fp32."""
    w = weight.detach().float()
    scale = (w.abs().amax() / E4M3_MAX).clamp_min(torch.finfo(torch.float32).tiny)
    return (w / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn), scale.reshape(())


def run_policy(fp8: Fp8Checkpoint | None, name: str = "", **overrides) -> MixedPrecision | None:
    """The step policy of a run on a checkpoint of FP8 layout ``fp8`` (None: not FP8, nothing to decide; any
    override is then refused by ``precision.resolve``) with the request's ``mixed_precision_*`` ``overrides``. A
    schedule of W8A8 steps on a weight-only FP8 export is refused (the reference refuses its layers too)."""
    policy = resolve(None if fp8 is None else fp8.quantization_config, has_fp8_linears=fp8 is not None, **overrides)
    if fp8 is None:
        return None
    if policy.enabled and fp8.weight_only:
        first = fp8.weight_only[0]
        raise ValueError(
            f"W8A8 needs the activation scale of every FP8 linear layer, but {len(fp8.weight_only)} of checkpoint "
            f"{name!r} have none (e.g. {first}.input_quantizer._amax or {first}.input_scale): it is a weight-only "
            "FP8 export. Set mixed_precision_format to none (CLI: --mixed-precision-format none; its layers then "
            "run W8A16, as the reference runs a weight-only checkpoint), or use NVIDIA's fp8 revision, which "
            "carries them.")
    return policy


def asked_fp8(fp8: Fp8Checkpoint | None, policy: MixedPrecision | None) -> str | None:
    """How FP8 compute was asked for explicitly (in words), or None: the approximate mode, or
    ``mixed_precision_format='fp8'``."""
    if policy is None:
        return None
    if fp8 is not None and fp8.approximate:
        return "weight_dtype fp8_e4m3fn_fast (approximate FP8 compute; CLI: --weight-dtype fp8_e4m3fn_fast)"
    return "mixed_precision_format='fp8' (CLI: --mixed-precision-format fp8)" if policy.forced else None


@dataclass(frozen=True)
class Fp8Steps:
    """What a run's FP8 linears do: ``modes[i]`` the ``StepPrecision`` of step ``i`` (``None`` for the whole
    run: every linear's ``forward``, W8A16 for an FP8 layer) and ``note``, one line for the log and the nodes — the
    policy in effect, or why the checkpoint's W8A8 steps do not run here (``fallback``)."""

    modes: tuple[StepPrecision, ...] | None
    note: str
    fallback: bool = False


def fp8_steps(model: nn.Module, policy: MixedPrecision | None, steps: int, device: torch.device | str,
              gemm: str = "auto") -> Fp8Steps | None:
    """Each step's FP8 modes for a run of ``steps`` on ``device`` under the resolved ``policy`` (None: the model
    has no FP8 layers, nothing to decide)."""
    if policy is None:
        return None
    fp8 = getattr(model, "fp8_checkpoint", None)
    approximate, asked = fp8 is not None and fp8.approximate, asked_fp8(fp8, policy)
    if gemm == "emulate" and torch.device(device).type != "cpu":
        raise ValueError(f"fp8_gemm='emulate' (the exact CPU emulation of the FP8 GEMM, a numerical reference) runs "
                         f"on the CPU only, not on {device}; use fp8_gemm 'auto'.")
    problem = None if gemm == "emulate" else device_fp8_problem(device)
    if problem is None and not any(isinstance(m, Fp8Linear) and m.has_w8a8 for m in model.modules()):
        problem = "its linear layers here (the host's own FP8 layers) have no W8A8 forward"
    check_fp8_compute(asked, device, gemm, problem)
    describe = policy.describe() + (" (approximate: FP8 computed from a bf16 checkpoint)" if approximate else "")
    if problem is not None:
        return Fp8Steps(None, f"the FP8 checkpoint runs W8A16 at every step (weights dequantized) because {problem}; "
                              f"its W8A8 steps ({describe}) need a GPU with FP8 tensor cores (sm 8.9+).", True)
    return Fp8Steps(tuple(policy.modes(i, steps) for i in range(steps)), describe)

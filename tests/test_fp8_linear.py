"""``Fp8Linear`` (cosmos3_core/model/fp8.py) against the reference's own FP8 linear on the same tensors (CPU).

The reference layer is a real NVIDIA ModelOpt 0.47 ``RealQuantLinear``, calibrated (max) and compressed by
``mtq.quantize`` / ``mtq.compress`` — the module a ModelOpt FP8 checkpoint restores to in diffusers. Its W8A8 path on
an FP8 GPU is ``fp8_per_tensor_gemm`` → ``_fp8_gemm_impl`` (``_to_fp8`` + ``torch._scaled_mm``); that function is
called here unchanged (its uncompiled body; torch's CPU ``_scaled_mm``). Checked:

* the FP8 activation is bit for bit the reference's ``_to_fp8`` (fp32 and bf16 inputs, the compiled and eager
  reference agree on the CPU);
* the W8A8 output equals the reference GEMM to fp32 summation order (≤ 2e-6 relative), bf16 outputs bit for bit;
  the CPU emulation equals torch's own CPU ``_scaled_mm`` the same way;
* on the CPU the reference module itself falls back to fake quantization (``x·448/amax`` → e4m3 → back, a dense
  ``F.linear``): ours equals that within fp32 rounding too, and the test counts how often the two roundings of the
  reference disagree on an FP8 value (its own CPU-vs-GPU spread);
* W8A16 is diffusers' ``_w8a16_linear`` bit for bit; the approximate mode's weights are ModelOpt's max-calibrated
  compression bit for bit, and its dynamic activation scales run each token through the reference's GEMM with that
  token's own range rounded up to a power of two (so a batch item's output is its own single run's);
* a weight-only FP8 layer (no activation scale) runs W8A16 as its native path, and a schedule of W8A8 steps on a
  weight-only checkpoint is one clear error.
"""

from __future__ import annotations

import types
import warnings

import pytest
import torch
from diffusers.pipelines.cosmos.mixed_precision import _w8a16_linear

from cosmos3_core.model.fp8 import Fp8Linear, emulated_scaled_mm, quantize_activation, quantize_weight, run_linear
from cosmos3_core.model.precision import FIRST_LAST_N_FP8_POLICY, StepPrecision
from cosmos3_core.model.weights import Fp8Checkpoint

warnings.filterwarnings("ignore", module="modelopt")
mtq = pytest.importorskip("modelopt.torch.quantization")
fpg = pytest.importorskip("modelopt.torch.quantization.backends.fp8_per_tensor_gemm")

REF_TO_FP8 = fpg._to_fp8._torchdynamo_orig_callable
REF_GEMM = fpg._fp8_gemm_impl._torchdynamo_orig_callable


def modelopt_linear(k: int, n: int, bias: bool, seed: int = 0, scale: float = 3.0):
    """A calibrated, compressed ModelOpt FP8 linear layer (and its calibration inputs)."""
    g = torch.Generator().manual_seed(seed)
    lin = torch.nn.Linear(k, n, bias=bias)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(n, k, generator=g) * 0.05)
        if bias:
            lin.bias.copy_(torch.randn(n, generator=g))
    model = torch.nn.Sequential(lin)
    data = [torch.randn(8, k, generator=g) * scale for _ in range(4)]
    mtq.quantize(model, mtq.FP8_DEFAULT_CFG, forward_loop=lambda m: [m(d) for d in data])
    mtq.compress(model)
    return model[0]


def ours_from(layer) -> Fp8Linear:
    """Our layer from the reference layer's state dict, as the loader reads a checkpoint, but with the scales as the
    reference computes them on the CPU (``amax / 448``, an exact division): the loader rounds them as the
    reference's GPU path does (``fp8.scale_of_amax``, checked against CUDA in test_fp8_gpu.py), which differs in the
    last bit for about half the values, and these CPU comparisons are bit for bit."""
    sd = layer.state_dict()
    n, k = sd["weight"].shape
    ours = Fp8Linear(k, n, bias="bias" in sd)
    ours.weight = torch.nn.Parameter(sd["weight"], requires_grad=False)
    if "bias" in sd:
        ours.bias = torch.nn.Parameter(sd["bias"], requires_grad=False)
    ours.scale_weight = torch.nn.Parameter(sd["weight_quantizer._scale"], requires_grad=False)
    ours.input_scale = sd["input_quantizer._amax"].float() / 448.0
    ours.w8a8_weight_scale = sd["weight_quantizer._amax"].float() / 448.0
    return ours


def bits(t):
    return t.view(torch.uint8)


def rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.fixture(scope="module", params=[True, False], ids=["bias", "no-bias"])
def pair(request):
    layer = modelopt_linear(64, 48, request.param)
    return layer, ours_from(layer)


def test_checkpoint_layout_is_modelopts(pair):
    layer, _ = pair
    sd = layer.state_dict()
    assert sd["weight"].dtype == torch.float8_e4m3fn
    assert {k for k in sd if "quantizer" in k} == {"input_quantizer._amax", "weight_quantizer._amax",
                                                   "weight_quantizer._scale"}
    assert all(sd[k].numel() == 1 for k in sd if "quantizer" in k)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_activation_fp8_is_the_references(pair, dtype):
    _, ours = pair
    x = (torch.randn(37, 64, generator=torch.Generator().manual_seed(1)) * 4).to(dtype)
    mine = quantize_activation(x, ours.input_scale)
    assert torch.equal(bits(mine), bits(REF_TO_FP8(x, ours.input_scale)))
    if dtype == torch.bfloat16:  # the reference's compiled kernel (Inductor on the CPU) rounds the same way
        assert torch.equal(bits(mine), bits(fpg._to_fp8(x, ours.input_scale)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_w8a8_equals_the_reference_gemm(pair, dtype):
    layer, ours = pair
    x = (torch.randn(3, 7, 64, generator=torch.Generator().manual_seed(2)) * 3).to(dtype)
    bias = None if layer.bias is None else layer.bias.to(dtype)
    ref = REF_GEMM(x, layer.state_dict()["weight"], ours.input_scale, ours.w8a8_weight_scale,
                   bias if dtype != torch.float32 else None)
    if dtype == torch.float32 and bias is not None:  # fp8_per_tensor_gemm adds an fp32 bias after the GEMM
        ref = ref + bias
    mine = ours.w8a8(x)
    assert mine.dtype == ref.dtype == dtype and mine.shape == ref.shape
    if dtype == torch.bfloat16:
        assert torch.equal(mine, ref)
    else:
        assert rel(mine, ref) <= 2e-6


def test_emulation_equals_torch_scaled_mm_on_cpu(pair):
    _, ours = pair
    x8 = quantize_activation(torch.randn(29, 64, generator=torch.Generator().manual_seed(3)) * 3, ours.input_scale)
    for out_dtype, bias in ((torch.float32, None), (torch.bfloat16, torch.randn(48).bfloat16())):
        want = torch._scaled_mm(x8, ours.weight.t(), scale_a=ours.input_scale, scale_b=ours.w8a8_weight_scale,
                                bias=bias, out_dtype=out_dtype)
        got = emulated_scaled_mm(x8, ours.weight.t(), ours.input_scale, ours.w8a8_weight_scale, bias, out_dtype)
        if out_dtype == torch.float32:
            assert rel(got, want) <= 2e-6
        else:  # bf16 out: the CPU kernel's accumulation order (oneDNN, ISA-dependent) may flip a last bit
            diff = (got.float() - want.float()).abs().max()
            assert torch.allclose(got.float(), want.float(), rtol=2 ** -7, atol=0), diff


def test_w8a8_equals_the_restored_module_on_cpu(pair):
    layer, ours = pair
    x = torch.randn(64, 64, generator=torch.Generator().manual_seed(4)) * 3
    with torch.no_grad():
        ref = layer(x)  # no FP8 GEMM on the CPU: ModelOpt's fake-quant fallback of the same layer
    assert rel(ours.w8a8(x), ref) <= 2e-6
    # the reference's two activation roundings (x / (amax/448) on a GPU, x · (448/amax) here) on these inputs
    amax = layer.input_quantizer.amax
    fake = (x * (448.0 / amax)).clamp(-448, 448).to(torch.float8_e4m3fn)
    flips = int((bits(fake) != bits(quantize_activation(x, ours.input_scale))).sum())
    assert flips <= x.numel() // 1000


def test_w8a16_is_diffusers(pair):
    layer, ours = pair
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(5))
    view = types.SimpleNamespace(weight=ours.weight, bias=ours.bias,
                                 weight_quantizer=types.SimpleNamespace(_scale=ours.scale_weight.data))
    assert torch.equal(ours(x), _w8a16_linear(view, x, "x"))
    assert torch.equal(run_linear(ours, x, StepPrecision("W8A16", "W8A16", "W8A16")), ours(x))
    ours.path = "generation"
    assert torch.equal(run_linear(ours, x, StepPrecision("W8A8", "W8A16", "W8A16")), ours.w8a8(x))
    assert torch.equal(run_linear(ours, x, StepPrecision("W8A16", "W8A8", "W8A8")), ours(x))


def test_approximate_weights_are_modelopt_max_calibration():
    layer = modelopt_linear(96, 80, bias=False, seed=7)
    dense = torch.nn.Linear(96, 80, bias=False)
    with torch.no_grad():
        dense.weight.copy_(torch.randn(80, 96, generator=torch.Generator().manual_seed(7)) * 0.05)
    q, scale = quantize_weight(dense.weight)
    assert torch.equal(bits(q), bits(layer.state_dict()["weight"]))
    assert torch.equal(scale, layer.weight_quantizer._scale.reshape(()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dynamic_activation_scales_run_each_token_through_the_references_gemm(pair, dtype):
    _, ours = pair
    g = torch.Generator().manual_seed(6)
    x = (torch.randn(2, 9, 64, generator=g) * torch.logspace(-2, 2, 9)[:, None]).to(dtype)  # rows of unlike ranges
    x[1, 3] = 0  # a token of zeros
    weight_scale = ours.w8a8_weight_scale
    saved = ours.input_scale
    try:
        ours.input_scale, ours.dynamic_input = None, True
        got = ours.w8a8(x)
        for item in range(2):
            for token in range(9):
                lone = x[item, token : token + 1]
                amax = fpg.reduce_amax(lone).float()  # the reference's uncalibrated range of this token alone
                if amax == 0:  # a token of zeros gives the bias alone
                    bias = torch.zeros(1) if ours.bias is None else ours.bias.to(dtype)
                    assert torch.equal(got[item, token], bias.expand(got.shape[-1]).to(dtype))
                    continue
                scale_a = 2.0 ** torch.ceil(torch.log2(amax / 448.0))
                want = REF_GEMM(lone, ours.weight, scale_a, weight_scale, ours.bias)
                assert rel(got[item, token : token + 1].float(), want.float()) <= (
                    2e-6 if dtype == torch.float32 else 8e-3), (item, token)
        assert torch.equal(ours.w8a8(x[1:]), got[1:])  # an item alone: its rows of the batch, bit for bit
        assert torch.equal(ours.w8a8(x[:, 4:]), got[:, 4:])  # and a share of the tokens (another GPU's, a window)
    finally:
        ours.input_scale, ours.dynamic_input = saved, False


def test_weight_only_layer_runs_w8a16_and_its_schedule_is_refused():
    from cosmos3_core.model.fp8 import run_policy

    layer = Fp8Linear(16, 16, bias=False)
    layer.weight = torch.nn.Parameter(torch.zeros(16, 16).to(torch.float8_e4m3fn), requires_grad=False)
    x = torch.randn(2, 16)
    layer.path = "generation"
    assert torch.equal(run_linear(layer, x, StepPrecision("W8A8", "W8A8", "W8A8")), layer(x))  # its native path is W8A16
    config = {"quant_method": "modelopt", "quant_algo": "FP8", "runtime": {"diffusion_step_policy":
                                                                           FIRST_LAST_N_FP8_POLICY}}
    weight_only = Fp8Checkpoint(config, weight_only=("layers.0.self_attn.to_q",))
    with pytest.raises(ValueError, match=r"layers\.0\.self_attn\.to_q\.input_quantizer\._amax.*weight-only.*"
                                         r"mixed_precision_format to none"):
        run_policy(weight_only, "ckpt")
    assert not run_policy(weight_only, "ckpt", mixed_precision_format="none").enabled

"""The fast modes on a CUDA GPU (skipped elsewhere; FP8 GEMM tests need sm 8.9+):

* our W8A8 GEMM (``Fp8Linear.w8a8``: the compiled ``_to_fp8`` + ``torch._scaled_mm``) against ModelOpt's
  ``fp8_per_tensor_gemm`` — the reference's restored forward — on Nano's GEMM shapes (M odd and even, bf16): bit
  for bit, and the emulation within fp32 summation order of both;
* a guided FP8 run against diffusers' mixed-precision pipeline on the tiny ModelOpt checkpoint, both on their real
  FP8 GEMMs: the same per-step trace; latents within the flip-limited bound of the CPU parity test;
* FP8 steps and SeaCache under ``torch.compile``: the compiled layer equals eager at bf16 rounding level, and the
  compiled run makes the same SeaCache decisions as eager;
* approximate FP8 compute of a bf16 checkpoint runs W8A8 (labelled approximate) and stays close to bf16.

Run on an H200: ``bash tests/run.sh tests/test_fp8_gpu.py``.
"""

from __future__ import annotations

import types
import warnings

import pytest
import torch

from cosmos3_core import api
from cosmos3_core.api import generate
from cosmos3_core.model.fp8 import Fp8Linear, emulated_scaled_mm, fp8_gemm_available, quantize_activation, scale_of_amax
from cosmos3_core.pipeline import Cosmos3Pipeline
from cosmos3_core.request import Request
from cosmos3_core.resolve import resolve
from cosmos3_core.runtime import RuntimeOptions
from cosmos3_core.sampling.sea_cache import SeaCacheConfig
from cosmos3_core.testing.fp8 import build_fp8_checkpoint
from support.compare import rel

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
needs_fp8 = pytest.mark.skipif(not torch.cuda.is_available() or not fp8_gemm_available("cuda"),
                               reason="needs FP8 tensor cores (sm 8.9+)")
warnings.filterwarnings("ignore", module="modelopt")

NANO_GEMMS = [(4096, 4096), (4096, 1024), (4096, 12288), (12288, 4096)]  # (K, N): q/o, k/v, gate/up, down
EAGER, COMPILED = RuntimeOptions(compile="off"), RuntimeOptions(compile="on")
CLIP = dict(prompt="a red robot walking", negative_prompt="blurry", num_frames=9, height=64, width=96, fps=24.0)


def layer(k: int, n: int, bias: bool) -> Fp8Linear:
    """An FP8 layer whose W8A8 scales are what the loader makes of the checkpoint's amax tensors (read on the CPU,
    ``scale_of_amax``, then moved); the amaxes ride along as ``weight_amax`` / ``input_amax`` for ModelOpt, which
    computes its own scales from them on the GPU."""
    g = torch.Generator("cuda").manual_seed(k + n)
    w = torch.randn(n, k, device="cuda", generator=g) * 0.02
    amax = w.abs().amax()
    m = Fp8Linear(k, n, bias=bias, device="cuda")
    m.weight = torch.nn.Parameter((w / (amax / 448)).to(torch.float8_e4m3fn), requires_grad=False)
    m.scale_weight = torch.nn.Parameter((amax / 448).reshape(()), requires_grad=False)
    m.weight_amax, m.input_amax = amax, torch.tensor(6.0, device="cuda")
    m.w8a8_weight_scale = scale_of_amax(m.weight_amax.cpu()).cuda()
    m.input_scale = scale_of_amax(m.input_amax.cpu()).cuda()
    if bias:
        m.bias = torch.nn.Parameter(torch.randn(n, device="cuda", generator=g), requires_grad=False)
    return m


@needs_fp8
@pytest.mark.parametrize("k, n", NANO_GEMMS)
@pytest.mark.parametrize("m", [1, 77, 4096, 4099])
@pytest.mark.parametrize("bias", [False, True])
def test_fp8_gemm_equals_modelopt(k, n, m, bias):
    fpg = pytest.importorskip("modelopt.torch.quantization.backends.fp8_per_tensor_gemm")
    lin = layer(k, n, bias)
    x = (torch.randn(m, k, device="cuda", generator=torch.Generator("cuda").manual_seed(m)) * 2).bfloat16()
    module = types.SimpleNamespace(
        input_quantizer=types.SimpleNamespace(amax=lin.input_amax),
        weight_quantizer=types.SimpleNamespace(amax=lin.weight_amax), weight=lin.weight)
    want = fpg.fp8_per_tensor_gemm(module, x, None if lin.bias is None else lin.bias.bfloat16())
    got = lin.w8a8(x)
    assert torch.equal(got, want)
    x8 = quantize_activation(x, lin.input_scale)
    emulated = emulated_scaled_mm(x8, lin.weight.t(), lin.input_scale, lin.w8a8_weight_scale,
                                  None if lin.bias is None else lin.bias.bfloat16(), torch.float32)
    assert rel(want.float(), emulated) <= 1e-2  # fast accumulation and the bf16 output against an fp32 emulation


def test_scales_round_as_the_references_cuda_division():
    """``scale_of_amax`` on the CPU (where the loader reads the checkpoint) gives what ModelOpt's
    ``amax.float() / 448.0`` gives on the GPU, for every amax: torch's CUDA division by a Python number multiplies by
    the fp32 reciprocal, the CPU's divides exactly (they differ in about half the values)."""
    amax = torch.rand(100_000, generator=torch.Generator().manual_seed(0)) * 20 + 1e-3
    on_gpu = amax.cuda().float() / 448.0
    assert torch.equal(scale_of_amax(amax).cuda(), on_gpu)
    assert not torch.equal((amax / 448.0).cuda(), on_gpu)  # the CPU's division would not do


@pytest.fixture(scope="module")
def dense_checkpoint(tiny_checkpoint):
    return tiny_checkpoint("nano", sound=True, seed=7)


@pytest.fixture(scope="module")
def fp8_checkpoint(tmp_path_factory, dense_checkpoint):
    return build_fp8_checkpoint(dense_checkpoint, tmp_path_factory.mktemp("fp8gpu") / "fp8")


@needs_fp8
def test_guided_fp8_run_follows_the_reference_pipeline(fp8_checkpoint, dense_checkpoint):
    mto = pytest.importorskip("modelopt.torch.opt")
    from diffusers import Cosmos3OmniPipeline, UniPCMultistepScheduler
    from test_fp8_parity import write_modelopt_state

    write_modelopt_state(dense_checkpoint, fp8_checkpoint)
    mto.enable_huggingface_checkpointing()
    ref = Cosmos3OmniPipeline.from_pretrained(fp8_checkpoint, enable_safety_checker=False,
                                              torch_dtype=torch.bfloat16).to("cuda")
    ref.scheduler = UniPCMultistepScheduler.from_config(ref.scheduler.config, flow_shift=3.0, use_karras_sigmas=False)
    want = ref(**CLIP, num_inference_steps=8, guidance_scale=6.0, generator=torch.Generator("cpu").manual_seed(3),
               output_type="latent")
    ours = Cosmos3Pipeline.load(fp8_checkpoint, dtype=torch.bfloat16, device="cuda")
    request = Request(**CLIP, steps=8, guidance=6.0, seed=3, schedule="flow_shift", shift=3.0, options=EAGER)
    out = generate(ours, request, decode=False)
    assert resolve(request, ours.info).sampling.mixed_precision.schedule(8) == tuple(ref._mixed_precision_trace)
    assert "W8A8" in ref._mixed_precision_trace
    assert rel(out.latents.float(), want.video.float()) <= 5e-2  # bf16 + FP8 flips (see test_fp8_parity)


@needs_fp8
def test_compiled_fp8_steps_match_eager(fp8_checkpoint):
    pipe = Cosmos3Pipeline.load(fp8_checkpoint, dtype=torch.bfloat16, device="cuda")
    text = pipe.encode_text(CLIP["prompt"], CLIP["negative_prompt"], num_frames=9, height=64, width=96, fps=24.0)
    latents = []
    for options in (EAGER, COMPILED):
        plan = api.plan(pipe, text, seed=3, steps=8, guidance=6.0, options=options)
        assert any(p is not None and p.generation == "W8A8" for p in plan.precision), plan.fp8
        latents.append(pipe.run(plan).latents.flatten().float())
    assert torch.nn.functional.cosine_similarity(*latents, dim=0) > 0.99


def test_sea_cache_decides_the_same_compiled_and_eager(dense_checkpoint):
    pipe = Cosmos3Pipeline.load(dense_checkpoint, dtype=torch.bfloat16, device="cuda")
    text = pipe.encode_text(CLIP["prompt"], CLIP["negative_prompt"], num_frames=9, height=64, width=96, fps=24.0)
    traces = []
    for options in (EAGER, COMPILED):
        plan = api.plan(pipe, text, seed=3, steps=12, guidance=6.0, sea_cache=SeaCacheConfig(threshold=0.6),
                         options=options)
        pipe.run(plan)
        traces.append(plan.cache.trace)
    assert traces[0] == traces[1] and not all(c for *_, c in traces[0])


@needs_fp8
def test_approximate_fp8_of_a_bf16_checkpoint_runs_and_stays_close(dense_checkpoint):
    exact = Cosmos3Pipeline.load(dense_checkpoint, dtype=torch.bfloat16, device="cuda")
    fast = Cosmos3Pipeline.load(dense_checkpoint, dtype=torch.bfloat16, device="cuda", fp8_compute=True)
    request = Request(**CLIP, steps=8, guidance=6.0, seed=3, options=EAGER)
    a = generate(exact, request, decode=False).latents.float()
    b = generate(fast, request, decode=False).latents.float()
    text = fast.encode_text(CLIP["prompt"], CLIP["negative_prompt"], num_frames=9, height=64, width=96, fps=24.0)
    plan = api.plan(fast, text, seed=3, steps=8, guidance=6.0, options=EAGER)
    assert "approximate" in plan.fp8 and plan.precision[4].generation == "W8A8"
    assert torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0) > 0.9 and rel(b, a) > 0

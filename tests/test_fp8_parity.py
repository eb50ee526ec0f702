"""FP8 W8A8/W8A16 generation == diffusers 0.42.1 ``Cosmos3OmniPipeline`` with its mixed-precision arguments, on a tiny
ModelOpt-FP8 checkpoint in the Hub layout (``cosmos3_core.testing.fp8``), fp32 on the CPU.

The reference loads the checkpoint its own way: nvidia-modelopt's Hugging Face plugin restores the quantized module
graph (``transformer/modelopt_state.pth``, written here by ModelOpt for the reference only — this pack never reads
it), diffusers' ModelOpt quantizer loads the FP8 weights and quantizer tensors, and the pipeline's
``Cosmos3MixedPrecisionRuntime`` switches W8A8/W8A16 per step. ModelOpt's W8A8 forward is its FP8-GPU path
(``fp8_per_tensor_gemm``); so that the reference runs it on the CPU each of its FP8 linears is given that function
(its uncompiled body, torch's CPU ``_scaled_mm``). Ours runs the exact emulation
(``RuntimeOptions(fp8_gemm="emulate")``), a whole ``Request`` resolved once (``api.generate``).

What is compared, and why the tolerances:

* the per-step precision trace (W8A16 / W8A8 / base) and the modes each step really ran: identical, for the
  official policy, overrides (first/last steps, reasoner policy, format none) and a distilled checkpoint without a
  policy (native W8A8 throughout, or forced);
* a schedule with W8A16 at every step: final latents and sound within 1e-4 (the bound of the bf16-free parity
  tests: fp32 summation order only);
* W8A8 steps: an FP8 activation is a discontinuous function of its input — an fp32 rounding-order difference of
  1e-7 (batched branches, the cached text tower) moves a value sitting on an e4m3 rounding boundary to the adjacent
  FP8 value, and on this tiny model (hidden 256, a few dozen tokens) one such flip moves the output by about 1e-3.
  The cascade that follows (one flipped input moves a whole row of the next layer) makes a value comparison of two
  runs meaningless past the first flip. So W8A8 is checked where it is exact: every call of every FP8 linear in a
  guided W8A8 step of the reference, on the reference's own activations, gives the reference's output through our
  layer (≤ 2e-6, fp32 summation order); whole runs with a few W8A8 steps stay within 3e-2 of the reference; runs
  with W8A8 at every step under guidance 6 are chaotic at that level (the reference itself moves by ~9 % when its
  starting noise moves by 1e-7) and are compared by their trace only. Those trace-only runs give the reference's
  FP8 linears the same FP8 operands multiplied in fp32 (``fp8_gemm_in_fp32``): torch's CPU ``_scaled_mm`` takes a
  third of a second per call even at this size (145 of a case's 150 s), and their values are not compared.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from diffusers import Cosmos3OmniPipeline, Cosmos3OmniTransformer, UniPCMultistepScheduler

from cosmos3_core import api
from cosmos3_core.api import generate
from cosmos3_core.model.fp8 import Fp8Linear
from cosmos3_core.model.precision import StepPrecision
from cosmos3_core.pipeline import Cosmos3Pipeline
from cosmos3_core.request import Request
from cosmos3_core.resolve import resolve
from cosmos3_core.runtime import RuntimeOptions
from cosmos3_core.testing.fp8 import build_fp8_checkpoint
from support.compare import rel

warnings.filterwarnings("ignore", module="modelopt")
mtq = pytest.importorskip("modelopt.torch.quantization")
mto = pytest.importorskip("modelopt.torch.opt")
fpg = pytest.importorskip("modelopt.torch.quantization.backends.fp8_per_tensor_gemm")

H, W, F, STEPS, SEED = 64, 96, 9, 8, 99
PROMPT = "a red robot walking on the street at night"
NEGATIVE = "blurry low quality video"
EMULATE = RuntimeOptions(fp8_gemm="emulate", compile="off")


def write_modelopt_state(dense_dir, fp8_dir) -> None:
    """ModelOpt's module graph for the quantized linears (``layers.*``), as its HF export saves it."""
    model = Cosmos3OmniTransformer.from_pretrained(dense_dir / "transformer", torch_dtype=torch.float32)
    fp8 = {"num_bits": (4, 3), "axis": None}
    mtq.quantize(model, {"quant_cfg": {"*": {"enable": False}, "layers.*weight_quantizer": fp8,
                                       "layers.*input_quantizer": fp8}, "algorithm": "max"}, forward_loop=None)
    for name, quantizer in model.named_modules():
        if name.endswith("input_quantizer") and quantizer.is_enabled:
            quantizer.amax = torch.tensor(1.0)  # a calibrated quantizer (the checkpoint's value is loaded over it)
    mtq.compress(model)
    torch.save(mto.modelopt_state(model), fp8_dir / "transformer" / "modelopt_state.pth")


def use_real_fp8_gemm(transformer) -> int:
    """Give each ModelOpt FP8 linear its FP8-GPU forward (fp8_per_tensor_gemm, uncompiled) on the CPU."""
    count = 0
    for _, module in transformer.named_modules():
        if hasattr(module, "_should_run_real_quant_gemm") and module.weight.dtype == torch.float8_e4m3fn:
            module._real_quant_gemm_impl = fpg.Fp8PerTensorLinear.apply
            assert module._should_run_real_quant_gemm
            count += 1
    return count


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, tiny_checkpoint):
    root = tmp_path_factory.mktemp("fp8")
    dense = tiny_checkpoint("nano", sound=True, seed=7)
    out = {}
    for name, policy in (("fp8", "default"), ("fp8-distilled", None)):
        kwargs = {} if policy == "default" else {"policy": None}
        out[name] = build_fp8_checkpoint(dense, root / name, **kwargs)
        write_modelopt_state(dense, out[name])
    return out


@pytest.fixture(scope="module")
def reference_fp8_gemm():
    patch = pytest.MonkeyPatch()
    patch.setattr(fpg, "_fp8_gemm_impl", fpg._fp8_gemm_impl._torchdynamo_orig_callable)
    mto.enable_huggingface_checkpointing()
    yield
    patch.undo()


def fp8_gemm_in_fp32(input, weight_fp8, scale_a, scale_b, bias=None):
    """ModelOpt's ``_fp8_gemm_impl`` with ``torch._scaled_mm`` as an fp32 matmul of the same FP8 operands (exact
    products, another summation order) — for the runs whose values are not compared (module docstring)."""
    input_fp8 = fpg._to_fp8._torchdynamo_orig_callable(input, scale_a).reshape(-1, input.shape[-1])
    output = (input_fp8.float() @ weight_fp8.reshape(-1, weight_fp8.shape[-1]).float().t()) * (scale_a * scale_b)
    output = output if bias is None else output + bias
    return output.to(input.dtype).reshape(*input.shape[:-1], output.shape[-1])


def load_reference(path):
    pipe = Cosmos3OmniPipeline.from_pretrained(path, enable_safety_checker=False, torch_dtype=torch.float32)
    assert use_real_fp8_gemm(pipe.transformer) == 28  # every linear of the 2 tiny layers
    pipe.scheduler = UniPCMultistepScheduler.from_config(pipe.scheduler.config, flow_shift=3.0,
                                                         use_karras_sigmas=False)
    return pipe


CASES = {  # name: (checkpoint, overrides, latent tolerance or None: trace only)
    "policy": ("fp8", {}, 3e-2),
    "all-w8a16": ("fp8", dict(mixed_precision_first_steps=STEPS), 1e-4),
    "first1-last2": ("fp8", dict(mixed_precision_first_steps=1, mixed_precision_last_steps=2), None),
    "reasoner-base": ("fp8", dict(mixed_precision_reasoner_policy="base_precision"), None),
    "format-none": ("fp8", dict(mixed_precision_format="none"), None),
    "distilled-native": ("fp8-distilled", {}, None),
    "distilled-forced": ("fp8-distilled", dict(mixed_precision_format="fp8", mixed_precision_first_steps=4,
                                                mixed_precision_last_steps=3), 3e-2),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_generation_equals_the_reference_mixed_precision_pipeline(checkpoints, reference_fp8_gemm, monkeypatch, case):
    name, overrides, tolerance = CASES[case]
    if tolerance is None:  # trace only
        monkeypatch.setattr(fpg, "_fp8_gemm_impl", fp8_gemm_in_fp32)
    reference = load_reference(checkpoints[name])
    ref = reference(prompt=PROMPT, negative_prompt=NEGATIVE, num_frames=F, height=H, width=W, fps=24.0,
                    num_inference_steps=STEPS, guidance_scale=6.0, enable_sound=True,
                    generator=torch.Generator("cpu").manual_seed(SEED), output_type="latent",
                    **{k: v for k, v in overrides.items() if k != "mixed_precision_overlap"})
    ours = Cosmos3Pipeline.load(checkpoints[name], dtype=torch.float32, device="cpu")
    assert sum(isinstance(m, Fp8Linear) and m.has_w8a8 for m in ours.transformer.modules()) == 28
    seen = []
    real = ours.transformer.denoise_step

    def recording(*args, precision=None, **kwargs):
        seen.append(precision)
        return real(*args, precision=precision, **kwargs)

    ours.transformer.denoise_step = recording
    request = Request(prompt=PROMPT, negative_prompt=NEGATIVE, num_frames=F, height=H, width=W, fps=24.0,
                      steps=STEPS, guidance=6.0, seed=SEED, schedule="flow_shift", shift=3.0, sound=True,
                      options=EMULATE, **overrides)
    out = generate(ours, request, decode=False)
    trace = reference._mixed_precision_trace
    assert len(trace) == STEPS
    assert resolve(request, ours.info).sampling.mixed_precision.schedule(STEPS) == tuple(trace)
    modes = list(seen)
    if reference._mixed_precision_config.enabled:
        assert [m.generation for m in modes] == trace
        want = "W8A16" if reference._mixed_precision_config.reasoner_policy == "high_precision" else "W8A8"
        assert all(m.reasoner == want for m in modes)
    else:
        assert set(trace) == {"base"} and all(p == ("W8A8", "W8A8", "W8A8") for p in seen)
    assert out.latents.shape == ref.video.shape
    print(case, "latents rel", rel(out.latents, ref.video))
    if tolerance is not None:
        assert rel(out.latents, ref.video) <= tolerance, case
        wave = ours.decode_sound(out.sound_latent, F, 24.0)
        assert rel(wave, ref.sound[:, : wave.shape[1]]) <= tolerance, case


def test_w8a8_steps_really_differ_from_w8a16(checkpoints):
    """The schedule matters: the same run with every step W8A16 gives other latents."""
    ours = Cosmos3Pipeline.load(checkpoints["fp8"], dtype=torch.float32, device="cpu")
    request = dict(prompt=PROMPT, negative_prompt=NEGATIVE, num_frames=F, height=H, width=W, steps=STEPS, seed=SEED,
                   options=EMULATE)
    mixed = generate(ours, Request(**request), decode=False)
    all_high = Request(**request, mixed_precision_first_steps=STEPS, mixed_precision_reasoner_policy="high_precision")
    high = generate(ours, all_high, decode=False)
    assert resolve(all_high, ours.info).sampling.mixed_precision.schedule(STEPS) == ("W8A16",) * STEPS
    assert 1e-6 < rel(mixed.latents, high.latents) < 0.5


def test_every_fp8_linear_of_a_w8a8_step_computes_the_references_output(checkpoints, reference_fp8_gemm,
                                                                        monkeypatch):
    """One guided T2V step with W8A8 everywhere (a 1-step run stays native; the reasoner path at base precision):
    every call of every FP8 linear of the reference — its real activations — is replayed through our layer: the
    same output to fp32 summation order. Ours runs W8A8 on the same layers in the same run."""
    reference = load_reference(checkpoints["fp8"])
    calls: list[tuple[str, torch.Tensor, torch.Tensor]] = []
    for name, module in reference.transformer.named_modules():
        if hasattr(module, "_should_run_real_quant_gemm") and module.weight.dtype == torch.float8_e4m3fn:
            module.register_forward_hook(
                lambda m, args, out, name=name: calls.append((name, args[0].detach().clone(), out.detach().clone())))
    reference(prompt=PROMPT, negative_prompt=NEGATIVE, num_frames=F, height=H, width=W, fps=24.0,
              num_inference_steps=1, guidance_scale=6.0, generator=torch.Generator("cpu").manual_seed(SEED),
              output_type="latent", enable_sound=True, mixed_precision_reasoner_policy="base_precision")
    ours = Cosmos3Pipeline.load(checkpoints["fp8"], dtype=torch.float32, device="cpu")
    names = {id(m): n for n, m in ours.transformer.named_modules()}
    ran: set[str] = set()
    real = Fp8Linear.w8a8

    def recording(self, x):
        ran.add(names[id(self)])
        return real(self, x)

    monkeypatch.setattr(Fp8Linear, "w8a8", recording)
    generate(ours, Request(prompt=PROMPT, negative_prompt=NEGATIVE, num_frames=F, height=H, width=W, steps=1,
                           guidance=6.0, seed=SEED, schedule="flow_shift", shift=3.0, sound=True, options=EMULATE,
                           mixed_precision_reasoner_policy="base_precision"), decode=False)
    last = len(ours.transformer.layers) - 1
    unused = {f"layers.{last}.self_attn.to_out"} | {f"layers.{last}.mlp.{p}" for p in ("gate_proj", "up_proj",
                                                                                      "down_proj")}
    assert ran == {name for name, _, _ in calls} - unused  # the last text layer's output feeds nothing
    worst = 0.0
    for name, x, y in calls:
        mine = real(ours.transformer.get_submodule(name), x)
        worst = max(worst, rel(mine, y))
    assert len(calls) == 2 * 28 and worst <= 2e-6


def test_compiled_w8a8_and_sea_cache_steps_equal_eager(checkpoints):
    """The FP8 layers and each step's precision key go through the compiled generation layer (the saved-graph
    path, traced with aot_eager on the CPU), SeaCache's subsets of branches included: the same run, bit for bit."""
    from cosmos3_core.sampling.sea_cache import SeaCacheConfig

    ours = Cosmos3Pipeline.load(checkpoints["fp8"], dtype=torch.float32, device="cpu")
    text = ours.encode_text(PROMPT, NEGATIVE, num_frames=F, height=H, width=W, fps=24.0)
    runs = []
    for options in (EMULATE, RuntimeOptions(fp8_gemm="emulate", compile="on", compile_backend="aot_eager")):
        plan = api.plan(ours, text, seed=SEED, steps=STEPS, guidance=6.0, sound=True, options=options,
                         sea_cache=SeaCacheConfig(threshold=0.6))
        assert set(plan.precision) == {StepPrecision("W8A16", "W8A16", "W8A8"), StepPrecision("W8A8", "W8A16", "W8A8")}
        runs.append((ours.run(plan).latents, plan.cache.trace))
    assert torch.equal(runs[0][0], runs[1][0]) and runs[0][1] == runs[1][1]
    assert not all(computed for *_, computed in runs[0][1])


def test_approximate_fp8_batch_items_equal_their_single_runs(tiny_checkpoint):
    """The approximate mode (a bf16 checkpoint's weights rounded to FP8, ``fp8_e4m3fn_fast``) scales each token's
    activation by its own range, so a batch item — and each guidance branch, whichever device it runs on — equals
    its own single run, as in every other mode (a scale over the whole batch moved item 0 by 1.2e-2)."""
    ours = Cosmos3Pipeline.load(tiny_checkpoint("nano", sound=True, seed=7), dtype=torch.float32, device="cpu",
                                fp8_compute=True)
    text = ours.encode_text(PROMPT, NEGATIVE, num_frames=F, height=H, width=W, fps=24.0)
    batch = api.plan(ours, text, seed=SEED, steps=STEPS, guidance=6.0, options=EMULATE, batch_size=2)
    assert "approximate" in batch.fp8 and any(p.generation == "W8A8" for p in batch.precision)
    both = ours.run(batch).latents
    for k in range(2):
        one = ours.run(api.plan(ours, text, seed=SEED + k, steps=STEPS, guidance=6.0, options=EMULATE)).latents
        assert rel(both[k : k + 1], one) <= 1e-6, k

"""GPU code paths vs diffusers 0.42.1 / transformers on the tiny checkpoints: CUDA fp32 and bf16 end to end through
both attention routes (SDPA and, where ``flash-attn-4`` imports on an sm90 GPU, FlashAttention-4), the attention
kernels against a float64 softmax, the compiled generation layer and the CUDA-graph reasoner decode. Skipped without
CUDA; run on the lent H200 together with ``bench/bench_generation.py``."""

from __future__ import annotations

import pytest
import torch

from cosmos3_core.kernels import attention as attn
from cosmos3_core.runtime import RuntimeOptions
from support.compare import rel

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
ROUTES = ["sdpa", pytest.param("flash4", marks=pytest.mark.skipif(
    bool(attn.flash4_unavailable_reason()), reason=f"FlashAttention-4: {attn.flash4_unavailable_reason()}"))]


@pytest.fixture()
def route(request):
    """The attention route under test (``RuntimeOptions.attention``)."""
    return request.param


@pytest.fixture(scope="module")
def checkpoint(tiny_checkpoint):
    return tiny_checkpoint("nano", sound=True, seed=7)


@pytest.mark.parametrize("dtype, tol, route", [(torch.float32, 1e-4, "sdpa"), (torch.bfloat16, 3e-2, "sdpa"),
                                              pytest.param(torch.bfloat16, 3e-2, "flash4", marks=ROUTES[1].marks)],
                         indirect=["route"])
def test_t2av_latents_match_diffusers_on_cuda(checkpoint, dtype, tol, route):
    from diffusers import Cosmos3OmniPipeline, UniPCMultistepScheduler

    from cosmos3_core.api import generate
    from cosmos3_core.pipeline import Cosmos3Pipeline
    from cosmos3_core.request import Request
    from cosmos3_core.runtime import RuntimeOptions

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    kw = dict(prompt="a red robot walking on the street", negative_prompt="blurry", num_frames=9, height=64,
              width=96, fps=24.0)
    ref = Cosmos3OmniPipeline.from_pretrained(checkpoint, enable_safety_checker=False, torch_dtype=dtype).to("cuda")
    ref.scheduler = UniPCMultistepScheduler.from_config(ref.scheduler.config, flow_shift=3.0, use_karras_sigmas=False)
    expected = ref(**kw, num_inference_steps=4, guidance_scale=6.0, enable_sound=True, output_type="latent",
                   generator=torch.Generator("cpu").manual_seed(3))
    ours = Cosmos3Pipeline.load(checkpoint, dtype=dtype, device="cuda")
    q, k = torch.empty(1, 4, 8, 128, dtype=dtype, device="cuda"), torch.empty(1, 2, 8, 128, dtype=dtype, device="cuda")
    assert attn.select_route(q, k, backend=route) == route  # the tiny checkpoint's head geometry takes the route
    out = generate(ours, Request(**kw, steps=4, guidance=6.0, seed=3, shift=3.0, sound=True,
                                 options=RuntimeOptions(attention=route)), decode=False)
    assert rel(out.latents, expected.video) <= tol
    wave = ours.decode_sound(out.sound_latent, 9, 24.0)
    assert rel(wave, expected.sound[:, : wave.shape[1]]) <= tol


def reference_attention(q, k, v, causal=False):
    """float64 softmax(QKᵀ/√d)V with key/value heads repeated, on the CPU."""
    q, k, v = (t.double().cpu() for t in (q, k, v))
    k, v = (t.repeat_interleave(q.shape[1] // k.shape[1], 1) for t in (k, v))
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    return s.softmax(-1) @ v


@pytest.mark.parametrize("route", ROUTES, indirect=True)
@pytest.mark.parametrize("causal", [False, True])
def test_attention_routes_match_float64(route, causal):
    """Generation-attention shapes ([text | gen] keys built by cat, grouped heads) and the causal text tower."""
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 8, 333, 128, generator=g).cuda().bfloat16()
    text = torch.randn(2, 2, 0 if causal else 77, 128, generator=g).cuda().bfloat16()
    k = torch.cat([text, torch.randn(2, 2, 333, 128, generator=g).cuda().bfloat16()], dim=2)
    v = torch.cat([text, torch.randn(2, 2, 333, 128, generator=g).cuda().bfloat16()], dim=2)
    assert attn.select_route(q, k, backend=route) == route
    got = attn.attention(q, k, v, causal=causal, backend=route)
    assert got.shape == q.shape and got.dtype == q.dtype
    assert rel(got, reference_attention(q, k, v, causal)) <= 1e-2  # bf16 operands


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_causal_text_attention_builds_no_per_length_cudnn_plan(dtype):
    """A prompt prefill's causal attention runs without cuDNN (a plan per new prompt length cost ~0.14 s a new
    guidance pair on the H200), exact against float64 at every new length."""
    from torch.profiler import ProfilerActivity, profile

    g = torch.Generator().manual_seed(4)
    names = []
    for length in (301, 317):
        q = torch.randn(1, 8, length, 128, generator=g).cuda().to(dtype)
        k, v = (torch.randn(1, 2, length, 128, generator=g).cuda().to(dtype) for _ in range(2))
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            got = attn.attention(q, k, v, causal=True)
            torch.cuda.synchronize()
        names += [e.key.lower() for e in prof.key_averages() if e.device_type.name == "CUDA"]
        assert rel(got, reference_attention(q, k, v, causal=True)) <= (1e-2 if dtype == torch.bfloat16 else 1e-5)
    assert not any("cudnn" in n for n in names), names
    if dtype == torch.bfloat16:
        assert any("flash" in n for n in names), names


def test_cuda_attention_route_matches_cpu_gqa():
    from cosmos3_core.kernels.attention import attention

    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 8, 300, 128, generator=g)
    k = torch.randn(1, 2, 350, 128, generator=g)
    v = torch.randn(1, 2, 350, 128, generator=g)
    expected = attention(q, k, v)
    got = attention(q.cuda().bfloat16(), k.cuda().bfloat16(), v.cuda().bfloat16())
    assert rel(got.float(), expected) <= 2e-2


@pytest.fixture()
def bf16_step(checkpoint):
    """A bf16 CUDA model and one guided step's inputs: ``step(options)`` runs ``denoise_step`` → vision velocity."""
    from cosmos3_core.model.layout import build_layout
    from cosmos3_core.model.loader import load_transformer

    model = load_transformer(checkpoint, dtype=torch.bfloat16, device="cuda")
    kvs = [model.prefill(list(range(1, 40))), model.prefill(list(range(2, 9)))]
    layout = build_layout(model.config, [kv.length for kv in kvs], (3, 4, 6), 24.0, device="cuda",
                          dtype=torch.bfloat16)
    x = torch.randn(1, 48, 3, 4, 6, device="cuda")
    t = torch.tensor(900, device="cuda")
    return model, lambda options=RuntimeOptions(compile=False): model.denoise_step(x, t, kvs, layout, options=options).vision.float()


def test_compiled_generation_layer_matches_eager(bf16_step):
    model, step = bf16_step
    eager = step()
    compiled = step(RuntimeOptions(compile=True))
    assert rel(compiled, eager) <= 2e-2  # bf16: fused kernels round intermediates differently
    assert torch.equal(step(), eager)  # compile off again: the eager layer, nothing left switched on


@pytest.mark.parametrize("route", ROUTES, indirect=True)
def test_compiled_step_with_route_matches_eager(bf16_step, route):
    """torch.compile traces through the attention op (a registered custom op for FlashAttention-4) in one graph:
    the saved (AOT) graphs are whole graphs, so a graph break at the attention call would fail the compile."""
    from cosmos3_core.kernels import precompiled
    from cosmos3_core.model.transformer import generation_layer_fn

    model, step = bf16_step
    eager = step(RuntimeOptions(attention=route))
    compiled = step(RuntimeOptions(attention=route, compile=True))
    assert rel(compiled, eager) <= 2e-2
    if precompiled.aot_supported():
        fn = generation_layer_fn(RuntimeOptions(compile=True))
        assert not fn._aot_failed and (fn.compiled or fn.loaded)  # whole graphs, saved or loaded

def test_reasoner_cuda_graph_decode_matches_eager(tiny_checkpoint):
    from cosmos3_core.reasoner.reasoner import Cosmos3Reasoner, SamplingParams

    root = tiny_checkpoint("nano", seed=0, reasoner=True)
    reasoner = Cosmos3Reasoner.load(root, dtype=torch.float32, device="cuda")
    reasoner.eos_token_ids = []
    prompt = reasoner.prepare("describe the robot on the street")
    no_graphs = RuntimeOptions(cuda_graphs=False)
    eager = reasoner.generate_ids(prompt, SamplingParams(max_new_tokens=24), options=no_graphs)
    graphed = reasoner.generate_ids(prompt, SamplingParams(max_new_tokens=24))
    assert graphed == eager and len(eager[0]) == 24
    reasoner.graph_sampling = False  # the greedy pick outside the captured step
    assert reasoner.generate_ids(prompt, SamplingParams(max_new_tokens=24)) == eager
    reasoner.graph_sampling = True
    penalized = SamplingParams(max_new_tokens=24, repetition_penalty=1.3)
    expected = reasoner.generate_ids(prompt, penalized, options=no_graphs)
    assert reasoner.generate_ids(prompt, penalized) == expected  # the penalty's `seen` updated inside the graph
    # inductor's fused decode layer, captured inside the graph
    assert reasoner.generate_ids(prompt, SamplingParams(max_new_tokens=24), options=RuntimeOptions(compile=True)) == eager


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n, k", [(6144, 4096), (4096, 12288), (1000, 1000), (131072, 2048)])
def test_triton_gemv_matches_float64(n, k, dtype):
    from cosmos3_core.kernels import gemv

    if gemv.triton_unavailable_reason():
        pytest.skip(gemv.triton_unavailable_reason())
    torch.manual_seed(n + k)
    w, x = torch.randn(n, k, device="cuda", dtype=dtype) * 0.05, torch.randn(1, k, device="cuda", dtype=dtype)
    exact = (x.double() @ w.double().T).view(-1)
    y = gemv.triton_gemv(x, w)
    assert y.shape == (n,) and y.dtype == dtype
    # fp32 accumulation + one rounding to nearest: within half a unit in the last place of the largest output
    half_ulp = {torch.bfloat16: 2 ** -9, torch.float16: 2 ** -12}[dtype]
    assert float((y.double() - exact).abs().max()) <= 1.01 * half_ulp * 2 * float(exact.abs().max())


def test_reasoner_bf16_decode_through_the_triton_gemv(tiny_checkpoint):
    """The decode step's projections through the Triton GEMV (forced: a fallback would raise) against cuBLAS, eager
    and compiled inside the CUDA graph (the custom op traces: ``fullgraph=True``)."""
    from cosmos3_core.kernels import gemv
    from cosmos3_core.reasoner.reasoner import Cosmos3Reasoner, SamplingParams, decode_weights

    if gemv.triton_unavailable_reason():
        pytest.skip(gemv.triton_unavailable_reason())
    root = tiny_checkpoint("nano", seed=0, reasoner=True)
    reasoner = Cosmos3Reasoner.load(root, dtype=torch.bfloat16, device="cuda")
    reasoner.eos_token_ids = []
    prompt = reasoner.prepare("describe the robot on the street")

    def teacher_forced(route, tokens=(5, 9, 2, 7)):
        options = RuntimeOptions(gemv=route)
        reasoner.prefill(prompt, cache_len=prompt.length + len(tokens), options=options)
        weights = decode_weights(reasoner.transformer, route)
        return torch.stack([reasoner.decode_step(torch.tensor([t], device="cuda"),
                                                 torch.tensor(prompt.length + i, device="cuda"),
                                                 torch.tensor(prompt.next_position + i, device="cuda"), weights,
                                                 options)
                            for i, t in enumerate(tokens)])

    cublas = teacher_forced("torch")
    assert rel(teacher_forced("triton"), cublas) <= 1e-2
    triton = RuntimeOptions(gemv="triton")
    eager_ids = reasoner.generate_ids(prompt, SamplingParams(max_new_tokens=16), options=triton)
    compiled_ids = reasoner.generate_ids(prompt, SamplingParams(max_new_tokens=16),
                                         options=RuntimeOptions(gemv="triton", compile=True))
    assert len(compiled_ids[0]) == 16
    assert compiled_ids[0][:4] == eager_ids[0][:4]  # fused rounding may part tied random logits later on
    with torch.inference_mode():  # as under ComfyUI: weights loaded and decoded as inference tensors
        host = Cosmos3Reasoner.load(root, dtype=torch.bfloat16, device="cuda")
        host.eos_token_ids = []
        assert host.generate_ids(host.prepare("describe the robot on the street"),
                                 SamplingParams(max_new_tokens=16), options=triton) == eager_ids


def test_distilled_i2v_matches_diffusers_on_cuda(tiny_checkpoint):
    """Distilled 4-step I2V on CUDA fp32 == ``Cosmos3DistilledModularPipeline`` on CUDA with the same CPU generator:
    the stochastic steps' noise is drawn on the CPU on both sides (device-independent), then moved."""
    import numpy as np
    from diffusers import ModularPipeline
    from PIL import Image

    from cosmos3_core.api import generate
    from cosmos3_core.pipeline import Cosmos3Pipeline
    from cosmos3_core.request import Request

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    ckpt = tiny_checkpoint("super", seed=5, distilled=True)
    image = Image.fromarray(np.random.default_rng(1).integers(0, 256, (80, 100, 3), dtype=np.uint8))
    kw = dict(prompt="a red robot walking on the street", num_frames=9, height=64, width=96, image=image)
    ref = ModularPipeline.from_pretrained(str(ckpt))
    ref.load_components(torch_dtype=torch.float32)
    ref.disable_safety_checker()
    ref.to("cuda")
    expected = ref(**kw, generator=torch.Generator("cpu").manual_seed(3), output_type="latent").get("videos")
    ours = Cosmos3Pipeline.load(ckpt, dtype=torch.float32, device="cuda")
    out = generate(ours, Request(**kw, seed=3), decode=False)
    assert rel(out.latents, expected) <= 1e-4



def test_vae_decode_to_host_matches_diffusers(checkpoint):
    """A CUDA decode into a host output goes through two pinned staging buffers (chunk k lands in the output while
    chunk k+1 decodes): its frames equal diffusers' whole-clip decode on the same GPU, for every chunk size, and
    ``on_chunk`` still reports every chunk once, in order."""
    from diffusers import AutoencoderKLWan

    from cosmos3_core.vae.video import load_vae

    torch.backends.cudnn.allow_tf32 = False
    vae = load_vae(checkpoint, dtype=torch.float32, device="cuda")
    ref = AutoencoderKLWan.from_pretrained(f"{checkpoint}/vae", torch_dtype=torch.float32).to("cuda")
    latents = torch.randn(1, vae.latent_channels, 5, 4, 6, generator=torch.Generator().manual_seed(0))
    mean, inv_std = vae.stats()
    with torch.no_grad():
        expected = ref.decode(latents.cuda() / inv_std + mean).sample.clamp(-1, 1)
    expected = (expected[0].float() * 0.5 + 0.5).clamp(0, 1).permute(1, 2, 3, 0).cpu()
    for chunk, reports in ((1, [1, 2, 3, 4, 5]), (2, [2, 4, 5]), (5, [5])):
        seen = []
        out = vae.decode(latents, chunk_latent_frames=chunk, on_chunk=lambda done, total, seen=seen: seen.append(done),
                         out_device="cpu")
        assert out.device.type == "cpu" and seen == reports
        torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
    # compiled (inductor) over channels-last activations and weights; then a host reloads the weights in the default
    # layout: the next clip puts them back before the compiled stages run (they were traced channels-last)
    for _ in range(2):
        out = vae.decode(latents, chunk_latent_frames=2, compile=True, out_device="cpu")
        torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
        for m in vae.vae.decoder.modules():
            if isinstance(m, (torch.nn.Conv2d, torch.nn.Conv3d)):
                m.weight.data = m.weight.data.contiguous()
    # each causal conv's history owns exactly its two frames: inductor turns a copy-out of a dense channels-last
    # slice into a view, which would keep every whole conv input alive from one frame to the next
    dec, state = vae.frame_decoder(compile=True), []
    with torch.no_grad():
        x = vae.vae.post_quant_conv(latents.cuda())
        for i in range(4):
            dec(x[:, :, i:i + 1], state, i == 0)
    hists = [h for stage in state for h in stage]
    assert hists and all(h.untyped_storage().nbytes() == h.numel() * h.element_size() for h in hists)


def test_restarted_process_loads_the_compiled_vae_stages(tmp_path):
    """Inductor on the GPU: the first process compiles and saves each decoder stage, a restarted one loads them all
    and traces nothing; both decode diffusers' frames (tests/test_precompiled.py's worker, tiny VAE, fp32)."""
    from cosmos3_core.kernels import precompiled

    if not precompiled.aot_supported():
        pytest.skip("this torch has no AOT compile")
    import test_precompiled as tp

    first = tp.run_worker(tmp_path / "cache", "inductor", "cuda")
    second = tp.run_worker(tmp_path / "cache", "inductor", "cuda")
    assert first["compiled"] >= 3 and first["loaded"] == 0 and "bytecode_tracing" in first["traced"]
    assert second["loaded"] == first["compiled"] and second["compiled"] == 0 and second["traced"] == []
    assert first["err"] <= 1e-4 and second["err"] <= 1e-4

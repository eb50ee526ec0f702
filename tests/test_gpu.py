"""GPU code paths vs diffusers 0.42.1 on the tiny checkpoint: CUDA fp32 and bf16 end to end, the CUDA attention
route (grouped-query SDPA, cuDNN) and the compiled generation layer. Skipped without CUDA; run on the lent H200
together with ``bench/bench_generation.py``."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from cosmos3_core.tiny import build_tiny_checkpoint

    return build_tiny_checkpoint(tmp_path_factory.mktemp("nano"), variant="nano", sound=True, seed=7)


def rel(a, b) -> float:
    a, b = torch.as_tensor(a).double().cpu(), torch.as_tensor(b).double().cpu()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-4), (torch.bfloat16, 3e-2)])
def test_t2av_latents_match_diffusers_on_cuda(checkpoint, dtype, tol):
    from diffusers import Cosmos3OmniPipeline, UniPCMultistepScheduler

    from cosmos3_core.pipeline import Cosmos3Pipeline, GenerationRequest

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    kw = dict(prompt="a red robot walking on the street", negative_prompt="blurry", num_frames=9, height=64,
              width=96, fps=24.0)
    ref = Cosmos3OmniPipeline.from_pretrained(checkpoint, enable_safety_checker=False, torch_dtype=dtype).to("cuda")
    ref.scheduler = UniPCMultistepScheduler.from_config(ref.scheduler.config, flow_shift=3.0, use_karras_sigmas=False)
    expected = ref(**kw, num_inference_steps=4, guidance_scale=6.0, enable_sound=True, output_type="latent",
                   generator=torch.Generator("cpu").manual_seed(3))
    ours = Cosmos3Pipeline.load(checkpoint, dtype=dtype, device="cuda")
    out = ours.generate(GenerationRequest(**kw, steps=4, guidance=6.0, seed=3, shift=3.0, sound=True), decode=False)
    assert rel(out.latents, expected.video) <= tol
    wave = ours.decode_sound(out.sound_latent, 9, 24.0)
    assert rel(wave, expected.sound[:, : wave.shape[1]]) <= tol


def test_cuda_attention_route_matches_cpu_gqa():
    from cosmos3_core.attention import attention

    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 8, 300, 128, generator=g)
    k = torch.randn(1, 2, 350, 128, generator=g)
    v = torch.randn(1, 2, 350, 128, generator=g)
    expected = attention(q, k, v)
    got = attention(q.cuda().bfloat16(), k.cuda().bfloat16(), v.cuda().bfloat16())
    assert rel(got.float(), expected) <= 2e-2


@pytest.fixture()
def bf16_step(checkpoint):
    """A bf16 CUDA model and one guided step's inputs: ``step()`` runs ``denoise_step`` → vision velocity."""
    from cosmos3_core.layout import build_layout
    from cosmos3_core.loader import load_transformer

    model = load_transformer(checkpoint, dtype=torch.bfloat16, device="cuda")
    kvs = [model.prefill(list(range(1, 40))), model.prefill(list(range(2, 9)))]
    layout = build_layout(model.config, [kv.length for kv in kvs], (3, 4, 6), 24.0, device="cuda",
                          dtype=torch.bfloat16)
    x = torch.randn(1, 48, 3, 4, 6, device="cuda")
    t = torch.tensor(900, device="cuda")
    return model, lambda: model.denoise_step(x, t, kvs, layout).vision.float()


def test_compiled_generation_layer_matches_eager(bf16_step):
    model, step = bf16_step
    eager = step()
    model.compile_generation_layers(True)
    try:
        compiled = step()
    finally:
        model.compile_generation_layers(False)
    assert rel(compiled, eager) <= 2e-2  # bf16: fused kernels round intermediates differently


def test_fp8_fast_mode_stays_close_to_exact(bf16_step):
    """Approximate mode: FP8 GEMMs in the generation tower keep the velocity close to bf16 exact mode."""
    from cosmos3_core.fp8 import disable_fp8, enable_fp8

    model, step = bf16_step
    exact = step()
    assert enable_fp8(model) == 2 * 7  # 4 attention + 3 MLP projections per layer
    fast = step()
    disable_fp8(model)
    again = step()
    cos = torch.nn.functional.cosine_similarity(exact.flatten(), fast.flatten(), dim=0)
    assert cos > 0.99 and rel(fast, exact) > 0  # close, and really a different (FP8) computation
    assert torch.equal(again, exact)  # disable_fp8 restores exact mode


def test_distilled_i2v_matches_diffusers_on_cuda(tmp_path):
    """Distilled 4-step I2V on CUDA fp32 == ``Cosmos3DistilledModularPipeline`` on CUDA with the same CPU generator:
    the stochastic steps' noise is drawn on the CPU on both sides (device-independent), then moved."""
    import numpy as np
    from diffusers import ModularPipeline
    from PIL import Image

    from cosmos3_core.pipeline import Cosmos3Pipeline, GenerationRequest
    from cosmos3_core.tiny import build_tiny_checkpoint

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    ckpt = build_tiny_checkpoint(tmp_path / "super4step", variant="super", seed=5, distilled=True)
    image = Image.fromarray(np.random.default_rng(1).integers(0, 256, (80, 100, 3), dtype=np.uint8))
    kw = dict(prompt="a red robot walking on the street", num_frames=9, height=64, width=96, image=image)
    ref = ModularPipeline.from_pretrained(str(ckpt))
    ref.load_components(torch_dtype=torch.float32)
    ref.disable_safety_checker()
    ref.to("cuda")
    expected = ref(**kw, generator=torch.Generator("cpu").manual_seed(3), output_type="latent").get("videos")
    ours = Cosmos3Pipeline.load(ckpt, dtype=torch.float32, device="cuda")
    out = ours.generate(GenerationRequest(**kw, seed=3), decode=False)
    assert rel(out.latents, expected) <= 1e-4

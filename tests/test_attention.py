"""The attention entry point's route selection and the FlashAttention-4 custom op's plumbing, on the CPU.

The FlashAttention-4 kernel itself only runs on a Hopper GPU (tests/test_gpu.py runs it against diffusers there).
Here a stand-in kernel with FlashAttention-4's calling convention (``[B, S, H, hd]`` tensors, grouped-query heads,
returns ``(out, lse)``), written as an explicit float64 softmax, checks what our side does: the layout transposes,
grouped heads, causal masking, the fake (meta) implementation ``torch.compile`` traces with, and that a compiled
caller has no graph break. The reference is a plain float64 softmax(QKᵀ/√d)V, not our SDPA route.
"""

from __future__ import annotations

import math

import pytest
import torch

from cosmos3_core.kernels import attention as attn


def reference(q, k, v, causal=False):
    """float64 softmax attention, ``[B, H, S, hd]`` layout, key/value heads repeated for grouped queries."""
    q, k, v = q.double(), k.double(), v.double()
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        sq, sk = scores.shape[-2:]
        scores = scores.masked_fill(torch.ones(sq, sk, dtype=torch.bool).triu(sk - sq + 1), float("-inf"))
    return scores.softmax(-1) @ v


def fake_flash4_kernel(q, k, v, causal=False):
    """FlashAttention-4's convention: ``[B, S, H, hd]`` in and out, plus the log-sum-exp."""
    assert q.shape[-1] == k.shape[-1] and q.shape[2] % k.shape[2] == 0
    out = reference(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal).transpose(1, 2)
    return out.to(q.dtype).contiguous(), None


@pytest.fixture()
def flash4_stub(monkeypatch):
    """Pretend FlashAttention-4 runs here, with the stand-in kernel."""
    calls = []

    def kernel(*args, **kwargs):
        calls.append(args[0].shape)
        return fake_flash4_kernel(*args, **kwargs)

    monkeypatch.setattr(attn, "_flash4_import", lambda: kernel)
    monkeypatch.setattr(attn, "_flash4_ready", lambda device_type, index: True)
    monkeypatch.setattr(attn, "flash4_unavailable_reason", lambda device=None: "")
    monkeypatch.setattr(attn, "FLASH4_MIN_QUERIES", 20)  # small test shapes count as long
    return calls


def rand(*shape, dtype=torch.bfloat16):
    return torch.randn(*shape, dtype=torch.float32).to(dtype)


def test_cpu_uses_sdpa_and_matches_reference():
    q, k, v = rand(1, 8, 40, 64, dtype=torch.float32), rand(1, 2, 52, 64, dtype=torch.float32), rand(1, 2, 52, 64, dtype=torch.float32)
    assert attn.select_route(q, k) == "sdpa"
    torch.testing.assert_close(attn.attention(q, k, v).double(), reference(q, k, v), rtol=1e-5, atol=1e-5)
    kc, vc = k[:, :, :40], v[:, :, :40]  # causal: square, as the text tower uses it
    torch.testing.assert_close(attn.attention(q, kc, vc, causal=True).double(), reference(q, kc, vc, True),
                               rtol=1e-5, atol=1e-5)


def _transformers_eager(q, k, v, allowed):
    """transformers' own ``eager_attention_forward`` (Qwen3-VL: ``repeat_kv`` expanded heads, additive mask)."""
    from types import SimpleNamespace

    from transformers.models.qwen3_vl.modeling_qwen3_vl import eager_attention_forward

    module = SimpleNamespace(num_key_value_groups=q.shape[1] // k.shape[1], training=False)
    additive = torch.zeros(allowed.shape, dtype=q.dtype).masked_fill(~allowed, torch.finfo(q.dtype).min)
    out, _ = eager_attention_forward(module, q, k, v, additive, scaling=q.shape[-1] ** -0.5)
    return out.transpose(1, 2)  # it returns [B, S, H, hd]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_route_matches_transformers_and_sdpa_math_on_a_partly_filled_cache(dtype):
    """One query token over a static cache whose slots past the cursor hold stale values (masked out): the decode
    route against transformers' eager attention (same arithmetic, expanded heads) and against PyTorch's SDPA math
    kernel in float64 over only the filled slots with the key/value heads expanded."""
    pytest.importorskip("transformers")
    from torch.nn.attention import SDPBackend, sdpa_kernel

    filled, size = 27, 48
    q, k, v = rand(2, 8, 1, 64, dtype=dtype), rand(2, 2, size, 64, dtype=dtype), rand(2, 2, size, 64, dtype=dtype)
    k[:, :, filled:] *= 50  # stale slots: large values that would dominate if they leaked through the mask
    v[:, :, filled:] = 1e3
    allowed = (torch.arange(size) < filled).view(1, 1, 1, size)
    assert attn.select_route(q, k, allowed) == "decode"
    out = attn.attention(q, k, v, mask=allowed)
    assert out.shape == q.shape and out.dtype == dtype
    with sdpa_kernel(SDPBackend.MATH):
        kx, vx = (t[:, :, :filled].double().repeat_interleave(4, 1) for t in (k, v))
        exact = torch.nn.functional.scaled_dot_product_attention(q.double(), kx, vx)
    eager = _transformers_eager(q, k, v, allowed)
    if dtype == torch.float32:
        torch.testing.assert_close(out, eager, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(out.double(), exact, rtol=1e-5, atol=1e-5)
    else:  # bf16 scores and probabilities, as transformers' eager path: equal to it up to GEMM blocking
        torch.testing.assert_close(out.float(), eager.float(), rtol=0, atol=1e-2)
        torch.testing.assert_close(out.double(), exact, rtol=0, atol=5e-2)
    # a per-batch mask (different fill per item) broadcasts over the grouped heads too
    per_item = torch.stack([torch.arange(size) < filled, torch.arange(size) < 5]).view(2, 1, 1, size)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(attn.attention(q, k, v, mask=per_item).float(),
                               _transformers_eager(q, k, v, per_item).float(), rtol=tol, atol=tol)


def test_decode_route_selection():
    q, k = rand(1, 8, 1, 64), rand(1, 2, 30, 64)
    allowed = torch.ones(1, 1, 1, 30, dtype=torch.bool)
    assert attn.select_route(q, k, allowed) == "decode"
    assert attn.select_route(rand(1, 8, 3, 64), k, allowed) == "sdpa"  # more than one query: SDPA with the mask
    assert attn.select_route(q, k, allowed.float()) == "sdpa"  # an additive float mask: SDPA
    assert attn.select_route(q, k, allowed, backend="sdpa") == "sdpa"  # the reference route everywhere


def test_backend_setting_is_validated_and_forcing_flash4_without_it_raises():
    from cosmos3_core.checks import check_options
    from cosmos3_core.runtime import RuntimeOptions

    with pytest.raises(ValueError, match="attention='flash3' is not one of"):
        RuntimeOptions(attention="flash3")
    if attn.flash4_unavailable_reason():  # this machine (CI): no Hopper GPU / no flash-attn-4
        with pytest.raises(ValueError, match="attention='flash4': FlashAttention-4 cannot run here"):
            check_options(RuntimeOptions(attention="flash4"))
    check_options(RuntimeOptions(attention="sdpa"))


def test_route_selection_with_flash4_available(flash4_stub):
    q, k = rand(1, 8, 24, 128), rand(1, 2, 20, 128)
    assert attn.select_route(q, k) == "flash4"
    assert attn.select_route(q[:, :, :16], k) == "sdpa"  # "auto": short sequences stay on SDPA (measured faster)
    assert attn.select_route(q.float(), k.float()) == "sdpa"  # fp32: no FlashAttention-4 kernel
    assert attn.select_route(rand(1, 8, 16, 80), rand(1, 2, 20, 80)) == "sdpa"  # unsupported head_dim
    assert attn.select_route(q, k, backend="sdpa") == "sdpa"  # the node/CLI switch
    assert attn.select_route(q[:, :, :16], k, backend="flash4") == "flash4"  # forced: any length
    with pytest.raises(RuntimeError, match="cannot run"):
        attn.select_route(q.float(), k.float(), backend="flash4")  # forced, inputs that do not fit: an error


@pytest.mark.parametrize("causal", [False, True])
def test_flash4_op_layout_and_grouped_heads(flash4_stub, causal):
    q, k, v = rand(2, 8, 24, 64), rand(2, 2, 24 if causal else 37, 64), rand(2, 2, 24 if causal else 37, 64)
    k_text_then_gen = torch.cat([rand(2, 2, 5, 64), k], dim=2)[:, :, 5:]  # a strided view, as in the layer
    out = attn.attention(q, k_text_then_gen, v, causal=causal)
    assert flash4_stub == [torch.Size([2, 24, 8, 64])]  # the kernel saw [B, S, H, hd]
    assert out.shape == q.shape and out.dtype == q.dtype
    torch.testing.assert_close(out.double(), reference(q, k, v, causal), rtol=0, atol=2e-2)


def test_flash4_op_traces_without_graph_breaks(flash4_stub):
    """The fake implementation gives the shape/strides torch.compile plans with; fullgraph proves no break."""
    q, k, v = rand(1, 8, 24, 64), rand(1, 2, 30, 64), rand(1, 2, 30, 64)

    def layer(q, k, v):
        return attn.attention(q * 1.0, k, v).float().sum(-1)

    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(q, k, v), layer(q, k, v))
    assert len(flash4_stub) == 2  # the compiled graph called the op, it did not fall back to SDPA
    out = torch.library.opcheck(attn.flash4_attention, (q, k, v, False), test_utils=("test_schema", "test_faketensor"))
    assert all(v == "SUCCESS" for v in out.values())


def test_the_step_hands_the_run_options_attention_route_to_every_layer(monkeypatch):
    """A run's ``RuntimeOptions.attention`` (CLI --attention, the nodes' ``attention``) reaches the one entry point
    from the generation tower's step, for that call only: no setting outlives the call."""
    from cosmos3_core.model import transformer as tr
    from cosmos3_core.runtime import RuntimeOptions

    seen = []
    real = tr.attention

    def recording(q, k, v, **kwargs):
        seen.append(kwargs.get("backend"))
        return real(q, k, v, **kwargs)

    monkeypatch.setattr(tr, "attention", recording)
    layer_args = _tiny_layer_args()
    tr.generation_layer(*layer_args, attention_backend="sdpa")
    tr.generation_layer(*layer_args)
    assert seen == ["sdpa", "auto"]
    assert RuntimeOptions().attention == "auto"


def _tiny_layer_args():
    from cosmos3_core.config import Cosmos3Config
    from cosmos3_core.model.layers import DecoderLayer

    cfg = Cosmos3Config(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=16, vocab_size=32, rope_axes_dim=(4, 2, 2))
    layer = DecoderLayer(cfg, torch.nn.Linear).eval()
    x = torch.randn(1, 6, 64)
    cos, sin = torch.ones(1, 6, 16), torch.zeros(1, 6, 16)
    return layer, x, cos, sin, [torch.randn(1, 2, 3, 16)], [torch.randn(1, 2, 3, 16)]

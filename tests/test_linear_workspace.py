"""The room a host keeps for a quantized linear layer's call (``weights.linear_call_workspace``) covers what the call
really allocates: measured with PyTorch's own memory profiler (the CPU allocator's events, in time order) on one
call of each kind of layer the loader builds — an NVIDIA FP8 layer's W8A16 forward, an FP8- or bf16-stored cast
weight, every GGML type the loader reads, a GGUF layer with a LoRA on top — at a layer size where the weight
dominates. These are eager calls on the CPU allocator; a compiled GPU step may fuse the dense weight away or hold
it differently: the card-size benchmark on a GPU checks that.

The node reserves this beside a run's working memory when it asks ComfyUI to load a tower (text and generation):
an estimate below the real allocation lets ComfyUI fill the card with weights and the call then runs out of memory.
"""

from __future__ import annotations

import pytest
import torch
from test_gguf import random_blocks
from torch.profiler import ProfilerActivity, profile

from cosmos3_core.model.fp8 import Fp8Linear, quantize_weight
from cosmos3_core.model.gguf_quants import BY_NAME, GgufLinear
from cosmos3_core.model.lora import LoraPatch
from cosmos3_core.model.weights import CastLinear, linear_call_workspace

OUT, IN, ROWS = 512, 1024, 4  # the weight (512 K values) dwarfs the input and output (4 rows)


def peak_allocated(fn) -> tuple[int, torch.Tensor]:
    """The most bytes held at once by allocations made during ``fn()`` (its result's included)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = fn()
    deltas = sorted((e.time_range.start, e.cpu_memory_usage if e.name == "[memory]" else e.self_cpu_memory_usage)
                    for e in prof.events())
    live = peak = 0
    for _, delta in deltas:
        live += delta
        peak = max(peak, live)
    return peak, out


def fp8_layer(dtype):
    layer = Fp8Linear(IN, OUT, bias=True)
    w8, scale = quantize_weight(torch.randn(OUT, IN))
    layer.weight = torch.nn.Parameter(w8, requires_grad=False)
    layer.scale_weight = torch.nn.Parameter(scale, requires_grad=False)
    layer.bias = torch.nn.Parameter(torch.randn(OUT, dtype=dtype), requires_grad=False)
    return layer


def cast_layer(storage, dtype):
    layer = CastLinear(IN, OUT, bias=True)
    layer.weight = torch.nn.Parameter(torch.randn(OUT, IN).to(storage), requires_grad=False)
    layer.bias = torch.nn.Parameter(torch.randn(OUT, dtype=dtype), requires_grad=False)
    return layer


def gguf_layer(kind, dtype):
    layer = GgufLinear(IN, OUT, bias=True)
    layer.quantize_as(BY_NAME[kind])
    blocks = torch.from_numpy(random_blocks(kind, OUT, IN, seed=1)).view(torch.uint8)
    layer.weight = torch.nn.Parameter(blocks.reshape(layer.weight.shape), requires_grad=False)
    layer.bias = torch.nn.Parameter(torch.randn(OUT, dtype=dtype), requires_grad=False)
    return layer


def gguf_lora_layer(dtype):
    layer = gguf_layer("Q8_0", dtype)
    lora = LoraPatch("lora", {"up": torch.randn(OUT, 8), "down": torch.randn(8, IN)}, 0.5, "test")
    layer.add_patch(lora, 0.8)
    return layer


LAYERS = {
    "fp8_w8a16": lambda dtype: fp8_layer(dtype),
    "cast_fp8_e4m3fn": lambda dtype: cast_layer(torch.float8_e4m3fn, dtype),
    "cast_same_dtype": lambda dtype: cast_layer(dtype, dtype),
    **{f"gguf_{k.lower()}": (lambda dtype, k=k: gguf_layer(k, dtype))
       for k in ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K")},
    "gguf_q8_0_lora": gguf_lora_layer,
}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("kind", list(LAYERS))
def test_the_reserved_room_covers_a_calls_allocations(kind, dtype):
    layer = LAYERS[kind](dtype)
    x = torch.randn(ROWS, IN, dtype=dtype)
    with torch.no_grad():
        peak, out = peak_allocated(lambda: layer(x))
    reserved = linear_call_workspace(layer, dtype)
    assert peak - out.nbytes <= reserved, (kind, peak, reserved)
    assert peak >= OUT * IN * dtype.itemsize  # the call did build a dense weight: the measurement sees it


def test_a_model_reserves_for_its_largest_quantized_layer():
    small, large = fp8_layer(torch.bfloat16), torch.nn.Linear(4 * IN, 4 * OUT, dtype=torch.bfloat16)
    model = torch.nn.ModuleDict({"fp8": small, "plain": large})
    # a bf16 layer in a bf16 run builds no other weight; the FP8 layer's cast weight and its product with the scale
    assert linear_call_workspace(model, torch.bfloat16) == 2 * OUT * IN * 2
    assert linear_call_workspace(torch.nn.Linear(IN, OUT, dtype=torch.bfloat16), torch.bfloat16) == 0

"""Packed projections (cosmos3_core.kernels.packed): the packed matrix is the layers' own weights, read as one GEMV.

The expected values are torch's own per-layer ``F.linear`` and the weights as they were before packing; the
reasoner's packed decode is checked against its layer-by-layer decode and (in test_reasoner.py, whose greedy and
compiled generations run through the packed path) against transformers.
"""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from cosmos3_core.kernels.packed import packed_weight


def _linears(widths=(8, 4, 4), d=16, dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    return [nn.Linear(d, w, bias=False).to(dtype) for w in widths]


def test_packed_rows_are_the_layers_weights_and_outputs_match():
    layers = _linears()
    before = [m.weight.detach().clone() for m in layers]
    x = torch.randn(3, 16)
    outputs = [F.linear(x, w) for w in before]
    w = packed_weight(layers)
    assert w.shape == (16, 16)
    torch.testing.assert_close(w, torch.cat(before), rtol=0, atol=0)
    for m, b in zip(layers, before):  # the modules still hold the same values, as row blocks of one tensor
        torch.testing.assert_close(m.weight, b, rtol=0, atol=0)
        assert m.weight.untyped_storage().data_ptr() == w.untyped_storage().data_ptr()
    torch.testing.assert_close(F.linear(x, w).split([8, 4, 4], dim=-1), tuple(outputs), rtol=1e-6, atol=1e-6)
    # a second call is a view of the same storage: nothing copied, nothing allocated
    again = packed_weight(layers)
    assert again.data_ptr() == w.data_ptr() and again.untyped_storage().data_ptr() == w.untyped_storage().data_ptr()


def test_packing_keeps_parameters_and_state_dict():
    block = nn.Sequential(*_linears())
    params = [id(p) for p in block.parameters()]
    state = {k: v.clone() for k, v in block.state_dict().items()}
    packed_weight(list(block))
    assert [id(p) for p in block.parameters()] == params
    for k, v in block.state_dict().items():
        torch.testing.assert_close(v, state[k], rtol=0, atol=0)
        assert v.is_contiguous()


def test_in_place_updates_are_seen_and_replaced_weights_repacked():
    layers = _linears()
    w = packed_weight(layers)
    with torch.no_grad():
        layers[1].weight.add_(1.0)  # a host patching in place (ComfyUI's copy_to_param)
    torch.testing.assert_close(w[8:12], layers[1].weight.detach(), rtol=0, atol=0)
    new = torch.randn(4, 16)
    layers[2].weight = nn.Parameter(new.clone())  # a host replacing the parameter (set_attr_param, .to(device))
    w2 = packed_weight(layers)
    torch.testing.assert_close(w2[12:], new, rtol=0, atol=0)
    torch.testing.assert_close(w2[:12], torch.cat([layers[0].weight, layers[1].weight]).detach(), rtol=0, atol=0)


def test_packing_under_inference_mode_leaves_writable_weights():
    layers = _linears()
    with torch.inference_mode():
        packed_weight(layers)
    assert not any(m.weight.is_inference() for m in layers)
    with torch.no_grad():
        layers[0].weight.mul_(2.0)  # would raise for an inference tensor outside inference mode


@pytest.mark.parametrize("call_mode", [False, True], ids=["called_outside", "called_inside"])
def test_weights_loaded_under_inference_mode_pack_and_stay_inference_tensors(call_mode):
    with torch.inference_mode():  # how ComfyUI loads a model: its nodes run under inference mode
        layers = _linears()
    before = [m.weight.detach().clone() for m in layers]
    x = torch.randn(3, 16)
    for _ in range(2):  # packing, then the view over the packed storage
        with torch.inference_mode(call_mode):
            w = packed_weight(layers)
            torch.testing.assert_close(F.linear(x, w), F.linear(x, torch.cat(before)), rtol=0, atol=0)
    assert all(m.weight.is_inference() for m in layers)  # same kind as loaded: a host patches them in inference mode
    with torch.inference_mode(), torch.no_grad():
        layers[1].weight.add_(1.0)
    torch.testing.assert_close(w[8:12], before[1] + 1.0, rtol=0, atol=0)


def test_a_mix_of_inference_and_normal_weights_is_left_alone():
    layers = _linears()
    with torch.inference_mode():
        layers[2] = nn.Linear(16, 4, bias=False)
    ptrs = [m.weight.data_ptr() for m in layers]
    assert packed_weight(layers) is None
    assert [m.weight.data_ptr() for m in layers] == ptrs


@pytest.mark.parametrize("case", ["bias", "dtype_mix", "fp8", "width", "host_cast", "weight_function", "one"])
def test_layers_that_cannot_be_packed_are_left_alone(case):
    layers = _linears()
    if case == "bias":
        layers[1] = nn.Linear(16, 4)
    elif case == "dtype_mix":
        layers[1] = layers[1].to(torch.float64)
    elif case == "fp8":
        if not hasattr(torch, "float8_e4m3fn"):
            pytest.skip("no float8 dtype in this torch")
        for m in layers:
            m.weight.data = m.weight.data.to(torch.float8_e4m3fn)
    elif case == "width":
        layers[1] = nn.Linear(12, 4, bias=False)
    elif case == "host_cast":
        layers[0].comfy_cast_weights = True  # ComfyUI's comfy.ops: casts (or streams) the weight at each call
    elif case == "weight_function":
        layers[2].weight_function = [lambda w: w]
    elif case == "one":
        layers = layers[:1]
    ptrs = [m.weight.data_ptr() for m in layers]
    assert packed_weight(layers) is None
    assert [m.weight.data_ptr() for m in layers] == ptrs  # untouched


@pytest.fixture(scope="module", params=["nano", "edge"])
def reasoner(request, tiny_checkpoint):
    pytest.importorskip("transformers")
    from cosmos3_core.model.loader import load_transformer
    from cosmos3_core.reasoner.reasoner import Cosmos3Reasoner
    from cosmos3_core.reasoner.vision import load_processor

    root = tiny_checkpoint(request.param, seed=0, reasoner=True)
    return Cosmos3Reasoner(load_transformer(root, dtype=torch.float32, device="cpu"), load_processor(root),
                           checkpoint_dir=root)


def test_packed_decode_step_equals_layer_by_layer(reasoner):
    from cosmos3_core.reasoner.reasoner import decode_weights

    p = reasoner.prepare("the robot arm picks up a red cup")
    state = {k: v.clone() for k, v in reasoner.transformer.state_dict().items()}
    packed = decode_weights(reasoner.transformer)
    assert all(w.qkv is not None and w.o is not None and w.down is not None for w in packed)
    for w, layer in zip(packed, reasoner.transformer.layers):
        silu = layer.mlp.act == "silu"
        assert (w.gate_up is not None, w.up is not None) == (silu, not silu)
        assert w.o is layer.self_attn.to_out.weight and w.down is layer.mlp.down_proj.weight
    results = []
    for use in (None, packed):
        reasoner.prefill(p, cache_len=p.length + 4)
        steps = [reasoner.decode_step(torch.tensor([t]), torch.tensor(p.length + i), torch.tensor(p.next_position + i),
                                      use) for i, t in enumerate((5, 9, 2))]
        results.append(torch.stack(steps))
    torch.testing.assert_close(results[1], results[0], rtol=1e-5, atol=1e-5)
    for k, v in reasoner.transformer.state_dict().items():  # packing moved no value
        torch.testing.assert_close(v, state[k], rtol=0, atol=0)

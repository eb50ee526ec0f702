"""Weight storage dtypes and NVIDIA's FP8 (ModelOpt) checkpoint layout in the core loader (CPU, fp32 compute).

* FP8/bf16/fp16-stored linear weights give exactly the output of an fp32 model whose linear weights were rounded
  to that dtype by torch (``w.to(fp8).float()``), on the diffusers-parity step of test_transformer_parity;
* a ModelOpt-layout checkpoint (``X.weight`` e4m3 + ``X.weight_quantizer._scale``/``_amax`` +
  ``X.input_quantizer._amax``, ``quantization_config`` in config.json) loads with FP8 weights as published and gives
  exactly the output of the dense checkpoint ``weight.float() * scale``; one cast layer equals diffusers 0.42.1's
  ``_w8a16_linear`` (its W8A16 path for these checkpoints);
* an FP8 weight without its scale is one clear error.
"""

from __future__ import annotations

import json
import shutil
import types

import pytest
import torch
from safetensors.torch import load_file, save_file
from test_transformer_parity import ours_step

from cosmos3_core.config import CheckpointError
from cosmos3_core.model.layers import KEEP_FP32
from cosmos3_core.model.loader import load_transformer
from cosmos3_core.model.weights import STORAGE_DTYPES, CastLinear, check_storage_device

FILE = "diffusion_pytorch_model.safetensors"


@pytest.fixture(scope="module")
def tiny(tiny_checkpoint):
    return tiny_checkpoint("nano", seed=5)


def linear_weight_names(model) -> list[str]:
    return [f"{n}.weight" for n, m in model.named_modules()
            if isinstance(m, torch.nn.Linear) and n.split(".")[0] not in KEEP_FP32]


def step(model):
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, model.config.vocab_size, (17,), generator=g).tolist()
    latents = torch.randn(1, 48, 2, 4, 6, generator=g)
    sound = torch.randn(64, 7, generator=g) if model.config.sound_gen else None
    out = ours_step(model, [ids], latents, 500, 24.0, (), sound)
    return out.vision, out.sound


def copy_checkpoint(src, dst, full: bool = False):
    """A copy of ``src`` (only transformer/ unless ``full``) that the test may rewrite."""
    skip = () if full else ("vae", "sound_tokenizer", "text_tokenizer")
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(*skip))
    return dst


def read_state(ckpt) -> dict[str, torch.Tensor]:
    """All tensors of ``<ckpt>/transformer`` (sharded or not)."""
    state = {}
    for f in sorted((ckpt / "transformer").glob("*.safetensors")):
        state.update(load_file(str(f)))
    return state


def write_state(ckpt, state: dict[str, torch.Tensor]) -> None:
    """Replace ``<ckpt>/transformer``'s weights by one ``diffusion_pytorch_model.safetensors``."""
    for f in (ckpt / "transformer").glob("*.safetensors*"):
        f.unlink()
    save_file(state, str(ckpt / "transformer" / FILE))


@pytest.mark.parametrize("name", list(STORAGE_DTYPES))
def test_stored_weights_equal_rounded_weights(tiny, name):
    storage = STORAGE_DTYPES[name]
    stored = load_transformer(tiny, dtype=torch.float32, storage_dtype=storage)
    rounded = load_transformer(tiny, dtype=torch.float32)
    names = linear_weight_names(rounded)
    params = dict(rounded.named_parameters())
    with torch.no_grad():
        for n in names:  # the reference: torch's own rounding of each fp32 weight
            params[n].copy_(params[n].to(storage).float())
    stored_params = dict(stored.named_parameters())
    assert all(stored_params[n].dtype == storage for n in names)
    assert stored.time_embedder.linear_1.weight.dtype == torch.float32  # KEEP_FP32 stays
    assert stored.layers[0].input_layernorm.weight.dtype == torch.float32  # norms keep the compute dtype
    v1, s1 = step(stored)
    v2, s2 = step(rounded)
    assert torch.equal(v1, v2) and torch.equal(s1, s2)
    exact_v, _ = step(load_transformer(tiny, dtype=torch.float32))
    assert not torch.equal(v1, exact_v)  # the rounding did happen
    if storage.itemsize == 1:
        linear_bytes = sum(stored_params[n].numel() * stored_params[n].element_size() for n in names)
        assert linear_bytes * 4 == sum(params[n].numel() * 4 for n in names)


def write_modelopt(src, dst, drop_scale_of: str | None = None, full: bool = False):
    """A ModelOpt-FP8-layout copy of ``src`` (what NVIDIA's fp8 revision holds) and its dense equivalent."""
    copy_checkpoint(src, dst, full=full)
    sd = read_state(dst)
    dense = dict(sd)
    quantized = [k for k in sd if k.startswith("layers.") and k.endswith(".weight") and sd[k].ndim == 2]
    for k in quantized:
        w = sd[k].float()
        amax = w.abs().amax()
        scale = amax / 448.0
        q = (w / scale).to(torch.float8_e4m3fn)
        prefix = k[: -len(".weight")]
        sd[k] = q
        if k != drop_scale_of:
            sd[prefix + ".weight_quantizer._scale"] = scale.reshape(())
        sd[prefix + ".weight_quantizer._amax"] = amax.reshape(())
        sd[prefix + ".input_quantizer._amax"] = torch.tensor(3.5)
        dense[k] = q.float() * scale
    write_state(dst, sd)
    cfg = json.loads((dst / "transformer" / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "modelopt", "quant_type": "FP8"}
    (dst / "transformer" / "config.json").write_text(json.dumps(cfg))
    return quantized, dense


def test_modelopt_fp8_checkpoint_loads_as_published(tiny, tmp_path):
    quantized, dense = write_modelopt(tiny, tmp_path / "fp8")
    dense_dir = copy_checkpoint(tiny, tmp_path / "dense")
    write_state(dense_dir, dense)
    fp8 = load_transformer(tmp_path / "fp8", dtype=torch.float32)
    params = dict(fp8.named_parameters())
    assert all(params[k].dtype == torch.float8_e4m3fn for k in quantized)
    assert params["proj_in.weight"].dtype == torch.float32  # not quantized in the file: compute dtype
    v1, s1 = step(fp8)
    v2, s2 = step(load_transformer(dense_dir, dtype=torch.float32))
    assert torch.equal(v1, v2) and torch.equal(s1, s2)
    # asking for bf16 storage dequantizes once (weight · scale) and rounds to bf16
    bf16 = load_transformer(tmp_path / "fp8", dtype=torch.float32, storage_dtype=torch.bfloat16)
    k = quantized[0]
    assert torch.equal(dict(bf16.named_parameters())[k], dense[k].to(torch.bfloat16))


def test_cast_layer_equals_diffusers_w8a16(tmp_path):
    from diffusers.pipelines.cosmos.mixed_precision import _w8a16_linear

    g = torch.Generator().manual_seed(0)
    w = torch.randn(24, 40, generator=g)
    scale = w.abs().amax() / 448.0
    q = (w / scale).to(torch.float8_e4m3fn)
    bias = torch.randn(24, generator=g)
    x = torch.randn(3, 5, 40, generator=g)
    ref_layer = types.SimpleNamespace(weight=q, bias=bias, weight_quantizer=types.SimpleNamespace(_scale=scale))
    ours = CastLinear(40, 24)
    ours.weight = torch.nn.Parameter(q, requires_grad=False)
    ours.bias = torch.nn.Parameter(bias)
    ours.scale_weight = torch.nn.Parameter(scale.reshape(()), requires_grad=False)
    with torch.no_grad():
        assert torch.equal(ours(x), _w8a16_linear(ref_layer, x, "layer"))


def test_fp8_weight_without_scale_is_refused(tiny, tmp_path):
    sd = read_state(tiny)
    victim = next(k for k in sd if k.startswith("layers.1.") and k.endswith("add_q_proj.weight"))
    write_modelopt(tiny, tmp_path / "fp8", drop_scale_of=victim)
    with pytest.raises(CheckpointError) as err:
        load_transformer(tmp_path / "fp8", dtype=torch.float32)
    msg = str(err.value)
    assert victim in msg and "weight_quantizer._scale" in msg and "download" in msg, msg


def test_storage_probe_refuses_a_device_that_cannot_hold_it():
    check_storage_device(torch.float8_e4m3fn, "cpu")  # the CPU holds and casts FP8
    with pytest.raises(ValueError, match="weight dtype fp8_e5m2 is not supported on device"):
        check_storage_device(torch.float8_e5m2, "cuda:99")

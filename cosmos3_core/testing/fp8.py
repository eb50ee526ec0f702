"""Tiny ModelOpt-FP8 checkpoint builder (a test fixture, never a model): the layout of NVIDIA's ``fp8`` Hub revisions.

``build_fp8_checkpoint(src, out, policy=FIRST_LAST_N_FP8_POLICY, activation_scales=True)`` copies a tiny checkpoint
(``tiny.py``) and rewrites ``transformer/`` as ModelOpt's FP8 export of it, the files diffusers 0.42.1 (with
nvidia-modelopt's restore) reads:

    transformer/config.json   + ``quantization_config``: ``quant_method: "modelopt"``, ``quant_type: "FP8"``,
                              ``quant_algo: "FP8"`` and, when ``policy`` is given, ``runtime.diffusion_step_policy``
                              (a distilled ``-4Step`` fp8 revision declares none: ``policy=None``)
    transformer/diffusion_pytorch_model.safetensors   per quantized linear ``X`` (every linear of ``layers.*``):
        ``X.weight``                   float8_e4m3fn ``[out, in]`` = ``round(w / (amax_w / 448))``
        ``X.weight_quantizer._amax``   fp32 scalar ``max |w|`` (ModelOpt's max calibration of the weight)
        ``X.weight_quantizer._scale``  fp32 scalar ``amax_w / 448``
        ``X.input_quantizer._amax``    fp32 scalar: the largest ``|input|`` the layer saw in a calibration pass
                                       (one prefill and one denoising step of the dense model on seeded inputs);
                                       left out with ``activation_scales=False`` (a weight-only FP8 export)
    every other tensor as in the source checkpoint.

This is the state dict of a ModelOpt ``RealQuantLinear`` after ``mtq.quantize(FP8_DEFAULT_CFG)`` + ``mtq.compress``
(``tests/test_fp8_linear.py`` checks the names and the rounding against ModelOpt itself). ModelOpt also saves its
module graph as ``transformer/modelopt_state.pth``, a pickle: this pack never reads it, and the parity tests write
it themselves, from ModelOpt, for the reference.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Mapping

import torch
from safetensors.torch import load_file, save_file

from ..model.fp8 import quantize_weight
from ..model.precision import FIRST_LAST_N_FP8_POLICY

SINGLE_FILE = "diffusion_pytorch_model.safetensors"


def quantized_names(state: Mapping[str, torch.Tensor]) -> list[str]:
    """Module names of the linears an FP8 export quantizes: every 2-D weight under ``layers.``."""
    return sorted(k[: -len(".weight")] for k, v in state.items()
                  if k.startswith("layers.") and k.endswith(".weight") and v.ndim == 2)


def calibrate_input_amax(src: Path, names: list[str], seed: int = 0) -> dict[str, float]:
    """Max ``|input|`` of each linear over one prefill and one guided denoising step of the dense checkpoint."""
    from ..model.layout import build_layout
    from ..model.loader import load_transformer

    model = load_transformer(src, dtype=torch.float32)
    amax: dict[str, float] = {}
    hooks = []
    for name, module in model.named_modules():
        if name in names:
            def hook(_m, args, _out, name=name):
                amax[name] = max(amax.get(name, 0.0), float(args[0].detach().abs().max()))
            hooks.append(module.register_forward_hook(hook))
    g = torch.Generator().manual_seed(seed)
    cfg = model.config
    try:
        kvs = model.prefill_many([torch.randint(0, cfg.vocab_size, (n,), generator=g) for n in (11, 7)])
        latents = torch.randn(1, cfg.latent_channel, 2, 4, 6, generator=g)
        layout = build_layout(cfg, [kv.length for kv in kvs], latents.shape[2:], 24.0)
        model.denoise_step(latents, torch.tensor(500), kvs, layout)
    finally:
        for h in hooks:
            h.remove()
    return {n: amax.get(n, 1.0) for n in names}


def build_fp8_checkpoint(src, out, *, policy: Mapping | None = FIRST_LAST_N_FP8_POLICY,
                         activation_scales: bool = True, seed: int = 0) -> Path:
    """Write the ModelOpt FP8 export of the tiny checkpoint ``src`` to ``out``; returns ``out``."""
    src, out = Path(src), Path(out)
    shutil.copytree(src, out, ignore=shutil.ignore_patterns("transformer"))
    (out / "transformer").mkdir(parents=True)
    state: dict[str, torch.Tensor] = {}
    for f in sorted((src / "transformer").glob("*.safetensors")):
        state.update(load_file(str(f)))
    names = quantized_names(state)
    input_amax = calibrate_input_amax(src, names, seed) if activation_scales else {}
    for name in names:
        w = state[f"{name}.weight"].float()
        state[f"{name}.weight"], scale = quantize_weight(w)
        state[f"{name}.weight_quantizer._amax"] = w.abs().amax().reshape(())
        state[f"{name}.weight_quantizer._scale"] = scale
        if activation_scales:
            state[f"{name}.input_quantizer._amax"] = torch.tensor(input_amax[name], dtype=torch.float32)
    save_file(state, str(out / "transformer" / SINGLE_FILE))
    config = json.loads((src / "transformer" / "config.json").read_text())
    quant = {"quant_method": "modelopt", "quant_type": "FP8", "quant_algo": "FP8"}
    if policy is not None:
        quant["runtime"] = {"diffusion_step_policy": dict(policy)}
    config["quantization_config"] = quant
    (out / "transformer" / "config.json").write_text(json.dumps(config, indent=2))
    return out

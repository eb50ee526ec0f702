"""Bad input to the fast modes (FP8 step policy, approximate FP8 compute, SeaCache), through the CLI and the core:
one message naming the argument (and its CLI flag), the value and the fix; never a traceback, never a silent change
of precision. Checked on this CPU (no FP8 GEMMs):

* real FP8 asked for where there are no FP8 GEMMs: ``--mixed-precision-format fp8`` and ``--weight-dtype
  fp8_e4m3fn_fast`` are refused by ``resolve.resolve``, before the model loads (the load is made to fail here);
  in the core the same at planning, on the device the plan runs on;
* an FP8 checkpoint without an explicit request runs W8A16 on such a device, with one notice saying so;
* a policy field the reference rejects (in the checkpoint) or an override it rejects or would ignore;
* a weight-only FP8 checkpoint (no activation scales) asked for the W8A8 schedule, refused before loading;
* SeaCache on a distilled 4-step checkpoint, on a 4-step run, with knobs out of range, knobs without
  ``--sea-cache``, with the two-GPU guidance split, and under torchrun parallelism;
* the FP8 model with a LoRA at strength 0 is the FP8 model (issue 30), in the core's W8A8 path.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
import torch
from test_bad_input import FAST, one_error

from cosmos3_core import api
from cosmos3_core.api import generate
from cosmos3_core.cli import main as generate_cli
from cosmos3_core.model.lora import linear_shapes, merge_lora, read_lora
from cosmos3_core.pipeline import Cosmos3Pipeline
from cosmos3_core.request import Request
from cosmos3_core.resolve import resolve
from cosmos3_core.runtime import RuntimeOptions
from cosmos3_core.sampling.sea_cache import SeaCacheConfig
from cosmos3_core.testing.fp8 import build_fp8_checkpoint

F, H, W = 5, 32, 32
EMULATE = RuntimeOptions(fp8_gemm="emulate", compile="off")


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory, tiny_checkpoint):
    root = tmp_path_factory.mktemp("fast")
    dense = tiny_checkpoint("nano", seed=3)
    return {
        "dense": dense,
        "fp8": build_fp8_checkpoint(dense, root / "fp8"),
        "weight-only": build_fp8_checkpoint(dense, root / "weight-only", activation_scales=False),
        "distilled": tiny_checkpoint("nano", seed=3, distilled=True),
    }


@pytest.fixture
def no_load(monkeypatch):
    """Any model load fails the test: what is refused must be refused before it."""
    def load(*args, **kwargs):
        raise AssertionError("the checkpoint was loaded before the refusal")

    monkeypatch.setattr(Cosmos3Pipeline, "load", load)


def cli_error(ckpt, capsys, *extra) -> str:
    return one_error(generate_cli.main, ["--checkpoint", str(ckpt), *FAST, "--out", str(Path(ckpt).parent / "o.mp4"),
                                         *extra], capsys)


@pytest.mark.parametrize("ckpt, flags, words", [
    ("fp8", ["--mixed-precision-format", "fp8"],
     ["mixed_precision_format='fp8' (CLI: --mixed-precision-format fp8)", "cpu has no FP8 GEMMs", "sm 8.9"]),
    ("dense", ["--weight-dtype", "fp8_e4m3fn_fast"],
     ["CLI: --weight-dtype fp8_e4m3fn_fast", "approximate", "cpu has no FP8 GEMMs"]),
    ("fp8", ["--weight-dtype", "fp8_e4m3fn_fast"], ["already NVIDIA FP8", "weight_dtype auto"]),
    ("dense", ["--mixed-precision-format", "fp8"], ["applies to NVIDIA ModelOpt FP8 checkpoints", "not quantized",
                                                    "--weight-dtype fp8_e4m3fn_fast"]),
    ("fp8", ["--mixed-precision-first-steps", "-2"],
     ["mixed_precision_first_steps=-2", "non-negative", "CLI: --mixed-precision-first-steps"]),
    ("fp8", ["--mixed-precision-format", "none", "--mixed-precision-last-steps", "2"],
     ["mixed_precision_last_steps=2 has no effect", "W8A8 at every step"]),
    ("weight-only", ["--steps", "8"], ["W8A8 needs the activation scale", "weight-only",
                                       "CLI: --mixed-precision-format none"]),
    ("fp8", ["--sea-cache-threshold", "0.3"], ["--sea-cache-threshold applies with SeaCache on", "add --sea-cache"]),
    ("fp8", ["--sea-cache", "--sea-cache-threshold", "-1"],
     ["sea_cache_threshold=-1.0", "non-negative", "CLI: --sea-cache-threshold"]),
    ("fp8", ["--sea-cache", "--sea-cache-residual-order", "2"], ["sea_cache_residual_order=2", "0 (reuse"]),
    ("fp8", ["--sea-cache", "--sea-cache-power-exp", "0"], ["sea_cache_power_exp=0.0", "positive"]),
    ("dense", ["--sea-cache"], ["a 1-step run has too few steps", "CLI: drop --sea-cache"]),
    ("dense", ["--sea-cache", "--steps", "8", "--cfg-parallel"], ["SeaCache runs on one GPU", "drop --sea-cache"]),
])
def test_cli_refuses_before_loading(ckpts, capsys, no_load, ckpt, flags, words):
    message = cli_error(ckpts[ckpt], capsys, *flags)
    for word in words:
        assert word in message, message


def test_cli_refuses_sea_cache_on_a_distilled_checkpoint(ckpts, capsys, no_load):
    argv = [a for i, a in enumerate(FAST) if a != "--steps" and FAST[i - 1] != "--steps"]
    message = one_error(generate_cli.main, ["--checkpoint", str(ckpts["distilled"]), *argv, "--out",
                                            str(ckpts["distilled"].parent / "o.mp4"), "--sea-cache"], capsys)
    assert "distilled few-step checkpoint" in message and "Turn sea_cache off" in message


def test_cli_says_why_an_fp8_checkpoint_runs_w8a16_here(ckpts, capsys, tmp_path):
    out = tmp_path / "o.mp4"
    assert generate_cli.main(["--checkpoint", str(ckpts["fp8"]), *FAST, "--out", str(out)]) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("FP8: ")]
    assert len(notes) == 1 and "runs W8A16 at every step" in notes[0] and "cpu has no FP8 GEMMs" in notes[0]
    assert out.is_file()


def test_fp8_checkpoint_on_a_cpu_runs_w8a16_with_one_notice(ckpts, caplog):
    pipe = Cosmos3Pipeline.load(ckpts["fp8"], dtype=torch.float32)
    text = pipe.encode_text("a red car", None, num_frames=F, height=H, width=W, fps=24.0)
    with caplog.at_level(logging.WARNING, logger="cosmos3"):
        plan = api.plan(pipe, text, steps=4)
    notices = [r.getMessage() for r in caplog.records if r.name == "cosmos3"]
    assert len(notices) == 1 and "runs W8A16 at every step" in notices[0] and "cpu has no FP8 GEMMs" in notices[0]
    assert plan.precision == (None,) * 4 and plan.fp8 in notices[0]  # every FP8 linear's forward: W8A16
    with pytest.raises(ValueError, match=r"mixed_precision_format='fp8' \(CLI: --mixed-precision-format fp8\) needs "
                                         r"real FP8 GEMMs, but cpu has no"):
        api.plan(pipe, text, steps=4, mixed_precision_format="fp8")
    with pytest.raises(ValueError, match="fp8_gemm='emulate'.*runs on the CPU only, not on meta"):
        api.plan(pipe, text, steps=4, device="meta", options=EMULATE)


def test_approximate_mode_on_a_cpu_is_refused_and_labelled(ckpts):
    pipe = Cosmos3Pipeline.load(ckpts["dense"], dtype=torch.float32, fp8_compute=True)
    text = pipe.encode_text("a red car", None, num_frames=F, height=H, width=W, fps=24.0)
    request = Request(prompt="a red car", num_frames=F, height=H, width=W, steps=8)
    with pytest.raises(ValueError, match=r"weight_dtype fp8_e4m3fn_fast \(approximate FP8 compute.*\) needs real FP8"):
        resolve(request, pipe.info)  # the request, before any model work
    with pytest.raises(ValueError, match=r"weight_dtype fp8_e4m3fn_fast \(approximate FP8 compute.*\) needs real FP8"):
        api.plan(pipe, text, steps=4)  # a sampler's plan, on the device it runs on
    plan = api.plan(pipe, text, steps=8, options=EMULATE)  # the numerical reference
    assert plan.precision[3] == ("W8A8", "W8A16", "W8A8") and "approximate" in plan.fp8
    assert torch.isfinite(pipe.run(plan).latents).all()
    with pytest.raises(Exception, match="already NVIDIA FP8"):
        Cosmos3Pipeline.load(ckpts["fp8"], dtype=torch.float32, fp8_compute=True)
    with pytest.raises(ValueError, match="loaded without approximate FP8 compute"):
        resolve(request, Cosmos3Pipeline.load(ckpts["dense"], dtype=torch.float32).info, fp8_compute=True)


def test_weight_only_checkpoint_refuses_the_w8a8_schedule(ckpts):
    pipe = Cosmos3Pipeline.load(ckpts["weight-only"], dtype=torch.float32)
    text = pipe.encode_text("a red car", None, num_frames=F, height=H, width=W, fps=24.0)
    with pytest.raises(ValueError, match=r"W8A8 needs the activation scale.*input_quantizer\._amax.*weight-only"):
        api.plan(pipe, text, steps=8, options=EMULATE)
    plan = api.plan(pipe, text, steps=4, options=EMULATE, mixed_precision_format="none")
    assert torch.isfinite(pipe.run(plan).latents).all()  # native for weight-only layers is W8A16


def test_bad_checkpoint_policy_names_the_field(ckpts, tmp_path, no_load):
    bad = tmp_path / "bad"
    shutil.copytree(ckpts["fp8"], bad)
    config = json.loads((bad / "transformer" / "config.json").read_text())
    config["quantization_config"]["runtime"]["diffusion_step_policy"]["first_steps"]["mode"] = "w8a16"
    (bad / "transformer" / "config.json").write_text(json.dumps(config))
    request = dict(prompt="a red car", num_frames=F, height=H, width=W, steps=8)
    with pytest.raises(ValueError, match=r"diffusion_step_policy\.first_steps\.mode='w8a16' must be 'a16' or"):
        resolve(Request(**request), bad)
    with pytest.raises(ValueError, match=r"^mixed_precision_reasoner_policy='fast' must be one of"):
        resolve(Request(**request, mixed_precision_format="none", mixed_precision_reasoner_policy="fast"), bad)


def test_sea_cache_refuses_too_few_steps_and_distilled(ckpts):
    pipe = Cosmos3Pipeline.load(ckpts["dense"], dtype=torch.float32)
    text = pipe.encode_text("a red car", None, num_frames=F, height=H, width=W, fps=24.0)
    with pytest.raises(ValueError, match=r"a 4-step run has too few steps \(4, SeaCache needs at least 8\)"):
        api.plan(pipe, text, steps=4, sea_cache=SeaCacheConfig())
    with pytest.raises(ValueError, match=r"sea_cache_max_consecutive_cached=-1"):
        api.plan(pipe, text, steps=12, sea_cache=SeaCacheConfig(max_consecutive_cached=-1))
    distilled = Cosmos3Pipeline.load(ckpts["distilled"], dtype=torch.float32)
    text = distilled.encode_text("a red car", None, num_frames=F, height=H, width=W, fps=24.0)
    with pytest.raises(ValueError, match="distilled few-step checkpoint"):
        api.plan(distilled, text, sea_cache=SeaCacheConfig())


def test_sea_cache_refused_with_a_second_gpu_denoiser(ckpts):
    pipe = Cosmos3Pipeline.load(ckpts["dense"], dtype=torch.float32)
    text = pipe.encode_text("a red car", None, num_frames=F, height=H, width=W, fps=24.0)
    plan = api.plan(pipe, text, steps=8, sea_cache=SeaCacheConfig())
    with pytest.raises(ValueError, match="SeaCache runs on one GPU"):
        pipe.run(plan, denoiser=pipe.transformer)


def test_fp8_w8a8_refused_under_torchrun_parallelism(ckpts):
    from cosmos3_core.parallel.run import check_fast_modes

    request = dict(prompt="a red car", num_frames=F, height=H, width=W, steps=8)
    check_fast_modes(resolve(Request(**request), ckpts["dense"]))  # a bf16 checkpoint runs
    with pytest.raises(ValueError, match="W8A8 steps do not run under --cfg-parallel / --ulysses"):
        check_fast_modes(resolve(Request(**request, options=EMULATE), ckpts["fp8"]))
    check_fast_modes(resolve(Request(**request, mixed_precision_first_steps=8), ckpts["fp8"]))  # all W8A16: runs


def test_lora_at_strength_zero_leaves_the_fp8_model_as_it_is(ckpts, tmp_path):
    """Issue 30: the FP8 model with a LoRA at strength 0 is the FP8 model, in its W8A8 steps too; a real strength
    changes it (the core's merge re-rounds the FP8 weights, so strength 0 must not touch them)."""
    from test_lora import write_lora

    request = Request(prompt="a red car", num_frames=F, height=H, width=W, steps=8, seed=2, options=EMULATE)
    pipe = Cosmos3Pipeline.load(ckpts["fp8"], dtype=torch.float32)
    plain = generate(pipe, request, decode=False).latents
    shapes = linear_shapes(pipe.transformer)
    targets = ("layers.0.self_attn.add_q_proj", "layers.1.mlp_moe_gen.down_proj", "layers.0.self_attn.to_k")
    patches = read_lora(write_lora(tmp_path / "l.safetensors", shapes, targets=targets), shapes)
    merge_lora(pipe.transformer, patches, 0.0)
    assert torch.equal(generate(pipe, request, decode=False).latents, plain)
    merge_lora(pipe.transformer, patches, 1.0)
    assert not torch.equal(generate(pipe, request, decode=False).latents, plain)

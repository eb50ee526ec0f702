"""Bad input to the fast modes (FP8 step policy, approximate FP8 compute, SeaCache), through the CLI and the core:
one message naming the flag or argument, the value and the fix; never a traceback, never a silent change of
precision.

* real FP8 asked for on a machine without FP8 GEMMs (this CPU): ``--mixed-precision-format fp8`` and
  ``--weight-dtype fp8_e4m3fn_fast`` are refused before the model loads; the same in the core, at planning;
* an FP8 checkpoint without an explicit request runs W8A16 on such a device, with one notice saying so;
* a policy field the reference rejects (in the checkpoint) or an override it rejects;
* a weight-only FP8 checkpoint (no activation scales) asked for the W8A8 schedule;
* SeaCache on a distilled 4-step checkpoint, on a 4-step run, with knobs out of range, or knobs without
  ``--sea-cache``.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from cosmos3_core.cli import main as generate
from cosmos3_core.model.precision import Fp8Options
from cosmos3_core.pipeline import Cosmos3Pipeline
from cosmos3_core.sampling.sea_cache import SeaCacheConfig
from cosmos3_core.testing.fp8 import build_fp8_checkpoint
from cosmos3_core.testing.tiny import build_tiny_checkpoint
from test_bad_input import FAST, one_error

F, H, W = 5, 32, 32


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("fast")
    dense = build_tiny_checkpoint(root / "nano", variant="nano", seed=3)
    return {
        "dense": dense,
        "fp8": build_fp8_checkpoint(dense, root / "fp8"),
        "weight-only": build_fp8_checkpoint(dense, root / "weight-only", activation_scales=False),
        "distilled": build_tiny_checkpoint(root / "distilled", variant="nano", seed=3, distilled=True),
    }


def cli_error(ckpt, capsys, *extra) -> str:
    return one_error(generate.main, ["--checkpoint", str(ckpt), *FAST, "--out", str(Path(ckpt).parent / "o.mp4"),
                                     *extra], capsys)


@pytest.mark.parametrize("flags, words", [
    (["--mixed-precision-format", "fp8"], ["--mixed-precision-format fp8", "cpu has no FP8 GEMMs", "sm 8.9"]),
    (["--weight-dtype", "fp8_e4m3fn_fast"], ["--weight-dtype fp8_e4m3fn_fast", "cpu has no FP8 GEMMs"]),
    (["--mixed-precision-first-steps", "-2"], ["--mixed-precision-first-steps -2", "0 or more"]),
    (["--sea-cache-threshold", "0.3"], ["--sea-cache-threshold applies with SeaCache on", "add --sea-cache"]),
    (["--sea-cache", "--sea-cache-threshold", "-1"], ["--sea-cache-threshold=-1.0", "non-negative"]),
    (["--sea-cache", "--sea-cache-residual-order", "2"], ["--sea-cache-residual-order=2", "0 (reuse"]),
    (["--sea-cache", "--sea-cache-power-exp", "0"], ["--sea-cache-power-exp=0.0", "positive"]),
])
def test_cli_refuses_before_loading(ckpts, capsys, flags, words):
    message = cli_error(ckpts["fp8"], capsys, *flags)
    for word in words:
        assert word in message, message


def test_cli_refuses_sea_cache_on_a_distilled_checkpoint(ckpts, capsys):
    argv = [a for i, a in enumerate(FAST) if a != "--steps" and FAST[i - 1] != "--steps"]
    message = one_error(generate.main, ["--checkpoint", str(ckpts["distilled"]), *argv, "--out",
                                        str(ckpts["distilled"].parent / "o.mp4"), "--sea-cache"], capsys)
    assert "distilled few-step checkpoint" in message and "Turn sea_cache off" in message


def test_fp8_checkpoint_on_a_cpu_runs_w8a16_with_one_notice(ckpts, caplog):
    pipe = Cosmos3Pipeline.load(ckpts["fp8"], dtype=torch.float32)
    text = pipe.encode_text("a red car", None, num_frames=F, height=H, width=W, fps=24.0)
    with caplog.at_level(logging.WARNING, logger="cosmos3"):
        plan = pipe.plan(text, steps=4)
    notices = [r.getMessage() for r in caplog.records if r.name == "cosmos3"]
    assert len(notices) == 1 and "runs W8A16 at every step" in notices[0] and "cpu has no FP8 GEMMs" in notices[0]
    assert plan.precision == (None,) * 4  # every FP8 linear's forward: W8A16
    with pytest.raises(ValueError, match=r"mixed_precision_format='fp8' needs real FP8 GEMMs, but cpu has no"):
        pipe.plan(text, steps=4, mixed_precision=Fp8Options(mixed_precision_format="fp8"), who="sample")


def test_approximate_mode_on_a_cpu_is_refused_and_labelled(ckpts):
    pipe = Cosmos3Pipeline.load(ckpts["dense"], dtype=torch.float32, fp8_compute=True)
    text = pipe.encode_text("a red car", None, num_frames=F, height=H, width=W, fps=24.0)
    with pytest.raises(ValueError, match=r"fp8_e4m3fn_fast \(approximate FP8 compute\) needs real FP8 GEMMs"):
        pipe.plan(text, steps=4)
    plan = pipe.plan(text, steps=8, mixed_precision=Fp8Options(gemm="emulate"))  # the numerical reference
    assert plan.precision[3] == "W8A8,W8A16,W8A8" and "approximate" in pipe.last_fp8.describe
    assert torch.isfinite(pipe.run(plan).latents).all()
    with pytest.raises(Exception, match="already NVIDIA FP8"):
        Cosmos3Pipeline.load(ckpts["fp8"], dtype=torch.float32, fp8_compute=True)


def test_weight_only_checkpoint_refuses_the_w8a8_schedule(ckpts):
    pipe = Cosmos3Pipeline.load(ckpts["weight-only"], dtype=torch.float32)
    text = pipe.encode_text("a red car", None, num_frames=F, height=H, width=W, fps=24.0)
    with pytest.raises(ValueError, match=r"W8A8 needs the activation scale.*input_quantizer\._amax.*weight-only"):
        pipe.plan(text, steps=8, mixed_precision=Fp8Options(gemm="emulate"))
    plan = pipe.plan(text, steps=4, mixed_precision=Fp8Options(gemm="emulate", mixed_precision_format="none"))
    assert torch.isfinite(pipe.run(plan).latents).all()  # native for weight-only layers is W8A16


def test_bad_checkpoint_policy_names_the_field(ckpts, tmp_path):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(ckpts["fp8"], bad)
    config = json.loads((bad / "transformer" / "config.json").read_text())
    config["quantization_config"]["runtime"]["diffusion_step_policy"]["first_steps"]["mode"] = "w8a16"
    (bad / "transformer" / "config.json").write_text(json.dumps(config))
    pipe = Cosmos3Pipeline.load(bad, dtype=torch.float32)
    text = pipe.encode_text("a red car", None, num_frames=F, height=H, width=W, fps=24.0)
    with pytest.raises(ValueError, match=r"diffusion_step_policy\.first_steps\.mode='w8a16' must be 'a16' or"):
        pipe.plan(text, steps=8)
    with pytest.raises(ValueError, match=r"sample: mixed_precision_reasoner_policy='fast' must be one of"):
        pipe.plan(text, steps=8, mixed_precision=Fp8Options(mixed_precision_format="none",
                                                            mixed_precision_reasoner_policy="fast"))


def test_sea_cache_refuses_too_few_steps_and_distilled(ckpts):
    pipe = Cosmos3Pipeline.load(ckpts["dense"], dtype=torch.float32)
    text = pipe.encode_text("a red car", None, num_frames=F, height=H, width=W, fps=24.0)
    with pytest.raises(ValueError, match=r"a 4-step run has too few steps \(4, SeaCache needs at least 8\)"):
        pipe.plan(text, steps=4, sea_cache=SeaCacheConfig())
    with pytest.raises(ValueError, match=r"sea_cache_max_consecutive_cached=-1"):
        pipe.plan(text, steps=12, sea_cache=SeaCacheConfig(max_consecutive_cached=-1))
    distilled = Cosmos3Pipeline.load(ckpts["distilled"], dtype=torch.float32)
    text = distilled.encode_text("a red car", None, num_frames=F, height=H, width=W, fps=24.0)
    with pytest.raises(ValueError, match="distilled few-step checkpoint"):
        distilled.plan(text, sea_cache=SeaCacheConfig())


def test_sea_cache_refused_with_a_second_gpu_denoiser(ckpts):
    pipe = Cosmos3Pipeline.load(ckpts["dense"], dtype=torch.float32)
    text = pipe.encode_text("a red car", None, num_frames=F, height=H, width=W, fps=24.0)
    plan = pipe.plan(text, steps=8, sea_cache=SeaCacheConfig())
    with pytest.raises(ValueError, match="SeaCache runs on one GPU"):
        pipe.run(plan, denoiser=pipe.transformer)

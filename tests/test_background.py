"""cosmos3_core.background.BackgroundWork: the thread runs under the creating thread's compile settings and
autograd modes, and a failure is reported by wait() as a warning instead of raised."""

import logging

import pytest
import torch
import torch._dynamo.config

from cosmos3_core.background import BackgroundWork


@pytest.mark.parametrize("mode", ["grad", "no_grad", "inference_mode"])
def test_background_work_sees_the_callers_compile_settings_and_modes(mode):
    seen = {}

    def probe():
        seen.update(limit=torch._dynamo.config.recompile_limit, grad=torch.is_grad_enabled(),
                    inference=torch.is_inference_mode_enabled(), autocast=torch.is_autocast_enabled("cpu"))

    ctx = {"grad": torch.enable_grad, "no_grad": torch.no_grad, "inference_mode": torch.inference_mode}[mode]
    with torch._dynamo.config.patch(recompile_limit=37), ctx(), torch.autocast("cpu"):
        work = BackgroundWork(probe, torch.device("cpu"), "probe")
        work.wait()
    assert seen == dict(limit=37, grad=mode == "grad", inference=mode == "inference_mode", autocast=False)


def test_background_failure_is_logged_by_wait_not_raised(caplog):
    def fail():
        raise RuntimeError("out of something")

    work = BackgroundWork(fail, torch.device("cpu"), "Failing warm-up")
    with caplog.at_level(logging.WARNING):
        work.wait()
        work.wait()  # reported once
    assert caplog.text.count("Failing warm-up failed (RuntimeError: out of something)") == 1
    assert not work.running

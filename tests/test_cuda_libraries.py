"""``kernels.cuda_libraries``: the preload's tiny call of each CUDA library route.

Each route must run at its own shapes (a wrong view would be skipped silently on the GPU: the debug log only), the
server's preload must make the calls last, on its own thread, on the device it is given and only there, with
``COSMOS3_PRELOAD_CUDA_LIBRARIES=1`` and not by default (off until a GPU measurement shows it pays). On a CUDA device every route must load with no
failure logged.
"""

from __future__ import annotations

import logging
import threading

import pytest
import torch


def test_every_route_runs_at_its_own_shapes():
    from cosmos3_core.kernels.cuda_libraries import ROUTES

    x = torch.randn(64, 64, dtype=torch.bfloat16)
    shapes = {name: tuple(call(x).shape) for name, call in ROUTES.items()}
    assert shapes == {"cublas": (64, 64), "cublaslt": (64, 64), "cudnn_conv3d": (1, 16, 4, 8, 8),
                      "cudnn_conv2d": (1, 4, 32, 32), "attention": (1, 2, 32, 64)}


@pytest.mark.parametrize("switch, loads", [("1", True), (None, False), ("0", False)])
def test_the_preload_loads_the_libraries_on_its_thread_for_the_device_it_is_given(monkeypatch, switch, loads):
    from cosmos3_core.kernels import caches, cuda_libraries

    calls = []
    monkeypatch.setattr(cuda_libraries, "load_cuda_libraries",
                        lambda device: calls.append((threading.current_thread().name, device)) or 0.25)
    monkeypatch.setattr(caches, "_FIRST_RUN", [])
    if switch is None:
        monkeypatch.delenv("COSMOS3_PRELOAD_CUDA_LIBRARIES", raising=False)
    else:
        monkeypatch.setenv("COSMOS3_PRELOAD_CUDA_LIBRARIES", switch)
    device = torch.device("cuda", 1)
    thread = caches.preload_first_run(compiles=False, cuda_device=device)
    thread.join(timeout=240)
    assert not thread.is_alive() and not thread.failed
    if loads:
        assert calls == [("cosmos3-preload", device)] and thread.cuda_libraries_s == 0.25
    else:
        assert calls == [] and thread.cuda_libraries_s is None


def test_a_preload_without_a_cuda_device_loads_no_library(monkeypatch):
    from cosmos3_core.kernels import caches, cuda_libraries

    calls = []
    monkeypatch.setattr(cuda_libraries, "load_cuda_libraries", lambda device: calls.append(device) or 0.0)
    monkeypatch.setattr(caches, "_FIRST_RUN", [])
    monkeypatch.setenv("COSMOS3_PRELOAD_CUDA_LIBRARIES", "1")
    thread = caches.preload_first_run(compiles=False)
    thread.join(timeout=240)
    assert calls == [] and thread.cuda_libraries_s is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_every_route_loads_on_a_cuda_device_from_a_thread_that_ends(caplog):
    from cosmos3_core.kernels.cuda_libraries import load_cuda_libraries

    seconds = []
    with caplog.at_level(logging.DEBUG, logger="cosmos3_core.kernels.cuda_libraries"):
        thread = threading.Thread(target=lambda: seconds.append(load_cuda_libraries(torch.device("cuda"))))
        thread.start()
        thread.join(timeout=120)
    assert seconds and seconds[0] > 0
    assert not [r.getMessage() for r in caplog.records if "not loaded ahead" in r.getMessage()]

"""``kernels.cuda_libraries``: the preload's tiny call of each CUDA library route.

Each route must run at its own shapes (a wrong view would be skipped silently on the GPU: the debug log only), the
server's preload must make the calls last, on its own thread, with ``COSMOS3_PRELOAD_CUDA_LIBRARIES=1`` and not by
default (off until a GPU measurement shows it pays). On a CUDA device every route must load with no failure
logged, and a later thread must find the ended thread's cuBLAS handle and workspace.
"""

from __future__ import annotations

import logging
import sys
import threading
import time

import pytest
import torch


def test_every_route_runs_at_its_own_shapes():
    from cosmos3_core.kernels.cuda_libraries import ROUTES

    x = torch.full((64, 64), 0.01, dtype=torch.bfloat16)
    shapes = {name: tuple(call(x).shape) for name, call in ROUTES.items()}
    assert shapes == {"gemm": (64, 64), "gemm_bias": (64, 64), "vae_conv3d": (1, 16, 2, 8, 8),
                      "vae_conv3d_spatial": (1, 16, 4, 8, 8), "attention": (1, 4, 8, 128),
                      "causal_attention": (1, 4, 8, 128)}


def test_a_route_that_fails_is_skipped_and_the_load_never_raises(monkeypatch, caplog):
    from cosmos3_core.kernels import cuda_libraries

    def broken(x):
        raise RuntimeError("no such kernel")

    monkeypatch.setitem(cuda_libraries.ROUTES, "gemm", broken)
    with caplog.at_level(logging.DEBUG, logger=cuda_libraries.__name__):
        seconds = cuda_libraries.load_cuda_libraries(torch.device("cpu"))
    assert seconds >= 0
    assert [r.getMessage() for r in caplog.records] == [
        "the CUDA library route gemm was not loaded ahead (RuntimeError: no such kernel)"]


@pytest.mark.parametrize("switch, loads", [("1", True), (None, False), ("0", False)])
def test_the_preload_loads_the_libraries_last_on_its_thread_when_switched_on(monkeypatch, switch, loads):
    from cosmos3_core.kernels import caches

    calls = []
    monkeypatch.setattr(caches, "_FIRST_RUN", [])
    if switch is None:
        monkeypatch.delenv("COSMOS3_PRELOAD_CUDA_LIBRARIES", raising=False)
    else:
        monkeypatch.setenv("COSMOS3_PRELOAD_CUDA_LIBRARIES", switch)

    def load_libraries() -> float:
        calls.append((threading.current_thread().name, [m for m in caches.RUN_MODULES if m not in sys.modules]))
        return 0.25

    thread = caches.preload_first_run(compiles=False, load_libraries=load_libraries)
    thread.join(timeout=240)
    assert not thread.is_alive() and not thread.failed
    if loads:  # on the preload's thread, after every import
        assert calls == [("cosmos3-preload", [])] and thread.cuda_libraries_s == 0.25
    else:
        assert calls == [] and thread.cuda_libraries_s is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_every_route_loads_on_a_cuda_device_and_the_next_thread_takes_its_handles(caplog):
    """No route fails on a real GPU, and a GEMM on a later thread finds the ended thread's cuBLAS handle and its
    workspace in torch's pool: it allocates no new workspace (≥ 1 MiB) on the device."""
    from cosmos3_core.kernels.cuda_libraries import load_cuda_libraries

    device = torch.device("cuda")
    seconds = []
    with caplog.at_level(logging.DEBUG, logger="cosmos3_core.kernels.cuda_libraries"):
        thread = threading.Thread(target=lambda: seconds.append(load_cuda_libraries(device)))
        thread.start()
        thread.join(timeout=120)
    assert seconds and seconds[0] > 0
    assert not [r.getMessage() for r in caplog.records if "not loaded ahead" in r.getMessage()]
    x = torch.full((64, 64), 0.01, device=device, dtype=torch.bfloat16)
    grown = []

    def gemm() -> None:
        before = torch.cuda.memory_allocated(device)
        y = x @ x
        torch.cuda.synchronize(device)
        grown.append(torch.cuda.memory_allocated(device) - before - y.numel() * y.element_size())

    time.sleep(0.2)  # a thread's handles go back to the pool at its C++ exit, just after Python's join returns
    later = threading.Thread(target=gemm)
    later.start()
    later.join(timeout=60)
    assert grown and grown[0] < 1 << 20, grown

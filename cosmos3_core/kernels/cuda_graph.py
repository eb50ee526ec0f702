"""CUDA-graph replay of a fixed-shape step: ``GraphedCall`` (the reasoner's batch-1 decode step over its static KV
cache, ``RuntimeOptions.cuda_graphs``).

Replaying a step as one graph removes kernel-launch and Python cost, and nothing else: same kernels, same order, the
results equal the un-captured step. A batch-1 decode step is launch-bound, so it gains several times on an H200
(Nano 21.5 → 99.7 tokens/s, Edge 32 → 210, docs/benchmark-log.md); the generation tower's guided step is not (T2I
1280×720 compiled: 48.1 → 46.0 ms, nothing from 256p up), so it is not graphed.

How: the first call runs ``fn`` on a side stream (the warm-up: cuBLAS workspaces, compiled kernels) and returns that
real result, then captures ``fn`` into a graph whose inputs are static copies. Later calls copy their tensor
arguments into those buffers, replay, and return a copy of the static output. ``fn`` must do no host sync.

Only under PyTorch's native caching allocator (``capture_supported``). Under ``cudaMallocAsync`` — the backend
ComfyUI selects on CUDA builds — an allocation made during capture is a graph memory node with no device address
yet, so Triton's launcher (the compiled decode layer, the GEMV kernel) refuses it as a "cpu tensor", and the broken
capture then kills the process when its tensors are freed (found by ``bench/soak.py`` on an H100: the reasoner node
crashed the server). There the call runs uncaptured.
"""

from __future__ import annotations

import logging
from typing import Callable

import torch

_log = logging.getLogger(__name__)


def capture_supported() -> bool:
    """Whether this process's CUDA allocator can capture graphs of Triton kernels (see the module docstring)."""
    return torch.cuda.get_allocator_backend() == "native"


class GraphedCall:
    """``fn(*tensors) -> tensor`` captured as one CUDA graph on its first call (after a warm-up run, whose result
    that call returns); later calls copy their tensor arguments into the static inputs and replay. For a loop
    whose shapes and state addresses do not change, e.g. the reasoner's decode step over its static KV cache."""

    def __init__(self, fn: Callable):
        self.fn = fn
        self.graph: torch.cuda.CUDAGraph | None = None
        self.inputs: tuple[torch.Tensor, ...] = ()
        self.output: torch.Tensor | None = None
        self.failed = False  # capture raised: every call runs ``fn`` directly (logged once)

    def __call__(self, *args: torch.Tensor) -> torch.Tensor:
        if self.failed:
            return self.fn(*args)
        if self.graph is None and not capture_supported():
            _log.info("CUDA-graph capture of %s skipped: the %s allocator cannot capture Triton kernels; running it "
                      "uncaptured.", getattr(self.fn, "__qualname__", self.fn), torch.cuda.get_allocator_backend())
            self.failed = True
            return self.fn(*args)
        if self.graph is None:
            self.inputs = tuple(a.clone() for a in args)
            current, side = torch.cuda.current_stream(), torch.cuda.Stream()
            side.wait_stream(current)
            with torch.cuda.stream(side):
                result = self.fn(*self.inputs)
            current.wait_stream(side)
            for static, a in zip(self.inputs, args):
                static.copy_(a)  # the warm-up may have updated state the inputs index; replay sees fresh values
            self.graph = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(self.graph):
                    self.output = self.fn(*self.inputs)
            except Exception as exc:  # noqa: BLE001 — e.g. a host copy inside fn: keep going uncaptured, and say so
                _log.warning("CUDA-graph capture of %s failed (%s); running it uncaptured.",
                             getattr(self.fn, "__qualname__", self.fn), str(exc).splitlines()[0] if str(exc) else exc)
                self.failed, self.graph, self.output = True, None, None
            return result
        for static, a in zip(self.inputs, args):
            static.copy_(a)
        self.graph.replay()
        return self.output.clone()

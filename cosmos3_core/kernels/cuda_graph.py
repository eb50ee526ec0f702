"""CUDA-graph replay of ``Cosmos3Transformer.denoise_step``: one captured graph per (layout, text K/V, shapes),
and ``GraphedCall`` for any fixed-shape step (the reasoner's decode step over its static KV cache).

Replaying a step as one graph removes kernel-launch and Python cost, and nothing else. Measured on an H200
(docs/benchmark-log.md): the reasoner's batch-1 decode is launch-bound and gains 4.6–6.5× (Nano 21.5 → 99.7 tok/s, Edge
32 → 210); the guided denoise step is not (T2I 1280×720: 27 TFLOP a step, 46–48 ms compiled against a 35 ms matmul
floor) and gains 48.1 → 46.0 ms at T2I and nothing from 256p up, so it stays opt-in. Same kernels, same order: the
results equal the un-captured step (relative difference 0.0 on the H200).

How: the first call for a key runs the step normally on a side stream (the warm-up: cuBLAS workspaces, compiled
kernels, FlashAttention-4's JIT) and returns that real result, then captures the step into a graph whose inputs
(latents, timestep, sound, action) are static buffers. Later calls copy their inputs into those buffers, replay,
and return copies of the static outputs. The step has no host sync (transformer.py), which capture requires.
An entry holds references to its layout and text K/V (so their memory, which the graph reads by address, stays
valid) and the graph's activation pool (about one step's peak): ``release`` frees them; at most ``max_graphs``
entries are kept (least recently used dropped first).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from ..model.layout import GenLayout
from ..model.text_kv import TextKV

_log = logging.getLogger(__name__)


@dataclass
class _Entry:
    graph: torch.cuda.CUDAGraph
    inputs: tuple[torch.Tensor | None, ...]  # static latents, timestep, sound, action
    outputs: object  # the StepOutput the capture produced (static tensors)
    keep_alive: tuple  # layout and text K/V read by address


def _clone(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.clone()


class StepGraphs:
    """Captures and replays ``step(latents, timestep, text, layout, sound, action)``."""

    def __init__(self, step: Callable, max_graphs: int = 2):
        self.step = step
        self.max_graphs = max_graphs
        self.entries: OrderedDict[tuple, _Entry] = OrderedDict()
        self.pool = None
        self.captures = 0

    def release(self) -> None:
        self.entries.clear()
        self.pool = None

    def _key(self, latents, timestep, text: Sequence[TextKV], layout: GenLayout, sound, action, extra) -> tuple:
        def sig(t):
            return None if t is None else (tuple(t.shape), t.dtype, t.device)

        return (id(layout), tuple(id(kv) for kv in text), sig(latents), sig(timestep), sig(sound), sig(action), extra)

    def __call__(self, latents, timestep, text: Sequence[TextKV], layout: GenLayout, sound=None, action=None,
                 extra: tuple = ()):
        """``extra``: anything else the captured kernels depend on (weight addresses, compile/attention mode)."""
        key = self._key(latents, timestep, text, layout, sound, action, extra)
        entry = self.entries.get(key)
        if entry is None:
            return self._capture(key, latents, timestep, text, layout, sound, action)
        self.entries.move_to_end(key)
        for static, new in zip(entry.inputs, (latents, timestep, sound, action)):
            if static is not None:
                static.copy_(new)
        entry.graph.replay()
        out = entry.outputs
        return type(out)(*(_clone(t) for t in (out.vision, out.sound, out.action)))

    def _capture(self, key, latents, timestep, text, layout, sound, action):
        inputs = tuple(_clone(t) for t in (latents, timestep, sound, action))
        current = torch.cuda.current_stream()
        side = torch.cuda.Stream()
        side.wait_stream(current)
        with torch.cuda.stream(side):  # warm-up outside capture; this is the real result of this call
            result = self.step(*inputs[:2], text, layout, *inputs[2:])
        current.wait_stream(side)
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            outputs = self.step(*inputs[:2], text, layout, *inputs[2:])
        self.captures += 1
        while len(self.entries) >= self.max_graphs:
            self.entries.popitem(last=False)
        self.entries[key] = _Entry(graph, inputs, outputs, (layout, tuple(text)))
        return result


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
            except RuntimeError as exc:  # e.g. a host copy inside fn: keep going uncaptured, and say so
                _log.warning("CUDA-graph capture of %s failed (%s); running it uncaptured.",
                             getattr(self.fn, "__qualname__", self.fn), str(exc).splitlines()[0] if str(exc) else exc)
                self.failed, self.graph, self.output = True, None, None
            return result
        for static, a in zip(self.inputs, args):
            static.copy_(a)
        self.graph.replay()
        return self.output.clone()

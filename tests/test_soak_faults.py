"""Faults found by the GPU soak (``bench/soak.py``, issue 39), each checked where the CPU can reach it.

* Out of GPU memory: a node's ``torch.OutOfMemoryError`` is one line that names the node and the fix, and ComfyUI
  0.3.75's executor still takes it for an out-of-memory error (its recovery unloads every model and it adds its tip),
  and the next run succeeds. The error carries no reference to the failed call's frames (their GPU tensors).
* The reasoner's CUDA-graph decode under ``cudaMallocAsync`` (ComfyUI's default allocator on CUDA): the capture
  handed Triton unmaterialised allocations ("cpu tensor?") and the broken capture then killed the server. It now
  runs uncaptured there.
"""

from __future__ import annotations

import sys

import pytest
import torch
from test_nodes import assert_next_run_succeeds, error_of, host, run, t2i_graph  # noqa: F401

TORCH_OOM = ("CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of 23.99 GiB of which "
             "1.02 GiB is free. Including non-PyTorch memory, this process has 22.97 GiB memory in use. Of the "
             "allocated memory 21.50 GiB is allocated by PyTorch, and 1.10 GiB is reserved by PyTorch but unallocated. "
             "If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")


def _pack(host, module: str):
    """A module of the pack as the host imported it (under custom_nodes/), not this process's own import."""
    package = host.node_class_mappings["Cosmos3KSamplerUniPCDualTower"].__module__.rsplit(".nodes.", 1)[0]
    return sys.modules[f"{package}.{module}"]


def _pack_pipeline_class(host):
    return _pack(host, "cosmos3_core.pipeline").Cosmos3Pipeline


@pytest.mark.comfy
def test_out_of_memory_is_one_line_naming_the_fix(host, monkeypatch):
    def out_of_memory(self, *args, **kwargs):
        big = torch.empty(1024, 1024)  # a tensor of the failed call's frame: must not stay referenced
        raise torch.OutOfMemoryError(TORCH_OOM + f" {big.shape}")

    with monkeypatch.context() as m:
        m.setattr(_pack_pipeline_class(host), "run", out_of_memory)
        success, _outputs, messages, _ = run(host, t2i_graph(seed=3))
    assert not success
    err = error_of(messages)
    assert err["node_type"] == "Cosmos3KSamplerUniPCDualTower", err
    first, *rest = err["exception_message"].split("\n")
    assert first == ("Cosmos3KSamplerUniPCDualTower: out of GPU memory (it asked for 20.00 GiB more). To fit, lower "
                     "width, height, num_frames or batch_size; load smaller weights: NVIDIA's FP8 checkpoint (the "
                     "repository's fp8 revision; W8A8 on sm 8.9+: RTX 40/50, L4, L40, H100), weight_dtype "
                     "fp8_e4m3fn, or a GGUF file in Load Cosmos3 Checkpoint's gguf input (Q8_0 for 12 GiB, Q4_0 for "
                     "8 GiB cards); or start ComfyUI with --lowvram."), first
    assert "PYTORCH_CUDA_ALLOC_CONF" not in err["exception_message"]  # torch's report is not repeated
    assert "ran out of memory on your GPU" in "\n".join(rest)  # ComfyUI's own OOM path ran (it unloads the models)
    assert_next_run_succeeds(host)


@pytest.mark.comfy
def test_out_of_memory_error_keeps_no_frames(host):
    """The one-line error is raised outside the ``except`` block: no ``__context__`` holding the failed frames."""
    errors = _pack(host, "nodes.errors")
    Cosmos3OutOfMemoryError, with_out_of_memory_message = errors.Cosmos3OutOfMemoryError, errors.with_out_of_memory_message

    class Node:
        @classmethod
        def execute(cls, n):
            raise torch.OutOfMemoryError(TORCH_OOM)

    with_out_of_memory_message(Node)
    with pytest.raises(Cosmos3OutOfMemoryError) as info:
        Node.execute(n=1)
    assert isinstance(info.value, torch.OutOfMemoryError)
    assert info.value.__context__ is None and info.value.__cause__ is None
    assert str(info.value).startswith("Node: out of GPU memory (it asked for 20.00 GiB more). To fit, lower width,")


@pytest.mark.comfy
def test_out_of_memory_names_the_card(host):
    """On a GPU the line names the card and its size beside the fix (issue 37: a card too small says which card);
    ComfyUI on the CPU has no card to name."""
    errors = _pack(host, "nodes.errors")
    card = (32 * 2**30 - 2**29, "cuda:0 (NVIDIA GeForce RTX 5090)")
    line = errors.out_of_memory_message("Cosmos3TextEncode", torch.OutOfMemoryError(TORCH_OOM), card)
    assert line.startswith("Cosmos3TextEncode: out of GPU memory on cuda:0 (NVIDIA GeForce RTX 5090), which has "
                           "31.5 GiB (it asked for 20.00 GiB more). To fit, lower width,"), line
    assert errors.card_of(torch.OutOfMemoryError(TORCH_OOM)) is None  # the test host runs ComfyUI with --cpu


def test_graphed_call_runs_uncaptured_under_cuda_malloc_async(monkeypatch):
    from cosmos3_core.kernels import cuda_graph

    monkeypatch.setattr(torch.cuda, "get_allocator_backend", lambda: "cudaMallocAsync")
    calls = []

    def step(x):
        calls.append(x)
        return x * 2

    graphed = cuda_graph.GraphedCall(step)
    for _ in range(3):  # on a CPU tensor: any capture attempt would fail; none is made
        assert torch.equal(graphed(torch.ones(3)), torch.full((3,), 2.0))
    assert graphed.failed and graphed.graph is None and len(calls) == 3
    monkeypatch.setattr(torch.cuda, "get_allocator_backend", lambda: "native")
    assert cuda_graph.capture_supported()

"""Cosmos3GuidanceOnTwoGPUs in the real in-process ComfyUI host (CPU only here).

What a CPU host can check: the node's refusal when the model is not on a GPU (clear message, next run works), and
the sampler's plumbing of the two-device split — a test-only node hands the sampler a handle whose second "device"
is the CPU (the one GPU-only check of the node bypassed), and the sampled latent must equal the plain run's: for the
dense tiny checkpoint, NVIDIA's ModelOpt FP8 checkpoint (its W8A8 steps, the FP8 GEMM emulated exactly on the CPU,
on both replicas) and a Q8_0 GGUF of the tiny checkpoint (its GGML blocks on both replicas). Two real GPUs running
the branches concurrently are not exercised (no GPU here).
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections import Counter

import pytest
import torch
from test_fast_modes_nodes import plans  # noqa: F401  (the fixture recording the plans the sampler runs)
from test_fp8_nodes import MODELOPT
from test_fp8_nodes import setup as fp8_setup  # noqa: F401  (the module fixture: builds the ModelOpt checkpoint)
from test_gguf_nodes import GGUF, gguf_setup  # noqa: F401  (gguf_setup: the module fixture writing the Q8_0 GGUF)
from test_nodes import _expect_error, host, run  # noqa: F401  (host: the module fixture of test_nodes)

from support.compare import rel
from test_workflows import load_api, shrink_api

pytestmark = pytest.mark.comfy

# rel(split, plain) bound, fp32 tiny models: the split run computes each branch at batch 1 where the plain run batches
# both, which may round an fp32 GEMM differently at the last bit, and an FP8 W8A8 step's e4m3 activations can carry
# that a little further (measured on a CPU: dense and GGUF bit-equal, FP8 8e-7; the FP8 replica running W8A16 at its
# W8A8 step instead: 9e-3).
TOLERANCE = 1e-5


def _graph(prefix: str, mode: str = "t2v", **kw) -> dict:
    return shrink_api(load_api(mode), prefix=f"cosmos3_tests/{prefix}", **kw)


def _pack(host) -> str:  # noqa: F811
    return host.node_class_mappings["Cosmos3Loader"].__module__.split(".nodes.")[0]


def test_two_gpu_node_refuses_a_model_on_the_cpu(host):  # noqa: F811
    g = _graph("two_gpu_refused")
    g["20"] = {"class_type": "Cosmos3GuidanceOnTwoGPUs", "inputs": {"model": ["1", 0], "second_gpu": 1}}
    g["3"]["inputs"]["model"] = ["20", 0]
    _expect_error(host, g, "Cosmos3GuidanceOnTwoGPUs", "the model runs on cpu, not a GPU", "two local GPUs")


# What the two test-only nodes below keep; ``_second_device_nodes`` clears it. Module-level (not a closure per test):
# ComfyUI keeps a node's instance across prompts, so a later test's class would not replace an earlier one's.
_CAPTURED: dict[str, object] = {}


class Cosmos3TestSecondDeviceCPU:
    """The two-GPU node with the CPU as the second device (its GPU checks bypassed); keeps the handle it returns."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("COSMOS3_MODEL",)}}

    RETURN_TYPES = ("COSMOS3_MODEL",)
    FUNCTION = "make"
    CATEGORY = "testing"

    def make(self, model):
        _CAPTURED["handle"] = handle = model.with_branch_devices(torch.device("cpu"))
        return (handle,)


class Cosmos3TestCaptureLatent:
    """Keeps the sampled latent under ``key``."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"samples": ("LATENT",), "key": ("STRING", {"default": ""})}}

    RETURN_TYPES = ()
    FUNCTION = "keep"
    OUTPUT_NODE = True
    CATEGORY = "testing"

    def keep(self, samples, key):
        _CAPTURED[key] = samples["samples"].clone()
        return ()


@contextlib.contextmanager
def _second_device_nodes(host):  # noqa: F811
    """The two test-only nodes in the host while the block runs; yields what they keep (``_CAPTURED``)."""
    nodes = host.node_class_mappings
    _CAPTURED.clear()
    nodes["Cosmos3TestSecondDeviceCPU"] = Cosmos3TestSecondDeviceCPU
    nodes["Cosmos3TestCaptureLatent"] = Cosmos3TestCaptureLatent
    try:
        yield _CAPTURED
    finally:
        del nodes["Cosmos3TestSecondDeviceCPU"], nodes["Cosmos3TestCaptureLatent"]
        _CAPTURED.clear()  # the handle holds ComfyUI model patchers: never kept past the test


def _plain_then_split(host, graph_of, calls: Counter | None = None):  # noqa: F811
    """Sample ``graph_of(key)`` (the loader "1" → the sampler "3") once as is and once with the uncond branch on the
    handle's second device. Returns (plain latent, split latent, the split run's ``BranchDevices``, ``calls`` as it
    was after the plain run — it is cleared for the split run), after checking that the sampler used the split."""
    plain_calls = Counter()
    with _second_device_nodes(host) as captured:
        for key, split in (("plain", False), ("split", True)):
            g = graph_of(key)
            if split:
                if calls is not None:
                    plain_calls.update(calls)
                    calls.clear()
                g["20"] = {"class_type": "Cosmos3TestSecondDeviceCPU", "inputs": {"model": ["1", 0]}}
                g["3"]["inputs"]["model"] = ["20", 0]
            g["21"] = {"class_type": "Cosmos3TestCaptureLatent", "inputs": {"samples": ["3", 0], "key": key}}
            success, _, messages, _ = run(host, g)
            assert success, messages
        branches = captured["handle"]._branch_split
        plain, got = captured["plain"].double(), captured["split"].double()
    assert branches is not None and branches.devices == [torch.device("cpu"), torch.device("cpu")]  # the sampler used it
    assert got.shape == plain.shape
    return plain, got, branches, plain_calls


def _count_calls(monkeypatch, cls, method: str) -> Counter:
    """Calls of ``cls.method`` from now on, by ``id`` of the layer (``_by_name`` names them in a model)."""
    seen, real = Counter(), getattr(cls, method)

    @functools.wraps(real)
    def counting(self, *args, **kwargs):
        seen[id(self)] += 1
        return real(self, *args, **kwargs)

    monkeypatch.setattr(cls, method, counting)
    return seen


def _by_name(seen: Counter, model: torch.nn.Module, names) -> dict[str, int]:
    return {n: seen[id(model.get_submodule(n))] for n in names}


def _generation_layers(branches, quantized) -> list[str]:
    """The generation tower's layers that are ``quantized(layer)`` on the model's device and in the replica on the
    second device (its text tower is ``meta``); checks that the replica keeps each such layer quantized."""
    model, replica = branches.replicas
    names = [n for n, m in replica.named_modules() if isinstance(getattr(m, "weight", None), torch.Tensor)
             and m.weight.device.type != "meta" and quantized(model.get_submodule(n))]
    assert names and all(quantized(replica.get_submodule(n)) for n in names), names
    return names


def test_sampler_runs_the_uncond_branch_on_the_handles_second_device(host):  # noqa: F811
    def graph_of(key):
        g = _graph(f"two_gpu_{key}")
        g["3"]["inputs"]["seed"] = 123
        return g

    plain, got, _, _ = _plain_then_split(host, graph_of)
    assert rel(got, plain) <= TOLERANCE


def test_fp8_modelopt_checkpoint_runs_w8a8_on_both_devices(host, fp8_setup, plans, monkeypatch):  # noqa: F811
    """NVIDIA's FP8 checkpoint (calibrated activation scales) through Load Cosmos3 Checkpoint, 7 steps (NVIDIA's
    policy: the middle step W8A8) with the FP8 GEMM emulated: every generation-tower FP8 layer runs its W8A8 forward
    as often on the second device's replica as on the model's own, and as in the plain run; the latents agree."""
    pack = _pack(host)
    sampler = sys.modules[host.node_class_mappings["Cosmos3KSamplerUniPCDualTower"].__module__]
    # the sampler's options, with the CPU's exact FP8 GEMM (no node input for it; the CPU has no FP8 tensor cores)
    monkeypatch.setattr(sampler, "RuntimeOptions", functools.partial(sampler.RuntimeOptions, fp8_gemm="emulate"))
    layer_cls = sys.modules[f"{pack}.nodes.model_handle"].StreamingFp8Linear
    w8a8 = _count_calls(monkeypatch, layer_cls, "w8a8")

    def graph_of(key):
        return _graph(f"two_gpu_fp8_{key}", "t2i", checkpoint=MODELOPT, width=48, height=32, steps=7, seed=5)

    plain, got, branches, plain_w8a8 = _plain_then_split(host, graph_of, w8a8)
    model, replica = branches.replicas
    gen = _generation_layers(branches, lambda m: isinstance(m, layer_cls) and m.has_w8a8)
    on_model, on_replica = _by_name(w8a8, model, gen), _by_name(w8a8, replica, gen)
    before = _by_name(plain_w8a8, model, gen)
    precisions = [g.precision for g in plans[1].guidance]
    assert len(plans) == 2 and [g.precision for g in plans[0].guidance] == precisions
    assert None not in precisions, "the sampler's plan has no FP8 step modes (W8A16 throughout)"
    # each layer's W8A8 steps under the plan's policy (NVIDIA's: the middle step of 7 on the "generation" path)
    w8a8_steps = {n: sum(g.precision.mode_of(model.get_submodule(n).path) == "W8A8" for g in plans[1].guidance)
                  for n in gen}
    assert max(w8a8_steps.values()) >= 1, w8a8_steps  # the run has W8A8 steps at all
    assert on_replica == w8a8_steps, on_replica  # on the second device, each at every one of its W8A8 steps
    assert on_model == on_replica == before  # and as often on the model's own device, and as in the plain run
    assert rel(got, plain) <= TOLERANCE


def test_gguf_q8_model_runs_its_blocks_on_both_devices(host, gguf_setup, monkeypatch):  # noqa: F811
    """A Q8_0 GGUF through Load Cosmos3 Checkpoint: the second device's replica keeps the GGML blocks (uint8) and
    every generation-tower layer dequantizes them at each step there, as on the model's own device; the latents
    agree."""
    pack = _pack(host)
    layer_cls = sys.modules[f"{pack}.nodes.model_handle"].StreamingGgufLinear
    calls = _count_calls(monkeypatch, layer_cls, "forward")

    def graph_of(key):
        g = _graph(f"two_gpu_gguf_{key}", seed=11)
        g["1"]["inputs"]["gguf"] = GGUF
        return g

    plain, got, branches, plain_calls = _plain_then_split(host, graph_of, calls)
    model, replica = branches.replicas
    gen = _generation_layers(branches, lambda m: isinstance(m, layer_cls) and m.weight.dtype == torch.uint8)
    on_model, on_replica = _by_name(calls, model, gen), _by_name(calls, replica, gen)
    steps = graph_of("plain")["3"]["inputs"]["steps"]
    assert set(on_replica.values()) == {steps}, on_replica  # every guided step on the second device
    assert on_model == on_replica == _by_name(plain_calls, model, gen)  # and on the model's own, as in the plain run
    assert rel(got, plain) <= TOLERANCE

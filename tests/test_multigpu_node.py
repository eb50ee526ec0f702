"""Cosmos3GuidanceOnTwoGPUs in the real in-process ComfyUI host (CPU only here).

What a CPU host can check: the node's refusal when the model is not on a GPU (clear message, next run works), and
the sampler's plumbing of the two-device split — a test-only node hands the sampler a handle whose second "device"
is the CPU (the one GPU-only check of the node bypassed), and the sampled latent must equal the plain run's. Two real
GPUs running the branches concurrently are not exercised (no GPU here).
"""

from __future__ import annotations

import pytest
import torch
from test_nodes import _expect_error, host, run  # noqa: F401  (host: the module fixture of test_nodes)

from support.compare import rel
from test_workflows import load_api, shrink_api

pytestmark = pytest.mark.comfy


def _graph(prefix: str) -> dict:
    return shrink_api(load_api("t2v"), prefix=f"cosmos3_tests/{prefix}")


def test_two_gpu_node_refuses_a_model_on_the_cpu(host):  # noqa: F811
    g = _graph("two_gpu_refused")
    g["20"] = {"class_type": "Cosmos3GuidanceOnTwoGPUs", "inputs": {"model": ["1", 0], "second_gpu": 1}}
    g["3"]["inputs"]["model"] = ["20", 0]
    _expect_error(host, g, "Cosmos3GuidanceOnTwoGPUs", "the model runs on cpu, not a GPU", "two local GPUs")


def test_sampler_runs_the_uncond_branch_on_the_handles_second_device(host):  # noqa: F811
    captured: dict[str, object] = {}

    class Cosmos3TestSecondDeviceCPU:
        @classmethod
        def INPUT_TYPES(cls):
            return {"required": {"model": ("COSMOS3_MODEL",)}}

        RETURN_TYPES = ("COSMOS3_MODEL",)
        FUNCTION = "make"
        CATEGORY = "testing"

        def make(self, model):
            captured["handle"] = handle = model.with_branch_devices(torch.device("cpu"))
            return (handle,)

    class Cosmos3TestCaptureLatent:
        @classmethod
        def INPUT_TYPES(cls):
            return {"required": {"samples": ("LATENT",), "key": ("STRING", {"default": ""})}}

        RETURN_TYPES = ()
        FUNCTION = "keep"
        OUTPUT_NODE = True
        CATEGORY = "testing"

        def keep(self, samples, key):
            captured[key] = samples["samples"].clone()
            return ()

    nodes = host.node_class_mappings
    nodes["Cosmos3TestSecondDeviceCPU"] = Cosmos3TestSecondDeviceCPU
    nodes["Cosmos3TestCaptureLatent"] = Cosmos3TestCaptureLatent
    try:
        for key, split in (("plain", False), ("split", True)):
            g = _graph(f"two_gpu_{key}")
            g["3"]["inputs"]["seed"] = 123
            if split:
                g["20"] = {"class_type": "Cosmos3TestSecondDeviceCPU", "inputs": {"model": ["1", 0]}}
                g["3"]["inputs"]["model"] = ["20", 0]
            g["21"] = {"class_type": "Cosmos3TestCaptureLatent", "inputs": {"samples": ["3", 0], "key": key}}
            success, _, messages, _ = run(host, g)
            assert success, messages
    finally:
        del nodes["Cosmos3TestSecondDeviceCPU"], nodes["Cosmos3TestCaptureLatent"]
    split = captured["handle"]._branch_split
    assert split is not None and split.devices == [torch.device("cpu"), torch.device("cpu")]  # the sampler used it
    plain, got = captured["plain"].double(), captured["split"].double()
    assert got.shape == plain.shape
    assert rel(got, plain) <= 1e-5

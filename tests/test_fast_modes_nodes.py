"""The fast-mode inputs of the sampler and Long Video nodes in a real ComfyUI 0.3.75 host (tiny checkpoints, CPU).

* SeaCache runs a workflow and reuses steps (the sampler's plan holds the run's SeaCache); the Long Video node
  takes it too, each window with a cache of its own;
* an NVIDIA FP8 (ModelOpt) checkpoint samples through the loader: the CPU has no FP8 GEMMs, so the run is W8A16 at
  every step and the log says why, once (its W8A8 steps in ComfyUI's layers: tests/test_fp8_nodes.py);
* SeaCache on too few steps, ``mixed_precision_format`` ``fp8`` on a bf16 checkpoint or where FP8 GEMMs cannot run:
  one message naming the node, the value and the fix, and the next run succeeds.
"""

from __future__ import annotations

import logging
import shutil
import sys

import pytest
from test_nodes import _expect_error, host, run, t2i_graph  # noqa: F401  (host: the module fixture)

from support import comfy_host
from test_workflows import load_api, nodes_of, shrink_api

FP8_NAME = "cosmos3-tiny-nano-fp8-fast"


def _sampler(graph) -> dict:
    (ks,) = nodes_of(graph, "Cosmos3KSamplerUniPCDualTower")
    return graph[ks]["inputs"]


@pytest.fixture
def plans(host, monkeypatch):
    """The plans the nodes run (``Cosmos3Pipeline.run``'s argument, in the host's copy of the pack), in order."""
    pack = host.node_class_mappings["Cosmos3KSamplerUniPCDualTower"].__module__.split(".nodes.")[0]
    pipeline = sys.modules[f"{pack}.cosmos3_core.pipeline"].Cosmos3Pipeline
    seen, real = [], pipeline.run

    def recording(self, plan, *args, **kwargs):
        seen.append(plan)
        return real(self, plan, *args, **kwargs)

    monkeypatch.setattr(pipeline, "run", recording)
    return seen


@pytest.fixture(scope="module")
def fp8_checkpoint(host):
    from cosmos3_core.testing.fp8 import build_fp8_checkpoint

    root = host.base_dir / "models" / "diffusers"
    build_fp8_checkpoint(root / "cosmos3-tiny-nano", root / FP8_NAME)
    yield FP8_NAME
    shutil.rmtree(root / FP8_NAME, ignore_errors=True)


def test_sea_cache_runs_a_workflow_and_reuses_steps(host, plans):
    graph = t2i_graph(seed=3)
    _sampler(graph).update(steps=12, sea_cache=True, sea_cache_threshold=0.6)
    success, _outputs, messages, _ = run(host, graph)
    assert success, comfy_host._execution_error_text(messages)
    (plan,) = plans
    assert plan.cache is not None and plan.cache.config.threshold == 0.6
    assert any(not computed for *_, computed in plan.cache.trace)


def test_long_video_takes_sea_cache_per_window(host, plans):
    graph = shrink_api(load_api("long_t2v"), prefix="cosmos3_tests/long_sea", steps=8)
    (nid,) = nodes_of(graph, "Cosmos3LongVideo")
    graph[nid]["inputs"].update(sea_cache=True, sea_cache_threshold=0.6)
    success, _outputs, messages = host.run(graph)
    assert success, comfy_host._execution_error_text(messages)
    assert len(plans) > 1 and all(p.cache is not None for p in plans)
    assert len({id(p.cache) for p in plans}) == len(plans)


def test_fp8_checkpoint_samples_w8a16_and_says_why(host, fp8_checkpoint, caplog, plans):
    graph = t2i_graph(seed=4, checkpoint=fp8_checkpoint)
    with caplog.at_level(logging.INFO, logger="cosmos3"):
        success, _outputs, messages, _ = run(host, graph)
    assert success, comfy_host._execution_error_text(messages)
    notes = [r.getMessage() for r in caplog.records if r.name == "cosmos3" and r.getMessage().startswith("FP8:")]
    assert len(notes) == 1 and "runs W8A16 at every step" in notes[0], notes
    (plan,) = plans
    assert plan.precision == (None,) * plan.steps and plan.fp8 in notes[0]


def test_sea_cache_with_too_few_steps_names_the_node(host):
    graph = t2i_graph(seed=5)
    _sampler(graph).update(steps=4, sea_cache=True)
    _expect_error(host, graph, "Cosmos3KSamplerUniPCDualTower", "sea_cache: SeaCache", "too few steps",
                  "Turn sea_cache off")


def test_fp8_format_on_a_bf16_checkpoint_names_the_node(host):
    graph = t2i_graph(seed=6)
    _sampler(graph).update(mixed_precision_format="fp8")
    _expect_error(host, graph, "Cosmos3KSamplerUniPCDualTower", "mixed_precision_format='fp8' applies to NVIDIA",
                  "fp8_e4m3fn_fast")


def test_fp8_format_where_w8a8_cannot_run_names_the_node(host, fp8_checkpoint):
    graph = t2i_graph(seed=7, checkpoint=fp8_checkpoint)
    _sampler(graph).update(mixed_precision_format="fp8")
    _expect_error(host, graph, "Cosmos3KSamplerUniPCDualTower", "mixed_precision_format='fp8'",
                  "needs real FP8 GEMMs", "cpu has no FP8 GEMMs")


def test_fp8_e5m2_storage_of_an_nvidia_fp8_checkpoint_is_refused(host, fp8_checkpoint):
    """weight_dtype fp8_e5m2 silently re-quantized the published e4m3 weights (issue 39); the CLI refuses the
    analogous case. fp8_e4m3fn keeps them as they are."""
    graph = t2i_graph(seed=5)
    (ld,) = nodes_of(graph, "Cosmos3Loader")
    graph[ld]["inputs"].update(checkpoint=fp8_checkpoint, weight_dtype="fp8_e5m2")
    _expect_error(host, graph, "Cosmos3Loader", "already NVIDIA FP8", "weight_dtype fp8_e5m2 would re-quantize it",
                  "weight_dtype auto")

"""The sampler node's fast-mode inputs in a real ComfyUI 0.3.75 host: SeaCache runs a workflow (and reuses steps),
SeaCache on too few steps and FP8 asked where no W8A8 forward exists are one message naming the node."""

from __future__ import annotations

import comfy_host
from test_nodes import _expect_error, host, run, t2i_graph  # noqa: F401
from test_workflows import nodes_of


def _sampler(graph) -> dict:
    (ks,) = nodes_of(graph, "Cosmos3KSamplerUniPCDualTower")
    return graph[ks]["inputs"]


def test_sea_cache_runs_a_workflow(host):
    graph = t2i_graph(seed=3)
    inputs = _sampler(graph)
    inputs.update(steps=12, sea_cache=True, sea_cache_threshold=0.6)
    success, _outputs, messages, _ = run(host, graph)
    assert success, comfy_host._execution_error_text(messages)


def test_sea_cache_with_too_few_steps_names_the_node(host):
    graph = t2i_graph(seed=4)
    _sampler(graph).update(steps=4, sea_cache=True)
    _expect_error(host, graph, "Cosmos3KSamplerUniPCDualTower", "SeaCache", "too few steps", "Turn sea_cache off")


def test_fp8_format_on_a_bf16_checkpoint_names_the_node(host):
    graph = t2i_graph(seed=5)
    _sampler(graph).update(mixed_precision_format="fp8")
    _expect_error(host, graph, "Cosmos3KSamplerUniPCDualTower", "mixed_precision_format='fp8'", "fp8_e4m3fn_fast")

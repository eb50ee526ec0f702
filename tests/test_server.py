"""A real ``main.py --cpu`` ComfyUI 0.3.75 server on 127.0.0.1 running the shipped workflows over HTTP.

One server per module (``--preview-method auto``), its home holding the tiny Nano (with sound) and Edge checkpoints and the test inputs.
Every shipped API workflow is POSTed (shrunk) to /prompt and must finish with status ``success`` in /history and
write a readable file (reasoner_to_i2v, on a tiny checkpoint with vision_encoder/, also returns the reasoner's caption
through PreviewAny); /object_info serves all seven Cosmos3 nodes; a second run with another seed reports the
loader and the text encode in ``execution_cached``. Once up, before any prompt, the server imports what a first run
needs (nodes/warmup.py).
"""
from __future__ import annotations

import time
import uuid

import pytest

from cosmos3_core.kernels.caches import RUN_MODULES
from support import comfy_host
from test_workflows import (
    MODES,
    PACK_NODE_IDS,
    REASONER_MODES,
    TINY_EDGE,
    TINY_NANO,
    TINY_NANO_VLM,
    check_outputs,
    ensure_tiny_checkpoints,
    load_api,
    nodes_of,
    shrink_api,
    write_test_inputs,
)

pytestmark = pytest.mark.comfy


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_checkpoint):
    base = comfy_host.comfy_home(tmp_path_factory.mktemp("server"))
    ensure_tiny_checkpoints(base / "models" / "diffusers", tiny_checkpoint)
    write_test_inputs(base / "input")
    # previews on (as many users run it): the sampler's per-step latent preview path runs in every workflow
    with comfy_host.ComfyServer(base, require_pack=True, extra_args=["--preview-method", "auto"]) as srv:
        yield srv


def status_messages(entry: dict) -> list:
    return (entry.get("status") or {}).get("messages") or []


def test_the_server_imports_what_a_first_run_needs_once_it_is_up(server):
    """nodes/warmup.py: started by the server's start, with no prompt queued; on this CPU server (compile 'auto' is
    off) without the compiler's modules."""
    deadline = time.monotonic() + 120
    while "Cosmos3: imported what a first run needs" not in server.log_text():
        assert time.monotonic() < deadline, server.log_tail()
        time.sleep(0.5)
    line = next(t for t in server.log_text().splitlines() if "Cosmos3: imported what a first run needs" in t)
    assert f"({len(RUN_MODULES)} of {len(RUN_MODULES)} modules)" in line, line  # all imported; not the compiler


def test_object_info_lists_all_nodes(server):
    assert set(PACK_NODE_IDS) <= set(server.pack_node_ids()), server.pack_node_ids()
    for node_id in PACK_NODE_IDS:
        info = server.object_info(node_id)
        assert info is not None, f"/object_info/{node_id} is empty"
        assert info["name"] == node_id and info["python_module"] == comfy_host.PACK_MODULE, info
        assert info["category"] == "Cosmos3"
    options = server.object_info("Cosmos3Loader")["input"]["required"]["checkpoint"][1]["options"]
    assert TINY_NANO in options and TINY_EDGE in options and TINY_NANO_VLM in options, options


@pytest.mark.parametrize("mode", MODES)
def test_workflow_over_http(server, mode):
    graph = shrink_api(load_api(mode), prefix=f"cosmos3_http/{mode}")  # reasoner_to_i2v: the *-vlm checkpoint
    entry = server.run(graph, timeout=300)
    assert entry["status"]["status_str"] == "success"
    events = [m[0] for m in status_messages(entry)]
    assert events[0] == "execution_start" and events[-1] == "execution_success", events
    check_outputs(server.base_dir, mode, graph, entry["outputs"])
    if mode in REASONER_MODES:  # the caption that became the prompt comes back as PreviewAny's UI text
        assert graph[nodes_of(graph, "Cosmos3Loader")[0]]["inputs"]["checkpoint"] == TINY_NANO_VLM
        (pv,) = nodes_of(graph, "PreviewAny")
        (caption,) = entry["outputs"][pv]["text"]
        assert isinstance(caption, str) and caption.strip(), entry["outputs"][pv]


def test_second_seed_reuses_text_encode(server):
    tag = f" (http cache probe {uuid.uuid4().hex[:8]})"
    first = shrink_api(load_api("t2av"), seed=11, prompt_suffix=tag, prefix="cosmos3_http/seed")
    second = shrink_api(load_api("t2av"), seed=12, prompt_suffix=tag, prefix="cosmos3_http/seed")
    # queue both before waiting: the server runs them in order
    pid1, pid2 = server.queue(first), server.queue(second)
    e1, e2 = server.wait(pid1, timeout=300), server.wait(pid2, timeout=300)
    assert e1["status"]["status_str"] == "success" and e2["status"]["status_str"] == "success"

    def cached(entry):
        return next(d["nodes"] for e, d in status_messages(entry) if e == "execution_cached")

    assert "2" not in cached(e1), cached(e1)  # new prompt text: the first run encodes it
    assert {"1", "2"} <= set(cached(e2)), cached(e2)  # Cosmos3Loader + Cosmos3TextEncode re-used
    assert "3" not in cached(e2) and "7" not in cached(e2), cached(e2)  # sampler and save ran again
    f1 = check_outputs(server.base_dir, "t2av", first, e1["outputs"])[0]
    f2 = check_outputs(server.base_dir, "t2av", second, e2["outputs"])[0]
    assert f1 != f2 and f1.read_bytes() != f2.read_bytes()


def test_bad_input_reports_node_and_server_keeps_working(server):
    graph = shrink_api(load_api("t2v"), checkpoint=TINY_EDGE)
    graph["2"]["inputs"]["num_frames"] = 10
    entry = server.wait(server.queue(graph), timeout=300)
    assert entry["status"]["status_str"] == "error"
    err = next(d for e, d in status_messages(entry) if e == "execution_error")
    assert err["node_type"] == "Cosmos3TextEncode" and "num_frames=10" in err["exception_message"], err
    ok = server.run(shrink_api(load_api("t2i"), prefix="cosmos3_http/after_error"), timeout=300)
    assert ok["status"]["status_str"] == "success"

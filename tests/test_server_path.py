"""``bench/bench_server_path.py --tiny`` end to end against a real ComfyUI 0.3.75 ``main.py`` server on the CPU.

The benchmark of record's whole flow on a tiny checkpoint written by the same writer (``testing/fullsize.py``): the
write stage (and its skip on a second call), a server with the pack running the shipped t2i/t2v/t2av API workflows
twice per shape, a restarted server on the same compile cache, and diffusers' ``Cosmos3OmniPipeline.from_pretrained``
on the same folder. The results file must hold every field the GPU run reports, with per-node times that add up to
the server's own ``execution_start`` → ``execution_success`` span.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from support import comfy_host

pytestmark = pytest.mark.comfy

BENCH = comfy_host.REPO_ROOT / "bench" / "bench_server_path.py"
SHAPES = ("t2i", "480p_t2v", "480p_t2av", "720p_t2av")
WORKFLOW_NODES = {"t2i": {"Cosmos3TextEncode", "Cosmos3KSamplerUniPCDualTower", "Cosmos3VAEDecode", "SaveImage"},
                  "t2v": {"Cosmos3TextEncode", "Cosmos3KSamplerUniPCDualTower", "Cosmos3VAEDecode", "CreateVideo",
                          "SaveVideo"}}
WORKFLOW_NODES["t2av"] = WORKFLOW_NODES["t2v"] | {"Cosmos3AudioDecode"}


def _bench(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, str(BENCH), "--tiny", *args], capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-6000:]}\n{proc.stderr[-6000:]}"
    return proc


def test_tiny_server_path_reports_every_field(tmp_path):
    work, out, page = tmp_path / "work", tmp_path / "server_path.json", tmp_path / "page"
    page.mkdir()
    (page / "index.html").write_text("<html></html>")  # served instead of the frontend package (a lent GPU machine)
    _bench("--stage", "all", "--work", str(work), "--comfyui", str(comfy_host.comfyui_dir()), "--out", str(out),
           "--settle", "0.5", f"--server-args=--front-end-root {page}")
    data = json.loads(out.read_text())
    for kind in ("ours", "restart"):
        assert data["server"][kind]["settle_s"] == 0.5
        assert f"web root: {page}" in (work / f"comfyui-{kind}.log").read_text()

    assert data["meta"]["tiny"] is True and data["meta"]["steps"] == 2 and data["meta"]["cond_tokens"] > 40
    assert data["checkpoint"]["kept_existing"] is False and data["checkpoint"]["size_gb"] > 0
    for kind in ("ours", "restart"):
        server = data["server"][kind]
        assert server["comfyui_version"] == "0.3.75" and server["startup_s"] > 0, server
        assert isinstance(server["pack_import_s"], float) and server["pack_import_s"] >= 0, server
    assert data["pack_import_s"] == data["server"]["ours"]["pack_import_s"]
    for which in ("ours", "diffusers"):  # the load stage: fresh processes, twice each
        rec = data["load"][which]
        assert rec["import_s"] > 0 and len(rec["loads"]) == 2 and rec["first_s"] > 0 and rec["second_s"] > 0, rec
    assert data["load"]["diffusers"]["loads"][1]["from_pretrained_s"] > 0
    load = data["diffusers_load"]
    assert load["diffusers"] == "0.42.1" and load["load_s"] > 0 and load["from_pretrained_s"] > 0, load

    for name in SHAPES:
        entry = data["shapes"][name]
        mode = entry["workflow"].rsplit("cosmos3_", 1)[1].removesuffix(".json")
        for key in ("first_s", "second_s", "restart_s", "diffusers_first_s", "diffusers_second_s",
                    "first_without_load_s", "restart_without_load_s"):
            assert isinstance(entry[key], float) and entry[key] > 0, (name, key, entry.get(key))
        for label in ("first", "second", "restart", "diffusers_first", "diffusers_second"):
            peak = entry["peak_memory"][label]
            assert peak["host_rss_gib"] > 0.1 and "gpu_smi_gib" in peak, (name, label, peak)
        for label in ("first", "second", "restart"):
            run = entry["runs"][label]
            nodes = run["nodes"]
            assert abs(run["prompt_executed_s"] - run["total_s"]) < 0.5, run  # the log line and /history agree
            ran = {n["class_type"] for n in nodes.values()}
            assert WORKFLOW_NODES[mode] <= ran, (name, label, ran)
            assert all(n["s"] is not None and n["s"] >= 0 for n in nodes.values()), nodes
            # the node spans tile the server's own execution_start -> execution_success span, up to how late the
            # websocket stream ran behind the executor (a CPU-starved server delivers its messages bunched)
            total, lag = sum(n["s"] for n in nodes.values()), run["event_lag_s"]
            assert set(lag) == {"start", "success"} and all(v > -0.05 for v in lag.values()), lag
            slack = 0.3 + abs(lag["success"] - lag["start"]) + max(lag.values())
            assert run["total_s"] - slack <= total <= run["total_s"] + slack, (name, label, total, run["total_s"], lag)
            sampler = next(n for n in nodes.values() if n["class_type"] == "Cosmos3KSamplerUniPCDualTower")
            # None: the two steps' progress messages arrived in one burst (a CPU-starved server; no server clock)
            assert sampler["steps"] == 2 and (sampler["s_per_step"] is None or sampler["s_per_step"] > 0), sampler
            first_of_server = label in ("first", "restart") and name == SHAPES[0]
            assert ("Cosmos3Loader" in ran) is first_of_server, (name, label, ran)
            assert (run["load_s"] > 0) is first_of_server and ("1" in run["cached"]) is not first_of_server, run
            assert run["without_load_s"] == pytest.approx(run["total_s"] - run["load_s"], abs=2e-3)
        assert entry["diffusers"]["second"]["steps"] == 2

    # a second write keeps the complete checkpoint (what makes a rerun of the stage cheap); a damaged one is redone
    from cosmos3_core.testing.fullsize import MARKER, is_complete, spec_of, write_random_checkpoint

    ckpt = work / "Cosmos3-Nano"
    shard = sorted((ckpt / "transformer").glob("*.safetensors"))[0]
    before = shard.stat().st_mtime_ns
    assert is_complete(ckpt, spec_of("nano", tiny=True)) and not is_complete(ckpt, spec_of("edge", tiny=True))
    write_random_checkpoint(ckpt, "nano", tiny=True, log=lambda _: None)
    assert shard.stat().st_mtime_ns == before
    with open(shard, "r+b") as f:
        f.truncate(shard.stat().st_size - 8)
    assert not is_complete(ckpt, spec_of("nano", tiny=True)) and (ckpt / MARKER).is_file()

"""``bench/soak.py --tiny`` (the GPU soak's job mix on a CPU server, issue 39) keeps working: a short run of its
warm-up, interrupt and checkpoint-switch phases against a real ComfyUI 0.3.75 ``main.py`` with the probe module
beside the pack. Every job ends as planned (interrupts land in the node they aim at, the websocket client that is
cut still gets its video), every job has the probe's record, ``output/`` holds only the successful jobs' files and
the interrupted long video's finished window, and the results file is written. (The CPU suite's own long soak is
``tests/test_soak.py``.)
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from support import comfy_host

pytestmark = pytest.mark.comfy

BENCH = comfy_host.REPO_ROOT / "bench" / "soak.py"


def test_tiny_soak_runs_its_mix(tmp_path):
    work, out = tmp_path / "work", tmp_path / "soak.json"
    proc = subprocess.run([sys.executable, str(BENCH), "--tiny", "--work", str(work), "--out", str(out),
                           "--comfyui", str(comfy_host.comfyui_dir()), "--phases", "warmup,main1,switch"],
                          capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-6000:]}\n{proc.stderr[-6000:]}"
    data = json.loads(out.read_text())
    jobs = data["jobs"]
    assert len(jobs) == 8 + 29 + 5, len(jobs)
    assert all(j["ok"] for j in jobs), [j for j in jobs if not j["ok"]]
    landed = {j["interrupt"]: j["node_type"] for j in jobs if j.get("interrupt")}
    assert landed == {"sampling": "Cosmos3KSamplerUniPCDualTower", "decode": "Cosmos3VAEDecode",
                      "window": "Cosmos3LongVideo"}, landed
    assert all(j["probe"] and j["probe"]["after"]["rss"] > 0 and j["probe"]["after"]["fds"]["total"] > 0
               for j in jobs)
    assert data["outputs"]["ok"] and data["outputs"]["interrupted_long_videos"], data["outputs"]
    assert data["summary"]["steady_jobs"] > 0 and data["summary"]["checks"]["fds"]["ok"], data["summary"]
    assert data["server"]["alive_at_end"]

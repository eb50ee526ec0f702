"""``bench/bench_fast_modes.py --tiny`` (issue 38's fast-mode batch) keeps working on the CPU: every mode runs,
NVIDIA's FP8 policy gives 35 − 3 − 3 = 29 W8A8 steps of 35 (the reference's FIRST_LAST_N policy), SeaCache reuses
steps, and the comparison against exact finds the FP8 runs close to exact but not equal to it (their W8A8 steps ran).
"""
from __future__ import annotations

import json
import subprocess
import sys

from support import comfy_host

BENCH = comfy_host.REPO_ROOT / "bench" / "bench_fast_modes.py"


def test_tiny_fast_modes_run_and_compare(tmp_path):
    out = tmp_path / "fast.json"
    proc = subprocess.run([sys.executable, str(BENCH), "--tiny", "--resolutions", "t2i", "--modes",
                           "exact,fp8,fp8+sea", "--dir", str(tmp_path / "latents"), "--out", str(out)],
                          capture_output=True, text=True, timeout=600, cwd=comfy_host.REPO_ROOT)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    runs = json.loads(out.read_text())
    assert runs["t2i/exact"]["fp8_w8a8_steps"] == 0 and runs["t2i/exact"]["fp8"] is None
    assert runs["t2i/fp8"]["fp8_w8a8_steps"] == 29 and runs["t2i/fp8+sea"]["fp8_w8a8_steps"] == 29
    assert runs["t2i/fp8+sea"]["reused_contexts"] > 0
    for mode in ("t2i/fp8", "t2i/fp8+sea"):
        assert 0.9 < runs["compare"][mode]["latent_cosine"] < 0.99999, runs["compare"][mode]

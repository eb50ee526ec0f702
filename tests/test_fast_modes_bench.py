"""``bench/bench_fast_modes.py --tiny`` (issue 38's fast-mode batch) keeps working on the CPU: every mode runs,
NVIDIA's FP8 policy gives 35 − 3 − 3 = 29 W8A8 steps of 35 (the reference's FIRST_LAST_N policy), SeaCache reuses
steps, and the comparison against exact finds the FP8 runs close to exact but not equal to it (their W8A8 steps ran);
each run's per-step times split by FP8 mode and SeaCache's cost model, and the projection to vLLM-Omni's published
reuse, land in the JSON.
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
    assert len(runs["t2i/exact"]["step_s"]) == 35 and "w8a8_step_s" not in runs["t2i/exact"]
    for mode in ("t2i/exact", "t2i/fp8", "t2i/fp8+sea"):  # the steps account for the run: none missing or extra
        assert abs(sum(runs[mode]["step_s"]) - runs[mode]["denoise_s"]) < 0.02 + 0.2 * runs[mode]["denoise_s"]
    assert runs["t2i/fp8"]["w8a8_step_s"] > 0 and runs["t2i/fp8"]["w8a16_step_s"] > 0
    both = runs["t2i/fp8+sea"]
    assert set(both["step_s_by_contexts_computed"]) >= {"0", "2"}, both["step_s_by_contexts_computed"]
    model = both["cost_model"]
    assert model["contexts_per_step"] == 2 and model["per_context_s"] > 0
    assert runs["machine"]["gpu"] == "cpu"


def test_a_shorter_run_projects_exact_and_fp8_to_35_steps(tmp_path):
    """``--steps 12``: NVIDIA's policy gives 3 + 3 W8A16 steps and 6 W8A8; the 35-step time is projected from the
    step means (6 W8A16 + 29 W8A8 for FP8), marked projected; SeaCache gets no projection of its own."""
    out = tmp_path / "short.json"
    proc = subprocess.run([sys.executable, str(BENCH), "--tiny", "--resolutions", "t2i", "--modes", "exact,fp8,sea",
                           "--steps", "12", "--warmup-steps", "1", "--dir", str(tmp_path / "latents"),
                           "--out", str(out)], capture_output=True, text=True, timeout=600, cwd=comfy_host.REPO_ROOT)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    runs = json.loads(out.read_text())
    exact, fp8, sea = runs["t2i/exact"], runs["t2i/fp8"], runs["t2i/sea"]
    assert exact["steps"] == 12 and exact["projected"] and len(exact["step_s"]) == 12
    assert abs(exact["denoise_35_steps_s"] - 35 * sum(exact["step_s"]) / 12) < 0.011
    assert fp8["fp8_w8a8_steps"] == 6
    # the warm-up of a fast mode reaches NVIDIA's W8A8 steps (its graph compiles there, not in the timed run)
    assert exact["warmup_steps"] == 1 and fp8["warmup_steps"] == 8 and sea["warmup_steps"] == 8
    expected = 29 * fp8["w8a8_step_s"] + 6 * fp8["w8a16_step_s"]
    assert abs(fp8["denoise_35_steps_s"] - expected) < 0.011
    assert sea["denoise_35_steps_s"] is None and sea["reused_contexts"] > 0


def test_reuse_projection_solves_for_the_published_speedup():
    """A SeaCache cost model of 0.1 s fixed + 0.4 s per context (2 contexts: a full step 0.9 s) and an exact run of
    35 × 0.9 s: 1.8× needs a mean step of 0.5 s, i.e. half the contexts reused; the FP8 run's own model at that
    reuse gives 35 × (0.1 + 0.3 · 2 · 0.5)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_fast_modes", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    runs = {"720p/exact": {"denoise_35_steps_s": 31.5},
            "720p/sea": {"reused_contexts": 28, "contexts": 70,
                         "cost_model": {"fixed_s": 0.1, "per_context_s": 0.4, "contexts_per_step": 2}},
            "720p/fp8+sea": {"cost_model": {"fixed_s": 0.1, "per_context_s": 0.3, "contexts_per_step": 2}}}
    proj = bench.project_reuse(runs, "720p")
    assert proj["reuse_fraction_needed"] == 0.5 and proj["measured_reuse_fraction"] == 0.4
    assert proj["sea_35_steps_s"] == 17.5 and proj["fp8_sea_35_steps_s"] == 14.0
    assert bench.project_reuse(runs, "480p") is None
    # out of reach: 1.8× over exact would need more than every context reused; the fraction stops at 1 and the
    # time is that of every step reused (35 × 0.1 s), not exact / 1.8
    runs["720p/exact"]["denoise_35_steps_s"] = 5.0
    proj = bench.project_reuse(runs, "720p")
    assert proj["reuse_fraction_needed"] == 1.0 and proj["sea_35_steps_s"] == 3.5
    runs["720p/sea"]["cost_model"]["per_context_s"] = 0.0  # reuse saves nothing: no fraction to solve for
    assert bench.project_reuse(runs, "720p")["reuse_fraction_needed"] is None

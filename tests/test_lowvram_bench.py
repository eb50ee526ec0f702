"""``bench/bench_lowvram.py --card-sizes`` (issue 37's card-size batch) keeps working on the CPU, and its step
timing leaves each graph's compile out of the step means: the first step (the W8A16 / only graph) and, under
NVIDIA's FP8 policy, the first W8A8 step, each counted once as it ran in the 35-step projection; the lent machine's
one-line-per-card view of its output (``bench/lent/summary.py``) names each case.
"""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from support import comfy_host

BENCH = comfy_host.REPO_ROOT / "bench" / "bench_lowvram.py"
SUMMARY = comfy_host.REPO_ROOT / "bench" / "lent" / "summary.py"


def bench_module():
    sys.path.insert(0, str(BENCH.parent))
    spec = importlib.util.spec_from_file_location("bench_lowvram", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def stamps_of(durations):
    stamps = [100.0]
    for d in durations:
        stamps.append(stamps[-1] + d)
    return stamps


def test_fp8_step_means_leave_out_each_graphs_compile():
    # 10 steps: 1-3 W8A16 (the first compiles), 4-7 W8A8 (the first compiles), 8-10 W8A16
    d = [20.0, 0.6, 0.6, 3.0, 0.45, 0.45, 0.45, 0.6, 0.6, 0.6]
    times = bench_module().step_times(stamps_of(d), seconds=sum(d) + 1.0, fp8=True)
    assert times["step_s_w8a16"] == 0.6 and times["step_s_w8a8"] == 0.45
    assert times["first_step_s"] == 20.0 and times["first_w8a8_step_s"] == 3.0
    assert times["projected_35_steps_s"] == round(1.0 + 20.0 + 3.0 + 5 * 0.6 + 28 * 0.45, 1)


def test_one_graph_step_mean_leaves_out_the_first():
    d = [12.0, 0.5, 0.5, 0.5]
    times = bench_module().step_times(stamps_of(d), seconds=sum(d), fp8=False)
    assert times == dict(step_s=0.5, first_step_s=12.0, projected_35_steps_s=round(12.0 + 34 * 0.5, 1))


@pytest.mark.comfy
def test_tiny_card_sizes_run_every_weights_kind(tmp_path):
    out = tmp_path / "cards.json"
    cases = "nano480_8g_q4_0,nano480_12g_fp8,nano480_16g_fp8_fast,nano480_16g_bf16"
    proc = subprocess.run([sys.executable, str(BENCH), "--comfyui", str(comfy_host.comfyui_dir()), "--card-sizes",
                           "--tiny", "--cases", cases, "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    runs = json.loads(out.read_text())["runs"]
    assert [r["case"] for r in runs] == cases.split(",")
    assert all(r["fits"] and r["sample"]["steps"] == 10 and r["frames_shape"][0] == 9 for r in runs)
    assert "step_s_w8a8" in runs[1]["sample"] and "step_s" in runs[0]["sample"]
    assert "step_s_w8a8" in runs[2]["sample"] and "approximate" in runs[2]["fp8"] and "approximate" not in runs[1]["fp8"]
    # a lent machine's short view of the same output (bench/lent/summary.py): one line per case, log lines skipped
    summary = subprocess.run([sys.executable, str(SUMMARY)], input=proc.stdout, capture_output=True, text=True,
                             check=True).stdout.splitlines()
    assert [line.split()[0] for line in summary] == cases.split(",")
    assert all(line.split()[1] == "fits" for line in summary) and "'step_s_w8a8'" in summary[1]


def test_a_failed_case_records_where_it_failed():
    def load_generation_tower():
        raise RuntimeError("Allocation on device 0 would exceed allowed memory. (out of memory)\nmore")

    try:
        load_generation_tower()
    except RuntimeError as exc:
        record = bench_module().failure(exc, handle=None, hold=None)
    assert record["error"] == "RuntimeError: Allocation on device 0 would exceed allowed memory. (out of memory)"
    assert record["where"][-1].startswith("test_lowvram_bench.py:") and record["where"][-1].endswith(
        " load_generation_tower")
    assert "at_failure" not in record


@pytest.mark.comfy
def test_full_size_cards_use_the_loaders_layer_classes_that_a_compiled_layer_is_saved_with():
    # torch saves a compiled generation layer to disk only with classes found at their module's top level; ComfyUI's
    # comfy.ops Linear is nested in a class, so a bench built on it measured a compile in every new process
    proc = subprocess.run([sys.executable, "-c", f"""
import sys
sys.path.insert(0, {str(comfy_host.comfyui_dir())!r}); sys.argv = sys.argv[:1]
from comfy.cli_args import args; args.cpu = True
sys.path.insert(0, {str(BENCH.parent)!r})
import importlib.util
spec = importlib.util.spec_from_file_location("bench_lowvram", {str(BENCH)!r})
bench = importlib.util.module_from_spec(spec); spec.loader.exec_module(bench)
bench.import_pack()
for weights in ("bf16", "fp8", "fp8_fast", "gguf_q4_0"):
    cls = bench.loader_linear(weights)
    assert "." not in cls.__qualname__ and getattr(sys.modules[cls.__module__], cls.__name__) is cls, cls
    assert cls.__module__ == "cosmos3_pack.nodes.model_handle", cls.__module__
print("ok")
"""], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]

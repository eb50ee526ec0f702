"""``bench/bench_generation.py --gemm-fusion --tiny`` (issue 38's FP8 GEMM micro-benchmark) keeps working on the CPU:
every case of one layer's GEMMs is timed (bf16 separate and fused; FP8 W8A8 GEMMs on a quantized input, per-tensor
and fused per-output-channel; the activation quantize; the whole W8A8 and W8A16 forwards of the product's
``Fp8Linear``), the per-layer sums and the 36-layer step land in the JSON, and a fused q/k/v FP8 GEMM with one scale
per output channel equals the three per-tensor GEMMs to bf16 rounding (what a fused FP8 layer would have
to do).
"""
from __future__ import annotations

import json
import subprocess
import sys

from support import comfy_host

BENCH = comfy_host.REPO_ROOT / "bench" / "bench_generation.py"


def test_tiny_gemm_fusion_times_every_case(tmp_path):
    out = tmp_path / "gemm.json"
    proc = subprocess.run([sys.executable, str(BENCH), "--gemm-fusion", "t2i", "--tiny", "--out", str(out)],
                          capture_output=True, text=True, timeout=600, cwd=comfy_host.REPO_ROOT)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    case = json.loads(out.read_text())["gemm_fusion"]["t2i"]
    assert case["m"] == 2 * 1 * 2 * 3  # both branches × 1 latent frame × (64/32) × ceil(96/32)
    for label in ("bf16_qkv_separate", "bf16_gate_up_fused", "fp8_qkv_separate", "fp8_gate_up_fused_rowwise",
                  "fp8_quantize_layer_inputs", "w8a8_forward_all", "w8a16_forward_all"):
        assert case[label]["ms"] > 0, label
    assert set(case["layer_ms"]) == {"bf16", "fp8_gemms_and_quantize", "w8a8_forward", "w8a16_forward"}
    assert "tflops" in case["bf16_down"] and "tflops" not in case["fp8_quantize_layer_inputs"]
    assert case["step_ms"]["bf16"] == round(36 * case["layer_ms"]["bf16"], 1)
    check = case["fp8_qkv_fused_rowwise_vs_separate"]
    # the outputs differ by bf16 rounding at most (2⁻⁸ relative at the largest value; 2⁻⁷ allows a value a
    # binade below it to round the other way): the two GEMMs multiply their scales in another order
    assert check["max_separate"] > 0 and check["max_abs"] <= 2 ** -7 * check["max_separate"], check

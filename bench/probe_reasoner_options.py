"""Probe: inductor options for the compiled, packed, graphed reasoner decode (batch 1) — tokens/s, compile warm-up
and the graphed logits' distance from the default options', per option set. One GPU run:

    python bench/probe_reasoner_options.py --families nano --out probe_reasoner_options.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_reasoner import EDGE, NANO, build, configure, max_abs, sync, teacher_forced_logits, timed_generate  # noqa: E402

OPTION_SETS = {
    "default": {},
    "coordinate_descent": {"coordinate_descent_tuning": True},
    "autotune_gemm": {"max_autotune_gemm": True, "max_autotune_gemm_backends": "TRITON,ATEN"},
    "autotune_gemm_cd": {"max_autotune_gemm": True, "max_autotune_gemm_backends": "TRITON,ATEN",
                         "coordinate_descent_tuning": True},
}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="probe_reasoner_options.json")
    p.add_argument("--families", default="nano")
    p.add_argument("--sets", default=",".join(OPTION_SETS))
    p.add_argument("--new-tokens", type=int, default=256)
    args = p.parse_args()
    from cosmos3_core.reasoner.reasoner import Cosmos3Reasoner, SamplingParams
    from cosmos3_core.testing.tiny_reasoner import build_tiny_reasoner_checkpoint
    from cosmos3_core.reasoner.vision import load_processor

    device, results = torch.device("cuda"), {"torch": torch.__version__}
    for family in args.families.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            processor = load_processor(build_tiny_reasoner_checkpoint(Path(tmp) / family, variant=family, seed=0))
        model = build(EDGE if family == "edge" else NANO, str(device))
        reasoner = Cosmos3Reasoner(model, processor, lm_head=model.lm_head, eos_token_ids=[])
        prepared = reasoner.prepare(" ".join(["describe the robot on the street"] * 66))
        configure(reasoner, "packed")
        reasoner.generate_ids(prepared, SamplingParams(max_new_tokens=8))
        rows, ref = results.setdefault(family, {}), None
        for name in args.sets.split(","):
            torch._dynamo.reset()
            reasoner.compile_decode(True, options=dict(OPTION_SETS[name]))
            sync(device)
            t0 = time.perf_counter()
            try:
                reasoner.generate_ids(prepared, SamplingParams(max_new_tokens=4))
            except Exception as exc:  # noqa: BLE001 — report the failing option set, go on with the others
                rows[name] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
                Path(args.out).write_text(json.dumps(results, indent=1))
                continue
            sync(device)
            row = {"compile_warmup_s": round(time.perf_counter() - t0, 1)}
            logits, fed = teacher_forced_logits(reasoner, prepared, ref[1] if ref else None, 4, "graph")
            ref = ref or (logits, fed)
            row["graph_logits_vs_default"] = max_abs(logits, ref[0])
            speed = [timed_generate(reasoner, prepared, args.new_tokens) for _ in range(2)]
            for s in speed:
                s.pop("ids", None)
            row["speed"] = speed
            rows[name] = row
            print(family, name, json.dumps(row), flush=True)
            Path(args.out).write_text(json.dumps(results, indent=1))
        reasoner.compile_decode(False)
        torch._dynamo.reset()
        del reasoner, model
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

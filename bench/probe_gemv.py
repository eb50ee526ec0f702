"""Batch-1 GEMV speed per weight shape of the reasoner's decode step: cuBLAS (``F.linear``) against the Triton kernel
of ``cosmos3_core/kernels/gemv.py`` over a grid of launch configurations, on one GPU.

Each shape is timed as the decode step runs it: ``--layers`` distinct random weights of that shape (one per text
layer, so nothing is served from L2), one GEMV each, back to back in one captured CUDA graph; bandwidth = weight
bytes ÷ replay time. ``max_rel`` = largest |y − y_fp64| ÷ max |y_fp64| per route (both accumulate in fp32).
``--profile-decode FAMILY`` also lists the kernels of one compiled decode step of a full-size random text tower
(torch.profiler, no CUDA graph), grouped by name, with calls per layer and time per token.

    python bench/probe_gemv.py --out bench/results_probe_gemv.json [--families nano,edge] [--profile-decode nano]
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# name: (N, K) of each decode GEMV (q/k/v and gate/up packed as packed.py does), layers
SHAPES = {
    "nano": ({"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288),
              "lm_head": (151936, 4096)}, 36),
    "edge": ({"qkv": (4096, 2048), "o": (2048, 2048), "up": (9216, 2048), "down": (2048, 9216),
              "lm_head": (131072, 2048)}, 28),
    "super": ({"qkv": (10240, 5120), "o": (5120, 8192), "gate_up": (51200, 5120), "down": (5120, 25600),
               "lm_head": (151936, 5120)}, 64),
}
CONFIGS = [dict(block_n=bn, block_k=bk, num_warps=w)
           for bn, bk, w in itertools.product((2, 4, 8, 16), (256, 512, 1024, 2048, 4096), (4, 8)) if bn * bk <= 16384]


def replay_ms(fns, reps: int = 20) -> float:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for f in fns:
            f()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for f in fns:
            f()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def probe_shape(n: int, k: int, layers: int) -> dict:
    from cosmos3_core.kernels import gemv as g

    kernel = g._kernel()
    weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(layers if n * k < 1e8 else 4)]
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    nbytes = sum(w.numel() * 2 for w in weights)
    exact = (x.double() @ weights[0].double().T).view(-1)
    scale = exact.abs().max().item()
    outs = [torch.empty(n, device="cuda", dtype=torch.bfloat16) for _ in weights]
    row = {"N": n, "K": k, "matrices": len(weights)}
    ms = replay_ms([cublas_call(x, w, o) for w, o in zip(weights, outs)])
    row["cublas"] = dict(ms=round(ms, 4), tb_s=round(nbytes / ms / 1e9, 3),
                         max_rel=float((F.linear(x, weights[0]).view(-1).double() - exact).abs().max() / scale))
    best = None
    for cfg in CONFIGS:
        def call(w, o, cfg=cfg):
            return lambda: kernel[(g.triton_grid(n, cfg["block_n"]),)](
                x, w, o, n, k, w.stride(0), BLOCK_N=cfg["block_n"], BLOCK_K=cfg["block_k"], num_warps=cfg["num_warps"])
        try:
            ms = replay_ms([call(w, o) for w, o in zip(weights, outs)])
        except Exception as exc:  # noqa: BLE001 — a config that does not compile is reported, not fatal
            row.setdefault("failed", []).append(f"{cfg}: {type(exc).__name__}")
            continue
        rel = float((outs[0].double() - exact).abs().max() / scale)
        entry = dict(cfg, ms=round(ms, 4), tb_s=round(nbytes / ms / 1e9, 3), max_rel=rel)
        row.setdefault("triton", []).append(entry)
        if best is None or ms < best["ms"]:
            best = entry
    row["best"] = best
    default = dict(zip(("block_n", "block_k", "num_warps"), g.launch_config(n, k)))
    row["default"] = next((e for e in row.get("triton", []) if all(e[key] == v for key, v in default.items())), default)
    return row


def cublas_call(x, w, o):
    return lambda: torch.matmul(x, w.T, out=o.view(1, -1))


def profile_decode(family: str, tokens: int = 8) -> dict:
    """Kernels of the compiled, packed decode step (no CUDA graph) per name: calls per layer, µs per token."""
    import tempfile

    from bench_generation import NANO
    from bench_reasoner import EDGE, build
    from cosmos3_core.reasoner.reasoner import Cosmos3Reasoner, SamplingParams
    from cosmos3_core.testing.tiny_reasoner import build_tiny_reasoner_checkpoint
    from cosmos3_core.reasoner.vision import load_processor

    with tempfile.TemporaryDirectory() as tmp:
        processor = load_processor(build_tiny_reasoner_checkpoint(Path(tmp) / family, variant=family, seed=0))
    model = build(NANO if family == "nano" else EDGE, "cuda")
    reasoner = Cosmos3Reasoner(model, processor, lm_head=model.lm_head, eos_token_ids=[])
    prepared = reasoner.prepare(" ".join(["describe the robot on the street"] * 66))
    reasoner.compile_decode(True)
    reasoner.cuda_graphs = False
    reasoner.generate_ids(prepared, SamplingParams(max_new_tokens=6))  # compile + warm
    torch.cuda.synchronize()
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        reasoner.generate_ids(prepared, SamplingParams(max_new_tokens=tokens + 1))
        torch.cuda.synchronize()
    layers = len(model.layers)
    rows = []
    for ev in prof.key_averages():
        if ev.device_type.name != "CUDA" or ev.count == 0:
            continue
        rows.append(dict(name=ev.key[:120], calls_per_token=round(ev.count / tokens, 2),
                         calls_per_layer=round(ev.count / tokens / layers, 2),
                         us_per_token=round(ev.device_time_total / tokens, 1),
                         us_per_call=round(ev.device_time_total / max(ev.count, 1), 2)))
    rows.sort(key=lambda r: -r["us_per_token"])
    del reasoner, model
    torch.cuda.empty_cache()
    return dict(family=family, tokens=tokens, note="includes the prefill of the profiled generation", kernels=rows[:40],
                kernels_per_token=round(sum(r["calls_per_token"] for r in rows), 1),
                us_per_token=round(sum(r["us_per_token"] for r in rows), 1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--families", default="nano,edge,super")
    ap.add_argument("--profile-decode", default="")
    args = ap.parse_args()
    torch.manual_seed(0)
    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    import triton

    results["triton"] = triton.__version__
    for family in args.families.split(","):
        shapes, layers = SHAPES[family]
        results[family] = {}
        for name, (n, k) in shapes.items():
            row = probe_shape(n, k, layers)
            results[family][name] = row
            top = sorted(row.get("triton", []), key=lambda e: e["ms"])[:4]
            print(f"{family} {name} {n}x{k}: cublas {row['cublas']['tb_s']} TB/s; default {row['default']}; top "
                  + "; ".join(f"{e['block_n']}/{e['block_k']}/{e['num_warps']} {e['tb_s']}" for e in top), flush=True)
            torch.cuda.empty_cache()
    Path(args.out).write_text(json.dumps(results, indent=1))
    if args.profile_decode:
        results["profile"] = profile_decode(args.profile_decode)
        for r in results["profile"]["kernels"][:25]:
            print(r, flush=True)
    Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

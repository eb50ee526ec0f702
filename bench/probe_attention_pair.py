"""The guidance pair's generation attention at one step's shapes: two calls (one per branch, as the step runs now)
against one FlashAttention-4 varlen call over both branches (queries and keys of the two branches packed one after
the other, ``cu_seqlens`` marking them). Nano geometry (32 query / 8 K/V heads, head_dim 128), bf16, random inputs.

Per shape and route: ms per pair back to back (host included: what the step pays when the host does not run
ahead) and replayed from one CUDA graph (GPU time only), TFLOP/s, and the largest difference from SDPA.

    python3 bench/probe_attention_pair.py --out bench/results_probe_attention_pair.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# generation queries of one branch, text keys of (cond, uncond): the end-to-end runs' templates (run 13)
SHAPES = {"t2i": (920, (1532, 61)), "256p": (2880 + 197, (1546, 77)), "480p": (9360 + 97, (1546, 77))}
H, KV, HD = 32, 8, 128


def events_ms(fn, iters: int = 50) -> float:
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def graph_ms(fn, iters: int = 50) -> float:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return events_ms(graph.replay, iters)


def main() -> None:
    from cosmos3_core.caches import enable_persistent_caches

    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--shapes", default="t2i,256p,480p")
    args = p.parse_args()
    enable_persistent_caches()
    from flash_attn.cute import flash_attn_func, flash_attn_varlen_func

    g = torch.Generator("cuda").manual_seed(0)
    results = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, shapes={})
    for name in args.shapes.split(","):
        n, texts = SHAPES[name]
        q = [torch.randn(1, n, H, HD, device="cuda", dtype=torch.bfloat16, generator=g) for _ in texts]
        k = [torch.randn(1, t + n, KV, HD, device="cuda", dtype=torch.bfloat16, generator=g) for t in texts]
        v = [torch.randn(1, t + n, KV, HD, device="cuda", dtype=torch.bfloat16, generator=g) for t in texts]
        qp, kp, vp = torch.cat(q, 1)[0], torch.cat(k, 1)[0], torch.cat(v, 1)[0]  # packed: [total, heads, hd]
        cu_q = torch.tensor([0, n, 2 * n], dtype=torch.int32, device="cuda")
        cu_k = torch.tensor([0, texts[0] + n, sum(texts) + 2 * n], dtype=torch.int32, device="cuda")
        max_k = max(texts) + n

        def sdpa():
            return torch.cat([F.scaled_dot_product_attention(a.transpose(1, 2), b.transpose(1, 2), c.transpose(1, 2),
                                                             enable_gqa=True).transpose(1, 2)
                              for a, b, c in zip(q, k, v)], 1)[0]

        def flash4_two():
            return torch.cat([flash_attn_func(a, b, c)[0] for a, b, c in zip(q, k, v)], 1)[0]

        def flash4_varlen():
            return flash_attn_varlen_func(qp, kp, vp, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=n,
                                          max_seqlen_k=max_k)[0]

        reference = sdpa().float()
        flops = sum(4 * H * HD * n * (t + n) for t in texts)
        row = {}
        for label, fn in (("sdpa_two_calls", sdpa), ("flash4_two_calls", flash4_two),
                          ("flash4_varlen_one_call", flash4_varlen)):
            eager, replay = events_ms(fn), graph_ms(fn)
            row[label] = dict(ms=round(eager, 4), graph_ms=round(replay, 4),
                              tflops_graph=round(flops / replay / 1e9, 1),
                              max_abs_diff_vs_sdpa=float(f"{(fn().float() - reference).abs().max().item():.2e}"))
        results["shapes"][name] = row
        print(name, row, flush=True)
    Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

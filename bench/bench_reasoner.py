"""Reasoner decode speed at batch 1 on full-size, random-weight Edge and Nano: eager vs compiled ``decode_step``.

The text tower + ``lm_head`` at real sizes with random bf16 weights; the prompt is rendered by a tiny checkpoint's
processor (token ids only matter for their count). Greedy decoding with no stop token, so every run produces
exactly ``--new-tokens`` tokens; tokens/s counts decode only (prefill timed apart). "cuda_graph" is the default
on CUDA (each decode step replays one captured graph, step_graph.GraphedCall); "eager" has it off. "compiled" wraps
``decode_step`` in ``torch.compile(mode="reduce-overhead")`` (CUDA graphs where torch accepts them).

    python bench/bench_reasoner.py --out reasoner.json [--families edge,nano] [--new-tokens 256]
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_generation import NANO, random_bf16_weights, sync  # noqa: E402

EDGE = dict(hidden_size=2048, intermediate_size=9216, num_hidden_layers=28, num_attention_heads=16,
            num_key_value_heads=8, head_dim=128, vocab_size=131072, hidden_act="relu2", qk_norm_for_text=False,
            use_und_k_norm_for_gen=True, rms_norm_eps=1e-5, rope_theta=1e8, rope_axes_dim=[24, 20, 20],
            action_gen=True, action_dim=64)


COMPILED = False


def build(values: dict, device: str):
    from cosmos3_core.config import Cosmos3Config
    from cosmos3_core.transformer import Cosmos3Transformer

    with torch.device("meta"):
        model = Cosmos3Transformer(Cosmos3Config.from_dict(values))
    return random_bf16_weights(model, device)


def run(reasoner, prepared, params) -> tuple[float, float, int]:
    sync()
    t0 = time.perf_counter()
    reasoner.prefill(prepared, cache_len=prepared.length + params.max_new_tokens)
    sync()
    prefill_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    ids, _ = reasoner.generate_ids(prepared, params)
    sync()
    total = time.perf_counter() - t0
    return prefill_s, total - prefill_s, len(ids)  # generate_ids re-runs the prefill; subtract it


def main() -> None:
    from cosmos3_core.reasoner import Cosmos3Reasoner, SamplingParams
    from cosmos3_core.tiny_reasoner import build_tiny_reasoner_checkpoint
    from cosmos3_core.vision import load_processor

    p = argparse.ArgumentParser()
    p.add_argument("--out", default="reasoner.json")
    p.add_argument("--families", default="edge,nano")
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--prompt-words", type=int, default=400)
    p.add_argument("--device", default="cuda")
    p.add_argument("--compiled", action="store_true", help="also time torch.compile(mode='reduce-overhead')")
    args = p.parse_args()
    global COMPILED
    COMPILED = args.compiled
    results = {"gpu": torch.cuda.get_device_name() if args.device == "cuda" else "cpu", "torch": torch.__version__, "new_tokens": args.new_tokens}
    for family in filter(None, args.families.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            files = build_tiny_reasoner_checkpoint(Path(tmp) / family, variant=family, seed=0)
            processor = load_processor(files)
        model = build(EDGE if family == "edge" else NANO, args.device)
        reasoner = Cosmos3Reasoner(model, processor, lm_head=model.lm_head, eos_token_ids=[])
        prepared = reasoner.prepare(" ".join(["describe the robot on the street"] * (args.prompt_words // 6)))
        params = SamplingParams(max_new_tokens=args.new_tokens, temperature=0.0)
        reasoner.cuda_graphs = False
        run(reasoner, prepared, SamplingParams(max_new_tokens=8, temperature=0.0))  # warm-up
        prefill_s, decode_s, n = run(reasoner, prepared, params)
        row = dict(prompt_tokens=prepared.length, prefill_s=round(prefill_s, 3),
                   eager_tokens_per_s=round(n / decode_s, 1))
        reasoner.cuda_graphs = True  # the default on CUDA: one captured graph per decode step
        t0 = time.perf_counter()
        ids_graph, _ = reasoner.generate_ids(prepared, SamplingParams(max_new_tokens=32, temperature=0.0))
        row["graph_call_32_tokens_incl_capture_s"] = round(time.perf_counter() - t0, 2)
        _, decode_s, n = run(reasoner, prepared, params)
        row["cuda_graph_tokens_per_s"] = round(n / decode_s, 1)
        reasoner.cuda_graphs = False
        row["graph_ids_equal_eager"] = ids_graph == reasoner.generate_ids(
            prepared, SamplingParams(max_new_tokens=32, temperature=0.0))[0]
        if not COMPILED:
            results[family] = row
            print(family, row, flush=True)
            Path(args.out).write_text(json.dumps(results, indent=1))
            del reasoner, model
            gc.collect()
            torch.cuda.empty_cache()
            continue
        try:
            eager_step = reasoner.decode_step
            reasoner.decode_step = torch.compile(eager_step, mode="reduce-overhead", fullgraph=True)
            t0 = time.perf_counter()
            run(reasoner, prepared, SamplingParams(max_new_tokens=16, temperature=0.0))
            row["compile_warmup_s"] = round(time.perf_counter() - t0, 1)
            _, decode_s, n = run(reasoner, prepared, params)
            row["compiled_tokens_per_s"] = round(n / decode_s, 1)
        except Exception as exc:  # noqa: BLE001 — report, do not hide, a compile failure
            row["compiled_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        results[family] = row
        print(family, row, flush=True)
        Path(args.out).write_text(json.dumps(results, indent=1))
        del reasoner, model
        gc.collect()
        torch.cuda.empty_cache()
        torch._dynamo.reset()


if __name__ == "__main__":
    main()

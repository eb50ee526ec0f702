"""Reasoner decode speed at batch 1 on full-size, random-weight Edge and Nano, per decode variant, in one GPU run.

The text tower + ``lm_head`` at real sizes with random bf16 weights; the prompt is rendered by a tiny checkpoint's
processor (token ids only matter for their count). Greedy decoding with no stop token, so every run produces
exactly ``--new-tokens`` tokens. A variant is a ``RuntimeOptions`` (attention route, compiled decode layer, GEMV
route) passed to ``generate_ids(..., options=)`` plus the reasoner's two decode-step settings
(``graph_sampling``, ``pack_projections``). Every variant runs with the CUDA graph on (``RuntimeOptions.cuda_graphs``,
the default: each decode step replays one captured graph, kernels/cuda_graph.GraphedCall):

    current                 the decode step before issue 12's levers: attention "sdpa" (masked SDPA over the cache
                            with the K/V heads expanded), the greedy pick outside the graph, GEMV route "torch"
    gqa                     + attention "auto": attention.py's decode route (grouped heads, transformers' eager
                            arithmetic)
    gqa_sampling            + the greedy pick and cursor advance inside the graph (the default)
    gqa_compiled            gqa + ``compile=True`` (the torch.compile'd decode layer, one graph for every layer),
                            pick outside
    gqa_compiled_sampling   gqa_compiled with the pick inside the step
    packed                  gqa_sampling + q/k/v and gate/up each read as one packed matrix (packed.py), cuBLAS
    packed_compiled         packed + ``compile=True``
    gemv                    packed, every projection and ``lm_head`` through the Triton GEMV (``gemv="auto"``,
                            gemv.py): the default ``RuntimeOptions()`` — BENCHMARKS.md's "default" column
    gemv_compiled           everything: ``RuntimeOptions(compile=True)`` — the "``compile`` on" column

Per variant: ``tokens_per_s`` (decode only, prefill subtracted, the graph capture included: the earlier runs'
measure), ``steady_tokens_per_s`` (tokens 32 → end, timed at the loop's host syncs, capture excluded) and token
agreement with ``current`` (``agree_prefix``: leading tokens equal; ``agree_frac``). ``compile_warmup_s``: the first
4-token generation with ``compile=True`` (compiles, then captures). ``compiled_graphs``: graphs dynamo traced
(2 = one per projection layout, split and packed, each shared by every layer and step: no recompiles).

``logits`` (per route: current / gqa / packed / gemv / compiled / packed_compiled / gemv_compiled): teacher-forced decode of ``--diff-steps`` tokens (the greedy
tokens of ``current`` eager), logits max |diff| per step of — ``eager_repeat`` (eager run twice: determinism),
``side_stream`` (eager on a non-default stream, as GraphedCall's warm-up), ``graph`` (GraphedCall: step 0 is its
warm-up, later steps are replays) — each against the same route's eager run, and ``vs_current_eager`` (the route
change itself); ``top1_equal_graph`` per step; ``top2_margin`` of current eager (how near-tied random weights are).
``capture_warnings``: CUDA-graph captures that failed (the step then ran uncaptured; should be empty).

    python bench/bench_reasoner.py --out bench/results/reasoner.json [--families edge,nano] [--new-tokens 256]
    python bench/bench_reasoner.py --tiny --out /tmp/reasoner_tiny.json     # CPU, tiny checkpoint: checks the script
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import NANO, random_bf16_weights  # noqa: E402

EDGE = dict(hidden_size=2048, intermediate_size=9216, num_hidden_layers=28, num_attention_heads=16,
            num_key_value_heads=8, head_dim=128, vocab_size=131072, hidden_act="relu2", qk_norm_for_text=False,
            use_und_k_norm_for_gen=True, rms_norm_eps=1e-5, rope_theta=1e8, rope_axes_dim=[24, 20, 20],
            action_gen=True, action_dim=64)
# name: (attention backend, compiled layer, greedy pick inside the step, packed projections, GEMV route)
VARIANTS = {"current": ("sdpa", False, False, False, "torch"), "gqa": ("auto", False, False, False, "torch"),
            "gqa_sampling": ("auto", False, True, False, "torch"), "gqa_compiled": ("auto", True, False, False, "torch"),
            "gqa_compiled_sampling": ("auto", True, True, False, "torch"),
            "packed": ("auto", False, True, True, "torch"), "packed_compiled": ("auto", True, True, True, "torch"),
            "gemv": ("auto", False, True, True, "auto"), "gemv_compiled": ("auto", True, True, True, "auto")}
STEADY_FROM = 32


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def build(values: dict, device: str):
    from cosmos3_core.config import Cosmos3Config
    from cosmos3_core.model.transformer import Cosmos3Transformer

    with torch.device("meta"):
        model = Cosmos3Transformer(Cosmos3Config.from_dict(values))
    return random_bf16_weights(model, device)


def configure(reasoner, variant: str):
    """Set the reasoner's decode-step settings of ``variant``; returns its ``RuntimeOptions``."""
    from cosmos3_core.runtime import RuntimeOptions

    backend, compiled, in_step, packed, gemv_route = VARIANTS[variant]
    reasoner.graph_sampling = in_step
    reasoner.pack_projections = packed
    return RuntimeOptions(attention=backend, compile=compiled, gemv=gemv_route)


def timed_generate(reasoner, prepared, new_tokens: int, options) -> dict:
    """Decode tokens/s with and without the first ``STEADY_FROM`` tokens (which hold the graph capture)."""
    from cosmos3_core.reasoner.reasoner import SamplingParams

    device = reasoner.device
    params = SamplingParams(max_new_tokens=new_tokens)
    sync(device)
    t0 = time.perf_counter()
    reasoner.prefill(prepared, cache_len=prepared.length + new_tokens, options=options)
    sync(device)
    prefill_s = time.perf_counter() - t0
    marks = {}
    t0 = time.perf_counter()
    ids, _ = reasoner.generate_ids(prepared, params, options=options,
                                   callback=lambda done, total: marks.setdefault(done, time.perf_counter()))
    sync(device)
    decode_s = time.perf_counter() - t0 - prefill_s  # generate_ids runs the prefill again; subtract it
    row = dict(tokens_per_s=round(len(ids) / decode_s, 1), prefill_s=round(prefill_s, 4))
    if STEADY_FROM in marks and new_tokens in marks and new_tokens > STEADY_FROM:
        row["steady_tokens_per_s"] = round((new_tokens - STEADY_FROM) / (marks[new_tokens] - marks[STEADY_FROM]), 1)
    return row | {"ids": ids}


@torch.no_grad()
def teacher_forced_logits(reasoner, prepared, tokens: list[int] | None, steps: int, mode: str,
                          options) -> tuple[list, list]:
    """Logits of ``steps`` decode steps fed ``tokens`` (None: this run's own greedy tokens) with ``options``;
    ``mode`` is ``eager``, ``side_stream`` or ``graph``. Returns (logits per step on the CPU, tokens fed)."""
    from cosmos3_core.kernels.cuda_graph import GraphedCall
    from cosmos3_core.reasoner.reasoner import decode_weights

    device = reasoner.device
    first = reasoner.prefill(prepared, cache_len=prepared.length + steps + 1, options=options)
    cache_index = torch.tensor(prepared.length, device=device)
    rope_position = torch.tensor(prepared.next_position, device=device)
    packed = decode_weights(reasoner.transformer, options.gemv) if reasoner.pack_projections else None

    def decode(token, index, position):
        return reasoner.decode_step(token, index, position, packed, options)

    step = GraphedCall(decode) if mode == "graph" else decode
    side = torch.cuda.Stream() if mode == "side_stream" else None
    fed = [int(first.argmax())] if tokens is None else tokens
    out = []
    for i in range(steps):
        token = torch.tensor([fed[i]], device=device)
        if side is not None:
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                logits = step(token, cache_index, rope_position)
            torch.cuda.current_stream().wait_stream(side)
        else:
            logits = step(token, cache_index, rope_position)
        out.append(logits.float().cpu())
        if tokens is None:
            fed.append(int(logits.argmax()))
        cache_index, rope_position = cache_index + 1, rope_position + 1
    return out, fed


def max_abs(a: list, b: list) -> list[float]:
    return [float((x - y).abs().max()) for x, y in zip(a, b)]


def logits_report(reasoner, prepared, steps: int, reference: dict | None, options) -> dict:
    """Eager vs eager-again / side stream / graph for the route ``options`` (and the reasoner's decode-step settings
    configured now) name (see the module docstring)."""
    eager, fed = teacher_forced_logits(reasoner, prepared, reference["fed"] if reference else None, steps, "eager",
                                       options)
    row = {"eager_repeat": max_abs(teacher_forced_logits(reasoner, prepared, fed, steps, "eager", options)[0], eager)}
    if reasoner.device.type == "cuda":
        side = teacher_forced_logits(reasoner, prepared, fed, steps, "side_stream", options)[0]
        graph = teacher_forced_logits(reasoner, prepared, fed, steps, "graph", options)[0]
        row |= {"side_stream": max_abs(side, eager), "graph": max_abs(graph, eager),
                "top1_equal_graph": [int(g.argmax()) == int(e.argmax()) for g, e in zip(graph, eager)]}
    if reference is None:
        top2 = [e.topk(2).values for e in eager]
        row |= {"top2_margin": [round(float(t[0] - t[1]), 4) for t in top2],
                "logit_max_abs": round(max(float(e.abs().max()) for e in eager), 3)}
    else:
        row["vs_current_eager"] = max_abs(eager, reference["eager"])
    row = {k: [round(x, 5) if isinstance(x, float) else x for x in v] if isinstance(v, list) else v
           for k, v in row.items()}
    return row, {"eager": eager, "fed": fed}


def agreement(ids: list[int], ref: list[int]) -> dict:
    prefix = next((i for i, (a, b) in enumerate(zip(ids, ref)) if a != b), min(len(ids), len(ref)))
    return dict(agree_prefix=prefix, agree_frac=round(sum(a == b for a, b in zip(ids, ref)) / max(len(ref), 1), 3))


def bench_family(family: str, args, device: torch.device) -> dict:
    from torch._dynamo.utils import counters

    from cosmos3_core.reasoner.reasoner import Cosmos3Reasoner, SamplingParams
    from cosmos3_core.reasoner.vision import load_processor
    from cosmos3_core.testing.tiny_reasoner import build_tiny_reasoner_checkpoint

    t_build = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        root = build_tiny_reasoner_checkpoint(Path(tmp) / family, variant=family, seed=0)
        if args.tiny:
            reasoner = Cosmos3Reasoner.load(root, dtype=torch.bfloat16, device=device)
            reasoner.eos_token_ids = []
        else:
            processor = load_processor(root)
            model = build(EDGE if family == "edge" else NANO, str(device))
            reasoner = Cosmos3Reasoner(model, processor, lm_head=model.lm_head, eos_token_ids=[])
    prepared = reasoner.prepare(" ".join(["describe the robot on the street"] * (args.prompt_words // 6)))
    row = dict(prompt_tokens=prepared.length, build_s=round(time.perf_counter() - t_build, 1))
    options = configure(reasoner, "current")
    reasoner.generate_ids(prepared, SamplingParams(max_new_tokens=8), options=options)  # warm-up (cuBLAS, allocator)

    logits, reference = {}, None
    for route in ("current", "gqa", "packed", "gemv"):
        options = configure(reasoner, route)
        logits[route], found = logits_report(reasoner, prepared, args.diff_steps, reference, options)
        reference = reference or found
    speed = {}
    for variant in ("current", "gqa", "gqa_sampling", "packed", "gemv"):
        options = configure(reasoner, variant)
        speed[variant] = timed_generate(reasoner, prepared, args.new_tokens, options)

    if not args.skip_compile:
        torch._dynamo.reset()
        graphs = counters["stats"]["unique_graphs"]
        try:
            options = configure(reasoner, "gqa_compiled")
            sync(device)
            t0 = time.perf_counter()
            reasoner.generate_ids(prepared, SamplingParams(max_new_tokens=4), options=options)
            sync(device)
            row["compile_warmup_s"] = round(time.perf_counter() - t0, 1)
            for label, variant in (("compiled", "gqa_compiled"), ("packed_compiled", "packed_compiled"),
                                   ("gemv_compiled", "gemv_compiled")):
                options = configure(reasoner, variant)
                logits[label], _ = logits_report(reasoner, prepared, args.diff_steps, reference, options)
            for variant in ("gqa_compiled", "gqa_compiled_sampling", "packed_compiled", "gemv_compiled"):
                options = configure(reasoner, variant)
                speed[variant] = timed_generate(reasoner, prepared, args.new_tokens, options)
        except Exception as exc:  # noqa: BLE001 — report, do not hide, a compile failure
            row["compiled_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
        row["compiled_graphs"] = counters["stats"]["unique_graphs"] - graphs

    ref_ids = speed["current"]["ids"]
    for s in speed.values():
        s |= agreement(s.pop("ids"), ref_ids)
    row |= {"variants": speed, "logits": logits}
    return row


def main() -> None:
    global STEADY_FROM
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True, help="results JSON")
    p.add_argument("--families", default="edge,nano")
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--prompt-words", type=int, default=400)
    p.add_argument("--diff-steps", type=int, default=4, help="teacher-forced steps of the logits comparison")
    p.add_argument("--skip-compile", action="store_true", help="leave out the compiled variants")
    p.add_argument("--tiny", action="store_true", help="tiny random checkpoint on the CPU (checks the script)")
    args = p.parse_args()
    if args.tiny:
        device = torch.device("cpu")
        args.new_tokens, args.prompt_words, STEADY_FROM = min(args.new_tokens, 24), min(args.prompt_words, 60), 8
    elif not torch.cuda.is_available():
        sys.exit("bench_reasoner.py: full size needs a CUDA device; use --tiny to check the script on the CPU.")
    else:
        device = torch.device("cuda")
    warnings = []  # a failed CUDA-graph capture runs the step uncaptured (kernels/cuda_graph.GraphedCall): say so

    class Collect(logging.Handler):
        def emit(self, record):
            warnings.append(record.getMessage()[:300])

    logging.getLogger("cosmos3_core.kernels.cuda_graph").addHandler(Collect(logging.WARNING))
    t_start = time.perf_counter()
    results = {"gpu": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "torch": torch.__version__,
               "weights": "tiny random (script check)" if args.tiny else "full-size random bf16",
               "new_tokens": args.new_tokens,
               "bf16_reduced_precision_reduction": torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction}
    for family in filter(None, args.families.split(",")):
        results[family] = bench_family(family, args, device)
        print(family, json.dumps(results[family]), flush=True)
        results["total_s"] = round(time.perf_counter() - t_start, 1)
        results["capture_warnings"] = warnings
        Path(args.out).write_text(json.dumps(results, indent=1))
        torch._dynamo.reset()  # drops the compiled layer's references to this family's model
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

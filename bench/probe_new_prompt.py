"""What a *new* prompt costs on the H200: the text prefill and the first guided T2I step at prompt lengths this
process has not seen, against the same calls repeated, per SDPA backend.

cuDNN attention (SDPA's default dispatch on Hopper) builds an execution plan per new shape; a prompt of a new length
is a new shape for the prefill's causal attention and for every generation step's keys ``[text | generation]``.
Full-size random bf16 Nano (our transformer only), pairs of (cond, uncond) lengths never used before in the process.

    python bench/probe_new_prompt.py --out bench/results_probe_new_prompt.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_generation import RESOLUTIONS, build_ours  # noqa: E402

BACKENDS = {"default": None, "flash": [SDPBackend.FLASH_ATTENTION]}  # efficient attention has no GQA


def wall(fn) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    from cosmos3_core.model.layout import build_layout

    model = build_ours("cuda")
    g = torch.Generator().manual_seed(1)
    ids = lambda n: torch.randint(0, 151000, (n,), generator=g).tolist()  # noqa: E731
    model.prefill_many([ids(1000), ids(50)])  # process warm-up (cuBLAS, allocator) at unrelated lengths
    res: dict = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, prefill={}, t2i_step={})
    length = 1400
    for name, backends in BACKENDS.items():
        rows = []
        for _ in range(3):
            length += 7
            pair = [ids(length), ids(60 + length % 13)]
            ctx = sdpa_kernel(backends) if backends else contextlib.nullcontext()
            with ctx:
                prefill = lambda pair=pair: model.prefill_many(pair)  # noqa: E731
                new, again = wall(prefill), wall(prefill)
            rows.append(dict(lengths=[len(p) for p in pair], new_s=round(new, 4), repeated_s=round(again, 4)))
        res["prefill"][name] = rows
        print("prefill", name, rows, flush=True)
    h, w, frames = RESOLUTIONS["t2i"]
    shape = (1, 48, 1, h // 16, w // 16)
    latents = torch.randn(shape, generator=g).to("cuda")
    t = torch.tensor(900, device="cuda")
    model.compile_generation_layers(True)
    for name in ("default", "flash"):
        backends = BACKENDS[name]
        rows = []
        for _ in range(4):
            length += 7
            kvs = model.prefill_many([ids(length), ids(61)])
            layout = build_layout(model.config, [kv.length for kv in kvs], shape[2:], 24.0, device="cuda",
                                  dtype=torch.bfloat16)
            ctx = sdpa_kernel(backends) if backends else contextlib.nullcontext()
            with ctx:
                step = lambda kvs=kvs, layout=layout: model.denoise_step(latents, t, kvs, layout)  # noqa: E731
                new, again = wall(step), wall(step)
            rows.append(dict(cond_length=length, first_step_s=round(new, 4), repeated_step_s=round(again, 4)))
        res["t2i_step"][name] = rows
        print("t2i step", name, rows, flush=True)
        torch._dynamo.reset()
        model.compile_generation_layers(False)
        model._compiled_fn = None
        model.compile_generation_layers(True)
    Path(args.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()

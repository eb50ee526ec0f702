"""What a run costs the first time, over the same run warm: the CLI's path in fresh processes on one compile cache.

Each process builds full-size random bf16 Nano (bench_generation.build_ours), the full-size Wan2.2 VAE and sound
decoder, then per shape runs what ``Cosmos3Pipeline.generate(compile=True)`` runs — prefill of a 1,500-token prompt
pair, 35 compiled guided steps, compiled VAE decode, audio decode — twice. "first-run overhead" = first wall time −
second; both towers stay resident (no text-tower move). For sampling (``sample``: what ``generate(decode=False)`` runs)
and the VAE decode (``decode``) apart, each run records its seconds, the graphs Dynamo traced, the inductor cache hits / misses and where the compile
time went (``torch._dynamo.utils.compilation_time_metrics``, phases ≥ 0.1 s). Processes run one after another on one
new, empty ``COSMOS3_CACHE_DIR``: process 1 is a machine's first run, the next ones a restart (e.g. of ComfyUI).

    python3 bench/bench_first_run.py --shapes 256p,480p --processes 2 --out bench/results_first_run.json
    python3 bench/bench_first_run.py --tiny --shapes 256p --processes 2 --out /tmp/first_run_tiny.json  # CPU check

``--profile-first`` runs each process's first sampling under ``torch.profiler`` and records the 25 ops / CUDA runtime
calls with the most host time (``first_sample_profile``): which first use the time outside compilation goes to. The
profiler slows that run, so its seconds are not the overhead to report.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_generation import (LONG_PROMPT, RESOLUTIONS, TINY_RESOLUTIONS, _compile_stats, build_ours,  # noqa: E402
                              fresh_processes, make_components, sync)


def _delta(before: dict, after: dict) -> dict:
    return dict(graphs=after["graphs"] - before["graphs"],
                fxgraph_cache_hit=after["fxgraph_cache_hit"] - before["fxgraph_cache_hit"],
                fxgraph_cache_miss=after["fxgraph_cache_miss"] - before["fxgraph_cache_miss"],
                compile_phases_s={k: round(v - before["phases"].get(k, 0.0), 2) for k, v in after["phases"].items()
                                  if v - before["phases"].get(k, 0.0) >= 0.1})


def _timed_stage(fn):
    before = _compile_stats()
    sync()
    start = time.perf_counter()
    out = fn()
    sync()
    return out, dict(s=round(time.perf_counter() - start, 2), **_delta(before, _compile_stats()))


def _profiled(fn, device: str):
    """``fn()`` under torch.profiler; returns its result and the 25 ops / runtime calls with the most self CPU time
    (where the host spent the run, compilation included)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as prof:
        out = fn()
    rows = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:25]
    return out, [dict(name=e.key, self_cpu_s=round(e.self_cpu_time_total / 1e6, 3), calls=e.count) for e in rows]


def child(shapes: list[str], tiny: bool, out: str, profile_first: bool = False) -> None:
    from cosmos3_core.audio import Cosmos3SoundDecoder
    from cosmos3_core.pipeline import Cosmos3Pipeline, GenerationRequest
    from cosmos3_core.vae import Cosmos3VAE

    t0 = time.perf_counter()
    device = "cpu" if tiny else "cuda"
    tmp = Path(tempfile.mkdtemp(prefix="cosmos3-first-run-"))
    if tiny:
        from cosmos3_core.tiny import build_tiny_checkpoint

        pipe = Cosmos3Pipeline.load(build_tiny_checkpoint(tmp, variant="nano", sound=True, seed=0))
    else:
        files, vae, audio, tokenizer = make_components(device, tmp)
        pipe = Cosmos3Pipeline(files, build_ours(device), Cosmos3VAE(vae), tokenizer, Cosmos3SoundDecoder(audio))
    sync()
    res = dict(setup_s=round(time.perf_counter() - t0, 1), torch=torch.__version__,
               device=torch.cuda.get_device_name() if device == "cuda" else device,
               cache=os.environ.get("COSMOS3_CACHE_DIR"), shapes={})
    for name in shapes:
        h, w, frames = (TINY_RESOLUTIONS if tiny else RESOLUTIONS)[name]
        request = GenerationRequest(prompt=LONG_PROMPT, num_frames=frames, height=h, width=w, steps=35, guidance=6.0,
                                    seed=0, sound=frames > 1, compile=True)
        runs = []
        for k in range(2):  # generate(): sample (prefill, plan, run), then decode as it does with compile on
            start = time.perf_counter()
            if profile_first and k == 0 and not res["shapes"]:  # the process's first sampling, under the profiler
                (sampled, res["first_sample_profile"]), sample = _timed_stage(
                    lambda: _profiled(lambda: pipe.generate(request, decode=False), device))
            else:
                sampled, sample = _timed_stage(lambda: pipe.generate(request, decode=False))
            _, decode = _timed_stage(lambda: pipe.decode_video(sampled.latents, compile=True))
            if sampled.sound_latent is not None:
                pipe.decode_sound(sampled.sound_latent, frames, request.fps)
            sync()
            runs.append(dict(wall_s=round(time.perf_counter() - start, 2),
                             **{k: round(v, 2) for k, v in sampled.timings.items()}, sample=sample, decode=decode))
        res["shapes"][name] = dict(first=runs[0], second=runs[1],
                                   first_run_overhead_s=round(runs[0]["wall_s"] - runs[1]["wall_s"], 2))
        print("first run", name, res["shapes"][name], flush=True)
    Path(out).write_text(json.dumps(res, indent=1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="256p,480p")
    p.add_argument("--processes", type=int, default=2, help="fresh processes, one after another, on one new cache")
    p.add_argument("--out", required=True)
    p.add_argument("--tiny", action="store_true", help="on the CPU with a tiny model (a check that it runs)")
    p.add_argument("--profile-first", action="store_true",
                   help="run each process's first sampling under torch.profiler and record where its host time went "
                        "(attribution only: the profiler slows that run)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args.shapes.split(","), args.tiny, args.out, args.profile_first)
        return
    results = dict(date=datetime.date.today().isoformat(), shapes=args.shapes.split(","), tiny=args.tiny,
                   processes=[])
    flags = ["--tiny"] * args.tiny + ["--profile-first"] * args.profile_first
    fresh_processes([__file__, "--child", "--shapes", args.shapes, *flags], args.processes, results, args.out)
    for i, run in enumerate(results["processes"], 1):
        for name, r in run["shapes"].items():
            print(f"process {i} {name}: first {r['first']['wall_s']} s (sample {r['first']['sample']['s']}, decode "
                  f"{r['first']['decode']['s']}), second {r['second']['wall_s']} s, overhead "
                  f"{r['first_run_overhead_s']} s", flush=True)


if __name__ == "__main__":
    main()

"""What a run costs the first time, over the same run warm: the CLI's path in fresh processes on one compile cache.

Each process builds full-size random bf16 Nano (common.build_ours), the full-size Wan2.2 VAE and sound
decoder, then per shape runs what the CLI's ``generate --compile`` runs — ``modes.dispatch.generate`` of a
``Request`` with ``RuntimeOptions(compile=True)``: prefill of a 1,500-token prompt pair, 35 compiled guided steps,
then the compiled VAE decode and the audio decode — twice. "first-run overhead" = first wall time − second; both
towers stay resident (no text-tower move). For sampling (``sample``: ``generate(..., decode=False)``: resolve,
prefill, plan, run) and the VAE decode (``decode``: ``decode_video`` with the run's options) apart, each run records its seconds, the graphs Dynamo traced, the inductor cache
hits / misses and where the compile time went (``torch._dynamo.utils.compilation_time_metrics``, phases ≥ 0.1 s);
``precompiled`` the graphs saved and loaded whole so far (``cosmos3_core.kernels.precompiled``: the process's
compiled generation layer, ``generation_layer_fn(RuntimeOptions(compile=True))``, and the VAE's compiled frame
decoder stages); ``step_s`` holds each step's seconds, the GPU waited for at every step (the first entry from the run's start: prefill,
plan and step 1), and ``first_step_new_modules`` the modules first imported up to the end of step 1. Processes run
one after another on one new, empty ``COSMOS3_CACHE_DIR``: process 1 is a machine's first run, the next ones a
restart (e.g. of ComfyUI).

    python3 bench/bench_first_run.py --shapes 256p,480p --processes 2 --preload --out bench/results/first_run.json
    python3 bench/bench_first_run.py --shapes t2i --processes 2 --preload --out bench/results/first_run_t2i.json
    python3 bench/bench_first_run.py --tiny --shapes 256p --processes 2 --out /tmp/first_run_tiny.json  # CPU check

``--profile-first`` runs each process's first sampling up to the end of step 1 under ``cProfile`` and records the
Python functions with the most own and cumulative time (``first_step_profile``): which first use the time outside
compilation goes to. The profiler slows that run, so its seconds are not the overhead to report.
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

from common import (LONG_PROMPT, RESOLUTIONS, TINY_RESOLUTIONS, build_ours, compile_stats,  # noqa: E402
                    fresh_processes, make_components, sync)


def _delta(before: dict, after: dict) -> dict:
    return dict(graphs=after["graphs"] - before["graphs"],
                fxgraph_cache_hit=after["fxgraph_cache_hit"] - before["fxgraph_cache_hit"],
                fxgraph_cache_miss=after["fxgraph_cache_miss"] - before["fxgraph_cache_miss"],
                compile_phases_s={k: round(v - before["phases"].get(k, 0.0), 2) for k, v in after["phases"].items()
                                  if v - before["phases"].get(k, 0.0) >= 0.1})


def _timed_stage(fn):
    before = compile_stats()
    sync()
    start = time.perf_counter()
    out = fn()
    sync()
    return out, dict(s=round(time.perf_counter() - start, 2), **_delta(before, compile_stats()))


def _python_profile(prof) -> dict:
    """The 40 functions with the most own time (``tottime``) and the 80 with the most cumulative time in a
    ``cProfile`` run."""
    import pstats

    stats = pstats.Stats(prof).stats  # {(file, line, name): (calls, ncalls, tottime, cumtime, callers)}

    def top(index: int, n: int) -> list[dict]:
        rows = sorted(stats.items(), key=lambda kv: -kv[1][index])[:n]
        return [dict(fn=f"{Path(f).name}:{line}:{name}", calls=v[1], tottime_s=round(v[2], 3),
                     cumtime_s=round(v[3], 3)) for (f, line, name), v in rows]
    return dict(by_own_time=top(2, 40), by_cumulative_time=top(3, 80))


class _StepClock:
    """A sampling callback: the seconds from the run's start to the end of step 1, then of each step after it (the
    GPU waited for at each step, so a first use shows in the step that pays it). With ``profile`` the host's
    Python time up to the end of step 1 runs under ``cProfile`` (``self.profile`` then holds its top functions)."""

    def __init__(self, profile: bool = False):
        self.seconds: list[float] = []
        self.profile = None
        self.new_modules: dict | None = None  # modules first imported up to the end of step 1, by package
        self._modules = set(sys.modules)
        self._profiler = None
        if profile:
            import cProfile

            self._profiler = cProfile.Profile()
            self._profiler.enable()
        self._last = time.perf_counter()

    def __call__(self, step: int, total: int, _preview=None) -> None:
        sync()
        now = time.perf_counter()
        if self._profiler is not None:
            self._profiler.disable()
            self.profile, self._profiler = _python_profile(self._profiler), None
        if self.new_modules is None:
            new = set(sys.modules) - self._modules
            packages: dict[str, int] = {}
            for name in new:
                key = ".".join(name.split(".")[:3])
                packages[key] = packages.get(key, 0) + 1
            top = sorted(packages.items(), key=lambda kv: -kv[1])[:40]
            self.new_modules = dict(count=len(new), by_package=dict(top))
        self.seconds.append(round(now - self._last, 3))
        self._last = time.perf_counter()


def _precompiled_counts(pipe, options) -> dict:
    """Graphs this process saved (compiled) and loaded from disk so far (``cosmos3_core.kernels.precompiled``)."""
    from cosmos3_core.model.transformer import generation_layer_fn

    decoder = pipe.vae.frame_decoder(compile=True, compile_backend=options.compile_backend)
    fns = [f for f in [generation_layer_fn(options), *decoder.precompiled.values()] if hasattr(f, "loaded")]
    return dict(compiled=sum(f.compiled for f in fns), loaded=sum(f.loaded for f in fns))


def child(shapes: list[str], tiny: bool, out: str, profile_first: bool = False, preload: bool = False) -> None:
    from cosmos3_core.vae.audio import Cosmos3SoundDecoder
    from cosmos3_core.kernels.caches import preload_compiler
    from cosmos3_core.modes.dispatch import generate
    from cosmos3_core.pipeline import Cosmos3Pipeline
    from cosmos3_core.request import Request
    from cosmos3_core.runtime import RuntimeOptions
    from cosmos3_core.vae.video import Cosmos3VAE

    t0 = time.perf_counter()
    preloading = preload_compiler() if preload else None  # before the model is built
    device = "cpu" if tiny else "cuda"
    tmp = Path(tempfile.mkdtemp(prefix="cosmos3-first-run-"))
    if tiny:
        from cosmos3_core.testing.tiny import build_tiny_checkpoint

        pipe = Cosmos3Pipeline.load(build_tiny_checkpoint(tmp, variant="nano", sound=True, seed=0))
    else:
        files, vae, audio, tokenizer = make_components(device, tmp)
        pipe = Cosmos3Pipeline(files, build_ours(device), Cosmos3VAE(vae), tokenizer, Cosmos3SoundDecoder(audio))
    sync()
    res = dict(setup_s=round(time.perf_counter() - t0, 1), torch=torch.__version__,
               device=torch.cuda.get_device_name() if device == "cuda" else device,
               cache=os.environ.get("COSMOS3_CACHE_DIR"), shapes={})
    if preloading is not None:
        res["preload"] = dict(done_before_first_run=not preloading.is_alive(), failed=preloading.failed,
                              seconds=None if preloading.seconds is None else round(preloading.seconds, 2))
    for name in shapes:
        h, w, frames = (TINY_RESOLUTIONS if tiny else RESOLUTIONS)[name]
        options = RuntimeOptions(compile=True)
        request = Request(prompt=LONG_PROMPT, num_frames=frames, height=h, width=w, steps=35, guidance=6.0, fps=24.0,
                          seed=0, sound=frames > 1, options=options)
        runs = []
        for k in range(2):  # generate(): sample (resolve, prefill, plan, run), then decode with the run's options
            steps = _StepClock(profile=profile_first and k == 0 and not res["shapes"])  # the process's first
            start = time.perf_counter()
            sampled, sample = _timed_stage(lambda: generate(pipe, request, callback=steps, decode=False))
            if steps.profile is not None:
                res["first_step_profile"] = steps.profile
            _, decode = _timed_stage(lambda: pipe.decode_video(sampled.latents, options=options))
            if sampled.sound_latent is not None:
                pipe.decode_sound(sampled.sound_latent, frames, request.fps)
            sync()
            runs.append(dict(wall_s=round(time.perf_counter() - start, 2),
                             **{k: round(v, 2) for k, v in sampled.timings.items()}, sample=sample, decode=decode,
                             step_s=steps.seconds, first_step_new_modules=steps.new_modules))
        res["shapes"][name] = dict(first=runs[0], second=runs[1],
                                   first_run_overhead_s=round(runs[0]["wall_s"] - runs[1]["wall_s"], 2),
                                   precompiled=_precompiled_counts(pipe, options))
        print("first run", name, res["shapes"][name], flush=True)
    Path(out).write_text(json.dumps(res, indent=1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="256p,480p")
    p.add_argument("--processes", type=int, default=2, help="fresh processes, one after another, on one new cache")
    p.add_argument("--out", required=True)
    p.add_argument("--tiny", action="store_true", help="on the CPU with a tiny model (a check that it runs)")
    p.add_argument("--profile-first", action="store_true",
                   help="run each process's first sampling up to step 1 under cProfile and record where its host "
                        "time went (attribution only: the profiler slows that run)")
    p.add_argument("--preload", action="store_true",
                   help="start caches.preload_compiler() before building the model (Cosmos3Pipeline.load does not: "
                        "beside a weight load it costs the load about what it saves; the bench builds its random "
                        "model without load())")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args.shapes.split(","), args.tiny, args.out, args.profile_first, args.preload)
        return
    results = dict(date=datetime.date.today().isoformat(), shapes=args.shapes.split(","), tiny=args.tiny,
                   processes=[])
    flags = ["--tiny"] * args.tiny + ["--profile-first"] * args.profile_first + ["--preload"] * args.preload
    fresh_processes([__file__, "--child", "--shapes", args.shapes, *flags], args.processes, results, args.out)
    for i, run in enumerate(results["processes"], 1):
        for name, r in run["shapes"].items():
            print(f"process {i} {name}: first {r['first']['wall_s']} s (sample {r['first']['sample']['s']}, decode "
                  f"{r['first']['decode']['s']}), second {r['second']['wall_s']} s, overhead "
                  f"{r['first_run_overhead_s']} s", flush=True)


if __name__ == "__main__":
    main()

"""Probe: can a process skip Dynamo's re-trace of the VAE decoder's stages by loading them AOT-compiled?

A restarted process that compiles the VAE decoder finds the kernels in the on-disk caches but still re-traces every
stage with Dynamo (1.4–1.5 s of 2.0 s at 256p, BENCHMARKS.md run 15). torch's experimental
``torch.compile(fn).aot_compile(example)`` / ``save_compiled_function`` / ``torch.compiler.load_compiled_function``
serializes Dynamo's output (bytecode, guards, the compiled graph with its kernels). Two phases, each in its own
process on the same folder:

* ``--phase save``: per stage of a steady-state latent frame, AOT-compile and save; then also run the ordinary
  ``torch.compile`` once (fills the on-disk caches, as a first process would).
* ``--phase load``: per stage, time the ordinary ``torch.compile`` first call (re-trace + cache hit) and the AOT
  load + first call; compare both outputs with eager.

    python3 bench/probe_aot_compile.py --phase save --dir /tmp/aot --out save.json
    python3 bench/probe_aot_compile.py --phase load --dir /tmp/aot --out load.json
    python3 bench/probe_aot_compile.py --tiny ...     # CPU, the tiny checkpoint's VAE
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def build(tiny: bool):
    from bench_generation import WAN22_VAE

    if tiny:
        from cosmos3_core.testing.tiny import build_tiny_checkpoint
        from cosmos3_core.vae.video import load_vae

        return load_vae(build_tiny_checkpoint(Path(tempfile.mkdtemp()), variant="nano", sound=False, seed=0),
                        dtype=torch.float32)
    from diffusers import AutoencoderKLWan

    from cosmos3_core.vae.video import Cosmos3VAE

    torch.manual_seed(0)
    return Cosmos3VAE(AutoencoderKLWan(**WAN22_VAE).to(device="cuda", dtype=torch.bfloat16).eval()
                      .requires_grad_(False))


def stage_inputs(vae, h: int, w: int):
    """The stages of frame 1 (steady state) with their inputs, after an eager frame 0."""
    from cosmos3_core.vae.video import frame_decoder as vd

    dec = vae.vae.decoder
    cl = vae.device.type == "cuda"
    vd.conv_weights_to_layout(dec, cl)
    gen = torch.Generator().manual_seed(1)
    z = torch.randn(1, vae.latent_channels, 2, h, w, generator=gen).to(vae.device, vae.dtype)
    x = vae.vae.post_quant_conv(z)
    fmt = torch.channels_last_3d if cl else torch.contiguous_format
    stages = [(vd._stage_in, dec)] + [(vd._stage_up, b) for b in dec.up_blocks] + [(vd._stage_out, dec)]
    state = [None] * len(stages)
    f0 = x[:, :, :1].contiguous(memory_format=fmt)
    for k, (fn, m) in enumerate(stages):
        f0, state[k] = fn(m, f0, state[k], True, cl)
    f1 = x[:, :, 1:2].contiguous(memory_format=fmt)
    inputs = []
    for k, (fn, m) in enumerate(stages):
        inputs.append((f1.clone(memory_format=torch.preserve_format), [t.clone(memory_format=torch.preserve_format)
                                                                       for t in state[k]]))
        f1, state[k] = fn(m, f1, state[k], False, cl)
    return stages, inputs, cl


def copy_hist(hist):
    return [t.clone(memory_format=torch.preserve_format) for t in hist]


def sync():
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--phase", choices=("save", "load"), required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--latent", default="16x28", help="latent h x w (256p: 16x28)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    os.environ.setdefault("COSMOS3_CACHE_DIR", str(Path(args.dir) / "cache"))
    from cosmos3_core.kernels.caches import prepare_compile

    prepare_compile()
    import torch._dynamo.config as dc

    res = dict(torch=torch.__version__, phase=args.phase, has_enable_aot_compile=hasattr(dc, "enable_aot_compile"),
               has_load_compiled_function=hasattr(torch.compiler, "load_compiled_function"), stages=[])
    if res["has_enable_aot_compile"]:
        dc.enable_aot_compile = True
    h, w = (int(v) for v in args.latent.split("x"))
    vae = build(args.tiny)
    with torch.no_grad():
        stages, inputs, cl = stage_inputs(vae, h, w)
    folder = Path(args.dir)
    folder.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        for k, ((fn, m), (x, hist)) in enumerate(zip(stages, inputs)):
            row: dict = dict(stage=k, fn=fn.__name__)
            ref, ref_hist = fn(m, x.clone(memory_format=torch.preserve_format), copy_hist(hist), False, cl)
            path = folder / f"stage{k}.aot"
            if args.phase == "save":
                try:
                    t0 = time.perf_counter()
                    aot = torch.compile(fn, fullgraph=True, dynamic=False).aot_compile(
                        ((m, x, copy_hist(hist), False, cl), {}))
                    row["aot_compile_s"] = round(time.perf_counter() - t0, 3)
                    t0 = time.perf_counter()
                    aot.save_compiled_function(str(path))
                    row["save_s"] = round(time.perf_counter() - t0, 3)
                    row["bytes"] = path.stat().st_size
                except Exception as e:  # noqa: BLE001 — a probe: record and go on
                    row["aot_error"] = f"{type(e).__name__}: {str(e)[:800]}"
                t0 = time.perf_counter()
                torch.compile(fn, fullgraph=True, dynamic=False)(m, x, copy_hist(hist), False, cl)
                sync()
                row["compile_first_call_s"] = round(time.perf_counter() - t0, 3)
            else:
                t0 = time.perf_counter()
                y, _ = torch.compile(fn, fullgraph=True, dynamic=False)(m, x, copy_hist(hist), False, cl)
                sync()
                row["compile_first_call_s"] = round(time.perf_counter() - t0, 3)
                row["compile_rel_diff"] = float((y.float() - ref.float()).norm() / ref.float().norm())
                try:
                    t0 = time.perf_counter()
                    with open(path, "rb") as f:
                        loaded = torch.compiler.load_compiled_function(f)
                    row["aot_load_s"] = round(time.perf_counter() - t0, 3)
                    t0 = time.perf_counter()
                    hist2 = copy_hist(hist)
                    y2, new_hist = loaded(m, x, hist2, False, cl)
                    sync()
                    row["aot_first_call_s"] = round(time.perf_counter() - t0, 3)
                    t0 = time.perf_counter()
                    loaded(m, x, copy_hist(hist), False, cl)
                    sync()
                    row["aot_second_call_s"] = round(time.perf_counter() - t0, 4)
                    row["aot_rel_diff"] = float((y2.float() - ref.float()).norm() / ref.float().norm())
                    row["aot_hist_same_objects"] = all(a is b for a, b in zip(new_hist, hist2))
                    row["aot_hist_rel_diff"] = max(float((a.float() - b.float()).norm() / max(b.float().norm(), 1e-12))
                                                   for a, b in zip(new_hist, ref_hist))
                except Exception as e:  # noqa: BLE001
                    row["aot_error"] = f"{type(e).__name__}: {str(e)[:800]}"
            res["stages"].append(row)
            print(json.dumps(row), flush=True)
    Path(args.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()

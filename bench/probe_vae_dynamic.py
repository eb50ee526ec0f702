"""Probe: the compiled VAE decoder stages with static sizes (one graph per size) against dynamic height/width (one
graph for every size): compile time at the first size, at a second size, and the decode time at both.

    python3 bench/probe_vae_dynamic.py --sizes 480p,720p --out results_probe_vae_dynamic.json
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

LATENTS = {"256p": (48, 16, 28), "480p": (24, 30, 52), "720p": (48, 45, 80), "tiny": (3, 4, 6), "tiny2": (3, 6, 4)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="480p,720p")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    from bench_encode_overlap import build_vae

    from cosmos3_core.vae.frame_decoder import WanFrameDecoder

    res = dict(torch=torch.__version__, runs={})
    for mode in ("static", "dynamic"):
        os.environ["COSMOS3_CACHE_DIR"] = tempfile.mkdtemp(prefix=f"vae-{mode}-")
        vae = build_vae(args.tiny, Path(tempfile.mkdtemp()))
        vae._frame_decoders[(True, vae.device.type == "cuda")] = WanFrameDecoder(
            vae.vae.decoder, compile=True, channels_last=vae.device.type == "cuda", dynamic_size=mode == "dynamic")
        rows = {}
        for size in args.sizes.split(","):
            t, h, w = LATENTS[size]
            z = torch.randn(1, 48, t, h, w, generator=torch.Generator().manual_seed(0))
            times = []
            for _ in range(2):
                if vae.device.type == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                out = vae.decode(z, compile=True, out_device="cpu")
                if vae.device.type == "cuda":
                    torch.cuda.synchronize()
                times.append(round(time.perf_counter() - t0, 3))
            eager = vae.decode(z, out_device="cpu")
            fns = vae.frame_decoder(True).precompiled.values()
            rows[size] = dict(first_s=times[0], second_s=times[1], graphs_compiled=sum(f.compiled for f in fns),
                              max_abs_vs_eager=float((out - eager).abs().max()))
            print(mode, size, rows[size], flush=True)
        res["runs"][mode] = rows
        del vae
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    Path(args.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()

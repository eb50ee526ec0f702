"""Wan2.2 VAE decode speed, memory and agreement: diffusers' per-frame decoder loop vs ``WanFrameDecoder`` variants.

Full-size random-weight Wan2.2 VAE (common.WAN22_VAE), bf16, CUDA. Per resolution and variant: one short
warm-up (``--warmup-frames`` latent frames: the eager first frame, then steady frames, which is where a compiled
variant compiles; reported as ``warmup_s``), then ``--repeats`` timed whole-clip decodes (``--repeats-720p`` at
720p), ``torch.cuda.synchronize`` timing, median reported. Every variant decodes the same latents one latent frame
at a time, post_quant_conv included, and copies each frame's raw decoder output (bf16, unclamped) into pinned host
memory; its frames are then compared with the diffusers loop's (``rel_l2``, ``max_abs``). Peak memory is
``torch.cuda.max_memory_allocated`` over the timed pass (reset per variant; ``peak_gib`` includes the ~1.3 GiB of
VAE weights, ``peak_above_weights_gib`` does not).

Variants: ``diffusers`` — ``vae.decoder(x, feat_cache=, feat_idx=, first_chunk=)`` per latent frame, as vae.py did
before WanFrameDecoder; ``eager`` — WanFrameDecoder; ``compiled`` — WanFrameDecoder with the steady frame
torch.compile'd; ``cl``/``cl_compiled`` — the same with channels_last_3d activations. ``--e2e`` also times
``Cosmos3VAE.decode`` (the user path: post-processing to fp32 frames on the CPU) at the first resolution, eager and
compiled (``decode(compile=True, compile_backend=--backend)``, what a run with ``RuntimeOptions(compile=True)``
decodes with).

    python bench/bench_vae.py --resolutions 720p --e2e --out bench/results/vae_diffusers_720p.json
    python bench/bench_vae.py --resolutions 480p,256p --variants diffusers,eager,compiled --out bench/results/vae_small.json
    python bench/bench_vae.py --resolutions 720p --variants compiled,cl,cl_compiled --e2e --out bench/results/vae_720p.json
    python bench/bench_vae.py --tiny --out /tmp/vae_tiny.json              # CPU check of the same code (~2 min)

``--encode-overlap`` times the CLI's mp4 encode overlapped with the VAE decode instead, against decoding first and
encoding after. Per resolution (pixel shapes of ``common.RESOLUTIONS``): random normalized latents decoded by
``Cosmos3VAE.decode`` (``--compile``: compiled, as ``generate --compile``), then ``decode`` alone, ``encode``
(``media.write_video`` of its frames) alone, ``sequential`` (decode, then ``write_video``: the CLI before the overlap)
and ``overlapped`` (the CLI's ``cli.common.decode_while_encoding`` + closing its writer: each decoded chunk goes to
the encoder's thread as soon as it is on the host). Each is timed twice in alternation after one warm-up decode (a compiled
decode's first run compiles); the best of each is reported. No sound (its track is muxed the same way in both).
``--tiny``: the tiny checkpoint's VAE on the CPU at ``common.TINY_RESOLUTIONS`` (a check that it runs).

    python bench/bench_vae.py --encode-overlap --compile --resolutions 480p,720p --out bench/results/vae_encode_overlap.json
    python bench/bench_vae.py --encode-overlap --tiny --resolutions 480p --out /tmp/encode_overlap_tiny.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

# (latent T, latent h, latent w): 720p/189f = 1280x720 -> 80x45; 480p/93f = 832x480 -> 52x30; 256p/189f = 320x192
SHAPES = {"720p": (48, 45, 80), "480p": (24, 30, 52), "256p": (48, 12, 20), "tiny": (4, 2, 3)}
VARIANTS = ("diffusers", "eager", "compiled", "cl", "cl_compiled")


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def build_vae(tiny: bool, device, dtype):
    if tiny:
        from cosmos3_core.testing.tiny import _build_vae

        vae = _build_vae(0, torch.Generator().manual_seed(0))
    else:
        from diffusers import AutoencoderKLWan

        from common import WAN22_VAE

        vae = AutoencoderKLWan(**WAN22_VAE)
    return vae.to(device=device, dtype=dtype).eval().requires_grad_(False)


def make_decoder(vae, variant: str, cache: dict, backend: str):
    """A callable ``step(x_frame, state, first) -> decoder output``; one WanFrameDecoder per variant (shared across
    resolutions so a compiled variant keeps its graphs)."""
    from cosmos3_core.vae.frame_decoder import WanFrameDecoder

    if variant == "diffusers":
        def step(x, state, first):
            if first:
                state[:] = [None] * sum(type(m).__name__ == "WanCausalConv3d" for m in vae.decoder.modules())
            return vae.decoder(x, feat_cache=state, feat_idx=[0], first_chunk=first)
        return step
    if variant not in cache:
        cache[variant] = WanFrameDecoder(vae.decoder, compile=variant.endswith("compiled"),
                                         channels_last=variant.startswith("cl"), compile_backend=backend)
    return cache[variant]


@torch.no_grad()
def decode_clip(vae, step, z: torch.Tensor, host: torch.Tensor | None) -> None:
    """post_quant_conv + one decoder call per latent frame; raw frames copied into ``host`` [C, F, H, W]."""
    x = vae.post_quant_conv(z)
    state, f = [], 0
    for i in range(z.shape[2]):
        out = step(x[:, :, i:i + 1], state, i == 0)
        if host is not None:
            host[:, f:f + out.shape[2]].copy_(out[0], non_blocking=True)
        f += out.shape[2]


def timed(fn, device) -> float:
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0


def compare(out: torch.Tensor, ref: torch.Tensor) -> dict:
    num = den = 0.0
    mx = 0.0
    for a, b in zip(out.split(1, dim=1), ref.split(1, dim=1)):  # frame by frame: bounded host memory
        a, b = a.float(), b.float()
        num += float((a - b).pow(2).sum())
        den += float(b.pow(2).sum())
        mx = max(mx, float((a - b).abs().max()))
    return {"rel_l2": (num / max(den, 1e-30)) ** 0.5, "max_abs": mx}


def bench_resolution(vae, name, variants, args, device, dtype, cache, weights_bytes) -> dict:
    t, h, w = SHAPES[name]
    gen = torch.Generator().manual_seed(0)
    z = torch.randn(1, vae.config.z_dim, t, h, w, generator=gen).to(device=device, dtype=dtype)
    p = vae.config.patch_size or 1
    c_out, s = vae.config.out_channels, vae.config.scale_factor_spatial // p
    frames = 1 + vae.config.scale_factor_temporal * (t - 1)
    pin = device.type == "cuda"
    ref = None
    res = {"latent_shape": list(z.shape), "pixel_frames": frames, "pixels": [h * vae.config.scale_factor_spatial,
                                                                                w * vae.config.scale_factor_spatial]}
    repeats = args.repeats_720p if name == "720p" else args.repeats
    for variant in variants:
        step = make_decoder(vae, variant, cache, args.backend)
        r = {}
        try:
            zw = z[:, :, :min(args.warmup_frames, t)]
            r["warmup_s"] = round(timed(lambda step=step, zw=zw: decode_clip(vae, step, zw, None), device), 3)
            host = torch.empty(c_out, frames, h * s, w * s, dtype=dtype, pin_memory=pin)
            if device.type == "cuda":
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
            times = [timed(lambda step=step, host=host: decode_clip(vae, step, z, host), device) for _ in range(repeats)]
            r["seconds"] = round(statistics.median(times), 3)
            r["times"] = [round(x, 3) for x in times]
            if device.type == "cuda":
                peak = torch.cuda.max_memory_allocated()
                r["peak_gib"] = round(peak / 2**30, 2)
                r["peak_above_weights_gib"] = round((peak - weights_bytes) / 2**30, 2)
            if variant == "diffusers" or ref is None:
                ref, r["reference"] = host, True
            else:
                r.update({k: float(f"{v:.3g}") for k, v in compare(host, ref).items()})
        except Exception as e:  # keep the other variants' numbers
            r["error"] = f"{type(e).__name__}: {e}"[:500]
        if "diffusers" in res and "seconds" in r and "seconds" in res["diffusers"]:
            r["speedup_vs_diffusers"] = round(res["diffusers"]["seconds"] / r["seconds"], 3)
        res[variant] = r
        print(name, variant, r, flush=True)
    return res


def bench_e2e(vae, name, args, device, cache) -> dict:
    """Cosmos3VAE.decode (normalized latents -> fp32 frames on the CPU), eager and compiled, with the decoders and
    layout it picks itself (channels-last on CUDA)."""
    from cosmos3_core.vae.video import Cosmos3VAE

    c3 = Cosmos3VAE(vae)
    t, h, w = SHAPES[name]
    lat = torch.randn(1, vae.config.z_dim, t, h, w, generator=torch.Generator().manual_seed(1))
    out = {}
    for compile in (False, True):
        decode = dict(compile=compile, compile_backend=args.backend)
        c3.decode(lat[:, :, :min(args.warmup_frames, t)], **decode)  # warm-up (compiles)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        sec = timed(lambda decode=decode: c3.decode(lat, **decode), device)
        r = {"seconds": round(sec, 3)}
        if device.type == "cuda":
            r["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        out["compiled" if compile else "eager"] = r
        print(name, "e2e", out, flush=True)
    return out


def encode_overlap(args) -> None:
    """``--encode-overlap``: decode, encode, decode-then-encode and the CLI's overlapped decode + encode."""
    from common import RESOLUTIONS, TINY_RESOLUTIONS, WAN22_VAE
    from cosmos3_core import media
    from cosmos3_core.cli.common import decode_while_encoding
    from cosmos3_core.runtime import RuntimeOptions
    from cosmos3_core.vae.video import Cosmos3VAE, load_vae

    tmp = Path(tempfile.mkdtemp(prefix="cosmos3-encode-overlap-"))
    device = torch.device("cpu" if args.tiny else "cuda")
    if args.tiny:
        from cosmos3_core.testing.tiny import build_tiny_checkpoint

        vae = load_vae(build_tiny_checkpoint(tmp, variant="nano", sound=False, seed=0), dtype=torch.float32)
    else:
        from diffusers import AutoencoderKLWan

        torch.manual_seed(0)
        vae = Cosmos3VAE(AutoencoderKLWan(**WAN22_VAE).to(device="cuda", dtype=torch.bfloat16).eval()
                         .requires_grad_(False))
    pipe = SimpleNamespace(vae=vae, decode_sound=None)  # what decode_while_encoding uses of a pipeline (no sound)
    options = RuntimeOptions(compile=args.compile, compile_backend=args.backend)
    decode = dict(compile=options.vae_compile, compile_backend=options.compile_backend)
    res = dict(date=datetime.date.today().isoformat(), torch=torch.__version__, cpus=os.cpu_count(),
               device="cpu" if args.tiny else torch.cuda.get_device_name(), compile=args.compile, shapes={})
    for name in args.resolutions.split(","):
        h, w, frames = (TINY_RESOLUTIONS if args.tiny else RESOLUTIONS)[name]
        g = torch.Generator().manual_seed(0)
        latents = torch.randn(vae.latent_shape(frames, h, w), generator=g)
        clip = tmp / f"{name}.mp4"
        cli_args = SimpleNamespace(out=clip)  # the CLI's arguments decode_while_encoding reads
        run = SimpleNamespace(fps=24.0, num_frames=frames, options=options)  # the resolved run's parts it reads
        decoded = vae.decode(latents, **decode)  # warm-up (a compiled decode compiles here)
        t = dict(decode=[], encode=[], sequential=[], overlapped=[])
        for _ in range(2):
            t["decode"].append(timed(lambda: vae.decode(latents, **decode), device))
            t["encode"].append(timed(lambda: media.write_video(clip, decoded, 24.0), device))
            t["sequential"].append(timed(lambda: media.write_video(clip, vae.decode(latents, **decode), 24.0), device))
            out = SimpleNamespace(latents=latents, sound_latent=None, frames=None, waveform=None)
            t["overlapped"].append(timed(lambda: decode_while_encoding(cli_args, pipe, run, out).close(), device))
        best = {k: round(min(v), 3) for k, v in t.items()}
        res["shapes"][name] = dict(frames=frames, height=h, width=w, **best, saved_s=round(best["sequential"] -
                                   best["overlapped"], 3), all_s={k: [round(x, 3) for x in v] for k, v in t.items()})
        print(name, res["shapes"][name], flush=True)
    Path(args.out).write_text(json.dumps(res, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--tiny", action="store_true", help="CPU, fp32, the tests' tiny Wan2.2 VAE (checks the script)")
    ap.add_argument("--resolutions", default="720p,480p,256p")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--repeats-720p", type=int, default=1)
    ap.add_argument("--warmup-frames", type=int, default=3, help="latent frames of the warm-up decode (>= 2)")
    ap.add_argument("--backend", default="inductor",
                    help="torch.compile backend of the compiled variants (RuntimeOptions.compile_backend)")
    ap.add_argument("--e2e", action="store_true", help="also time Cosmos3VAE.decode at the first resolution")
    ap.add_argument("--encode-overlap", action="store_true",
                    help="time the CLI's mp4 encode overlapped with the decode instead (see the docstring)")
    ap.add_argument("--compile", action="store_true", help="--encode-overlap: compiled decode, as generate --compile")
    args = ap.parse_args()
    if args.encode_overlap:
        if not args.tiny and not torch.cuda.is_available():
            raise SystemExit("bench_vae.py --encode-overlap needs a CUDA GPU (or --tiny for a CPU check).")
        encode_overlap(args)
        return
    variants = args.variants.split(",")
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        raise SystemExit(f"--variants: unknown {bad}; choose from {VARIANTS}")
    if args.tiny:
        device, dtype, resolutions = torch.device("cpu"), torch.float32, ["tiny"]
    else:
        if not torch.cuda.is_available():
            raise SystemExit("bench_vae.py needs a CUDA GPU (or --tiny for a CPU check).")
        device, dtype, resolutions = torch.device("cuda"), torch.bfloat16, args.resolutions.split(",")
    vae = build_vae(args.tiny, device, dtype)
    weights = sum(p.numel() * p.element_size() for p in vae.parameters())
    results = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"), "host": platform.node(),
        "torch": torch.__version__, "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "dtype": str(dtype), "vae_weights_gib": round(weights / 2**30, 3), "args": vars(args), "resolutions": {},
    }
    cache: dict = {}
    t0 = time.perf_counter()
    for name in resolutions:
        results["resolutions"][name] = bench_resolution(vae, name, variants, args, device, dtype, cache, weights)
        Path(args.out).write_text(json.dumps(results, indent=2))
    if args.e2e:
        results["e2e"] = {resolutions[0]: bench_e2e(vae, resolutions[0], args, device, cache)}
    results["total_s"] = round(time.perf_counter() - t0, 1)
    Path(args.out).write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

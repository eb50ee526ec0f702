"""The CLI's mp4 encode overlapped with the VAE decode, against decoding first and encoding after.

Per shape: random normalized latents ``[1, 48, T, h, w]`` decoded by the Wan2.2 VAE (full size, random bf16
weights, on the GPU; ``--tiny``: the tiny checkpoint's VAE on the CPU), then

* ``decode``: ``Cosmos3VAE.decode`` alone; ``encode``: ``media.write_video`` of its frames alone;
* ``sequential``: decode, then ``write_video`` (the CLI before the overlap);
* ``overlapped``: ``generate.decode_while_encoding`` + closing its writer (what ``generate`` runs now: each decoded
  chunk goes to the encoder's thread as soon as it is on the host).

Each timed twice in alternation after one warm-up decode (a compiled decode's first run compiles); the best of each
is reported. No sound (its track is muxed the same way in both). Results to a JSON file.

    python3 bench/bench_encode_overlap.py --shapes 480p,720p --compile --out bench/results_encode_overlap.json
    python3 bench/bench_encode_overlap.py --tiny --shapes 480p --out /tmp/encode_overlap_tiny.json   # CPU check
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
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import RESOLUTIONS, WAN22_VAE, sync  # noqa: E402


def build_vae(tiny: bool, tmp: Path):
    from cosmos3_core.vae.video import Cosmos3VAE, load_vae

    if tiny:
        from cosmos3_core.testing.tiny import build_tiny_checkpoint

        return load_vae(build_tiny_checkpoint(tmp, variant="nano", sound=False, seed=0), dtype=torch.float32)
    from diffusers import AutoencoderKLWan

    torch.manual_seed(0)
    return Cosmos3VAE(AutoencoderKLWan(**WAN22_VAE).to(device="cuda", dtype=torch.bfloat16).eval()
                      .requires_grad_(False))


def timed(fn) -> float:
    sync()
    start = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="480p,720p")
    p.add_argument("--compile", action="store_true", help="compiled VAE decode, as generate --compile")
    p.add_argument("--tiny", action="store_true", help="the tiny checkpoint's VAE on the CPU (a check that it runs)")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    from cosmos3_core import media
    from cosmos3_core.cli.main import decode_while_encoding

    tmp = Path(tempfile.mkdtemp(prefix="cosmos3-encode-overlap-"))
    vae = build_vae(args.tiny, tmp)
    pipe = SimpleNamespace(vae=vae, decode_sound=None)
    res = dict(date=datetime.date.today().isoformat(), torch=torch.__version__, cpus=os.cpu_count(),
               device="cpu" if args.tiny else torch.cuda.get_device_name(), compile=args.compile, shapes={})
    for name in args.shapes.split(","):
        h, w, frames = RESOLUTIONS[name]
        g = torch.Generator().manual_seed(0)
        latents = torch.randn(vae.latent_shape(frames, h, w), generator=g)
        clip = tmp / f"{name}.mp4"
        run_args = SimpleNamespace(fps=24.0, num_frames=frames, compile=args.compile, out=clip)
        decoded = vae.decode(latents, compile=args.compile)  # warm-up (a compiled decode compiles here)
        t = dict(decode=[], encode=[], sequential=[], overlapped=[])
        for _ in range(2):
            t["decode"].append(timed(lambda: vae.decode(latents, compile=args.compile)))
            t["encode"].append(timed(lambda: media.write_video(clip, decoded, 24.0)))
            t["sequential"].append(timed(lambda: media.write_video(clip, vae.decode(latents, compile=args.compile),
                                                                   24.0)))
            out = SimpleNamespace(latents=latents, sound_latent=None, frames=None, waveform=None)
            t["overlapped"].append(timed(lambda: decode_while_encoding(run_args, pipe, out).close()))
        best = {k: round(min(v), 3) for k, v in t.items()}
        res["shapes"][name] = dict(frames=frames, height=h, width=w, **best, saved_s=round(best["sequential"] -
                                   best["overlapped"], 3), all_s={k: [round(x, 3) for x in v] for k, v in t.items()})
        print(name, res["shapes"][name], flush=True)
    Path(args.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()

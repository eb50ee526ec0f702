"""Probe: GPU time per kernel of the Wan2.2 VAE decode at 720p (steady latent frames), eager channels-last and
compiled, to see what the decode spends its time on. One GPU run.

    python bench/probe_vae.py --variant cl_compiled --weights-cl --out probe_vae.json   # one variant per process
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_vae import build_vae, decode_clip, make_decoder, timed  # noqa: E402


@torch.no_grad()
def profile_variant(vae, variant: str, frames: int = 3) -> dict:
    from torch.profiler import ProfilerActivity, profile

    step = make_decoder(vae, variant, {}, "inductor")
    z = torch.randn(1, 48, 8, 45, 80, device="cuda", dtype=torch.bfloat16)
    x = vae.post_quant_conv(z)
    state = []
    for i in range(5):
        step(x[:, :, i:i + 1], state, i == 0)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(5, 5 + frames):
            step(x[:, :, i:i + 1], state, False)
        torch.cuda.synchronize()
    rows, total = [], 0.0
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", 0) or 0
        if t <= 0:
            continue
        total += t
        rows.append((t / frames, e.count // frames, e.key[:120]))
    rows.sort(reverse=True)
    zc = torch.randn(1, 48, 48, 45, 80, device="cuda", dtype=torch.bfloat16)
    clip = [round(timed(lambda: decode_clip(vae, step, zc, None), torch.device("cuda")), 3) for _ in range(2)]
    return dict(gpu_ms_per_frame=round(total / frames / 1e3, 2), clip_720p_s=clip,
                top=[dict(ms=round(t / 1e3, 3), n=n, name=k) for t, n, k in rows[:25]])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="probe_vae.json")
    p.add_argument("--variant", default="compiled", help="bench_vae variant: eager, cl, compiled, cl_compiled")
    p.add_argument("--weights-cl", action="store_true", help="conv weights stored channels-last before any call")
    args = p.parse_args()
    vae = build_vae(False, torch.device("cuda"), torch.bfloat16)
    if args.weights_cl:
        for m in vae.decoder.modules():
            if isinstance(m, (torch.nn.Conv3d, torch.nn.Conv2d)):
                fmt = torch.channels_last_3d if m.weight.ndim == 5 else torch.channels_last
                m.weight.data = m.weight.data.contiguous(memory_format=fmt)
    res = {args.variant + ("_weights_cl" if args.weights_cl else ""): profile_variant(vae, args.variant)}
    Path(args.out).write_text(json.dumps(res, indent=1))
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()

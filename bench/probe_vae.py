"""Probe: GPU time per kernel of the Wan2.2 VAE decode at 720p (steady latent frames), eager channels-last and
compiled, to see what the decode spends its time on. One GPU run.

    python bench/probe_vae.py --variant cl_compiled --weights-cl --out probe_vae.json   # one variant per process
    python bench/probe_vae.py --variant cl_compiled --memory --out mem.json   # what is alive at the peak

``--memory`` records the CUDA caching allocator's history over a 6-latent-frame 720p decode (after a warm-up that
compiles) and reports the peak and, at that moment, the live blocks grouped by the innermost source line that
allocated them (inductor's generated code names its buffers there).
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
from cosmos3_core.vae.frame_decoder import conv_weights_to_layout  # noqa: E402


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


@torch.no_grad()
def memory_at_peak(vae, variant: str, latent_frames: int = 6) -> dict:
    step = make_decoder(vae, variant, {}, "inductor")
    z = torch.randn(1, 48, latent_frames, 45, 80, device="cuda", dtype=torch.bfloat16)
    decode_clip(vae, step, z, None)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.memory._record_memory_history(max_entries=200000)
    decode_clip(vae, step, z, None)
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    peak = torch.cuda.max_memory_allocated()
    live, total, best, best_live, at_event = {}, 0, -1, {}, -1
    events = [e for t in snap["device_traces"] for e in t]
    for i, e in enumerate(events):
        if e["action"] == "alloc":
            live[e["addr"]] = e
            total += e["size"]
        elif e["action"] == "free_requested" and e["addr"] in live:
            total -= live.pop(e["addr"])["size"]
        if total > best:
            best, best_live, at_event = total, dict(live), i

    def where(e) -> str:
        frames = [f for f in e.get("frames", []) if f["filename"].endswith(".py") and "torch/" not in f["filename"]]
        return "; ".join(f"{Path(f['filename']).name}:{f['line']} {f['name']}" for f in frames[:3]) or "?"

    groups: dict[str, list] = {}
    for e in best_live.values():
        g = groups.setdefault(where(e), [0, 0])
        g[0] += e["size"]
        g[1] += 1
    top = sorted(groups.items(), key=lambda kv: -kv[1][0])[:30]
    codes = sorted({f["filename"] for e in best_live.values() for f in e.get("frames", [])
                    if "inductor" in f["filename"] or "/tmp/" in f["filename"]})
    return dict(base_gib=round(base / 2**30, 2), peak_gib=round(peak / 2**30, 2),
                traced_peak_above_base_gib=round(best / 2**30, 2), at_event=at_event, events=len(events),
                live_at_peak=[dict(gib=round(b / 2**30, 3), n=n, where=w) for w, (b, n) in top],
                inductor_files=codes)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="probe_vae.json")
    p.add_argument("--variant", default="compiled", help="bench_vae variant: eager, cl, compiled, cl_compiled")
    p.add_argument("--weights-cl", action="store_true", help="conv weights stored channels-last before any call")
    p.add_argument("--memory", action="store_true", help="report what is alive at the allocator peak instead")
    args = p.parse_args()
    vae = build_vae(False, torch.device("cuda"), torch.bfloat16)
    if args.weights_cl:
        conv_weights_to_layout(vae.decoder, channels_last=True)
    run = memory_at_peak if args.memory else profile_variant
    res = {args.variant + ("_weights_cl" if args.weights_cl else ""): run(vae, args.variant)}
    if args.memory:  # the generated code the live blocks point into, to read offline
        import shutil
        out_dir = Path(args.out).parent / "inductor_code"
        out_dir.mkdir(parents=True, exist_ok=True)
        for f in res[next(iter(res))]["inductor_files"]:
            shutil.copy(f, out_dir / Path(f).name)
    Path(args.out).write_text(json.dumps(res, indent=1))
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()

"""Long video (windowed text-to-video, streamed to an mp4): per-window time and peak memory on full-size random Nano.

For each shape it resolves a windowed ``Request`` (``num_frames`` past one clip, ``frames_per_chunk``; eager,
``RuntimeOptions()``) and generates the whole video window by window with
``cosmos3_core.modes.long_video.generate_long`` and the streaming mp4 writer as its sink, and records per window: denoising seconds, decode+write seconds, peak GPU memory
allocated during the window (the peak is reset between windows) and the host's resident memory after the window.
Flat peaks over the windows are the claim to check: nothing but the last decoded tail crosses a window boundary.

Weights: common.py's random bf16 Nano transformer and full-size Wan2.2 VAE / AVAE.

    python bench/bench_longvideo.py --steps 2 --out bench/results/longvideo.json  # 30 s 480p, 20 s 720p, GPU
    python bench/bench_longvideo.py --tiny --out /tmp/lv.json                     # the tiny checkpoint, CPU check
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

# name: (height, width, total frames, frames per window)
SHAPES = {"30s_480p": (480, 832, 721, 189), "20s_720p": (720, 1280, 481, 189)}
TINY_SHAPES = {"tiny_4_windows": (32, 48, 21, 9)}


def host_rss_gib() -> float:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 2**20, 2)
    except OSError:
        pass
    return float("nan")


def load_pipeline(tiny: bool, device: str, tmp: Path):
    if tiny:
        from cosmos3_core.pipeline import Cosmos3Pipeline
        from cosmos3_core.testing.tiny import build_tiny_checkpoint

        path = build_tiny_checkpoint(tmp / "tiny", variant="nano", sound=True, seed=0)
        return Cosmos3Pipeline.load(path, dtype=torch.float32, device=device)
    from common import build_models, make_components
    from cosmos3_core.pipeline import Cosmos3Pipeline
    from cosmos3_core.vae.audio import Cosmos3SoundDecoder
    from cosmos3_core.vae.video import Cosmos3VAE

    _, ours = build_models(device)
    files, vae, audio, tokenizer = make_components(device, tmp)
    return Cosmos3Pipeline(files, ours, Cosmos3VAE(vae), tokenizer, Cosmos3SoundDecoder(audio))


def bench_shape(pipe, name: str, shape, *, steps: int, sound: bool, device: str, out_dir: Path) -> dict:
    from cosmos3_core.media import VideoWriter, probe_media
    from cosmos3_core.modes.long_video import generate_long
    from cosmos3_core.request import Request
    from cosmos3_core.resolve import resolve
    from cosmos3_core.runtime import RuntimeOptions

    h, w, total, chunk = shape
    cuda = device == "cuda"
    windows: list[dict] = []
    state = {"start": time.perf_counter()}

    def reset_peak() -> None:
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()

    def progress(k, n, step, steps_, _preview) -> None:
        if step == 1:
            print(f"{name}: window {k + 1}/{n}", flush=True)

    path = out_dir / f"{name}.mp4"
    prompt = "a red robot walks down a busy city street at night while the camera follows"
    if device == "cuda":  # ≈1,500 tokens, like a JSON-upsampled prompt (common.LONG_PROMPT)
        from common import LONG_PROMPT as prompt
    run = resolve(Request(prompt=prompt, num_frames=total, frames_per_chunk=chunk, height=h, width=w, steps=steps,
                          seed=0, sound=sound, options=RuntimeOptions(compile=False)), pipe.info)
    with VideoWriter(path, 24.0, w, h, audio=sound) as writer:
        def sink(frames, audio):  # runs right after each window's decode: record the window, start the next
            writer.append(frames, audio)
            if cuda:
                torch.cuda.synchronize()
            windows.append(dict(window=len(windows) + 1, frames=int(frames.shape[0]),
                                wall_s=round(time.perf_counter() - state["start"], 2),
                                peak_gpu_gib=round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None,
                                host_rss_gib=host_rss_gib()))
            reset_peak()
            state["start"] = time.perf_counter()

        reset_peak()
        result = generate_long(pipe, run, [sink], progress=progress, device=device)
    for row, den, dec in zip(windows, result.timings["denoise"], result.timings["decode"]):
        row.update(denoise_s=round(den, 2), decode_and_write_s=round(dec, 2))
    info = probe_media(path)
    g = result.geometry
    return dict(height=h, width=w, total_frames=total, frames_per_chunk=chunk, conditional_frames=g.conditional_frames,
                num_windows=g.num_windows, steps=steps, sound=sound, windows=windows,
                file_frames=info["video_frames"], file_bytes=path.stat().st_size)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="results JSON")
    p.add_argument("--shapes", default=",".join(SHAPES), help=f"any of {', '.join(SHAPES)}")
    p.add_argument("--steps", type=int, default=35, help="denoising steps per window (peak memory does not depend on it)")
    p.add_argument("--sound", action="store_true", help="also generate (and stream) each window's sound track")
    p.add_argument("--tiny", action="store_true", help="tiny random checkpoint on the CPU: checks the script runs")
    args = p.parse_args()
    device = "cpu" if args.tiny else "cuda"
    shapes = TINY_SHAPES if args.tiny else {k: SHAPES[k] for k in args.shapes.split(",") if k}
    results = dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                   host=platform.node(), torch=torch.__version__,
                   gpu=torch.cuda.get_device_name() if device == "cuda" else None, shapes={})
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        with torch.inference_mode():
            pipe = load_pipeline(args.tiny, device, tmp)
            for name, shape in shapes.items():
                results["shapes"][name] = bench_shape(pipe, name, shape, steps=2 if args.tiny else args.steps,
                                                      sound=args.sound, device=device, out_dir=tmp)
                print(json.dumps(results["shapes"][name]), flush=True)
    Path(args.out).write_text(json.dumps(results, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

"""End-to-end T2V on N GPUs (CFG-parallel × Ulysses, tile-parallel VAE decode), full-size random-weight Nano.

Run once per layout under torchrun; each run appends one JSON line (per-stage seconds, peak memory per rank) to
``--out``. The 1-GPU line (``--nproc-per-node 1``, no flags) is the baseline of the scaling efficiencies that
``--render`` prints (speed-up ÷ GPUs, per stage)::

    torchrun --nproc-per-node 1 bench/bench_parallel.py --out bench/results/parallel.jsonl
    torchrun --nproc-per-node 2 bench/bench_parallel.py --cfg-parallel --out bench/results/parallel.jsonl
    torchrun --nproc-per-node 2 bench/bench_parallel.py --ulysses 2 --out bench/results/parallel.jsonl
    torchrun --nproc-per-node 4 bench/bench_parallel.py --cfg-parallel --ulysses 2 --out bench/results/parallel.jsonl
    torchrun --nproc-per-node 4 bench/bench_parallel.py --ulysses 4 --out bench/results/parallel.jsonl
    python bench/bench_parallel.py --render bench/results/parallel.jsonl

Each run resolves one ``Request`` (eager, ``RuntimeOptions()``) on the pipeline's checkpoint and runs it with
``cosmos3_core.parallel.run.generate`` (the clip's stages with a ``ParallelDenoiser`` and the tile-parallel decode);
a 1-step run of the same shape warms up first (``--no-warmup``: not). Every rank builds the same weights (seeded, on its own GPU), as common.py builds them for one GPU: Nano's
geometry, bf16, the Wan2.2 VAE at its released widths. Defaults: 1280×720, 189 frames, 35 steps, guidance 6,
common.py's long prompt and the checkpoint's default negative prompt. ``--tiny`` runs the tiny test checkpoint in fp32 at
64×96×9, 2 steps, on the CPU with gloo: it only checks that the script starts and finishes (no timing value).
Set ``NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1`` on the lent H200 machines.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def build_pipeline(tiny: bool, device: torch.device, tmp: Path):
    from cosmos3_core.pipeline import Cosmos3Pipeline
    from cosmos3_core.testing.tiny import build_tiny_checkpoint

    if tiny:
        files = build_tiny_checkpoint(tmp / "tiny", variant="nano", sound=False, seed=0)
        return Cosmos3Pipeline.load(files, dtype=torch.float32, device=device, with_sound=False)
    from common import build_ours, make_components
    from cosmos3_core.vae.video import Cosmos3VAE

    model = build_ours(str(device))  # seeded: the same weights on every rank
    torch.manual_seed(0)  # the VAE's default init, identical on every rank
    files, vae, _audio, tokenizer = make_components(str(device), tmp)
    return Cosmos3Pipeline(files, model, Cosmos3VAE(vae), tokenizer)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cfg-parallel", action="store_true")
    p.add_argument("--ulysses", type=int, default=1)
    p.add_argument("--tiny", action="store_true", help="tiny checkpoint on the CPU with gloo: a start-up check")
    p.add_argument("--height", type=int, default=720)
    p.add_argument("--width", type=int, default=1280)
    p.add_argument("--num-frames", type=int, default=189)
    p.add_argument("--steps", type=int, default=35)
    p.add_argument("--no-warmup", action="store_true", help="skip the 1-step warm-up run at the same shape")
    p.add_argument("--out", default=None, help="append one JSON line with the results (rank 0)")
    p.add_argument("--render", default=None, help="print a Markdown table from a results file and exit")
    args = p.parse_args()
    if args.render:
        print(render(Path(args.render)))
        return
    if args.tiny:
        args.height, args.width, args.num_frames, args.steps = 64, 96, 9, 2

    from dataclasses import replace

    from common import LONG_PROMPT
    from cosmos3_core.parallel.mesh import init_parallel
    from cosmos3_core.parallel.run import generate
    from cosmos3_core.request import Request
    from cosmos3_core.resolve import resolve
    from cosmos3_core.runtime import RuntimeOptions

    heads = (4, 2) if args.tiny else (32, 8)
    mesh = init_parallel(args.cfg_parallel, args.ulysses, guidance=6.0, num_heads=heads[0], num_kv_heads=heads[1],
                         device_type="cpu" if args.tiny else "cuda")
    cuda = mesh.device.type == "cuda"
    with tempfile.TemporaryDirectory() as tmp:
        pipe = build_pipeline(args.tiny, mesh.device, Path(tmp))
        request = Request(prompt=LONG_PROMPT, negative_prompt=None, num_frames=args.num_frames, height=args.height,
                          width=args.width, steps=args.steps, guidance=6.0, seed=0,
                          options=RuntimeOptions(compile=False))
        if not args.no_warmup:
            generate(pipe, resolve(replace(request, steps=1), pipe.info), mesh, decode=False)
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        out = generate(pipe, resolve(request, pipe.info), mesh)
        total = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0
    from cosmos3_core.parallel.mesh import all_gather_strings

    peaks = all_gather_strings(f"{peak:.2f}", mesh.device)
    row = dict(
        gpus=mesh.world_size, cfg=mesh.cfg, ulysses=mesh.ulysses, tiny=args.tiny,
        device=torch.cuda.get_device_name(mesh.device) if cuda else platform.processor() or "cpu",
        height=args.height, width=args.width, frames=args.num_frames, steps=args.steps,
        preprocess_s=round(out.timings["preprocess"], 2), denoise_s=round(out.timings["inference"], 2),
        vae_decode_s=round(out.timings["decode"], 2), total_s=round(total, 2),
        peak_gib_per_rank=[float(x) for x in peaks], frames_shape=list(out.frames.shape),
        torch=torch.__version__, date=time.strftime("%Y-%m-%d"),
    )
    if mesh.rank == 0:
        print(json.dumps(row), flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(row) + "\n")
    torch.distributed.destroy_process_group()


def render(path: Path) -> str:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    base = next((r for r in rows if r["gpus"] == 1 and not r["tiny"]), None)
    lines = ["| GPUs | cfg × ulysses | denoise s | VAE decode s | total s | efficiency (denoise / decode / total) | peak GiB |",
             "|---:|---|---:|---:|---:|---|---:|"]
    for r in rows:
        if r["tiny"]:
            continue
        eff = "–"
        if base and r is not base:
            e = [base[k] / r[k] / r["gpus"] for k in ("denoise_s", "vae_decode_s", "total_s")]
            eff = " / ".join(f"{x:.0%}" for x in e)
        lines.append(f"| {r['gpus']} | {r['cfg']} × {r['ulysses']} | {r['denoise_s']} | {r['vae_decode_s']} | "
                     f"{r['total_s']} | {eff} | {max(r['peak_gib_per_rank'])} |")
    return "\n".join(lines)


if __name__ == "__main__":
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")
    main()

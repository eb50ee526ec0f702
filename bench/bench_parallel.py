"""End-to-end T2V / T2AV on N GPUs (CFG-parallel × Ulysses × tensor parallel, tile-parallel VAE decode), full-size
random-weight Nano or Super.

Run once per layout under torchrun; each run appends one result (per-stage seconds, weight and peak memory per
rank) to ``--out`` (``.jsonl``: one JSON line; ``.json``: merged into the list the file holds). The 1-GPU line
(``--nproc-per-node 1``, no flags) is the baseline of the scaling efficiencies that ``--render`` prints (speed-up ÷
GPUs, per stage). bench/README.md lists the commands of each multi-GPU run (issue 42)::

    torchrun --nproc-per-node 1 bench/bench_parallel.py --out bench/results/parallel.json
    torchrun --nproc-per-node 2 bench/bench_parallel.py --cfg-parallel --out bench/results/parallel.json
    torchrun --nproc-per-node 2 bench/bench_parallel.py --tp 2 --out bench/results/parallel.json
    torchrun --nproc-per-node 4 bench/bench_parallel.py --cfg-parallel --tp 2 --out bench/results/parallel.json
    torchrun --nproc-per-node 2 bench/bench_parallel.py --model super --tp 2 --out bench/results/parallel.json
    python bench/bench_parallel.py --render bench/results/parallel.json
    python bench/bench_parallel.py --memory-table          # the computed per-GPU memory of each layout (no GPU)

Each run resolves one ``Request`` (eager unless ``--compile on``) and runs it with
``cosmos3_core.parallel.run.generate`` (the clip's stages with a ``ParallelDenoiser`` and the tile-parallel decode);
a 1-step run of the same shape warms up first (``--no-warmup``: not). Every rank builds the same weights as
common.py builds them for one GPU (seeded, drawn on its own GPU): Nano's or Super's geometry, bf16, the Wan2.2 VAE
at its released widths; with ``--tp`` each rank draws every tensor whole and keeps only its slice
(``common.build_sharded``), so a sharded Nano has the one-GPU run's weights and a Super never sits whole on a GPU.
``--save-latents`` writes rank 0's final latents; ``--compare`` reads such a file (the one-GPU run of the same
shape and seed) and adds the relative difference and the cosine to the result. Defaults: 1280×720, 189 frames, 35
steps, guidance 6, common.py's long prompt and the checkpoint's default negative prompt; ``--sound``: T2AV.
``--tiny`` runs the tiny test checkpoints in fp32 at 64×96×9, 2 steps, on the CPU with gloo (``--model super``: the
Super-shaped one, loaded sharded from its files): it only checks that the script starts and finishes.
Set ``NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1`` on the lent H200 machines
(the script sets them when they are unset).
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

GEOMETRIES = ("nano", "super")


def geometry(model: str) -> dict:
    from cosmos3_core.testing.fullsize import NANO, SUPER

    return NANO if model == "nano" else SUPER


def build_pipeline(args, mesh, tmp: Path):
    from cosmos3_core.config import Cosmos3Config
    from cosmos3_core.parallel.tensor import TensorParallel
    from cosmos3_core.pipeline import Cosmos3Pipeline
    from cosmos3_core.testing.tiny import build_tiny_checkpoint

    if args.tiny:
        files = build_tiny_checkpoint(tmp / "tiny", variant=args.model, sound=args.sound, seed=0)
        sharding = TensorParallel(mesh.tp_mesh, Cosmos3Config.from_checkpoint(files)) if sharded(args, mesh) else None
        return Cosmos3Pipeline.load(files, dtype=torch.float32, device=mesh.device, with_sound=args.sound,
                                    sharding=sharding)
    from common import build_sharded, make_components
    from cosmos3_core.vae.audio import Cosmos3SoundDecoder
    from cosmos3_core.vae.video import Cosmos3VAE

    config = Cosmos3Config.from_dict(geometry(args.model))
    sharding = TensorParallel(mesh.tp_mesh, config) if sharded(args, mesh) else None
    model = build_sharded(geometry(args.model), str(mesh.device), sharding)  # seeded: the same on every rank
    torch.manual_seed(0)  # the VAE's default init, identical on every rank
    files, vae, audio, tokenizer = make_components(str(mesh.device), tmp)
    return Cosmos3Pipeline(files, model, Cosmos3VAE(vae), tokenizer, Cosmos3SoundDecoder(audio) if args.sound else None)


def sharded(args, mesh) -> bool:
    return mesh.tp > 1 or args.tp_path


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cfg-parallel", action="store_true")
    p.add_argument("--ulysses", type=int, default=1)
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel degree")
    p.add_argument("--tp-path", action="store_true",
                   help="shard with DTensor even at --tp 1 (the tensor-parallel code path on one GPU: must equal the "
                        "plain run)")
    p.add_argument("--compile", choices=("off", "on", "auto"), default="off",
                   help="RuntimeOptions.compile (default off: eager; the 1-step warm-up absorbs the compile)")
    p.add_argument("--model", choices=GEOMETRIES, default="nano", help="the random weights' geometry")
    p.add_argument("--sound", action="store_true", help="T2AV (a sound track too)")
    p.add_argument("--tiny", action="store_true", help="tiny checkpoint on the CPU with gloo: a start-up check")
    p.add_argument("--height", type=int, default=720)
    p.add_argument("--width", type=int, default=1280)
    p.add_argument("--num-frames", type=int, default=189)
    p.add_argument("--steps", type=int, default=35)
    p.add_argument("--no-warmup", action="store_true", help="skip the 1-step warm-up run at the same shape")
    p.add_argument("--save-latents", default=None, help="write rank 0's final latents (.safetensors)")
    p.add_argument("--compare", default=None, help="a --save-latents file to compare the final latents with")
    p.add_argument("--out", default=None, help="add the result to this file (.jsonl: a line; .json: the list)")
    p.add_argument("--render", default=None, help="print a Markdown table from a results file and exit")
    p.add_argument("--memory-table", action="store_true", help="print the computed per-GPU memory table and exit")
    args = p.parse_args()
    if args.tiny:
        args.height, args.width, args.num_frames, args.steps = 64, 96, 9, 2
    return args


def main() -> None:
    args = parse_args()
    if args.render:
        print(render(Path(args.render)))
        return
    if args.memory_table:
        print(memory_table())
        return
    from dataclasses import replace

    from common import LONG_PROMPT
    from cosmos3_core.config import Cosmos3Config
    from cosmos3_core.parallel.mesh import init_parallel
    from cosmos3_core.parallel.run import generate
    from cosmos3_core.request import Request
    from cosmos3_core.resolve import resolve
    from cosmos3_core.runtime import RuntimeOptions
    from cosmos3_core.testing.tiny import transformer_config

    config = Cosmos3Config.from_dict(transformer_config(args.model, args.sound, 128) if args.tiny
                                     else geometry(args.model))
    mesh = init_parallel(args.cfg_parallel, args.ulysses, tp=args.tp, guidance=6.0,
                         num_heads=config.num_attention_heads, num_kv_heads=config.num_key_value_heads,
                         device_type="cpu" if args.tiny else "cuda")
    cuda = mesh.device.type == "cuda"
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        pipe = build_pipeline(args, mesh, Path(tmp))
        build_s = time.perf_counter() - start
        request = Request(prompt=LONG_PROMPT, negative_prompt=None, num_frames=args.num_frames, height=args.height,
                          width=args.width, steps=args.steps, guidance=6.0, seed=0, sound=args.sound,
                          options=RuntimeOptions(compile=args.compile))
        if not args.no_warmup:
            generate(pipe, resolve(replace(request, steps=1), pipe.info), mesh, decode=False)
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        out = generate(pipe, resolve(request, pipe.info), mesh)
        total = time.perf_counter() - start
    row = result_row(args, mesh, pipe, out, total, build_s)
    if mesh.rank == 0:
        if args.save_latents:
            from safetensors.torch import save_file

            save_file({"latents": out.latents.float().cpu().contiguous()}, args.save_latents)
        print(json.dumps(row), flush=True)
        if args.out:
            add_result(Path(args.out), row)
    torch.distributed.destroy_process_group()


def result_row(args, mesh, pipe, out, total: float, build_s: float) -> dict:
    """The run's result (the same on every rank; the per-rank lists gathered)."""
    from common import git_commit
    from cosmos3_core.parallel.mesh import all_gather_strings
    from cosmos3_core.parallel.sizing import GIB, per_rank_parameters
    from cosmos3_core.parallel.tensor import local_parameter_bytes

    cuda = mesh.device.type == "cuda"
    peak = torch.cuda.max_memory_allocated() / GIB if cuda else 0.0
    weights = local_parameter_bytes(pipe.transformer) / GIB
    peaks = all_gather_strings(f"{peak:.2f}", mesh.device)
    weight_gib = all_gather_strings(f"{weights:.2f}", mesh.device)
    card_gib = torch.cuda.get_device_properties(mesh.device).total_memory / GIB if cuda else 0.0
    whole = per_rank_parameters(pipe.config, 1).bytes() / GIB
    layout = " × ".join([f"CFG {mesh.cfg}"] * (mesh.cfg > 1) + [f"Ulysses {mesh.ulysses}"] * (mesh.ulysses > 1)
                        + [f"TP {mesh.tp}"] * (mesh.tp > 1)) or "1 GPU"
    row = dict(
        model=args.model, gpus=mesh.world_size, layout=layout + (" (TP code path)" if args.tp_path else ""),
        cfg=mesh.cfg, ulysses=mesh.ulysses, tp=mesh.tp, tiny=args.tiny, sound=args.sound, compile=args.compile,
        device=torch.cuda.get_device_name(mesh.device) if cuda else platform.processor() or "cpu",
        height=args.height, width=args.width, frames=args.num_frames, steps=args.steps,
        build_s=round(build_s, 1), preprocess_s=round(out.timings["preprocess"], 2),
        denoise_s=round(out.timings["inference"], 2), step_s=round(out.timings["inference"] / args.steps, 3),
        vae_decode_s=round(out.timings["decode"], 2), total_s=round(total, 2),
        weights_gib_per_rank=[float(x) for x in weight_gib], peak_gib_per_rank=[float(x) for x in peaks],
        whole_model_gib_bf16=round(whole, 1), card_gib=round(card_gib, 1),
        one_card_holds_the_weights=bool(cuda and whole < card_gib), frames_shape=list(out.frames.shape),
        torch=torch.__version__, commit=git_commit(), date=time.strftime("%Y-%m-%d"),
    )
    if args.compare:
        row["vs_reference"] = compare(out.latents, Path(args.compare))
    return row


def compare(latents: torch.Tensor, path: Path) -> dict:
    """Relative L2 difference and cosine of ``latents`` against the ``--save-latents`` file ``path``."""
    from safetensors.torch import load_file

    ref = load_file(str(path))["latents"].float()
    got = latents.float().cpu()
    rel = float((got - ref).norm() / ref.norm())
    cosine = float(torch.nn.functional.cosine_similarity(got.flatten(), ref.flatten(), dim=0))
    return dict(reference=path.name, rel=float(f"{rel:.3g}"), cosine=float(f"{cosine:.9f}"))


def add_result(path: Path, row: dict) -> None:
    """``.jsonl``: append a line; otherwise merge into the JSON list the file holds (created if missing)."""
    if path.suffix == ".jsonl":
        with open(path, "a") as f:
            f.write(json.dumps(row) + "\n")
        return
    rows = json.loads(path.read_text()) if path.is_file() else []
    path.write_text(json.dumps([*rows, row], indent=1) + "\n")


def read_results(path: Path) -> list[dict]:
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return json.loads(path.read_text())


def render(path: Path) -> str:
    rows = [r for r in read_results(path) if not r["tiny"]]
    lines = ["| card | model | GPUs | layout | sound | denoise s | VAE decode s | total s | efficiency (denoise / "
             "decode / total) | weights GiB/GPU | peak GiB/GPU |",
             "|---|---|---:|---|---|---:|---:|---:|---|---:|---:|"]
    for r in rows:
        base = next((b for b in rows if b["gpus"] == 1 and b["device"] == r["device"] and b.get("model", "nano")
                     == r.get("model", "nano") and b.get("sound") == r.get("sound")), None)
        eff = "–"
        if base and r is not base:
            e = [base[k] / r[k] / r["gpus"] for k in ("denoise_s", "vae_decode_s", "total_s")]
            eff = " / ".join(f"{x:.0%}" for x in e)
        layout = r.get("layout") or f"CFG {r['cfg']} × Ulysses {r['ulysses']}"
        weights = max(r["weights_gib_per_rank"]) if "weights_gib_per_rank" in r else "–"
        sound = "T2AV" if r.get("sound") else "T2V"
        lines.append(f"| {r['device']} | {r.get('model', 'nano')} | {r['gpus']} | {layout} | {sound} | "
                     f"{r['denoise_s']} | {r['vae_decode_s']} | {r['total_s']} | {eff} | {weights} | "
                     f"{max(r['peak_gib_per_rank'])} |")
    return "\n".join(lines)


LAYOUTS = {  # GPUs: (cfg_parallel, ulysses, tp) — the layouts the docs' table compares
    1: [(False, 1, 1)],
    2: [(True, 1, 1), (False, 1, 2)],
    4: [(True, 2, 1), (True, 1, 2), (False, 1, 4)],
    8: [(True, 4, 1), (True, 1, 4), (False, 1, 8)],
}
SHAPES = {"480p/93f": (480, 832, 93), "720p/189f": (720, 1280, 189)}
TEXT_TOKENS = [1500, 60]  # a JSON-upsampled prompt and the default negative (common.py's lengths)


def memory_table() -> str:
    """Per GPU, computed (``parallel.sizing``): bf16 weights (an FP8 ModelOpt checkpoint's in brackets) and
    one guided T2V step's working memory at each shape, for Nano and Super in each layout."""
    from cosmos3_core.config import Cosmos3Config
    from cosmos3_core.model.layout import patch_grid
    from cosmos3_core.parallel.sizing import GIB, per_rank_parameters, per_rank_step_bytes

    lines = ["| model | GPUs | layout | weights GiB/GPU bf16 (FP8) | + step 480p/93f | + step 720p/189f |",
             "|---|---:|---|---:|---:|---:|"]
    for model in GEOMETRIES:
        config = Cosmos3Config.from_dict(geometry(model))
        for gpus, layouts in LAYOUTS.items():
            for cfg, u, tp in layouts:
                counts = per_rank_parameters(config, tp)
                steps = []
                for h, w, f in SHAPES.values():
                    t, ph, pw = patch_grid(((f - 1) // 4 + 1, h // 16, w // 16), config.latent_patch_size)
                    steps.append(per_rank_step_bytes(config, t * ph * pw, TEXT_TOKENS, cfg_parallel=cfg, ulysses=u,
                                                     tp=tp) / GIB)
                name = " × ".join(["CFG 2"] * cfg + [f"Ulysses {u}"] * (u > 1) + [f"TP {tp}"] * (tp > 1)) or "1 GPU"
                lines.append(f"| {model} | {gpus} | {name} | {counts.bytes() / GIB:.1f} ({counts.bytes(1) / GIB:.1f}) "
                             f"| {steps[0]:.1f} | {steps[1]:.1f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")
    main()

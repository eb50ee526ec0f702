"""Weight storage dtype (the loader's ``weight_dtype``): memory and speed of bf16 vs fp8_e4m3fn weights on a GPU.

Runs what the node graph runs (text encode → sampler → VAE decode → sound decode) through this pack's
``Cosmos3ModelHandle`` and ComfyUI's model management, exactly as ``bench_lowvram.py`` does, once with bf16 linear
weights and once with fp8_e4m3fn storage (computed in bf16 through ``comfy.ops.manual_cast`` — what the loader
builds for ``weight_dtype=fp8_e4m3fn``). Full-size random Nano weights (bench_lowvram's), no download.

Cases (``--cases``, default all): ``h200_480p`` (Nano 480p/93f on the whole card), ``h200_720p`` (720p/189f on the
whole card), ``card16_480p`` (a simulated 16 GiB card: the rest of the GPU held). Reports per case and dtype:
generation/text tower sizes as ComfyUI counts them, per-phase peak GPU memory of this process, seconds, and
whether it fit.

    python bench/bench_weights.py --comfyui ~/.cache/cosmos3/venv/ComfyUI --out bench/results_weights.json
    python bench/bench_weights.py --comfyui ~/.cache/cosmos3/venv/ComfyUI --tiny   # CPU check of the script

``--tiny`` runs the same phases on the CPU with the tiny random checkpoint loaded through the loader's own path
(``Cosmos3ModelHandle.load(..., storage_dtype)``) at 96×64/9 frames: no memory numbers, only that every phase runs
and the fp8/bf16 ratio of the generation tower's linear weight bytes (0.5).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

CASES = {"h200_480p": ("480p", None), "h200_720p": ("720p", None), "card16_480p": ("480p", 16.0)}
DTYPES = {"bf16": torch.bfloat16, "fp8_e4m3fn": torch.float8_e4m3fn}
TINY_SHAPE = (64, 96, 9)


def gib(n: int) -> float:
    return round(n / 2**30, 3)


def linear_bytes(patcher) -> int:
    """Bytes of the linear weights that follow ``weight_dtype`` (the fp32 time embedder excluded)."""
    return sum(m.weight.numel() * m.weight.element_size() for m in patcher.model.modules()
               if isinstance(m, torch.nn.Linear) and m.weight is not None and m.weight.dtype != torch.float32)


def store_linear_weights(pipe, storage: torch.dtype) -> None:
    """Round every transformer linear weight to ``storage`` in place (the time embedder stays fp32), as the
    loader's ``storage_dtype`` does when it reads a checkpoint."""
    if storage == torch.bfloat16:
        return
    for name, m in pipe.transformer.named_modules():
        if isinstance(m, torch.nn.Linear) and not name.startswith("time_embedder"):
            m.weight.data = m.weight.data.to(storage)


def run_case(handle, mm, shape, vram_gib, steps: int, cuda: bool) -> dict:
    from common import LONG_PROMPT

    pipe = handle.pipeline
    h, w, frames = shape
    mm.unload_all_models()
    gc.collect()
    hold, block, before = 0, None, 0
    if cuda:
        torch.cuda.empty_cache()
        before = torch.cuda.memory_allocated()  # left over from earlier cases: counts against the simulated card
        if vram_gib is not None:
            free, _ = torch.cuda.mem_get_info()
            hold = int(free - (vram_gib - 0.5) * 2**30 + before)  # 0.5 GiB: what a real card's context keeps
            block = torch.empty(hold, dtype=torch.uint8, device="cuda")
    out = dict(height=h, width=w, frames=frames, vram_gib=vram_gib, allocated_before_gib=gib(before),
               generation_tower_gib=gib(handle.generation_patcher.model_size()),
               generation_linear_bytes=linear_bytes(handle.generation_patcher),
               text_tower_gib=gib(handle.text_patcher.model_size()))
    text_shape = dict(num_frames=frames, height=h, width=w, fps=24.0)

    def phase(label, fn):
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        result = fn()
        if cuda:
            torch.cuda.synchronize()
        out[label] = dict(seconds=round(time.perf_counter() - t0, 2))
        if cuda:
            out[label]["peak_gib"] = gib(torch.cuda.max_memory_allocated() - hold)
        return result

    try:
        def encode():
            ids = pipe.tokenize(LONG_PROMPT, None, **text_shape)
            handle.load_text_tower(text_length=ids.prefill_tokens)
            return pipe.prefill_prompts(ids, **text_shape).to(mm.intermediate_device())

        text = phase("text_encode", encode)

        def sample():
            plan = pipe.plan(text, seed=0, steps=steps, guidance=6.0, sound=pipe.supports_sound,
                             device=handle.generation_device)
            handle.load_generation_tower(plan.memory_required)
            return pipe.run(plan)

        result = phase("sample", sample)
        out["sample"]["steps"] = steps

        def decode():
            handle.load_vae(result.latents.shape)
            return pipe.decode_video(result.latents)

        video = phase("vae_decode", decode)
        out["frames_shape"] = list(video.shape)
        if result.sound is not None:
            def sound():
                handle.load_sound_decoder()
                return pipe.decode_sound(result.sound, frames, 24.0)

            phase("sound_decode", sound)
        if cuda:
            out["peak_gib"] = max(v["peak_gib"] for v in out.values() if isinstance(v, dict) and "peak_gib" in v)
            # the held block leaves exactly the card's budget (leftovers included): finishing without an
            # out-of-memory error is fitting; the peak includes what earlier cases left allocated
            out["fits"] = True
    except Exception as exc:  # an out-of-memory is the finding: report it
        out["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
    finally:
        del block
        mm.unload_all_models()
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--comfyui", required=True, help="a ComfyUI tree (main.py, comfy/)")
    p.add_argument("--cases", default=",".join(CASES), help=f"comma separated, of {list(CASES)}")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--tiny", action="store_true", help="CPU check of the script on the tiny checkpoint")
    p.add_argument("--out", default="weights.json")
    args = p.parse_args()

    sys.path.insert(0, str(Path(args.comfyui).resolve()))
    sys.argv = sys.argv[:1]  # ComfyUI's argument parser reads sys.argv at import
    from comfy.cli_args import args as comfy_args

    comfy_args.cpu = args.tiny  # before comfy.model_management picks its device
    import comfy.model_management as mm
    import comfy.ops

    from bench_lowvram import import_pack, random_nano_pipeline

    handle_cls = import_pack()
    from cosmos3_pack.cosmos3_core.testing.tiny import build_tiny_checkpoint

    cuda = not args.tiny
    results = dict(torch=torch.__version__, gpu=torch.cuda.get_device_name() if cuda else "cpu", runs=[])
    with tempfile.TemporaryDirectory() as tmp:
        files = build_tiny_checkpoint(Path(tmp) / "files", variant="nano", seed=0)
        for dtype_name, storage in DTYPES.items():
            t0 = time.perf_counter()
            if args.tiny:  # the loader's own path: checkpoint → storage dtype at load
                handle = handle_cls.load("tiny", files, torch.float32, "cpu", storage)
                cases = {"tiny_cpu": (TINY_SHAPE, None)}
            else:
                cast = storage != torch.bfloat16  # the loader's choice of layer class
                pipe = random_nano_pipeline(files, comfy.ops.manual_cast.Linear if cast
                                            else comfy.ops.disable_weight_init.Linear)
                store_linear_weights(pipe, storage)
                handle = handle_cls.from_pipeline("nano-random", files, torch.bfloat16, pipe)
                from common import RESOLUTIONS

                cases = {c: (RESOLUTIONS[CASES[c][0]], CASES[c][1]) for c in args.cases.split(",")}
            init_s = round(time.perf_counter() - t0, 1)
            for case, (shape, vram) in cases.items():
                row = dict(case=case, weight_dtype=dtype_name, init_s=init_s,
                           **run_case(handle, mm, shape, vram, args.steps, cuda))
                results["runs"].append(row)
                print(json.dumps(row), flush=True)
                Path(args.out).write_text(json.dumps(results, indent=1))
            del handle
            gc.collect()
    runs = {r["weight_dtype"]: r for r in results["runs"] if r["case"] == results["runs"][0]["case"]}
    if len(runs) == 2:
        ratio = runs["fp8_e4m3fn"]["generation_linear_bytes"] / max(runs["bf16"]["generation_linear_bytes"], 1)
        print(f"fp8/bf16 generation-tower linear bytes: {ratio:.3f}", flush=True)


if __name__ == "__main__":
    main()

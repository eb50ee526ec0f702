"""Cosmos3-Nano on a small GPU through ComfyUI's model management: does it fit, how fast is it, and what does the
loader's ``weight_dtype`` (bf16 vs fp8_e4m3fn linear-weight storage) change?

Runs what the node graph runs (text encode → sampler → VAE decode → sound decode) with this pack's
``Cosmos3ModelHandle`` — the four ModelPatchers and memory estimates the nodes use — on full-size random bf16 Nano
weights kept on the CPU as ComfyUI's offload device. ComfyUI (``--comfyui``, e.g. the tree ``tests/run.sh``
installs) decides what is resident: it evicts the text tower for the generation tower and loads a tower partially
when it does not fit, the rest of its linear layers streaming their weights from pinned CPU memory at every call
(``comfy.ops`` Linear).

Simulated cards (default): a card of ``--vram-gib`` GiB on a big GPU, made by holding the rest of its memory.
Reports, per phase, peak GPU memory *of this process* (the held block excluded), how much of each tower was
resident, and seconds (denoising steps after the first averaged and extrapolated to 35 where fewer are run).

    PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync \
        python bench/bench_lowvram.py --comfyui ~/.cache/cosmos3/venv/ComfyUI --vram-gib 24,16 --out bench/results/lowvram.json

Set the allocator in the environment as ComfyUI would (its ``main.py`` picks ``backend:cudaMallocAsync`` on CUDA
builds of torch unless told otherwise); torch reads it when it loads.

Weight storage (``--weight-storage``): the same phases once with bf16 linear weights and once with fp8_e4m3fn storage
(computed in bf16 through ``comfy.ops.manual_cast`` — what the loader builds for ``weight_dtype=fp8_e4m3fn``).
Cases (``--cases``, default all): ``h200_480p`` (Nano 480p/93f on the whole card), ``h200_720p`` (720p/189f on the
whole card), ``card16_480p`` (a simulated 16 GiB card: the rest of the GPU held). Reports per case and dtype:
generation/text tower sizes as ComfyUI counts them, per-phase peak GPU memory of this process, seconds, and
whether it fit. ``--tiny`` runs the same phases on the CPU with the tiny random checkpoint loaded through the
loader's own path (``Cosmos3ModelHandle.load(..., storage_dtype)``) at 96×64/9 frames: no memory numbers, only that
every phase runs and the fp8/bf16 ratio of the generation tower's linear weight bytes (0.5).

    python bench/bench_lowvram.py --comfyui ~/.cache/cosmos3/venv/ComfyUI --weight-storage --out bench/results/weights.json
    python bench/bench_lowvram.py --comfyui ~/.cache/cosmos3/venv/ComfyUI --weight-storage --cases card16_480p \
        --out bench/results/weights_card16.json     # the 16 GiB case alone, in a fresh process
    python bench/bench_lowvram.py --comfyui ~/.cache/cosmos3/venv/ComfyUI --weight-storage --tiny --out /tmp/w.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
import types
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from common import LONG_PROMPT, NANO, RESOLUTIONS, WAN22_VAE, gib  # noqa: E402

CONTEXT_GIB = 0.5  # what a real card's CUDA context and driver keep of its nominal size
CASES = {"h200_480p": ("480p", None), "h200_720p": ("720p", None), "card16_480p": ("480p", 16.0)}
DTYPES = {"bf16": torch.bfloat16, "fp8_e4m3fn": torch.float8_e4m3fn}
TINY_SHAPE = (64, 96, 9)


def pack_api():
    """``cosmos3_core.api`` of the pack as ComfyUI imports it (one copy of its classes)."""
    from cosmos3_pack.cosmos3_core import api

    return api


def import_pack():
    """The pack as ComfyUI imports it (a package, relative imports intact), without its node registration."""
    for name, path in (("cosmos3_pack", REPO), ("cosmos3_pack.nodes", REPO / "nodes")):
        module = types.ModuleType(name)
        module.__path__ = [str(path)]
        sys.modules[name] = module
    from cosmos3_pack.nodes.model_handle import Cosmos3ModelHandle

    return Cosmos3ModelHandle


def random_nano_pipeline(files: Path, linear):
    """Full-size Nano with seeded random bf16 weights on the CPU (ComfyUI's offload device), built with ComfyUI's
    Linear like the loader node does, plus a random Wan2.2 VAE and the AVAE sound decoder."""
    from cosmos3_pack.cosmos3_core.config import Cosmos3Config
    from cosmos3_pack.cosmos3_core.model.layers import KEEP_FP32
    from cosmos3_pack.cosmos3_core.model.transformer import Cosmos3Transformer
    from cosmos3_pack.cosmos3_core.pipeline import Cosmos3Pipeline
    from cosmos3_pack.cosmos3_core.sampling.prompt import load_tokenizer
    from cosmos3_pack.cosmos3_core.vae.audio import Cosmos3SoundDecoder
    from cosmos3_pack.cosmos3_core.vae.video import Cosmos3VAE
    from diffusers import AutoencoderKLWan, Cosmos3AVAEAudioTokenizer

    skip = ("lm_head", "action_proj_in", "action_proj_out", "action_modality_embed")
    with torch.device("meta"):
        model = Cosmos3Transformer(Cosmos3Config.from_dict(NANO), skip_modules=skip, linear=linear)
    model = model.to(torch.bfloat16).to_empty(device="cpu")
    g = torch.Generator("cuda").manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():  # drawn on the GPU (fast), kept on the CPU
            if p.ndim == 1 and "norm" in name:
                p.copy_((1.0 + 0.05 * torch.randn(p.shape, generator=g, device="cuda")).cpu())
            else:
                p.copy_((0.02 * torch.randn(p.shape, generator=g, device="cuda", dtype=torch.bfloat16)).cpu())
    for name in KEEP_FP32:  # the fp32 modules stay fp32 (a bf16 time embedder degrades video)
        getattr(model, name).float()
    model.eval().requires_grad_(False)
    vae = AutoencoderKLWan(**WAN22_VAE).to(dtype=torch.bfloat16).eval().requires_grad_(False)
    audio = Cosmos3AVAEAudioTokenizer().eval().requires_grad_(False)
    audio.register_to_config(encoder_enabled=False)
    return Cosmos3Pipeline(files, model, Cosmos3VAE(vae), load_tokenizer(files), Cosmos3SoundDecoder(audio))


def resident(patcher) -> dict:
    total = patcher.model_size()
    loaded = patcher.loaded_size()
    return dict(resident_gib=gib(loaded), of_gib=gib(total), streamed=bool(getattr(patcher.model, "model_lowvram", False)))


def run(handle, mm, name: str, vram_gib: float, steps: int) -> dict:
    pipe = handle.pipeline
    h, w, frames = RESOLUTIONS[name]
    mm.unload_all_models()
    gc.collect()
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info()
    hold = int(free - (vram_gib - CONTEXT_GIB) * 2**30)
    block = torch.empty(hold, dtype=torch.uint8, device="cuda")
    out = dict(vram_gib=vram_gib, free_gib_seen_by_comfyui=gib(mm.get_free_memory(mm.get_torch_device())))
    shape = dict(num_frames=frames, height=h, width=w, fps=24.0)

    def phase(label, fn):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        result = fn()
        torch.cuda.synchronize()
        out[label] = dict(seconds=round(time.perf_counter() - t0, 2),
                          peak_gib=gib(torch.cuda.max_memory_allocated() - hold),
                          peak_reserved_gib=gib(torch.cuda.max_memory_reserved() - hold))
        return result

    try:
        def encode():
            ids = pipe.tokenize(LONG_PROMPT, None, **shape)
            handle.load_text_tower(text_length=ids.prefill_tokens)
            text = pipe.prefill_prompts(ids, **shape)
            return text.to(mm.intermediate_device())

        text = phase("text_encode", encode)
        out["text_encode"]["text_tower"] = resident(handle.text_patcher)
        stamps = []

        def sample():
            plan = pack_api().plan(pipe, text, seed=0, steps=steps, guidance=6.0, sound=True, device=handle.generation_device)
            handle.load_generation_tower(plan.memory_required)
            return pipe.run(plan, callback=lambda *_: (torch.cuda.synchronize(), stamps.append(time.perf_counter())))

        result = phase("sample", sample)
        per_step = (stamps[-1] - stamps[0]) / (len(stamps) - 1)
        out["sample"].update(steps=steps, step_s=round(per_step, 3), generation_tower=resident(handle.generation_patcher),
                             text_tower_after=resident(handle.text_patcher),
                             projected_35_steps_s=round(out["sample"]["seconds"] + per_step * (35 - steps), 1))

        def decode():
            handle.load_vae(result.latents.shape)
            return pipe.decode_video(result.latents)

        out["vae_decode_memory_required_gib"] = gib(pipe.vae.memory_required(result.latents.shape))
        video = phase("vae_decode", decode)
        out["vae_decode"]["generation_tower_after"] = resident(handle.generation_patcher)

        def sound():
            handle.load_sound_decoder()
            return pipe.decode_sound(result.sound, frames, 24.0)

        wave = phase("sound_decode", sound)
        out.update(frames_shape=list(video.shape), audio_samples=int(wave.shape[-1]),
                   peak_gib=max(out[k]["peak_gib"] for k in ("text_encode", "sample", "vae_decode", "sound_decode")))
        out["fits"] = out["peak_gib"] <= vram_gib - CONTEXT_GIB
    except Exception as exc:  # an out-of-memory or placement error is the finding: report it
        out["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
        out["at_error"] = dict(
            allocated_gib=gib(torch.cuda.memory_allocated() - hold), reserved_gib=gib(torch.cuda.memory_reserved() - hold),
            text_tower=resident(handle.text_patcher), generation_tower=resident(handle.generation_patcher),
            vae=resident(handle.vae_patcher))
    finally:
        del block
        mm.unload_all_models()
        gc.collect()
        torch.cuda.empty_cache()
    return out


# ------------------------------------------------------------------------------------------------ weight storage
def gib3(n: int) -> float:
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
    out = dict(height=h, width=w, frames=frames, vram_gib=vram_gib, allocated_before_gib=gib3(before),
               generation_tower_gib=gib3(handle.generation_patcher.model_size()),
               generation_linear_bytes=linear_bytes(handle.generation_patcher),
               text_tower_gib=gib3(handle.text_patcher.model_size()))
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
            out[label]["peak_gib"] = gib3(torch.cuda.max_memory_allocated() - hold)
        return result

    try:
        def encode():
            ids = pipe.tokenize(LONG_PROMPT, None, **text_shape)
            handle.load_text_tower(text_length=ids.prefill_tokens)
            return pipe.prefill_prompts(ids, **text_shape).to(mm.intermediate_device())

        text = phase("text_encode", encode)

        def sample():
            plan = pack_api().plan(pipe, text, seed=0, steps=steps, guidance=6.0, sound=pipe.info.has_sound,
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


def cards_main(args) -> None:
    """Each simulated card size in turn (the default mode)."""
    import comfy.model_management as mm
    import comfy.ops

    handle_cls = import_pack()
    from cosmos3_pack.cosmos3_core.testing.tiny import build_tiny_checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        files = build_tiny_checkpoint(Path(tmp) / "files", variant="nano", seed=0)  # tokenizer, scheduler configs
        t0 = time.perf_counter()
        pipe = random_nano_pipeline(files, comfy.ops.disable_weight_init.Linear)
        handle = handle_cls.from_pipeline("nano-random", files, torch.bfloat16, pipe)
        results = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, resolution=args.resolution,
                       allocator=os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "native"),
                       init_s=round(time.perf_counter() - t0, 1), runs=[])
        for vram in [float(v) for v in args.vram_gib.split(",")]:
            results["runs"].append(run(handle, mm, args.resolution, vram, args.steps))
            print(json.dumps(results["runs"][-1]), flush=True)
            Path(args.out).write_text(json.dumps(results, indent=1))
    os.sync()


def weight_storage_main(args) -> None:
    """bf16 then fp8_e4m3fn storage, each over the chosen cases (``--weight-storage``)."""
    from comfy.cli_args import args as comfy_args

    comfy_args.cpu = args.tiny  # before comfy.model_management picks its device
    import comfy.model_management as mm
    import comfy.ops

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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--comfyui", required=True, help="a ComfyUI tree (main.py, comfy/)")
    p.add_argument("--vram-gib", default="24", help="card sizes to simulate, comma separated")
    p.add_argument("--resolution", default="480p", choices=sorted(RESOLUTIONS))
    p.add_argument("--weight-storage", action="store_true",
                   help="bf16 vs fp8_e4m3fn linear-weight storage over --cases instead of the simulated cards")
    p.add_argument("--cases", default=",".join(CASES), help=f"--weight-storage: comma separated, of {list(CASES)}")
    p.add_argument("--steps", type=int, default=None, help="denoising steps run (default 4; --weight-storage: 3)")
    p.add_argument("--tiny", action="store_true", help="--weight-storage: CPU check of the script, tiny checkpoint")
    p.add_argument("--out", required=True, help="results JSON")
    args = p.parse_args()
    if args.tiny and not args.weight_storage:
        p.error("--tiny checks the --weight-storage mode; add --weight-storage")
    if not args.tiny and not torch.cuda.is_available():
        p.error("the simulated cards and --weight-storage need a CUDA GPU; add --weight-storage --tiny for a CPU "
                "check of the script")
    args.steps = args.steps or (3 if args.weight_storage else 4)

    sys.path.insert(0, str(Path(args.comfyui).resolve()))
    sys.argv = sys.argv[:1]  # ComfyUI's argument parser reads sys.argv at import
    (weight_storage_main if args.weight_storage else cards_main)(args)


if __name__ == "__main__":
    main()

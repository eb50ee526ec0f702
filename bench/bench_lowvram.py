"""Cosmos3-Nano on a small GPU through ComfyUI's model management: does it fit, and how fast is it?

Simulates a card of ``--vram-gib`` GiB on a big GPU by holding the rest of its memory, then runs what the node graph
runs (text encode → sampler → VAE decode → sound decode) with this pack's ``Cosmos3ModelHandle`` — the four
ModelPatchers and memory estimates the nodes use — on full-size random bf16 Nano weights kept on the CPU as
ComfyUI's offload device. ComfyUI (``--comfyui``, e.g. the tree ``tests/run.sh`` installs) decides what is resident:
it evicts the text tower for the generation tower and loads a tower partially when it does not fit, the rest of its
linear layers streaming their weights from pinned CPU memory at every call (``comfy.ops`` Linear).

Reports, per phase, peak GPU memory *of this process* (the held block excluded), how much of each tower was
resident, and seconds (denoising steps after the first averaged and extrapolated to 35 where fewer are run).

    PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync \
        python bench/bench_lowvram.py --comfyui ~/.cache/cosmos3/venv/ComfyUI --vram-gib 24,16 --out lowvram.json

Set the allocator in the environment as ComfyUI would (its ``main.py`` picks ``backend:cudaMallocAsync`` on CUDA
builds of torch unless told otherwise); torch reads it when it loads.
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
    from diffusers import AutoencoderKLWan, Cosmos3AVAEAudioTokenizer

    from cosmos3_pack.cosmos3_core.vae.audio import Cosmos3SoundDecoder
    from cosmos3_pack.cosmos3_core.config import Cosmos3Config
    from cosmos3_pack.cosmos3_core.pipeline import Cosmos3Pipeline
    from cosmos3_pack.cosmos3_core.sampling.prompt import load_tokenizer
    from cosmos3_pack.cosmos3_core.model.transformer import Cosmos3Transformer
    from cosmos3_pack.cosmos3_core.vae.video import Cosmos3VAE

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
    model.keep_fp32().eval().requires_grad_(False)
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
            plan = pipe.plan(text, seed=0, steps=steps, guidance=6.0, sound=True, device=handle.generation_device)
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


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--comfyui", required=True, help="a ComfyUI tree (main.py, comfy/)")
    p.add_argument("--vram-gib", default="24", help="card sizes to simulate, comma separated")
    p.add_argument("--resolution", default="480p", choices=sorted(RESOLUTIONS))
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--out", default="lowvram.json")
    args = p.parse_args()

    sys.path.insert(0, str(Path(args.comfyui).resolve()))
    sys.argv = sys.argv[:1]  # ComfyUI's argument parser reads sys.argv at import
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


if __name__ == "__main__":
    main()

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
import logging
import os
import sys
import tempfile
import time
import traceback
import types
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from common import LONG_PROMPT, NANO, RESOLUTIONS, WAN22_VAE, gib, git_commit  # noqa: E402

CONTEXT_GIB = 0.5  # what a real card's CUDA context and driver keep of its nominal size
CASES = {"h200_480p": ("480p", None), "h200_720p": ("720p", None), "card16_480p": ("480p", 16.0)}
DTYPES = {"bf16": torch.bfloat16, "fp8_e4m3fn": torch.float8_e4m3fn}
TINY_SHAPE = (64, 96, 9)


def pack_api():
    """``cosmos3_core.api`` of the pack as ComfyUI imports it (one copy of its classes)."""
    from cosmos3_pack.cosmos3_core import api

    return api


def pack_runtime():
    """``cosmos3_core.runtime`` of the pack as ComfyUI imports it."""
    from cosmos3_pack.cosmos3_core import runtime

    return runtime


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
            text = pipe.prefill_prompts(ids, **shape, options=pack_runtime().DEFAULT)
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
            return pipe.prefill_prompts(ids, **text_shape, options=pack_runtime().DEFAULT).to(mm.intermediate_device())

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

    handle_cls = import_pack()
    from cosmos3_pack.cosmos3_core.testing.tiny import build_tiny_checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        files = build_tiny_checkpoint(Path(tmp) / "files", variant="nano", seed=0)  # tokenizer, scheduler configs
        t0 = time.perf_counter()
        pipe = random_nano_pipeline(files, loader_linear("bf16"))
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
                pipe = random_nano_pipeline(files, _pack("nodes.model_handle").streaming_ops(cast).linear)
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


# ------------------------------------------------------------------------------------------------ card sizes
# Every card size users have (issue 37): name → (model, resolution, weights, card GiB). Weights: bf16 (the pack's
# streaming Linear), fp8 (NVIDIA's ModelOpt layout in the pack's StreamingFp8Linear: W8A8 under NVIDIA's step policy
# where the GPU has FP8 tensor cores), fp8_fast (a bf16 checkpoint loaded with weight_dtype fp8_e4m3fn_fast: the same
# layers, each weight rounded to e4m3 at load, dynamic activation scales), gguf_q8_0 / gguf_q4_0 (StreamingGgufLinear,
# GGML blocks dequantized per call).
CARD_CASES = {
    "nano480_8g_q4_0": ("nano", "480p", "gguf_q4_0", 8),
    "nano480_12g_q8_0": ("nano", "480p", "gguf_q8_0", 12),
    "nano480_12g_fp8": ("nano", "480p", "fp8", 12),
    "nano480_16g_fp8": ("nano", "480p", "fp8", 16),
    "nano480_16g_bf16": ("nano", "480p", "bf16", 16),
    "nano480_24g_fp8": ("nano", "480p", "fp8", 24),
    "nano480_24g_bf16": ("nano", "480p", "bf16", 24),
    "nano480_16g_fp8_fast": ("nano", "480p", "fp8_fast", 16),
    "nano480_24g_fp8_fast": ("nano", "480p", "fp8_fast", 24),
    "nano480_32g_bf16": ("nano", "480p", "bf16", 32),
    "nano720_24g_fp8": ("nano", "720p", "fp8", 24),
    "nano720_32g_bf16": ("nano", "720p", "bf16", 32),
    "super480_32g_fp8": ("super", "480p", "fp8", 32),
    "super480_48g_fp8": ("super", "480p", "fp8", 48),
    "nano480_whole_bf16": ("nano", "480p", "bf16", None),  # the whole card (the 1.15× target's baseline)
}
FP8_INPUT_SCALE = 4.0 / 448  # the calibrated activation scale of every random FP8 layer (a stand-in: speed only)


def _pack(module: str):
    import importlib

    return importlib.import_module(f"cosmos3_pack.{module}")


def loader_linear(weights: str) -> type:
    """The decoder-layer Linear class the loader node builds for ``weights`` (``streaming_ops``: top-level classes,
    which a compiled layer is saved to disk with; ComfyUI's nested ``comfy.ops`` classes are not)."""
    ops = _pack("nodes.model_handle").streaming_ops(cast=False)
    if weights == "bf16":
        return ops.linear
    if weights in ("fp8", "fp8_fast"):
        return ops.scaled_linear
    if weights.startswith("gguf_"):
        return ops.quantized_linear
    raise ValueError(f"loader_linear: unknown weights {weights!r} (bf16, fp8, fp8_fast, gguf_<type>)")


def random_fullsize_pipeline(files: Path, model: str, weights: str):
    """Full-size Nano/Super with seeded random weights on the CPU (ComfyUI's offload device) in the layer classes the
    loader node builds for ``weights`` — the decoder-layer linears bf16, NVIDIA FP8 (e4m3 + its scale + a calibrated
    activation scale, NVIDIA's step policy) or GGML blocks (random bytes with a weight-sized scale) — drawn tensor by
    tensor on the GPU, so the host never holds more than the stored model (Super FP8: ≈64 GB). Plus a random Wan2.2
    VAE and the AVAE sound decoder."""
    from diffusers import AutoencoderKLWan, Cosmos3AVAEAudioTokenizer

    fullsize, weights_mod = _pack("cosmos3_core.testing.fullsize"), _pack("cosmos3_core.model.weights")
    quants = _pack("cosmos3_core.model.gguf_quants")
    config = _pack("cosmos3_core.config").Cosmos3Config.from_dict(fullsize.NANO if model == "nano" else fullsize.SUPER)
    fp8_layers = weights in ("fp8", "fp8_fast")
    linear = loader_linear(weights)
    skip = ("lm_head", "action_proj_in", "action_proj_out", "action_modality_embed")
    with torch.device("meta"):
        tf = _pack("cosmos3_core.model.transformer").Cosmos3Transformer(config, skip_modules=skip, linear=linear)
    device = "cuda" if torch.cuda.is_available() else "cpu"  # CPU: a check of this builder, shrunk
    g, cpu_g = torch.Generator(device).manual_seed(0), torch.Generator().manual_seed(0)
    qtype = quants.BY_NAME.get(weights[len("gguf_"):].upper()) if weights.startswith("gguf_") else None
    with torch.no_grad():
        for mname, module in tf.named_modules():
            for pname, p in list(module.named_parameters(recurse=False)):
                layer_weight = mname.startswith("layers.") and pname == "weight" and p.ndim == 2
                if layer_weight and qtype is not None:
                    module.quantize_as(qtype)
                    blocks = torch.randint(0, 256, (module.weight.numel() // qtype.type_size, qtype.type_size),
                                           dtype=torch.uint8, generator=cpu_g)
                    d = 0.02 / (127 if qtype.name == "Q8_0" else 8)
                    blocks[:, :2] = torch.full((blocks.shape[0], 1), d, dtype=torch.float16).view(torch.uint8)
                    module.weight = torch.nn.Parameter(blocks.reshape(module.weight.shape), requires_grad=False)
                    continue
                if p.ndim == 1 and "norm" in pname + mname:
                    value = 1.0 + 0.05 * torch.randn(p.shape, generator=g, device=device)
                else:
                    value = 0.02 * torch.randn(p.shape, generator=g, device=device)
                value = value.float() if mname.startswith("time_embedder") or pname == "scale_weight" \
                    else value.to(torch.bfloat16)
                if pname == "scale_weight":
                    value = torch.ones((), device=device)
                if layer_weight and fp8_layers:
                    set_fp8_weight(module, mname, value, approximate=weights == "fp8_fast")
                    continue
                module._parameters[pname] = torch.nn.Parameter(value.cpu(), requires_grad=False)
    if fp8_layers:
        tf.fp8_checkpoint = weights_mod.Fp8Checkpoint(dict(weights_mod.APPROXIMATE_FP8_CONFIG),
                                                      approximate=weights == "fp8_fast")
    tf.eval().requires_grad_(False)
    vae = AutoencoderKLWan(**WAN22_VAE).to(dtype=torch.bfloat16).eval().requires_grad_(False)
    audio = Cosmos3AVAEAudioTokenizer().eval().requires_grad_(False)
    audio.register_to_config(encoder_enabled=False)
    pipeline = _pack("cosmos3_core.pipeline")
    return pipeline.Cosmos3Pipeline(files, tf, _pack("cosmos3_core.vae.video").Cosmos3VAE(vae),
                                    _pack("cosmos3_core.sampling.prompt").load_tokenizer(files),
                                    _pack("cosmos3_core.vae.audio").Cosmos3SoundDecoder(audio))


def set_fp8_weight(module, name: str, value: torch.Tensor, approximate: bool) -> None:
    """``value`` into an FP8 layer as the loader leaves it: NVIDIA's layout (e4m3 weight, its scale, a calibrated
    activation scale), or for ``approximate`` (``fp8_e4m3fn_fast``) the weight rounded at load with dynamic
    activation scales and ``scale_b`` the weight's own scale (``loader._set_w8a8_scales``)."""
    fp8, precision = _pack("cosmos3_core.model.fp8"), _pack("cosmos3_core.model.precision")
    w8, scale = fp8.quantize_weight(value)
    module.weight = torch.nn.Parameter(w8.cpu(), requires_grad=False)
    module.scale_weight = torch.nn.Parameter(scale.cpu(), requires_grad=False)
    module.path = precision.linear_path(name)
    if approximate:
        module.dynamic_input = True
    else:
        module.w8a8_weight_scale = scale.cpu().clone()
        module.input_scale = torch.tensor(FP8_INPUT_SCALE)


def streamed_bytes(patcher) -> int:
    """Bytes of the tower's weights left on the offload device: what ComfyUI copies to the GPU at every step."""
    device = patcher.load_device
    return sum(p.numel() * p.element_size() for p in patcher.model.parameters() if p.device != device)


class Phases:
    """Each phase of a case timed into ``out[label]`` (``seconds``; on a GPU also ``peak_gib``, the peak allocated
    beyond the ``hold`` bytes that simulate the card)."""

    def __init__(self, out: dict, cuda: bool, hold: int):
        self.out, self.cuda, self.hold = out, cuda, hold

    def __call__(self, label: str, fn):
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        result = fn()
        if self.cuda:
            torch.cuda.synchronize()
        self.out[label] = dict(seconds=round(time.perf_counter() - t0, 2))
        if self.cuda:
            self.out[label]["peak_gib"] = gib3(torch.cuda.max_memory_allocated() - self.hold)
        return result


def hold_card(vram_gib: float, before: int) -> tuple[torch.Tensor, int]:
    """A simulated card of ``vram_gib`` GiB: the rest of the GPU held by one block (and its size in bytes).
    ``before``: what this process still holds on the GPU from earlier cases, counted against the card (it is in the
    phases' peaks too)."""
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info()
    hold = max(int(free - (vram_gib - CONTEXT_GIB) * 2**30 + before), 0)
    return torch.empty(hold, dtype=torch.uint8, device="cuda"), hold


def left_on_gpu(handle, top: int = 8) -> list[str]:
    """The largest CUDA tensors still alive (after every model was unloaded): shape, dtype, MiB and, where the
    handle's modules hold it, its name — what a case leaves to the next one in this process."""
    names = {}
    for patcher in (handle.text_patcher, handle.generation_patcher, handle.vae_patcher, handle.sound_patcher):
        if patcher is not None:
            names.update({t.data_ptr(): n for n, t in (*patcher.model.named_parameters(),
                                                       *patcher.model.named_buffers())})
    seen, found = set(), []
    for obj in gc.get_objects():
        if not (isinstance(obj, torch.Tensor) and obj.is_cuda):
            continue
        try:  # a compiler's fake tensor has no storage: not memory
            ptr = obj.untyped_storage().data_ptr()
        except RuntimeError:
            continue
        if ptr not in seen:
            seen.add(ptr)
            found.append((obj.untyped_storage().nbytes(), obj))
    found.sort(key=lambda f: -f[0])
    return [f"{tuple(t.shape)} {t.dtype} {n / 2**20:.0f} MiB {names.get(t.data_ptr(), type(t).__name__)}"
            for n, t in found[:top]]


def card_case(handle, mm, shape, vram_gib, steps: int, cuda: bool, options) -> dict:
    """One card: text encode, ``steps`` denoising steps (compiled as shipped: ``options``), VAE and sound decode;
    on failure, where and at what memory it failed."""
    mm.unload_all_models()
    gc.collect()
    before = torch.cuda.memory_allocated() if cuda else 0
    if before > 2**26:
        print(f"left on the GPU from earlier cases, {gib3(before)} GiB:", *left_on_gpu(handle), sep="\n  ", flush=True)
    block, hold = hold_card(vram_gib, before) if cuda and vram_gib is not None else (None, 0)
    h, w, frames = shape
    out = dict(height=h, width=w, frames=frames, vram_gib=vram_gib, allocated_before_gib=gib3(before),
               generation_tower_gib=gib3(handle.generation_patcher.model_size()),
               text_tower_gib=gib3(handle.text_patcher.model_size()))
    try:
        run_card(handle, mm, shape, steps, options, Phases(out, cuda, hold))
        if cuda:
            out["peak_gib"] = max(v["peak_gib"] for v in out.values() if isinstance(v, dict) and "peak_gib" in v)
        out["fits"] = True
    except Exception as exc:  # an out-of-memory error, or the pack's card-too-small message: the finding
        out["fits"] = False
        traceback.print_exc()  # the whole story in the log; the record keeps the innermost frames
        out.update(failure(exc, handle, hold if cuda else None))
    finally:
        del block
        mm.unload_all_models()
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
    return out


def run_card(handle, mm, shape, steps: int, options, phase: Phases) -> None:
    """The node graph's work on one card, each part loaded through ComfyUI's model management as the nodes do."""
    pipe, out, cuda = handle.pipeline, phase.out, phase.cuda
    h, w, frames = shape
    text_shape = dict(num_frames=frames, height=h, width=w, fps=24.0)
    stamps: list[float] = []

    def encode():
        ids = pipe.tokenize(LONG_PROMPT, None, **text_shape)
        handle.load_text_tower(text_length=ids.prefill_tokens)
        return pipe.prefill_prompts(ids, **text_shape, options=options).to(mm.intermediate_device())

    text = phase("text_encode", encode)

    def sample():
        stamps.append(time.perf_counter())
        plan = pack_api().plan(pipe, text, seed=0, steps=steps, guidance=6.0, sound=pipe.info.has_sound,
                               device=handle.generation_device, options=options, prepare=handle.prepare)
        handle.load_generation_tower(plan.memory_required)
        out["streamed_gib_per_step"] = gib3(streamed_bytes(handle.generation_patcher))
        out["fp8"] = plan.fp8
        sync = torch.cuda.synchronize if cuda else (lambda: None)
        return pipe.run(plan, callback=lambda *_: (sync(), stamps.append(time.perf_counter())))

    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    result = phase("sample", sample)
    out["sample"].update(steps=steps, **step_times(stamps, out["sample"]["seconds"], out["fp8"] is not None),
                         graphs_compiled=torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs)
    out["frames_shape"] = list(phase("vae_decode", lambda: (handle.load_vae(result.latents.shape),
                                                            pipe.decode_video(result.latents))[1]).shape)
    if result.sound is not None:
        phase("sound_decode", lambda: (handle.load_sound_decoder(),
                                       pipe.decode_sound(result.sound, frames, 24.0))[1])


def failure(exc: Exception, handle, hold: int | None) -> dict:
    """What a failed case leaves to read: the error, the innermost frames it came from and, on a GPU, the memory
    allocated at that moment and how much of each tower was resident."""
    frames = traceback.extract_tb(exc.__traceback__)[-5:]
    out = dict(error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:400]}",
               where=[f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in frames])
    if hold is not None:
        out["at_failure"] = dict(
            allocated_gib=gib3(torch.cuda.memory_allocated() - hold),
            generation_resident_gib=gib3(handle.generation_patcher.model_size()
                                         - streamed_bytes(handle.generation_patcher)),
            text_resident_gib=gib3(handle.text_patcher.model_size() - streamed_bytes(handle.text_patcher)))
    return out


def step_times(stamps: list[float], seconds: float, fp8: bool) -> dict:
    """Per-step seconds from the callback's ``stamps`` (the first: before the plan) and the 35-step projection. The
    first step of each kind may compile its graph: it counts as it ran in the projection and is left out of the
    kind's mean. FP8 runs under NVIDIA's policy (steps 1–3 and the last 3 W8A16, the rest W8A8; the first W8A8 step
    compiles the W8A8 graph): each kind's mean, and 35 steps = the first of each kind + 5 W8A16 + 28 W8A8 (else the
    first + 34 of the one mean)."""
    d = [b - a for a, b in zip(stamps, stamps[1:])]
    if len(d) < 3:
        return {}
    if not fp8 or len(d) < 9:
        mean = sum(d[1:]) / len(d[1:])
        return dict(step_s=round(mean, 3), first_step_s=round(d[0], 2),
                    projected_35_steps_s=round(seconds - sum(d) + d[0] + 34 * mean, 1))
    a16 = [x for i, x in enumerate(d) if i < 3 or i >= len(d) - 3][1:]
    a8 = d[4:len(d) - 3]
    t16, t8 = sum(a16) / len(a16), sum(a8) / len(a8)
    return dict(step_s_w8a16=round(t16, 3), step_s_w8a8=round(t8, 3), first_step_s=round(d[0], 2),
                first_w8a8_step_s=round(d[3], 2),
                projected_35_steps_s=round(seconds - sum(d) + d[0] + d[3] + 5 * t16 + 28 * t8, 1))


def tiny_card_handle(handle_cls, tmp: Path, model: str, weights: str):
    """The tiny checkpoint of ``model`` loaded through the loader node's own path for ``weights`` (the GGUF written by
    the converter, the FP8 checkpoint in NVIDIA's layout), fp32 on the CPU."""
    from cosmos3_pack.cosmos3_core.model.gguf_write import write_gguf
    from cosmos3_pack.cosmos3_core.testing.fp8 import build_fp8_checkpoint
    from cosmos3_pack.cosmos3_core.testing.tiny import build_tiny_checkpoint

    files = tmp / f"tiny-{model}"
    if not files.is_dir():
        build_tiny_checkpoint(files, variant=model, seed=0)
    if weights == "fp8":
        fp8 = tmp / f"tiny-{model}-fp8"
        if not fp8.is_dir():
            build_fp8_checkpoint(files, fp8)
        return handle_cls.load(f"tiny-{model}-fp8", fp8, torch.float32, "cpu")
    gguf = None
    if weights.startswith("gguf_"):
        gguf = tmp / f"tiny-{model}-{weights}.gguf"
        if not gguf.is_file():
            write_gguf(files, gguf, weights[len("gguf_"):].upper())
    return handle_cls.load(f"tiny-{model}", files, torch.float32, "cpu", gguf_file=gguf,
                           fp8_compute=weights == "fp8_fast")


def card_sizes_main(args) -> None:
    """Every card size of ``--cases`` (default: all of ``CARD_CASES``), one weights build per (model, weights)."""
    from comfy.cli_args import args as comfy_args

    comfy_args.cpu = args.tiny
    import comfy.model_management as mm

    handle_cls = import_pack()
    runtime = _pack("cosmos3_core.runtime")
    from cosmos3_pack.cosmos3_core.testing.tiny import build_tiny_checkpoint

    cuda = not args.tiny
    names = args.cases.split(",") if args.cases != ",".join(CASES) else list(CARD_CASES)
    unknown = [n for n in names if n not in CARD_CASES]
    if unknown:
        raise SystemExit(f"--cases: unknown {unknown}; choose from {list(CARD_CASES)}")
    # --tiny: the CPU has no FP8 GEMM; the W8A8 steps run emulated (what fp8_e4m3fn_fast asks for explicitly)
    options = runtime.RuntimeOptions(compile="off", fp8_gemm="emulate") if args.tiny else \
        runtime.RuntimeOptions(compile="auto")
    results = dict(torch=torch.__version__, gpu=torch.cuda.get_device_name() if cuda else "cpu",
                   date=time.strftime("%Y-%m-%d"), commit=git_commit(), host_link=None, runs=[])
    if cuda:
        results["host_link"] = host_to_device_gib_s()
    by_weights: dict[tuple[str, str], list[str]] = {}
    for name in names:
        model, _, weights, _ = CARD_CASES[name]
        by_weights.setdefault((model, weights), []).append(name)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for (model, weights), cases in by_weights.items():
            t0 = time.perf_counter()
            if args.tiny:
                handle = tiny_card_handle(handle_cls, tmp, model, weights)
            else:
                files = build_tiny_checkpoint(tmp / "files", variant="nano", seed=0) if not (tmp / "files").is_dir() \
                    else tmp / "files"
                pipe = random_fullsize_pipeline(files, model, weights)
                handle = handle_cls.from_pipeline(f"{model}-random-{weights}", files, torch.bfloat16, pipe)
            init_s = round(time.perf_counter() - t0, 1)
            for name in cases:
                _, resolution, _, vram = CARD_CASES[name]
                shape = TINY_SHAPE if args.tiny else RESOLUTIONS[resolution]
                row = dict(case=name, model=model, weights=weights, resolution=resolution, init_s=init_s,
                           **card_case(handle, mm, shape, vram, args.steps, cuda, options))
                results["runs"].append(row)
                print(json.dumps(row), flush=True)
                Path(args.out).write_text(json.dumps(results, indent=1))
            del handle
            gc.collect()


def host_to_device_gib_s() -> float:
    """GiB/s of a pinned 1 GiB host→GPU copy on this machine (the card-size runs stream weights over it)."""
    src = torch.empty(2**30, dtype=torch.uint8).pin_memory()
    dst = torch.empty_like(src, device="cuda")
    dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(3):
        dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    return round(3 / (time.perf_counter() - t0), 1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--comfyui", required=True, help="a ComfyUI tree (main.py, comfy/)")
    p.add_argument("--vram-gib", default="24", help="card sizes to simulate, comma separated")
    p.add_argument("--resolution", default="480p", choices=sorted(RESOLUTIONS))
    p.add_argument("--weight-storage", action="store_true",
                   help="bf16 vs fp8_e4m3fn linear-weight storage over --cases instead of the simulated cards")
    p.add_argument("--card-sizes", action="store_true",
                   help=f"every card size users have (issue 37), --cases of {list(CARD_CASES)} (default all)")
    p.add_argument("--cases", default=",".join(CASES), help=f"--weight-storage: comma separated, of {list(CASES)}")
    p.add_argument("--steps", type=int, default=None,
                   help="denoising steps run (default 4; --weight-storage: 3; --card-sizes: 10, so that NVIDIA's "
                        "FP8 policy has W8A8 steps after the one that compiles)")
    p.add_argument("--tiny", action="store_true",
                   help="--weight-storage / --card-sizes: CPU check of the script, tiny checkpoints")
    p.add_argument("--out", required=True, help="results JSON")
    args = p.parse_args()
    if args.tiny and not (args.weight_storage or args.card_sizes):
        p.error("--tiny checks the --weight-storage and --card-sizes modes; add one")
    if not args.tiny and not torch.cuda.is_available():
        p.error("the simulated cards, --weight-storage and --card-sizes need a CUDA GPU; add --tiny for a CPU check "
                "of the script")
    args.steps = args.steps or (10 if args.card_sizes else 3 if args.weight_storage else 4)
    # ComfyUI's model manager says at INFO what it loads and how much of a tower it leaves to stream
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    sys.path.insert(0, str(Path(args.comfyui).resolve()))
    sys.argv = sys.argv[:1]  # ComfyUI's argument parser reads sys.argv at import
    main_of = card_sizes_main if args.card_sizes else weight_storage_main if args.weight_storage else cards_main
    main_of(args)


if __name__ == "__main__":
    main()

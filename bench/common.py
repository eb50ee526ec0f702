"""Shared pieces of the GPU benchmarks: shapes, full-size random-weight Nano builders, timing and process helpers.

Every benchmark measures speed and memory on **full-size models with seeded random bf16 weights** (no real
checkpoint is read): ``NANO`` is Cosmos3-Nano's transformer geometry (the same dict builds diffusers'
``Cosmos3OmniTransformer`` and ours, so both sides can share one set of weights), ``WAN22_VAE`` the Wan2.2 VAE at its
released widths. The text side is a tiny checkpoint's tokenizer, scheduler and model index
(``cosmos3_core.testing.tiny``): only the token *count* of a prompt matters for speed. Prompts are a ~1,500-token
conditional prompt (``LONG_PROMPT``, like a JSON-upsampled one) and a ~60-token negative.

``step_flops`` counts one guided step's generation-tower work as the benchmark tables report TFLOP/s: per branch,
linear FLOPs ``2·L·(D·H·d + 2·D·Hkv·d + H·d·D + 3·D·F)`` per token plus the attention core ``4·H·d·N·(N + S_text)·L``
(QKᵀ and PV), softmax, norms and RoPE ignored (< 1 %); the text K/V is cached, so the text tower costs nothing
per step.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

RESOLUTIONS = {"t2i": (720, 1280, 1), "256p": (192, 320, 189), "480p": (480, 832, 93), "720p": (720, 1280, 189)}
TINY_RESOLUTIONS = {"t2i": (64, 96, 1), "256p": (32, 64, 17), "480p": (48, 80, 9), "720p": (64, 96, 17)}  # --tiny
COND_TOKENS, UNCOND_TOKENS = 1500, 60
from cosmos3_core.testing.fullsize import NANO, WAN22_VAE  # noqa: E402  (the released geometries)


def sync() -> None:
    if torch.cuda.is_initialized():  # --tiny runs on the CPU
        torch.cuda.synchronize()


def gib(n: int) -> float:
    return round(n / 2**30, 2)


def timed(fn, warmup: int = 1, iters: int = 3) -> float:
    for _ in range(warmup):
        fn()
    sync()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    sync()
    return (time.perf_counter() - start) / iters


def step_flops(num_tokens: int, text_lengths: list[int]) -> float:
    """Gen-tower FLOPs of one step over all branches: linear + attention core (the module docstring's count)."""
    d, f, h, kv, hd, layers = 4096, 12288, 32, 8, 128, 36
    linear = 2 * layers * (d * h * hd + 2 * d * kv * hd + h * hd * d + 3 * d * f)
    total = 0.0
    for text in text_lengths:
        total += num_tokens * linear + 4 * h * hd * num_tokens * (num_tokens + text) * layers
    return total


def random_bf16_weights(model: torch.nn.Module, device: str) -> torch.nn.Module:
    """Materialize a meta-built Cosmos3 transformer on ``device`` in bf16 with seeded random weights (norm weights
    ≈ 1, the rest N(0, 0.02)); the time embedder stays fp32 as in real checkpoints."""
    model = model.to(torch.bfloat16).to_empty(device=device)
    g = torch.Generator(device).manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1 and "norm" in name:
                p.copy_(1.0 + 0.05 * torch.randn(p.shape, generator=g, device=device))
            else:
                p.normal_(0.0, 0.02, generator=g)
    model.time_embedder.float()
    return model.eval().requires_grad_(False)


def fp8_linear(weight: torch.Tensor, input_amax: float, bias: torch.Tensor | None = None) -> torch.nn.Module:
    """An ``Fp8Linear`` (the product's class) in NVIDIA's ModelOpt layout made from a dense ``weight`` [out, in]: the
    weight rounded once to e4m3 with one per-tensor scale (``quantize_weight``, ModelOpt's max calibration), the
    activation scale ``input_amax / 448`` as a calibrated checkpoint stores it, ``bias`` as given."""
    from cosmos3_core.model.fp8 import Fp8Linear, quantize_weight
    from cosmos3_core.model.weights import E4M3_MAX

    q, scale = quantize_weight(weight)
    with torch.device("meta"):
        layer = Fp8Linear(weight.shape[1], weight.shape[0], bias=bias is not None)
    layer.weight = torch.nn.Parameter(q, requires_grad=False)
    layer.scale_weight = torch.nn.Parameter(scale, requires_grad=False)
    if bias is not None:
        layer.bias = bias
    layer.input_scale = torch.tensor(input_amax, device=q.device) / E4M3_MAX
    layer.w8a8_weight_scale = scale
    return layer


OURS_SKIP = ("lm_head", "action_proj_in", "action_proj_out", "action_modality_embed")  # generation needs none


def meta_ours() -> torch.nn.Module:
    """Our full-size Nano transformer on the meta device (no storage yet)."""
    from cosmos3_core.config import Cosmos3Config
    from cosmos3_core.model.transformer import Cosmos3Transformer

    with torch.device("meta"):
        return Cosmos3Transformer(Cosmos3Config.from_dict(NANO), skip_modules=OURS_SKIP)


def build_sharded(geometry: dict, device: str, sharding=None) -> torch.nn.Module:
    """``random_bf16_weights``'s model and values (the same seeded draws, in the same order) for the transformer of
    ``geometry`` (``NANO``, ``SUPER``), its decoder layers split by ``sharding`` (``parallel.tensor.TensorParallel``,
    None: whole): each full tensor is drawn on ``device`` and only this rank's slice of it is kept, so no rank ever
    holds the whole model and a sharded Nano equals the one-GPU ``build_ours``."""
    from cosmos3_core.config import Cosmos3Config
    from cosmos3_core.model.transformer import Cosmos3Transformer

    with torch.device("meta"):
        model = Cosmos3Transformer(Cosmos3Config.from_dict(geometry), skip_modules=OURS_SKIP)
    if sharding is not None:
        sharding.shard(model)
    g = torch.Generator(device).manual_seed(0)
    state = {}
    with torch.no_grad():
        for name, p in model.named_parameters():
            shape, index = sharding.source(name, p) if sharding is not None else (tuple(p.shape), None)
            full = torch.empty(shape, dtype=torch.bfloat16, device=device)
            if p.ndim == 1 and "norm" in name:
                full.copy_(1.0 + 0.05 * torch.randn(shape, generator=g, device=device))
            else:
                full.normal_(0.0, 0.02, generator=g)
            local = full if index is None else full[index].clone()
            del full
            local = local.float() if name.startswith("time_embedder.") else local
            state[name] = local if sharding is None else sharding.place(local, p)
    model.load_state_dict(state, strict=True, assign=True)
    return model.eval().requires_grad_(False)


def build_ours(device: str) -> torch.nn.Module:
    """Our full-size Nano alone, seeded random bf16 weights (no diffusers model beside it)."""
    return random_bf16_weights(meta_ours(), device)


def build_models(device: str):
    from diffusers import Cosmos3OmniTransformer

    with torch.device("meta"):
        ref = Cosmos3OmniTransformer(**NANO)
    ref = random_bf16_weights(ref, device)
    ours = meta_ours()
    state = {k: v for k, v in ref.state_dict().items() if not k.startswith(OURS_SKIP)}
    ours.load_state_dict(state, strict=True, assign=True)
    return ref, ours.eval().requires_grad_(False)


def reference_inputs(ref, ids: list[int], latents: torch.Tensor, fps: float, timestep: int):
    import types

    from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import Cosmos3OmniPipeline as P

    pipe = types.SimpleNamespace(transformer=ref, vae_scale_factor_temporal=4)
    dev = latents.device
    text = P._prepare_text_segment(pipe, ids, dev)
    vis = P._prepare_vision_segment(pipe, latents, False, text["vision_start_temporal_offset"], fps,
                                    text["und_len"], dev, [])
    return dict(
        input_ids=text["input_ids"], text_indexes=text["text_indexes"],
        position_ids=torch.cat([text["text_mrope_ids"], vis["vision_mrope_ids"]], dim=1), und_len=text["und_len"],
        sequence_length=text["und_len"] + vis["num_vision_tokens"], vision_tokens=[latents.to(torch.bfloat16)],
        vision_token_shapes=vis["vision_token_shapes"], vision_sequence_indexes=vis["vision_sequence_indexes"],
        vision_mse_loss_indexes=vis["vision_mse_loss_indexes"],
        vision_timesteps=torch.full((vis["num_noisy_vision_tokens"],), timestep, device=dev),
        vision_noisy_frame_indexes=vis["vision_noisy_frame_indexes"], return_dict=False,
    )


def make_components(device: str, tmp: Path):
    from diffusers import AutoencoderKLWan, Cosmos3AVAEAudioTokenizer

    from cosmos3_core.sampling.prompt import load_tokenizer
    from cosmos3_core.testing.tiny import build_tiny_checkpoint

    files = build_tiny_checkpoint(tmp / "files", variant="nano", seed=0)  # tokenizer, scheduler, model_index
    vae = AutoencoderKLWan(**WAN22_VAE).to(device=device, dtype=torch.bfloat16).eval().requires_grad_(False)
    audio = Cosmos3AVAEAudioTokenizer().to(device).eval().requires_grad_(False)
    audio.register_to_config(encoder_enabled=False)
    return files, vae, audio, load_tokenizer(files)


LONG_PROMPT = " ".join(["a red robot walks down a busy city street at night while the camera follows"] * 100)


def build_tiny_ours() -> torch.nn.Module:
    """A tiny random fp32 model on the CPU (cosmos3_core/testing/tiny.py's geometry and init) for ``--tiny``."""
    from cosmos3_core.config import Cosmos3Config
    from cosmos3_core.model.transformer import Cosmos3Transformer
    from cosmos3_core.testing.tiny import randomize_transformer_, transformer_config

    config = Cosmos3Config.from_dict(transformer_config("nano", sound=False, vocab_size=1000, action=False))
    model = Cosmos3Transformer(config, skip_modules=("lm_head",))
    with torch.no_grad():
        randomize_transformer_(model, torch.Generator().manual_seed(0))
    return model.eval().requires_grad_(False)


def compile_stats() -> dict:
    """Cache counters and compile-time totals so far in this process (compare two snapshots)."""
    from torch._dynamo.utils import compilation_time_metrics, counters

    times = {k: sum(compilation_time_metrics.get(name, [])) for k, name in
             (("compile_s", "_compile.compile_inner"), ("dynamo_tracing_s", "bytecode_tracing"))}
    return dict(
        phases={k: sum(v) for k, v in compilation_time_metrics.items()},
        fxgraph_cache_hit=counters["inductor"]["fxgraph_cache_hit"],
        fxgraph_cache_miss=counters["inductor"]["fxgraph_cache_miss"],
        autograd_cache_hit=counters["aot_autograd"]["autograd_cache_hit"],
        autograd_cache_miss=counters["aot_autograd"]["autograd_cache_miss"],
        graphs=counters["stats"]["unique_graphs"], **times)


def git_commit() -> str:
    """This checkout's short commit, for a results file: ``-dirty`` after it when the tree differs from it (a lent
    machine's copy of a working tree may keep an older commit's ``.git``); "unknown" outside a git checkout."""
    try:
        return subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=7"], capture_output=True,
                              text=True, cwd=Path(__file__).parent, timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def fresh_processes(argv: list[str], count: int, results: dict, out_path: str,
                    extra: list[list[str]] | None = None) -> None:
    """Run ``python argv… --out <file>`` ``count`` times (process ``i`` with ``extra[i]`` added), one fresh process
    after another, on one new, empty ``COSMOS3_CACHE_DIR`` (the compile settings the environment held are dropped
    so that every cache lands there); each process's JSON, with its wall time, is appended to
    ``results["processes"]`` and ``results`` written to ``out_path`` after each process."""
    cache = Path(tempfile.mkdtemp(prefix="cosmos3-fresh-processes-"))
    drop = ("TORCHINDUCTOR_", "TRITON_CACHE_DIR", "FLASH_ATTENTION_CUTE_DSL_CACHE", "TORCH_COMPILE")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env["COSMOS3_CACHE_DIR"] = str(cache)
    results.setdefault("processes", [])
    try:
        for i in range(count):
            probe = cache / "process.json"
            start = time.perf_counter()
            more = extra[i] if extra else []
            subprocess.run([sys.executable, *argv, *more, "--out", str(probe)], env=env, check=True, timeout=560)
            run = json.loads(probe.read_text())
            run["process_wall_s"] = round(time.perf_counter() - start, 1)
            results["processes"].append(run)
            Path(out_path).write_text(json.dumps(results, indent=1))
    finally:
        shutil.rmtree(cache, ignore_errors=True)

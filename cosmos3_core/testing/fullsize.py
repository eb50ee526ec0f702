"""Full-size random-weight Cosmos3 checkpoint writer (a benchmark fixture, never a model).

``write_random_checkpoint(out_dir, variant="nano"|"edge", layers=None, seed=0, device=None)`` (or
``python -m cosmos3_core.testing.fullsize --out DIR [--variant nano|edge] [--layers N]``) writes a folder in the
Hugging Face Hub layout of ``nvidia/Cosmos3-Nano`` / ``-Edge`` at the released sizes, as diffusers 0.42.1
``Cosmos3OmniPipeline.from_pretrained`` and this package's loader read it:

    transformer/config.json + diffusion_pytorch_model-0000K-of-0000N.safetensors + ...safetensors.index.json
        ``Cosmos3OmniTransformer``'s keys in its ``state_dict`` order, bf16, in 5 GB shards (the Hub's layout);
        written one tensor at a time (the peak host memory is one tensor, not the model)
    vae/                 ``AutoencoderKLWan`` at the Wan2.2 TI2V-5B geometry (``WAN22_VAE``), fp32, diffusers' init
                         (built on the CPU, written by ``save_pretrained``: 2.8 GB in memory at a time)
    sound_tokenizer/     ``Cosmos3AVAEAudioTokenizer()`` at its released geometry, decoder only, fp32 (Nano only)
    text_tokenizer/, scheduler/, assets/negative_prompt.json, model_index.json
                         as ``testing/tiny.py`` writes them (a WordLevel tokenizer: a prompt's token *count*, not
                         its vocabulary, is what a benchmark needs)

Sizes: Nano 15.17 B transformer parameters (30.3 GB bf16) + VAE 2.8 GB + sound tokenizer 1.9 GB ≈ 35 GB; Edge
3.37 B (6.7 GB) + VAE ≈ 9.6 GB. ``layers`` keeps the per-layer geometry with fewer layers (a smaller file of the
same shapes). ``tiny=True`` writes the same layout through the same code at ``testing/tiny.py``'s geometry (a
check of the writer that runs in a second).

Transformer values: seeded N(0, 0.02), RMSNorm weights 1 + 0.05·N(0, 1) (as ``bench/common.py``'s random builders),
drawn on ``device`` (CUDA when available: a 35 GB checkpoint is then limited by the disk, not the random numbers).
Safetensors is written directly in its documented format (8-byte little-endian header length, JSON header with
``dtype``/``shape``/``data_offsets``, space-padded to 8 bytes, then the raw little-endian tensor bytes in header
order). ``model_index.json`` and then the marker ``.cosmos3-random-checkpoint.json`` (the spec and every file's
size) are written last: ``is_complete`` compares them, so an interrupted write is redone and a finished one skipped.
"""

from __future__ import annotations

import argparse
import json
import shutil
import struct
import time
from pathlib import Path

import torch

from .tiny import (
    _LEGACY_TRANSFORMER_KEYS,
    SCHEDULER_CONFIG,
    _build_sound_tokenizer,
    _build_vae,
    build_text_tokenizer,
    transformer_config,
)

NANO = dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
            num_key_value_heads=8, head_dim=128, vocab_size=151936, sound_gen=True, sound_dim=64,
            action_gen=True, action_dim=64,
            rope_scaling={"mrope_interleaved": True, "mrope_section": [24, 20, 20], "rope_type": "default"})
# Super's geometry (docs/architecture.md: hidden 5120, MLP 25600, 64 layers, 64/8 heads); not written by this module
SUPER = dict(NANO, hidden_size=5120, intermediate_size=25600, num_hidden_layers=64, num_attention_heads=64)
EDGE = dict(hidden_size=2048, intermediate_size=9216, num_hidden_layers=28, num_attention_heads=16,
            num_key_value_heads=8, head_dim=128, vocab_size=131072, hidden_act="relu2", qk_norm_for_text=False,
            use_und_k_norm_for_gen=True, rms_norm_eps=1e-5, rope_theta=1e8, rope_axes_dim=[24, 20, 20],
            action_gen=True, action_dim=64)
WAN22_VAE = dict(base_dim=160, decoder_base_dim=256, z_dim=48, dim_mult=[1, 2, 4, 4], num_res_blocks=2,
                 attn_scales=[], temperal_downsample=[False, True, True], is_residual=True, in_channels=12,
                 out_channels=12, patch_size=2, scale_factor_spatial=16, scale_factor_temporal=4,
                 latents_mean=[0.0] * 48, latents_std=[1.0] * 48)
SHARD_BYTES = 5_000_000_000  # the Hub's "5GB" shards
MARKER = ".cosmos3-random-checkpoint.json"
# NVIDIA's negative is a structured JSON caption; this one re-serializes to ~60 tokens of the tiny vocabulary
NEGATIVE_PROMPT = {
    "summary": "blurry low quality distorted video with flickering grainy pixelated frames",
    "artifacts": ["flickering", "grainy", "pixelated", "blurry", "distorted"],
    "motion": "static jerky camera",
    "scene": "dark low quality background",
}
_ST_DTYPES = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32", torch.float64: "F64",
              torch.int64: "I64", torch.int32: "I32", torch.uint8: "U8", torch.bool: "BOOL",
              torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2"}


def transformer_kwargs(variant: str, layers: int | None = None, tiny: bool = False) -> dict:
    """``Cosmos3OmniTransformer`` kwargs of a full-size (or ``tiny``) Nano / Edge."""
    if variant not in ("nano", "edge"):
        raise ValueError(f"write_random_checkpoint: variant must be 'nano' or 'edge', got {variant!r}.")
    if tiny:
        cfg = transformer_config(variant, sound=variant == "nano", vocab_size=1024, action=True)
    else:
        cfg = dict(NANO if variant == "nano" else EDGE)
    if layers is not None:
        if layers < 1:
            raise ValueError(f"write_random_checkpoint: layers must be >= 1, got {layers}.")
        cfg["num_hidden_layers"] = layers
    return cfg


def spec_of(variant: str, layers: int | None = None, seed: int = 0, tiny: bool = False,
            shard_bytes: int | None = None) -> dict:
    """What a checkpoint written with these arguments is (``is_complete`` compares it with the marker)."""
    shard_bytes = shard_bytes or (3_000_000 if tiny else SHARD_BYTES)
    return dict(variant=variant, layers=layers, seed=seed, tiny=tiny, shard_bytes=shard_bytes,
                transformer=transformer_kwargs(variant, layers, tiny), format=1)


def is_complete(out_dir, spec: dict) -> bool:
    """True when ``out_dir`` holds a finished checkpoint of this spec (marker matches, every file has its size)."""
    marker = Path(out_dir) / MARKER
    try:
        saved = json.loads(marker.read_text())
    except (OSError, json.JSONDecodeError):
        return False
    if saved.get("spec") != json.loads(json.dumps(spec)):
        return False
    for rel, size in saved.get("files", {}).items():
        path = Path(out_dir) / rel
        if not path.is_file() or path.stat().st_size != size:
            return False
    return True


def _header_bytes(entries: list[tuple[str, torch.dtype, tuple[int, ...]]]) -> tuple[bytes, int]:
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, dtype, shape in entries:
        n = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
        header[name] = {"dtype": _ST_DTYPES[dtype], "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw, offset


def write_safetensors_streaming(path: Path, entries, make) -> int:
    """Write ``entries`` ``[(name, dtype, shape)]`` to ``path``, each tensor made by ``make(name, dtype, shape)`` just
    before it is written (so one tensor is in memory at a time); returns the file size."""
    head, data_bytes = _header_bytes(entries)
    with open(path, "wb") as f:
        f.write(head)
        for name, dtype, shape in entries:
            t = make(name, dtype, shape)
            if t.dtype != dtype or tuple(t.shape) != tuple(shape):
                raise RuntimeError(f"{name}: made {t.dtype} {tuple(t.shape)}, header says {dtype} {tuple(shape)}")
            t = t.detach().to("cpu").contiguous()
            if t.numel():
                f.write(t.reshape(-1).view(torch.uint8).numpy().data)  # the tensor's own bytes, no copy
    size = path.stat().st_size
    if size != len(head) + data_bytes:
        raise RuntimeError(f"{path}: wrote {size} bytes, expected {len(head) + data_bytes}")
    return size


def _random_maker(seed: int, device: str):
    def make(name: str, dtype: torch.dtype, shape) -> torch.Tensor:
        g = torch.Generator(device).manual_seed(seed * 1_000_003 + (hash_name(name) & 0xFFFFFFFF))
        z = torch.randn(tuple(shape), generator=g, device=device, dtype=torch.float32)
        if len(shape) == 1 and "norm" in name:
            z = 1.0 + 0.05 * z
        else:
            z = 0.02 * z
        return z.to(dtype)
    return make


def hash_name(name: str) -> int:
    """A stable (process-independent) integer of a tensor name: its per-tensor random stream."""
    h = 1469598103934665603
    for byte in name.encode():
        h = ((h ^ byte) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h


def _write_transformer(folder: Path, cfg: dict, seed: int, device: str, shard_bytes: int,
                       dtype: torch.dtype = torch.bfloat16) -> dict[str, int]:
    from diffusers import Cosmos3OmniTransformer

    folder.mkdir(parents=True, exist_ok=True)
    with torch.device("meta"):
        model = Cosmos3OmniTransformer(**cfg)
    model.save_config(folder)
    cfg_path = folder / "config.json"
    saved = json.loads(cfg_path.read_text())
    if cfg.get("rope_scaling") is not None:  # the Hub Nano config carries only rope_scaling
        saved.pop("rope_axes_dim", None)
    cfg_path.write_text(json.dumps({**saved, **_LEGACY_TRANSFORMER_KEYS}, indent=2) + "\n")
    entries = [(k, dtype, tuple(v.shape)) for k, v in model.state_dict().items()]
    elem = torch.empty((), dtype=dtype).element_size()
    shards: list[list] = [[]]
    size = 0
    for e in entries:
        n = torch.Size(e[2]).numel() * elem
        if shards[-1] and size + n > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(e)
        size += n
    make = _random_maker(seed, device)
    files, weight_map = {}, {}
    for i, shard in enumerate(shards, 1):
        name = f"diffusion_pytorch_model-{i:05d}-of-{len(shards):05d}.safetensors"
        files[f"transformer/{name}"] = write_safetensors_streaming(folder / name, shard, make)
        weight_map.update({k: name for k, _, _ in shard})
    total = sum(torch.Size(s).numel() * elem for _, _, s in entries)
    index = folder / "diffusion_pytorch_model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2) + "\n")
    return files


def _full_vae():
    from diffusers import AutoencoderKLWan

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return AutoencoderKLWan(**WAN22_VAE).eval()  # diffusers' own init: decodes to finite, varied pixels


def _full_sound_tokenizer():
    from diffusers import Cosmos3AVAEAudioTokenizer

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return Cosmos3AVAEAudioTokenizer(encoder_enabled=False).eval()  # decoder-only weights, as on the Hub


def write_random_checkpoint(out_dir, variant: str = "nano", layers: int | None = None, seed: int = 0,
                            device: str | None = None, tiny: bool = False, shard_bytes: int | None = None,
                            log=print) -> Path:
    """Write (or keep, when already complete) a random-weight checkpoint; returns its folder."""
    out = Path(out_dir)
    spec = spec_of(variant, layers, seed, tiny, shard_bytes)
    shard_bytes = spec["shard_bytes"]
    if is_complete(out, spec):
        log(f"{out}: complete {variant} checkpoint already there, kept")
        return out
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    t0 = time.perf_counter()
    n_vocab = build_text_tokenizer(out / "text_tokenizer")
    cfg = transformer_kwargs(variant, layers, tiny)
    if n_vocab > cfg["vocab_size"]:
        raise RuntimeError(f"tokenizer has {n_vocab} tokens, transformer vocab {cfg['vocab_size']}")
    files = _write_transformer(out / "transformer", cfg, seed, device, shard_bytes)
    log(f"transformer written in {time.perf_counter() - t0:.1f} s")
    gen = torch.Generator().manual_seed(seed)
    (_build_vae(seed, gen) if tiny else _full_vae()).save_pretrained(out / "vae")
    sound = bool(cfg.get("sound_gen"))
    if sound:
        (_build_sound_tokenizer(seed) if tiny else _full_sound_tokenizer()).save_pretrained(
            out / "sound_tokenizer")
    for rel, obj in (("scheduler/scheduler_config.json", SCHEDULER_CONFIG),
                     ("assets/negative_prompt.json", NEGATIVE_PROMPT)):
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_text(json.dumps(obj, indent=2) + "\n")
    (out / "model_index.json").write_text(json.dumps({
        "_class_name": "Cosmos3OmniPipeline", "_diffusers_version": "0.42.1",
        "default_use_system_prompt": variant != "edge", "enable_safety_checker": False,
        "use_native_flow_schedule": variant == "edge", "safety_checker": [None, None],
        "scheduler": ["diffusers", "UniPCMultistepScheduler"],
        "sound_tokenizer": ["diffusers", "Cosmos3AVAEAudioTokenizer"] if sound else [None, None],
        "text_tokenizer": ["transformers", "PreTrainedTokenizerFast"],
        "transformer": ["diffusers", "Cosmos3OmniTransformer"], "vae": ["diffusers", "AutoencoderKLWan"],
    }, indent=2) + "\n")
    for path in sorted(out.rglob("*")):
        if path.is_file():
            files[str(path.relative_to(out))] = path.stat().st_size
    (out / MARKER).write_text(json.dumps({"spec": spec, "files": files}, indent=1) + "\n")
    log(f"{out}: {variant} checkpoint, {sum(files.values()) / 1e9:.2f} GB in {time.perf_counter() - t0:.1f} s")
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m cosmos3_core.testing.fullsize", description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="output checkpoint folder (replaced unless already complete)")
    ap.add_argument("--variant", choices=["nano", "edge"], default="nano")
    ap.add_argument("--layers", type=int, default=None, help="fewer transformer layers of the same geometry")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default=None, help="where the random values are drawn (default: cuda if present)")
    ap.add_argument("--tiny", action="store_true", help="testing/tiny.py's geometry (a check of the writer)")
    args = ap.parse_args(argv)
    write_random_checkpoint(args.out, args.variant, args.layers, args.seed, args.device, args.tiny)


if __name__ == "__main__":
    main()

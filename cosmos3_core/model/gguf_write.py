"""The GGUF converter: ``transformer/`` of a Hub-layout Cosmos3 checkpoint written as one GGUF file (the layout and
metadata ``gguf_file.py`` reads), quantized by the ``gguf`` package (``gguf.quants.quantize``), written by its
``GGUFWriter``. ``python -m cosmos3_core.gguf --checkpoint DIR --type Q8_0 --out FILE`` runs it. The source is the
checkpoint folder or its ``transformer/`` folder itself (as everywhere a checkpoint is read); either writes the same
file, ``general.name`` being the checkpoint folder's name.

What it writes: every tensor of ``transformer/`` except ``lm_head`` (the reasoner reads that from the Hub folder).
The linear weights of the decoder layers (``layers.*``, both towers) in the asked type — Q8_0, Q5_1, Q5_0, Q4_1,
Q4_0 (the types the ``gguf`` package quantizes); 1-D tensors, tensors of at most 1024 values and the fp32 time
embedder in F32; every other tensor (the embedding, ``proj_in``/``proj_out``, the action heads) and a decoder-layer
weight whose rows are not whole blocks in its source dtype (F32, F16 or BF16: not rounded). ``BF16``/``F16``/``F32``
as the type write the decoder layers unquantized (an input for llama.cpp's quantize tool, whose K-quants Q4_K, Q5_K
and Q6_K the loader reads). An NVIDIA FP8 checkpoint is refused: convert the bf16 (main) revision.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open

from ..config import CheckpointError, Cosmos3Config, transformer_dir
from .gguf_file import ARCHITECTURE, CONFIG_KEY, gguf_package
from .gguf_quants import BY_NAME, PLAIN
from .layers import KEEP_FP32
from .loader import read_fp8_checkpoint, weight_files

WRITABLE = ("Q8_0", "Q5_1", "Q5_0", "Q4_1", "Q4_0", "BF16", "F16", "F32")
SMALL = 1024  # tensors of at most this many values stay F32 (as ComfyUI-GGUF's converter keeps them)
# gguf's LlamaFileType of each writable type (general.file_type)
FILE_TYPES = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9, "BF16": 32}


def tensor_type(name: str, tensor: torch.Tensor, asked: str) -> str:
    """The GGML type the converter writes checkpoint tensor ``name`` in when ``asked`` is the file's type."""
    if tensor.ndim < 2 or tensor.numel() <= SMALL or name.split(".")[0] in KEEP_FP32:
        return "F32"
    source = {torch.float16: "F16", torch.bfloat16: "BF16"}.get(tensor.dtype, "F32")
    if not (name.startswith("layers.") and name.endswith(".weight") and tensor.ndim == 2):
        return source
    if asked in PLAIN:
        return asked
    return asked if tensor.shape[-1] % BY_NAME[asked].block == 0 else source


def _encode(gguf, tensor: torch.Tensor, kind: str) -> tuple[np.ndarray, object]:
    """(the array ``GGUFWriter.add_tensor`` takes, its ``raw_dtype``) for ``tensor`` written as ``kind``."""
    values = tensor.detach().float().cpu().numpy()
    if kind == "F32":
        return values, None
    if kind == "F16":
        return values.astype(np.float16), None
    qtype = gguf.GGMLQuantizationType[kind]
    return gguf.quants.quantize(values, qtype), qtype


def _tensors(checkpoint_dir: str | Path):
    """(name, tensor) of every transformer tensor but ``lm_head``, one file open at a time."""
    by_file: dict[Path, list[str]] = {}
    for name, path in weight_files(checkpoint_dir).items():
        if name != "lm_head.weight":
            by_file.setdefault(path, []).append(name)
    for path, names in by_file.items():
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for name in sorted(names):
                yield name, f.get_tensor(name)


def write_gguf(checkpoint_dir: str | Path, out: str | Path, qtype: str) -> dict[str, int]:
    """Write ``<checkpoint_dir>/transformer`` (or ``checkpoint_dir`` when it is that ``transformer`` folder) to the
    GGUF file ``out`` in type ``qtype``; returns how many tensors were written in each GGML type."""
    if qtype not in WRITABLE:
        raise ValueError(f"--type {qtype!r} is not one the converter writes; choose one of {', '.join(WRITABLE)} "
                         "(K-quants: write BF16, then quantize it with llama.cpp).")
    source = Path(checkpoint_dir)
    Cosmos3Config.from_checkpoint(source)  # a folder that is not a Cosmos3 checkpoint is refused here
    if read_fp8_checkpoint(source) is not None:
        raise CheckpointError(f"{source} is an NVIDIA FP8 (ModelOpt) checkpoint; convert the bf16 checkpoint (the "
                              "main revision) to GGUF instead.")
    gguf = gguf_package()
    folder = transformer_dir(source)
    raw_config = json.loads((folder / "config.json").read_text())
    writer = gguf.GGUFWriter(str(out), ARCHITECTURE)
    writer.add_name(folder.absolute().parent.resolve().name)  # the checkpoint's name, whichever folder was given
    writer.add_string(CONFIG_KEY, json.dumps(raw_config, sort_keys=True))
    writer.add_file_type(FILE_TYPES[qtype])
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    counts: dict[str, int] = {}
    for name, tensor in _tensors(source):
        kind = tensor_type(name, tensor, qtype)
        counts[kind] = counts.get(kind, 0) + 1
        data, raw_dtype = _encode(gguf, tensor, kind)
        writer.add_tensor(name, data, raw_dtype=raw_dtype)
    with warnings.catch_warnings():  # the writer logs its endianness; nothing to tell the user
        warnings.simplefilter("ignore")
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    writer.close()
    return counts

"""Cosmos3 transformer weights in a GGUF file, read and checked: damaged, truncated, of another model, of a type
this pack cannot dequantize — each one ``CheckpointError`` naming the file and the fix (``gguf_write.py`` writes
them: the converter, ``python -m cosmos3_core.gguf``).

The file format is GGUF (ggml's ``docs/gguf.md``), read and written with the ``gguf`` package, the field's tool, as
city96's ComfyUI-GGUF stores diffusion models: one tensor per checkpoint key, named as in ``transformer/*.safetensors``
(``layers.3.self_attn.to_q.weight``), its GGML type per tensor, dimensions innermost first (``[in, out]`` for a
``[out, in]`` weight). A file written by tools that reshape tensors whose rows do not fill whole blocks records the
real shape as ``comfy.gguf.orig_shape.<name>`` (ComfyUI-GGUF's key); it is honoured.

Metadata this pack writes and reads:

* ``general.architecture`` ``"cosmos3"`` — a GGUF of another architecture is refused by name;
* ``cosmos3.config`` — the source's ``transformer/config.json`` (JSON text): the loader refuses a file whose
  architecture fields (``Cosmos3Config``) differ from those of the Hub folder it is loaded with, naming both;
* ``general.name`` (the source folder's name), ``general.file_type`` and ``general.quantization_version``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
import torch

from ..config import CheckpointError, Cosmos3Config
from .gguf_quants import QUANTIZED, TYPES, QuantType

ARCHITECTURE = "cosmos3"
CONFIG_KEY = f"{ARCHITECTURE}.config"
ORIG_SHAPE_PREFIX = "comfy.gguf.orig_shape."
_SUPPORTED = ", ".join(QUANTIZED)


def gguf_package():
    try:
        import gguf
    except ImportError as exc:  # a requirement of the pack; say how to get it rather than fail obscurely
        raise CheckpointError("reading or writing GGUF files needs the gguf package (pip install gguf, from the "
                              "pack's requirements.txt).") from exc
    return gguf


@dataclass(frozen=True)
class GgufTensor:
    """One tensor of a GGUF file: its GGML type, its shape in PyTorch order and its bytes (a view of the file)."""

    name: str
    qtype: QuantType
    shape: tuple[int, ...]
    data: np.ndarray

    def raw(self) -> torch.Tensor:
        """The tensor's bytes as a ``uint8`` tensor in memory (copied out of the file)."""
        return torch.from_numpy(np.array(self.data).view(np.uint8).reshape(-1))


@dataclass(frozen=True)
class GgufFile:
    path: Path
    architecture: str | None
    name: str | None
    config: dict | None
    tensors: dict[str, GgufTensor]


def _damaged(path: Path, why: str) -> CheckpointError:
    return CheckpointError(f"GGUF file {path} is damaged or truncated ({why}); download or convert it again "
                           "(python -m cosmos3_core.gguf --checkpoint DIR --type Q8_0 --out FILE).")


def _unknown_type(path: Path, what: str) -> CheckpointError:
    return CheckpointError(f"GGUF file {path} uses quantization type {what}, which this pack cannot dequantize "
                           f"(it reads {_SUPPORTED}, F32, F16 and BF16); re-quantize the Cosmos3 weights to one of "
                           "those (python -m cosmos3_core.gguf --type Q8_0, or llama.cpp's quantize with Q4_K/Q5_K/"
                           "Q6_K).")


def _open_reader(path: Path):
    gguf = gguf_package()
    try:
        return gguf.GGUFReader(str(path))
    except ValueError as exc:
        found = re.search(r"(\d+)\)? is not a valid GGMLQuantizationType", str(exc))
        if found:
            raise _unknown_type(path, f"id {found.group(1)} (unknown to the gguf package)") from exc
        raise _damaged(path, str(exc)) from exc
    except (OSError, KeyError, IndexError, TypeError, OverflowError, UnicodeDecodeError) as exc:
        raise _damaged(path, f"{type(exc).__name__}: {exc}") from exc


def _field(reader, key: str):
    field = reader.get_field(key)
    if field is None:
        return None
    try:
        return field.contents()
    except (ValueError, IndexError, UnicodeDecodeError):
        return None


def read_gguf(path: str | Path) -> GgufFile:
    """The metadata and tensors of the GGUF file ``path`` (memory-mapped; nothing is copied yet)."""
    path = Path(path)
    if path.is_dir():
        inside = sorted(p.name for p in path.glob("*.gguf"))[:4]
        raise CheckpointError(f"GGUF file {path} is a folder, not a .gguf file; give the .gguf file's own path"
                              + (f" (in it: {', '.join(inside)})." if inside else "."))
    if not path.is_file():
        raise CheckpointError(f"GGUF file {path} does not exist; put the .gguf file under ComfyUI's "
                              "models/diffusion_models (or models/unet) folder, or give its full path.")
    reader = _open_reader(path)
    tensors = {}
    for t in reader.tensors:
        qtype = TYPES.get(int(t.tensor_type))
        if qtype is None:
            raise _unknown_type(path, f"{t.tensor_type.name} (tensor {t.name!r})")
        shape = _field(reader, ORIG_SHAPE_PREFIX + t.name)
        shape = tuple(int(v) for v in (shape if shape else reversed(t.shape.tolist())))
        if t.data.nbytes != int(np.prod(shape)) * qtype.type_size // qtype.block:
            raise _damaged(path, f"tensor {t.name!r} holds {t.data.nbytes} bytes, not the {qtype.name} size of "
                                 f"shape {shape}")
        tensors[t.name] = GgufTensor(t.name, qtype, shape, t.data)
    config = _field(reader, CONFIG_KEY)
    try:
        config = json.loads(config) if isinstance(config, str) else None
    except json.JSONDecodeError as exc:
        raise _damaged(path, f"its {CONFIG_KEY} metadata is not JSON") from exc
    return GgufFile(path, _field(reader, "general.architecture"), _field(reader, "general.name"), config, tensors)


def _architecture_fields(config: Cosmos3Config) -> dict:
    return {f.name: getattr(config, f.name) for f in fields(config) if f.name != "source"}


def check_model(gguf_file: GgufFile, config: Cosmos3Config, folder: Path) -> None:
    """Refuse a GGUF of another architecture, or of another Cosmos3 than the Hub folder ``folder`` (``config``)."""
    path, arch = gguf_file.path, gguf_file.architecture
    if arch != ARCHITECTURE:
        named = f"a GGUF of {arch!r}" + (f" ({gguf_file.name})" if gguf_file.name else "") if arch else \
            "a GGUF without general.architecture"
        raise CheckpointError(f"GGUF file {path} is {named}, not of a Cosmos3 transformer; choose a Cosmos3 GGUF "
                              "(python -m cosmos3_core.gguf writes one from a Cosmos3 checkpoint).")
    if gguf_file.config is None:
        return  # no recorded config (another writer): the tensor shapes are checked against config.json on load
    theirs = _architecture_fields(Cosmos3Config.from_dict(gguf_file.config, source=str(path)))
    ours = _architecture_fields(config)
    differ = [k for k in ours if theirs.get(k) != ours[k]]
    if differ:
        shown = ", ".join(f"{k} {theirs.get(k)} vs {ours[k]}" for k in differ[:4])
        raise CheckpointError(f"GGUF file {path} was converted from another Cosmos3 model ({gguf_file.name or '?'}) "
                              f"than the checkpoint folder {folder} ({shown}); pick the checkpoint folder the GGUF "
                              "was made from (same size: Nano, Super or Edge) for its VAE, tokenizer and configs.")

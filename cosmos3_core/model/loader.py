"""Load ``transformer/`` of a Hub-layout Cosmos3 checkpoint into ``Cosmos3Transformer`` by parameter name.

Mirrors how diffusers 0.42.1 ``ModelMixin.from_pretrained`` reads ``Cosmos3OmniTransformer`` (sharded
``diffusion_pytorch_model-*.safetensors`` + ``diffusion_pytorch_model.safetensors.index.json``, or one
``diffusion_pytorch_model.safetensors``), without its machinery: the module tree is built on the ``meta`` device,
each tensor is read memory-mapped from safetensors (never pickle), cast to the requested dtype (``time_embedder``
stays fp32) and assigned in place — so the peak host memory is one tensor, not a second copy of the model. A load
straight to a GPU moves each tensor through a ring of pinned staging buffers (``kernels.host_copy``) rather than by
``Tensor.to``'s pageable copy (``pinned_staging=False``: by ``Tensor.to``).

Every key must be accounted for: a key the model lacks, a key the checkpoint lacks, or a shape that disagrees
with ``config.json`` is one error naming the first few offenders (and the GGUF file, with the fix, when a GGUF's
tensor names are the ones that do not fit). Weights deliberately left out
(``skip_modules``: ``lm_head`` for generation-only use, the action heads) are listed explicitly.

``load_diffusers_folder`` is the one guarded entry for the diffusers modules of a checkpoint (``vae/``,
``sound_tokenizer/``): it checks ``config.json`` and every weight file itself first — safetensors only, never a
pickle (``.bin``/``.pt``/``.ckpt``), a damaged file named with the fix — then builds the module the way
``from_pretrained(torch_dtype=...)`` ends up with it: ``from_config`` on the ``meta`` device (no random init, no
``accelerate``), every tensor of the files read memory-mapped, cast to the dtype (floating tensors; the modules have
no ``_keep_in_fp32_modules``) and assigned, each key accounted for. ``checkpoint_fingerprint`` is what a cache of
loaded checkpoints keys on: it changes when a folder is replaced under the same name.

Linear weights may be stored narrower than the compute dtype (``storage_dtype``, e.g. FP8), and NVIDIA's FP8
(ModelOpt) checkpoints load as published (FP8 weight + tensorwise scale); see ``weights.py`` for both. Their
linears are ``fp8.Fp8Linear`` (by default), given the checkpoint's activation and W8A8 weight scales
(``X.input_quantizer._amax`` / ``X.input_scale``, ``X.weight_quantizer._amax``) and the reference's path class;
``fp8_compute=True`` quantizes a bf16 checkpoint's decoder-layer linears the same way at load (approximate FP8
compute, ``fp8.py``). ``model.fp8_checkpoint`` (``weights.Fp8Checkpoint``) is then what the step policy reads.

A distributed load passes a ``WeightSharding`` (``sharding=``; parallel/tensor.py's ``TensorParallel``): it splits
the meta-built model (``shard``), says which slice of each checkpoint tensor this rank holds (``source``), and
makes the model's parameter from that slice (``place``). Each rank then reads only its slices (safetensors'
``get_slice``), never a whole sharded tensor, and every per-tensor step above (FP8 scales, casts) runs on the slice.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, Sequence

import torch
from safetensors import SafetensorError, safe_open

from ..config import CheckpointError, Cosmos3Config, transformer_dir
from ..kernels.host_copy import StagedCopier, staging_to
from .fp8 import Fp8Linear, quantize_weight, scale_of_amax
from .gguf_file import GgufFile, check_model, read_gguf
from .gguf_quants import QUANTIZED, GgufLinear, dequantize, packed_shape
from .layers import KEEP_FP32
from .precision import linear_path
from .towers import tower_module
from .transformer import Cosmos3Transformer
from .weights import (
    AMAX_SUFFIX,
    FP8_DTYPES,
    INPUT_SCALE_SUFFIXES,
    WEIGHT_SCALE_SUFFIXES,
    CastLinear,
    Fp8Checkpoint,
    fp8_checkpoint,
    is_dropped,
    is_modelopt_fp8,
    missing_scale_error,
    read_scale,
    scale_key,
    stored_linear_weight,
)

INDEX_FILE = "diffusion_pytorch_model.safetensors.index.json"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
SINGLE_FILE = "diffusion_pytorch_model.safetensors"


class WeightSharding(Protocol):
    """How a distributed load splits the transformer's weights across ranks (see the module docstring)."""

    def shard(self, model: torch.nn.Module) -> None: ...

    def source(self, name: str, param: torch.Tensor) -> tuple[tuple[int, ...], tuple[slice, ...] | None]: ...

    def place(self, local: torch.Tensor, param: torch.Tensor) -> torch.Tensor: ...


def weight_files(checkpoint_dir: str | Path) -> dict[str, Path]:
    """Map every tensor name to the safetensors file that holds it (validating that the files exist)."""
    folder = transformer_dir(checkpoint_dir)
    index = folder / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, json.JSONDecodeError, KeyError) as exc:
            raise CheckpointError(f"{index} is not a valid safetensors index ({exc}).") from exc
        files = {name: folder / shard for name, shard in weight_map.items()}
        missing = sorted({p.name for p in files.values() if not p.is_file()})
        if missing:
            raise CheckpointError(
                f"{folder}: shard file(s) {missing} listed in {INDEX_FILE} are missing; "
                "the download is incomplete — fetch the missing files into that folder."
            )
        return files
    single = folder / SINGLE_FILE
    if single.is_file():
        with _open(single) as f:
            return {name: single for name in f.keys()}
    raise CheckpointError(
        f"{folder}: no {INDEX_FILE} or {SINGLE_FILE}; this is not a Cosmos3 transformer folder."
    )


def _open(path: Path):
    try:
        return safe_open(str(path), framework="pt", device="cpu")
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{path} is damaged or truncated ({exc}); download it again.") from exc


def _skipped(name: str, skip_modules: Sequence[str]) -> bool:
    return any(name == m or name.startswith(m + ".") for m in skip_modules)


@dataclass(frozen=True)
class LinearOps:
    """The linear-layer classes a load builds, by how the weights are stored: the one seam where a host plugs in
    its own layers (as ComfyUI's ``operations`` and ComfyUI-GGUF's ops do).

    ``linear``: weights in the compute dtype, or cast per call (a subclass of ``nn.Linear`` with the same
    parameters, e.g. ComfyUI's ``comfy.ops.disable_weight_init.Linear``, which can stream its weights from the
    offload device when VRAM is short; a plain ``nn.Linear`` becomes ``CastLinear`` when the storage dtype differs).
    ``scaled_linear``: FP8 weights kept with their ModelOpt scale (a linear layer with an fp32 ``scale_weight``
    parameter, e.g. ``CastLinear`` or ComfyUI's ``comfy.ops.scaled_fp8_ops().Linear``; ``Fp8Linear`` and its
    subclasses also get their W8A8 scales). ``quantized_linear``: GGUF weights kept as GGML blocks (``GgufLinear``
    or a host's subclass)."""

    linear: type[torch.nn.Linear] = torch.nn.Linear
    scaled_linear: type[torch.nn.Linear] = Fp8Linear
    quantized_linear: type[torch.nn.Linear] = GgufLinear


def load_transformer(
    checkpoint_dir: str | Path,
    dtype: torch.dtype = torch.bfloat16,
    device: torch.device | str = "cpu",
    skip_modules: Sequence[str] = (),
    ops: LinearOps = LinearOps(),
    storage_dtype: torch.dtype | None = None,
    fp8_compute: bool = False,
    sharding: WeightSharding | None = None,
    gguf_file: str | Path | None = None,
    pinned_staging: bool = True,
) -> Cosmos3Transformer:
    """Build ``Cosmos3Transformer`` from ``<checkpoint_dir>/transformer`` computing in ``dtype`` on ``device``.

    ``ops``: the linear-layer classes, by how the weights are stored (``LinearOps``). ``storage_dtype`` (None: the
    compute dtype, or FP8 as an FP8 checkpoint stores it) is the dtype of the linear weights. ``fp8_compute``:
    quantize a bf16 checkpoint's decoder-layer linears to FP8 with per-tensor scales at load (approximate FP8
    compute; W8A8 with dynamic activation scales). ``sharding``: this rank's part of a distributed load (module
    docstring). ``gguf_file``: the weights come from this GGUF file (``gguf_file.py``), every linear layer is an
    ``ops.quantized_linear`` and the quantized ones keep their GGML blocks; tensors the file lacks come from
    ``transformer/`` as usual. ``pinned_staging``: a load to a CUDA device moves the tensors through pinned buffers
    (``kernels.host_copy``), else by ``Tensor.to``."""
    config = Cosmos3Config.from_checkpoint(checkpoint_dir)
    folder = transformer_dir(checkpoint_dir)
    config_values = _config_values(folder)
    gguf = None if gguf_file is None else _open_gguf(gguf_file, config, folder, fp8_compute, storage_dtype, sharding)
    files = weight_files(checkpoint_dir) if gguf is None else _companion_files(checkpoint_dir, config_values)
    fp8 = None if gguf is not None else fp8_checkpoint(config_values, files, fp8_compute=fp8_compute,
                                                        where=str(folder))
    _check_fp8_compute(fp8_compute, storage_dtype, ops, sharding)
    modelopt = fp8 is not None and is_modelopt_fp8(config_values, set(files))
    check_fp8_storage(modelopt, storage_dtype, str(folder))
    keep_fp8 = (modelopt and storage_dtype in (None, torch.float8_e4m3fn)) or fp8_compute
    linear = _layer_class(ops, keep_fp8=keep_fp8, gguf=gguf is not None, storage_dtype=storage_dtype, dtype=dtype)
    with torch.device("meta"):
        model = Cosmos3Transformer(config, skip_modules=skip_modules, linear=linear)
    if sharding is not None:
        sharding.shard(model)
    params = model.state_dict(keep_vars=True)
    slices = {name: sharding.source(name, p) if sharding is not None else (tuple(p.shape), None)
              for name, p in params.items()}
    expected = {name: shape for name, (shape, _) in slices.items()}
    linear_weights = {f"{name}.weight" for name, m in model.named_modules()
                      if isinstance(m, torch.nn.Linear) and name.split(".")[0] not in KEEP_FP32}
    from_gguf = set() if gguf is None else {name for name in gguf.tensors if not _skipped(name, skip_modules)}
    wanted = _wanted_files(files, from_gguf, expected, skip_modules, folder, None if gguf is None else gguf.path)
    with _copier_to(device, pinned_staging) as copier:
        storage = _Storage(folder, files, dtype, storage_dtype, device, modelopt, fp8_compute, copier)
        state = _read_files(wanted, slices, linear_weights, storage)
        if gguf is not None:
            state.update(_read_gguf(model, gguf, sorted(from_gguf), expected, linear_weights, storage))
    if sharding is not None:
        state = {name: sharding.place(value, params[name]) for name, value in state.items()}
    model.load_state_dict(state, strict=True, assign=True)
    model.fp8_checkpoint = fp8 if keep_fp8 else None  # bf16/fp16 storage dequantized it: a dense model
    if model.fp8_checkpoint is not None:
        _set_w8a8_scales(model, files, folder, approximate=fp8.approximate, device=device)
    return model.eval().requires_grad_(False)


def _check_fp8_compute(fp8_compute: bool, storage_dtype, ops: LinearOps, sharding) -> None:
    if fp8_compute and (storage_dtype is not None or not issubclass(ops.scaled_linear, Fp8Linear)):
        raise ValueError("fp8_compute stores the linear weights in FP8 itself, in its own layers (Fp8Linear or a "
                         "subclass); leave storage_dtype unset.")
    if fp8_compute and sharding is not None:
        raise ValueError("fp8_compute rounds each weight with one scale of the whole tensor, which a sharded load "
                         "never reads whole; load the bf16 checkpoint without it for a tensor-parallel run.")


def _layer_class(ops: LinearOps, *, keep_fp8: bool, gguf: bool, storage_dtype, dtype) -> type[torch.nn.Linear]:
    """The class of every linear layer of this load: GGML blocks, FP8 kept with its scale, or dense (cast per
    call when a plain ``nn.Linear`` would hold weights stored in another dtype than the compute dtype)."""
    if gguf:
        return ops.quantized_linear
    if keep_fp8:
        return ops.scaled_linear
    if ops.linear is torch.nn.Linear and storage_dtype not in (None, dtype):
        return CastLinear
    return ops.linear


def _wanted_files(files: dict[str, Path], from_gguf: set[str], expected: dict, skip_modules: Sequence[str],
                  folder: Path, gguf_path: Path | None = None) -> dict[str, Path]:
    """The safetensors tensors to read (by name, with their file), once every key is accounted for: the model's
    keys less the GGUF's and the scales (read with their weight), against the files' less the skipped and dropped
    ones. A mismatch is one error naming the first few offenders — the GGUF file ``gguf_path`` when it holds names
    the model lacks (with those the model then misses), else the folder."""
    scales = {name for name in expected if name.endswith(".scale_weight")}
    wanted = {name: path for name, path in files.items()
              if not _skipped(name, skip_modules) and not is_dropped(name)
              and not name.endswith(WEIGHT_SCALE_SUFFIXES) and name not in from_gguf}
    missing = sorted(set(expected) - set(wanted) - from_gguf - scales)
    foreign = sorted(from_gguf - set(expected))
    if gguf_path is not None and foreign:
        raise _gguf_names_error(gguf_path, folder, foreign, missing)
    unexpected = sorted(set(wanted) - set(expected))
    if missing or unexpected:
        raise CheckpointError(
            f"{folder}: weights do not match config.json — "
            f"{len(missing)} missing (e.g. {missing[:4]}), {len(unexpected)} unexpected (e.g. {unexpected[:4]}). "
            "The config and the weights belong to different models, or the download is incomplete."
        )
    return wanted


def _gguf_names_error(path: Path, folder: Path, foreign: list[str], missing: list[str]) -> CheckpointError:
    """A GGUF whose tensor names are not this model's (another tool's naming, e.g. ``model.diffusion_model.*``, or
    another model), named with a few of the unexpected and missing names and the fix."""
    found = [f"{len(names)} {what} (e.g. {names[:4]})" for names, what in (
        (foreign, "unexpected"), (missing, "missing from both the GGUF and the checkpoint folder")) if names]
    return CheckpointError(
        f"GGUF file {path}: its tensor names are not those of the Cosmos3 transformer that {folder}/config.json "
        f"describes — {', '.join(found)}. It was written for another model or by another tool; convert the Hub "
        "checkpoint with python -m cosmos3_core.gguf --checkpoint DIR --type Q8_0 --out FILE, or pick the GGUF made "
        "for this model."
    )


@dataclass(frozen=True)
class _Storage:
    """How one load keeps what it reads: the compute dtype, the linear weights' storage dtype, the device, and
    whether the FP8 scales come with the weights (a ModelOpt checkpoint) or are made at load (``fp8_compute``),
    and the pinned staging a load to a GPU moves its tensors through (``copier``; none elsewhere)."""

    folder: Path
    files: dict[str, Path]
    dtype: torch.dtype
    storage_dtype: torch.dtype | None
    device: torch.device | str
    modelopt: bool
    fp8_compute: bool
    copier: StagedCopier | None = None

    def to_device(self, tensor: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        """``tensor`` on the load's device in ``dtype`` (None: its own); cast on the host first, then staged."""
        if dtype is not None and tensor.dtype != dtype:
            if self.copier is None:
                return tensor.to(device=self.device, dtype=dtype)
            tensor = tensor.to(dtype)
        return tensor.to(self.device) if self.copier is None else self.copier.copy(tensor)


def _copier_to(device, pinned_staging: bool = True):
    """The staging a load to ``device`` uses, as a context that waits for its copies at the end: pinned buffers for
    a CUDA device (``kernels.host_copy``; BENCHMARKS.md, "The shipped staging end to end": Nano's load 4.20 → 2.05 s
    on an H100), none elsewhere or when ``pinned_staging`` is off."""
    return staging_to(device, pinned_staging) or contextlib.nullcontext()


def _read_files(wanted: dict[str, Path], slices: dict, linear_weights: set[str],
                storage: _Storage) -> dict[str, torch.Tensor]:
    """The state of the ``wanted`` tensors, read file by file (each tensor, or this rank's slice of it, memory-
    mapped); a layer's ``scale_weight`` starts at 1 and is set with its weight."""
    state = {name: torch.ones((), dtype=torch.float32, device=storage.device)
             for name in slices if name.endswith(".scale_weight")}
    by_file: dict[Path, list[str]] = {}
    for name, path in wanted.items():
        by_file.setdefault(path, []).append(name)
    for path, names in by_file.items():
        with _open(path) as f:
            for name in names:
                shape, part = slices[name]
                tensor = _read(f, path, name, shape, part)
                if name in linear_weights:
                    _store_linear_weight(state, name, tensor, storage)
                else:
                    target = torch.float32 if name.split(".")[0] in KEEP_FP32 else storage.dtype
                    state[name] = storage.to_device(tensor, target)
    return state


def _store_linear_weight(state: dict[str, torch.Tensor], name: str, tensor: torch.Tensor, storage: _Storage) -> None:
    """A linear weight into ``state`` as its layer keeps it: stored dtype plus ``scale_weight`` where the layer
    has one, else dequantized (never a dropped scale)."""
    scale = _scale_of(name, storage.files, storage.folder) if storage.modelopt else None
    if storage.fp8_compute and name.startswith("layers."):
        tensor, scale = quantize_weight(tensor)
    if tensor.dtype in FP8_DTYPES and scale is None and storage.modelopt:
        raise missing_scale_error(name, tensor.dtype, str(storage.folder))
    tensor, scale = stored_linear_weight(tensor, scale, storage.dtype, storage.storage_dtype)
    scale_name = name[: -len(".weight")] + ".scale_weight"
    if scale_name in state:
        state[scale_name] = scale.to(storage.device)
    elif float(scale) != 1.0:  # a host class without scale_weight: never drop the scale
        tensor = (tensor.float() * scale).to(storage.dtype)
    state[name] = storage.to_device(tensor)


def _open_gguf(path, config: Cosmos3Config, folder: Path, fp8_compute: bool, storage_dtype, sharding) -> GgufFile:
    """The GGUF file a load reads its weights from, checked to be of this Cosmos3 and loaded as it is stored."""
    if fp8_compute or storage_dtype is not None or sharding is not None:
        raise ValueError("a GGUF file is loaded as its GGML types store it: leave weight_dtype auto (no FP8 compute "
                         "or storage dtype) and load it on one GPU (no tensor parallelism).")
    gguf = read_gguf(path)
    check_model(gguf, config, folder.parent)
    return gguf


def _companion_files(checkpoint_dir: str | Path, config_values: dict) -> dict[str, Path]:
    """The safetensors weights of the Hub folder a GGUF load reads the tensors the GGUF lacks from: none when the
    folder holds no transformer weights (only its configs, VAE and tokenizer) or holds the FP8 revision's."""
    folder = transformer_dir(checkpoint_dir)
    if not (folder / INDEX_FILE).is_file() and not (folder / SINGLE_FILE).is_file():
        return {}
    files = weight_files(checkpoint_dir)
    return {} if is_modelopt_fp8(config_values, set(files)) else files


def _read_gguf(model, gguf: GgufFile, names: list[str], expected: dict, linear_weights: set[str],
               storage: _Storage) -> dict[str, torch.Tensor]:
    """The state of the tensors ``names`` read from ``gguf``: a quantized linear weight as its GGML blocks (its
    layer made to hold them, ``GgufLinear.quantize_as``), everything else dequantized to the compute dtype (the
    fp32 modules to fp32)."""
    state = {}
    for name in names:
        t = gguf.tensors[name]
        if tuple(t.shape) != tuple(expected[name]):
            raise CheckpointError(f"GGUF file {gguf.path}: {name!r} has shape {t.shape} but config.json implies "
                                  f"{tuple(expected[name])}; the GGUF and the checkpoint folder belong to different "
                                  "models.")
        raw = t.raw()
        keep_fp32 = name.split(".")[0] in KEEP_FP32
        if name in linear_weights and t.qtype.name in QUANTIZED and not keep_fp32:
            model.get_submodule(name[: -len(".weight")]).quantize_as(t.qtype)
            state[name] = storage.to_device(raw.reshape(packed_shape(t.shape, t.qtype)))
        else:
            target = torch.float32 if keep_fp32 else storage.dtype
            state[name] = storage.to_device(dequantize(raw, t.qtype, t.shape), target)
    return state


def _set_w8a8_scales(model: Cosmos3Transformer, files: dict[str, Path], folder: Path, *, approximate: bool,
                     device) -> None:
    """Each FP8 ``Fp8Linear``'s path class, activation scale (``scale_a``) and W8A8 weight scale (``scale_b``) from
    the checkpoint's quantizer tensors, as ModelOpt computes them on the GPU (``fp8.scale_of_amax``; an
    ``input_scale`` is ``amax / 448`` already); approximate mode: dynamic activation scales and ``scale_b`` = the
    weight's own scale."""
    layers = {name: m for name, m in model.named_modules()
              if isinstance(m, Fp8Linear) and m.weight.dtype == torch.float8_e4m3fn}
    wanted = [name + suffix for name in layers for suffix in (*INPUT_SCALE_SUFFIXES, AMAX_SUFFIX)]
    by_file: dict[Path, list[str]] = {}
    for key in wanted:
        if key in files and not approximate:
            by_file.setdefault(files[key], []).append(key)
    scalars = {}
    for path, keys in by_file.items():
        with _open(path) as f:
            scalars.update({key: read_scale(key, _read(f, path, key), str(folder)) for key in keys})
    for name, module in layers.items():
        module.path = linear_path(name)
        if approximate:
            module.dynamic_input = True
            continue
        amax, given = scalars.get(name + INPUT_SCALE_SUFFIXES[0]), scalars.get(name + INPUT_SCALE_SUFFIXES[1])
        if amax is not None or given is not None:
            module.input_scale = (scale_of_amax(amax) if amax is not None else given).to(device)
        weight_amax = scalars.get(name + AMAX_SUFFIX)
        if weight_amax is not None:
            module.w8a8_weight_scale = scale_of_amax(weight_amax).to(device)


def check_fp8_storage(modelopt: bool, storage_dtype: torch.dtype | None, where: str) -> None:
    """An NVIDIA FP8 (ModelOpt, e4m3 + scales) checkpoint is kept as published: another FP8 storage dtype would
    re-quantize its weights (fp8_e5m2: a max change of ~1.3 on the tiny checkpoint), with no word."""
    if modelopt and storage_dtype is not None and storage_dtype.itemsize == 1 and storage_dtype != torch.float8_e4m3fn:
        name = str(storage_dtype).removeprefix("torch.").replace("float8", "fp8")
        raise CheckpointError(f"{where}: the checkpoint is already NVIDIA FP8 (ModelOpt, e4m3 with scales); "
                              f"weight_dtype {name} would re-quantize it and change its weights — load it as it is "
                              "(weight_dtype auto or fp8_e4m3fn).")


def read_fp8_checkpoint(checkpoint_dir: str | Path, fp8_compute: bool = False) -> Fp8Checkpoint | None:
    """The transformer's FP8 layout (``weights.fp8_checkpoint``) from its config and tensor names, before any
    weight is read; a damaged or missing weights file is left to the load, which names it."""
    folder = transformer_dir(checkpoint_dir)
    try:
        names = weight_files(checkpoint_dir)
    except CheckpointError:
        names = {}
    return fp8_checkpoint(_config_values(folder), names, fp8_compute=fp8_compute, where=str(folder))


def _config_values(folder: Path) -> dict:
    try:
        return json.loads((folder / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def _read(f, path: Path, name: str, shape: tuple[int, ...] | None = None,
          index: tuple[slice, ...] | None = None) -> torch.Tensor:
    """Tensor ``name`` of the open file ``f``, checked to have ``shape`` (the one ``config.json`` implies), or
    only its ``index`` slice (a sharded load: the rest is never read)."""
    try:
        part = f.get_slice(name)
        found = tuple(part.get_shape())
        if shape is None or found == tuple(shape):
            return f.get_tensor(name) if index is None else part[index]
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise CheckpointError(f"{path}: tensor {name!r} is unreadable ({exc}); download it again.") from exc
    raise CheckpointError(f"{path}: {name!r} has shape {found} but config.json implies {tuple(shape)}; the config "
                          "and the weights belong to different models.")


def _scale_of(weight_name: str, files: dict[str, Path], folder: Path) -> torch.Tensor | None:
    key = scale_key(weight_name, files)
    if key is None:
        return None
    with _open(files[key]) as f:
        return read_scale(key, _read(f, files[key], key), str(folder))


def load_diffusers_folder(module_cls, folder: Path, what: str, dtype: torch.dtype) -> torch.nn.Module:
    """``module_cls`` (a diffusers ``ModelMixin``) from a local folder of ``config.json`` + safetensors, as
    ``module_cls.from_pretrained(folder, torch_dtype=dtype)`` gives it; any problem is one ``CheckpointError`` naming
    the file and the fix (never diffusers' traceback, never a pickle load)."""
    folder = Path(folder)
    redownload = f"download the checkpoint's {folder.name}/ folder again"
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise CheckpointError(f"{config_path} not found: the {what} folder {folder.name}/ must hold config.json and "
                              f"diffusion_pytorch_model*.safetensors; {redownload}.")
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{config_path} is not readable JSON ({exc}); {redownload}.") from exc
    weights = sorted(folder.glob("*.safetensors"))
    pickles = sorted(p.name for p in folder.iterdir() if p.suffix.lower() in PICKLE_SUFFIXES)
    if not weights:
        found = f"only pickle weights {pickles}, which are never loaded (unsafe)" if pickles else "no weights"
        raise CheckpointError(f"{folder}: the {what} has {found}; it needs diffusion_pytorch_model*.safetensors — "
                              f"{redownload} (or convert the weights to safetensors).")
    try:
        module = _build_on_meta(module_cls, config)
    except (TypeError, ValueError, KeyError) as exc:
        raise CheckpointError(f"{config_path}: the {what} cannot be built from it ({exc}); {redownload}.") from exc
    expected = module.state_dict(keep_vars=True)
    state: dict[str, torch.Tensor] = {}
    for path in weights:
        with _open(path) as f:
            for name in f.keys():
                tensor = _read(f, path, name)
                if name in expected and tuple(tensor.shape) != tuple(expected[name].shape):
                    raise CheckpointError(f"{path}: {name!r} has shape {tuple(tensor.shape)} but config.json implies "
                                          f"{tuple(expected[name].shape)}; {redownload}.")
                state[name] = tensor.to(dtype) if tensor.is_floating_point() else tensor
    missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    if missing or unexpected:
        raise CheckpointError(f"{folder}: the {what}'s weights do not match its config.json — {len(missing)} "
                              f"missing (e.g. {missing[:3]}), {len(unexpected)} unexpected (e.g. {unexpected[:3]}); "
                              f"{redownload}.")
    module.load_state_dict(state, strict=True, assign=True)
    return module.eval()


def _build_on_meta(module_cls, config: dict) -> torch.nn.Module:
    """``module_cls.from_config(config)`` with every tensor on the ``meta`` device (nothing allocated or initialised).
    diffusers' Cosmos3 sound tokenizer wraps its convolutions in ``torch.nn.utils.weight_norm``, whose deprecation
    FutureWarning (the module works as published) is silenced here, at the call that raises it."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*torch\.nn\.utils\.weight_norm.* is deprecated",
                                category=FutureWarning)
        with torch.device("meta"):
            return module_cls.from_config(config)


def checkpoint_fingerprint(checkpoint_dir: str | Path) -> str:
    """A digest of what a loaded checkpoint depends on: the resolved folder, ``transformer/config.json``'s bytes
    and (name, size, mtime, ctime, inode) of every file up to two levels deep. Replacing the folder (another model,
    a re-download, a copy with preserved mtimes: a new ctime, which no copy can preserve) changes it; reading the
    same folder again does not.
    Unreadable entries count as such, so the fingerprint itself never raises."""
    root = Path(checkpoint_dir)
    digest = hashlib.sha256(str(root.resolve()).encode())
    try:
        digest.update((transformer_dir(root) / "config.json").read_bytes())
    except OSError as exc:
        digest.update(f"config unreadable: {exc.errno}".encode())
    for dirpath, dirnames, filenames in os.walk(root):
        depth = len(Path(dirpath).relative_to(root).parts)
        dirnames[:] = sorted(dirnames) if depth < 1 else []
        for name in sorted(filenames):
            path = Path(dirpath) / name
            try:
                st = path.stat()
                entry = f"{path.relative_to(root)}|{st.st_size}|{st.st_mtime_ns}|{st.st_ctime_ns}|{st.st_ino}"
            except OSError as exc:
                entry = f"{path.relative_to(root)}|unreadable {exc.errno}"
            digest.update(entry.encode())
    return digest.hexdigest()


def load_lm_head(checkpoint_dir: str | Path, config: Cosmos3Config, dtype: torch.dtype,
                 device: torch.device | str = "cpu") -> torch.nn.Linear:
    """``lm_head.weight`` from ``transformer/`` (for a transformer that was loaded without it)."""
    path = weight_files(checkpoint_dir).get("lm_head.weight")
    if path is None:
        raise CheckpointError(f"{checkpoint_dir}: transformer/ has no lm_head.weight; the reasoner needs it.")
    with safe_open(str(path), framework="pt", device="cpu") as f:
        weight = f.get_tensor("lm_head.weight")
    if tuple(weight.shape) != (config.vocab_size, config.hidden_size):
        raise CheckpointError(f"{path}: lm_head.weight has shape {tuple(weight.shape)}, expected "
                              f"{(config.vocab_size, config.hidden_size)}.")
    head = torch.nn.Linear(config.hidden_size, config.vocab_size, bias=False, device="meta")
    head.weight = torch.nn.Parameter(weight.to(device=device, dtype=dtype), requires_grad=False)
    return head


def load_text_tower(checkpoint_dir: str | Path, dtype: torch.dtype = torch.bfloat16,
                    device: torch.device | str = "cpu") -> Cosmos3Transformer:
    """A ``Cosmos3Transformer`` with only the understanding tower (+ ``lm_head``) materialized — the generation
    weights stay on the ``meta`` device. For reasoner-only use (the CLI); half the memory of a full load."""
    config = Cosmos3Config.from_checkpoint(checkpoint_dir)
    with torch.device("meta"):
        model = Cosmos3Transformer(config)
    text_ids = {id(p) for p in tower_module(model, "text").parameters()}
    wanted = [n for n, p in model.named_parameters() if id(p) in text_ids]
    files = weight_files(checkpoint_dir)
    missing = [n for n in wanted if n not in files]
    if missing:
        raise CheckpointError(f"{checkpoint_dir}: transformer/ lacks text-tower weights {missing[:4]}.")
    state, by_file = {}, {}
    for name in wanted:
        by_file.setdefault(files[name], []).append(name)
    for path, names in by_file.items():
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for name in names:
                state[name] = f.get_tensor(name).to(device=device, dtype=dtype)
    model.load_state_dict(state, strict=False, assign=True)
    return model.eval().requires_grad_(False)

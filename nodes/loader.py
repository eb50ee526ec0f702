"""Cosmos3Loader: a checkpoint folder under models/diffusers or models/cosmos3 → COSMOS3_MODEL."""

from __future__ import annotations

import os
from pathlib import Path

import comfy.model_management as mm
import folder_paths
import torch
from comfy_api.latest import io

from ..cosmos3_core.config import DTYPES
from ..cosmos3_core.model.loader import checkpoint_fingerprint
from ..cosmos3_core.model.weights import STORAGE_DTYPES, check_storage_device
from .core_vae import Cosmos3CoreVAE
from .model_handle import Cosmos3ModelHandle
from .types import CATEGORY, Cosmos3Model

FOLDER_KEYS = ("cosmos3", "diffusers")
NONE_FOUND = "(no Cosmos3 checkpoint found)"
WEIGHT_DTYPES = {"auto": None, **STORAGE_DTYPES}


def register_model_folder() -> None:
    """Add ``models/cosmos3`` beside ComfyUI's own ``models/diffusers``."""
    if "cosmos3" not in folder_paths.folder_names_and_paths:
        folder_paths.add_model_folder_path("cosmos3", os.path.join(folder_paths.models_dir, "cosmos3"))


def find_checkpoints() -> dict[str, Path]:
    """Sub-folders holding a Cosmos3 transformer, by display name (``<folder>`` or ``<folder> (diffusers)``)."""
    found: dict[str, Path] = {}
    for key in FOLDER_KEYS:
        if key not in folder_paths.folder_names_and_paths:
            continue
        for root in folder_paths.get_folder_paths(key):
            if not os.path.isdir(root):
                continue
            for entry in sorted(os.listdir(root)):
                path = Path(root) / entry
                config = path / "transformer" / "config.json"
                try:
                    listed = config.is_file() and "Cosmos3OmniTransformer" in config.read_text(errors="ignore")[:4096]
                except OSError:  # unreadable: list it, so that loading it says what is wrong with it
                    listed = True
                if listed:
                    found.setdefault(entry, path)
    return found


def _roots() -> list[str]:
    keys = [k for k in FOLDER_KEYS if k in folder_paths.folder_names_and_paths]
    return [p for k in keys for p in folder_paths.get_folder_paths(k)]


def _checkpoint_path(checkpoint: str) -> Path | None:
    """The folder a checkpoint name stands for: a listed one, or else a folder of that name that holds a
    ``transformer/`` folder (its config is damaged or unreadable: loading it explains), else None."""
    found = find_checkpoints()
    if checkpoint in found:
        return found[checkpoint]
    if not checkpoint or os.sep in checkpoint or (os.altsep and os.altsep in checkpoint) or checkpoint in (".", ".."):
        return None
    for root in _roots():
        if (Path(root) / checkpoint / "transformer").is_dir():
            return Path(root) / checkpoint
    return None


class Cosmos3Loader(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        names = list(find_checkpoints()) or [NONE_FOUND]
        return io.Schema(
            node_id="Cosmos3Loader",
            display_name="Load Cosmos3 Checkpoint",
            category=CATEGORY,
            description="Loads a Cosmos3 (Nano/Edge/Super) checkpoint folder in the Hugging Face layout; a distilled "
                        "*-4Step checkpoint (modular_model_index.json) samples on its own fixed schedule.",
            inputs=[
                io.Combo.Input("checkpoint", options=names, tooltip="A folder under models/cosmos3 or models/diffusers "
                               "holding transformer/, vae/, text_tokenizer/, scheduler/ (and sound_tokenizer/)."),
                io.Combo.Input("dtype", options=["auto", *DTYPES], default="auto",
                               tooltip="Compute dtype. auto: bf16 on a GPU that supports it, else fp32."),
                io.Combo.Input("device", options=["default", "cpu"], default="default",
                               tooltip="default: ComfyUI's GPU with its offloading; cpu: run everything on the CPU."),
                io.Combo.Input("weight_dtype", options=list(WEIGHT_DTYPES), default="auto", optional=True,
                               tooltip="How the transformer's linear weights are stored; they are computed in the "
                                       "dtype above. fp8_e4m3fn halves bf16 memory (Nano's generation tower 14 → 7 "
                                       "GiB). auto: as the checkpoint stores them (an NVIDIA FP8 checkpoint stays "
                                       "FP8), else the compute dtype."),
            ],
            outputs=[Cosmos3Model.Output(display_name="model", tooltip="The loaded checkpoint; connect it to every "
                                                                             "Cosmos3 node."),
                     io.Vae.Output(display_name="vae",
                                   tooltip="The checkpoint's Wan2.2 VAE as ComfyUI's own VAE, for core VAE Decode "
                                           "(Tiled), VAE Encode and latent tools on the sampler's LATENT. Built on "
                                           "first use (a second copy of the VAE in memory, ComfyUI's dtype).")],
        )

    @classmethod
    def fingerprint_inputs(cls, checkpoint: str, dtype: str = "auto", device: str = "default",
                           weight_dtype: str = "auto"):
        """ComfyUI re-runs the loader (and everything downstream) when this changes: a checkpoint folder replaced
        under the same name while the server runs is loaded again, never served from the cached model."""
        path = _checkpoint_path(checkpoint)
        return checkpoint_fingerprint(path) if path is not None else f"missing {checkpoint}"

    @classmethod
    def execute(cls, checkpoint: str, dtype: str = "auto", device: str = "default",
                weight_dtype: str = "auto") -> io.NodeOutput:
        if dtype not in ("auto", *DTYPES):
            raise ValueError(f"Cosmos3Loader: dtype {dtype!r} is not one of auto, {', '.join(DTYPES)}.")
        if device not in ("default", "cpu"):
            raise ValueError(f"Cosmos3Loader: device {device!r} is not one of default, cpu.")
        if weight_dtype not in WEIGHT_DTYPES:
            raise ValueError(f"Cosmos3Loader: weight_dtype {weight_dtype!r} is not one of {', '.join(WEIGHT_DTYPES)}.")
        path = _checkpoint_path(checkpoint)
        if path is None:
            where = ", ".join(_roots())
            raise ValueError(
                f"Cosmos3Loader: checkpoint {checkpoint!r} was not found. Put the Cosmos3 checkpoint folder "
                f"(with transformer/config.json) under one of: {where}, then refresh."
            )
        if dtype == "auto":
            gpu = device == "default" and mm.get_torch_device().type != "cpu"
            torch_dtype = torch.bfloat16 if gpu and mm.should_use_bf16(mm.get_torch_device()) else torch.float32
        else:
            torch_dtype = DTYPES[dtype]
        storage = WEIGHT_DTYPES[weight_dtype]
        load_device = mm.get_torch_device() if device == "default" else torch.device("cpu")
        if storage is not None:
            try:
                if not mm.supports_cast(load_device, storage):
                    raise ValueError(f"ComfyUI cannot cast {weight_dtype} on this device")
                check_storage_device(storage, load_device)
            except ValueError as exc:
                raise ValueError(
                    f"Cosmos3Loader: weight_dtype {weight_dtype!r} is not supported on {load_device} ({exc}); set "
                    "weight_dtype to bf16 or fp16 (or auto), or device to cpu."
                ) from exc
        try:
            handle = Cosmos3ModelHandle.load(checkpoint, path, torch_dtype, device, storage)
        except (ValueError, FileNotFoundError) as exc:
            raise ValueError(f"Cosmos3Loader: checkpoint {checkpoint!r} cannot be loaded: {exc}") from exc
        return io.NodeOutput(handle, Cosmos3CoreVAE(handle.pipeline.vae, handle.vae_patcher.load_device, checkpoint))

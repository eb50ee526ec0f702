"""Cosmos3Loader: a checkpoint folder under models/diffusers or models/cosmos3 → COSMOS3_MODEL."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import comfy.model_management as mm
import folder_paths
import torch
from comfy_api.latest import io

from ..cosmos3_core.config import DTYPES
from ..cosmos3_core.model.loader import checkpoint_fingerprint
from ..cosmos3_core.model.weights import STORAGE_DTYPES, check_storage_device
from ..cosmos3_core.sampling.distilled import read_distilled
from .core_vae import Cosmos3CoreVAE
from .model_handle import Cosmos3ModelHandle
from .types import CATEGORY, Cosmos3Model

FOLDER_KEYS = ("cosmos3", "diffusers")
NONE_FOUND = "(no Cosmos3 checkpoint found)"
WEIGHT_DTYPES = {"auto": None, **STORAGE_DTYPES}
PICK = "pick one in Load Cosmos3 Checkpoint"
# The checkpoint names the shipped workflows carry (the Hub repository names) and the kind of checkpoint each
# stands for: when no folder has that name and exactly one listed checkpoint is of that kind, the name means it.
SHIPPED_NAMES = {"Cosmos3-Nano": "Nano/Super", "Cosmos3-Super": "Nano/Super", "Cosmos3-Edge": "Edge",
                 "Cosmos3-Super-Text2Image-4Step": "distilled 4-step",
                 "Cosmos3-Super-Image2Video-4Step": "distilled 4-step"}
_log = logging.getLogger(__name__)


def register_model_folder() -> None:
    """Add ``models/cosmos3`` beside ComfyUI's own ``models/diffusers`` (also when ``extra_model_paths.yaml``
    already named a ``cosmos3`` folder: ComfyUI keeps each path once)."""
    folder_paths.add_model_folder_path("cosmos3", os.path.join(folder_paths.models_dir, "cosmos3"))


def find_checkpoints() -> dict[str, Path]:
    """Sub-folders holding a Cosmos3 transformer, by display name (``<folder>`` or ``<folder> (diffusers)``)."""
    found: dict[str, Path] = {}
    for root in _roots():
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


def checkpoint_kind(path: Path) -> str:
    """``Edge`` (a ``relu2`` transformer), ``distilled 4-step`` (its modular_model_index.json names the distilled
    pipeline) or ``Nano/Super``; ``unreadable`` when its files cannot tell (loading it says why)."""
    try:
        config = json.loads((path / "transformer" / "config.json").read_text(encoding="utf-8"))
        if config.get("hidden_act") == "relu2":
            return "Edge"
        return "distilled 4-step" if read_distilled(path) is not None else "Nano/Super"
    except (OSError, ValueError, AttributeError):
        return "unreadable"


def resolve_checkpoint(checkpoint: str) -> tuple[str, Path] | None:
    """(name, folder) a checkpoint name stands for: a listed folder of that name; else a folder of that name that
    holds ``transformer/`` (its config is damaged or unreadable: loading it explains); else, for a name the shipped
    workflows carry, the one listed checkpoint of its kind; else None."""
    found = find_checkpoints()
    if checkpoint in found:
        return checkpoint, found[checkpoint]
    if checkpoint and os.sep not in checkpoint and not (os.altsep and os.altsep in checkpoint) \
            and checkpoint not in (".", ".."):
        for root in _roots():
            if (Path(root) / checkpoint / "transformer").is_dir():
                return checkpoint, Path(root) / checkpoint
    kind = SHIPPED_NAMES.get(checkpoint)
    same_kind = [(name, path) for name, path in found.items() if kind and checkpoint_kind(path) == kind]
    return same_kind[0] if len(same_kind) == 1 else None


def missing_checkpoint_message(checkpoint: str) -> str:
    """What a user reads when ``checkpoint`` resolves to no folder: every folder searched with the checkpoints found
    in it, and the fix."""
    found, roots = find_checkpoints(), list(dict.fromkeys(_roots()))
    if not found:
        return (f"Cosmos3Loader: no Cosmos3 checkpoint was found in {', '.join(roots)} (a checkpoint is a folder "
                f"holding transformer/config.json). Download one into {Path(roots[0]) / 'Cosmos3-Nano'} (README: "
                f"\"Get the model\"), press r to refresh, then {PICK}.")
    kind = SHIPPED_NAMES.get(checkpoint)
    several = sum(checkpoint_kind(p) == kind for p in found.values()) if kind else 0
    why = f" and {several} {kind} checkpoints were" if several > 1 else ""
    where = "; ".join(f"in {root}: " + (", ".join(f"'{name}' ({checkpoint_kind(path)})" for name, path in found.items()
                                                 if path.parent == Path(root)) or "none") for root in roots)
    return (f"Cosmos3Loader: checkpoint {checkpoint!r} was not found{why}; {PICK} — {where}. To add one, put its "
            "folder (with transformer/config.json) in one of those folders and press r to refresh.")


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
        resolved = resolve_checkpoint(checkpoint)
        return checkpoint_fingerprint(resolved[1]) if resolved is not None else f"missing {checkpoint}"

    @classmethod
    def validate_inputs(cls, checkpoint: str | None = None) -> bool | str:
        """Refuses a checkpoint name that stands for no folder before the prompt is queued (ComfyUI 0.3.75 does not
        check a V3 combo's value against its options); a linked value (None here) is checked when it runs."""
        if checkpoint is None or resolve_checkpoint(checkpoint) is not None:
            return True
        return missing_checkpoint_message(checkpoint)

    @classmethod
    def execute(cls, checkpoint: str, dtype: str = "auto", device: str = "default",
                weight_dtype: str = "auto") -> io.NodeOutput:
        if dtype not in ("auto", *DTYPES):
            raise ValueError(f"Cosmos3Loader: dtype {dtype!r} is not one of auto, {', '.join(DTYPES)}.")
        if device not in ("default", "cpu"):
            raise ValueError(f"Cosmos3Loader: device {device!r} is not one of default, cpu.")
        if weight_dtype not in WEIGHT_DTYPES:
            raise ValueError(f"Cosmos3Loader: weight_dtype {weight_dtype!r} is not one of {', '.join(WEIGHT_DTYPES)}.")
        resolved = resolve_checkpoint(checkpoint)
        if resolved is None:
            raise ValueError(missing_checkpoint_message(checkpoint))
        name, path = resolved
        if name != checkpoint:
            _log.info("Cosmos3Loader: no checkpoint folder is named %r; loading %r (%s), the only %s checkpoint "
                      "found (%s to change it).", checkpoint, name, path, checkpoint_kind(path), PICK)
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
            handle = Cosmos3ModelHandle.load(name, path, torch_dtype, device, storage)
        except (ValueError, FileNotFoundError) as exc:
            raise ValueError(f"Cosmos3Loader: checkpoint {name!r} cannot be loaded: {exc}") from exc
        return io.NodeOutput(handle, Cosmos3CoreVAE(handle.pipeline.vae, handle.vae_patcher.load_device, name))

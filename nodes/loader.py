"""Cosmos3Loader: a checkpoint folder under models/diffusers or models/cosmos3 → COSMOS3_MODEL; optionally its
transformer's weights from a GGUF file in ComfyUI's diffusion_models/unet folders (the ``gguf`` input), the folder
then giving everything else (VAE, tokenizer, configs)."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import comfy.model_management as mm
import folder_paths
import torch
from comfy_api.latest import io

from ..cosmos3_core.config import DTYPES, Cosmos3Config
from ..cosmos3_core.model.fp8 import device_fp8_problem
from ..cosmos3_core.model.loader import checkpoint_fingerprint
from ..cosmos3_core.model.weights import STORAGE_DTYPES, check_storage_device
from ..cosmos3_core.sampling.distilled import read_distilled
from .core_vae import Cosmos3CoreVAE
from .errors import node_errors
from .hub_cache import HUB_KEY, WEIGHTS, cache_roots, download_fix, hub_revision, hub_snapshots, missing_files
from .model_handle import Cosmos3ModelHandle
from .types import CATEGORY, Cosmos3Model

NODE = "Cosmos3Loader"
FOLDER_KEYS = ("cosmos3", "diffusers")
GGUF_KEY = "cosmos3_gguf"  # the .gguf files of ComfyUI's diffusion_models folders (register_model_folder)
GGUF_NONE = "none"
NONE_FOUND = "(no Cosmos3 checkpoint found)"
WEIGHT_DTYPES = {"auto": None, **STORAGE_DTYPES}
FP8_FAST = "fp8_e4m3fn_fast"  # ComfyUI's name for FP8 compute (W8A8) from a bf16 checkpoint: approximate
WEIGHT_DTYPE_CHOICES = [*WEIGHT_DTYPES, FP8_FAST]
PICK = "pick one in Load Cosmos3 Checkpoint"
# The checkpoint names the shipped workflows carry (the Hub repository names) and the kind of checkpoint each
# stands for: when no folder has that name and exactly one listed checkpoint is of that kind, the name means it.
SHIPPED_NAMES = {"Cosmos3-Nano": "Nano", "Cosmos3-Super": "Super", "Cosmos3-Edge": "Edge",
                 "Cosmos3-Super-Text2Image-4Step": "distilled 4-step",
                 "Cosmos3-Super-Image2Video-4Step": "distilled 4-step"}
_log = logging.getLogger(__name__)


def register_model_folder() -> None:
    """Add ``models/cosmos3`` beside ComfyUI's own ``models/diffusers`` (also when ``extra_model_paths.yaml``
    already named a ``cosmos3`` folder: ComfyUI keeps each path once), and the ``.gguf`` files of ComfyUI's
    ``diffusion_models`` folders (``models/diffusion_models``, ``models/unet`` and what ``extra_model_paths.yaml``
    adds to them: the same list of folders, shared) as ``cosmos3_gguf``."""
    folder_paths.add_model_folder_path("cosmos3", os.path.join(folder_paths.models_dir, "cosmos3"))
    folders = folder_paths.folder_names_and_paths.get("diffusion_models", ([], set()))[0]
    folder_paths.folder_names_and_paths[GGUF_KEY] = (folders, {".gguf"})


def gguf_files() -> list[str]:
    """The ``.gguf`` files of ComfyUI's diffusion_models/unet folders (names relative to their folder)."""
    if GGUF_KEY not in folder_paths.folder_names_and_paths:
        return []
    return list(folder_paths.get_filename_list(GGUF_KEY))


def gguf_path(gguf: str) -> Path | None:
    """The file a ``gguf`` input names (None: ``none``); a name that is no listed file is refused (a folder's name:
    said so, with the ``.gguf`` files inside it to pick instead)."""
    if gguf in (None, GGUF_NONE):
        return None
    path = folder_paths.get_full_path(GGUF_KEY, gguf) if GGUF_KEY in folder_paths.folder_names_and_paths else None
    if path is None:
        roots = folder_paths.get_folder_paths("diffusion_models")
        name = os.path.relpath(os.path.join("/", gguf), "/")  # the name as get_full_path reads it
        for root in roots if name != "." else ():
            if os.path.isdir(os.path.join(root, name)):
                raise ValueError(_gguf_folder_message(gguf, root, name))
        raise ValueError(f"gguf file {gguf!r} was not found in {', '.join(roots)}; put the .gguf file there "
                         "(python -m cosmos3_core.gguf writes one from a checkpoint), press r to refresh, then pick "
                         "it — or set gguf to none.")
    return Path(path)


def _gguf_folder_message(gguf: str, root: str, name: str, shown: int = 4) -> str:
    """A ``gguf`` input naming a folder of ``root``: what it is and the fix — the ``.gguf`` files inside it (the
    first ``shown``, as the gguf list names them), or, with none there, where to put one."""
    folder = os.path.join(root, name)
    inside: list[str] = []
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=True):  # ComfyUI's own listing follows links
        dirnames.sort()
        inside += [os.path.relpath(os.path.join(dirpath, f), root) for f in sorted(filenames)
                   if f.lower().endswith(".gguf")]
        if len(inside) > shown:
            break
    said = f"gguf {gguf!r} is a folder ({folder}), not a .gguf file"
    if not inside:
        return (f"{said}, and it holds no .gguf file; put the .gguf file in it or in {root} (python -m "
                "cosmos3_core.gguf writes one from a checkpoint), press r to refresh, then pick the file — or set "
                "gguf to none.")
    listed = ", ".join(repr(n) for n in inside[:shown]) + (", …" if len(inside) > shown else "")
    return f"{said}; pick the .gguf file inside it: {listed} (press r to refresh if it is not listed)."


def hub_roots() -> list[Path]:
    """The Hugging Face cache folders searched: the Hub client's own, then ``extra_model_paths.yaml``'s
    ``cosmos3_hub`` entries (nodes/hub_cache.py)."""
    return cache_roots(folder_paths.folder_names_and_paths.get(HUB_KEY, ([],))[0])


def find_checkpoints() -> dict[str, Path]:
    """Checkpoint folders by display name: sub-folders of models/cosmos3 and models/diffusers holding a Cosmos3
    transformer (by folder name), then the Cosmos3 snapshots of the Hugging Face caches (``<org>/<repo> (hub
    <revision>)``, nodes/hub_cache.py)."""
    found = _folder_checkpoints()
    for name, path in hub_snapshots(hub_roots()).items():
        found.setdefault(name, path)
    return found


def _folder_checkpoints() -> dict[str, Path]:
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
    """``distilled 4-step`` (its modular_model_index.json names the distilled pipeline), else the transformer's
    ``Cosmos3Config.family`` (``Nano``, ``Super`` or ``Edge``); ``unreadable`` when its files cannot tell (loading
    it says why)."""
    try:
        config = json.loads((path / "transformer" / "config.json").read_text(encoding="utf-8"))
        family = Cosmos3Config.from_dict(config, source=str(path / "transformer" / "config.json")).family
        return "distilled 4-step" if family != "Edge" and read_distilled(path) is not None else family
    except (OSError, ValueError, AttributeError, TypeError):
        return "unreadable"


def resolve_checkpoint(checkpoint: str) -> tuple[str, Path] | None:
    """(name, folder) a checkpoint name stands for: a listed folder of that name; else a folder of that name that
    holds ``transformer/`` (its config is damaged or unreadable: loading it explains); else, for a name the shipped
    workflows carry, that Hub repository's ``main`` snapshot in the Hugging Face cache (its only one, if no main),
    else the one listed checkpoint of its kind; else None."""
    found = find_checkpoints()
    if checkpoint in found:
        return checkpoint, found[checkpoint]
    if checkpoint and os.sep not in checkpoint and not (os.altsep and os.altsep in checkpoint) \
            and checkpoint not in (".", ".."):
        for root in _roots():
            if (Path(root) / checkpoint / "transformer").is_dir():
                return checkpoint, Path(root) / checkpoint
    kind = SHIPPED_NAMES.get(checkpoint)
    if kind:
        cached = hub_revision({n: p for n, p in found.items() if n not in _folder_checkpoints()}, checkpoint)
        if cached is not None:
            return cached
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
    listed = lambda names: ", ".join(f"'{n}' ({checkpoint_kind(found[n])})" for n in names) or "none"  # noqa: E731
    where = "; ".join(f"in {root}: " + listed([n for n, p in found.items() if p.parent == Path(root)])
                      for root in roots)
    hub = [n for n in found if " (hub " in n]
    where += f"; in the Hugging Face cache ({', '.join(map(str, hub_roots()))}): {listed(hub)}"
    return (f"Cosmos3Loader: checkpoint {checkpoint!r} was not found{why}; {PICK} — {where}. To add one, put its "
            "folder (with transformer/config.json) in one of those folders and press r to refresh.")


def _host_fp8_matrix_mult() -> bool:
    """ComfyUI started with ``--fast fp8_matrix_mult`` (or ``--fast``): FP8 weights compute in FP8 where they can."""
    try:
        from comfy.cli_args import PerformanceFeature, args
    except ImportError:
        return False
    return PerformanceFeature.Fp8MatrixMultiplication in (args.fast or ())


def fp8_compute_choice(weight_dtype: str, device: torch.device) -> tuple[str, bool]:
    """(the storage ``weight_dtype`` to load with, FP8 compute on?) for the ``weight_dtype`` asked on ``device``:
    ``fp8_e4m3fn_fast`` (or ``fp8_e4m3fn`` under ``--fast fp8_matrix_mult``) is FP8 compute where the GPU has FP8
    tensor cores; elsewhere ``fp8_e4m3fn_fast`` is FP8 storage computed W8A16, with one notice (ComfyUI's own
    fallback), never a silent change."""
    asked_fast = weight_dtype == FP8_FAST or (weight_dtype == "fp8_e4m3fn" and _host_fp8_matrix_mult())
    if not asked_fast:
        return weight_dtype, False
    problem = device_fp8_problem(device)
    if problem is None:
        return "auto", True
    if weight_dtype == FP8_FAST:
        _log.warning("Cosmos3Loader: weight_dtype fp8_e4m3fn_fast needs FP8 tensor cores, but %s; the weights are "
                     "stored as fp8_e4m3fn and computed W8A16 (dequantized per layer) instead.", problem)
    return "fp8_e4m3fn", False


def check_snapshot_complete(name: str, path: Path, gguf_file: Path | None = None) -> None:
    """A Hub-cache snapshot whose transformer shards were not all downloaded: one message naming the missing files
    and the ``hf download`` line that completes it (a folder's are named by the core loader). A snapshot with no
    transformer weights at all is complete beside a ``gguf_file`` (configs, VAE and tokenizer only: the core loader
    names any tensor neither holds)."""
    if " (hub " not in name:
        return
    missing = missing_files(path)
    if missing == [WEIGHTS] and gguf_file is not None:
        return
    if missing:
        raise ValueError(f"checkpoint {name!r} ({path}) lacks {', '.join(missing[:4])}"
                         f"{' …' if len(missing) > 4 else ''}: its download stopped before it finished. Complete it "
                         f"with: {download_fix(path, missing)}")


class Cosmos3Loader(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        names = list(find_checkpoints()) or [NONE_FOUND]
        return io.Schema(
            node_id=NODE,
            display_name="Load Cosmos3 Checkpoint",
            category=CATEGORY,
            description="Loads a Cosmos3 (Nano/Edge/Super) checkpoint folder in the Hugging Face layout; a distilled "
                        "*-4Step checkpoint (modular_model_index.json) samples on its own fixed schedule.",
            inputs=[
                io.Combo.Input("checkpoint", options=names, tooltip="A folder under models/cosmos3 or models/diffusers "
                               "holding transformer/, vae/, text_tokenizer/, scheduler/ (and sound_tokenizer/), or a "
                               "snapshot in the Hugging Face cache ('nvidia/Cosmos3-Nano (hub main)', the fp8 "
                               "revision '(hub fp8)')."),
                io.Combo.Input("dtype", options=["auto", *DTYPES], default="auto",
                               tooltip="Compute dtype. auto: bf16 on a GPU that supports it, else fp32."),
                io.Combo.Input("device", options=["default", "cpu"], default="default",
                               tooltip="default: ComfyUI's GPU with its offloading; cpu: run everything on the CPU."),
                io.Combo.Input("weight_dtype", options=WEIGHT_DTYPE_CHOICES, default="auto", optional=True,
                               tooltip="How the transformer's linear weights are stored; they are computed in the "
                                       "dtype above. fp8_e4m3fn halves bf16 memory (Nano's generation tower 14 → 7 "
                                       "GiB). auto: as the checkpoint stores them (an NVIDIA FP8 checkpoint stays "
                                       "FP8 and runs NVIDIA's W8A8 step policy on GPUs with FP8 tensor cores, sm "
                                       "8.9+), else the compute dtype. fp8_e4m3fn_fast: FP8 compute (W8A8) for a "
                                       "bf16 checkpoint, its weights rounded to FP8 with per-tensor scales — "
                                       "approximate; on a GPU without FP8 tensor cores it is fp8_e4m3fn (W8A16, the "
                                       "log says so). With ComfyUI's --fast fp8_matrix_mult, fp8_e4m3fn is "
                                       "fp8_e4m3fn_fast."),
                io.Combo.Input("gguf", options=[GGUF_NONE, *gguf_files()], default=GGUF_NONE, optional=True,
                               tooltip="GGUF transformer weights (a .gguf file in models/diffusion_models or "
                                       "models/unet; python -m cosmos3_core.gguf makes one): kept quantized and "
                                       "dequantized layer by layer (Q8_0 ≈ half the memory of bf16, Q4_0 ≈ a quarter). "
                                       "The checkpoint above gives everything else (VAE, tokenizer, configs): pick "
                                       "the one the GGUF was converted from. none: the checkpoint's own weights."),
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
                           weight_dtype: str = "auto", gguf: str = GGUF_NONE):
        """ComfyUI re-runs the loader (and everything downstream) when this changes: a checkpoint folder (or GGUF
        file) replaced under the same name while the server runs is loaded again, never served from the cached
        model."""
        resolved = resolve_checkpoint(checkpoint)
        folder = checkpoint_fingerprint(resolved[1]) if resolved is not None else f"missing {checkpoint}"
        try:
            path = gguf_path(gguf)
            st = path.stat() if path is not None else None
        except (ValueError, OSError):
            return f"{folder} gguf missing {gguf}"
        return folder if st is None else f"{folder} gguf {path.resolve()} {st.st_size} {st.st_mtime_ns} {st.st_ino}"

    @classmethod
    def validate_inputs(cls, checkpoint: str | None = None) -> bool | str:
        """Refuses a checkpoint name that stands for no folder before the prompt is queued (ComfyUI 0.3.75 does not
        check a V3 combo's value against its options); a linked value (None here) is checked when it runs. (A
        ``gguf`` name that is no file is refused when the node runs: ComfyUI would repeat a shared validation
        message under every input named here.)"""
        if checkpoint is None or resolve_checkpoint(checkpoint) is not None:
            return True
        return missing_checkpoint_message(checkpoint)

    @classmethod
    def execute(cls, checkpoint: str, dtype: str = "auto", device: str = "default",
                weight_dtype: str = "auto", gguf: str = GGUF_NONE) -> io.NodeOutput:
        with node_errors(NODE):
            name, path, gguf_file = _checked_sources(checkpoint, gguf, dtype, device, weight_dtype)
            torch_dtype, load_device = _compute_dtype(dtype, device), _load_device(device)
            weight_dtype, fp8_compute = fp8_compute_choice(weight_dtype, load_device)
            storage = WEIGHT_DTYPES[weight_dtype]
            if storage is not None:
                _check_storage(weight_dtype, storage, load_device)
            try:
                handle = Cosmos3ModelHandle.load(name, path, torch_dtype, device, storage, gguf_file=gguf_file,
                                                 fp8_compute=fp8_compute)
            except (ValueError, FileNotFoundError) as exc:
                what = f"checkpoint {name!r}" + (f" with gguf {gguf!r}" if gguf_file is not None else "")
                raise ValueError(f"{what} cannot be loaded: {exc}") from exc
        return io.NodeOutput(handle, Cosmos3CoreVAE(handle.pipeline.vae, handle.vae_patcher.load_device, name))


def _checked_sources(checkpoint: str, gguf: str, dtype: str, device: str, weight_dtype: str):
    """(name, folder, GGUF file or None) of a load, once every widget value is one the loader knows."""
    if dtype not in ("auto", *DTYPES):
        raise ValueError(f"dtype {dtype!r} is not one of auto, {', '.join(DTYPES)}.")
    if device not in ("default", "cpu"):
        raise ValueError(f"device {device!r} is not one of default, cpu.")
    if weight_dtype not in WEIGHT_DTYPE_CHOICES:
        raise ValueError(f"weight_dtype {weight_dtype!r} is not one of {', '.join(WEIGHT_DTYPE_CHOICES)}.")
    gguf_file = gguf_path(gguf)
    if gguf_file is not None and weight_dtype != "auto":
        raise ValueError(f"weight_dtype {weight_dtype!r} does not apply to a GGUF file, whose weights stay in their "
                         "GGML types; set weight_dtype to auto (or gguf to none).")
    resolved = resolve_checkpoint(checkpoint)
    if resolved is None:
        raise ValueError(missing_checkpoint_message(checkpoint))
    name, path = resolved
    check_snapshot_complete(name, path, gguf_file)
    if name != checkpoint:
        _log.info("Cosmos3Loader: no checkpoint folder is named %r; loading %r (%s), the only %s checkpoint "
                  "found (%s to change it).", checkpoint, name, path, checkpoint_kind(path), PICK)
    return name, path, gguf_file


def _compute_dtype(dtype: str, device: str) -> torch.dtype:
    """``auto``: bf16 on a GPU that computes it well (ComfyUI's own test), else fp32."""
    if dtype != "auto":
        return DTYPES[dtype]
    gpu = device == "default" and mm.get_torch_device().type != "cpu"
    return torch.bfloat16 if gpu and mm.should_use_bf16(mm.get_torch_device()) else torch.float32


def _load_device(device: str) -> torch.device:
    return mm.get_torch_device() if device == "default" else torch.device("cpu")


def _check_storage(weight_dtype: str, storage: torch.dtype, load_device: torch.device) -> None:
    try:
        if not mm.supports_cast(load_device, storage):
            raise ValueError(f"ComfyUI cannot cast {weight_dtype} on this device")
        check_storage_device(storage, load_device)
    except ValueError as exc:
        raise ValueError(f"weight_dtype {weight_dtype!r} is not supported on {load_device} ({exc}); set "
                         "weight_dtype to bf16 or fp16 (or auto), or device to cpu.") from exc

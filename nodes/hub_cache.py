"""Cosmos3 checkpoints where the Hugging Face Hub client keeps them: the snapshots of a Hub cache, by repository and
revision, for Load Cosmos3 Checkpoint's list.

The cache layout is huggingface_hub's (``file_download.py``, ``constants.py``): ``<cache>/models--<org>--<name>/``
holds ``snapshots/<commit>/`` (the repository's files, as links into ``blobs/``) and ``refs/<revision>`` (a text file
naming the commit a branch or tag was downloaded at: ``refs/main``, ``refs/fp8`` for NVIDIA's FP8 revision). The
cache folder is ``HF_HUB_CACHE`` (or the older ``HUGGINGFACE_HUB_CACHE``), else ``HF_HOME/hub``, else
``$XDG_CACHE_HOME/huggingface/hub``, else ``~/.cache/huggingface/hub`` — the client's own order; more cache folders
come from ComfyUI's ``extra_model_paths.yaml`` under the key ``cosmos3_hub`` (ComfyUI adds them to that model
folder key).

Listed: every snapshot of a ``models--*--*Cosmos3*`` repository whose ``transformer/config.json`` names
``Cosmos3OmniTransformer``, as ``<org>/<name> (hub <revision>)`` — ``main``, ``fp8``, … the refs pointing at it, or
``@<commit[:8]>`` when none does. Nothing is read beyond the config: a snapshot with missing files is listed, and
loading it names the file that is missing (``missing_files``, then the loader's own checks).

A complete snapshot's ``transformer/`` holds its weights as the core loader reads them (cosmos3_core/model/loader.py
``weight_files``): ``diffusion_pytorch_model.safetensors.index.json`` and every shard its ``weight_map`` names, or
the one file ``diffusion_pytorch_model.safetensors`` (no index). Shards without their index (the index's blob never
arrived, or was deleted) lack the index, and any shard of the ``-0000K-of-0000N`` sequence not there; a folder with
no weights at all lacks ``transformer/diffusion_pytorch_model*`` (whichever of the two layouts the repository has:
``hf download --include`` fetches it).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from ..cosmos3_core.model.loader import INDEX_FILE as INDEX
from ..cosmos3_core.model.loader import SINGLE_FILE as SINGLE  # an unsharded transformer: complete without an index

HUB_KEY = "cosmos3_hub"  # extra_model_paths.yaml key for more Hub cache folders
REPO_GLOB = "models--*--*"
SHARD = re.compile(r"(?P<stem>.+)-(?P<k>\d{5})-of-(?P<n>\d{5})\.safetensors")  # save_pretrained's shard names
WEIGHTS = "transformer/diffusion_pytorch_model*"  # the weights when not one file of them is there (a glob)


def default_cache() -> Path:
    """The Hub cache folder huggingface_hub uses, from the same environment variables in the same order."""
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(name):
            return Path(os.environ[name]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "huggingface" / "hub"


def cache_roots(extra: list[str] = ()) -> list[Path]:
    """The default cache folder and the ``extra`` ones (ComfyUI's ``cosmos3_hub`` paths), each once."""
    roots = [default_cache(), *(Path(p).expanduser() for p in extra)]
    return list(dict.fromkeys(roots))


def _is_cosmos3(snapshot: Path) -> bool:
    config = snapshot / "transformer" / "config.json"
    try:
        return config.is_file() and "Cosmos3OmniTransformer" in config.read_text(errors="ignore")[:4096]
    except OSError:
        return True  # unreadable: list it, so that loading it says what is wrong with it


def _refs(repo: Path) -> dict[str, list[str]]:
    """commit → the revisions (refs) naming it."""
    out: dict[str, list[str]] = {}
    refs = repo / "refs"
    if not refs.is_dir():
        return out
    for ref in sorted(p for p in refs.rglob("*") if p.is_file()):
        try:
            commit = ref.read_text().strip()
        except OSError:
            continue
        out.setdefault(commit, []).append(ref.relative_to(refs).as_posix())
    return out


def repo_id(repo: Path) -> str:
    """``models--nvidia--Cosmos3-Nano`` → ``nvidia/Cosmos3-Nano``."""
    return "/".join(repo.name.split("--")[1:])


def snapshot_name(repo: Path, snapshot: Path, refs: dict[str, list[str]]) -> str:
    names = refs.get(snapshot.name)
    revision = ", ".join(sorted(names, key=lambda r: (r != "main", r))) if names else f"@{snapshot.name[:8]}"
    return f"{repo_id(repo)} (hub {revision})"


def hub_snapshots(roots: list[Path]) -> dict[str, Path]:
    """Display name → snapshot folder of every Cosmos3 snapshot in the cache folders ``roots``."""
    found: dict[str, Path] = {}
    for root in roots:
        if not root.is_dir():
            continue
        for repo in sorted(root.glob(REPO_GLOB)):
            if "cosmos3" not in repo.name.lower() or not (repo / "snapshots").is_dir():
                continue
            refs = _refs(repo)
            for snapshot in sorted((repo / "snapshots").iterdir()):
                if snapshot.is_dir() and _is_cosmos3(snapshot):
                    found.setdefault(snapshot_name(repo, snapshot, refs), snapshot)
    return found


def hub_revision(snapshots: dict[str, Path], repo_name: str) -> tuple[str, Path] | None:
    """The snapshot a shipped workflow's checkpoint name (``Cosmos3-Nano``) means in the cache: the repository's
    ``main`` revision, else its only snapshot."""
    mine = {name: path for name, path in snapshots.items() if name.split(" (hub ")[0].split("/")[-1] == repo_name}
    main = [(name, path) for name, path in mine.items() if name.endswith("(hub main)") or "(hub main," in name]
    if main:
        return main[0]
    return next(iter(mine.items())) if len(mine) == 1 else None


def missing_files(snapshot: Path) -> list[str]:
    """The transformer weight files of ``snapshot`` that are absent (a link to a blob never downloaded, or no link),
    as repository paths: the shards its index lists; else, when there is neither the index nor the single
    ``diffusion_pytorch_model.safetensors``, the index and the shards missing from the sequence those present
    (or dangling) belong to; ``WEIGHTS`` (a glob) when there is no weight file at all. [] when complete, or when
    the index is unreadable (the core loader names that)."""
    folder = snapshot / "transformer"
    index = folder / INDEX
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, AttributeError, TypeError):
            return []
        return [f"transformer/{s}" for s in shards if not (folder / s).is_file()]
    if (folder / SINGLE).is_file():
        return []
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    expected: set[str] = set()
    for name in names:
        shard = SHARD.fullmatch(name)
        if shard:
            stem, count = shard["stem"], shard["n"]
            expected.update(f"{stem}-{k:05d}-of-{count}.safetensors" for k in range(1, int(count) + 1))
    if expected or os.path.lexists(index):  # sharded: the index is what is missing (and any shard not there)
        return [f"transformer/{INDEX}", *(f"transformer/{s}" for s in sorted(expected) if not (folder / s).is_file())]
    if os.path.lexists(folder / SINGLE):  # its link dangles: the blob is gone
        return [f"transformer/{SINGLE}"]
    return [WEIGHTS]


def download_fix(snapshot: Path, names: list[str]) -> str:
    """How to complete a Hub snapshot: the ``hf download`` line of its repository and revision for the files
    ``names`` (a glob among them, ``WEIGHTS``: as ``--include`` patterns, quoted for the shell)."""
    repo = snapshot.parent.parent
    refs = _refs(repo).get(snapshot.name, [])
    revision = None if "main" in refs else refs[0] if refs else snapshot.name
    files = (" ".join(f'--include "{n}"' for n in names) if any("*" in n for n in names) else " ".join(names))
    return f"hf download {repo_id(repo)}" + (f" --revision {revision}" if revision else "") + " " + files

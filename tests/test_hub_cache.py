"""Checkpoints where the Hugging Face Hub client keeps them: Load Cosmos3 Checkpoint lists the Cosmos3 snapshots of
the Hub cache (and of ``extra_model_paths.yaml``'s ``cosmos3_hub`` folders) by repository and revision, loads them,
lets a shipped workflow's ``Cosmos3-Nano`` mean the cached ``main`` revision, and names the missing file of a
snapshot whose download stopped (real ComfyUI 0.3.75 host; the cache laid out as huggingface_hub writes it:
snapshot files are links into ``blobs/``, ``refs/<revision>`` names a commit).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from test_workflows import TINY_EDGE, TINY_NANO

MAIN = "1" * 40
FP8 = "2" * 40
EDGE = "3" * 40


def lay_snapshot(repo: Path, commit: str, source: Path, ref: str | None = None) -> Path:
    """``source``'s files as snapshot ``commit`` of ``repo``: each a link to a blob named by a digest, as the Hub
    client writes them; ``refs/<ref>`` names the commit."""
    snapshot = repo / "snapshots" / commit
    for path in sorted(p for p in source.rglob("*") if p.is_file()):
        blob = repo / "blobs" / f"{commit[:4]}-{abs(hash(path.relative_to(source).as_posix())):x}"
        blob.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, blob)
        link = snapshot / path.relative_to(source)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(blob)
    if ref:
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / ref).write_text(commit)
    return snapshot


@pytest.fixture(scope="module")
def cache(host, tmp_path_factory):
    models = host.base_dir / "models" / "diffusers"
    root = tmp_path_factory.mktemp("hf") / "hub"
    nano = root / "models--nvidia--Cosmos3-Nano"
    lay_snapshot(nano, MAIN, models / TINY_NANO, "main")
    lay_snapshot(nano, FP8, models / TINY_NANO, "fp8")
    lay_snapshot(root / "models--nvidia--Cosmos3-Edge", EDGE, models / TINY_EDGE)  # no ref: a detached download
    lay_snapshot(root / "models--Qwen--Qwen3-0.6B", MAIN, models / TINY_NANO / "text_tokenizer", "main")  # not listed
    extra = tmp_path_factory.mktemp("hf-extra") / "hub"
    lay_snapshot(extra / "models--nvidia--Cosmos3-Super", MAIN, models / TINY_NANO, "main")
    return root, extra


@pytest.fixture
def loader(host, cache, monkeypatch):
    """The loader node class and its module, the Hub cache pointed at ``cache``, ``extra`` named under the
    ``cosmos3_hub`` key as extra_model_paths.yaml would."""
    import folder_paths

    root, extra = cache
    monkeypatch.setenv("HF_HUB_CACHE", str(root))
    monkeypatch.setitem(folder_paths.folder_names_and_paths, "cosmos3_hub", ([str(extra)], set()))
    cls = host.node_class_mappings["Cosmos3Loader"]
    return cls, sys.modules[cls.__module__]


def test_default_cache_follows_the_hub_clients_environment(loader, monkeypatch, tmp_path):
    hub = sys.modules[loader[1].__name__.rpartition(".")[0] + ".hub_cache"]
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert hub.default_cache() == tmp_path / ".cache" / "huggingface" / "hub"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert hub.default_cache() == tmp_path / "x" / "huggingface" / "hub"
    monkeypatch.setenv("HF_HOME", str(tmp_path / "h"))
    assert hub.default_cache() == tmp_path / "h" / "hub"
    monkeypatch.setenv("HUGGINGFACE_HUB_CACHE", str(tmp_path / "old"))
    assert hub.default_cache() == tmp_path / "old"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "new"))
    assert hub.default_cache() == tmp_path / "new"


def test_snapshots_are_listed_by_repository_and_revision(loader):
    cls, _ = loader
    options = cls.define_schema().inputs[0].options
    hub = [o for o in options if "(hub " in o]
    assert sorted(hub) == sorted(["nvidia/Cosmos3-Nano (hub main)", "nvidia/Cosmos3-Nano (hub fp8)",
                                  f"nvidia/Cosmos3-Edge (hub @{EDGE[:8]})", "nvidia/Cosmos3-Super (hub main)"]), hub
    assert TINY_NANO in options  # the folders are still listed, first


def test_a_snapshot_loads_and_a_shipped_name_means_the_cached_main_revision(loader, cache):
    cls, module = loader
    handle = cls.execute(checkpoint="nvidia/Cosmos3-Nano (hub fp8)", dtype="fp32", device="cpu").result[0]
    assert handle.path == cache[0] / "models--nvidia--Cosmos3-Nano" / "snapshots" / FP8
    assert module.resolve_checkpoint("Cosmos3-Nano") == (
        "nvidia/Cosmos3-Nano (hub main)", cache[0] / "models--nvidia--Cosmos3-Nano" / "snapshots" / MAIN)
    assert module.resolve_checkpoint("Cosmos3-Edge")[0] == f"nvidia/Cosmos3-Edge (hub @{EDGE[:8]})"  # its only one


def test_a_snapshot_with_a_missing_shard_names_the_file_and_the_download(loader, cache, tmp_path):
    cls, _ = loader
    repo = cache[0] / "models--nvidia--Cosmos3-Nano"
    commit = "4" * 40
    snapshot = lay_snapshot(repo, commit, repo / "snapshots" / FP8, "stopped")
    try:
        shard = sorted((snapshot / "transformer").glob("*-00002-of-*.safetensors"))[0]
        shard.resolve().unlink()  # the blob never arrived: the link dangles
        with pytest.raises(ValueError, match=rf"Cosmos3Loader: checkpoint 'nvidia/Cosmos3-Nano \(hub stopped\)' "
                                             rf"\(.*\) lacks transformer/{shard.name}: its download stopped before it "
                                             rf"finished. Complete it with: hf download nvidia/Cosmos3-Nano "
                                             rf"--revision stopped transformer/{shard.name}"):
            cls.execute(checkpoint="nvidia/Cosmos3-Nano (hub stopped)", dtype="fp32", device="cpu")
    finally:
        shutil.rmtree(snapshot)
        (repo / "refs" / "stopped").unlink()

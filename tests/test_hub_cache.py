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


INDEX = "diffusion_pytorch_model.safetensors.index.json"
SINGLE = "diffusion_pytorch_model.safetensors"


@pytest.fixture
def stopped(cache):
    """A copy of the Nano ``fp8`` snapshot as commit ``5…`` under the ref ``stopped``, removed afterwards."""
    repo = cache[0] / "models--nvidia--Cosmos3-Nano"
    snapshot = lay_snapshot(repo, "5" * 40, repo / "snapshots" / FP8, "stopped")
    yield snapshot
    shutil.rmtree(snapshot)
    (repo / "refs" / "stopped").unlink()


def load_error(cls) -> str:
    with pytest.raises(ValueError) as err:
        cls.execute(checkpoint="nvidia/Cosmos3-Nano (hub stopped)", dtype="fp32", device="cpu")
    return str(err.value)


def stopped_message(names: str, fix: str) -> str:
    return (f"lacks {names}: its download stopped before it finished. Complete it with: hf download "
            f"nvidia/Cosmos3-Nano --revision stopped {fix}")


@pytest.mark.parametrize("lost", ["link", "blob"])
def test_a_snapshot_without_its_shard_index_names_the_index_and_the_download(loader, stopped, lost):
    """The index deleted (``link``) or its blob never arrived (``blob``: the link dangles), every shard there: the
    index is the one file named, and the ``hf download`` line fetches exactly it."""
    cls, _ = loader
    index = stopped / "transformer" / INDEX
    assert sorted((stopped / "transformer").glob("*-of-*.safetensors"))  # the tiny checkpoint is sharded
    (index.resolve() if lost == "blob" else index).unlink()
    message = load_error(cls)
    assert message.startswith("Cosmos3Loader: checkpoint 'nvidia/Cosmos3-Nano (hub stopped)'"), message
    assert message.endswith(stopped_message(f"transformer/{INDEX}", f"transformer/{INDEX}")), message
    assert "not a Cosmos3 transformer folder" not in message


def test_a_snapshot_without_its_index_and_a_shard_names_both(loader, stopped):
    """No index, so the shards expected are those of the ``-0000K-of-0000N`` sequence of the ones there."""
    cls, _ = loader
    shards = sorted((stopped / "transformer").glob("*-of-*.safetensors"))
    assert len(shards) >= 3
    (stopped / "transformer" / INDEX).unlink()
    shards[1].unlink()
    missing = f"transformer/{INDEX} transformer/{shards[1].name}"
    assert load_error(cls).endswith(stopped_message(missing.replace(" ", ", "), missing))


def test_a_snapshot_with_no_transformer_weights_downloads_them_by_pattern(loader, stopped):
    """Neither the index nor any weight file: the repository may be sharded or one file, so the line fetches
    whichever it has (``--include``), never a file name that may not exist there."""
    cls, _ = loader
    for path in (stopped / "transformer").iterdir():
        if path.name != "config.json":
            path.unlink()
    weights = "transformer/diffusion_pytorch_model*"
    assert load_error(cls).endswith(stopped_message(weights, f'--include "{weights}"'))


def single_file_transformer(snapshot: Path) -> Path:
    """``snapshot``'s sharded transformer rewritten as the one ``diffusion_pytorch_model.safetensors`` (a link to
    its blob, as the Hub client writes it), no index."""
    from safetensors.torch import load_file, save_file

    folder = snapshot / "transformer"
    shards = sorted(folder.glob("*-of-*.safetensors"))
    state = {k: v for shard in shards for k, v in load_file(shard).items()}
    for path in [*shards, folder / INDEX]:
        path.unlink()
    blob = snapshot.parent.parent / "blobs" / f"{snapshot.name[:4]}-single"
    save_file(state, blob, metadata={"format": "pt"})
    (folder / SINGLE).symlink_to(blob)
    return folder / SINGLE


def test_a_single_file_transformer_without_an_index_is_complete(loader, stopped):
    cls, module = loader
    hub = sys.modules[module.__name__.rpartition(".")[0] + ".hub_cache"]
    single = single_file_transformer(stopped)
    assert hub.missing_files(stopped) == []
    handle = cls.execute(checkpoint="nvidia/Cosmos3-Nano (hub stopped)", dtype="fp32", device="cpu").result[0]
    assert handle.path == stopped
    single.resolve().unlink()  # its blob gone: the one file is what is missing
    assert hub.missing_files(stopped) == [f"transformer/{SINGLE}"]
    assert load_error(cls).endswith(stopped_message(f"transformer/{SINGLE}", f"transformer/{SINGLE}"))


def test_a_snapshot_without_transformer_weights_loads_beside_a_gguf_holding_them(loader, stopped, host):
    """A snapshot downloaded for its configs, VAE and tokenizer only, the transformer from a GGUF: complete."""
    from cosmos3_core.model.gguf_write import write_gguf

    cls, _ = loader
    folder = host.base_dir / "models" / "diffusion_models"
    folder.mkdir(parents=True, exist_ok=True)
    gguf = folder / "cosmos3-test-hub-nano-q8_0.gguf"
    write_gguf(host.base_dir / "models" / "diffusers" / TINY_NANO, gguf, "Q8_0")
    try:
        for path in (stopped / "transformer").iterdir():
            if path.name != "config.json":
                path.unlink()
        handle = cls.execute(checkpoint="nvidia/Cosmos3-Nano (hub stopped)", dtype="fp32", device="cpu",
                             gguf=gguf.name).result[0]
        assert handle.path == stopped
        quantized = [m for m in handle.pipeline.transformer.modules()  # the pack's own import of the core
                     if "GgufLinear" in {c.__name__ for c in type(m).__mro__}]
        assert quantized  # the transformer came from the GGUF
    finally:
        gguf.unlink()

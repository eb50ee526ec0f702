"""Where compiled graphs are kept and what their key covers (``cosmos3_core.kernels.precompiled``).

* The key's source digest covers every source file of ``cosmos3_core`` — the generation layer's graph inlines
  ``model/``, the VAE stages' ``vae/`` — so an update of any of them compiles again instead of loading a graph of
  the old code (torch's loader checks no source).
* Inside ComfyUI, which imports the pack under its folder's path (``/…/custom_nodes/<pack>``), the graph files are
  named from the package's root and kept in the cache folder, never beside the pack; files that such a path-named
  graph left in ``custom_nodes`` are removed, and nothing else there.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import torch

from cosmos3_core.kernels import precompiled

PACKAGE = Path(precompiled.__file__).resolve().parents[1]


def _digest_of(root: Path, monkeypatch) -> str:
    monkeypatch.setattr(precompiled, "PACKAGE_ROOT", root)
    precompiled.code_digest.cache_clear()
    try:
        return precompiled.code_digest()
    finally:
        precompiled.code_digest.cache_clear()


def test_the_source_digest_covers_every_subpackage(tmp_path, monkeypatch):
    import cosmos3_core

    assert precompiled.PACKAGE_ROOT == Path(cosmos3_core.__file__).resolve().parent  # the whole package, read below
    copy = tmp_path / "cosmos3_core"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    seen = {_digest_of(copy, monkeypatch)}
    assert _digest_of(copy, monkeypatch) in seen  # the same code, the same digest
    for edited in ("model/transformer.py", "vae/frame_decoder.py", "sampling/loop.py", "kernels/attention.py"):
        with open(copy / edited, "a") as f:
            f.write("\n# edited\n")
        digest = _digest_of(copy, monkeypatch)
        assert digest not in seen, edited
        seen.add(digest)
    # a file that moves to another subpackage is other code for the key, though its bytes are the same
    (copy / "model" / "towers.py").rename(copy / "sampling" / "towers.py")
    assert _digest_of(copy, monkeypatch) not in seen


@pytest.mark.comfy
def test_under_comfyui_graph_files_are_named_from_the_package_and_kept_in_the_cache(tmp_path, monkeypatch):
    from support import comfy_host

    host = comfy_host.get_executor()
    host.assert_pack_loaded()
    name = next(n for n in sys.modules if n.endswith(".cosmos3_core.kernels.precompiled") and n != precompiled.__name__)
    loaded = sys.modules[name]  # the pack's core as ComfyUI's own loader imported it
    assert loaded.HOST_PREFIX.startswith(str(host.base_dir)), loaded.HOST_PREFIX  # a path, as ComfyUI names it
    layer = sys.modules[loaded.HOST_PREFIX + "cosmos3_core.model.transformer"].generation_layer

    monkeypatch.setenv("COSMOS3_CACHE_DIR", str(tmp_path / "cache"))
    path = loaded.PrecompiledFunction(layer).path((torch.zeros(2, 3),))
    assert path.parent == tmp_path / "cache" / "aot", path
    assert path.name.startswith("cosmos3_core.model.transformer.generation_layer-"), path.name

    # where graph files named ``<module>.<function>`` went when the module was ComfyUI's path-like name: the
    # absolute name replaced the cache folder's path
    module = f"{layer.__module__}.{layer.__qualname__}"
    misplaced = [Path(f"{module}-{'ab12' * 6}.bin"), Path(f"{module}-{'0f' * 12}.2.bin")]
    custom_nodes = Path(loaded.HOST_PREFIX).parent
    assert all(p.is_absolute() and p.parent == custom_nodes for p in misplaced), misplaced
    pack = Path(loaded.HOST_PREFIX).name
    kept = [custom_nodes / f"{pack}cosmos3_core.notes.bin", custom_nodes / "other_pack.bin",
            Path(f"{module}-{'ab12' * 6}.txt"), Path(f"{module}-{'ab12' * 5}.bin")]
    for p in misplaced + kept:
        p.write_bytes(b"x")
    try:
        assert loaded.remove_misplaced_files.__wrapped__() == len(misplaced)
        assert [p for p in misplaced if p.exists()] == []
        assert all(p.exists() for p in kept)
    finally:
        for p in misplaced + kept:
            p.unlink(missing_ok=True)

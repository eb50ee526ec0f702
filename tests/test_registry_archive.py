"""The Comfy Registry archive: what ``comfy node publish`` uploads and ``comfy node install`` unpacks.

comfy-cli packs the files git tracks minus those ``.comfyignore`` matches (gitignore syntax; comfy-cli 1.23
``file_utils.zip_files``). Git applies the same syntax here (``git ls-files -i --exclude-from=.comfyignore``), and:

* the archive leaves out the development-only files (the test modules, the benchmark scripts and results, CI) and
  keeps the pack, its metadata, the workflows and every document a user reads;
* every relative link in the archive's Markdown files points at a file inside the archive;
* unpacked as a real folder in ``custom_nodes/`` of a real ComfyUI 0.3.75 server (nothing of the repository on its
  path), the pack registers its nodes, lists its templates and runs the shipped T2AV API workflow (shrunk, tiny
  checkpoint) to an mp4 with sound; the CLI runs from the unpacked folder.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from support import comfy_host
from test_workflows import PACK_NODE_IDS, check_outputs, ensure_tiny_checkpoints, shrink_api, write_test_inputs

ROOT = comfy_host.REPO_ROOT
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _git_files(*args: str) -> set[str]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.fail("needs the repository's git checkout (the archive is built from the files git tracks)")
    out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", *args], capture_output=True, check=True)
    return {p for p in out.stdout.decode().split("\0") if p}


@pytest.fixture(scope="module")
def archive_files() -> set[str]:
    tracked = _git_files()
    ignored = _git_files("--cached", "--ignored", "--exclude-from=.comfyignore")
    return {p for p in tracked - ignored if (ROOT / p).is_file()}


def test_archive_keeps_the_pack_and_leaves_out_development_files(archive_files):
    pack = {p for p in _git_files() if p.startswith(("cosmos3_core/", "nodes/", "example_workflows/"))}
    needed = pack | {"__init__.py", "pyproject.toml", "requirements.txt", "LICENSE", "README.md", "BENCHMARKS.md",
                     "tests/run.sh"}
    assert not sorted(needed - archive_files), "the registry archive would miss these"
    left_out = [p for p in archive_files
                if p.startswith((".ci/", "tests/test_", "tests/support/", "bench/results/")) or
                (p.startswith("bench/") and p.endswith(".py"))]
    assert not left_out, f"development-only files in the registry archive: {left_out}"


def test_every_markdown_link_stays_inside_the_archive(archive_files):
    broken = []
    for doc in sorted(p for p in archive_files if p.endswith(".md")):
        for target in LINK.findall((ROOT / doc).read_text()):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue  # a web address or an anchor in the same file
            path = os.path.normpath(os.path.join(os.path.dirname(doc), target.split("#")[0]))
            if path not in archive_files and not any(f.startswith(path + "/") for f in archive_files):
                broken.append(f"{doc} → {target}")
    assert not broken, f"links to files the registry archive leaves out: {broken}"


@pytest.mark.comfy
def test_pack_runs_from_the_unpacked_archive(archive_files, tmp_path, tiny_checkpoint):
    base = comfy_host.comfy_home(tmp_path, link_pack=False)
    unpacked = base / "custom_nodes" / comfy_host.PACK_NAME
    for rel in archive_files:
        (unpacked / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, unpacked / rel)
    ensure_tiny_checkpoints(base / "models" / "diffusers", tiny_checkpoint)
    write_test_inputs(base / "input")

    cli = subprocess.run([sys.executable, "-m", "cosmos3_core.generate", "--help"], cwd=unpacked,
                         capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0 and "--checkpoint" in cli.stdout, cli.stderr[-2000:]

    with comfy_host.ComfyServer(base, require_pack=True) as srv:
        assert set(PACK_NODE_IDS) <= set(srv.pack_node_ids())
        templates = srv.get("/api/workflow_templates")[comfy_host.PACK_NAME]
        shipped = sorted(p.stem for p in (unpacked / "example_workflows").glob("*.json"))
        assert sorted(templates) == shipped and shipped, templates
        api = json.loads((unpacked / "example_workflows" / "api" / "cosmos3_t2av.json").read_text())
        graph = shrink_api(api, prefix="cosmos3_archive/t2av")
        entry = srv.run(graph, timeout=300)
        assert entry["status"]["status_str"] == "success", entry["status"]
        check_outputs(base, "t2av", graph, entry["outputs"])
        assert "IMPORT FAILED" not in srv.log_text()

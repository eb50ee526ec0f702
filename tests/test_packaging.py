"""The pack's install metadata says what the code needs, in the ranges it is tested with.

* ``requirements.txt`` (what ComfyUI-Manager and ``comfy node install`` install) and ``pyproject.toml``'s
  ``[project] dependencies`` (what the Comfy Registry publishes) are the same list;
* every module the pack imports outside the standard library is one of them (or an optional extra, or part of the
  host: ComfyUI and its PyTorch), and every listed package is imported — no missing and no stale dependency;
* the ranges hold the versions the test environment pins (tests/run.sh) and the versions installed there, keep the
  reference (diffusers 0.42.x, transformers 5.x) and pin nothing exactly, so an install never downgrades a user;
* ComfyUI's own parser of custom-node metadata (``comfy_config.config_parser`` of the real 0.3.75 host, the code its
  server runs when it loads the pack) reads the registry fields, and the LICENSE is the license pyproject names.
"""

from __future__ import annotations

import ast
import importlib.metadata
import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_SOURCES = [ROOT / "__init__.py", *sorted((ROOT / "cosmos3_core").rglob("*.py")),
                   *sorted((ROOT / "nodes").rglob("*.py"))]

# Imported, but provided by the ComfyUI host rather than installed by the pack (why, per module).
HOST_MODULES = {
    "torch": "the host's PyTorch build (ComfyUI's requirements.txt lists it); the pack never replaces it",
    "triton": "ships with PyTorch's Linux CUDA wheels; imported only where it is available",
    "comfy": "ComfyUI", "comfy_api": "ComfyUI", "comfy_extras": "ComfyUI", "folder_paths": "ComfyUI",
    "latent_preview": "ComfyUI", "server": "ComfyUI", "node_helpers": "ComfyUI", "comfy_execution": "ComfyUI",
}
OWN_MODULES = {"cosmos3_core", "nodes"}


def _requirements(lines) -> dict[str, Requirement]:
    reqs = [Requirement(line) for line in (raw.strip() for raw in lines) if line and not line.startswith("#")]
    by_name = {canonicalize_name(r.name): r for r in reqs}
    assert len(by_name) == len(reqs), f"a package is listed twice: {[r.name for r in reqs]}"
    return by_name


@pytest.fixture(scope="module")
def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


@pytest.fixture(scope="module")
def runtime(pyproject) -> dict[str, Requirement]:
    return _requirements(pyproject["project"]["dependencies"])


def _imported_top_level_modules() -> dict[str, list[str]]:
    """Every absolute import of the package (module level or inside functions): top-level name → files."""
    found: dict[str, list[str]] = {}
    for path in PACKAGE_SOURCES:
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                found.setdefault(name.split(".")[0], []).append(str(path.relative_to(ROOT)))
    return found


def _pinned_test_versions() -> dict[str, Version]:
    """``name==version`` pins of the test environment (tests/run.sh's TORCH_PINS and DEPS arrays)."""
    script = (ROOT / "tests" / "run.sh").read_text()
    pins = {}
    for array in ("TORCH_PINS", "DEPS"):
        match = re.search(rf"^{array}=\((.*?)\)", script, re.MULTILINE | re.DOTALL)
        assert match, f"tests/run.sh has no {array}=(...) array"
        for item in shlex.split(match.group(1)):
            req = Requirement(item)
            pinned = [s.version for s in req.specifier if s.operator == "=="]
            if pinned:
                pins[canonicalize_name(req.name)] = Version(pinned[0])
    return pins


def test_requirements_txt_is_the_pyproject_dependency_list(runtime):
    listed = _requirements((ROOT / "requirements.txt").read_text().splitlines())
    assert {n: str(r.specifier) for n, r in listed.items()} == {n: str(r.specifier) for n, r in runtime.items()}
    assert not [r for r in listed.values() if r.marker or r.url], "requirements.txt: plain requirements only"


def test_every_import_is_a_declared_dependency_and_every_dependency_is_imported(pyproject, runtime):
    optional = _requirements(pyproject["project"]["optional-dependencies"]["flash"])
    distributions = importlib.metadata.packages_distributions()
    imported = _imported_top_level_modules()
    missing, used = [], set()
    for module, files in sorted(imported.items()):
        if module in sys.stdlib_module_names or module in OWN_MODULES or module in HOST_MODULES or module == "__future__":
            continue
        dists = {canonicalize_name(d) for d in distributions.get(module, [])}
        if module == "flash_attn":  # the optional FlashAttention-4 (not installed in the CPU test environment)
            dists = {"flash-attn-4"}
        declared = dists & (set(runtime) | set(optional))
        if not declared:
            missing.append(f"{module} (imported by {files[0]}; distributions {sorted(dists) or 'unknown'})")
        used |= declared
    assert not missing, f"imported but not declared in requirements.txt / pyproject.toml: {missing}"
    stale = sorted(set(runtime) - used)
    assert not stale, f"declared but never imported by the pack: {stale}"
    assert "torch" not in runtime, "torch is the host's; listing it lets pip replace a user's CUDA build"


def test_ranges_hold_the_tested_versions_and_keep_the_reference(runtime):
    pins = _pinned_test_versions()
    checked = {name: pins[name] for name in runtime if name in pins}
    assert "diffusers" in checked, "tests/run.sh no longer pins diffusers, the numerical reference"
    for name, version in checked.items():
        assert runtime[name].specifier.contains(version, prereleases=True), \
            f"{name}: the tests pin {version}, outside {runtime[name].specifier}"
    for name, req in runtime.items():
        installed = Version(importlib.metadata.version(name))
        assert req.specifier.contains(installed, prereleases=True), \
            f"{name} {installed} (the test environment's) is outside {req.specifier}"
        assert not [s for s in req.specifier if s.operator in ("==", "===")], f"{name}: an exact pin downgrades users"
    diffusers, transformers = runtime["diffusers"].specifier, runtime["transformers"].specifier
    assert diffusers.contains("0.42.1") and diffusers.contains("0.42.9")
    assert not diffusers.contains("0.42.0") and not diffusers.contains("0.43.0"), "diffusers 0.42.x is the reference"
    assert transformers.contains("5.15.0") and transformers.contains("5.99")
    assert not transformers.contains("5.14.9") and not transformers.contains("6.0.0")


def test_comfyui_reads_the_registry_metadata(pyproject, runtime):
    comfyui = os.environ.get("COMFYUI_DIR")
    if not comfyui or not (Path(comfyui) / "comfy_config" / "config_parser.py").is_file():
        pytest.skip("needs the ComfyUI host (COMFYUI_DIR, set by tests/run.sh)")
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); from comfy_config import config_parser; "
            "print(json.dumps(config_parser.extract_node_configuration(sys.argv[2]).model_dump()))")
    r = subprocess.run([sys.executable, "-c", code, comfyui, str(ROOT)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    parsed = json.loads(r.stdout.strip().splitlines()[-1])
    project, comfy = parsed["project"], parsed["tool_comfy"]
    assert project["name"] == pyproject["project"]["name"]
    assert re.fullmatch(r"[A-Za-z][A-Za-z0-9]*(?:[-_.][A-Za-z0-9]+)*", project["name"]) and len(project["name"]) < 100
    assert re.fullmatch(r"\d+\.\d+\.\d+", project["version"]), "the registry wants a three-part semantic version"
    assert _requirements(project["dependencies"]).keys() == runtime.keys()
    assert project["supported_os"] == ["POSIX :: Linux"]
    assert project["supported_accelerators"] == ["GPU :: NVIDIA CUDA"]
    assert project["supported_comfyui_version"] == ">=0.3.75"
    assert comfy["publisher_id"] and comfy["display_name"] == "Cosmos3"
    assert project["license"]["text"] == "Apache-2.0"
    license_text = (ROOT / "LICENSE").read_text()
    assert "Apache License\n                           Version 2.0, January 2004" in license_text
    assert "END OF TERMS AND CONDITIONS" in license_text


def test_the_test_map_names_every_test_module():
    """tests/README.md groups every test module by what it proves; a new module must find its row there."""
    tests = Path(__file__).resolve().parent
    listed = set(re.findall(r"`(test_\w+\.py)`", (tests / "README.md").read_text()))
    assert listed == {p.name for p in tests.glob("test_*.py")}

"""A new user's first run in a real ``main.py --cpu`` ComfyUI 0.3.75 server: the checkpoint where the README puts
it under a name of the user's own, another one in a Hub cache folder named in ``extra_model_paths.yaml``, the
shipped workflow's checkpoint name as it comes, and a Python environment without ``accelerate`` (ComfyUI does not
install it; ``peft``, which imports it, is hidden with it).

* The shipped name ``Cosmos3-Nano`` stands for the one Nano checkpoint found (``my-nano``), ``Cosmos3-Edge``
  for the one Edge (the Hub snapshot, listed by its revision folder); both shrunk workflows run and say which
  folder they loaded.
* The server's log of those runs (checkpoint loads included: transformer, VAE, sound decoder) holds no warning, no
  deprecation, no ``accelerate`` advice and no "scaled fp8" line (no FP8 is involved).
* ``extra_model_paths.yaml`` (read by ComfyUI itself at start-up) also names a folder under ComfyUI's
  ``diffusion_models`` key and one under its legacy ``unet`` key, each holding a ``.gguf``, and a Hub cache folder
  under the pack's ``cosmos3_hub`` key holding a Cosmos3-Super snapshot: Load Cosmos3 Checkpoint lists both GGUF
  files and the snapshot (``nvidia/Cosmos3-Super (hub main)``), and a workflow runs from the extra folder's GGUF.
* A name that stands for no folder is refused when queued (HTTP 400, the loader's ``validate_inputs``), listing the
  checkpoints found and the folders searched (the extra Hub cache folder too), and saying "pick one in Load Cosmos3
  Checkpoint".
"""
from __future__ import annotations

import os
import re
import shutil

import pytest

from cosmos3_core.model.gguf_write import write_gguf
from support import comfy_host
from test_workflows import check_outputs, load_api, nodes_of, shrink_api, write_test_inputs

pytestmark = pytest.mark.comfy

REVISION = "0123456789abcdef0123456789abcdef01234567"  # a Hub snapshot folder is named by its commit
SUPER_REVISION = "89abcdef0123456789abcdef0123456789abcdef"
SUPER = "nvidia/Cosmos3-Super (hub main)"  # the snapshot in the cosmos3_hub folder, as the loader lists it
EXTRA_GGUF = "cosmos3-extra-q4.gguf"  # in the yaml's diffusion_models folder
UNET_GGUF = "cosmos3-extra-unet-q4.gguf"  # in the yaml's unet folder (ComfyUI's legacy name of diffusion_models)
# What must never appear while a checkpoint loads and runs (case-insensitive).
NOISE = re.compile(r"warn|deprecat|accelerate|scaled fp8|traceback|error", re.IGNORECASE)
HIDE = "import sys\nfor _name in ('accelerate', 'peft'):\n    sys.modules[_name] = None  # find_spec() sees None\n"


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_checkpoint):
    tmp = tmp_path_factory.mktemp("first-run")
    base = comfy_host.comfy_home(tmp)
    shutil.copytree(tiny_checkpoint("nano", seed=0), base / "models" / "cosmos3" / "my-nano")
    snapshots = tmp / "hub" / "models--nvidia--Cosmos3-Edge" / "snapshots"
    shutil.copytree(tiny_checkpoint("edge", seed=0), snapshots / REVISION)
    extra = tmp / "more-models"  # a second section of the yaml: GGUF folders and a Hub cache for the pack
    for folder in ("dm", "un", "hub"):
        (extra / folder).mkdir(parents=True)
    write_gguf(tiny_checkpoint("nano", seed=0), extra / "dm" / EXTRA_GGUF, "Q4_0")
    shutil.copyfile(extra / "dm" / EXTRA_GGUF, extra / "un" / UNET_GGUF)
    repo = extra / "hub" / "models--nvidia--Cosmos3-Super"
    shutil.copytree(tiny_checkpoint("super", seed=0), repo / "snapshots" / SUPER_REVISION)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(SUPER_REVISION)
    yaml = tmp / "extra_model_paths.yaml"
    yaml.write_text(f"hub_cache:\n    base_path: {snapshots}\n    cosmos3: .\n"
                    f"more_models:\n    base_path: {extra}\n    diffusion_models: dm\n    unet: un\n"
                    "    cosmos3_hub: hub\n")
    write_test_inputs(base / "input")
    hide = tmp / "no_accelerate"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(HIDE)
    hub_cache = tmp / "hf-cache"  # the Hub client's cache the loader also lists (nodes/hub_cache.py): empty here
    hub_cache.mkdir()
    env = {**os.environ, "PYTHONPATH": str(hide), "HF_HUB_CACHE": str(hub_cache)}
    with comfy_host.ComfyServer(base, require_pack=True, env=env,
                                extra_args=["--extra-model-paths-config", str(yaml)]) as srv:
        srv.snapshots, srv.hub_cache, srv.extra = snapshots, hub_cache, extra
        yield srv


def run_log(srv, graph: dict) -> tuple[dict, list[str]]:
    """Run ``graph``; its history entry and the server's log lines of that run."""
    seen = len(srv.log_text())
    entry = srv.run(graph, timeout=300)
    return entry, srv.log_text()[seen:].splitlines()


def test_loader_lists_models_cosmos3_and_the_hub_snapshot(server):
    log = server.log_text()
    assert "Adding extra search path cosmos3" in log
    for key, folder in (("diffusion_models", "dm"), ("unet", "un"), ("cosmos3_hub", "hub")):
        assert f"Adding extra search path {key} {server.extra / folder}" in log, key
    inputs = server.object_info("Cosmos3Loader")["input"]
    options = inputs["required"]["checkpoint"][1]["options"]
    assert sorted(options) == sorted([REVISION, "my-nano", SUPER]), options
    gguf = inputs["optional"]["gguf"][1]["options"]
    assert gguf[0] == "none" and sorted(gguf[1:]) == sorted([EXTRA_GGUF, UNET_GGUF]), gguf  # models/ holds none


def test_a_workflow_runs_from_a_gguf_in_an_extra_diffusion_models_folder(server):
    graph = shrink_api(load_api("t2i"), checkpoint="my-nano", prefix="first_run/extra_gguf")
    (loader,) = nodes_of(graph, "Cosmos3Loader")
    graph[loader]["inputs"]["gguf"] = EXTRA_GGUF
    entry, lines = run_log(server, graph)
    check_outputs(server.base_dir, "t2i", graph, entry["outputs"])
    noise = [line for line in lines if NOISE.search(line)]
    assert not noise, "\n".join(lines)


@pytest.mark.parametrize("mode, name, loaded, where", [
    ("t2av", "Cosmos3-Nano", "my-nano", "models/cosmos3/my-nano"),
    ("t2v", "Cosmos3-Edge", REVISION, f"snapshots/{REVISION}"),
])
def test_shipped_name_runs_on_the_one_checkpoint_of_its_kind_without_a_warning(server, mode, name, loaded, where):
    graph = shrink_api(load_api(mode), checkpoint=name, prefix=f"first_run/{mode}")
    entry, lines = run_log(server, graph)
    check_outputs(server.base_dir, mode, graph, entry["outputs"])
    said = [line for line in lines if f"no checkpoint folder is named {name!r}; loading {loaded!r}" in line]
    assert len(said) == 1 and where in said[0] and "pick one in Load Cosmos3 Checkpoint" in said[0], lines
    noise = [line for line in lines if NOISE.search(line)]
    assert not noise, "\n".join(lines)


def test_missing_checkpoint_is_refused_when_queued(server):
    graph = shrink_api(load_api("t2i"), checkpoint="Cosmos3-Nano-v2", prefix="first_run/missing")
    with pytest.raises(comfy_host.PromptValidationError) as refused:
        server.queue(graph)
    (loader,) = [nid for nid, n in graph.items() if n["class_type"] == "Cosmos3Loader"]
    (error,) = refused.value.node_errors[loader]["errors"]
    msg = error["details"]
    models = server.base_dir / "models"
    want = ("checkpoint - Cosmos3Loader: checkpoint 'Cosmos3-Nano-v2' was not found; pick one in Load Cosmos3 "
            f"Checkpoint — in {server.snapshots}: '{REVISION}' (Edge); in {models / 'cosmos3'}: 'my-nano' (Nano); "
            f"in {models / 'diffusers'}: none; in the Hugging Face cache ({server.hub_cache}, "
            f"{server.extra / 'hub'}): '{SUPER}' (Super). To add one, put its folder (with transformer/config.json) "
            "in one of those folders and press r to refresh.")
    assert msg == want, msg

"""``caches.CompilerPreload``: the compiler's modules import on a background thread.

A fresh process (nothing of torch's compiler imported yet) starts the preload and, while it runs, compiles and runs
a function on the main thread: the result must equal eager, every module of ``COMPILER_MODULES`` must be imported
by the end, none may fail, and the inductor cache must still point at ``COSMOS3_CACHE_DIR`` (importing
``torch._dynamo`` writes torch's default folder into the environment). ``Cosmos3Pipeline.load`` must not start it:
a preload beside the weight reads costs the load about what it saves the first compile.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]

FRESH_PROCESS = r"""
import json, os, sys
import torch
import torch.nn.functional as F
from cosmos3_core.kernels.caches import COMPILER_MODULES, CompilerPreload, enable_persistent_caches

imported_before = [m for m in COMPILER_MODULES if m in sys.modules]
enable_persistent_caches()  # as a host does before its preload (preload_first_run, with compile_workers)
thread = CompilerPreload()
thread.start()
f = torch.compile(lambda x: F.silu(x) * x + 1, backend="aot_eager", fullgraph=True)  # Dynamo on this thread
x = torch.randn(257)
y = f(x)
thread.join(timeout=240)
print(json.dumps(dict(
    imported_before=imported_before, alive=thread.is_alive(), failed=thread.failed, seconds=thread.seconds,
    missing=[m for m in COMPILER_MODULES if m not in sys.modules],
    compiled_matches_eager=bool(torch.equal(y, F.silu(x) * x + 1)),
    inductor_cache=os.environ.get("TORCHINDUCTOR_CACHE_DIR"))))
"""


def test_preload_imports_the_compiler_while_the_main_thread_compiles(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHINDUCTOR_", "TRITON_", "TORCH_COMPILE"))}
    env.update(COSMOS3_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-c", FRESH_PROCESS], env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["imported_before"] == [], "importing caches.py already imported the compiler: nothing to preload"
    assert not out["alive"] and out["seconds"] is not None
    assert out["failed"] == {}
    assert out["missing"] == []
    assert out["compiled_matches_eager"]
    assert out["inductor_cache"] == str(tmp_path / "cache" / "inductor")


@pytest.fixture(scope="module")
def edge(tiny_checkpoint):
    return tiny_checkpoint("edge", sound=False, seed=2)


def test_load_runs_no_preload_beside_the_reads(monkeypatch, edge):
    """Also where CUDA is: a thread importing the compiler while the weights are read makes the reading thread wait
    for the GIL after every tensor (the load grew by about the imports' 2–3 s)."""
    import cosmos3_core.pipeline as pipeline_mod
    from cosmos3_core.kernels import caches

    started = []
    monkeypatch.setattr(caches.CompilerPreload, "start", lambda self: started.append(self))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    pipe = pipeline_mod.Cosmos3Pipeline.load(edge, dtype=torch.float32, with_sound=False)
    assert started == [] and pipe.transformer is not None
    caches.CompilerPreload().start()  # the recorder sees a preload when one is started (the check above can fail)
    assert len(started) == 1


FIRST_RUN_PROCESS = r"""
import json, sys
from cosmos3_core.kernels.caches import RUN_MODULES, preload_first_run, wait_for_preload

LAZY = ("diffusers", "transformers", "peft", "accelerate", "tokenizers", "huggingface_hub")
before = sorted(m for m in sys.modules if m.split(".")[0] in LAZY)
thread = preload_first_run(compiles=False)
wait_for_preload()
preloaded = set(sys.modules)
from cosmos3_core.cli.main import main
code = main(sys.argv[1:])
print(json.dumps(dict(before=before, failed=thread.failed, alive=thread.is_alive(), code=code,
                      once=preload_first_run(compiles=True) is thread,
                      imported_by_the_run=sorted(m for m in set(sys.modules) - preloaded if m.split(".")[0] in LAZY))))
"""


def test_the_first_run_preload_leaves_a_text_to_video_with_sound_run_nothing_to_import(tmp_path, tiny_checkpoint):
    """``preload_first_run`` (a ComfyUI server's idle time, nodes/warmup.py) must import the modules of diffusers,
    transformers and their dependencies that a first T2AV run through the CLI imports — text encode, sampling, the
    VAE and the sound decoder, the mp4 with sound — but for a few small scheduler modules."""
    nano = tiny_checkpoint("nano", seed=2)
    args = ["--checkpoint", str(nano), "--prompt", "a red car on a street", "--height", "64", "--width", "96",
            "--num-frames", "9", "--fps", "24", "--steps", "2", "--device", "cpu", "--dtype", "fp32",
            "--out", str(tmp_path / "clip.mp4")]
    env = {**os.environ, "COSMOS3_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", FIRST_RUN_PROCESS, *args], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["before"] == [], "importing the package already imported them: nothing to preload"
    assert out["failed"] == {} and not out["alive"] and out["once"], out
    assert out["code"] == 0 and (tmp_path / "clip.mp4").stat().st_size > 0
    # left to the run: the scheduler classes diffusers resolves as UniPC's compatibles at its first from_config
    # (about 15 small modules, 0.02 s on the CPU machine)
    left = [m for m in out["imported_by_the_run"] if not m.startswith("diffusers.schedulers.scheduling_")]
    assert left == [], left


WORKERS_PROCESS = r"""
import json, sys
from cosmos3_core.kernels.caches import preload_first_run

thread = preload_first_run(compiles=sys.argv[1] == "compiles")
thread.join(timeout=240)
from torch._dynamo.utils import compilation_time_metrics  # torch records each computation of its source key here
from torch._inductor import async_compile

pools = list(async_compile._pool_set)
sidecar_env = {}
if pools:  # the environment the workers' sidecar started with: the compile caches must point at ours already
    with open(f"/proc/{pools[0].process.pid}/environ", "rb") as f:
        sidecar_env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
print(json.dumps(dict(started=thread.workers_started, pools=len(pools),
                      sidecar_running=bool(pools) and pools[0].process.poll() is None,
                      sidecar_inductor_cache=sidecar_env.get(b"TORCHINDUCTOR_CACHE_DIR", b"").decode(),
                      torch_key_computed="inductor_codecache_torch_key" in compilation_time_metrics)))
"""


def _preload_in_a_fresh_process(tmp_path, how: str, **env_more) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TORCHINDUCTOR_", "TRITON_", "TORCH_WARM", "COSMOS3_PRESTART"))}
    env.update(COSMOS3_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=str(REPO), TORCHINDUCTOR_COMPILE_THREADS="2",
               **env_more)
    proc = subprocess.run([sys.executable, "-c", WORKERS_PROCESS, how], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Inductor's worker pool compiles Triton only")
def test_a_preload_for_compiling_runs_starts_inductors_compile_workers_and_honours_the_switches(tmp_path):
    """With ``compiles``, the preload hashes torch's sources for Inductor's keys and starts torch's own pool of
    compile worker processes (its sidecar process running); without ``compiles``, with the pack's
    ``COSMOS3_PRESTART_COMPILE_WORKERS=0`` or torch's ``TORCH_WARM_POOL=0``, no pool is started."""
    out = _preload_in_a_fresh_process(tmp_path, "compiles")
    assert out["started"] and out["pools"] == 1 and out["sidecar_running"] and out["torch_key_computed"], out
    assert out["sidecar_inductor_cache"] == str(tmp_path / "cache" / "inductor"), out
    out = _preload_in_a_fresh_process(tmp_path, "no-compile")
    assert not out["started"] and out["pools"] == 0 and not out["torch_key_computed"], out
    out = _preload_in_a_fresh_process(tmp_path, "compiles", COSMOS3_PRESTART_COMPILE_WORKERS="0")
    assert not out["started"] and out["pools"] == 0 and out["torch_key_computed"], out
    out = _preload_in_a_fresh_process(tmp_path, "compiles", TORCH_WARM_POOL="0")
    assert not out["started"] and out["pools"] == 0, out


@pytest.mark.parametrize("variable, default", [("COSMOS3_PRESTART_COMPILE_WORKERS", True),
                                               ("COSMOS3_PRELOAD_CUDA_LIBRARIES", False)])
@pytest.mark.parametrize("value, wanted, warned", [
    (None, None, False), ("", None, False), ("1", True, False), ("0", False, False), ("off", False, False),
    (" False ", False, False), ("yes", True, False), (" ON ", True, False), ("maybe", None, True)])
def test_the_preload_switches_read_common_spellings_and_name_any_other_value(monkeypatch, caplog, variable, default,
                                                                             value, wanted, warned):
    """``None`` in ``wanted``: the switch's default (the compile workers' early start on, the CUDA libraries off)."""
    from cosmos3_core.kernels import caches

    read = {"COSMOS3_PRESTART_COMPILE_WORKERS": caches.prestart_compile_workers_wanted,
            "COSMOS3_PRELOAD_CUDA_LIBRARIES": caches.preload_cuda_libraries_wanted}[variable]
    if value is None:
        monkeypatch.delenv(variable, raising=False)
    else:
        monkeypatch.setenv(variable, value)
    with caplog.at_level("WARNING", logger=caches.__name__):
        assert read() is (default if wanted is None else wanted)
    messages = [r.getMessage() for r in caplog.records if variable in r.getMessage()]
    assert len(messages) == (1 if warned else 0), messages
    if warned:
        state = "on" if default else "off"
        assert "'maybe'" in messages[0] and f"stays {state}" in messages[0] and "Set it to 1 or 0" in messages[0]


def test_a_compile_worker_start_that_fails_never_stops_the_preload(monkeypatch):
    """The early start is a head start only: torch failing to start its pool (here its ``maybe_warm_pool``
    raising) is logged at debug level and reported as not started, never raised into the server."""
    from torch._inductor import async_compile

    from cosmos3_core.kernels import caches

    def fails():
        raise RuntimeError("no pool here")

    monkeypatch.setattr(async_compile, "maybe_warm_pool", fails)
    assert caches.start_compile_workers() is False


@pytest.mark.comfy
def test_a_wrapped_node_starts_after_the_preload_and_a_hung_one_is_waited_out_once(tmp_path, monkeypatch, caplog):
    """nodes/warmup.py's ``waits_for_preload`` around a node's ``execute`` (the pack as ComfyUI imports it): it runs
    once the preload's imports are done; an import that outlasts the wait lets the node run with one warning, and
    the next node does not wait."""
    from support import comfy_host

    comfy_host.get_executor().assert_pack_loaded()
    pack = next(n for n in sys.modules if n.endswith(".nodes.warmup")).removesuffix("nodes.warmup")
    caches, waits_for_preload = sys.modules[pack + "cosmos3_core.kernels.caches"], sys.modules[
        pack + "nodes.warmup"].waits_for_preload
    assert sys.modules[pack + "nodes"].Cosmos3Loader.execute.__func__.__wrapped__  # the shipped nodes are wrapped

    (tmp_path / "cosmos3_slow_probe.py").write_text("import time\ntime.sleep(1.0)\n")
    (tmp_path / "cosmos3_hung_probe.py").write_text("import time\ntime.sleep(4.0)\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    class Node:
        ran: list = []

        @classmethod
        def execute(cls, value):
            cls.ran.append((value, [t.is_alive() for t in caches._FIRST_RUN]))
            return value

    waits_for_preload(Node)
    for module, timeout in (("cosmos3_slow_probe", caches.PRELOAD_WAIT_S), ("cosmos3_hung_probe", 0.5)):
        thread = caches.CompilerPreload((module,))
        monkeypatch.setattr(caches, "_FIRST_RUN", [thread])
        monkeypatch.setattr(caches, "PRELOAD_WAIT_S", timeout)
        thread.start()
        Node.ran.clear()
        assert Node.execute(1) == 1 and Node.execute(2) == 2
        if module == "cosmos3_slow_probe":
            assert Node.ran == [(1, [False]), (2, [False])] and thread.failed == {}
        else:  # waited out: the first call ran beside the import after 0.5 s, the second at once, one warning
            assert Node.ran == [(1, [True]), (2, [True])] and thread.waited_out
            assert sum("still running" in r.getMessage() for r in caplog.records) == 1
            thread.join()


NODES_FIRST_RUN_PROCESS = r"""
import json, shutil, sys
from pathlib import Path
from support import comfy_host
from test_workflows import load_api, shrink_api

LAZY = ("diffusers", "transformers", "peft", "accelerate", "tokenizers", "huggingface_hub")
host = comfy_host.get_executor()
host.assert_pack_loaded()
shutil.copytree(sys.argv[1], host.base_dir / "models" / "diffusers" / "Cosmos3-Nano")
pack = next(n for n in sys.modules if n.endswith(".nodes.warmup")).removesuffix("nodes.warmup")
caches = sys.modules[pack + "cosmos3_core.kernels.caches"]
thread = caches.preload_first_run(compiles=False)  # what the server's start does (nodes/warmup.py)
caches.wait_for_preload()
preloaded = set(sys.modules)
outputs = host.run_ok(shrink_api(load_api("t2av"), checkpoint="Cosmos3-Nano"))  # raises unless it succeeds
print(json.dumps(dict(failed=thread.failed, outputs=len(outputs),
                      imported_by_the_run=sorted(m for m in set(sys.modules) - preloaded if m.split(".")[0] in LAZY))))
"""


@pytest.mark.comfy
def test_the_first_run_preload_leaves_a_t2av_workflow_nothing_to_import(tmp_path, tiny_checkpoint):
    """The same through the nodes: ComfyUI's executor in a fresh process runs the shipped T2AV workflow (shrunk) on
    a tiny Nano after the preload; the workflow imports nothing of diffusers, transformers and their dependencies
    but a few scheduler modules."""
    from support import comfy_host

    nano = tiny_checkpoint("nano", seed=2)
    env = {**os.environ, "COSMOS3_CACHE_DIR": str(tmp_path / "cache"), "COMFYUI_DIR": str(comfy_host.comfyui_dir()),
           "PYTHONPATH": str(REPO / "tests")}
    proc = subprocess.run([sys.executable, "-c", NODES_FIRST_RUN_PROCESS, str(nano)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["failed"] == {} and out["outputs"] > 0, out
    left = [m for m in out["imported_by_the_run"] if not m.startswith("diffusers.schedulers.scheduling_")]
    assert left == [], left

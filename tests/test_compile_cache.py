"""A second process reuses the first one's ``torch.compile`` of the generation layer from disk.

Two fresh processes, one after the other, with ``COSMOS3_CACHE_DIR`` on the same empty folder, each run the
sampler's path (``Cosmos3Pipeline.run`` of a plan with ``RuntimeOptions(compile=True)``, CPU inductor) on a tiny checkpoint: eager, then compiled,
then compiled with a prompt of another length. The first must compile exactly one graph (one for both prompt
lengths) and save it to ``<COSMOS3_CACHE_DIR>/aot`` (``cosmos3_core.kernels.precompiled``); the second must load it from
there without Dynamo tracing anything. Compiled latents must equal eager ones at fp32 rounding level. No timing is
asserted.
Needs a C++ compiler (CPU inductor); about a minute on 2 cores.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cosmos3_core import api

needs_cpu_inductor = pytest.mark.skipif(shutil.which(os.environ.get("CXX", "g++")) is None,
                                        reason="CPU inductor needs a C++ compiler")
REPO = Path(__file__).resolve().parents[1]
SHAPE = dict(num_frames=9, height=64, width=96, fps=24.0)


def worker(checkpoint: str) -> dict:
    """One fresh process's run; returns what the test checks."""
    import torch
    from torch._dynamo.utils import compilation_time_metrics

    from cosmos3_core.model.transformer import generation_layer_fn
    from cosmos3_core.pipeline import Cosmos3Pipeline
    from cosmos3_core.runtime import RuntimeOptions

    pipe = Cosmos3Pipeline.load(checkpoint, dtype=torch.float32, device="cpu", with_sound=False)
    out = {}
    for name, prompt in (("short", "a red robot walking"), ("long", "a red robot walking on a wet street at night")):
        text = pipe.encode_text(prompt, "blurry", **SHAPE)
        eager = pipe.run(api.plan(pipe, text, seed=1, steps=2, sound=False)).latents
        compiled = pipe.run(api.plan(pipe, text, seed=1, steps=2, sound=False, options=RuntimeOptions(compile=True))).latents
        out[name] = dict(rel=float((compiled - eager).norm() / eager.norm()), tokens=text.cond.length)
    layer = generation_layer_fn(RuntimeOptions(compile=True))  # the process's one compiled layer
    out.update(compiled=layer.compiled, loaded=layer.loaded, cache_dir=os.environ.get("TORCHINDUCTOR_CACHE_DIR"),
               traced=sorted(k for k in compilation_time_metrics if "tracing" in k or "capture" in k))
    return out


def run_worker(checkpoint: Path, cache: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHINDUCTOR_", "TRITON_", "TORCH_COMPILE"))}
    env.update(COSMOS3_CACHE_DIR=str(cache), PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, __file__, str(checkpoint)], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.compile
@needs_cpu_inductor
def test_second_process_loads_the_compiled_layer_from_disk(tiny_checkpoint, tmp_path):
    checkpoint = tiny_checkpoint("nano", sound=False, seed=7)
    cache = tmp_path / "cache"
    first, second = run_worker(checkpoint, cache), run_worker(checkpoint, cache)
    for run in (first, second):
        assert run["cache_dir"] == str(cache / "inductor"), run
        assert run["short"]["tokens"] != run["long"]["tokens"], run
        for name in ("short", "long"):
            assert run[name]["rel"] <= 1e-4, run  # fp32: fused kernels round differently, nothing more
    # one graph for both prompt lengths and every layer, traced and saved by the first process …
    assert first["compiled"] == 1 and first["loaded"] == 0 and "bytecode_tracing" in first["traced"], first
    assert len(list((cache / "aot").glob("*generation_layer-*.bin"))) == 1
    # … and loaded by the second, which traces nothing
    assert second["compiled"] == 0 and second["loaded"] == 1 and second["traced"] == [], second


def test_cache_dir_replaces_torch_default_but_keeps_the_users(monkeypatch, tmp_path):
    """Importing torch._dynamo writes torch's /tmp default into TORCHINDUCTOR_CACHE_DIR: that value counts as unset."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    from cosmos3_core.kernels.caches import enable_persistent_caches

    monkeypatch.setenv("COSMOS3_CACHE_DIR", str(tmp_path / "root"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", default_cache_dir())
    monkeypatch.setenv("TRITON_CACHE_DIR", os.path.join(default_cache_dir(), "triton", "0"))
    assert enable_persistent_caches() == tmp_path / "root"
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "root" / "inductor")
    assert "TRITON_CACHE_DIR" not in os.environ  # torch re-derives it under ours
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "my-triton"))
    enable_persistent_caches()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "mine")
    assert os.environ["TRITON_CACHE_DIR"] == str(tmp_path / "my-triton")


def test_every_compiled_run_sets_the_compile_settings_in_its_own_context():
    """torch (≥ 2.14) keeps compile settings per context and ComfyUI runs each prompt in a fresh asyncio task (a copy
    of its worker thread's context): every compiled run, not only the one that built the compiled layer, must raise
    Dynamo's recompile limit in its own context — at the default of 8 the generation layer would fall back to eager
    after eight shapes."""
    import contextvars

    import torch._dynamo.config

    from cosmos3_core.kernels.caches import RECOMPILE_LIMIT
    from cosmos3_core.pipeline import Cosmos3Pipeline
    from cosmos3_core.runtime import RuntimeOptions
    from cosmos3_core.sampling.plan import SamplePlan, Stream

    plan = SamplePlan(streams=(Stream("vision", torch.zeros(1), None),), guidance=(), sigmas=torch.zeros(1), timesteps=torch.zeros(0, dtype=torch.long),
                      device=torch.device("cpu"), memory_required=0, num_tokens=0,
                      options=RuntimeOptions(compile=True))
    pipe = Cosmos3Pipeline.__new__(Cosmos3Pipeline)  # only ``run``: a compiled plan of no steps
    pipe.transformer = None

    def compiled_run_settings() -> int:
        pipe.run(plan)  # what every compiled run does first
        return torch._dynamo.config.recompile_limit

    for _ in range(2):  # the first run builds the compiled layer, the second reuses it
        assert contextvars.Context().run(compiled_run_settings) == RECOMPILE_LIMIT


if __name__ == "__main__":
    print(json.dumps(worker(sys.argv[1])))

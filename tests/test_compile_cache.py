"""A second process reuses the first one's ``torch.compile`` of the generation layer from the on-disk caches.

Two fresh processes, one after the other, with ``COSMOS3_CACHE_DIR`` on the same empty folder, each run the
sampler's path (``Cosmos3Pipeline.sample(compile=True)``, CPU inductor) on a tiny checkpoint: eager, then compiled,
then compiled with a prompt of another length. The first must compile exactly one graph (one for both prompt
lengths) into ``<COSMOS3_CACHE_DIR>/inductor``; the second must get it from there (FX-graph and AOT-autograd cache
hits, no miss). Compiled latents must equal eager ones at fp32 rounding level. No timing is asserted.
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

pytestmark = [
    pytest.mark.compile,
    pytest.mark.skipif(shutil.which(os.environ.get("CXX", "g++")) is None, reason="CPU inductor needs a C++ compiler"),
]
REPO = Path(__file__).resolve().parents[1]
SHAPE = dict(num_frames=9, height=64, width=96, fps=24.0)


def worker(checkpoint: str) -> dict:
    """One fresh process's run; returns what the test checks."""
    import torch
    from torch._dynamo.utils import counters

    from cosmos3_core.pipeline import Cosmos3Pipeline

    pipe = Cosmos3Pipeline.load(checkpoint, dtype=torch.float32, device="cpu", with_sound=False)
    out = {}
    for name, prompt in (("short", "a red robot walking"), ("long", "a red robot walking on a wet street at night")):
        text = pipe.encode_text(prompt, "blurry", **SHAPE)
        eager = pipe.sample(text, seed=1, steps=2, sound=False).latents
        compiled = pipe.sample(text, seed=1, steps=2, sound=False, compile=True).latents
        out[name] = dict(rel=float((compiled - eager).norm() / eager.norm()), tokens=text.cond.length)
    out.update(inductor=dict(counters["inductor"]), aot=dict(counters["aot_autograd"]),
               graphs=counters["stats"]["unique_graphs"], cache_dir=os.environ.get("TORCHINDUCTOR_CACHE_DIR"))
    return out


def run_worker(checkpoint: Path, cache: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHINDUCTOR_", "TRITON_", "TORCH_COMPILE"))}
    env.update(COSMOS3_CACHE_DIR=str(cache), PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, __file__, str(checkpoint)], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_second_process_loads_the_compiled_layer_from_disk(tmp_path):
    from cosmos3_core.tiny import build_tiny_checkpoint

    checkpoint = build_tiny_checkpoint(tmp_path / "nano", variant="nano", sound=False, seed=7)
    cache = tmp_path / "cache"
    first, second = run_worker(checkpoint, cache), run_worker(checkpoint, cache)
    for run in (first, second):
        assert run["cache_dir"] == str(cache / "inductor"), run
        assert run["short"]["tokens"] != run["long"]["tokens"], run
        assert run["graphs"] == 1, run  # one graph for both prompt lengths and every layer
        for name in ("short", "long"):
            assert run[name]["rel"] <= 1e-4, run  # fp32: fused kernels round differently, nothing more
    assert first["inductor"].get("fxgraph_cache_miss") == 1 and not first["inductor"].get("fxgraph_cache_hit"), first
    assert (cache / "inductor" / "fxgraph").is_dir()
    assert second["inductor"].get("fxgraph_cache_hit", 0) >= 1, second
    assert not second["inductor"].get("fxgraph_cache_miss"), second
    assert second["aot"].get("autograd_cache_hit", 0) >= 1 and not second["aot"].get("autograd_cache_miss"), second


if __name__ == "__main__":
    print(json.dumps(worker(sys.argv[1])))

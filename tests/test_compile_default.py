"""``compile`` defaults to ``auto``: on where it pays (CUDA with Triton and a C compiler), off elsewhere; ``on``
where torch.compile cannot run is one clear error before anything loads; and the package imports without the
compiler, diffusers or transformers (they load where a run first needs them).

The import checks run a fresh interpreter and read its ``sys.modules``; the refusal runs the real CLI with a PATH
that holds no compiler.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cosmos3_core.checks import check_options
from cosmos3_core.runtime import DEFAULT, RuntimeOptions, compile_pays

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("diffusers", "transformers", "torch._dynamo", "torch._inductor", "scipy", "triton")


def _fresh(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO), **env})


def test_the_cli_and_the_library_import_without_compiler_diffusers_or_transformers():
    r = _fresh("import sys\nimport cosmos3_core.cli.main, cosmos3_core.pipeline, cosmos3_core.api, "
               "cosmos3_core.reasoner.reasoner, cosmos3_core.parallel.run, cosmos3_core.kernels.compile\n"
               f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))")
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "[]", r.stdout


def test_the_kernel_checks_are_constants_to_dynamo_as_torch_marks_them():
    """Our ``constant_result`` sets the attribute ``torch.compiler.assume_constant_result`` sets (so Dynamo treats
    the route checks as constants), without importing Dynamo at the decoration."""
    from cosmos3_core.kernels import attention, gemv

    marked = torch.compiler.assume_constant_result(lambda: 0)
    names = [n for n in vars(marked) if n.startswith("_dynamo")]
    assert names == ["_dynamo_marked_constant"], names
    assert attention._flash4_ready._dynamo_marked_constant is True
    assert gemv._triton_ready._dynamo_marked_constant is True


def test_auto_is_the_default_and_follows_the_device():
    assert DEFAULT.compile == "auto" and RuntimeOptions(compile=True).compile == "on"
    assert RuntimeOptions(compile=False).compile == "off"
    assert RuntimeOptions().on("cpu").compiles is False and RuntimeOptions().on("cpu").vae_compile is False
    on_cuda = RuntimeOptions().on("cuda")
    assert on_cuda.compiles is compile_pays()
    assert on_cuda.vae_compile == ("cached" if compile_pays() else False)  # the VAE: graphs already on disk only
    assert RuntimeOptions(compile="on").on("cpu").vae_compile is True
    with pytest.raises(ValueError, match=r"compile='yes' is not one of \['auto', 'on', 'off'\]"):
        RuntimeOptions(compile="yes")


def test_forced_compile_without_a_compiler_is_one_error_before_loading(tmp_path, tiny_checkpoint):
    """``--compile`` (on) with no C++ compiler on PATH, on the CPU: one ``error:`` line naming the input and the
    fix, exit 2, before the model loads."""
    empty = tmp_path / "bin"
    empty.mkdir()
    r = subprocess.run([sys.executable, "-m", "cosmos3_core.generate", "--checkpoint", str(tiny_checkpoint("edge")),
                        "--prompt", "a cat", "--device", "cpu", "--compile", "--out", str(tmp_path / "x.mp4")],
                       capture_output=True, text=True, timeout=300, cwd=REPO,
                       env={**os.environ, "PYTHONPATH": str(REPO), "PATH": str(empty), "CXX": ""})
    assert r.returncode == 2, (r.stdout, r.stderr[-2000:])
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert lines == ["error: compile='on': torch.compile cannot run here (no C++ compiler (Inductor's CPU kernels) "
                     "on PATH); use compile 'auto' or 'off' (CLI: --compile auto), or install it."], lines


def test_forced_compile_with_a_tracing_backend_needs_no_compiler(monkeypatch):
    monkeypatch.setenv("PATH", "")
    check_options(RuntimeOptions(compile="on", compile_backend="aot_eager", device_type="cpu"))


def test_a_compile_that_fails_mid_run_is_one_error_and_the_next_run_works(tiny_checkpoint):
    """A compiler that fails inside the run (a backend that raises, as a broken toolchain does): one ``CompileError``
    naming the function and the fix; the next run, eager, works and equals an eager run made before the failure."""
    from torch._dynamo import register_backend

    from cosmos3_core.api import generate
    from cosmos3_core.kernels.precompiled import CompileError
    from cosmos3_core.pipeline import Cosmos3Pipeline
    from cosmos3_core.request import Request

    @register_backend(name="cosmos3_test_broken")
    def broken(gm, example_inputs):
        raise RuntimeError("the C compiler crashed")

    pipe = Cosmos3Pipeline.load(tiny_checkpoint("edge"), dtype=torch.float32, device="cpu")
    request = dict(prompt="a red robot", height=32, width=48, num_frames=1, steps=2, seed=5)
    before = generate(pipe, Request(**request, options=RuntimeOptions(compile="off")), decode=False).latents
    with pytest.raises(CompileError, match=r"compile: torch.compile failed for generation_layer \(.*the C compiler "
                                           r"crashed.*\); set compile to 'off' \(CLI: --compile off\)"):
        generate(pipe, Request(**request, options=RuntimeOptions(compile="on", compile_backend="cosmos3_test_broken")),
                 decode=False)
    after = generate(pipe, Request(**request, options=RuntimeOptions(compile="off")), decode=False).latents
    assert torch.equal(after, before)

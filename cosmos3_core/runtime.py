"""How a run executes, as one value: the kernel routes and compilation, never the numbers a run computes.

``RuntimeOptions`` is built once per run (from node inputs or CLI flags), checked by ``resolve.resolve``
before any model work, and handed down explicitly: ``SamplePlan.options`` carries it into the denoising loop and the
model's step, the reasoner's ``generate`` takes it, the VAE decode reads ``compile`` from it. Nothing in the package
keeps a run switch in a module global or on a model object, so two runs (two ComfyUI prompts, two threads) never see
each other's settings.

* ``attention``: ``auto`` (FlashAttention-4 where it can run and pays, else PyTorch SDPA), ``sdpa`` (always SDPA,
  the reference's route) or ``flash4`` (FlashAttention-4; an error where it cannot run) — kernels/attention.py.
* ``compile``: ``auto`` (the default), ``on`` or ``off`` (``True``/``False`` mean on/off). On: ``torch.compile`` the
  generation layer, the VAE decoder's steady-state frame and the reasoner's decode layer; compiled graphs are kept on
  disk (kernels/caches.py, kernels/precompiled.py). ``auto`` compiles where it pays — on CUDA with Triton and a C
  compiler (``compile_pays``) — and there compiles the generation layer and the reasoner's decode layer, while the
  VAE decoder runs compiled only from graphs already on disk (its compile costs a first run far more than it saves:
  0.1–1.7 s a decode), else eagerly; elsewhere ``auto`` is off. ``on`` where torch.compile cannot run is refused by
  ``checks.check_options`` before anything loads. ``compiles`` / ``vae_compile`` are what a run does.
* ``gemv``: the reasoner's batch-1 projections: ``auto`` (the Triton GEMV on CUDA sm80+), ``triton`` (required) or
  ``torch`` (``F.linear``) — kernels/gemv.py.
* ``cuda_graphs``: replay the reasoner's decode step as one captured CUDA graph on CUDA (kernels/cuda_graph.py).
* ``compile_backend``: the ``torch.compile`` backend of every compiled function (``inductor``; the tests trace with
  ``aot_eager``, which needs no C++ compiler).
* ``fp8_gemm``: the W8A8 GEMM of an FP8 checkpoint's steps (model/fp8.py): ``auto`` (``torch._scaled_mm`` where
  the GPU has FP8 tensor cores; elsewhere the steps run W8A16, saying so) or ``emulate`` (the exact fp32
  emulation on the CPU: a numerical reference for tests, slow).

Routes change kernels, not the math: every route computes the same attention / projection up to rounding.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import os
import shutil

ATTENTION_ROUTES = ("auto", "sdpa", "flash4")
GEMV_ROUTES = ("auto", "triton", "torch")
COMPILE_MODES = ("auto", "on", "off")
FP8_GEMM_ROUTES = ("auto", "emulate")


@functools.lru_cache(maxsize=None)
def compile_unavailable_reason(cuda: bool) -> str:
    """Empty if Inductor can compile for CUDA (``cuda``) or the CPU here, else why not (nothing is imported)."""
    if cuda and importlib.util.find_spec("triton") is None:
        return "Triton is not installed (Inductor generates its CUDA kernels with it)"
    if cuda:
        compilers, what = [os.environ.get("CC"), "cc", "gcc", "clang"], "C compiler (Triton builds its launcher)"
    else:
        compilers, what = [os.environ.get("CXX"), "c++", "g++", "clang++"], "C++ compiler (Inductor's CPU kernels)"
    if not any(c and shutil.which(c) for c in compilers):
        return f"no {what} on PATH"
    return ""


def compile_pays() -> bool:
    """Whether ``compile='auto'`` compiles: a CUDA device where Inductor can compile."""
    import torch

    return torch.cuda.is_available() and not compile_unavailable_reason(True)


@dataclasses.dataclass(frozen=True)
class RuntimeOptions:
    attention: str = "auto"
    compile: str = "auto"
    gemv: str = "auto"
    cuda_graphs: bool = True
    compile_backend: str = "inductor"
    device_type: str | None = None  # the run's device ("cuda", "cpu"); None: CUDA if this machine has it
    fp8_gemm: str = "auto"

    def __post_init__(self):
        if self.attention not in ATTENTION_ROUTES:
            raise ValueError(f"attention={self.attention!r} is not one of {list(ATTENTION_ROUTES)}; 'sdpa' forces "
                             "PyTorch SDPA (the reference's route).")
        if self.gemv not in GEMV_ROUTES:
            raise ValueError(f"gemv={self.gemv!r} is not one of {list(GEMV_ROUTES)}; 'torch' forces F.linear.")
        if isinstance(self.compile, bool):
            object.__setattr__(self, "compile", "on" if self.compile else "off")
        if self.compile not in COMPILE_MODES:
            raise ValueError(f"compile={self.compile!r} is not one of {list(COMPILE_MODES)}; 'auto' compiles where it "
                             "pays (CUDA with Triton).")
        if not isinstance(self.cuda_graphs, bool):
            raise ValueError(f"cuda_graphs={self.cuda_graphs!r} must be true or false.")
        if not isinstance(self.compile_backend, str) or not self.compile_backend:
            raise ValueError(f"compile_backend={self.compile_backend!r} must name a torch.compile backend.")
        if self.fp8_gemm not in FP8_GEMM_ROUTES:
            raise ValueError(f"fp8_gemm={self.fp8_gemm!r} is not one of {list(FP8_GEMM_ROUTES)}; 'emulate' is the "
                             "CPU's exact emulation of the FP8 GEMM (tests).")


    @property
    def compiles(self) -> bool:
        """Whether the run compiles the generation layer and the reasoner's decode layer."""
        if self.compile != "auto":
            return self.compile == "on"
        return (self.device_type in (None, "cuda")) and compile_pays()

    @property
    def vae_compile(self) -> bool | str:
        """The VAE decode's ``compile``: True (compile), ``"cached"`` (graphs already on disk, else eager), False."""
        if self.compile == "on":
            return True
        return "cached" if self.compiles else False


    def on(self, device) -> "RuntimeOptions":
        """These options for a run on ``device`` (a ``torch.device`` or its type), which ``auto`` depends on."""
        kind = device if isinstance(device, str) else device.type
        return self if self.device_type == kind else dataclasses.replace(self, device_type=kind)


DEFAULT = RuntimeOptions()

"""How a run executes, as one value: the kernel routes and compilation, never the numbers a run computes.

``RuntimeOptions`` is built once per run (from node inputs or CLI flags), checked by ``sampling/request.resolve``
before any model work, and handed down explicitly: ``SamplePlan.options`` carries it into the denoising loop and the
model's step, the reasoner's ``generate`` takes it, the VAE decode reads ``compile`` from it. Nothing in the package
keeps a run switch in a module global or on a model object, so two runs (two ComfyUI prompts, two threads) never see
each other's settings.

* ``attention``: ``auto`` (FlashAttention-4 where it can run and pays, else PyTorch SDPA), ``sdpa`` (always SDPA,
  the reference's route) or ``flash4`` (FlashAttention-4; an error where it cannot run) — kernels/attention.py.
* ``compile``: ``torch.compile`` the generation layer and the VAE decoder's steady-state frame (and the reasoner's
  decode layer); compiled graphs are kept on disk (kernels/caches.py, kernels/precompiled.py).
* ``gemv``: the reasoner's batch-1 projections: ``auto`` (the Triton GEMV on CUDA sm80+), ``triton`` (required) or
  ``torch`` (``F.linear``) — kernels/gemv.py.
* ``cuda_graphs``: replay the reasoner's decode step as one captured CUDA graph on CUDA (kernels/cuda_graph.py).
* ``compile_backend``: the ``torch.compile`` backend of every compiled function (``inductor``; the tests trace with
  ``aot_eager``, which needs no C++ compiler).

Routes change kernels, not the math: every route computes the same attention / projection up to rounding.
"""

from __future__ import annotations

from dataclasses import dataclass

ATTENTION_ROUTES = ("auto", "sdpa", "flash4")
GEMV_ROUTES = ("auto", "triton", "torch")


@dataclass(frozen=True)
class RuntimeOptions:
    attention: str = "auto"
    compile: bool = False
    gemv: str = "auto"
    cuda_graphs: bool = True
    compile_backend: str = "inductor"

    def __post_init__(self):
        if self.attention not in ATTENTION_ROUTES:
            raise ValueError(f"attention={self.attention!r} is not one of {list(ATTENTION_ROUTES)}; 'sdpa' forces "
                             "PyTorch SDPA (the reference's route).")
        if self.gemv not in GEMV_ROUTES:
            raise ValueError(f"gemv={self.gemv!r} is not one of {list(GEMV_ROUTES)}; 'torch' forces F.linear.")
        for name in ("compile", "cuda_graphs"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}={getattr(self, name)!r} must be true or false.")
        if not isinstance(self.compile_backend, str) or not self.compile_backend:
            raise ValueError(f"compile_backend={self.compile_backend!r} must name a torch.compile backend.")


DEFAULT = RuntimeOptions()

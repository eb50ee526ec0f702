"""cosmos3_core: NVIDIA Cosmos3 inference in pure PyTorch (no ComfyUI imports).

The public face, imported lazily (``import cosmos3_core`` itself loads nothing heavy)::

    from cosmos3_core import Cosmos3Pipeline, Request, RuntimeOptions, generate
    pipe = Cosmos3Pipeline.load("models/cosmos3/Cosmos3-Nano", device="cuda")
    out = generate(pipe, Request(prompt="...", num_frames=93, height=480, width=832))

Layers, bottom to top (each imports only the ones below it; ``tests/test_import_graph.py`` holds the code to it):

1. ``runtime.py``, ``defaults.py``, ``config.py``, ``media.py`` — per-run options, every default and constant, the
   checkpoint config, media files;
2. ``kernels/`` — attention, GEMV, compile caches;
3. ``model/`` — the Mixture-of-Transformers and its weights;
4. ``vae/`` (Wan2.2 video VAE, sound decoder) and ``sampling/`` (prompts, conditioning, the plan, the loop,
   schedulers, SeaCache);
5. ``request.py`` — the vocabulary of a run (``Request``, ``Resolved``, ``CheckpointInfo``), and ``reasoner/``;
6. ``pipeline.py`` — the stages on a loaded checkpoint;
7. ``modes/`` (clip, windows, Transfer, action) and ``parallel/``;
8. ``checks.py`` and ``resolve.py`` — the resolver: every default and user-facing check of a run, once;
9. ``api.py`` — the front door (``generate``), then ``cli/`` and the ``python -m`` shims.

``testing/`` holds the tiny random checkpoints the tests build. The ComfyUI nodes in ``nodes/`` are thin glue over
this package, above all of it.
"""

from __future__ import annotations

import importlib

_PUBLIC = {
    "Cosmos3Pipeline": "pipeline",
    "GenerationOutput": "pipeline",
    "Request": "request",
    "Resolved": "request",
    "CheckpointInfo": "request",
    "ActionRequest": "request",
    "SamplingRequest": "request",
    "resolve": "resolve",
    "RuntimeOptions": "runtime",
    "Cosmos3Config": "config",
    "CheckpointError": "config",
    "generate": "api",
    "plan": "api",
    "MODES": "request",
    "Cosmos3Reasoner": "reasoner.reasoner",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    if name in _PUBLIC:
        value = getattr(importlib.import_module(f"{__name__}.{_PUBLIC[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

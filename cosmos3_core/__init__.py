"""cosmos3_core: NVIDIA Cosmos3 inference in pure PyTorch (no ComfyUI imports).

The public face, imported lazily (``import cosmos3_core`` itself loads nothing heavy)::

    from cosmos3_core import Cosmos3Pipeline, Request, RuntimeOptions, generate
    pipe = Cosmos3Pipeline.load("models/cosmos3/Cosmos3-Nano", device="cuda")
    out = generate(pipe, Request(prompt="...", num_frames=93, height=480, width=832))

Layers, bottom to top: ``kernels/`` (attention, GEMV, compile caches) → ``model/`` (the Mixture-of-Transformers,
weights) → ``vae/`` (Wan2.2 video VAE, sound decoder) and ``sampling/`` (prompts, conditioning, the plan, the loop,
schedulers) → ``request.py`` (one Request, resolved once) → ``pipeline.py`` (the stages on a loaded checkpoint) →
``modes/`` (clip, windows, Transfer, action) and ``reasoner/`` → ``parallel/`` and ``cli/``. ``testing/`` holds the
tiny random checkpoints the tests build. The ComfyUI nodes in ``nodes/`` are thin glue over this package.
"""

from __future__ import annotations

import importlib

_PUBLIC = {
    "Cosmos3Pipeline": "pipeline",
    "GenerationOutput": "pipeline",
    "Request": "request",
    "Resolved": "request",
    "CheckpointInfo": "request",
    "resolve": "request",
    "RuntimeOptions": "runtime",
    "Cosmos3Config": "config",
    "CheckpointError": "config",
    "generate": "modes.dispatch",
    "MODES": "modes.dispatch",
    "Cosmos3Reasoner": "reasoner.reasoner",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    if name in _PUBLIC:
        value = getattr(importlib.import_module(f"{__name__}.{_PUBLIC[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

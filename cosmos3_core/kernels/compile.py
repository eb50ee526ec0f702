"""Compiled versions of the package's hot functions, made once per process and shared by every run that asks.

A run that has ``RuntimeOptions.compile`` set calls ``compiled(fn, ...)`` for the function it runs (the generation
layer, the VAE decoder's stages, the reasoner's decode layer) instead of ``fn``. The compiled function is made on
the first request and kept for the process, so switching compile off and on again never re-traces; the model
objects hold no compile state. ``aot=True`` (the default) keeps every graph on disk whole
(``precompiled.PrecompiledFunction``: a restarted process loads it instead of tracing); ``aot=False`` is plain
``torch.compile`` (the reasoner's decode layer, which a CUDA graph captures around it).

``prepare_compile`` (caches.py) runs at every call of ``prepared()``: torch keeps Dynamo/Inductor settings per
``contextvars`` context, and a host such as ComfyUI runs each prompt in a fresh one, so the on-disk caches and the
recompile limit are set again in each run's own context (only what is not already in place is written).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from .caches import prepare_compile
from .precompiled import PrecompiledFunction

_COMPILED: dict[tuple, Callable] = {}


def compiled(fn: Callable, *, aot: bool = True, **kwargs: Any) -> Callable:
    """``fn`` compiled (see the module docstring); ``kwargs`` go to ``PrecompiledFunction`` (``aot``) or
    ``torch.compile`` (plain). One compiled function per (``fn``, ``aot``, ``kwargs``) for the process."""
    key = (fn, aot, tuple(sorted(kwargs.items(), key=lambda kv: kv[0])))
    if key not in _COMPILED:
        prepare_compile()
        _COMPILED[key] = PrecompiledFunction(fn, **kwargs) if aot else torch.compile(fn, **kwargs)
    return _COMPILED[key]


def prepared() -> None:
    """Put the compile settings in place in the calling run's context (call once per compiled run)."""
    prepare_compile()

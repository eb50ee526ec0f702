"""Whether an optional CUDA kernel (FlashAttention-4 in attention.py, the Triton GEMV in gemv.py) can run on a
device: one answer per device index, worked out on first use and kept, so a route check costs a dict lookup.

``constant_result`` marks such a check as a constant to ``torch.compile`` exactly as
``torch.compiler.assume_constant_result`` does (the ``_dynamo_marked_constant`` attribute Dynamo reads), without
importing Dynamo: ``torch.compiler.assume_constant_result`` imports ``torch._dynamo`` (about 600 modules, seconds of
host time) at the decoration, i.e. at the pack's import."""

from __future__ import annotations

from typing import Callable

import torch


def constant_result(fn: Callable) -> Callable:
    """``fn``'s result is a constant to ``torch.compile``: the call is made at trace time, never graph-breaks."""
    fn._dynamo_marked_constant = True
    return fn


def import_failure(what: str, exc: BaseException) -> str:
    """The reason text for a kernel package that does not import."""
    first = str(exc).splitlines()[0][:160] if str(exc) else ""
    return f"{what} does not import ({type(exc).__name__}: {first})"


def unavailable_reason(cache: dict[int, str], device: torch.device | None,
                       check: Callable[[int, int], str]) -> str:
    """Empty if the kernel can run on the CUDA ``device`` (default: the current one), else why not.
    ``check(major, minor)`` answers for a device of that compute capability; ``cache`` keeps its answer per index."""
    if not torch.cuda.is_available():
        return "no CUDA device"
    index = device.index if device is not None and device.index is not None else torch.cuda.current_device()
    if index not in cache:
        cache[index] = check(*torch.cuda.get_device_capability(index))
    return cache[index]

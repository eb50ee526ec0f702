"""The nodes' user-error boundary: a core ``ValueError`` gets the node's name in front, once; a GPU out-of-memory
error becomes one line that names the node and the fix.

The core raises plain messages that name the argument, its value and the fix (``num_frames=10 must be …``); the
node that called it prefixes its own id, so ComfyUI's error panel says which node and which input to change.

Out of memory: ``with_out_of_memory_message`` wraps a node's ``execute``; torch's multi-line allocator report becomes
``Cosmos3OutOfMemoryError``, a subclass of ``torch.OutOfMemoryError`` so that ComfyUI 0.3.75's executor still
treats it as one (``execution.execute``: it unloads every model, its recovery, and adds its own tip after our line).
It is raised outside the ``except`` block, so it carries no reference to the failed call's frames (and their
tensors) as ``__context__``.
"""

from __future__ import annotations

import functools
import re
from contextlib import contextmanager

import torch

from ..cosmos3_core.checks import SMALLER_WEIGHTS

_ALLOCATION = re.compile(r"Tried to allocate ([0-9.]+ [KMGT]?i?B)")
_DEVICE = re.compile(r"\b(?:GPU|device) (\d+)\b")  # torch's allocators name the GPU that ran out
OUT_OF_MEMORY_FIX = f"lower width, height, num_frames or batch_size; {SMALLER_WEIGHTS}; or start ComfyUI with --lowvram"


class Cosmos3OutOfMemoryError(torch.OutOfMemoryError):
    """A GPU out-of-memory error whose message is one line naming the node and the fix."""


def out_of_memory_message(node_id: str, exc: BaseException, card: tuple[int, str] | None = None) -> str:
    """The one line for ``exc``; ``card`` (the bytes and name of the GPU that ran out, ``card_of``) names it, so a
    user sees its size beside the fix."""
    asked = _ALLOCATION.search(str(exc))
    what = f" (it asked for {asked.group(1)} more)" if asked else ""
    where = f" on {card[1]}, which has {card[0] / 2**30:.1f} GiB" if card else ""
    return f"{node_id}: out of GPU memory{where}{what}. To fit, {OUT_OF_MEMORY_FIX}."


def card_of(exc: BaseException) -> tuple[int, str] | None:
    """``model_handle.card_memory`` of the GPU ``exc`` ran out on — the one torch's message names ("GPU 1 has a total
    capacity …", "Allocation on device 1 …"), else ComfyUI's own; None when ComfyUI runs on the CPU."""
    import comfy.model_management as mm

    from .model_handle import card_memory

    device = mm.get_torch_device()
    named = _DEVICE.search(str(exc))
    if named and isinstance(device, torch.device) and device.type == "cuda":
        device = torch.device("cuda", int(named.group(1)))
    return card_memory(device) if isinstance(device, torch.device) else None


def with_out_of_memory_message(node_cls: type) -> type:
    """Wrap ``node_cls.execute`` (a classmethod) so that a GPU out-of-memory error is one line (module docstring)."""
    func = node_cls.execute.__func__
    node_id = node_cls.__name__

    @functools.wraps(func)
    def execute(cls, *args, **kwargs):
        try:
            return func(cls, *args, **kwargs)
        except Cosmos3OutOfMemoryError:
            raise
        except torch.OutOfMemoryError as exc:
            message = out_of_memory_message(node_id, exc, card_of(exc))
        raise Cosmos3OutOfMemoryError(message)

    node_cls.execute = classmethod(execute)
    return node_cls


@contextmanager
def node_errors(node_id: str):
    try:
        yield
    except ValueError as exc:
        message = str(exc)
        if message.startswith(f"{node_id}:"):
            raise
        raise ValueError(f"{node_id}: {message}") from exc

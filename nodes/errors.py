"""The nodes' user-error boundary: a core ``ValueError`` gets the node's name in front, once.

The core raises plain messages that name the argument, its value and the fix (``num_frames=10 must be …``); the
node that called it prefixes its own id, so ComfyUI's error panel says which node and which input to change.
"""

from __future__ import annotations

from contextlib import contextmanager


@contextmanager
def node_errors(node_id: str):
    try:
        yield
    except ValueError as exc:
        message = str(exc)
        if message.startswith(f"{node_id}:"):
            raise
        raise ValueError(f"{node_id}: {message}") from exc

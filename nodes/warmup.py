"""A ComfyUI server's idle time before its first prompt, put to use.

When the server starts listening (aiohttp's ``on_startup``, after every custom node is imported), the modules a
first Cosmos3 run would import are imported on a daemon thread (``cosmos3_core.kernels.caches.preload_first_run``):
diffusers' VAE and sound decoder with the scheduler and the tokenizer, and torch's compiler where the sampler's
``compile`` 'auto' compiles (a CUDA device with Triton). A restarted server's first run then finds them loaded
instead of importing them itself (1–2 s for the first group on a desktop CPU, 2–3 s for the compiler on an H200
machine). Every Cosmos3 node's ``execute`` first waits for that thread (at once once it is done): a prompt queued
while it still runs does its imports on one thread only, and pays no more than it would have without it.

Where no server starts (a script driving ComfyUI's executor), nothing is preloaded.
"""

from __future__ import annotations

import functools
import logging

from ..cosmos3_core.kernels.caches import preload_first_run, wait_for_preload
from ..cosmos3_core.runtime import compile_pays

_log = logging.getLogger(__name__)


async def _on_server_start(_app) -> None:
    import comfy.model_management as mm

    device = mm.get_torch_device()
    preload_first_run(compiles=getattr(device, "type", None) == "cuda" and compile_pays())


def preload_when_the_server_starts() -> bool:
    """Register the preload with ComfyUI's server; whether one is registered (False: no server object, or one
    already started)."""
    try:
        from server import PromptServer

        PromptServer.instance.app.on_startup.append(_on_server_start)
    except (ImportError, AttributeError, RuntimeError) as e:  # RuntimeError: the app's signals are frozen
        _log.debug("Cosmos3: no server start to preload at (%s)", e)
        return False
    return True


def waits_for_preload(node_cls: type) -> type:
    """Wrap ``node_cls.execute`` (a classmethod) so that it starts after the preload's imports are done."""
    func = node_cls.execute.__func__

    @functools.wraps(func)
    def execute(cls, *args, **kwargs):
        wait_for_preload()
        return func(cls, *args, **kwargs)

    node_cls.execute = classmethod(execute)
    return node_cls

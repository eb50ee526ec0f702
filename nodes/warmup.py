"""A ComfyUI server's idle time before its first prompt, put to use.

When the server starts listening (aiohttp's ``on_startup``, after every custom node is imported), the modules a first
Cosmos3 run would import are imported on a daemon thread (``cosmos3_core.kernels.caches.preload_first_run``): diffusers'
VAE and sound decoder with the scheduler and the tokenizer, and torch's compiler where the sampler's ``compile`` 'auto'
compiles (a CUDA device with Triton), where it then starts Inductor's compile worker processes
(``COSMOS3_PRESTART_COMPILE_WORKERS=0``: left to torch's first compile), and, on a CUDA device with
``COSMOS3_PRELOAD_CUDA_LIBRARIES=1`` (off by default until measured), a tiny call of each CUDA library route a run uses
loads those libraries. A first run after that finds them loaded and running. Every Cosmos3 node's ``execute`` first
waits for that thread (``wait_for_preload``; at once when it is done), so a Cosmos3 node never imports beside it; a
prompt queued before it is done waits for the rest of it (the compiler's share too, on a GPU, even if that prompt turns
compile off). Nodes of other packs and the server's own requests do not wait.

A failure here never stops the server: the preload is skipped with one warning. Where no server starts (a script
driving ComfyUI's executor), nothing is preloaded and nothing waits.
"""

from __future__ import annotations

import functools
import logging

from ..cosmos3_core.kernels.caches import preload_first_run, wait_for_preload
from ..cosmos3_core.kernels.cuda_libraries import load_cuda_libraries
from ..cosmos3_core.runtime import compile_pays

_log = logging.getLogger(__name__)


async def _on_server_start(_app) -> None:
    try:
        import comfy.model_management as mm

        device = mm.get_torch_device()
        cuda = getattr(device, "type", None) == "cuda"
        preload_first_run(compiles=cuda and compile_pays(),
                          load_libraries=functools.partial(load_cuda_libraries, device) if cuda else None)
    except Exception as e:  # noqa: BLE001 — an optional head start must never stop the server
        _log.warning("Cosmos3: the background imports of a first run's modules did not start (%s: %s); a first "
                     "run imports them itself.", type(e).__name__, e)


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

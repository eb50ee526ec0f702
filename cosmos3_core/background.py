"""Work on a background thread that must not change what the foreground computes: compiling ahead.

``BackgroundWork(fn, device)`` runs ``fn()`` once on a daemon thread, under the grad / inference mode of the thread
that created it (a compiled graph is guarded on those modes, so graphs built here are the ones the foreground will
look up) with autocast off, and on CUDA on its own stream, so its kernels interleave with the foreground's instead
of queueing behind them. ``wait()`` joins it. A failure is kept and reported by ``wait()`` as a logged warning,
never raised: background work only prepares (e.g. builds compiled graphs), so a failure costs the foreground the
time it would have spent anyway, not a result.

Used for the compiled VAE decoder's warm-up during sampling (``Cosmos3VAE.start_compile_warmup``).
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

import torch

_log = logging.getLogger(__name__)


class BackgroundWork:
    def __init__(self, fn: Callable[[], None], device: torch.device, name: str):
        self.name = name
        self.error: BaseException | None = None
        self._fn, self._device = fn, torch.device(device)
        self._inference = torch.is_inference_mode_enabled()
        self._grad = torch.is_grad_enabled()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    def _main(self) -> None:
        try:
            with torch.inference_mode(self._inference), torch.set_grad_enabled(self._grad), \
                    torch.autocast(self._device.type, enabled=False):
                if self._device.type == "cuda":
                    stream = torch.cuda.Stream(self._device)
                    with torch.cuda.stream(stream):
                        self._fn()
                    stream.synchronize()  # its memory goes back to the pool only once its kernels are done
                else:
                    self._fn()
        except BaseException as exc:  # noqa: BLE001 — reported by wait(); the foreground does the work itself
            self.error = exc

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def wait(self) -> None:
        """Block until the work is done; a failure is logged (once), not raised."""
        self._thread.join()
        if self.error is not None:
            _log.warning("%s failed (%s: %s); the foreground does this work itself.", self.name,
                         type(self.error).__name__, self.error)
            self.error = None

"""Weights moved from host memory to a GPU through pinned staging buffers.

A tensor in pageable host memory (the memory-mapped safetensors a checkpoint loads as, or ordinary process memory)
reaches the GPU through the CUDA driver's own staging, one synchronous copy per tensor. ``StagedCopier`` copies each
tensor's bytes into one of a ring of ``slots`` pinned buffers (torch's multi-threaded host copy) and issues the
GPU's read of that buffer without waiting (``copy_(non_blocking=True)`` on the current stream), so the host fills
the next buffer while the GPU reads the last. A buffer is written again only after the event recorded behind its
last read. The copies are ordered on the current stream like any later kernel, so the weights are ready for
whatever runs next on it; ``finish`` waits until every buffer is read. The buffers then go back to torch's
pinned-memory cache, which keeps them for the next load (``slots`` × ``slot_bytes`` of host memory). What the
scheme gains over ``Tensor.to`` on an H100 is in BENCHMARKS.md ("A restarted server's towers through pinned
staging").

The bytes arrive as they are (any dtype: bf16, FP8, GGUF blocks); a tensor under ``min_bytes``, not contiguous, not
on the CPU or of a tensor subclass goes by plain ``Tensor.to``. Where the host refuses the pinned buffers, one
warning says so and the copier moves the rest by ``Tensor.to``. On a CPU (``device`` type ``cpu``) the buffers are
ordinary memory and every copy is synchronous (the same slicing, for tests); other devices are refused. The scheme
is the double-buffered pinned staging of CUDA's best-practices guide for overlapping transfers with host work.
"""

from __future__ import annotations

import logging

import torch

_log = logging.getLogger(__name__)

SLOT_BYTES = 64 << 20  # one staging buffer
SLOTS = 4  # buffers in the ring: the host fills one while the GPU reads the others
MIN_BYTES = 1 << 20  # smaller tensors go by plain Tensor.to: a ring slot would not pay for itself


class StagedCopier:
    """Copies host tensors to ``device`` through a ring of ``slots`` buffers of ``slot_bytes`` (pinned on a GPU),
    allocated at the first copy that uses them. Use as a context manager, or call ``finish`` when done."""

    def __init__(self, device: torch.device, slot_bytes: int = SLOT_BYTES, slots: int = SLOTS,
                 min_bytes: int = MIN_BYTES):
        self.device, self.slot_bytes, self.slots, self.min_bytes = torch.device(device), slot_bytes, slots, min_bytes
        if self.device.type not in ("cuda", "cpu"):
            raise ValueError(f"StagedCopier stages to a CUDA device (or the CPU, for tests), not {self.device}.")
        self._pinning_refused = False
        self._buffers: list[torch.Tensor] = []
        self._read: list[torch.cuda.Event | None] = []  # per buffer: recorded after the GPU's last read of it
        self._next = 0
        self.staged_bytes = 0  # what went through the buffers (the rest went by Tensor.to)

    def copy(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` on ``device``, same dtype, shape and bytes; on the current stream, ready for what runs next
        on it."""
        if not self._stages(tensor) or not self._have_buffers():
            return tensor.to(self.device)
        out = torch.empty(tensor.shape, dtype=tensor.dtype, device=self.device)
        source, target = _bytes(tensor), _bytes(out)
        for start in range(0, source.numel(), self.slot_bytes):
            end = min(start + self.slot_bytes, source.numel())
            buffer = self._take_buffer()[: end - start]
            buffer.copy_(source[start:end])
            target[start:end].copy_(buffer, non_blocking=True)
            self._mark_read()
        self.staged_bytes += source.numel()
        return out

    def finish(self) -> None:
        """Wait until the GPU has read every buffer, then let them go (back to torch's pinned-memory cache)."""
        for event in self._read:
            if event is not None:
                event.synchronize()
        self._buffers, self._read, self._next = [], [], 0

    def close(self, failed: bool = False) -> None:
        """``finish``; after a failed load (``failed``) an error waiting for the copies is only logged, so that the
        load's own error is the one raised."""
        try:
            self.finish()
        except Exception as exc:  # noqa: BLE001 — re-raised unless the load itself failed
            if not failed:
                raise
            self._buffers, self._read, self._next = [], [], 0
            _log.warning("Cosmos3: after the failed load, its staged copies could not be waited for either (%s)",
                         str(exc).splitlines()[0][:200])

    def __enter__(self) -> "StagedCopier":
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        self.close(failed=exc_type is not None)

    def _stages(self, tensor: torch.Tensor) -> bool:
        return (type(tensor) in (torch.Tensor, torch.nn.Parameter) and tensor.device.type == "cpu"
                and tensor.is_contiguous() and tensor.nbytes >= self.min_bytes)

    def _have_buffers(self) -> bool:
        """Allocate the ring at its first use; False (one warning, once) where the host refuses pinned memory."""
        if self._buffers or self._pinning_refused:
            return bool(self._buffers)
        pinned = self.device.type == "cuda"
        try:
            self._buffers = [torch.empty(self.slot_bytes, dtype=torch.uint8, pin_memory=pinned)
                             for _ in range(self.slots)]
        except RuntimeError as exc:  # cudaHostAlloc refused (a host short of lockable memory)
            self._pinning_refused = True
            _log.warning("Cosmos3: the host refused %d MiB of pinned memory for staging weights to %s (%s); they "
                         "move by plain Tensor.to, more slowly.", self.slots * self.slot_bytes >> 20, self.device,
                         str(exc).splitlines()[0][:160])
            return False
        self._read = [None] * self.slots
        return True

    def _take_buffer(self) -> torch.Tensor:
        """The next buffer of the ring, once the GPU has read what it held."""
        index = self._next
        event = self._read[index]
        if event is not None:
            event.synchronize()
        return self._buffers[index]

    def _mark_read(self) -> None:
        if self.device.type == "cuda":
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(self.device))
            self._read[self._next] = event
        self._next = (self._next + 1) % self.slots


def staging_to(device, enabled: bool = True) -> StagedCopier | None:
    """The copier a load to ``device`` moves its weights through: one for a CUDA device where ``enabled`` (the
    host's pinned-memory switch), else None (plain ``Tensor.to``)."""
    if device is None or not enabled or torch.device(device).type != "cuda":
        return None
    return StagedCopier(device)


def _bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor's storage as a flat uint8 view."""
    return tensor.detach().reshape(-1).view(torch.uint8)

"""How fast a checkpoint's tensors reach the GPU from the host, by the way they are copied.

A restarted ComfyUI server's first Cosmos3 run moves both towers (about 27 GiB of bf16 for Nano) from the
checkpoint's memory-mapped safetensors — page cache warm, pages not yet faulted into the new process — to the GPU.
ComfyUI moves each module with ``Module.to``: a pageable copy. This probe writes one safetensors file of
``--gib`` GiB in ``--pieces`` tensors of a tower's sizes, then times each way of moving all of it to the GPU, each
from a fresh ``safe_open`` (as a new process would see the file):

* ``mmap_pageable``: ``tensor.to(device)`` per tensor, straight from the mapping (what ComfyUI does today);
* ``anon_pageable``: the same from ordinary process memory the tensors were copied into beforehand (not timed);
* ``anon_register``: ``cudaHostRegister`` of each tensor, a non-blocking copy, unregister (ComfyUI's pinning);
* ``mmap_staged``: through ``--buffers`` pinned staging buffers of ``--chunk-mib`` MiB: the host copies into one
  buffer while the GPU reads another (``cosmos3_core.kernels.host_copy``'s scheme);
* ``mmap_staged_N``: the same with N host threads filling buffers.

One JSON line per way as it is measured (GiB/s and seconds), merged into ``--out``. ``--tiny`` runs the timing
code on the CPU with a few MiB (the pinned ways need CUDA and are skipped there).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import threading
import time
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

GIB = 1 << 30


def write_file(path: Path, gib: float, pieces: int) -> int:
    """A safetensors file of about ``gib`` GiB of bf16 in ``pieces`` tensors: mostly 2-D weights of a few
    sizes and a few small 1-D ones, as a tower's layers are. Returns its tensor bytes."""
    per = int(gib * GIB / pieces) // 2
    cols = 4096 if per >= 4096 * 64 else 64
    tensors, total = {}, 0
    for i in range(pieces):
        shape = (max(1, per // cols), cols) if i % 8 else (max(1, per // cols // 16), cols)
        tensors[f"layers.{i}.weight"] = torch.empty(shape, dtype=torch.bfloat16).fill_(i % 7)
        tensors[f"layers.{i}.norm"] = torch.ones(cols, dtype=torch.bfloat16)
        total += tensors[f"layers.{i}.weight"].nbytes + cols * 2
    save_file(tensors, str(path))
    return total


def mapped(path: Path) -> list[torch.Tensor]:
    with safe_open(str(path), framework="pt", device="cpu") as f:
        return [f.get_tensor(k) for k in f.keys()]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def pageable(tensors, device):
    return [t.to(device) for t in tensors]


def registered(tensors, device):
    cudart, out = torch.cuda.cudart(), []
    for t in tensors:
        cudart.cudaHostRegister(t.data_ptr(), t.nbytes, 0)
        out.append(t.to(device, non_blocking=True))
        torch.cuda.current_stream(device).synchronize()
        cudart.cudaHostUnregister(t.data_ptr())
    return out


def staged(tensors, device, chunk: int, buffers: int, threads: int = 1):
    """Copy through pinned buffers: host threads fill a free buffer with the next tensors (byte-packed), the
    copy stream moves it into the tensors' GPU storage; an event per buffer says when it is free again."""
    out = [torch.empty_like(t, device=device) for t in tensors]
    pinned = [torch.empty(chunk, dtype=torch.uint8, pin_memory=True) for _ in range(buffers)]
    stream = torch.cuda.Stream(device)
    groups, cur, size = [], [], 0
    for i, t in enumerate(tensors):  # tensors larger than a chunk go in pieces of their bytes
        nbytes = t.nbytes
        for off in range(0, nbytes, chunk):
            n = min(chunk, nbytes - off)
            if size + n > chunk:
                groups.append(cur)
                cur, size = [], 0
            cur.append((i, off, n, size))
            size += n
    if cur:
        groups.append(cur)
    todo: queue.Queue = queue.Queue()
    for group in groups:
        todo.put(group)
    free: queue.Queue = queue.Queue()  # (buffer index, the event after which the GPU has read it, or None)
    for b in range(buffers):
        free.put((b, None))
    filled: queue.Queue = queue.Queue()

    def fill():
        while True:
            try:
                group = todo.get_nowait()
            except queue.Empty:
                return
            b, read = free.get()
            if read is not None:
                read.synchronize()
            for i, off, n, at in group:
                pinned[b][at:at + n].copy_(tensors[i].reshape(-1).view(torch.uint8)[off:off + n])
            filled.put((b, group))

    workers = [threading.Thread(target=fill, daemon=True) for _ in range(threads)]
    for w in workers:
        w.start()
    for _ in groups:
        b, group = filled.get()
        with torch.cuda.stream(stream):
            for i, off, n, at in group:
                out[i].view(-1).view(torch.uint8)[off:off + n].copy_(pinned[b][at:at + n], non_blocking=True)
            read = torch.cuda.Event()
            read.record(stream)
        free.put((b, read))
    for w in workers:
        w.join()
    stream.synchronize()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gib", type=float, default=13.0)
    p.add_argument("--pieces", type=int, default=500)
    p.add_argument("--chunk-mib", type=int, default=256)
    p.add_argument("--buffers", type=int, default=4)
    p.add_argument("--dir", type=Path, default=Path("/tmp/probe_host_copy"))
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp")) / "probe_host_copy.json")
    p.add_argument("--tiny", action="store_true")
    args = p.parse_args()
    cuda = torch.cuda.is_available() and not args.tiny
    device = torch.device("cuda" if cuda else "cpu")
    gib, pieces = (0.01, 20) if args.tiny else (args.gib, args.pieces)
    args.dir.mkdir(parents=True, exist_ok=True)
    path = args.dir / "probe.safetensors"
    t0 = time.perf_counter()
    nbytes = write_file(path, gib, pieces)
    record = {"meta": {"device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
                       "bytes": nbytes, "tensors": 2 * pieces, "write_s": round(time.perf_counter() - t0, 2),
                       "threads": torch.get_num_threads(), "chunk_mib": args.chunk_mib, "buffers": args.buffers},
              "ways": {}}
    print(json.dumps(record["meta"]), flush=True)
    chunk = args.chunk_mib << 20 if not args.tiny else 1 << 20
    ways = {"mmap_pageable": lambda t: pageable(t, device), "anon_pageable": lambda t: pageable(t, device)}
    if cuda:
        ways["anon_register"] = lambda t: registered(t, device)
        for n in (1, 2, 4, 8):
            ways[f"mmap_staged_{n}"] = lambda t, n=n: staged(t, device, chunk, args.buffers, n)
        ways["mmap_staged_4_chunk64"] = lambda t: staged(t, device, 64 << 20, 8, 4)
    reference = None
    for name, move in ways.items():
        for attempt in range(2):  # the second is what a process that has done it once sees (allocator warm)
            tensors = mapped(path)
            if name.startswith("anon"):
                tensors = [t.clone() for t in tensors]
            sync(device)
            start = time.perf_counter()
            try:
                out = move(tensors)
                sync(device)
                seconds = time.perf_counter() - start
                check = torch.stack([o.view(-1)[-1].float().cpu() for o in out[:64]])
                reference = check if reference is None else reference
                same = bool(torch.equal(check, reference))
                line = {"way": name, "attempt": attempt, "s": round(seconds, 3),
                        "gib_per_s": round(nbytes / GIB / seconds, 2), "same": same}
            except Exception as e:  # noqa: BLE001 — a probe: report and go on
                line = {"way": name, "attempt": attempt, "error": f"{type(e).__name__}: {e}"[:300]}
            out = tensors = None
            if cuda:
                torch.cuda.empty_cache()
            record["ways"].setdefault(name, []).append(line)
            print(json.dumps(line), flush=True)
            args.out.write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()

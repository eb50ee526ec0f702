"""The soak's probe inside the ComfyUI server: a custom node module with no nodes, copied by ``bench/soak.py`` into
its server's ``custom_nodes/`` (never part of the pack).

It wraps ``execution.PromptExecutor.execute`` (ComfyUI 0.3.75's prompt worker calls it once per prompt, on its own
thread) and, when a prompt ends, before the worker takes the next one, records what the process holds: GPU memory
as torch's allocator counts it (``memory_stats``: allocated / active / reserved bytes, the peak during the prompt)
and as the device reports it (``mem_get_info``: every process), host RSS, the C heap in use and kept free (glibc
``mallinfo2``), open file descriptors (by kind), pinned host memory (ComfyUI's own pin registry
``TOTAL_PINNED_MEMORY``, torch's caching host allocator, the kernel's ``VmLck``/``VmPin``), the number of compiled
graphs (Dynamo's ``unique_graphs`` counter and the graphs the pack's ``kernels.compile`` keeps), and ComfyUI's
loaded models. Each is taken twice: right after the prompt (``raw``) and
after a ``gc.collect()`` (``after``: what is still referenced; ComfyUI's own worker collects every 10 s).

Routes: ``GET /cosmos3_soak/record/{prompt_id}`` (404 until that prompt ended), ``GET /cosmos3_soak/stats`` (now,
no collect).
"""

from __future__ import annotations

import ctypes
import gc
import os
import sys
import threading
import time

import execution
import torch
from aiohttp import web
from server import PromptServer

NODE_CLASS_MAPPINGS: dict = {}
RECORDS: dict[str, dict] = {}
_LOCK = threading.Lock()


def _proc_status() -> dict:
    out = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("VmRSS", "VmHWM", "VmLck", "VmPin", "Threads"):
                    parts = rest.split()
                    out[key] = int(parts[0]) * (1024 if len(parts) > 1 else 1)
    except OSError:
        pass
    return out


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                     "fsmblks", "uordblks", "fordblks", "keepcost")]


def _heap() -> dict:
    """glibc's own count of the C heap (``mallinfo2``, glibc ≥ 2.33): bytes in use (``uordblks`` + ``hblkhd``: small
    blocks and mmapped ones) and bytes free but kept (``fordblks``). RSS that grows while ``in_use`` does not is the
    allocator keeping freed memory, not something still referenced."""
    try:
        fn = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return {}
    fn.restype = _MallInfo2
    m = fn()
    return {"in_use": m.uordblks + m.hblkhd, "free_kept": m.fordblks, "arena": m.arena, "mmapped": m.hblkhd}


def _fds() -> dict:
    kinds: dict[str, int] = {}
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return {}
    for name in names:
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        kind = target.split(":", 1)[0] if ":" in target and not target.startswith("/") else "file"
        kinds[kind] = kinds.get(kind, 0) + 1
    return {"total": sum(kinds.values()), **kinds}


def _cuda() -> dict:
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return {}
    s = torch.cuda.memory_stats()
    free, total = torch.cuda.mem_get_info()
    out = {k: s.get(f"{k}_bytes.all.current") for k in ("allocated", "active", "reserved")}
    out.update(peak_allocated=s.get("allocated_bytes.all.peak"), device_free=free, device_total=total)
    return out


def _pinned() -> dict:
    out = {}
    mm = sys.modules.get("comfy.model_management")
    if mm is not None:
        out["comfy_pinned"] = getattr(mm, "TOTAL_PINNED_MEMORY", None)
        out["comfy_pinned_tensors"] = len(getattr(mm, "PINNED_MEMORY", {}) or {})
    stats = getattr(torch.cuda, "host_memory_stats", None)
    if stats is not None and torch.cuda.is_available():
        try:
            s = stats()
            out["torch_host_allocated"] = s.get("allocated_bytes.current")
            out["torch_host_reserved"] = s.get("reserved_bytes.current")
        except Exception:  # noqa: BLE001 — an older torch without the counters
            pass
    return out


def _compiled() -> dict:
    out = {}
    try:
        from torch._dynamo.utils import counters

        out["dynamo_unique_graphs"] = int(counters["stats"]["unique_graphs"])
    except Exception:  # noqa: BLE001
        pass
    pack = [m for name, m in list(sys.modules.items()) if name.endswith("cosmos3_core.kernels.compile") and m]
    fns = graphs = 0
    for mod in pack:
        for fn in getattr(mod, "_COMPILED", {}).values():
            fns += 1
            graphs += sum(len(v) for v in getattr(fn, "_by_key", {}).values()) + (getattr(fn, "_plain", None) is not None)
    out.update(pack_compiled_functions=fns, pack_graphs=graphs)
    return out


def _models() -> dict:
    mm = sys.modules.get("comfy.model_management")
    loaded = getattr(mm, "current_loaded_models", []) if mm is not None else []
    return {"loaded": len(loaded), "names": [type(getattr(m, "real_model", None) or m).__name__ for m in loaded]}


def snapshot() -> dict:
    return dict(t=time.time(), cuda=_cuda(), proc=_proc_status(), heap=_heap(), fds=_fds(), pinned=_pinned(),
                compiled=_compiled(), models=_models())


_original_execute = execution.PromptExecutor.execute


def _execute(self, prompt, prompt_id, *args, **kwargs):
    t0 = time.time()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        try:
            torch.cuda.reset_peak_memory_stats()
        except Exception:  # noqa: BLE001 — an allocator backend without peaks
            pass
    try:
        return _original_execute(self, prompt, prompt_id, *args, **kwargs)
    finally:
        raw = snapshot()
        gc.collect()
        record = dict(started=t0, ended=raw["t"], raw=raw, after=snapshot())
        with _LOCK:
            RECORDS[prompt_id] = record


execution.PromptExecutor.execute = _execute
routes = PromptServer.instance.routes


@routes.get("/cosmos3_soak/record/{prompt_id}")
async def _record(request):
    with _LOCK:
        rec = RECORDS.get(request.match_info["prompt_id"])
    return web.json_response(rec) if rec is not None else web.json_response({}, status=404)


@routes.get("/cosmos3_soak/stats")
async def _stats(request):
    return web.json_response(snapshot())

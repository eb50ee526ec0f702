"""What a running ComfyUI 0.3.75 server tells about a prompt: its event stream, its log, and the memory in use.

ComfyUI 0.3.75 keeps per prompt, in ``/history/<id>``, only prompt-level records: the ``execution_start``,
``execution_cached`` and ``execution_success`` status messages, each with a server ``timestamp`` in ms
(``execution.PromptExecutor.add_message``), and logs ``Prompt executed in X seconds`` (``main.py``) and, at start-up,
``Import times for custom nodes:`` (``nodes.init_external_custom_nodes``, 0.1 s resolution). It records nothing per
node; the only per-node signal it emits is its websocket stream to the prompt's ``client_id``: ``progress_state``
(every node's state, sent when a node starts and when it finishes: ``comfy_execution/progress.py``), ``executing``
(a node is about to run) and ``progress`` (a progress bar's step: the sampler's steps). ``EventStream`` records that
stream with arrival times on 127.0.0.1 (a stdlib RFC 6455 client: no dependency beyond the server's own Python),
and ``node_times`` turns it into per-node seconds: from a node's first ``running`` state to its first ``finished``.

``MemoryPoller`` samples, while a prompt runs, the GPU memory in use (``nvidia-smi --query-gpu=memory.used
-lms 100``: every process on that GPU, what a user's monitor shows; torch's own counters are not reachable from
outside the server) and the server process's resident host memory (``/proc/<pid>/status`` VmRSS).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import threading
import time

_WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


class EventStream(threading.Thread):
    """The server's websocket messages to ``client_id``, as ``(arrival time.time(), type, data)`` in order."""

    def __init__(self, host: str, port: int, client_id: str, timeout: float = 10.0):
        super().__init__(daemon=True)
        self.events: list[tuple[float, str, dict]] = []
        self.lock = threading.Lock()
        self.error: BaseException | None = None
        self.sock = socket.create_connection((host, port), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((f"GET /ws?clientId={client_id} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
                           f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n")
                          .encode())
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise ConnectionError("the server closed the websocket during the handshake")
            buf += chunk
        head, self._buf = buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        accept = base64.b64encode(hashlib.sha1((key + _WS_GUID).encode()).digest()).decode()
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        if " 101 " not in lines[0] + " " or headers.get("sec-websocket-accept") != accept:
            raise ConnectionError(f"websocket handshake refused: {lines[0]!r}")
        self.sock.settimeout(None)
        self.start()

    def _exact(self, n: int) -> bytes:
        while len(self._buf) < n:
            chunk = self.sock.recv(max(65536, n - len(self._buf)))
            if not chunk:
                raise ConnectionError("websocket closed")
            self._buf += chunk
        out, self._buf = self._buf[:n], self._buf[n:]
        return out

    def _send(self, opcode: int, payload: bytes = b"") -> None:
        mask = os.urandom(4)  # a client's frames are masked (RFC 6455 §5.3)
        head = bytes([0x80 | opcode, 0x80 | len(payload)])  # control frames: payload < 126
        self.sock.sendall(head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))

    def run(self) -> None:
        parts: list[bytes] = []
        kind = 0x1  # the opcode of the message being assembled (a continuation frame keeps it)
        try:
            while True:
                b0, b1 = self._exact(2)
                opcode, n = b0 & 0x0F, b1 & 0x7F
                if n == 126:
                    n = struct.unpack(">H", self._exact(2))[0]
                elif n == 127:
                    n = struct.unpack(">Q", self._exact(8))[0]
                mask = self._exact(4) if b1 & 0x80 else None
                payload = self._exact(n)
                if mask:
                    payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
                if opcode == 0x8:  # close
                    return
                if opcode == 0x9:  # ping
                    self._send(0xA, payload)
                    continue
                if opcode in (0x1, 0x2):
                    kind, parts = opcode, []
                if opcode in (0x0, 0x1, 0x2):
                    parts.append(payload)
                    if b0 & 0x80:  # FIN: a whole message (binary ones are latent previews: not recorded)
                        if kind == 0x1:
                            self._record(b"".join(parts))
                        parts = []
        except (OSError, ConnectionError) as exc:
            self.error = exc

    def _record(self, message: bytes) -> None:
        t = time.time()
        try:
            obj = json.loads(message)
        except ValueError:
            return
        with self.lock:
            self.events.append((t, obj.get("type", ""), obj.get("data") or {}))

    def of_prompt(self, prompt_id: str) -> list[tuple[float, str, dict]]:
        with self.lock:
            return [e for e in self.events if e[2].get("prompt_id") == prompt_id]

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


def node_times(events: list[tuple[float, str, dict]], graph: dict) -> dict[str, dict]:
    """Per executed node: ``{class_type, s}`` from its first ``running`` to its first ``finished`` state (the
    ``executing`` message when no ``progress_state`` came); the sampler also gets ``steps`` and ``s_per_step``
    (``None`` when its progress messages arrived together: ComfyUI's messages carry no server time, so a
    CPU-starved event loop that delivers them in one burst says nothing about the step's length)."""
    start: dict[str, float] = {}
    end: dict[str, float] = {}
    steps: dict[str, list[float]] = {}
    for t, kind, data in events:
        if kind == "progress_state":
            for nid, state in (data.get("nodes") or {}).items():
                nid = str(state.get("real_node_id") or nid)
                if state.get("state") == "running":
                    start.setdefault(nid, t)
                elif state.get("state") == "finished" and nid in start:
                    end.setdefault(nid, t)
        elif kind == "executing" and data.get("node") is not None:
            start.setdefault(str(data["node"]), t)
        elif kind == "progress" and data.get("node") is not None:
            steps.setdefault(str(data["node"]), []).append(t)
    out = {}
    for nid, t0 in start.items():
        rec = {"class_type": graph.get(nid, {}).get("class_type"), "s": round(end[nid] - t0, 3) if nid in end else None}
        ticks = steps.get(nid, [])
        if len(ticks) >= 2:
            per_step = (ticks[-1] - ticks[0]) / (len(ticks) - 1)
            rec.update(steps=len(ticks), s_per_step=round(per_step, 4) if per_step >= 1e-3 else None)
        out[nid] = rec
    return out


def delivery_lag(events: list[tuple[float, str, dict]]) -> dict:
    """Arrival minus the server's own timestamp of ``execution_start`` and ``execution_success`` (same clock:
    127.0.0.1), seconds: how late the stream ran behind the executor at both ends of a run (when the server's
    event-loop thread is starved of CPU, per-node times are late by up to this much)."""
    lag = {}
    for t, kind, data in events:
        if kind in ("execution_start", "execution_success") and data.get("timestamp") is not None:
            lag.setdefault(kind.removeprefix("execution_"), round(t - data["timestamp"] / 1000, 3))
    return lag


def history_times(entry: dict) -> dict:
    """From a ``/history`` entry: the server's ``execution_start`` → ``execution_success`` seconds and the cached
    node ids."""
    stamps, cached = {}, []
    for event, data in (entry.get("status") or {}).get("messages") or []:
        stamps.setdefault(event, data.get("timestamp"))
        if event == "execution_cached":
            cached = [str(n) for n in data.get("nodes", [])]
    total = None
    if stamps.get("execution_start") is not None and stamps.get("execution_success") is not None:
        total = round((stamps["execution_success"] - stamps["execution_start"]) / 1000, 3)
    return {"total_s": total, "cached": cached}


_IMPORT_LINE = re.compile(r"^\s*([0-9.]+) seconds( \(IMPORT FAILED\))?: (.+?)\s*$")
_EXECUTED_LINE = re.compile(r"Prompt executed in (?:([0-9.]+) seconds|(\d+):(\d+):(\d+))")


def pack_import_seconds(log: str, pack_dir_name: str) -> float | None:
    """The pack's line of the start-up block ``Import times for custom nodes:`` (None if absent or failed)."""
    block = log.split("Import times for custom nodes:", 1)
    if len(block) < 2:
        return None
    for line in block[1].splitlines():
        m = _IMPORT_LINE.match(line)
        if m and os.path.basename(m.group(3).rstrip("/")) == pack_dir_name:
            return None if m.group(2) else float(m.group(1))
    return None


def prompt_executed_seconds(log: str) -> list[float]:
    """Every ``Prompt executed in …`` of the log, in seconds, in order."""
    out = []
    for m in _EXECUTED_LINE.finditer(log):
        if m.group(1) is not None:
            out.append(float(m.group(1)))
        else:
            h, mi, s = (int(m.group(i)) for i in (2, 3, 4))
            out.append(float(h * 3600 + mi * 60 + s))
    return out


def _rss_bytes(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


class MemoryPoller:
    """Peak GPU memory used (nvidia-smi, MiB → GiB) and peak RSS of ``pid`` between ``start()`` and ``stop()``."""

    def __init__(self, pid: int | None, gpu_index: int | None, period_s: float = 0.1):
        self.pid, self.gpu_index, self.period_s = pid, gpu_index, period_s
        self.gpu_peak_mib: float | None = None
        self.rss_peak: int | None = None
        self._stop = threading.Event()
        self._smi = None
        self._threads: list[threading.Thread] = []

    def start(self) -> "MemoryPoller":
        if self.gpu_index is not None and shutil.which("nvidia-smi"):
            self._smi = subprocess.Popen(
                ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", str(self.gpu_index),
                 "-lms", str(int(self.period_s * 1000))], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            self._threads.append(threading.Thread(target=self._read_smi, daemon=True))
        if self.pid is not None:
            self._threads.append(threading.Thread(target=self._poll_rss, daemon=True))
        for t in self._threads:
            t.start()
        return self

    def _read_smi(self) -> None:
        for line in self._smi.stdout:
            try:
                v = float(line.strip())
            except ValueError:
                continue
            self.gpu_peak_mib = v if self.gpu_peak_mib is None else max(self.gpu_peak_mib, v)

    def _poll_rss(self) -> None:
        while not self._stop.is_set():
            v = _rss_bytes(self.pid)
            if v is not None:
                self.rss_peak = v if self.rss_peak is None else max(self.rss_peak, v)
            self._stop.wait(self.period_s)

    def stop(self) -> dict:
        time.sleep(2 * self.period_s)  # the last samples of the run
        self._stop.set()
        if self._smi is not None:
            self._smi.terminate()
            try:
                self._smi.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._smi.kill()
        for t in self._threads:
            t.join(timeout=5)
        return {"gpu_smi_gib": None if self.gpu_peak_mib is None else round(self.gpu_peak_mib / 1024, 2),
                "host_rss_gib": None if self.rss_peak is None else round(self.rss_peak / 2**30, 2)}


def gpu_index() -> int | None:
    """The GPU nvidia-smi should watch: the first of ``CUDA_VISIBLE_DEVICES`` when numeric, else 0; None without
    nvidia-smi."""
    if not shutil.which("nvidia-smi"):
        return None
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
    return int(first) if first.isdigit() else 0

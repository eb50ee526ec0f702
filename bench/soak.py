"""A day of use on one server: a real ComfyUI 0.3.75 ``main.py`` with the pack (default flags, ``compile`` as shipped),
a random full-size Nano and Edge in the Hub layout, and a long mixed queue from two HTTP clients at once, with
cancels, a checkpoint switch, an out-of-memory job and a websocket client that drops; per job, what the server
process holds afterwards (issue 39).

Phases (each job's graph is a shipped API workflow at a small size; ``--tiny``: the tiny checkpoints on a CPU server):

* ``warmup`` (clients A and B at once): every kind once — T2I, batch of 2, a LoRA, the reasoner; T2V, T2AV, I2V,
  a windowed long video (2 windows). Compiles what ``compile: auto`` compiles.
* ``main1`` (A and B at once, and client C): the mix again with ``/interrupt`` (targeted by prompt id) while the
  sampler steps, while Cosmos3 VAE Decode runs, and in a long video's second window; the LoRA job followed by the
  same job without it; client C queues a video, and its websocket is cut (no close frame) while the sampler steps.
* ``switch`` (one client): the Edge checkpoint folder (T2V, I2V, T2I), then Nano again.
* ``oom`` (one client): ``POST /free`` (ComfyUI unloads every model), a helper process holds all of the GPU but
  ``--card-gib`` (a simulated 24 GiB card), a job far too large for it (must fail with the pack's one-line
  out-of-memory message), the next job on the same card (must succeed), then the memory is given back.
* ``main2`` (A and B at once, and client C): the mix with its interrupts and the websocket cut again (≥ 40 jobs: the
  window of the RSS criterion).

Per job (``--out`` JSON, rewritten after every job and copied to ``--copy-to``; one printed line per job): status,
expected status, server seconds (``/history`` timestamps), wall seconds, where an interrupt landed, the error
message, files written; and from ``bench/soak_probe.py`` (a no-node custom module the script puts beside the pack
in the server's ``custom_nodes``), recorded inside the server when the prompt ends: GPU allocated / reserved / peak,
host RSS, open descriptors by kind, pinned host memory, compiled-graph counts, loaded models — right after the
prompt and after a ``gc.collect()``.

Pass (``summary``): every job ends as expected; nothing in ``output/`` but the successful jobs' files and the
interrupted long videos' finished windows (each playable, whole windows); after ``warmup``, the GPU memory
allocated after each Nano job outside ``switch``/``oom`` is within ±1 % of their median; host RSS grows < 2 % over
the last 40 jobs; no growth of non-socket descriptors over them; the compiled-graph count is flat over ``main2``.

    python bench/soak.py --stage write --work /tmp/soak                  # the checkpoints (~45 GB; 2-4 min)
    python bench/soak.py --stage soak --work /tmp/soak --comfyui DIR --copy-to "$OUT"   # ~8-10 min on an H100
    python bench/soak.py --tiny --comfyui ~/.cache/cosmos3/venv/ComfyUI   # the same mix on the CPU (tests/test_soak.py
                                                                          # keeps the CPU suite's own soak)

The out-of-memory job (720p/189f T2AV, batch 4: about 53 GiB of working memory) fits the pack's estimate on an 80 GB
card but not the simulated 24 GiB one; it must end in one line naming the fix, whether the plan's estimate refuses it
or the step runs out of memory (``Cosmos3OutOfMemoryError``). On the lent GPU machine (no network, no ComfyUI
dependencies): carry ComfyUI's tree, a git archive of the pack and wheels of diffusers, av, aiohttp (+ its deps),
torchsde, einops, requests; ``comfyui-frontend-package`` is not needed (a stand-in ``--front-end-root`` is made).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "tests"))  # support.comfy_host: how the tests start the real 0.3.75 server

import server_probe  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")

NANO, EDGE = "Cosmos3-Nano", "Cosmos3-Edge"
LORA = "cosmos3_soak_lora.safetensors"
IMAGE = "cosmos3_soak.png"
GIB = 2**30
OOM_NEEDLES = ("out of GPU memory", "needs about")  # at run time (Cosmos3OutOfMemoryError) or the plan's estimate
LORA_TARGETS = ("layers.0.self_attn.to_q", "layers.1.self_attn.to_v", "layers.0.mlp.up_proj", "proj_in")


@dataclass(frozen=True)
class Sizes:
    image: tuple[int, int]  # height, width
    video: tuple[int, int, int]  # height, width, frames
    steps: int
    long_chunk: int  # frames per window; a long video is 2 windows
    reasoner_tokens: int
    interrupt_video: tuple[int, int, int]  # a job that is cancelled: long enough for the cancel to land
    interrupt_steps: int
    oom: tuple[int, int, int, int]  # height, width, frames, batch: far beyond the simulated card
    dtype: str


FULL = Sizes(image=(720, 1280), video=(480, 832, 33), steps=6, long_chunk=33, reasoner_tokens=32,
             interrupt_video=(480, 832, 33), interrupt_steps=12, oom=(720, 1280, 189, 4), dtype="auto")
TINY = Sizes(image=(32, 64), video=(32, 64, 5), steps=2, long_chunk=9, reasoner_tokens=8,
             interrupt_video=(192, 320, 33), interrupt_steps=200, oom=(720, 1280, 189, 8), dtype="fp32")


# ------------------------------------------------------------------------------------------------ graphs
def _api(mode: str) -> dict:
    return json.loads((REPO / "example_workflows" / "api" / f"cosmos3_{mode}.json").read_text())


def _put(g: dict, nid: str, name: str, value) -> None:
    """Set an input, through the PrimitiveInt it is linked to when it is linked."""
    v = g[nid]["inputs"][name]
    if isinstance(v, list) and len(v) == 2 and isinstance(v[0], str):
        g[v[0]]["inputs"]["value"] = value
    else:
        g[nid]["inputs"][name] = value


def graph(mode: str, sz: Sizes, *, seed: int, prefix: str, checkpoint: str = NANO, video=None, steps=None,
          batch: int = 1, lora: bool = False) -> dict:
    """A shipped API workflow at a soak size: ``mode`` in t2i, t2v, t2av, i2v, long_t2v."""
    g = _api(mode)
    height, width, frames = video or ((*sz.image, 1) if mode == "t2i" else sz.video)
    for nid, node in g.items():
        ct, inp = node["class_type"], node["inputs"]
        if ct == "Cosmos3Loader":
            inp.update(checkpoint=checkpoint, dtype=sz.dtype)
        elif ct in ("Cosmos3TextEncode", "Cosmos3VAEEncodeCond"):
            _put(g, nid, "width", width)
            _put(g, nid, "height", height)
            if ct == "Cosmos3TextEncode" and inp["num_frames"] != 1:
                inp["num_frames"] = frames
        elif ct == "Cosmos3KSamplerUniPCDualTower":
            inp.update(steps=steps or sz.steps, seed=seed, batch_size=batch)
        elif ct == "Cosmos3LongVideo":
            inp.update(width=width, height=height, frames_per_chunk=sz.long_chunk, num_frames=2 * sz.long_chunk - 1,
                       steps=steps or sz.steps, seed=seed, filename_prefix=prefix)
        elif ct == "LoadImage":
            inp["image"] = IMAGE
        elif ct in ("SaveImage", "SaveVideo"):
            inp["filename_prefix"] = prefix
    if lora:  # Cosmos3LoraLoader between the loader and every node that takes the model
        g["20"] = {"class_type": "Cosmos3LoraLoader", "inputs": {"model": ["1", 0], "lora_name": LORA,
                                                                  "strength": 1.0}}
        for nid, node in g.items():
            if nid != "20" and node["inputs"].get("model") == ["1", 0]:
                node["inputs"]["model"] = ["20", 0]
    return g


def reasoner_graph(sz: Sizes, *, seed: int, checkpoint: str = NANO) -> dict:
    return {"1": {"class_type": "Cosmos3Loader", "inputs": {"checkpoint": checkpoint, "dtype": sz.dtype,
                                                          "device": "default"}},
            "30": {"class_type": "Cosmos3Reasoner",
                   "inputs": {"model": ["1", 0], "prompt": f"What happens next in a busy street? ({seed})",
                              "task": "question", "max_new_tokens": sz.reasoner_tokens, "temperature": 0.0,
                              "seed": seed}},
            "31": {"class_type": "PreviewAny", "inputs": {"source": ["30", 0]}}}


# ------------------------------------------------------------------------------------------------ jobs
@dataclass
class Job:
    name: str
    make: object  # (seed, prefix) -> graph
    expect: str = "success"  # success | interrupted | error
    interrupt: str | None = None  # sampling | decode | window
    needle: str | tuple[str, ...] | None = None  # for expect=error: (one of them) in the message's first line
    checkpoint: str = NANO
    drop_ws: bool = False
    record: dict = field(default_factory=dict)


def kinds(sz: Sizes) -> dict:
    """name -> (make(seed, prefix), options) of every job kind in the mix."""
    iv, ist = sz.interrupt_video, sz.interrupt_steps
    return {
        "t2i": lambda s, p: graph("t2i", sz, seed=s, prefix=p),
        "t2v": lambda s, p: graph("t2v", sz, seed=s, prefix=p),
        "t2av": lambda s, p: graph("t2av", sz, seed=s, prefix=p),
        "i2v": lambda s, p: graph("i2v", sz, seed=s, prefix=p),
        "batch2": lambda s, p: graph("t2i", sz, seed=s, prefix=p, batch=2),
        "lora": lambda s, p: graph("t2i", sz, seed=s, prefix=p, lora=True),
        "long": lambda s, p: graph("long_t2v", sz, seed=s, prefix=p),
        "reasoner": lambda s, p: reasoner_graph(sz, seed=s),
        "int_sampling": lambda s, p: graph("t2v", sz, seed=s, prefix=p, video=iv, steps=ist),
        "int_decode": lambda s, p: graph("t2v", sz, seed=s, prefix=p, video=iv),
        "int_window": lambda s, p: graph("long_t2v", sz, seed=s, prefix=p, steps=max(sz.steps, 4)),
        "edge_t2v": lambda s, p: graph("t2v", sz, seed=s, prefix=p, checkpoint=EDGE),
        "edge_i2v": lambda s, p: graph("i2v", sz, seed=s, prefix=p, checkpoint=EDGE),
        "edge_t2i": lambda s, p: graph("t2i", sz, seed=s, prefix=p, checkpoint=EDGE),
        "oom": lambda s, p: graph("t2av", sz, seed=s, prefix=p, video=sz.oom[:3], batch=sz.oom[3]),
    }


def job(k: dict, name: str, tiny: bool = True) -> Job:
    opts = {"int_sampling": dict(expect="interrupted", interrupt="sampling"),
            "int_decode": dict(expect="interrupted", interrupt="decode"),
            "int_window": dict(expect="interrupted", interrupt="window"),
            "oom": dict(expect="error", needle=OOM_NEEDLES)}.get(name, {})
    if name == "reasoner" and not tiny:  # random full-size weights pick ids the stand-in tokenizer cannot spell
        opts = dict(expect="error", needle="the model produced no text")
    return Job(name, k[name], checkpoint=EDGE if name.startswith("edge_") else NANO, **opts)


PLAN = {
    "warmup": (["t2i", "batch2", "lora", "reasoner"], ["t2v", "t2av", "i2v", "long"]),
    "main1": (["t2i", "int_sampling", "t2i", "lora", "t2i", "reasoner", "batch2", "t2i", "int_decode", "t2i",
               "reasoner", "t2i", "batch2", "t2i"],
              ["t2v", "t2av", "int_sampling", "i2v", "long", "int_window", "t2v", "t2av", "i2v", "int_decode", "t2v",
               "long", "t2av", "t2v"]),
    "switch": (["edge_t2v", "edge_i2v", "edge_t2i", "t2i", "t2v"],),
    "main2": (["t2i", "lora", "t2i", "int_sampling", "reasoner", "t2i", "batch2", "t2i", "int_decode", "t2i", "t2av",
               "t2i", "reasoner", "t2i", "batch2", "t2i", "i2v", "t2i", "reasoner", "t2i"],
              ["t2v", "t2av", "i2v", "int_window", "long", "t2v", "int_sampling", "t2av", "i2v", "t2v", "long",
               "int_decode", "t2v", "t2av", "i2v", "long", "t2v", "t2av", "i2v", "t2v"]),
}


# ------------------------------------------------------------------------------------------------ the server side
class Http:
    def __init__(self, url: str):
        self.url = url

    def call(self, method: str, path: str, body=None, timeout: float = 30):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"} if data else {})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read()
        return json.loads(raw) if raw else None

    def queue(self, g: dict, client_id: str) -> str:
        try:
            return self.call("POST", "/prompt", {"prompt": g, "client_id": client_id})["prompt_id"]
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"POST /prompt refused ({e.code}): {e.read().decode(errors='replace')[:2000]}") from None

    def entry(self, pid: str) -> dict | None:
        entry = (self.call("GET", f"/history/{pid}") or {}).get(pid)
        status = (entry or {}).get("status") or {}
        return entry if status.get("completed") or status.get("status_str") in ("success", "error") else None

    def probe(self, pid: str, timeout: float = 60) -> dict | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                return self.call("GET", f"/cosmos3_soak/record/{pid}")
            except urllib.error.HTTPError as e:
                if e.code != 404:
                    raise
            time.sleep(0.1)
        return None


def outcome(entry: dict) -> tuple[str, dict]:
    status = entry.get("status") or {}
    for event, data in status.get("messages") or []:
        if event == "execution_interrupted":
            return "interrupted", data
        if event == "execution_error":
            return "error", data
    return status.get("status_str") or "unknown", {}


def history_seconds(entry: dict) -> float | None:
    stamps = {}
    for event, data in (entry.get("status") or {}).get("messages") or []:
        stamps.setdefault(event, data.get("timestamp"))
    end = next((stamps.get(k) for k in ("execution_success", "execution_error", "execution_interrupted")
                if stamps.get(k) is not None), None)
    start = stamps.get("execution_start")
    return None if start is None or end is None else round((end - start) / 1000, 3)


def output_files(entry: dict) -> list[str]:
    files = []
    for node_out in (entry.get("outputs") or {}).values():
        for key in ("images", "gifs", "videos", "animated", "audio"):
            for item in node_out.get(key) or []:
                if isinstance(item, dict) and item.get("type") == "output" and item.get("filename"):
                    files.append(os.path.join(item.get("subfolder") or "", item["filename"]))
    return files


# ------------------------------------------------------------------------------------------------ clients
class Soak:
    def __init__(self, args, srv, home: Path, res: "Results"):
        self.args, self.srv, self.home, self.res = args, srv, home, res
        self.http = Http(srv.url)
        self.sz = TINY if args.tiny else FULL
        self.kinds = kinds(self.sz)
        self.n = 0
        self.lock = threading.Lock()
        self.t0 = time.monotonic()

    def next_index(self) -> int:
        with self.lock:
            self.n += 1
            return self.n

    def over_time(self) -> bool:
        return self.args.minutes is not None and time.monotonic() - self.t0 > self.args.minutes * 60

    def run_job(self, jb: Job, client: str, cid: str, stream, phase: str) -> dict:
        n = self.next_index()
        prefix = f"soak/{n:03d}_{jb.name}"
        g = jb.make(1000 + n, prefix)
        rec = dict(n=n, phase=phase, client=client, name=jb.name, checkpoint=jb.checkpoint, expect=jb.expect,
                   prefix=prefix, interrupt=jb.interrupt)
        t0 = time.time()
        try:
            pid = self.http.queue(g, cid)
        except RuntimeError as exc:
            rec.update(status="refused", ok=False, error=str(exc))
            self.res.add_job(rec)
            return rec
        rec["prompt_id"] = pid
        if jb.interrupt:
            rec["interrupt_sent"] = self.interrupt_when(jb, pid, g, stream)
        if jb.drop_ws:
            rec["ws_dropped"] = self.drop_when_sampling(pid, stream)
        entry = self.wait(pid)
        status, data = outcome(entry)
        rec.update(status=status, wall_s=round(time.time() - t0, 3), seconds=history_seconds(entry),
                   files=output_files(entry))
        if data:
            rec["node_type"] = data.get("node_type")
            if status == "error":
                rec["error"] = str(data.get("exception_message", ""))[:2000]
                rec["exception_type"] = data.get("exception_type")
        ok = status == jb.expect
        if ok and jb.expect == "error":
            first = rec["error"].strip().splitlines()[0] if rec["error"].strip() else ""
            needles = (jb.needle,) if isinstance(jb.needle, str) else jb.needle
            ok = any(n in first for n in needles) and first.startswith("Cosmos3") and len(first) < 400
            rec["error_first_line"] = first
        rec["ok"] = ok
        probe = self.http.probe(pid)
        rec["probe"] = compact_probe(probe)
        self.res.add_job(rec)
        return rec

    def wait(self, pid: str) -> dict:
        deadline = time.monotonic() + self.args.job_timeout
        while True:
            entry = self.http.entry(pid)
            if entry is not None:
                return entry
            if self.srv.proc.poll() is not None:
                raise RuntimeError(f"the server died (exit {self.srv.proc.returncode}):\n{self.srv.log_tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"prompt {pid} not done after {self.args.job_timeout} s:\n{self.srv.log_tail()}")
            time.sleep(0.1)

    def _watch(self, pid: str, stream, fire, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(fire(kind, data) for _, kind, data in stream.of_prompt(pid)):
                return True
            if self.http.entry(pid) is not None:
                return False
            time.sleep(0.02)
        return False

    def interrupt_when(self, jb: Job, pid: str, g: dict, stream) -> dict:
        """POST /interrupt for ``pid`` once it is where ``jb.interrupt`` says (from its websocket events)."""
        sampler = next((k for k, v in g.items() if v["class_type"] in ("Cosmos3KSamplerUniPCDualTower",
                                                                      "Cosmos3LongVideo")), None)
        decode = next((k for k, v in g.items() if v["class_type"] == "Cosmos3VAEDecode"), None)
        steps = g[sampler]["inputs"]["steps"]

        def fire(kind, data):
            if jb.interrupt == "decode":
                if kind == "executing" and str(data.get("node")) == decode:
                    return True
                return kind == "progress" and str(data.get("node")) == decode and data.get("value", 0) >= 1
            if kind != "progress" or str(data.get("node")) != sampler:
                return False
            if jb.interrupt == "window":
                return data.get("value", 0) > steps + 1  # into the second window's steps
            return data.get("value", 0) >= 1

        t0 = time.time()
        landed = self._watch(pid, stream, fire, self.args.job_timeout)
        if landed:
            self.http.call("POST", "/interrupt", {"prompt_id": pid})
        return dict(sent=landed, after_s=round(time.time() - t0, 3))

    def drop_when_sampling(self, pid: str, stream) -> bool:
        """Cut the websocket (no close frame) once the sampler steps, as a closed browser tab does."""
        def fire(kind, data):
            return kind == "progress" and data.get("value", 0) >= 1
        seen = self._watch(pid, stream, fire, self.args.job_timeout)
        try:
            stream.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        except OSError:
            pass
        stream.sock.close()
        return seen

    def client(self, name: str, jobs: list[Job], phase: str, errors: list) -> None:
        import uuid

        cid = f"soak-{name}-{uuid.uuid4().hex[:8]}"
        stream = server_probe.EventStream("127.0.0.1", self.srv.port, cid)
        try:
            for jb in jobs:
                if self.over_time() and phase == "main2":
                    self.res.note(f"client {name}: time budget reached, {phase} stops early")
                    break
                self.run_job(jb, name, cid, stream, phase)
        except BaseException as exc:  # noqa: BLE001 — reported by the phase
            errors.append(f"client {name}: {type(exc).__name__}: {exc}")
        finally:
            stream.close()

    def concurrent(self, phase: str, lists: tuple, extra: list[tuple[str, list[Job]]] = ()) -> None:
        errors: list[str] = []
        threads = [threading.Thread(target=self.client, args=(chr(ord("A") + i), [job(self.kinds, n, self.args.tiny) for n in names],
                                                               phase, errors))
                   for i, names in enumerate(lists)]
        threads += [threading.Thread(target=self.client, args=(name, jobs, phase, errors)) for name, jobs in extra]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise RuntimeError("; ".join(errors))

    # -------------------------------------------------------------------------------------------- out of memory
    def oom_phase(self) -> None:
        if self.args.tiny:
            self.res.note("oom: skipped on the CPU (no GPU to run out of); tests/test_soak_oom.py covers the message")
            return
        self.http.call("POST", "/free", {"unload_models": True, "free_memory": True})
        card = int(self.args.card_gib * GIB)
        deadline = time.monotonic() + 90  # ComfyUI moves every model to the CPU, then empties its cache
        while (used := gpu_used_by_server(self.http)) > card - 4 * GIB and time.monotonic() < deadline:
            time.sleep(1)
        target_free = max(card - used, GIB)
        holder = hold_gpu(target_free, self.args.python)
        self.res.note(f"oom: server held {used / GIB:.2f} GiB after /free; a helper now holds all but "
                      f"{target_free / GIB:.2f} GiB: a {self.args.card_gib:g} GiB card")
        try:
            import uuid

            cid = f"soak-oom-{uuid.uuid4().hex[:8]}"
            stream = server_probe.EventStream("127.0.0.1", self.srv.port, cid)
            try:
                for name in ("oom", "t2i"):
                    self.run_job(job(self.kinds, name, self.args.tiny), "O", cid, stream, "oom")
            finally:
                stream.close()
        finally:
            holder.stdin.close()
            holder.wait(timeout=60)
        self.res.note("oom: the helper gave the memory back")


HOLDER = r"""
import sys, torch
target = int(sys.argv[1])
torch.cuda.init()
free, total = torch.cuda.mem_get_info()
held = torch.empty(max(free - target, 0), dtype=torch.uint8, device="cuda")
print(f"held {held.numel() / 2**30:.2f} GiB; free {torch.cuda.mem_get_info()[0] / 2**30:.2f} GiB", flush=True)
sys.stdin.read()
"""


def hold_gpu(target_free: int, python: str) -> subprocess.Popen:
    proc = subprocess.Popen([python, "-c", HOLDER, str(target_free)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    line = proc.stdout.readline().strip()
    print(f"[oom] holder: {line}", flush=True)
    if not line.startswith("held"):
        raise RuntimeError(f"the GPU holder did not start: {line!r}")
    return proc


def gpu_used_by_server(http: Http) -> int:
    cuda = http.call("GET", "/cosmos3_soak/stats")["cuda"]
    return int(cuda["device_total"] - cuda["device_free"])


def compact_probe(p: dict | None) -> dict | None:
    if not p:
        return None

    def one(s):
        c, pr = s.get("cuda") or {}, s.get("proc") or {}
        return dict(gpu_allocated=c.get("allocated"), gpu_reserved=c.get("reserved"), gpu_active=c.get("active"),
                    gpu_peak=c.get("peak_allocated"), device_used=(c["device_total"] - c["device_free"]) if c else None,
                    rss=pr.get("VmRSS"), heap=s.get("heap"), vm_lck=pr.get("VmLck"), vm_pin=pr.get("VmPin"),
                    threads=pr.get("Threads"),
                    fds=s.get("fds"), pinned=s.get("pinned"), compiled=s.get("compiled"), models=s.get("models"))
    return dict(started=p["started"], ended=p["ended"], raw=one(p["raw"]), after=one(p["after"]))


# ------------------------------------------------------------------------------------------------ results
class Results:
    """The JSON file, merged and rewritten (atomically) after every job; also copied to ``copy_to``."""

    def __init__(self, path: Path, copy_to: Path | None):
        self.path, self.copy_to = path, copy_to
        self.data = json.loads(path.read_text()) if path.is_file() else {}
        self.lock = threading.Lock()

    def save(self) -> None:
        with self.lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.data, indent=1) + "\n")
            tmp.replace(self.path)
            if self.copy_to is not None:
                self.copy_to.mkdir(parents=True, exist_ok=True)
                shutil.copy(self.path, self.copy_to / self.path.name)

    def add_job(self, rec: dict) -> None:
        with self.lock:
            self.data.setdefault("jobs", []).append(rec)
        self.save()
        print(job_line(rec), flush=True)

    def note(self, text: str) -> None:
        with self.lock:
            self.data.setdefault("notes", []).append(f"{time.strftime('%H:%M:%S')} {text}")
        self.save()
        print(f"[note] {text}", flush=True)


def _mib(v) -> str:
    return "-" if v is None else f"{v / 2**20:.0f}"


def job_line(r: dict) -> str:
    a = ((r.get("probe") or {}).get("after")) or {}
    mb = _mib
    comp = a.get("compiled") or {}
    fds = a.get("fds") or {}
    where = f" @{r.get('node_type')}" if r.get("status") in ("interrupted", "error") else ""
    return (f"[job {r['n']:3d}] {r['phase']:6s} {r['client']} {r['name']:12s} {r['status']:11s}{where} "
            f"{'ok ' if r.get('ok') else 'BAD'} {r.get('seconds')}s alloc {mb(a.get('gpu_allocated'))}MB "
            f"res {mb(a.get('gpu_reserved'))}MB rss {mb(a.get('rss'))}MB "
            f"heap {mb((a.get('heap') or {}).get('in_use'))}MB fds {fds.get('total')} "
            f"pinned {mb((a.get('pinned') or {}).get('comfy_pinned'))}MB graphs {comp.get('pack_graphs')}/"
            f"{comp.get('dynamo_unique_graphs')}" + (f" | {r.get('error_first_line') or r.get('error', '')[:200]}"
                                                     if r.get("status") == "error" else ""))


# ------------------------------------------------------------------------------------------------ checks
def check_outputs(home: Path, jobs: list[dict]) -> dict:
    """Every file under output/soak/ belongs to a successful job, or is an interrupted long video's finished
    windows (playable: whole windows of frames)."""
    by_prefix = {Path(j["prefix"]).name: j for j in jobs}
    out_dir = home / "output" / "soak"
    files = sorted(p for p in out_dir.rglob("*") if p.is_file()) if out_dir.is_dir() else []
    stray, partial_ok = [], []
    for p in files:
        owner = next((j for pre, j in by_prefix.items() if p.name.startswith(pre + "_")), None)
        if owner is None:
            stray.append(str(p.relative_to(home)))
        elif owner["status"] == "success":
            continue
        elif owner["name"] in ("int_window", "long") and owner["status"] == "interrupted":
            frames = count_frames(p)
            partial_ok.append(dict(file=p.name, frames=frames))
            if not frames:
                stray.append(f"{p.relative_to(home)} (not playable)")
        else:
            stray.append(f"{p.relative_to(home)} ({owner['status']} job {owner['n']})")
    missing = [f for j in jobs if j["status"] == "success" for f in j.get("files", [])
               if not (home / "output" / f).is_file()]
    return dict(files=len(files), stray=stray, missing=missing, interrupted_long_videos=partial_ok,
                ok=not stray and not missing)


def count_frames(path: Path) -> int:
    try:
        import av

        with av.open(str(path)) as c:
            return sum(1 for _ in c.decode(video=0))
    except Exception:  # noqa: BLE001 — unplayable counts as 0 frames
        return 0


WORK_OF = {"int_sampling": "t2v", "int_decode": "t2v", "int_window": "long", "ws_drop": "t2v"}  # same model work


def steady_jobs(jobs: list[dict]) -> list[dict]:
    """Nano jobs with a probe record, in the order they ended, after the warm-up: in each stretch of the soak
    between model reloads (the server's start, the ``switch`` and ``oom`` phases), the jobs after the last one that
    was the first of its kind of work in that stretch (it loaded what it uses and compiled what it had not)."""
    done = sorted((j for j in jobs if j.get("probe")), key=lambda j: j["probe"]["ended"])
    out, stretch, seen, warm_until = [], [], set(), 0

    def close():
        out.extend(j for j in stretch[warm_until:] if j["checkpoint"] == NANO)

    for j in done:
        if j["phase"] in ("switch", "oom"):
            close()
            stretch, seen, warm_until = [], set(), 0
            continue
        stretch.append(j)
        work = WORK_OF.get(j["name"], j["name"])
        if work not in seen:
            seen.add(work)
            warm_until = len(stretch)
    close()
    return out


def _gpu_check(steady: list[dict]) -> dict | None:
    levels = [j["probe"]["after"]["gpu_allocated"] for j in steady if j["probe"]["after"].get("gpu_allocated")]
    if not levels:
        return None
    med = sorted(levels)[len(levels) // 2]
    off = [dict(n=j["n"], name=j["name"], rel=round(j["probe"]["after"]["gpu_allocated"] / med - 1, 4))
           for j in steady if abs(j["probe"]["after"]["gpu_allocated"] / med - 1) > 0.01]
    return dict(jobs=len(levels), median_gib=round(med / GIB, 3), min_gib=round(min(levels) / GIB, 3),
                max_gib=round(max(levels) / GIB, 3), outside_1pct=off, ok=not off)


def _host_checks(last: list[dict]) -> tuple[dict, dict]:
    """RSS growth per job kind (first → last of that kind: kinds differ by what they hold, e.g. decoded frames)
    and non-socket descriptors (sockets are the clients' HTTP connections) over ``last``."""
    by_kind: dict[str, list[int]] = {}
    for j in last:
        by_kind.setdefault(j["name"], []).append(j["probe"]["after"]["rss"])
    growth = {k: round(v[-1] / v[0] - 1, 4) for k, v in by_kind.items() if len(v) >= 2}
    worst = max(growth.values(), default=0.0)
    rss_all = [j["probe"]["after"]["rss"] for j in last]
    rss = dict(jobs=len(last), first_mib=round(rss_all[0] / 2**20), last_mib=round(rss_all[-1] / 2**20),
               min_mib=round(min(rss_all) / 2**20), max_mib=round(max(rss_all) / 2**20), growth_by_kind=growth,
               ok=worst < 0.02)

    def files(j):
        f = j["probe"]["after"].get("fds") or {}
        return f.get("total", 0) - f.get("socket", 0)
    fds = dict(first=files(last[0]), last=files(last[-1]), max=max(files(j) for j in last),
               sockets_last=(last[-1]["probe"]["after"].get("fds") or {}).get("socket"),
               ok=files(last[-1]) <= files(last[0]))
    return rss, fds


def summarize(jobs: list[dict]) -> dict:
    """The pass criteria (module docstring) over the steady jobs (``steady_jobs``)."""
    bad = [f"{j['n']} {j['name']}: {j['status']} (expected {j['expect']})" for j in jobs if not j.get("ok")]
    steady = steady_jobs(jobs)
    last = steady[-40:]
    rss, fds = _host_checks(last) if len(last) >= 2 else (None, None)
    counts = [((j["probe"]["after"].get("compiled") or {}).get("pack_graphs"),
               (j["probe"]["after"].get("compiled") or {}).get("dynamo_unique_graphs")) for j in last]
    graphs = dict(first=counts[0], last=counts[-1], ok=counts[0] == counts[-1]) if counts else None
    pinned = [((j["probe"]["after"].get("pinned") or {}).get("comfy_pinned") or 0) for j in last]
    interrupts = [dict(n=j["n"], target=j["interrupt"], landed=j.get("node_type"), status=j["status"])
                  for j in jobs if j.get("interrupt")]
    gpu = _gpu_check(steady)
    checks = dict(all_expected=not bad, gpu=gpu, rss=rss, fds=fds, graphs=graphs)
    ok = not bad and all(c is None or c.get("ok") for c in (gpu, rss, fds, graphs))
    return dict(jobs=len(jobs), steady_jobs=len(steady), by_status=_count(j["status"] for j in jobs),
                unexpected=bad, interrupts=interrupts,
                pinned_steady_mib=[round(min(pinned) / 2**20), round(max(pinned) / 2**20)] if pinned else None,
                checks=checks, ok=ok)


def _count(items) -> dict:
    out: dict = {}
    for i in items:
        out[i] = out.get(i, 0) + 1
    return out


# ------------------------------------------------------------------------------------------------ stages
def stage_write(args, res: Results) -> None:
    from cosmos3_core.testing.fullsize import write_random_checkpoint

    t0 = time.perf_counter()
    for name, variant in ((NANO, "nano"), (EDGE, "edge")):
        write_random_checkpoint(args.ckpt / name, variant, tiny=args.tiny, log=lambda m: print(f"[write] {m}",
                                                                                              flush=True))
    sizes = {n: round(sum(f.stat().st_size for f in (args.ckpt / n).rglob("*") if f.is_file()) / 1e9, 2)
             for n in (NANO, EDGE)}
    res.data["checkpoints"] = dict(size_gb=sizes, write_s=round(time.perf_counter() - t0, 1), tiny=args.tiny)
    res.save()
    print(f"[write] {res.data['checkpoints']}", flush=True)


def write_lora(path: Path, checkpoint: Path, rank: int = 8, alpha: float = 8.0) -> None:
    """A PEFT LoRA on a few of the checkpoint's linear layers, shapes read from its safetensors headers."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    shapes = {}
    for shard in sorted((checkpoint / "transformer").glob("*.safetensors")):
        with safe_open(str(shard), "pt") as f:
            for key in f.keys():
                if key.endswith(".weight") and key[: -len(".weight")] in LORA_TARGETS:
                    shapes[key[: -len(".weight")]] = tuple(f.get_slice(key).get_shape())
    g = torch.Generator().manual_seed(0)
    sd = {}
    for m, (out_f, in_f) in shapes.items():
        sd[f"transformer.{m}.lora_A.weight"] = (torch.randn(rank, in_f, generator=g) * 0.01).to(torch.bfloat16)
        sd[f"transformer.{m}.lora_B.weight"] = (torch.randn(out_f, rank, generator=g) * 0.01).to(torch.bfloat16)
    meta = {"lora_adapter_metadata": json.dumps({"transformer.r": rank, "transformer.lora_alpha": alpha,
                                                 "transformer.target_modules": sorted(shapes)})}
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(sd, str(path), metadata=meta)


def prepare_home(args) -> Path:
    from PIL import Image

    from support import comfy_host

    home = comfy_host.comfy_home(args.work / "home")
    for name in (NANO, EDGE):
        link = home / "models" / "diffusers" / name
        if not link.exists():
            link.symlink_to((args.ckpt / name).resolve(), target_is_directory=True)
    lora = home / "models" / "loras" / LORA
    if not lora.is_file():
        write_lora(lora, args.ckpt / NANO)
    img = home / "input" / IMAGE
    if not img.is_file():
        import numpy as np

        yy, xx = np.mgrid[0:480, 0:832]
        Image.fromarray(np.stack([xx % 256, yy % 256, (xx + yy) % 256], -1).astype(np.uint8)).save(img)
    shutil.copy(REPO / "bench" / "soak_probe.py", home / "custom_nodes" / "cosmos3_soak_probe.py")
    shutil.rmtree(home / "output" / "soak", ignore_errors=True)
    return home


def server_args(args) -> list[str]:
    """A stand-in frontend where the machine has no comfyui-frontend-package (the server needs only a folder)."""
    try:
        import comfyui_frontend_package  # noqa: F401
        return []
    except ImportError:
        front = args.work / "frontend"
        front.mkdir(parents=True, exist_ok=True)
        (front / "index.html").write_text("<html><body>soak</body></html>\n")
        return ["--front-end-root", str(front)]


def stage_soak(args, res: Results) -> None:
    from support import comfy_host

    home = prepare_home(args)
    for key in ("jobs", "notes", "summary", "outputs", "phase_s"):  # a new soak: the write stage's record stays
        res.data.pop(key, None)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHINDUCTOR_", "COSMOS3_CACHE_DIR"))}
    env["COSMOS3_CACHE_DIR"] = str(args.work / "compile-cache")
    log = args.work / "comfyui-soak.log"
    with comfy_host.ComfyServer(home, cpu=args.tiny, python=args.python, env=env, log_path=log, start_timeout=300,
                                extra_args=server_args(args)) as srv:
        stats = srv.system_stats()
        res.data["server"] = dict(startup_s=round(srv.startup_s, 2), devices=[d.get("name") for d in
                                                                              stats.get("devices", [])],
                                  comfyui_version=stats.get("system", {}).get("comfyui_version"),
                                  pytorch=stats.get("system", {}).get("pytorch_version"))
        res.save()
        print(f"[soak] server up: {res.data['server']}", flush=True)
        soak = Soak(args, srv, home, res)
        t0 = time.monotonic()
        try:
            for i, phase in enumerate(args.phases):
                p0 = time.monotonic()
                res.note(f"phase {phase} starts")
                if phase == "oom":
                    soak.oom_phase()
                elif phase in ("main1", "main2"):
                    drop = Job("ws_drop", soak.kinds["t2v"], drop_ws=True)
                    soak.concurrent(phase, PLAN[phase], extra=[("C", [drop])])
                else:
                    soak.concurrent(phase, PLAN[phase])
                nth = args.phases[:i + 1].count(phase)  # a phase that repeats: main2, main2#2, …
                key = phase if nth == 1 else f"{phase}#{nth}"
                res.data.setdefault("phase_s", {})[key] = round(time.monotonic() - p0, 1)
                res.save()
        finally:
            res.data["soak_s"] = round(time.monotonic() - t0, 1)
            jobs = res.data.get("jobs", [])
            res.data["outputs"] = check_outputs(home, jobs)
            res.data["summary"] = summarize(jobs)
            res.data["summary"]["checks"]["outputs"] = res.data["outputs"]["ok"]
            res.data["summary"]["ok"] = res.data["summary"]["ok"] and res.data["outputs"]["ok"]
            res.data["server"]["alive_at_end"] = srv.proc.poll() is None
            res.data["server"]["log_oom_lines"] = [ln for ln in srv.log_text().splitlines() if "OOM" in ln][:10]
            res.save()
            shutil.copy(log, args.work / "comfyui-soak.log.txt")
            if args.copy_to is not None:
                shutil.copy(log, args.copy_to / "comfyui-soak.log")
            print(f"[soak] summary: {json.dumps(res.data['summary'])}", flush=True)


def gpu_name() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--stage", default="write,soak", help="write, soak, or both (default)")
    p.add_argument("--tiny", action="store_true", help="the tiny checkpoints on a CPU server: a check that it runs")
    p.add_argument("--work", type=Path, default=None, help="checkpoints, ComfyUI home, caches, log")
    p.add_argument("--comfyui", type=Path, default=os.environ.get("COMFYUI_DIR"), help="ComfyUI 0.3.75 tree")
    p.add_argument("--python", default=sys.executable, help="the server's Python (default: this one)")
    p.add_argument("--phases", default="warmup,main1,switch,oom,main2")
    p.add_argument("--card-gib", type=float, default=24.0, help="the simulated card of the oom phase")
    p.add_argument("--minutes", type=float, default=None, help="stop queueing main2 jobs after this many minutes")
    p.add_argument("--job-timeout", type=float, default=None, help="seconds one job may take (default 300; tiny 120)")
    p.add_argument("--out", type=Path, default=None, help="results JSON (default <work>/soak.json)")
    p.add_argument("--copy-to", type=Path, default=None, help="also copy the JSON (and the log) here")
    args = p.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a time limit's SIGTERM still stops the server
    args.work = (args.work or Path.home() / ".cache" / "cosmos3" / "bench" /
                 ("soak_tiny" if args.tiny else "soak")).resolve()
    args.ckpt = args.work / "checkpoints"
    args.phases = [s.strip() for s in args.phases.split(",") if s.strip()]
    args.job_timeout = args.job_timeout or (120.0 if args.tiny else 300.0)
    stages = [s.strip() for s in args.stage.split(",")]
    if "soak" in stages:
        if args.comfyui is None or not (Path(args.comfyui) / "main.py").is_file():
            p.error(f"--comfyui {args.comfyui}: not a ComfyUI tree (no main.py)")
        os.environ["COMFYUI_DIR"] = str(Path(args.comfyui).resolve())
    args.work.mkdir(parents=True, exist_ok=True)
    res = Results((args.out or args.work / "soak.json").resolve(), args.copy_to)
    meta = res.data.setdefault("meta", {})
    import torch  # never initialises CUDA here: the oom phase counts every process's GPU memory as the server's

    meta.update(tiny=args.tiny, sizes=(TINY if args.tiny else FULL).__dict__, phases=args.phases,
                card_gib=args.card_gib, python=platform.python_version(), torch=torch.__version__,
                gpu=gpu_name(), host=platform.node(), date=datetime.datetime.now().isoformat(timespec="seconds"))
    res.save()
    if "write" in stages and "soak" in stages:  # a child process: the writer's CUDA memory is gone before the soak
        child = [sys.executable, __file__, "--stage", "write", "--work", str(args.work), "--out", str(res.path)]
        subprocess.run(child + (["--tiny"] if args.tiny else []), check=True)
        res.data = json.loads(res.path.read_text())
    elif "write" in stages:
        stage_write(args, res)
    if "soak" in stages:
        stage_soak(args, res)
    print(f"results: {res.path}", flush=True)


if __name__ == "__main__":
    main()

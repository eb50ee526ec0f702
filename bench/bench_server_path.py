"""The user's path, the benchmark of record: a real ComfyUI server with this pack, the shipped API workflows, a
full-size random-weight Nano on disk in the Hub layout, and diffusers' ``Cosmos3OmniPipeline.from_pretrained`` on the
same folder in the same session.

Stages (``--stage``, comma-separated or ``all``; each resumable, every result merged into ``--out`` as soon as it
exists, so a stage cut short keeps what it measured):

* ``write``: a full-size random Nano (``cosmos3_core/testing/fullsize.py``: 15.17 B bf16 transformer parameters in
  5 GB shards, Wan2.2 VAE, sound tokenizer; ≈35 GB) into ``--checkpoint``; kept when already complete. It also
  records the prompts' token counts.
* ``ours``: an empty compile cache (``COSMOS3_CACHE_DIR`` = ``<work>/compile-cache``, emptied: a machine's first run),
  then ComfyUI 0.3.75's ``main.py`` (``--comfyui``, run by ``--python``) on the GPU with default flags, the pack linked
  as a custom node and the checkpoint as ``models/diffusers/Cosmos3-Nano``; per shape two runs, ``first`` and
  ``second``, of ``example_workflows/api/cosmos3_<t2i|t2v|t2av>.json`` at full size (T2I 1280×720, T2V and T2AV 480p/93f,
  T2AV 720p/189f), 35 steps, CFG 6 as shipped, the ~1,500-token ``common.LONG_PROMPT``, ``compile`` as shipped unless
  ``--compile``. Every run has a new seed and a new one-token prompt tag, so the text encode runs each time (as in
  each diffusers call) and the loader is cached after the first run of the session.
* ``restart``: a new server on the same compile cache; one ``restart`` run per shape (the first shape's includes the
  model load). ``--settle S`` waits S seconds between a server being up and its first prompt, as a user opening
  the page would (the pack imports what a first run needs meanwhile: ``nodes/warmup.py``); 0, the default, queues
  at once. ``--server-args='…'`` adds arguments to ComfyUI's ``main.py`` (``--front-end-root DIR`` where the frontend
  package is not installed).
* ``load``: ``Cosmos3Pipeline.load`` straight to the GPU (what the CLI does; the transformer through pinned
  staging), the same after importing diffusers' VAE classes apart (``ours_imported``), the same by ``Tensor.to``
  (``ours_pageable``) and diffusers' ``from_pretrained`` +
  ``.to("cuda")``, each in a fresh process, twice (the second from a warm page cache and a started CUDA).
* ``diffusers``: in this process, ``Cosmos3OmniPipeline.from_pretrained(<checkpoint>, torch_dtype=bf16)`` then
  ``.to("cuda")`` (both timed), then per shape a first and a second call with the same prompt, negative (the
  checkpoint's ``assets/negative_prompt.json`` re-serialized, what our empty negative resolves to), steps, CFG,
  ``enable_sound`` for T2AV and ``output_type="np"`` (``--diffusers-first-steps`` shortens the first call, a warm-up).

What is read from the server (``server_probe.py``): each run's seconds from ``/history`` (``execution_start`` →
``execution_success`` server timestamps) and the ``Prompt executed in`` log line; per-node seconds from the server's
websocket stream (0.3.75 records nothing per node); the pack's ``Import times for custom nodes`` line; peak GPU
memory (nvidia-smi, all processes) and server RSS while each run lasts; ``/system_stats`` after it. Summary per shape
(``t2i``, ``480p_t2v``, ``480p_t2av``, ``720p_t2av``): ``first_s``, ``second_s``, ``restart_s``,
``diffusers_second_s`` (+ ``*_without_load_s``, ``diffusers_first_s``, ``peak_memory``, ``runs`` with the per-node
breakdown).

What the machine needs: a CUDA GPU and nvidia-smi; a Python 3.11 (``--python``, also the one running this script)
with torch 2.14.1, diffusers 0.42.1, accelerate, transformers ≥ 5.15, safetensors, av, einops and ComfyUI 0.3.75's
requirements (aiohttp, …; ``tests/run.sh`` installs the set); a ComfyUI 0.3.75 tree (``--comfyui``, e.g. what
``tests/run.sh`` extracts to ``$VENV/ComfyUI``); ~40 GB free disk for the checkpoint (``--work``, default
``~/.cache/cosmos3/bench/server_path``: checkpoint, ComfyUI home, compile cache, logs, ``server_path.json``). Every
call below also takes ``--comfyui DIR --python PY --copy-to "$OUT"`` (the JSON is copied there after each
measurement, so a call cut at its time limit still returns what it measured). Expected H200 durations, in this order
(``ours`` empties the compile cache that ``restart`` reuses; one device call ≤ 10 min):

    python bench/bench_server_path.py --stage write                                   # 1-3 min (disk-bound)
    python bench/bench_server_path.py --stage ours --shapes t2i,480p_t2v,480p_t2av    # ~3.5 min
    python bench/bench_server_path.py --stage restart --shapes t2i,480p_t2v,480p_t2av # ~2 min
    python bench/bench_server_path.py --stage diffusers --shapes t2i,480p_t2v,480p_t2av  # ~3 min
    python bench/bench_server_path.py --stage load                                    # ~1.5 min
    python bench/bench_server_path.py --stage ours --shapes 720p_t2av                 # ~9 min (2 × ~250 s)
    python bench/bench_server_path.py --stage diffusers --shapes 720p_t2av --diffusers-first-steps 2  # ~6 min
    python bench/bench_server_path.py --stage restart --shapes 720p_t2av              # ~5 min

``--runs first`` keeps ``ours`` to a machine's first run per shape (at 720p it saves ~250 s).

``--tiny`` runs the whole flow on the CPU (tiny checkpoint through the same writer, small shapes, 2 steps, a short
prompt; ``tests/test_server_path.py``): a check that it runs, not a measurement.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import shutil
import sys
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "tests"))  # support.comfy_host: how the tests start the real 0.3.75 server

import server_probe  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local folders only; the device machine has no network

SHAPES = {"t2i": ("t2i", 720, 1280, 1), "480p_t2v": ("t2v", 480, 832, 93), "480p_t2av": ("t2av", 480, 832, 93),
          "720p_t2av": ("t2av", 720, 1280, 189)}  # name: (workflow, height, width, frames)
TINY_SHAPES = {"t2i": ("t2i", 32, 64, 1), "480p_t2v": ("t2v", 32, 64, 5), "480p_t2av": ("t2av", 32, 64, 5),
               "720p_t2av": ("t2av", 64, 96, 9)}
CHECKPOINT_NAME = "Cosmos3-Nano"  # what the shipped workflows load
STAGES = ("write", "ours", "restart", "diffusers", "load")
DROP_ENV = ("TORCHINDUCTOR_", "TRITON_CACHE_DIR", "FLASH_ATTENTION_CUTE_DSL_CACHE", "TORCH_COMPILE", "COSMOS3_CACHE_DIR")


def long_prompt(words: int | None) -> str:
    from common import LONG_PROMPT  # noqa: PLC0415 (imports torch: only where needed)

    return LONG_PROMPT if words is None else " ".join(LONG_PROMPT.split()[:words])


class Results:
    """The JSON file, merged and rewritten (atomically) after every measurement; also copied to ``copy_to``."""

    def __init__(self, path: Path, copy_to: Path | None):
        self.path, self.copy_to = path, copy_to
        self.data = json.loads(path.read_text()) if path.is_file() else {}
        self.data.setdefault("shapes", {})

    def shape(self, name: str) -> dict:
        return self.data["shapes"].setdefault(name, {})

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1) + "\n")
        tmp.replace(self.path)
        if self.copy_to is not None:
            self.copy_to.mkdir(parents=True, exist_ok=True)
            shutil.copy(self.path, self.copy_to / self.path.name)


# ------------------------------------------------------------------ write
def stage_write(args, res: Results) -> None:
    import torch

    from cosmos3_core.sampling.prompt import default_negative_prompt, encode_prompts, load_tokenizer
    from cosmos3_core.testing.fullsize import MARKER, is_complete, spec_of, write_random_checkpoint

    t0 = time.perf_counter()
    marker = args.checkpoint / MARKER
    existed = is_complete(args.checkpoint, spec_of("nano", tiny=args.tiny))
    write_random_checkpoint(args.checkpoint, "nano", tiny=args.tiny)
    files = json.loads(marker.read_text())["files"]
    tok = load_tokenizer(args.checkpoint)
    ids = encode_prompts(tok, long_prompt(args.prompt_words) + " take0", default_negative_prompt(args.checkpoint),
                         num_frames=93, height=480, width=832, fps=24.0, use_system_prompt=True)
    res.data["checkpoint"] = dict(path=str(args.checkpoint), size_gb=round(sum(files.values()) / 1e9, 2),
                                  write_s=round(time.perf_counter() - t0, 1), kept_existing=existed,
                                  device="cuda" if torch.cuda.is_available() else "cpu")
    res.data.setdefault("meta", {}).update(cond_tokens=len(ids.cond), uncond_tokens=len(ids.uncond))
    res.save()
    print(f"[write] {res.data['checkpoint']}", flush=True)


# ------------------------------------------------------------------ the server
def build_graph(shape: tuple, steps: int, seed: int, prompt: str, compile_choice: str, prefix: str) -> dict:
    """The shipped API workflow of ``shape`` at its size with this run's seed, prompt and steps."""
    mode, height, width, frames = shape
    graph = json.loads((REPO / "example_workflows" / "api" / f"cosmos3_{mode}.json").read_text())

    def put(nid: str, name: str, value) -> None:  # through a PrimitiveInt when the input is linked
        v = graph[nid]["inputs"][name]
        if isinstance(v, list) and len(v) == 2 and isinstance(v[0], str):
            graph[v[0]]["inputs"]["value"] = value
        else:
            graph[nid]["inputs"][name] = value

    for nid, node in graph.items():
        ct, inp = node["class_type"], node["inputs"]
        if ct == "Cosmos3Loader":
            inp["checkpoint"] = CHECKPOINT_NAME
        elif ct == "Cosmos3TextEncode":
            put(nid, "width", width)
            put(nid, "height", height)
            if (inp["num_frames"] == 1) != (frames == 1):
                raise RuntimeError(f"cosmos3_{mode}.json: num_frames {inp['num_frames']} cannot become {frames}")
            inp.update(num_frames=frames, prompt=prompt)
        elif ct == "Cosmos3KSamplerUniPCDualTower":
            inp.update(steps=steps, seed=seed)
            if compile_choice != "as-shipped":
                inp["compile"] = compile_choice
        elif ct in ("SaveImage", "SaveVideo"):
            inp["filename_prefix"] = prefix
    return graph


def _home(args) -> Path:
    from support import comfy_host

    home = comfy_host.comfy_home(args.work / "home")
    link = home / "models" / "diffusers" / CHECKPOINT_NAME
    if link.is_symlink() and Path(os.readlink(link)) != args.checkpoint.resolve():
        link.unlink()
    if not link.exists():
        link.symlink_to(args.checkpoint.resolve(), target_is_directory=True)
    return home


def _env(cache: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(DROP_ENV)}
    env["COSMOS3_CACHE_DIR"] = str(cache)
    return env


def run_once(srv, stream, graph: dict, timeout: float, gpu: int | None) -> dict:
    from support import comfy_host

    before = len(server_probe.prompt_executed_seconds(srv.log_text()))
    poller = server_probe.MemoryPoller(srv.proc.pid, gpu).start()
    t0 = time.time()
    pid = srv.queue(graph)
    entry = srv.wait(pid, timeout=timeout, poll=0.2)
    wall = time.time() - t0
    peak = poller.stop()
    status = entry.get("status") or {}
    if status.get("status_str") != "success":
        raise comfy_host.PromptExecutionError(comfy_host._execution_error_text(status.get("messages")))
    deadline = time.time() + 10  # the log line and the last websocket messages follow the history entry
    executed = []
    while time.time() < deadline:
        executed = server_probe.prompt_executed_seconds(srv.log_text())[before:]
        if executed and any(e[1] == "execution_success" for e in stream.of_prompt(pid)):
            break
        time.sleep(0.1)
    hist = server_probe.history_times(entry)
    events = stream.of_prompt(pid)
    nodes = server_probe.node_times(events, graph)
    load = sum(n["s"] or 0.0 for n in nodes.values() if n["class_type"] == "Cosmos3Loader")
    devices = srv.system_stats().get("devices", [])
    return dict(prompt_id=pid, total_s=hist["total_s"], prompt_executed_s=executed[0] if executed else None,
                client_wall_s=round(wall, 3), cached=hist["cached"], nodes=nodes, load_s=round(load, 3),
                without_load_s=None if hist["total_s"] is None else round(hist["total_s"] - load, 3),
                event_lag_s=server_probe.delivery_lag(events), peak_memory=peak, system_stats_after=devices)


def _stop_leftover_server(pid_file: Path) -> None:
    """A server this script started in an earlier call that was killed before it could stop it (SIGKILL at a time
    limit): end its process group, found by the pid it recorded, if that process is still ComfyUI's main.py."""
    import signal

    try:
        pid = int(pid_file.read_text())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except (OSError, ValueError):
        pid_file.unlink(missing_ok=True)
        return
    if "main.py" in cmdline and str(pid_file.parent) in cmdline:
        print(f"stopping the server left by an earlier call (pid {pid})", flush=True)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(pid, sig)
            except ProcessLookupError:
                break
            time.sleep(5)
    pid_file.unlink(missing_ok=True)


def stage_server(args, res: Results, kind: str) -> None:
    from support import comfy_host

    cache = args.work / "compile-cache"
    if kind == "ours":
        shutil.rmtree(cache, ignore_errors=True)
        cache.mkdir(parents=True)
    elif not cache.is_dir():
        raise SystemExit(f"--stage restart needs {cache} from --stage ours (run that first, same --work).")
    if not (args.checkpoint / ".cosmos3-random-checkpoint.json").is_file():
        raise SystemExit(f"{args.checkpoint} holds no written checkpoint: run --stage write first.")
    home = _home(args)
    gpu = None if args.tiny else server_probe.gpu_index()
    prompt = long_prompt(args.prompt_words)
    log = args.work / f"comfyui-{kind}.log"
    pid_file = args.work / "home" / "server.pid"  # the server's command line holds <work>/home: checked on reuse
    _stop_leftover_server(pid_file)
    with comfy_host.ComfyServer(home, cpu=args.tiny, python=args.python, env=_env(cache), log_path=log,
                                start_timeout=300, extra_args=shlex.split(args.server_args)) as srv:
        pid_file.write_text(str(srv.proc.pid))
        stats = srv.system_stats()
        server = dict(startup_s=round(srv.startup_s, 2),
                      pack_import_s=server_probe.pack_import_seconds(srv.log_text(), comfy_host.PACK_NAME),
                      comfyui_version=stats.get("system", {}).get("comfyui_version"),
                      devices=[d.get("name") for d in stats.get("devices", [])], settle_s=args.settle)
        res.data.setdefault("server", {})[kind] = server
        if kind == "ours":
            res.data["pack_import_s"] = server["pack_import_s"]
        res.save()
        print(f"[{kind}] server up: {server}", flush=True)
        time.sleep(args.settle)  # a user opening the page before queueing: the server's idle time (nodes/warmup.py)
        stream = server_probe.EventStream("127.0.0.1", srv.port, srv.client_id)
        try:
            for name in args.shapes:
                shape = args.shape_table[name]
                for label in (args.runs if kind == "ours" else ("restart",)):
                    seed = 42 + len(res.shape(name).get("runs", {})) + (100 if label == "restart" else 0)
                    tag = f" take{uuid.uuid4().hex[:8]}"  # one word: one token, a new text-encode input
                    graph = build_graph(shape, args.steps, seed, prompt + tag, args.compile,
                                        f"cosmos3_bench/{name}_{label}")
                    rec = run_once(srv, stream, graph, args.run_timeout, gpu)
                    summarize_run(res.shape(name), shape, label, rec)
                    res.save()
                    print(f"[{kind}] {name} {label}: {rec['total_s']} s (load {rec['load_s']} s) "
                          f"peak {rec['peak_memory']}", flush=True)
        finally:
            stream.close()
    pid_file.unlink(missing_ok=True)


def summarize_run(entry: dict, shape: tuple, label: str, rec: dict) -> None:
    mode, height, width, frames = shape
    entry.update(workflow=f"example_workflows/api/cosmos3_{mode}.json", height=height, width=width, frames=frames,
                 sound=mode == "t2av")
    entry.setdefault("runs", {})[label] = rec
    entry[f"{label}_s"] = rec["total_s"]
    if label != "second":
        entry[f"{label}_without_load_s"] = rec["without_load_s"]
    entry.setdefault("peak_memory", {})[label] = rec["peak_memory"]


# ------------------------------------------------------------------ diffusers
def stage_diffusers(args, res: Results) -> None:
    import torch

    device = "cpu" if args.tiny else "cuda"
    dtype = torch.float32 if args.tiny else torch.bfloat16

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    t0 = time.perf_counter()
    import diffusers
    from diffusers import Cosmos3OmniPipeline

    import_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    pipe = Cosmos3OmniPipeline.from_pretrained(str(args.checkpoint), torch_dtype=dtype, enable_safety_checker=False,
                                               local_files_only=True)
    from_pretrained_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    pipe.to(device)
    sync()
    to_device_s = time.perf_counter() - t0
    pipe.set_progress_bar_config(disable=True)
    res.data["diffusers_load"] = dict(import_s=round(import_s, 2), from_pretrained_s=round(from_pretrained_s, 2),
                                      to_device_s=round(to_device_s, 2),
                                      load_s=round(from_pretrained_s + to_device_s, 2), diffusers=diffusers.__version__)
    res.save()
    print(f"[diffusers] load {res.data['diffusers_load']}", flush=True)
    negative = json.dumps(json.loads((args.checkpoint / "assets" / "negative_prompt.json").read_text()))
    prompt = long_prompt(args.prompt_words)
    gpu = None if args.tiny else server_probe.gpu_index()
    for name in args.shapes:
        mode, height, width, frames = args.shape_table[name]
        entry = res.shape(name)
        for call in ("first", "second"):
            steps = args.diffusers_first_steps if call == "first" and args.diffusers_first_steps else args.steps
            if device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            poller = server_probe.MemoryPoller(os.getpid(), gpu).start()
            sync()
            t0 = time.perf_counter()
            pipe(prompt=prompt + f" take{uuid.uuid4().hex[:8]}", negative_prompt=negative, num_frames=frames,
                 height=height, width=width, fps=24.0, num_inference_steps=steps, guidance_scale=6.0,
                 enable_sound=mode == "t2av", output_type="np", generator=torch.Generator("cpu").manual_seed(42))
            sync()
            seconds = round(time.perf_counter() - t0, 3)
            peak = poller.stop()
            if device == "cuda":
                peak["torch_allocated_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
            entry.update(height=height, width=width, frames=frames, sound=mode == "t2av")
            entry.setdefault("diffusers", {})[call] = dict(s=seconds, steps=steps, peak_memory=peak)
            entry[f"diffusers_{call}_s"] = seconds
            entry.setdefault("peak_memory", {})[f"diffusers_{call}"] = peak
            res.save()
            print(f"[diffusers] {name} {call} ({steps} steps): {seconds} s peak {peak}", flush=True)


# ------------------------------------------------------------------ load (library vs diffusers, fresh processes)
LOAD_CHILD = r"""
import gc, json, sys, time
t0 = time.perf_counter()
import torch
torch_s = time.perf_counter() - t0
which, ckpt, device = sys.argv[1:4]
dtype = torch.float32 if device == "cpu" else torch.bfloat16
sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
t0 = time.perf_counter()
if which.startswith("ours"):
    from cosmos3_core.pipeline import Cosmos3Pipeline
else:
    from diffusers import Cosmos3OmniPipeline
out = dict(torch_import_s=round(torch_s, 2), import_s=round(time.perf_counter() - t0, 2), loads=[])
if which == "ours_imported":  # diffusers' VAE and sound classes imported before the loads, timed apart
    t0 = time.perf_counter()
    from diffusers import AutoencoderKLWan, Cosmos3AVAEAudioTokenizer  # noqa: F401
    out["vae_classes_import_s"] = round(time.perf_counter() - t0, 2)
for _ in range(2):
    t0 = time.perf_counter()
    if which.startswith("ours"):
        pipe = Cosmos3Pipeline.load(ckpt, dtype=dtype, device=device, pinned_staging=which != "ours_pageable")
        sync()
        rec = dict(s=round(time.perf_counter() - t0, 2))
    else:
        pipe = Cosmos3OmniPipeline.from_pretrained(ckpt, torch_dtype=dtype, enable_safety_checker=False,
                                                   local_files_only=True)
        t1 = time.perf_counter()
        pipe.to(device)
        sync()
        rec = dict(from_pretrained_s=round(t1 - t0, 2), to_device_s=round(time.perf_counter() - t1, 2),
                   s=round(time.perf_counter() - t0, 2))
    out["loads"].append(rec)
    del pipe
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
print("LOAD_RESULT " + json.dumps(out), flush=True)
"""


def stage_load(args, res: Results) -> None:
    """``Cosmos3Pipeline.load`` (the CLI's load, straight to the device: the transformer through pinned staging),
    the same after importing diffusers' VAE and sound classes apart (``ours_imported``: what a process's first load
    spends on that import), the same by ``Tensor.to`` (``ours_pageable``), and diffusers' ``from_pretrained`` +
    ``.to(device)`` on the checkpoint, each in a fresh process (its first load includes CUDA's start), twice, after
    one untimed read of the checkpoint (so that no variant pays for a cold page cache)."""
    import subprocess

    device = "cpu" if args.tiny else "cuda"
    for path in sorted(p for p in args.checkpoint.rglob("*") if p.is_file()):  # every variant from a warm page cache
        with path.open("rb") as f:
            while f.read(64 << 20):
                pass
    env = _env(args.work / "compile-cache-load")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    for which in ("ours", "ours_imported", "ours_pageable", "diffusers"):
        proc = subprocess.run([args.python, "-c", LOAD_CHILD, which, str(args.checkpoint), device], env=env,
                              cwd=REPO, capture_output=True, text=True, timeout=600)
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("LOAD_RESULT ")), None)
        if proc.returncode != 0 or line is None:
            raise RuntimeError(f"load probe ({which}) failed, exit {proc.returncode}:\n{proc.stderr[-4000:]}")
        rec = json.loads(line.removeprefix("LOAD_RESULT "))
        rec.update(first_s=rec["loads"][0]["s"], second_s=rec["loads"][1]["s"])
        res.data.setdefault("load", {})[which] = rec
        res.save()
        print(f"[load] {which}: {rec}", flush=True)


# ------------------------------------------------------------------ main
def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--stage", default="all", help=f"comma-separated of {', '.join(STAGES)}, or all")
    p.add_argument("--tiny", action="store_true", help="the whole flow on the CPU, tiny checkpoint and shapes")
    p.add_argument("--work", type=Path, default=None,
                   help="home, compile cache, logs, results (default ~/.cache/cosmos3/bench/server_path[_tiny])")
    p.add_argument("--checkpoint", type=Path, default=None, help="checkpoint folder (default <work>/Cosmos3-Nano)")
    p.add_argument("--comfyui", type=Path, default=os.environ.get("COMFYUI_DIR"),
                   help="ComfyUI 0.3.75 tree (holds main.py); default $COMFYUI_DIR")
    p.add_argument("--python", default=sys.executable, help="the server's Python (default: this one)")
    p.add_argument("--shapes", default=None, help=f"comma-separated of {', '.join(SHAPES)} (default all)")
    p.add_argument("--runs", default="first,second", help="the ours stage's runs per shape: first[,second]")
    p.add_argument("--server-args", default="",
                   help="more arguments for ComfyUI's main.py, e.g. --server-args='--front-end-root DIR' where the "
                        "frontend package is not installed (a lent GPU machine)")
    p.add_argument("--settle", type=float, default=0.0,
                   help="seconds between a server being up and its first prompt (default 0: queued at once)")
    p.add_argument("--steps", type=int, default=None, help="sampler steps (default 35; --tiny 2)")
    p.add_argument("--compile", choices=["as-shipped", "auto", "on", "off"], default="as-shipped",
                   help="the sampler's compile input (default: as the shipped workflow has it)")
    p.add_argument("--prompt-words", type=int, default=None, help="shorten the prompt (default: all; --tiny 40)")
    p.add_argument("--diffusers-first-steps", type=int, default=None,
                   help="steps of diffusers' first call per shape (a warm-up; default: --steps)")
    p.add_argument("--run-timeout", type=float, default=None, help="seconds one run may take (default 580; tiny 300)")
    p.add_argument("--out", type=Path, default=None, help="results JSON (default <work>/server_path.json)")
    p.add_argument("--copy-to", type=Path, default=None, help="also copy the JSON into this folder after each update")
    args = p.parse_args(argv)
    import signal

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a time limit's SIGTERM still stops the server

    stages = STAGES if args.stage == "all" else tuple(s.strip() for s in args.stage.split(","))
    bad = [s for s in stages if s not in STAGES]
    if bad:
        p.error(f"--stage {','.join(bad)}: not one of {', '.join(STAGES)}, all")
    args.runs = tuple(r.strip() for r in args.runs.split(","))
    if not args.runs or any(r not in ("first", "second") for r in args.runs) or args.runs[0] != "first":
        p.error(f"--runs {','.join(args.runs)}: 'first' or 'first,second'")
    args.shape_table = TINY_SHAPES if args.tiny else SHAPES
    args.shapes = list(args.shape_table) if args.shapes is None else [s.strip() for s in args.shapes.split(",")]
    bad = [s for s in args.shapes if s not in args.shape_table]
    if bad:
        p.error(f"--shapes {','.join(bad)}: not one of {', '.join(args.shape_table)}")
    args.work = (args.work or Path.home() / ".cache" / "cosmos3" / "bench" /
                 ("server_path_tiny" if args.tiny else "server_path")).resolve()
    args.checkpoint = (args.checkpoint or args.work / CHECKPOINT_NAME).resolve()
    args.steps = args.steps or (2 if args.tiny else 35)
    args.prompt_words = args.prompt_words if args.prompt_words is not None else (40 if args.tiny else None)
    args.run_timeout = args.run_timeout or (300.0 if args.tiny else 580.0)
    if any(s in ("ours", "restart") for s in stages):
        if args.comfyui is None or not (Path(args.comfyui) / "main.py").is_file():
            p.error(f"--comfyui {args.comfyui}: not a ComfyUI tree (no main.py); pass the 0.3.75 tree or set "
                    "COMFYUI_DIR")
        os.environ["COMFYUI_DIR"] = str(Path(args.comfyui).resolve())  # read by comfy_host
    args.work.mkdir(parents=True, exist_ok=True)
    res = Results((args.out or args.work / "server_path.json").resolve(), args.copy_to)
    meta = res.data.setdefault("meta", {})
    if meta.get("tiny", args.tiny) != args.tiny:
        p.error(f"{res.path} holds {'tiny' if meta['tiny'] else 'full-size'} results; use another --out")
    meta.update(tiny=args.tiny, steps=args.steps, cfg=6.0, compile=args.compile, prompt_words=args.prompt_words,
                python=platform.python_version(), host=platform.node(),
                date=datetime.datetime.now().isoformat(timespec="seconds"))
    for stage in stages:
        t0 = time.perf_counter()
        if stage == "write":
            stage_write(args, res)
        elif stage in ("ours", "restart"):
            stage_server(args, res, stage)
        elif stage == "diffusers":
            stage_diffusers(args, res)
        else:
            stage_load(args, res)
        res.data.setdefault("stage_s", {})[stage] = round(time.perf_counter() - t0, 1)
        res.save()
    import torch

    meta.update(torch=torch.__version__, gpu=torch.cuda.get_device_name() if torch.cuda.is_available() else None)
    res.save()
    print(f"results: {res.path}", flush=True)


if __name__ == "__main__":
    main()

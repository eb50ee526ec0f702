"""A real ComfyUI 0.3.75 host for the tests: throwaway homes, an in-process executor, a real server.

The host tree is installed by ``bash tests/run.sh`` (outside the repo) and located through the
``COMFYUI_DIR`` environment variable. See docs/comfy-host.md for the recipe.

Public API (plain module, not a conftest; tests do ``from support import comfy_host``):

    PACK_NAME                      folder/module name of the pack inside custom_nodes/
    REPO_ROOT                      the repository root (the pack under test)
    comfyui_dir() -> Path          the host tree; skips (COSMOS3_ALLOW_NO_HOST=1) or fails if absent
    comfy_home(tmp, link_pack=True) -> Path
                                   a fresh ComfyUI base directory with the repo linked in
    get_executor(base_dir=None, cpu=True) -> InProcessHost
                                   process-wide in-process host (first call fixes base_dir)
    pack_node_ids() -> list[str]   node ids registered by the pack (in-process host)
    assert_pack_loaded() -> list[str]
                                   fails with the import traceback if the pack did not load
    ComfyServer(base_dir, ...)     context manager running ``main.py`` as a subprocess
    PromptValidationError          raised when a graph does not validate (both hosts)
    PromptExecutionError           raised by ComfyServer.run / InProcessHost.run_ok on failure

Gotchas this module handles (numbers refer to docs/comfy-host.md §4):
  * ComfyUI registers a directory pack under ``sys.modules[<full path>]`` (dots -> "_x_"), not under
    its folder name, so ``import cosmos3_pack_under_test`` never works. Reach node classes through
    ``host.node_class_mappings`` / ``nodes.NODE_CLASS_MAPPINGS`` and never import the pack's
    ``__init__.py`` a second time under another name (gotcha 12).
  * A pack that fails to import only logs "(IMPORT FAILED)"; ``assert_pack_loaded`` and
    ``ComfyServer(require_pack=True)`` turn that into a test failure with the traceback.
  * Import order for the in-process host (gotchas 7, 10): ``args`` are set before
    ``comfy.model_management``/``folder_paths`` load, ``utils.*`` before ``nodes``.
  * ``PromptExecutor.execute`` calls ``asyncio.run``: use ``InProcessHost.run`` from sync tests
    only (gotcha 11).
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

PACK_NAME = "cosmos3_pack_under_test"
PACK_MODULE = f"custom_nodes.{PACK_NAME}"  # RELATIVE_PYTHON_MODULE / object_info python_module
NODE_PREFIX = "Cosmos3"
REPO_ROOT = Path(__file__).resolve().parents[2]  # tests/support/comfy_host.py -> the repo

__all__ = [
    "PACK_NAME", "PACK_MODULE", "NODE_PREFIX", "REPO_ROOT",
    "comfyui_dir", "comfy_home", "get_executor", "pack_node_ids", "assert_pack_loaded",
    "InProcessHost", "ComfyServer", "PromptValidationError", "PromptExecutionError", "free_port",
]


class PromptValidationError(RuntimeError):
    """The graph did not validate. ``error`` and ``node_errors`` are ComfyUI's dicts."""

    def __init__(self, error: Any, node_errors: Any):
        self.error = error
        self.node_errors = node_errors
        super().__init__(f"prompt failed validation: {_fmt(error)}\nnode_errors: {_fmt(node_errors)}")


class PromptExecutionError(RuntimeError):
    """The graph validated but failed while executing."""

    def __init__(self, message: str, status_messages: Any = None):
        self.status_messages = status_messages
        super().__init__(message)


def _fmt(obj: Any) -> str:
    try:
        return json.dumps(obj, indent=1, default=str)
    except Exception:
        return repr(obj)


def _execution_error_text(status_messages) -> str:
    for item in status_messages or []:
        event, data = item[0], item[1]
        if event in ("execution_error", "execution_interrupted"):
            tb = "".join(data.get("traceback") or [])
            return (f"{event} in node {data.get('node_id')} ({data.get('node_type')}): "
                    f"{data.get('exception_type')}: {data.get('exception_message')}\n{tb}")
    return "no execution_error message; status: " + _fmt(status_messages)


# --------------------------------------------------------------------------------------------
# locating the host
# --------------------------------------------------------------------------------------------

def comfyui_dir() -> Path:
    """The ComfyUI tree from ``$COMFYUI_DIR``.

    If it is missing: ``pytest.skip`` when ``COSMOS3_ALLOW_NO_HOST=1``, else ``pytest.fail``
    (CI must never skip host tests silently).
    """
    raw = os.environ.get("COMFYUI_DIR", "")
    path = Path(raw) if raw else None
    if path is not None and (path / "main.py").is_file() and (path / "nodes.py").is_file():
        return path.resolve()
    why = ("COMFYUI_DIR is not set" if path is None
           else f"COMFYUI_DIR={raw} does not contain ComfyUI (no main.py/nodes.py)")
    import pytest
    if os.environ.get("COSMOS3_ALLOW_NO_HOST") == "1":
        pytest.skip(f"{why}; skipped because COSMOS3_ALLOW_NO_HOST=1")
    pytest.fail(f"{why}. Run the tests with `bash tests/run.sh` (it installs ComfyUI 0.3.75 "
                f"and sets COMFYUI_DIR), or set COSMOS3_ALLOW_NO_HOST=1 to skip host tests.",
                pytrace=False)
    raise AssertionError("unreachable")


def comfy_home(tmp: os.PathLike | str, link_pack: bool = True) -> Path:
    """Create a throwaway ComfyUI base directory under ``tmp`` and return it.

    Layout: custom_nodes/, user/, models/diffusers/, input/, output/, temp/; with
    ``link_pack`` the repository root is symlinked as ``custom_nodes/cosmos3_pack_under_test``
    (a fixed name: a CI clone folder called e.g. ``nodes`` or ``comfy`` would shadow ComfyUI).
    """
    base = Path(tmp) / "comfy_home"
    for sub in ("custom_nodes", "user", "models/diffusers", "input", "output", "temp"):
        (base / sub).mkdir(parents=True, exist_ok=True)
    if link_pack:
        link = base / "custom_nodes" / PACK_NAME
        if not link.exists():
            link.symlink_to(REPO_ROOT, target_is_directory=True)
    return base


# --------------------------------------------------------------------------------------------
# in-process host
# --------------------------------------------------------------------------------------------

class _Capture(logging.Handler):
    def __init__(self):
        super().__init__(level=logging.DEBUG)
        self.records: list[str] = []

    def emit(self, record):
        try:
            self.records.append(record.getMessage())
        except Exception:
            pass


class InProcessHost:
    """ComfyUI loaded into this process (docs/comfy-host.md §3). Use ``get_executor()``."""

    def __init__(self, base_dir: Path, cpu: bool = True):
        self.base_dir = Path(base_dir).resolve()
        self.comfyui_dir = comfyui_dir()
        t0 = time.perf_counter()
        if str(self.comfyui_dir) not in sys.path:
            sys.path.insert(0, str(self.comfyui_dir))
        for name in ("nodes", "server", "execution", "utils", "folder_paths"):
            mod = sys.modules.get(name)
            if mod is not None and not str(getattr(mod, "__file__", "") or "").startswith(str(self.comfyui_dir)):
                raise RuntimeError(f"module {name!r} already imported from {getattr(mod, '__file__', mod)}; "
                                   f"it shadows ComfyUI's. Do not put the repo root on sys.path.")
        from comfy.cli_args import args  # imported, not run: parses [] (pytest argv ignored)
        args.cpu = bool(cpu)
        args.base_directory = str(self.base_dir)
        args.disable_api_nodes = True
        args.database_url = "sqlite:///:memory:"
        import folder_paths
        if Path(folder_paths.base_path).resolve() != self.base_dir:
            raise RuntimeError(f"folder_paths was imported before the host was set up "
                               f"(base_path={folder_paths.base_path})")
        # ComfyUI's own order, not isort's: its ``utils`` package first (imported after ``execution``, ``utils`` is
        # already a module that is not the package; gotcha 10)
        import utils.extra_config  # noqa: F401
        import utils.install_util  # noqa: F401

        # isort: split
        import server

        # isort: split
        import nodes

        # isort: split
        import execution
        import hook_breaker_ac10a0
        self.folder_paths = folder_paths
        self.server_module = server
        self.nodes = nodes
        self.execution = execution
        self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)
        self.prompt_server = server.PromptServer(self.loop)  # real object, never started
        capture = _Capture()
        root = logging.getLogger()
        root.addHandler(capture)
        old_level = root.level
        if root.level > logging.INFO or root.level == logging.NOTSET:
            root.setLevel(logging.INFO)
        try:
            hook_breaker_ac10a0.save_functions()
            self.loop.run_until_complete(nodes.init_extra_nodes(init_custom_nodes=True, init_api_nodes=False))
            hook_breaker_ac10a0.restore_functions()
        finally:
            root.removeHandler(capture)
            root.setLevel(old_level)
        self.init_log = capture.records
        self.executor = execution.PromptExecutor(
            self.prompt_server, cache_type=execution.CacheType.CLASSIC, cache_args={"lru": 0, "ram": 0})
        self.startup_s = time.perf_counter() - t0

    # -- registry ------------------------------------------------------------------------------
    @property
    def node_class_mappings(self) -> dict:
        return self.nodes.NODE_CLASS_MAPPINGS

    def pack_loaded(self) -> bool:
        return PACK_NAME in self.nodes.LOADED_MODULE_DIRS

    def pack_node_ids(self) -> list[str]:
        """Node ids registered from custom_nodes/cosmos3_pack_under_test (sorted)."""
        return sorted(k for k, cls in self.nodes.NODE_CLASS_MAPPINGS.items()
                      if getattr(cls, "RELATIVE_PYTHON_MODULE", None) == PACK_MODULE)

    def pack_import_log(self) -> str:
        """ComfyUI's start-up log records that mention the pack (tracebacks included)."""
        return "\n".join(m for m in self.init_log if PACK_NAME in m)

    def assert_pack_loaded(self) -> list[str]:
        """Fail loudly unless the pack imported and registered at least one ``Cosmos3*`` node."""
        link = self.base_dir / "custom_nodes" / PACK_NAME
        if not link.exists():
            raise AssertionError(f"{link} does not exist: build the home with comfy_home(tmp, link_pack=True)")
        if not self.pack_loaded():
            raise AssertionError(f"ComfyUI could not import the pack ({link} -> {REPO_ROOT}):\n"
                                 + (self.pack_import_log() or "(no log captured)"))
        ids = self.pack_node_ids()
        if not any(i.startswith(NODE_PREFIX) for i in ids):
            raise AssertionError(f"the pack imported but registered no {NODE_PREFIX}* node "
                                 f"(registered: {ids}); log:\n{self.pack_import_log()}")
        return ids

    # -- running graphs ------------------------------------------------------------------------
    def validate(self, prompt: dict, prompt_id: str | None = None):
        """``execution.validate_prompt`` -> (ok, error, outputs_to_execute, node_errors)."""
        return self.loop.run_until_complete(
            self.execution.validate_prompt(prompt_id or str(uuid.uuid4()), prompt, None))

    def run(self, prompt: dict, prompt_id: str | None = None, extra_data: dict | None = None,
            fresh: bool = False):
        """Validate and execute an API-format graph.

        Returns ``(success, outputs, status_messages)``: outputs are the UI payloads per output
        node (e.g. ``{"9": {"images": [...]}}``). Raises ``PromptValidationError`` if the graph
        does not validate. ``fresh=True`` drops the executor's output cache first.
        """
        prompt_id = prompt_id or str(uuid.uuid4())
        ok, err, outputs_to_execute, node_errors = self.validate(prompt, prompt_id)
        if not ok:
            raise PromptValidationError(err, node_errors)
        if fresh:
            self.executor.reset()
        self.executor.execute(prompt, prompt_id, dict(extra_data or {}), outputs_to_execute)
        self._drain()
        ex = self.executor
        return ex.success, ex.history_result.get("outputs", {}), list(ex.status_messages)

    def run_ok(self, prompt: dict, **kw) -> dict:
        """Like ``run`` but raises ``PromptExecutionError`` on failure; returns outputs."""
        success, outputs, messages = self.run(prompt, **kw)
        if not success:
            raise PromptExecutionError(_execution_error_text(messages), messages)
        return outputs

    def _drain(self):
        # send_sync() queued websocket messages on the never-started server's loop: drop them.
        try:
            self.loop.run_until_complete(asyncio.sleep(0))
            q = self.prompt_server.messages
            while not q.empty():
                q.get_nowait()
        except Exception:
            pass


_HOST: InProcessHost | None = None
_HOST_ERROR: BaseException | None = None
_HOST_TMP: str | None = None
_HOST_LOCK = threading.Lock()


def get_executor(base_dir: os.PathLike | str | None = None, cpu: bool = True) -> InProcessHost:
    """The process-wide in-process host, created on first call.

    ``base_dir`` is honoured on the first call only (ComfyUI's folder_paths is global); with
    ``None`` a session home with the pack linked is created under a temp dir (``host.base_dir``;
    put models in ``host.base_dir / "models" / ...``). A later call with a *different* explicit
    ``base_dir`` raises. If the host failed to start once, every later call re-raises.
    """
    global _HOST, _HOST_ERROR, _HOST_TMP
    with _HOST_LOCK:
        if _HOST_ERROR is not None:
            raise RuntimeError(f"the in-process ComfyUI host failed to start earlier: {_HOST_ERROR!r}") from _HOST_ERROR
        if _HOST is None:
            comfyui_dir()  # skip/fail before touching anything
            if base_dir is None:
                _HOST_TMP = tempfile.mkdtemp(prefix="cosmos3-comfy-")
                base_dir = comfy_home(_HOST_TMP)
            try:
                _HOST = InProcessHost(Path(base_dir), cpu=cpu)
            except BaseException as e:
                if type(e).__module__.startswith(("_pytest", "pytest")):
                    raise
                _HOST_ERROR = e
                raise
        elif base_dir is not None and Path(base_dir).resolve() != _HOST.base_dir:
            raise ValueError(f"the in-process host already uses base_dir={_HOST.base_dir}; "
                             f"call get_executor() without base_dir and use host.base_dir")
        return _HOST


def pack_node_ids() -> list[str]:
    """Node ids the pack registered in the in-process host."""
    return get_executor().pack_node_ids()


def assert_pack_loaded() -> list[str]:
    """Fail with ComfyUI's import traceback unless the pack loaded in the in-process host."""
    return get_executor().assert_pack_loaded()


def _cleanup_session_home():
    if _HOST_TMP:
        shutil.rmtree(_HOST_TMP, ignore_errors=True)


import atexit  # noqa: E402

atexit.register(_cleanup_session_home)


# --------------------------------------------------------------------------------------------
# real server
# --------------------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ComfyServer:
    """``python main.py --cpu ...`` against ``base_dir`` as a subprocess (stdlib HTTP client).

        with ComfyServer(comfy_home(tmp_path)) as srv:
            pid = srv.queue(graph)
            entry = srv.wait(pid)           # history entry: {"status": ..., "outputs": ...}

    Start-up fails fast with the log tail if the process dies, after ``start_timeout`` s, or
    (``require_pack=True``) if the log reports ``IMPORT FAILED`` for the pack. The process group
    is killed on exit, also on exceptions. The log is ``base_dir/comfyui.log`` unless given.
    """

    def __init__(self, base_dir: os.PathLike | str, *, require_pack: bool = True, cpu: bool = True,
                 port: int | None = None, start_timeout: float = 120.0,
                 log_path: os.PathLike | str | None = None, extra_args: list[str] | None = None,
                 python: str | None = None, env: dict | None = None):
        self.base_dir = Path(base_dir).resolve()
        self.comfyui_dir = comfyui_dir()
        self.require_pack = require_pack
        self.cpu = cpu
        self.port = port or free_port()
        self.start_timeout = start_timeout
        self.log_path = Path(log_path) if log_path else self.base_dir / "comfyui.log"
        self.extra_args = list(extra_args or [])
        self.python = python or sys.executable
        self.env = env
        self.url = f"http://127.0.0.1:{self.port}"
        self.client_id = str(uuid.uuid4())
        self.proc: subprocess.Popen | None = None
        self._log_file = None
        self.startup_s: float | None = None

    # -- lifecycle -----------------------------------------------------------------------------
    def __enter__(self) -> "ComfyServer":
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def command(self) -> list[str]:
        cmd = [self.python, str(self.comfyui_dir / "main.py")]
        if self.cpu:
            cmd.append("--cpu")
        cmd += ["--listen", "127.0.0.1", "--port", str(self.port), "--base-directory", str(self.base_dir),
                "--disable-auto-launch", "--disable-api-nodes", "--database-url", "sqlite:///:memory:"]
        return cmd + self.extra_args

    def start(self) -> None:
        self.launch()
        self.wait_ready()

    def launch(self) -> None:
        """Start the process and return at once (``wait_ready`` waits for it: two servers can start together)."""
        self._t0 = time.monotonic()
        env = dict(os.environ if self.env is None else self.env)
        env["PYTHONUNBUFFERED"] = "1"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_file = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.command(), cwd=str(self.comfyui_dir), env=env,
                                     stdin=subprocess.DEVNULL, stdout=self._log_file,
                                     stderr=subprocess.STDOUT, start_new_session=True)

    def wait_ready(self) -> None:
        t0 = self._t0
        deadline = t0 + self.start_timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ComfyUI exited with code {self.proc.returncode} during start-up; "
                                   f"log {self.log_path}:\n{self.log_tail()}")
            try:
                self.get("/system_stats", timeout=2)
                break
            except (urllib.error.URLError, ConnectionError, OSError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"ComfyUI not ready after {self.start_timeout:.0f} s; "
                                   f"log {self.log_path}:\n{self.log_tail()}")
            time.sleep(0.25)
        self.startup_s = time.monotonic() - t0
        if self.require_pack:
            self.assert_pack_loaded()

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    proc.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    # -- log -----------------------------------------------------------------------------------
    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, n: int = 60) -> str:
        return "\n".join(self.log_text().splitlines()[-n:])

    def pack_import_failed(self) -> bool:
        return any("IMPORT FAILED" in line and PACK_NAME in line for line in self.log_text().splitlines())

    def assert_pack_loaded(self) -> list[str]:
        """Fail unless the log has no IMPORT FAILED for the pack and a Cosmos3* node is served."""
        if self.pack_import_failed():
            raise AssertionError(f"ComfyUI reports IMPORT FAILED for {PACK_NAME}; log {self.log_path}:\n"
                                 + self.log_tail(120))
        ids = self.pack_node_ids()
        if not any(i.startswith(NODE_PREFIX) for i in ids):
            raise AssertionError(f"server lists no {NODE_PREFIX}* node from {PACK_NAME} (got {ids}); "
                                 f"log:\n{self.log_tail(120)}")
        return ids

    def pack_node_ids(self) -> list[str]:
        info = self.object_info()
        return sorted(k for k, v in info.items() if v.get("python_module") == PACK_MODULE)

    # -- HTTP ----------------------------------------------------------------------------------
    def _request(self, method: str, path: str, body: Any = None, timeout: float = 30):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"} if data else {})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read()
        return json.loads(raw) if raw else None

    def get(self, path: str, timeout: float = 30):
        return self._request("GET", path, timeout=timeout)

    def post(self, path: str, body: Any, timeout: float = 30):
        return self._request("POST", path, body, timeout=timeout)

    def system_stats(self) -> dict:
        return self.get("/system_stats")

    def object_info(self, node_id: str | None = None):
        """All node infos (no argument), or one node's info dict, or None if not registered."""
        if node_id is None:
            return self.get("/object_info", timeout=120)
        return self.get(f"/object_info/{urllib.request.quote(node_id, safe='')}").get(node_id)

    def queue(self, prompt_graph: dict, extra_data: dict | None = None) -> str:
        """POST /prompt; returns the prompt_id. Raises PromptValidationError on a 400."""
        body = {"prompt": prompt_graph, "client_id": self.client_id}
        if extra_data:
            body["extra_data"] = extra_data
        try:
            resp = self.post("/prompt", body)
        except urllib.error.HTTPError as e:
            text = e.read().decode(errors="replace")
            try:
                j = json.loads(text)
            except ValueError:
                raise RuntimeError(f"POST /prompt -> HTTP {e.code}: {text}") from None
            raise PromptValidationError(j.get("error"), j.get("node_errors")) from None
        if resp.get("node_errors"):
            raise PromptValidationError(resp.get("error"), resp["node_errors"])
        return resp["prompt_id"]

    def wait(self, prompt_id: str, timeout: float = 120.0, poll: float = 0.25) -> dict:
        """Poll GET /history/<id> until the prompt finished; returns its history entry."""
        deadline = time.monotonic() + timeout
        while True:
            hist = self.get(f"/history/{prompt_id}")
            entry = (hist or {}).get(prompt_id)
            if entry is not None:
                status = entry.get("status") or {}
                if status.get("completed") or status.get("status_str") in ("success", "error"):
                    return entry
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"ComfyUI died (exit {self.proc.returncode}) while running {prompt_id}:\n"
                                   + self.log_tail())
            if time.monotonic() > deadline:
                raise TimeoutError(f"prompt {prompt_id} not finished after {timeout} s; log:\n{self.log_tail()}")
            time.sleep(poll)

    def run(self, prompt_graph: dict, timeout: float = 120.0) -> dict:
        """queue + wait; raises PromptExecutionError unless status_str == "success"."""
        entry = self.wait(self.queue(prompt_graph), timeout=timeout)
        status = entry.get("status") or {}
        if status.get("status_str") != "success":
            raise PromptExecutionError(_execution_error_text(status.get("messages")), status.get("messages"))
        return entry

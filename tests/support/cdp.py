"""A small Chrome DevTools Protocol client for the canvas test: headless Debian Chromium driven over a websocket.

    with Browser() as b:                 # chromium --headless=new on a free port, throwaway profile
        b.navigate("http://127.0.0.1:8188/")
        b.wait_for("window.app && app.graph")
        b.eval("app.graph._nodes.length")
        b.drop_file("/tmp/x.json", x, y)  # Input.dispatchDragEvent dragEnter/dragOver/drop with a real file
        b.click(x, y)                     # Input.dispatchMouseEvent press/release
        b.replace_text("721")             # Ctrl+A, type, Enter (into the focused box)
        b.screenshot(path)

JavaScript dialogs (the "Leave site?" ``beforeunload`` prompt a reload raises while the graph has unsaved changes)
are answered as they open (accepted) and recorded in ``dialogs``. Console errors and uncaught exceptions are kept in
``errors``. Needs ``websocket-client`` (PyPI) and Chromium (Debian's ``chromium`` package).
"""
from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import websocket

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")


def find_chromium() -> str | None:
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


class CDPError(RuntimeError):
    pass


class Browser:
    def __init__(self, width: int = 1600, height: int = 1000, timeout: float = 60.0):
        self.width, self.height, self.timeout = width, height, timeout
        self.profile = tempfile.mkdtemp(prefix="cosmos3-chromium-")
        self.proc: subprocess.Popen | None = None
        self.ws: websocket.WebSocket | None = None
        self._id = 0
        self.events: list[dict] = []
        self.dialogs: list[dict] = []
        self.errors: list[str] = []

    # -- lifecycle ----------------------------------------------------------------------------
    def __enter__(self) -> "Browser":
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> None:
        exe = find_chromium()
        if exe is None:
            raise RuntimeError("chromium not found: apt-get install chromium (tests/run.sh does this)")
        args = [exe, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--no-first-run", "--no-default-browser-check", "--disable-extensions", "--mute-audio",
                f"--user-data-dir={self.profile}", "--remote-debugging-port=0", "--remote-allow-origins=*",
                f"--window-size={self.width},{self.height}", "about:blank"]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     start_new_session=True)
        port_file = Path(self.profile) / "DevToolsActivePort"
        deadline = time.monotonic() + self.timeout
        while not (port_file.is_file() and port_file.read_text().strip()):
            if self.proc.poll() is not None:
                raise RuntimeError(f"chromium exited with code {self.proc.returncode} at start-up")
            if time.monotonic() > deadline:
                raise TimeoutError("chromium did not open its DevTools port")
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
            pages = [t for t in json.loads(r.read()) if t.get("type") == "page"]
        self.ws = websocket.create_connection(pages[0]["webSocketDebuggerUrl"], timeout=self.timeout,
                                              suppress_origin=True)
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable")
        self.call("Emulation.setDeviceMetricsOverride", width=self.width, height=self.height,
                  deviceScaleFactor=1, mobile=False)

    def resize(self, width: int, height: int) -> None:
        """The window's new size (the page sees a resize, as when a user resizes the browser window)."""
        self.width, self.height = width, height
        window = self.call("Browser.getWindowForTarget")["windowId"]
        self.call("Browser.setWindowBounds", windowId=window, bounds={"width": width, "height": height})
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1,
                  mobile=False)

    def close(self) -> None:
        if self.ws is not None:
            try:
                self.ws.close()
            except Exception:
                pass
            self.ws = None
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, 15)
                self.proc.wait(timeout=10)
            except Exception:
                try:
                    os.killpg(self.proc.pid, 9)
                except Exception:
                    pass
        self.proc = None
        shutil.rmtree(self.profile, ignore_errors=True)

    # -- protocol -----------------------------------------------------------------------------
    def _on_event(self, msg: dict) -> None:
        method, params = msg.get("method"), msg.get("params", {})
        self.events.append(msg)
        if method == "Page.javascriptDialogOpening":
            self.dialogs.append(params)
            self._send("Page.handleJavaScriptDialog", accept=True)
        elif method == "Runtime.exceptionThrown":
            d = params.get("exceptionDetails", {})
            self.errors.append(str(d.get("exception", {}).get("description") or d.get("text")))
        elif method == "Runtime.consoleAPICalled" and params.get("type") == "error":
            self.errors.append(" ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", [])))

    def _send(self, method: str, **params) -> int:
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        return self._id

    def call(self, method: str, timeout: float | None = None, **params) -> dict:
        want = self._send(method, **params)
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            self.ws.settimeout(max(0.1, deadline - time.monotonic()))
            try:
                msg = json.loads(self.ws.recv())
            except websocket.WebSocketTimeoutException:
                raise TimeoutError(f"CDP {method}: no answer") from None
            if msg.get("id") == want:
                if "error" in msg:
                    raise CDPError(f"CDP {method}: {msg['error']}")
                return msg.get("result", {})
            if "method" in msg:
                self._on_event(msg)
            if time.monotonic() > deadline:
                raise TimeoutError(f"CDP {method}: no answer")

    def pump(self, seconds: float = 0.0) -> None:
        """Handle events (dialogs!) arriving in the next ``seconds``."""
        deadline = time.monotonic() + seconds
        while True:
            left = deadline - time.monotonic()
            self.ws.settimeout(max(0.01, left))
            try:
                msg = json.loads(self.ws.recv())
            except websocket.WebSocketTimeoutException:
                return
            if "method" in msg:
                self._on_event(msg)
            if left <= 0:
                return

    # -- helpers ------------------------------------------------------------------------------
    def eval(self, expression: str, await_promise: bool = True):
        res = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=await_promise)
        if "exceptionDetails" in res:
            d = res["exceptionDetails"]
            raise CDPError(f"JS error in {expression[:80]!r}: {d.get('exception', {}).get('description') or d}")
        return res.get("result", {}).get("value")

    def wait_for(self, expression: str, timeout: float = 60.0, what: str | None = None):
        deadline = time.monotonic() + timeout
        while True:
            try:
                value = self.eval(expression)
            except CDPError:
                value = None
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out waiting for {what or expression}")
            self.pump(0.2)

    def navigate(self, url: str) -> None:
        self.call("Page.navigate", url=url)

    def reload(self) -> None:
        """``location.reload()`` as a user's F5 (its ``beforeunload`` dialog is answered as it opens)."""
        self._send("Runtime.evaluate", expression="setTimeout(() => location.reload(), 0); true")
        self.pump(2.0)

    def drop_file(self, path: str | Path, x: float, y: float) -> None:
        data = {"items": [], "files": [str(Path(path).resolve())], "dragOperationsMask": 1}
        for kind in ("dragEnter", "dragOver", "drop"):
            self.call("Input.dispatchDragEvent", type=kind, x=x, y=y, data=data)

    def click(self, x: float, y: float) -> None:
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1)

    def drag(self, x0: float, y0: float, x1: float, y1: float, steps: int = 5) -> None:
        self.call("Input.dispatchMouseEvent", type="mouseMoved", x=x0, y=y0)
        self.call("Input.dispatchMouseEvent", type="mousePressed", x=x0, y=y0, button="left", clickCount=1)
        for i in range(1, steps + 1):
            self.call("Input.dispatchMouseEvent", type="mouseMoved", x=x0 + (x1 - x0) * i / steps,
                      y=y0 + (y1 - y0) * i / steps, button="left", buttons=1)
        self.call("Input.dispatchMouseEvent", type="mouseReleased", x=x1, y=y1, button="left", clickCount=1)

    def key(self, key: str, code: str, key_code: int) -> None:
        for kind in ("keyDown", "keyUp"):
            self.call("Input.dispatchKeyEvent", type=kind, key=key, code=code, windowsVirtualKeyCode=key_code)

    def replace_text(self, text: str, enter: bool = True) -> None:
        """What a user does in a focused text box: select all (Ctrl+A), type ``text`` key by key, press Enter."""
        self.call("Input.dispatchKeyEvent", type="keyDown", key="a", code="KeyA", windowsVirtualKeyCode=65,
                  modifiers=2, commands=["selectAll"])
        self.call("Input.dispatchKeyEvent", type="keyUp", key="a", code="KeyA", windowsVirtualKeyCode=65, modifiers=2)
        for ch in text:  # one key press per character (what input widgets that filter keys, e.g. PrimeVue's, see)
            code = f"Digit{ch}" if ch.isdigit() else (f"Key{ch.upper()}" if ch.isalpha() else "")
            self.call("Input.dispatchKeyEvent", type="keyDown", key=ch, code=code, text=ch, unmodifiedText=ch,
                      windowsVirtualKeyCode=ord(ch.upper()) if ch.isalnum() else 0)
            self.call("Input.dispatchKeyEvent", type="keyUp", key=ch, code=code,
                      windowsVirtualKeyCode=ord(ch.upper()) if ch.isalnum() else 0)
        if enter:
            self.call("Input.dispatchKeyEvent", type="keyDown", key="Enter", code="Enter", windowsVirtualKeyCode=13,
                      text="\r")
            self.call("Input.dispatchKeyEvent", type="keyUp", key="Enter", code="Enter", windowsVirtualKeyCode=13)

    def screenshot(self, path: str | Path) -> Path:
        data = self.call("Page.captureScreenshot", format="png")["data"]
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path

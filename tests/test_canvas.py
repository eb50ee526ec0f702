"""The shipped UI workflows in ComfyUI's real frontend, in headless Chromium, against a real ComfyUI 0.3.75 server —
twice: with the frontend 0.3.75 serves (``comfyui_frontend_package`` 1.32.9) and with the newest one on PyPI
(``NEW_FRONTEND``, served through ComfyUI's ``--front-end-root``; tests/run.sh installs it beside the venv).

One ``main.py --cpu`` server per frontend (tiny random checkpoints, test inputs) and one headless Debian Chromium
driven over the Chrome DevTools Protocol (tests/support/cdp.py). For every UI workflow in ``example_workflows/``
(test_workflows' glob):

* the file is dropped onto ``#graph-canvas`` (``Input.dispatchDragEvent`` with the real file) with the tiny
  checkpoint and the test inputs picked in its combo widgets (as a user picks them) and every number as shipped;
* no missing-node dialog and no error toast appear, every node's type is registered in the frontend;
* it opens readable with the frontends' default settings: the saved viewport (``extra.ds``) is at or above the
  level-of-detail zoom (``LiteGraph.Canvas.MinFontSizeForLOD``, 8 px of 14 px text: 0.571), so
  ``app.canvas.low_quality`` is false and titles, widgets and the Read me are drawn; it shows every node whole inside
  ``FREE`` (the canvas left free by the frontend's bars in the 1600×1000 window), and every node's title fits its
  node;
* the numbers the tiny run needs (sizes, frames, steps, ...; ``shrink_api``'s values) are TYPED into their widgets
  as a user does (click the widget, Ctrl+A, type, Enter); a stepped widget first gets the value one below (off its
  grid: it must snap to the valid value, e.g. 720 → 721 frames), then the value itself; each widget must then hold
  exactly that value;
* the **Run** button is clicked (a real mouse event), the prompt finishes with ``success`` in /history, the graph the
  frontend queued carries the typed values and its output file reads back with them (frames, size, fps, sound);
* a screenshot of the canvas before and after the run is kept in ``$COSMOS3_ARTIFACTS/canvas/<frontend>`` (default
  ``<repo>/.out/canvas``).

Also: every stepped INT widget of every pack node, typed on and off its grid near its ends, holds only valid values
(and in "Nodes 2.0", where a number is an HTML text box, the Long Video's frame counts and width do too);
ComfyUI's Templates listing (``/api/workflow_templates``) shows exactly the UI workflows (no API twins), each with its
``.jpg`` served, and the real Templates dialog (the pack's category) shows that ``.jpg`` on every card under a title
that is not cut off (``templates_dialog.png``); a reload with unsaved workflows raises the "Leave site?" dialog, which
is answered, and the app comes back.

Every template opens the same way in a 1920×1080 window (its saved viewport is absolute: the graph keeps its place,
the bars move out). The Templates dialog shows the pack's cards in ``web/template_order.json``'s order (the common
modes first; the pack's frontend extension sorts them), each with its rendered picture
(``example_workflows/thumbnails.py``).

``COSMOS3_UPDATE_TEMPLATES=1`` (with the bundled frontend) rewrites each UI workflow's ``extra.ds`` to frame its graph
in ``FREE`` (at most zoom 1).

What the newest frontend cannot do with the 0.3.75 backend (example_workflows/README.md): its queue and history panels read
``/api/jobs``, which 0.3.75 lacks (404; the panels stay empty and the console logs the error). Running, previews,
outputs and templates work; this test ignores only those ``/api/jobs`` console errors.
"""
from __future__ import annotations

import json
import os
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from support import comfy_host
from test_workflows import (
    ALL_WORKFLOWS,
    TEMPLATE_ORDER,
    check_mp4,
    check_outputs,
    ensure_tiny_checkpoints,
    load_api,
    load_ui,
    nodes_of,
    schema_inputs,
    shrink_api,
    source_node,
    thumbnail_path,
    ui_path,
    widget_slots,
    write_test_inputs,
)

pytestmark = pytest.mark.comfy

BUNDLED_FRONTEND = "1.32.9"  # what ComfyUI 0.3.75's requirements install
NEW_FRONTEND = "1.58.1"  # the newest comfyui-frontend-package on PyPI (tests/run.sh pins the same)
FRONTENDS = ("bundled", "newest")
ARTIFACTS = Path(os.environ.get("COSMOS3_ARTIFACTS", comfy_host.REPO_ROOT / ".out")) / "canvas"
UPDATE = os.environ.get("COSMOS3_UPDATE_TEMPLATES") == "1"
APP_READY = ("window.app && window.app.graph && window.LiteGraph && "
             "!!LiteGraph.registered_node_types['Cosmos3Loader'] && !!document.querySelector('#graph-canvas')")
# No first-run template dialog, no minimap over the graph; every level-of-detail setting as the frontends ship it.
SETTINGS = {"Comfy.TutorialCompleted": True, "Comfy.Minimap.Visible": False, "Comfy.Graph.CanvasInfo": False}
WINDOW, WIDE_WINDOW = (1600, 1000), (1920, 1080)
# The canvas each window leaves free of both frontends' bars (1.32.9's "Nodes 2.0" banner, the tabs and menu on top,
# the workflow name and the Run bar floating below them, the side bar on the left, the zoom controls bottom right):
# x0, y0, x1, y1 in pixels.
FREE = (72, 136, 1580, 940)
WIDE_FREE = (72, 136, 1900, 1020)
CLIP_FRAMES = 13  # write_test_inputs' clip: Transfer's length when the cap (num_frames) is above it


def canvas_shrink(mode: str) -> dict:
    """``shrink_api`` arguments of the canvas runs: one step and 5 frames (half the run time of the default 9 and
    2), 9 frames where the workflow needs more than 2 latent frames (first+last frame, video continuation, windows)."""
    return dict(frames=9 if mode in ("flf2v", "v2v", "long_t2v", "transfer") else 5, steps=1,
                prefix=f"cosmos3_canvas/{mode}")


@pytest.fixture(scope="module")
def browser():
    try:
        from support import cdp
    except ImportError as exc:  # never a silent skip in CI
        pytest.fail(f"the canvas test needs websocket-client (tests/run.sh installs it): {exc}")
    if cdp.find_chromium() is None:
        pytest.fail("chromium is not installed: tests/run.sh installs it with apt-get (Debian's chromium package)")
    with cdp.Browser(width=WINDOW[0], height=WINDOW[1]) as b:
        yield b


def new_frontend_root() -> Path:
    raw = os.environ.get("COSMOS3_NEW_FRONTEND_ROOT", "")
    root = Path(raw) if raw else None
    if root is None or not (root / "index.html").is_file():
        pytest.fail(f"comfyui-frontend-package {NEW_FRONTEND} is not installed (COSMOS3_NEW_FRONTEND_ROOT="
                    f"{raw!r}): run the tests with `bash tests/run.sh`, which installs it beside the venv")
    return root


@pytest.fixture(scope="module")
def servers(tmp_path_factory, tiny_checkpoint):
    """Both servers, launched together (the second one starts while the first pass runs) and stopped at the end."""
    wanted = ("bundled",) if UPDATE else FRONTENDS
    out = {}
    try:
        for frontend in wanted:
            base = comfy_host.comfy_home(tmp_path_factory.mktemp(f"canvas-{frontend}"))
            ensure_tiny_checkpoints(base / "models" / "diffusers", tiny_checkpoint)
            write_test_inputs(base / "input")
            settings = base / "user" / "default" / "comfy.settings.json"
            settings.parent.mkdir(parents=True, exist_ok=True)
            settings.write_text(json.dumps(SETTINGS))  # no first-run template dialog, no minimap over the graph
            extra = ["--front-end-root", str(new_frontend_root())] if frontend == "newest" else []
            srv = comfy_host.ComfyServer(base, require_pack=True, extra_args=extra, start_timeout=300)
            srv.frontend, srv.artifacts = frontend, ARTIFACTS / frontend
            srv.launch()
            out[frontend] = srv
        yield out
    finally:
        for srv in out.values():
            srv.stop()


@pytest.fixture(scope="module", params=FRONTENDS)
def server(request, servers):
    if request.param not in servers:
        pytest.skip("COSMOS3_UPDATE_TEMPLATES=1 writes the templates with the bundled frontend only")
    srv = servers[request.param]
    if srv.startup_s is None:
        srv.wait_ready()
        srv.infos = srv.object_info()  # every node's schema, once (what the frontend also reads at start)
    return srv


@pytest.fixture(scope="module")
def page(server, browser):
    t0 = time.monotonic()
    browser.navigate(server.url + "/")
    browser.wait_for(APP_READY, timeout=180, what="the ComfyUI frontend with the Cosmos3 nodes")
    browser.pump(1.0)
    browser.load_s = time.monotonic() - t0
    version = browser.eval("window.__COMFYUI_FRONTEND_VERSION__")
    assert version == {"bundled": BUNDLED_FRONTEND, "newest": NEW_FRONTEND}[server.frontend], version
    # errors while the app starts are the frontend's own (1.32.9 logs a TypeError in a settings onChange with any
    # settings, with or without this pack); none may come from the pack
    ours = [e for e in browser.errors if "cosmos3" in e.lower()]
    assert not ours, ours
    browser.errors.clear()
    return browser


# -------------------------------------------------------------------------------------------- helpers

def typed_values(server, mode: str, ui: dict) -> list[tuple[int, str, object]]:
    """(node id, widget, value) for every number ``shrink_api`` changes in the workflow: what the test types."""
    small = shrink_api(load_api(mode), **canvas_shrink(mode))
    out = []
    for node in ui["nodes"]:
        nid = str(node["id"])
        if nid not in small:
            continue  # a frontend-only note
        info = server.infos.get(node["type"])
        kinds = schema_inputs(info)
        for (name, kind), shipped in zip(widget_slots(info), node.get("widgets_values") or []):
            value = small[nid]["inputs"].get(name)
            if (kind == "value" and kinds[name]["type"] in ("INT", "FLOAT") and name in small[nid]["inputs"]
                    and source_node(small, value) is None and value != shipped):
                out.append((node["id"], name, value))
    return out


def picked_ui(server, mode: str) -> dict:
    """The UI workflow with ``shrink_api``'s combo and text values (the tiny checkpoint, the test inputs, output
    prefixes, fp32): what a user picks from lists; numbers stay as shipped (they are typed)."""
    ui = load_ui(mode)
    small = shrink_api(load_api(mode), **canvas_shrink(mode))
    for node in ui["nodes"]:
        nid = str(node["id"])
        if nid not in small:
            continue
        info = server.infos.get(node["type"])
        kinds = schema_inputs(info)
        values = node.get("widgets_values") or []
        for i, (name, kind) in enumerate(widget_slots(info)[:len(values)]):
            literal = small[nid]["inputs"].get(name)
            if (kind == "value" and name in small[nid]["inputs"] and source_node(small, literal) is None
                    and kinds[name]["type"] not in ("INT", "FLOAT")):
                values[i] = literal
    return ui


def graph_state(b) -> dict:
    return b.eval("""(() => {
        const dialogs = [...document.querySelectorAll('.p-dialog, [role=dialog]')].map(
            d => d.textContent.trim().slice(0, 300));
        const toasts = [...document.querySelectorAll('.p-toast-message, [data-sonner-toast]')].map(
            t => ({cls: t.className + ' ' + (t.getAttribute('data-type') || ''),
                   text: t.textContent.trim().slice(0, 300)}));
        const nodes = app.graph._nodes.map(n => ({
            id: n.id, type: n.type, registered: !!LiteGraph.registered_node_types[n.type], errors: !!n.has_errors,
            widgets: Object.fromEntries((n.widgets || []).map(w => [w.name, w.value]))}));
        return {dialogs, toasts, nodes};
    })()""")


def assert_clean(state: dict, what: str) -> None:
    missing = [d for d in state["dialogs"] if "missing" in d.lower() or "not found" in d.lower()]
    assert not missing, f"{what}: missing-node dialog: {missing}"
    errors = [t for t in state["toasts"] if "error" in t["cls"]]
    assert not errors, f"{what}: error toast: {errors}"
    unregistered = [(n["id"], n["type"]) for n in state["nodes"] if not n["registered"] or n["errors"]]
    assert not unregistered, f"{what}: nodes not registered in the frontend: {unregistered}"


def drop(b, path: Path, n_nodes: int) -> None:
    b.eval("app.graph.clear(); true")  # so the wait below sees the dropped graph, not the previous one
    b.drop_file(path, 800, 500)
    b.wait_for(f"app.graph._nodes.length === {n_nodes}", timeout=30, what=f"{path.name} on the canvas")
    b.pump(0.25)


def node_boxes(b) -> list:
    """[id, title, x0, y0, x1, y1 (screen px, title bar included), title width + its margins (px)] per node."""
    return b.eval("""(() => {
        const ds = app.canvas.ds, r = document.querySelector('#graph-canvas').getBoundingClientRect();
        const ctx = document.createElement('canvas').getContext('2d');
        return app.graph._nodes.map(n => {
            const [x, y, w, h] = n.getBounding();
            const title = n.getTitle ? n.getTitle() : n.title;
            ctx.font = n.titleFontStyle;  // the frontend draws the title in width - 2 title heights, else cuts it
            const need = ctx.measureText(title).width + 2 * LiteGraph.NODE_TITLE_HEIGHT;
            return [n.id, title, r.x + (x + ds.offset[0]) * ds.scale, r.y + (y + ds.offset[1]) * ds.scale,
                    r.x + (x + w + ds.offset[0]) * ds.scale, r.y + (y + h + ds.offset[1]) * ds.scale, need, w,
                    n.collapsed || n.type === 'MarkdownNote' || n.type === 'Note'];
        });
    })()""")


def assert_readable(b, mode: str, free: tuple) -> None:
    """As opened: drawn in full (not the frontend's low-quality mode, which leaves out titles, widgets and the Read
    me's text), at the saved zoom, every node whole inside ``free`` and every title fitting its node."""
    view = b.eval("({low: app.canvas.low_quality, scale: app.canvas.ds.scale, "
                  "font: app.extensionManager.setting.get('LiteGraph.Canvas.MinFontSizeForLOD')})")
    saved = load_ui(mode)["extra"]["ds"]["scale"]
    assert view["scale"] == pytest.approx(saved), (mode, view, saved)
    assert view["font"] == 8, f"the frontend's level-of-detail font size is {view['font']}, not its default 8"
    assert view["low"] is False, f"{mode} opens in low-quality mode at zoom {view['scale']} ({view})"
    for nid, title, x0, y0, x1, y1, need, width, free_title in node_boxes(b):
        assert free[0] <= x0 and free[1] <= y0 and x1 <= free[2] and y1 <= free[3], \
            f"{mode}: node {nid} ({title}) at {[round(v) for v in (x0, y0, x1, y1)]} is outside the view {free}"
        assert free_title or need <= width, f"{mode}: the title {title!r} needs {need:.0f} px, node {nid} is {width}"


def frame_graph(b) -> dict:
    """The ``extra.ds`` that centres the graph (as the frontend lays it out) in ``FREE``."""
    bounds = b.eval("""(() => { const bs = app.graph._nodes.map(n => n.getBounding());
        return [Math.min(...bs.map(b => b[0])), Math.min(...bs.map(b => b[1])),
                Math.max(...bs.map(b => b[0] + b[2])), Math.max(...bs.map(b => b[1] + b[3]))]; })()""")
    x0, y0, x1, y1 = bounds
    pad = 12
    w, h = FREE[2] - FREE[0] - 2 * pad, FREE[3] - FREE[1] - 2 * pad
    scale = round(min(w / (x1 - x0), h / (y1 - y0), 1.0) - 0.0005, 3)
    ox = (FREE[0] + (FREE[2] - FREE[0] - (x1 - x0) * scale) / 2) / scale - x0
    oy = (FREE[1] + (FREE[3] - FREE[1] - (y1 - y0) * scale) / 2) / scale - y0
    return {"scale": scale, "offset": [round(ox, 1), round(oy, 1)]}


def node_js(nid) -> str:
    """The JavaScript expression of node ``nid`` (1.32.9 keeps ids as numbers, 1.58 as strings)."""
    return f"app.graph._nodes.find(n => String(n.id) === {json.dumps(str(nid))})"


def show_widget(b, nid: int, name: str) -> list:
    """The screen point of the widget's value, as the canvas shows it now; when the widget is too small there (below
    0.3 scale), off screen or under a bar, the view first pans and zooms (scale 1) to put it mid-canvas, as a user
    would before editing."""
    return b.eval(f"""(() => {{
        const n = {node_js(nid)}, w = n.widgets.find(w => w.name === {json.dumps(name)});
        const ds = app.canvas.ds, c = document.querySelector('#graph-canvas'), r = c.getBoundingClientRect();
        if (!n.widgets.some(v => v.y)) app.canvas.draw(true, true);  // a node never drawn: lay its widgets out
        const gx = n.pos[0] + n.size[0] / 2;
        const gy = n.pos[1] + w.y + (w.computedHeight || LiteGraph.NODE_WIDGET_HEIGHT) / 2;
        let x = r.x + (gx + ds.offset[0]) * ds.scale, y = r.y + (gy + ds.offset[1]) * ds.scale;
        if (ds.scale < 0.3 || document.elementFromPoint(x, y) !== c) {{
            ds.scale = 1; ds.offset[0] = r.width / 2 - gx; ds.offset[1] = r.height / 2 - gy;
            app.canvas.setDirty(true, true);
            x = r.x + r.width / 2; y = r.y + r.height / 2;
        }}
        return [x, y];
    }})()""")


def widget_value(b, nid: int, name: str):
    return b.eval(f"{node_js(nid)}.widgets.find(w => w.name === {json.dumps(name)}).value")


def type_into_widget(b, nid: int, name: str, text: str):
    """Click the number widget (the frontend opens its value box, focused), Ctrl+A, type, Enter; the value held."""
    x, y = show_widget(b, nid, name)
    b.click(x, y)
    b.wait_for("!!document.querySelector('.graphdialog input') && "
               "document.activeElement === document.querySelector('.graphdialog input')",
               timeout=5, what=f"the value box of widget {name!r} (node {nid})")
    b.replace_text(text)
    b.wait_for("!document.querySelector('.graphdialog input')", timeout=5, what="the value box to close")
    return widget_value(b, nid, name)


def click_run(b) -> None:
    center = b.eval("""(() => {
        const btn = document.querySelector('[data-testid="queue-button"]')
            || [...document.querySelectorAll('button')].find(x => x.getAttribute('aria-label') === 'Run');
        if (!btn) return null;
        const r = btn.getBoundingClientRect();
        return [r.x + r.width / 2, r.y + r.height / 2];
    })()""")
    assert center, "no Run button in the frontend"
    b.click(*center)


def run_from_the_run_button(b, server, timeout: float = 300.0) -> dict:
    """Click **Run** and wait for the prompt it queued; its history entry."""
    before = set(server.get("/history"))
    click_run(b)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        new = [k for k in server.get("/history") if k not in before]
        if new:
            return server.wait(new[0], timeout=max(1.0, deadline - time.monotonic()))
        time.sleep(0.1)
    raise TimeoutError(f"the Run button queued nothing within {timeout} s; log:\n{server.log_tail()}")


def output_items(base_dir: Path, outputs: dict) -> list[Path]:
    return [base_dir / "output" / item.get("subfolder", "") / item["filename"]
            for ui_out in outputs.values() for items in ui_out.values() if isinstance(items, list)
            for item in items if isinstance(item, dict) and item.get("type") == "output" and "filename" in item]


def check_run(server, mode: str, api: dict, outputs: dict) -> list[Path]:
    """The files a finished run wrote, read back against the values in the graph the frontend queued."""
    if nodes_of(api, "Cosmos3TextEncode"):
        return check_outputs(server.base_dir, mode, api, outputs)
    files = output_items(server.base_dir, outputs)
    assert files and all(f.is_file() for f in files), (files, outputs)
    for nid in nodes_of(api, "Cosmos3LongVideo"):  # the mp4 it wrote: the typed length, size and fps
        inp = api[nid]["inputs"]
        controlled = any(source_node(api, inp.get(k)) is not None for k in ("edge", "blur", "depth", "seg", "wsm"))
        frames = min(CLIP_FRAMES, inp["num_frames"]) if controlled else inp["num_frames"]
        (mp4,) = [f for f in files if f.suffix == ".mp4"]
        check_mp4(mp4, inp["width"], inp["height"], frames, inp["fps"], audio=inp["sound"])
    return files


def write_viewport(mode: str, ds: dict) -> None:
    path = ui_path(mode)
    ui = json.loads(path.read_text())
    ui.setdefault("extra", {})["ds"] = ds
    path.write_text(json.dumps(ui, indent=2, ensure_ascii=False) + "\n")


# -------------------------------------------------------------------------------------------- tests

def test_stepped_int_widgets_hold_only_valid_values_as_typed(server, page):
    """Every pack node's INT widgets with a step, typed as a user types: on the grid near both ends (kept), one off
    it (snapped to the nearest valid value), past max (clamped to max, itself valid)."""
    b = page
    b.eval("app.graph.clear(); true")
    cases = []
    infos = {k: v for k, v in server.infos.items() if v.get("python_module") == comfy_host.PACK_MODULE}
    for node_id, info in sorted(infos.items()):
        for name, s in schema_inputs(info).items():
            if s["type"] == "INT" and s["widget"] and (s["opts"].get("step") or 1) > 1:
                cases.append((node_id, name, s["opts"]["min"], s["opts"]["max"], s["opts"]["step"]))
    assert len(cases) >= 8, cases
    for node_id, name, lo, hi, step in cases:
        nid = b.eval(f"""(() => {{ const n = LiteGraph.createNode({json.dumps(node_id)}); n.pos = [100, 100];
            app.graph.add(n); return n.id; }})()""")
        typed = {lo: lo, lo + 2 * step - 1: lo + 2 * step, lo + 3 * step + 1: lo + 3 * step, hi - step: hi - step,
                 hi + 1000: hi}
        for text, want in typed.items():
            held = type_into_widget(b, nid, name, str(text))
            assert held == want, f"{node_id}.{name}: typed {text}, the widget holds {held} (want {want})"
        b.eval(f"app.graph.remove({node_js(nid)}); true")


def test_stepped_int_widgets_in_nodes_2_0(server, page):
    """The same typing in "Nodes 2.0" (``Comfy.VueNodes.Enabled``: nodes drawn as HTML, a number is a text box):
    click the box, Ctrl+A, type, Tab; the widget holds the snapped valid value."""
    b = page
    b.eval("app.extensionManager.setting.set('Comfy.VueNodes.Enabled', true)")
    try:
        b.eval("app.graph.clear(); true")
        nid = b.eval("""(() => { const n = LiteGraph.createNode('Cosmos3LongVideo'); n.pos = [100, 100];
            app.graph.add(n); return String(n.id); })()""")
        box = ("[...document.querySelectorAll('[data-node-id=\"%s\"] input')].find(i => { let e = i;"
               " for (let k = 0; k < 8 && e; k++, e = e.parentElement) if ((e.textContent || '').trim()"
               ".startsWith(%s)) return true; return false; })")
        b.wait_for(box % (nid, json.dumps("num_frames")), timeout=15, what="the Nodes 2.0 text box of num_frames")
        for name, text, want in (("num_frames", "16", 17), ("num_frames", "720", 721), ("num_frames", "3", 5),
                                 ("num_frames", "99999", 14401), ("frames_per_chunk", "8", 9), ("width", "500", 496)):
            x, y = b.eval(f"(() => {{ const r = {box % (nid, json.dumps(name))}.getBoundingClientRect();"
                          f" return [r.x + r.width / 2, r.y + r.height / 2]; }})()")
            b.click(x, y)
            b.replace_text(text, enter=False)
            b.key("Tab", "Tab", 9)
            try:
                b.wait_for(f"{node_js(nid)}.widgets.find(w => w.name === {json.dumps(name)}).value === {want}",
                           timeout=5)
            except TimeoutError:
                pytest.fail(f"Nodes 2.0: typed {text} into {name}, the widget holds {widget_value(b, nid, name)} "
                            f"(want {want})")
    finally:
        b.eval("app.extensionManager.setting.set('Comfy.VueNodes.Enabled', false)")
        b.eval("app.graph.clear(); true")
        b.pump(0.5)


@pytest.mark.parametrize("mode", ALL_WORKFLOWS)
def test_workflow_typed_on_canvas_runs_from_the_run_button(server, page, tmp_path, mode):
    b = page
    ui_file = ui_path(mode)
    if UPDATE:  # the viewport of the shipped file, as the frontend lays it out
        drop(b, ui_file, len(load_ui(mode)["nodes"]))
        write_viewport(mode, frame_graph(b))
    ui = picked_ui(server, mode)
    path = tmp_path / ui_file.name  # same name: the workflow tab shows the template's title
    path.write_text(json.dumps(ui))
    drop(b, path, len(ui["nodes"]))
    state = graph_state(b)
    assert_clean(state, f"{mode} after the drop")
    b.screenshot(server.artifacts / f"{mode}_opened.png")

    # drawn in full at the saved viewport, which frames the whole graph; every title fits its node
    assert_readable(b, mode, FREE)

    # every shipped widget value is shown (the numbers before typing)
    by_id = {str(n["id"]): n for n in state["nodes"]}  # 1.58 keeps node ids as strings
    for node in ui["nodes"]:
        info = server.infos.get(node["type"])
        if not node.get("widgets_values") or info is None:  # a frontend-only note
            continue
        widgets = by_id[str(node["id"])]["widgets"]
        for (name, kind), value in zip(widget_slots(info), node["widgets_values"]):
            if kind == "upload":
                continue
            shown = widgets.get("control_after_generate" if kind == "control" else name)
            if kind == "value" and schema_inputs(info)[name]["type"] in ("INT", "FLOAT"):
                assert shown is not None and float(shown) == float(value), (mode, node["type"], name, shown, value)
            else:
                assert shown == value, (mode, node["type"], name, shown, value)

    # the tiny run's numbers, typed
    typed = typed_values(server, mode, ui)
    assert typed, f"{mode}: nothing to type"
    types = {n["id"]: n["type"] for n in ui["nodes"]}
    for nid, name, value in typed:
        step = schema_inputs(server.infos[types[nid]])[name]["opts"].get("step") or 1
        if isinstance(value, int) and step > 1:  # off the grid first: the frontend must snap it to the value
            held = type_into_widget(b, nid, name, str(value - 1))
            assert held == value, f"{mode}: typed {value - 1} into {types[nid]}.{name} (step {step}), it holds {held}"
        held = type_into_widget(b, nid, name, str(value))
        assert held == value, f"{mode}: typed {value} into {types[nid]}.{name}, it holds {held}"

    entry = run_from_the_run_button(b, server)
    status = entry.get("status") or {}
    b.key(".", "Period", 190)  # fit view, for the screenshot
    b.pump(0.2)
    b.screenshot(server.artifacts / f"{mode}_after_run.png")
    assert status.get("status_str") == "success", json.dumps(status.get("messages"), default=str)[:3000]
    api = entry["prompt"][2]  # what the frontend queued: its own conversion of the canvas
    assert {n["class_type"] for n in api.values()} == {n["class_type"] for n in load_api(mode).values()}
    for nid, name, value in typed:  # the typed values went into the run
        node = api[str(nid)]["inputs"]
        assert node[name] == value, (mode, nid, name, node[name], value)
    check_run(server, mode, api, entry["outputs"])
    assert_clean(graph_state(b), f"{mode} after the run")


def test_every_template_opens_readable_in_a_1920x1080_window(server, page, tmp_path):
    """The same workflows, opened in a larger window: the saved viewport keeps the graph where it was (drawn in full,
    inside what the bars leave free); the window goes back to 1600×1000 afterwards."""
    b = page
    b.resize(*WIDE_WINDOW)
    try:
        b.wait_for(f"document.querySelector('#graph-canvas').getBoundingClientRect().right > {WINDOW[0]}",
                   timeout=10, what="the canvas to fill the wider window")
        for mode in ALL_WORKFLOWS:
            ui = picked_ui(server, mode)
            path = tmp_path / ui_path(mode).name
            path.write_text(json.dumps(ui))
            drop(b, path, len(ui["nodes"]))
            assert_clean(graph_state(b), f"{mode} in {WIDE_WINDOW}")
            b.screenshot(server.artifacts / f"{mode}_opened_{WIDE_WINDOW[0]}x{WIDE_WINDOW[1]}.png")
            assert_readable(b, mode, WIDE_FREE)
    finally:
        b.resize(*WINDOW)
        b.pump(0.5)


def test_a_checkpoint_that_is_not_there_is_refused_on_run_with_the_fix(server, page):
    """The shipped Text to Image as it comes: its checkpoint ``Cosmos3-Nano`` stands for no folder here (this server
    holds several Nano-type tiny checkpoints under other names), so **Run** is refused before anything runs and the
    frontend holds the loader's message (``app.lastNodeErrors``, which also outlines the node): the checkpoints found, the folders searched, "pick
    one in Load Cosmos3 Checkpoint" — 1.32.9 shows it in its error dialog, 1.58.1 in the details of its "Invalid
    input" toast naming the node."""
    b = page
    mode = "t2i"
    drop(b, ui_path(mode), len(load_ui(mode)["nodes"]))
    (loader,) = [n["id"] for n in load_ui(mode)["nodes"] if n["type"] == "Cosmos3Loader"]
    before, seen = set(server.get("/history")), len(b.errors)
    click_run(b)
    held = f"JSON.stringify(app.lastNodeErrors && app.lastNodeErrors[{json.dumps(str(loader))}] || null)"
    b.wait_for(f"{held} !== 'null'", timeout=20, what="the loader's validation error")
    (error,) = json.loads(b.eval(held))["errors"]
    for needle in ("Cosmos3Loader: checkpoint 'Cosmos3-Nano' was not found and",
                   "pick one in Load Cosmos3 Checkpoint — in ", "'cosmos3-tiny-nano' (Nano)",
                   "models/diffusers: "):
        assert needle in error["details"], (needle, error)
    on_screen = ("pick one in Load Cosmos3 Checkpoint" if server.frontend == "bundled"
                 else "Load Cosmos3 Checkpoint rejected the value for checkpoint")
    b.wait_for(f"document.body.innerText.includes({json.dumps(on_screen)})", timeout=10, what=on_screen)
    b.screenshot(server.artifacts / "missing_checkpoint_refused.png")
    assert set(server.get("/history")) == before, "something ran"
    refused = [e for e in b.errors[seen:] if e.startswith("PromptExecutionError")]  # the frontend logs the refusal
    assert len(refused) == len(b.errors[seen:]) == 1, b.errors[seen:]
    del b.errors[seen:]
    closed = b.eval(f"""(() => {{  // the close (x) of the smallest box showing the refusal
        const close = 'button[aria-label=Close], .p-dialog-close-button';
        let box = [...document.querySelectorAll('*')].filter(e => (e.innerText || '').includes({json.dumps(on_screen)})).pop();
        while (box && !box.querySelector(close)) box = box.parentElement;
        if (box) box.querySelector(close).click();
        return !!box;
    }})()""")
    assert closed, "no close (x) button on the refusal"
    b.wait_for(f"!document.body.innerText.includes({json.dumps(on_screen)})", timeout=10, what="the refusal closed")


def test_templates_list_ui_workflows_with_thumbnails(server):
    listing = server.get("/api/workflow_templates")
    names = sorted(listing.get(comfy_host.PACK_NAME, []))
    assert names == sorted(ui_path(m).stem for m in ALL_WORKFLOWS), listing  # no API twin, no stray file
    for mode in ALL_WORKFLOWS:
        url = f"/api/workflow_templates/{comfy_host.PACK_NAME}/{urllib.parse.quote(thumbnail_path(mode).name)}"
        with urllib.request.urlopen(server.url + url, timeout=30) as r:
            assert r.status == 200 and r.headers.get("Content-Type") == "image/jpeg", (url, r.headers)
            assert r.read(3) == b"\xff\xd8\xff"  # a JPEG


def test_templates_dialog_cards_show_the_thumbnails(server, page):
    """The real Templates dialog (Comfy.BrowseTemplates), the pack's category: one card per UI workflow in
    ``web/template_order.json``'s order (the pack's frontend extension sorts the file-system listing), titled by the
    file name without being cut off, whose picture is our ``.jpg`` (fetched once the card is in view). Screenshots:
    the first cards (``templates_dialog.png``) and the last (``templates_dialog_end.png``)."""
    b = page
    titles = list(TEMPLATE_ORDER)
    b.eval("app.extensionManager.command.execute('Comfy.BrowseTemplates'); true")
    pack = json.dumps(comfy_host.PACK_NAME)
    labels = f"[...document.querySelectorAll('[role=dialog] *')].filter(e => !e.children.length && " \
             f"e.textContent.trim() === {pack})"
    b.wait_for(f"{labels}.length > 0", timeout=30, what="the Templates dialog with the pack's category")
    b.eval(f"(() => {{ const nav = {labels}; nav[nav.length - 1].click(); return true; }})()")
    cards = "[...document.querySelectorAll('[role=dialog] [data-testid^=\"template-workflow-\"]')]" \
            ".filter(c => c.getAttribute('data-testid') !== 'template-workflow-detail')"
    b.wait_for(f"{cards}.length === {len(titles)}", timeout=30, what=f"{len(titles)} cards in the pack's category")
    names = b.eval(f"{cards}.map(c => c.getAttribute('data-testid').slice('template-workflow-'.length))")
    assert names == titles, names
    card = ("(() => {{ const c = {cards}[{i}], im = c.querySelector('img'), h = c.querySelector('h3'); "
            "return {what}; }})()")
    loaded = {}
    for i in range(len(titles)):
        b.eval(f"{cards}[{i}].scrollIntoView({{block: 'center'}}); true")
        b.wait_for(card.format(cards=cards, i=i, what="!!im && im.complete && im.naturalWidth > 0"),
                   timeout=15, what=f"the thumbnail of template card {names[i]!r}")
        src, w, h, title, cut = b.eval(card.format(cards=cards, i=i, what=(
            "[im.src, im.naturalWidth, im.naturalHeight, h.textContent.trim(), "
            "h.scrollWidth > h.clientWidth + 1 || h.scrollHeight > h.clientHeight + 1]")))
        assert "default-template" not in src, f"template card {names[i]!r} shows the frontend's placeholder: {src}"
        assert title == names[i] and not cut, f"the card's title {title!r} is cut off"
        loaded[names[i]] = [w, h]
    b.screenshot(server.artifacts / "templates_dialog_end.png")
    b.eval(f"{cards}[0].scrollIntoView({{block: 'end'}}); true")
    b.pump(0.5)
    b.screenshot(server.artifacts / "templates_dialog.png")
    from PIL import Image

    for mode in ALL_WORKFLOWS:  # the picture shown is our file (its size), not the frontend's default-template.png
        with Image.open(thumbnail_path(mode)) as im:
            assert loaded[ui_path(mode).stem] == list(im.size), (mode, loaded[ui_path(mode).stem], im.size)
    closed = b.eval("""(() => {
        const dlg = document.querySelector('[data-testid="template-workflows-content"]').closest('[role=dialog]');
        const btn = [...dlg.querySelectorAll('button')].find(x => /close/i.test(x.getAttribute('aria-label') || '')
            || x.querySelector('[class*="lucide--x"], .pi-times'));
        if (btn) btn.click();
        return !!btn;
    })()""")
    assert closed, "no close (x) button on the Templates dialog"
    b.wait_for(f"{cards}.length === 0", timeout=10, what="the Templates dialog to close")


def test_reload_with_unsaved_workflows_asks_to_leave(server, page):
    b = page
    mode = ALL_WORKFLOWS[0]
    drop(b, ui_path(mode), len(load_ui(mode)["nodes"]))  # a freshly opened workflow is not "modified" yet
    # a user edit: drag the first real node by its title bar (also the user gesture Chromium wants for the dialog)
    x, y = b.eval("""(() => {
        const n = app.graph._nodes.find(n => !!LiteGraph.registered_node_types[n.type] && n.type !== 'MarkdownNote');
        const ds = app.canvas.ds, r = document.querySelector('#graph-canvas').getBoundingClientRect();
        return [r.x + (n.pos[0] + 30 + ds.offset[0]) * ds.scale, r.y + (n.pos[1] - 12 + ds.offset[1]) * ds.scale];
    })()""")
    b.drag(x, y, x + 80, y + 40)
    b.wait_for("app.extensionManager.workflow.modifiedWorkflows.length > 0", timeout=10, what="the edit to register")
    seen, seen_errors = len(b.dialogs), len(b.errors)
    b.reload()
    b.wait_for(APP_READY, timeout=180, what="the frontend after the reload")
    b.pump(1.0)
    ours = [e for e in b.errors[seen_errors:] if "cosmos3" in e.lower()]  # the start's own errors: as in ``page``
    assert not ours, ours
    del b.errors[seen_errors:]
    beforeunload = [d for d in b.dialogs[seen:] if d.get("type") == "beforeunload"]
    assert beforeunload, f"no 'Leave site?' dialog on reload (dialogs: {b.dialogs})"


def test_console_has_no_errors_but_the_missing_jobs_api(server, page):
    """Uncaught exceptions and console errors since the app started (drops, typing, runs, dialogs, the reload); with
    the newest frontend the ``/api/jobs`` requests 0.3.75 cannot answer are the only ones allowed (the queue and
    history panels' known gap)."""
    errors = [e for e in page.errors if not ("Jobs API" in e or "fetch jobs" in e or "/api/jobs" in e)]
    page.errors.clear()
    assert not errors, errors

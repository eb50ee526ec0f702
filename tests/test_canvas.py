"""The shipped UI workflows in ComfyUI 0.3.75's real frontend (1.32.9), in headless Chromium, against a real server.

One ``main.py --cpu`` server (tiny random checkpoints, test inputs) and one headless Debian Chromium driven over the
Chrome DevTools Protocol (tests/support/cdp.py). For every UI workflow found in ``example_workflows/`` (test_workflows'
glob), its sizes shrunk for the tiny checkpoint (the same values ``shrink_api`` gives the API twin, written into the
UI file's widgets_values through the live schemas):

* the file is dropped onto ``#graph-canvas`` (``Input.dispatchDragEvent`` with the real file);
* no missing-node dialog and no error toast appear, every node's type is registered in the frontend;
* each widget holds the value saved for it (by widget name, so a value in the wrong widget fails);
* the **Run** button is clicked (a real mouse event), the prompt finishes with ``success`` in /history and its output
  file exists and reads back (``check_outputs``);
* a screenshot of the canvas before and after the run is kept in ``$COSMOS3_ARTIFACTS/canvas`` (default
  ``<repo>/.out/canvas``).

Also: ComfyUI's Templates listing (``/api/workflow_templates``) shows exactly the UI workflows (no API twins), each
with its ``.jpg`` thumbnail served, and the real Templates dialog (the pack's category) shows that ``.jpg`` on every
card (``templates_dialog.png``); a reload with unsaved workflows raises the "Leave site?" dialog, which is
answered, and the app comes back. ``COSMOS3_UPDATE_THUMBNAILS=1`` also rewrites ``example_workflows/<name>.jpg`` from a
screenshot of each workflow as shipped (fit to view).
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
from test_workflows import (ALL_WORKFLOWS, check_outputs, ensure_tiny_checkpoints, load_api, load_ui, schema_inputs,
                            shrink_api, source_node, thumbnail_path, ui_path, widget_slots, write_test_inputs)

pytestmark = pytest.mark.comfy

ARTIFACTS = Path(os.environ.get("COSMOS3_ARTIFACTS", comfy_host.REPO_ROOT / ".out")) / "canvas"
UPDATE_THUMBNAILS = os.environ.get("COSMOS3_UPDATE_THUMBNAILS") == "1"
APP_READY = ("window.app && window.app.graph && window.LiteGraph && "
             "!!LiteGraph.registered_node_types['Cosmos3Loader'] && !!document.querySelector('#graph-canvas')")
SETTINGS = {"Comfy.TutorialCompleted": True, "Comfy.Minimap.Visible": False, "Comfy.Graph.CanvasInfo": False,
            "LiteGraph.Canvas.LowQualityRenderingZoomThreshold": 0.2}  # widgets drawn at fit-view zoom


@pytest.fixture(scope="module")
def browser():
    try:
        from support import cdp
    except ImportError as exc:  # never a silent skip in CI
        pytest.fail(f"the canvas test needs websocket-client (tests/run.sh installs it): {exc}")
    if cdp.find_chromium() is None:
        pytest.fail("chromium is not installed: tests/run.sh installs it with apt-get (Debian's chromium package)")
    with cdp.Browser(width=1600, height=1000) as b:
        yield b


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_checkpoint):
    base = comfy_host.comfy_home(tmp_path_factory.mktemp("canvas"))
    ensure_tiny_checkpoints(base / "models" / "diffusers", tiny_checkpoint)
    write_test_inputs(base / "input")
    settings = base / "user" / "default" / "comfy.settings.json"
    settings.parent.mkdir(parents=True, exist_ok=True)
    settings.write_text(json.dumps(SETTINGS))  # no first-run template dialog, no minimap over the graph
    with comfy_host.ComfyServer(base, require_pack=True) as srv:
        yield srv


@pytest.fixture(scope="module")
def page(server, browser):
    t0 = time.monotonic()
    browser.navigate(server.url + "/")
    browser.wait_for(APP_READY, timeout=180, what="the ComfyUI frontend with the Cosmos3 nodes")
    browser.pump(1.0)
    browser.load_s = time.monotonic() - t0
    return browser


def shrunk_ui(server, mode: str) -> dict:
    """The UI workflow with the values ``shrink_api`` gives its API twin, by widget name (so sizes, steps, the tiny
    checkpoint and the test inputs are what the canvas shows)."""
    ui, api = load_ui(mode), load_api(mode)
    small = shrink_api(api, prefix=f"cosmos3_canvas/{mode}")
    for node in ui["nodes"]:
        nid = str(node["id"])
        if nid not in small:
            continue  # a frontend-only note
        info = server.object_info(node["type"])
        values = node.get("widgets_values") or []
        for i, (name, kind) in enumerate(widget_slots(info)[:len(values)]):
            literal = small[nid]["inputs"].get(name)
            if kind == "value" and name in small[nid]["inputs"] and source_node(small, literal) is None:
                values[i] = literal
    return ui


def graph_state(b) -> dict:
    return b.eval("""(() => {
        const dialogs = [...document.querySelectorAll('.p-dialog')].map(d => d.textContent.trim().slice(0, 300));
        const toasts = [...document.querySelectorAll('.p-toast-message')].map(
            t => ({cls: t.className, text: t.textContent.trim().slice(0, 300)}));
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
    rect = b.eval("(() => { const r = document.querySelector('#graph-canvas').getBoundingClientRect();"
                  " return [r.x + r.width / 2, r.y + r.height / 2]; })()")
    b.eval("app.graph.clear(); true")  # so the wait below sees the dropped graph, not the previous one
    b.drop_file(path, *rect)
    b.wait_for(f"app.graph._nodes.length === {n_nodes}", timeout=30, what=f"{path.name} on the canvas")
    b.pump(0.5)


def click_run(b) -> None:
    center = b.eval("""(() => {
        const btn = [...document.querySelectorAll('button')].find(x => x.getAttribute('aria-label') === 'Run');
        if (!btn) return null;
        const r = btn.getBoundingClientRect();
        return [r.x + r.width / 2, r.y + r.height / 2];
    })()""")
    assert center, "no Run button in the frontend"
    b.click(*center)


def wait_history(server, before: set, timeout: float = 300.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        hist = server.get("/history")
        new = [k for k in hist if k not in before]
        if new:
            entry = server.wait(new[0], timeout=max(1.0, deadline - time.monotonic()))
            return entry
        time.sleep(0.25)
    raise TimeoutError(f"the Run button queued nothing within {timeout} s; log:\n{server.log_tail()}")


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
    """The real Templates dialog (Comfy.BrowseTemplates), the pack's category: one card per UI workflow, titled by the
    file name, whose picture is our ``.jpg`` (LazyImage fetches it once the card is in view: scroll each card in)."""
    b = page
    titles = sorted(ui_path(m).stem for m in ALL_WORKFLOWS)
    b.eval("app.extensionManager.command.execute('Comfy.BrowseTemplates'); true")
    pack = json.dumps(comfy_host.PACK_NAME)
    b.wait_for(f"[...document.querySelectorAll('.p-dialog *')]"
               f".some(e => !e.children.length && e.textContent.trim() === {pack})",
               timeout=30, what="the Templates dialog with the pack's category")
    b.eval(f"""(() => {{ const nav = [...document.querySelectorAll('.p-dialog *')].filter(
        e => !e.children.length && e.textContent.trim() === {pack}); nav[nav.length - 1].click(); return true; }})()""")
    cards = "[...document.querySelectorAll('.p-dialog [data-testid^=\"template-workflow-\"]')]"
    b.wait_for(f"{cards}.length === {len(titles)}", timeout=30, what=f"{len(titles)} cards in the pack's category")
    names = b.eval(f"{cards}.map(c => c.getAttribute('data-testid').slice('template-workflow-'.length))")
    assert sorted(names) == titles, names
    img = "(() => {{ const im = {cards}[{i}].querySelector('img'); return {what}; }})()"
    loaded = {}
    for i in range(len(titles)):
        b.eval(f"{cards}[{i}].scrollIntoView({{block: 'center'}}); true")
        b.wait_for(img.format(cards=cards, i=i, what="!!im && im.complete && im.naturalWidth > 0"),
                   timeout=15, what=f"the thumbnail of template card {names[i]!r}")
        src, *size = b.eval(img.format(cards=cards, i=i, what="[im.src, im.naturalWidth, im.naturalHeight]"))
        assert "default-template" not in src, f"template card {names[i]!r} shows the frontend's placeholder: {src}"
        loaded[names[i]] = size
    b.screenshot(ARTIFACTS / "templates_dialog.png")
    from PIL import Image

    for mode in ALL_WORKFLOWS:  # the picture shown is our file (its size), not the frontend's default-template.png
        with Image.open(thumbnail_path(mode)) as im:
            assert loaded[ui_path(mode).stem] == list(im.size), (mode, loaded[ui_path(mode).stem], im.size)
    closed = b.eval("""(() => {
        const dlg = document.querySelector('[data-testid="template-workflows-content"]').closest('.p-dialog');
        const btn = [...dlg.querySelectorAll('button')].find(x => x.querySelector('[class*="lucide--x"], .pi-times'));
        if (btn) btn.click();
        return !!btn;
    })()""")
    assert closed, "no close (x) button on the Templates dialog"
    b.wait_for(f"{cards}.length === 0", timeout=10, what="the Templates dialog to close")


@pytest.mark.parametrize("mode", ALL_WORKFLOWS)
def test_workflow_dropped_on_canvas_runs_from_the_run_button(server, page, tmp_path, mode):
    b = page
    ui_file = ui_path(mode)
    if UPDATE_THUMBNAILS:  # the shipped file as a user sees it first, fit to view
        shipped = tmp_path / f"shipped {ui_file.name}"
        shipped.write_text(ui_file.read_text())
        drop(b, shipped, len(load_ui(mode)["nodes"]))
        write_thumbnail(b, thumbnail_path(mode))
    ui = shrunk_ui(server, mode)
    path = tmp_path / ui_file.name  # same name: the workflow tab shows the template's title
    path.write_text(json.dumps(ui))
    drop(b, path, len(ui["nodes"]))
    state = graph_state(b)
    assert_clean(state, f"{mode} after the drop")
    by_id = {n["id"]: n for n in state["nodes"]}
    for node in ui["nodes"]:
        info = server.object_info(node["type"])
        if not node.get("widgets_values") or info is None:  # a frontend-only note
            continue
        widgets = by_id[node["id"]]["widgets"]
        for (name, kind), value in zip(widget_slots(info), node["widgets_values"]):
            if kind == "upload":
                continue
            shown = widgets.get("control_after_generate" if kind == "control" else name)
            if kind == "value" and schema_inputs(info)[name]["type"] in ("INT", "FLOAT"):
                assert shown is not None and float(shown) == float(value), (mode, node["type"], name, shown, value)
            else:
                assert shown == value, (mode, node["type"], name, shown, value)
    b.key(".", "Period", 190)  # fit view, for the screenshots
    b.pump(0.5)
    b.screenshot(ARTIFACTS / f"{mode}_loaded.png")

    before = set(server.get("/history"))
    click_run(b)
    entry = wait_history(server, before)
    status = entry.get("status") or {}
    b.pump(1.0)
    b.screenshot(ARTIFACTS / f"{mode}_after_run.png")
    assert status.get("status_str") == "success", json.dumps(status.get("messages"), default=str)[:3000]
    api = entry["prompt"][2]  # what the frontend queued: its own conversion of the canvas
    assert {n["class_type"] for n in api.values()} == {n["class_type"] for n in load_api(mode).values()}
    if any(n["class_type"] == "Cosmos3TextEncode" for n in api.values()):
        files = check_outputs(server.base_dir, mode, api, entry["outputs"])  # reads the media back
    else:  # action workflows write their own files (actions JSON, video): each one named must exist
        files = [server.base_dir / "output" / item.get("subfolder", "") / item["filename"]
                 for ui_out in entry["outputs"].values() for items in ui_out.values() if isinstance(items, list)
                 for item in items if isinstance(item, dict) and item.get("type") == "output" and "filename" in item]
        assert files, entry["outputs"]
    assert all(f.is_file() for f in files), files
    assert_clean(graph_state(b), f"{mode} after the run")


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
    seen = len(b.dialogs)
    b.reload()
    b.wait_for(APP_READY, timeout=180, what="the frontend after the reload")
    beforeunload = [d for d in b.dialogs[seen:] if d.get("type") == "beforeunload"]
    assert beforeunload, f"no 'Leave site?' dialog on reload (dialogs: {b.dialogs})"


def write_thumbnail(b, path: Path) -> None:
    """A JPEG of the graph (fit to view, cropped to the nodes) for the Templates browser."""
    from PIL import Image

    b.call("Input.dispatchMouseEvent", type="mouseMoved", x=5, y=995)  # no hover tooltip in the picture
    b.key(".", "Period", 190)
    b.pump(0.8)
    raw = b.screenshot(ARTIFACTS / f"{path.stem}.png")
    x0, y0, x1, y1 = b.eval("""(() => {
        const ds = app.canvas.ds, r = document.querySelector('#graph-canvas').getBoundingClientRect();
        const xs = [], ys = [];
        for (const n of app.graph._nodes) {
            xs.push(n.pos[0], n.pos[0] + n.size[0]); ys.push(n.pos[1] - LiteGraph.NODE_TITLE_HEIGHT, n.pos[1] + n.size[1]);
        }
        const sx = v => r.x + (v + ds.offset[0]) * ds.scale, sy = v => r.y + (v + ds.offset[1]) * ds.scale;
        return [sx(Math.min(...xs)) - 16, sy(Math.min(...ys)) - 16, sx(Math.max(...xs)) + 16, sy(Math.max(...ys)) + 16];
    })()""")
    with Image.open(raw) as im:
        crop = im.convert("RGB").crop((max(0, int(x0)), max(0, int(y0)), min(im.width, int(x1)), min(im.height, int(y1))))
    crop.thumbnail((640, 400))
    crop.save(path, "JPEG", quality=88)

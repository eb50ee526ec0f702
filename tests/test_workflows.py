"""The shipped workflows against the live ComfyUI 0.3.75 host.

Layout (discovered by glob, so a new workflow needs no edit here): a UI workflow ``example_workflows/<Title>.json``
(ComfyUI lists every ``*.json`` directly in a pack's ``example_workflows/`` as a template; the frontend shows the
file name as the card's title), its thumbnail ``example_workflows/<Title>.jpg`` (a card naming the mode, its inputs →
outputs and its checkpoint, rendered by ``example_workflows/thumbnails.py``, which also writes the cards' order,
``web/template_order.json``) and its API twin
``example_workflows/api/cosmos3_<mode>.json`` (outside the templates glob). The UI workflow's **Read me** note names
its twin on its last line and carries the template's one-line description under its title (the frontend has no
description field for a pack's template: it repeats the file name).

(a) every UI workflow and its API twin agree: node ids, class types, links and widget values (widgets_values is
    mapped to input names with the node schemas the running host serves, control_after_generate and upload
    widgets included);
(b) every node type exists in the host, every API input exists in its schema, required inputs are present,
    combo values are valid options (the checkpoint and the user's input files excepted: real-world names) and
    numbers are inside min/max; link types match the schemas on both ends;
(c) the API graphs pass ``execution.validate_prompt`` once the tiny checkpoint and test inputs are substituted,
    both at the shipped size and shrunk;
plus the real-use defaults of the shipped files and the templates' own hygiene (titles that fit a card, a one-line
description, ``randomize`` seeds, a saved viewport). A widget converted to an input (``prompt`` of Cosmos3TextEncode
fed by the reasoner's caption in ``reasoner_to_i2v``; width/height fed by PrimitiveInt) is a UI input entry with
``widget: {"name": ...}`` and a link, keeps its slot in widgets_values, and is a ``[node, slot]`` link in the API.

This module also holds the helpers the node and server tests share (``shrink_api``, ``ensure_tiny_checkpoints``,
``write_test_inputs``, ``check_outputs``); import them with ``from test_workflows import ...``.
"""
from __future__ import annotations

import json
import math
import re
import sys
from fractions import Fraction
from pathlib import Path

import pytest

from support import comfy_host

pytestmark = pytest.mark.comfy

WORKFLOWS_DIR = comfy_host.REPO_ROOT / "example_workflows"
API_DIR = WORKFLOWS_DIR / "api"
_API_LINE = re.compile(r"`example_workflows/api/cosmos3_(?P<mode>[a-z0-9_]+)\.json`")
README_NOTE = "Read me"  # the MarkdownNote every UI workflow opens with: title, description, details, API twin


def readme_note(ui: dict) -> str:
    notes = [n for n in ui["nodes"] if n["type"] == "MarkdownNote" and n.get("title") == README_NOTE]
    assert len(notes) == 1, f"{len(notes)} MarkdownNote nodes titled {README_NOTE!r} (want one)"
    return notes[0]["widgets_values"][0]


def discover_workflows() -> dict[str, Path]:
    """mode -> UI workflow file, for every ``example_workflows/*.json`` (the files ComfyUI lists as templates): the
    mode is the API twin its Read me note names (``example_workflows/api/cosmos3_<mode>.json``)."""
    found: dict[str, Path] = {}
    for path in sorted(WORKFLOWS_DIR.glob("*.json")):
        ui = json.loads(path.read_text())
        assert "nodes" in ui, f"{path.name} is not a UI workflow (an API graph here is a broken template card)"
        modes = _API_LINE.findall(readme_note(ui))
        assert len(modes) == 1, f"{path.name}: its Read me note must name its API twin once, got {modes}"
        mode = modes[0]
        assert mode not in found, f"two UI workflows for mode {mode!r}: {found[mode].name}, {path.name}"
        found[mode] = path
    return found


def ui_path(mode: str) -> Path:
    return discover_workflows()[mode]


def api_path(mode: str) -> Path:
    return API_DIR / f"cosmos3_{mode}.json"


def thumbnail_path(mode: str) -> Path:
    return ui_path(mode).with_suffix(".jpg")


ALL_WORKFLOWS = tuple(discover_workflows())
ACTION_WORKFLOWS = tuple(m for m in ALL_WORKFLOWS if m.startswith("action_"))  # world-model modes
# long video (Cosmos3LongVideo writes its own mp4; tests/test_long_video_nodes.py runs these end to end)
LONG_WORKFLOWS = tuple(m for m in ALL_WORKFLOWS if m in ("long_t2v", "transfer"))
MODES = tuple(m for m in ALL_WORKFLOWS if m not in ACTION_WORKFLOWS + LONG_WORKFLOWS)
# workflows with a reasoner (shrink_api runs one that looks at an image on a *_VLM tiny checkpoint)
REASONER_MODES = tuple(m for m in MODES if api_path(m).is_file() and '"Cosmos3Reasoner"' in api_path(m).read_text())
PACK_NODE_IDS = ("Cosmos3Loader", "Cosmos3TextEncode", "Cosmos3VAEEncodeCond", "Cosmos3KSamplerUniPCDualTower",
                 "Cosmos3VAEDecode", "Cosmos3AudioDecode", "Cosmos3Reasoner")
FRONTEND_ONLY = {"Note", "MarkdownNote"}  # virtual frontend nodes: never part of the API graph
PREVIEW_NODES = ("PreviewAny",)  # output nodes that only show text in the UI (no file)
REAL_CHECKPOINT = "Cosmos3-Nano"
TINY_NANO = "cosmos3-tiny-nano"
TINY_EDGE = "cosmos3-tiny-edge"
TINY_NANO_VLM = "cosmos3-tiny-nano-vlm"  # + vision_encoder/ and processor files (the reasoner can look at images)
TINY_EDGE_VLM = "cosmos3-tiny-edge-vlm"
TINY_DISTILLED = "cosmos3-tiny-nano-4step"  # the distilled layout (modular_model_index.json, distilled_sigmas)
EDGE_CHECKPOINT = "Cosmos3-Edge"
EDGE_RECIPE = dict(width=832, height=480, num_frames=121, steps=20, cfg=6.0, schedule="flow_shift", shift=12.0)
DISTILLED_CHECKPOINTS = {"distilled_t2i": "Cosmos3-Super-Text2Image-4Step",
                         "distilled_i2v": "Cosmos3-Super-Image2Video-4Step"}
TEST_IMAGE = "cosmos3_test_image.png"
TEST_CLIP = "cosmos3_test_clip.mp4"
# combo inputs whose shipped value is a real-world name (a checkpoint folder, a file the user uploads)
REAL_WORLD_COMBOS = {("Cosmos3Loader", "checkpoint"), ("LoadImage", "image"), ("LoadVideo", "file"),
                     ("Cosmos3LoadActions", "file")}
THUMBNAIL_SIZE = (480, 320)  # example_workflows/thumbnails.py's cards (3:2, as the Templates dialog crops them)
TEMPLATE_ORDER = tuple(json.loads((comfy_host.REPO_ROOT / "web" / "template_order.json").read_text()))
COMMON_FIRST = ("Cosmos3 Video with Sound", "Cosmos3 Text to Video", "Cosmos3 Image to Video", "Cosmos3 Text to Image")
# The saved zoom of every template: at or above the frontends' default level-of-detail zoom (MinFontSizeForLOD 8 px
# of 14 px text = 0.571 on a screen of device pixel ratio 1; less on a HiDPI one), so it opens drawn in full.
MIN_SCALE = 0.6
MAX_TITLE_CHARS = 26  # fits a Templates card at 1600 px (≈250 px of bold 14 px text; test_canvas measures it)
# control_after_generate stays "fixed" on these: a size (PrimitiveInt) and the reasoner's seed (a re-queue re-uses
# its cached caption); every other seed is "randomize", as in ComfyUI's own templates
KEEP_FIXED = ("PrimitiveInt", "Cosmos3Reasoner")
TEST_ACTIONS = "cosmos3_test_actions.json"  # 4 bridge actions (10-dim), for the shrunk forward-dynamics workflow
SAVE_NODES = ("SaveImage", "SaveVideo", "Cosmos3SaveActions", "Cosmos3LongVideo")  # output nodes that write files
WIDGET_TYPES = {"INT", "FLOAT", "STRING", "BOOLEAN", "COMBO"}
UPLOAD_FLAGS = ("image_upload", "video_upload", "audio_upload", "file_upload")
CONTROL_VALUES = {"fixed", "increment", "decrement", "randomize"}


# --------------------------------------------------------------------------------------------
# shared helpers (also used by test_nodes.py and test_server.py)
# --------------------------------------------------------------------------------------------

def load_ui(mode: str) -> dict:
    return json.loads(ui_path(mode).read_text())


def load_api(mode: str) -> dict:
    return json.loads(api_path(mode).read_text())


def prepared_executor(tiny_checkpoint):
    """The in-process ComfyUI host with this pack loaded (fails with the import traceback if it did not), the tiny
    checkpoints in its model folder and the test inputs in its input folder — what every node test starts from.
    ``tiny_checkpoint`` is the session fixture of tests/support/fixtures.py."""
    from support import comfy_host

    h = comfy_host.get_executor()
    h.assert_pack_loaded()
    ensure_tiny_checkpoints(h.base_dir / "models" / "diffusers", tiny_checkpoint)
    write_test_inputs(h.base_dir / "input")
    return h


# the tiny checkpoints of a ComfyUI home: folder name -> tiny_checkpoint(...) arguments
TINY_CHECKPOINTS = {
    TINY_NANO: dict(variant="nano", seed=0),  # with sound (the builder's default for Nano)
    TINY_EDGE: dict(variant="edge", seed=0),
    TINY_DISTILLED: dict(variant="nano", seed=0, distilled=True),
    TINY_NANO_VLM: dict(variant="nano", seed=0, reasoner=True),  # + vision_encoder/ and processor files
    TINY_EDGE_VLM: dict(variant="edge", seed=0, reasoner=True),
}


def ensure_tiny_checkpoints(models_dir: Path, tiny_checkpoint) -> dict[str, Path]:
    """The ``TINY_CHECKPOINTS`` under ``models_dir``: copies of the session's shared folders (``tiny_checkpoint``,
    tests/support/fixtures.py; each built once per session), so that the node tests may change them. A folder is
    copied aside and renamed into place, so a folder present here is complete and is kept."""
    import shutil
    import uuid

    out = {}
    for name, kwargs in TINY_CHECKPOINTS.items():
        path = Path(models_dir) / name
        if not path.is_dir():
            tmp = Path(models_dir) / f".{name}.{uuid.uuid4().hex[:8]}.part"
            try:
                shutil.copytree(tiny_checkpoint(**kwargs), tmp, symlinks=True)
                tmp.rename(path)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        out[name] = path
    return out


def tiny_checkpoint_for(api: dict, variant: str = "nano") -> str:
    """The tiny checkpoint a graph runs on: the ``*-vlm`` one when a reasoner looks at an image, the distilled one
    for a graph made for a distilled (``*-4Step``) checkpoint, the Edge one for a graph made for Cosmos3-Edge."""
    names = [str(n["inputs"].get("checkpoint", "")) for n in api.values() if n["class_type"] == "Cosmos3Loader"]
    if any(name.endswith("-4Step") for name in names):
        return TINY_DISTILLED
    if any("-Edge" in name for name in names):  # a graph made for Cosmos3-Edge runs on the tiny Edge
        variant = "edge"
    looks = any(n["class_type"] == "Cosmos3Reasoner" and source_node(api, n["inputs"].get("image")) is not None
                for n in api.values())
    if variant == "nano":
        return TINY_NANO_VLM if looks else TINY_NANO
    return TINY_EDGE_VLM if looks else TINY_EDGE


def write_test_inputs(input_dir: Path, clip_frames: int = 13, fps: int = 24) -> None:
    """A 120x80 PNG and a 112x64 h264 clip (sizes differ from the generation size on purpose)."""
    import av
    import numpy as np
    from PIL import Image

    input_dir = Path(input_dir)
    input_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    if not (input_dir / TEST_ACTIONS).is_file():
        actions = rng.standard_normal((4, 10)).round(4).tolist()
        (input_dir / TEST_ACTIONS).write_text(json.dumps({"domain_name": "bridge_orig_lerobot", "actions": actions}))
    if not (input_dir / TEST_IMAGE).is_file():
        yy, xx = np.mgrid[0:80, 0:120]
        img = np.stack([xx * 2, yy * 3, (xx + yy) % 256], -1).astype(np.uint8)
        Image.fromarray(img).save(input_dir / TEST_IMAGE)
    if not (input_dir / TEST_CLIP).is_file():
        tmp = input_dir / (TEST_CLIP + ".part.mp4")
        with av.open(str(tmp), "w") as c:
            s = c.add_stream("libx264", rate=fps)
            s.width, s.height, s.pix_fmt = 112, 64, "yuv420p"
            for i in range(clip_frames):
                arr = (rng.random((64, 112, 3)) * 64 + i * 12).clip(0, 255).astype(np.uint8)
                for p in s.encode(av.VideoFrame.from_ndarray(arr, format="rgb24")):
                    c.mux(p)
            for p in s.encode():
                c.mux(p)
        tmp.rename(input_dir / TEST_CLIP)


def source_node(api: dict, value):
    """The node id a link ``[id, slot]`` points at, else None."""
    if isinstance(value, list) and len(value) == 2 and isinstance(value[0], str):
        return value[0]
    return None


def resolve(api: dict, node_id: str, name: str):
    """An input's literal value, following links into PrimitiveInt/PrimitiveFloat nodes."""
    value = api[node_id]["inputs"][name]
    src = source_node(api, value)
    if src is None:
        return value
    node = api[src]
    assert node["class_type"].startswith("Primitive"), f"{node_id}.{name} comes from {node['class_type']}"
    return node["inputs"]["value"]


def _set(api: dict, node_id: str, name: str, value) -> None:
    src = source_node(api, api[node_id]["inputs"][name])
    if src is None:
        api[node_id]["inputs"][name] = value
    else:
        api[src]["inputs"]["value"] = value


def shrink_api(api: dict, *, checkpoint: str | None = None, width: int = 96, height: int = 64, frames: int = 9,
               steps: int = 2, image: str = TEST_IMAGE, video: str = TEST_CLIP, prefix: str | None = None,
               seed: int | None = None, prompt_suffix: str = "", max_new_tokens: int = 8) -> dict:
    """A copy of a shipped API graph that runs in a second on the tiny checkpoint.

    ``checkpoint`` None: the tiny Nano, with reasoner parts when a reasoner looks at an image
    (``tiny_checkpoint_for``); a distilled checkpoint keeps the sampler's steps (fixed by it). Sizes go through the PrimitiveInt nodes when width/height are linked (one source of
    truth stays one). Text-to-image (num_frames 1) stays one frame. A reasoner writes ``max_new_tokens`` tokens at
    most; ``prompt_suffix`` goes to the text encode's prompt, or to the reasoner's when the prompt is its caption.
    """
    g = json.loads(json.dumps(api))
    if checkpoint is None:
        checkpoint = tiny_checkpoint_for(g)
    for nid, node in g.items():
        ct, inp = node["class_type"], node["inputs"]
        if ct == "Cosmos3Loader":
            inp.update(checkpoint=checkpoint, dtype="fp32")
        elif ct in ("Cosmos3TextEncode", "Cosmos3VAEEncodeCond", "Cosmos3FirstLastFrame"):
            _set(g, nid, "width", width)
            _set(g, nid, "height", height)
            if ct == "Cosmos3FirstLastFrame":
                inp["num_frames"] = frames
            if ct == "Cosmos3TextEncode":
                if inp["num_frames"] != 1:
                    inp["num_frames"] = frames
                src = source_node(g, inp["prompt"])
                if src is None:
                    inp["prompt"] = inp["prompt"] + prompt_suffix
                elif g[src]["class_type"] == "Cosmos3Reasoner":
                    g[src]["inputs"]["prompt"] = g[src]["inputs"]["prompt"] + prompt_suffix
        elif ct == "Cosmos3Reasoner":
            inp["max_new_tokens"] = max_new_tokens
        elif ct == "Cosmos3ActionCondition":  # 256 tier; inverse dynamics reads all 13 frames of the test clip
            inp.update(chunk_size=12 if inp["mode"] == "inverse_dynamics" else 4, resolution_tier="256")
            inp["prompt"] = inp["prompt"] + prompt_suffix
        elif ct == "Cosmos3LoadActions":
            inp["file"] = TEST_ACTIONS
        elif ct == "Cosmos3SaveActions" and prefix is not None:
            inp["filename_prefix"] = prefix
        elif ct == "Cosmos3KSamplerUniPCDualTower":
            if checkpoint != TINY_DISTILLED:
                inp["steps"] = steps
            if seed is not None:
                inp["seed"] = seed
        elif ct == "LoadImage":
            inp["image"] = image
        elif ct == "LoadVideo":
            inp["file"] = video
        elif ct == "Cosmos3LongVideo":  # windows of `frames`; two or more windows (a control clip sets its own)
            inp.update(width=width, height=height, frames_per_chunk=frames, steps=steps, prompt=inp["prompt"] + prompt_suffix)
            inp["num_frames"] = 2 * frames - 1  # with a control clip: a cap on its length
            if seed is not None:
                inp["seed"] = seed
            if prefix is not None:
                inp["filename_prefix"] = prefix
        elif ct in ("SaveImage", "SaveVideo") and prefix is not None:
            inp["filename_prefix"] = prefix
    return g


def nodes_of(api: dict, class_type: str) -> list[str]:
    return [nid for nid, n in api.items() if n["class_type"] == class_type]


def output_files(base_dir: Path, ui_output: dict) -> list[Path]:
    """Files a SaveImage/SaveVideo UI payload names (``images`` entries)."""
    files = []
    for item in ui_output.get("images", []):
        assert item["type"] == "output", ui_output
        files.append(Path(base_dir) / "output" / item.get("subfolder", "") / item["filename"])
    return files


def check_png(path: Path, width: int, height: int) -> None:
    import numpy as np
    from PIL import Image

    assert path.is_file() and path.suffix == ".png", path
    with Image.open(path) as im:
        assert im.size == (width, height), (path, im.size)
        arr = np.asarray(im.convert("RGB"), dtype=np.float32)
    assert arr.std() > 0.5, f"{path} is a constant image"


def check_mp4(path: Path, width: int, height: int, frames: int, fps: float, audio: bool) -> dict:
    """Read an mp4 back with PyAV: h264 frame count, size, fps; AAC 48 kHz stereo of frames/fps seconds."""
    import av
    import numpy as np

    assert path.is_file() and path.suffix == ".mp4", path
    info = {}
    with av.open(str(path)) as c:
        vs = c.streams.video
        assert len(vs) == 1, f"{path}: {len(vs)} video streams"
        v = vs[0]
        assert v.codec_context.name == "h264", v.codec_context.name
        assert v.average_rate == Fraction(fps).limit_denominator(1001), (v.average_rate, fps)
        decoded = [f.to_ndarray(format="rgb24") for f in c.decode(v)]
    assert len(decoded) == frames, f"{path}: {len(decoded)} frames, expected {frames}"
    assert decoded[0].shape == (height, width, 3), decoded[0].shape
    assert float(np.stack(decoded).astype(np.float32).std()) > 0.5, f"{path} is a constant video"
    info["frames"] = len(decoded)
    with av.open(str(path)) as c:
        streams = c.streams.audio
        if not audio:
            assert len(streams) == 0, f"{path} has an audio stream but the workflow makes none"
            return info
        assert len(streams) == 1, f"{path}: no audio stream"
        a = streams[0]
        assert a.codec_context.name == "aac" and a.sample_rate == 48000, (a.codec_context.name, a.sample_rate)
        samples, channels = 0, 0
        for fr in c.decode(a):
            samples += fr.samples
            channels = len(fr.layout.channels)
        stream_s = float(a.duration * a.time_base) if a.duration else samples / 48000
    want = frames / fps
    assert channels == 2, channels
    # the container duration is exact; decoded AAC is padded to whole 1024-sample frames
    assert abs(stream_s - want) <= 1024 / 48000, f"audio stream {stream_s:.4f} s, video {want:.4f} s"
    assert want * 48000 <= samples <= want * 48000 + 2048, f"{samples} decoded samples for {want:.4f} s"
    info["audio_s"] = stream_s
    return info


def check_outputs(base_dir: Path, mode: str, api: dict, outputs: dict) -> list[Path]:
    """Assert a finished shrunk workflow wrote the right file(s); returns them."""
    save_ids = nodes_of(api, "SaveImage") + nodes_of(api, "SaveVideo")
    assert len(save_ids) == 1, save_ids
    sid = save_ids[0]
    assert sid in outputs, f"no UI output for save node {sid}: {outputs}"
    files = output_files(base_dir, outputs[sid])
    assert len(files) == 1, files
    te = nodes_of(api, "Cosmos3TextEncode")[0]
    width, height = resolve(api, te, "width"), resolve(api, te, "height")
    frames, fps = api[te]["inputs"]["num_frames"], api[te]["inputs"]["fps"]
    if frames == 1:
        check_png(files[0], width, height)
    else:
        cv = nodes_of(api, "CreateVideo")[0]
        assert float(api[cv]["inputs"]["fps"]) == float(fps), mode
        check_mp4(files[0], width, height, frames, fps, audio="audio" in api[cv]["inputs"])
    return files


# -- live schema (what /object_info serves) ---------------------------------------------------

def node_info(host, class_type: str) -> dict:
    """The node's /object_info entry, computed exactly as server.py does."""
    cls = host.node_class_mappings[class_type]
    if hasattr(cls, "GET_NODE_INFO_V1"):  # V3 io.ComfyNode
        return cls.GET_NODE_INFO_V1()
    it = cls.INPUT_TYPES()
    return {"input": it, "input_order": {k: list(v) for k, v in it.items()},
            "output": list(cls.RETURN_TYPES),
            "output_name": list(getattr(cls, "RETURN_NAMES", None) or cls.RETURN_TYPES)}


def schema_inputs(info: dict) -> dict[str, dict]:
    """name -> {type, opts, optional, widget} in input_order (required, then optional)."""
    out = {}
    for group in ("required", "optional"):
        for name in info["input_order"].get(group, []):
            spec = info["input"][group][name]
            typ, opts = spec[0], (spec[1] if len(spec) > 1 else {}) or {}
            is_combo = isinstance(typ, list) or typ == "COMBO"
            widget = (is_combo or typ in WIDGET_TYPES) and not opts.get("forceInput")
            options = typ if isinstance(typ, list) else opts.get("options")
            out[name] = dict(type="COMBO" if is_combo else typ, opts=opts, optional=group == "optional",
                             widget=widget, options=options)
    return out


def widget_slots(info: dict) -> list[tuple[str, str]]:
    """The frontend's widgets_values layout: (input name, "value" | "control" | "upload") per entry."""
    slots = []
    for name, s in schema_inputs(info).items():
        if not s["widget"]:
            continue
        slots.append((name, "value"))
        if s["opts"].get("control_after_generate"):
            slots.append((name, "control"))
        if any(s["opts"].get(f) for f in UPLOAD_FLAGS):
            slots.append((name, "upload"))
    return slots


def ui_links(ui: dict) -> dict[int, tuple]:
    return {link[0]: tuple(link[1:]) for link in ui["links"]}


def same_value(a, b) -> bool:
    """JSON equality as the frontend means it: 6 == 6.0 (JavaScript has one number type), but True != 1."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return float(a) == float(b)
    return type(a) is type(b) and a == b


# --------------------------------------------------------------------------------------------
# tests (``host``: the shared fixture of tests/support/fixtures.py, ``prepared_executor(tiny_checkpoint)``)
# --------------------------------------------------------------------------------------------

def test_every_mode_ships_a_ui_and_api_pair():
    """Templates browser hygiene: only UI workflows in example_workflows/ (API twins in api/), each with a thumbnail."""
    assert {"t2i", "t2v", "t2av", "i2v", "v2v", "reasoner_to_i2v"} <= set(MODES), MODES
    apis = sorted(p.name for p in API_DIR.glob("*.json"))
    assert apis == sorted(api_path(m).name for m in ALL_WORKFLOWS), "every api/*.json needs a UI workflow and vice versa"
    for path in WORKFLOWS_DIR.glob("*.json"):  # an API-format graph here would be a broken template card
        assert "nodes" in json.loads(path.read_text()), f"{path.name} is not a UI workflow; move it to api/"
    for mode in ALL_WORKFLOWS:
        ui, api = load_ui(mode), load_api(mode)
        assert ui["version"] == 0.4 and isinstance(ui["nodes"], list) and isinstance(ui["links"], list)
        assert all(isinstance(k, str) and k.isdigit() and "class_type" in v and "inputs" in v for k, v in api.items())
        assert ui["last_node_id"] >= max(n["id"] for n in ui["nodes"])
        assert ui["last_link_id"] >= max((link[0] for link in ui["links"]), default=0)
        assert len({n["id"] for n in ui["nodes"]}) == len(ui["nodes"]), "duplicate node ids"
        assert len({link[0] for link in ui["links"]}) == len(ui["links"]), "duplicate link ids"
        thumb = thumbnail_path(mode)
        assert thumb.is_file(), (f"{thumb.name} missing: the Templates browser shows no picture. Write it with "
                                 "python example_workflows/thumbnails.py")
        from PIL import Image

        with Image.open(thumb) as im:
            assert im.format == "JPEG" and im.size == THUMBNAIL_SIZE, (thumb.name, im.format, im.size)
    readme = (WORKFLOWS_DIR / "README.md").read_text()
    for mode in ALL_WORKFLOWS:
        assert f"`{ui_path(mode).name}`" in readme and f"`api/{api_path(mode).name}`" in readme, mode
    assert "reasoner_to_i2v" in REASONER_MODES, REASONER_MODES


def test_template_cards_are_the_rendered_cards_in_their_order():
    """The Templates page: ``web/template_order.json`` lists every UI workflow once, the common modes first (video with
    sound, text to video, image to video, text to image), as ``thumbnails.CARDS`` orders them; every ``<Title>.jpg``
    is the card ``thumbnails.render`` draws for it (within JPEG rounding)."""
    import importlib.util

    from PIL import Image, ImageChops, ImageStat

    spec = importlib.util.spec_from_file_location("thumbnails", WORKFLOWS_DIR / "thumbnails.py")
    thumbnails = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = thumbnails  # its dataclasses look their module up there
    spec.loader.exec_module(thumbnails)
    titles = [card.title for card in thumbnails.CARDS]
    assert list(TEMPLATE_ORDER) == titles, "web/template_order.json is stale: run python example_workflows/thumbnails.py"
    assert sorted(titles) == sorted(ui_path(m).stem for m in ALL_WORKFLOWS) and len(set(titles)) == len(titles)
    assert TEMPLATE_ORDER[:len(COMMON_FIRST)] == COMMON_FIRST, TEMPLATE_ORDER
    for card in thumbnails.CARDS:
        with Image.open(thumbnails.thumbnail_path(card)) as shipped:
            diff = ImageStat.Stat(ImageChops.difference(shipped.convert("RGB"), thumbnails.render(card))).mean
        assert max(diff) < 2.0, f"{card.title}.jpg is not its rendered card (mean difference {diff}): run thumbnails.py"


@pytest.mark.parametrize("mode", ALL_WORKFLOWS)
def test_template_title_description_seeds_and_viewport(host, mode):
    """What the Templates browser and the first look at the canvas show: a title short enough for a card (the
    frontend shows the file name; tests/test_canvas.py measures it on the card), a Read me note that opens with that
    title and a one-line description not repeating it, seeds that change on every queue as in ComfyUI's own
    templates (``randomize``; the reasoner's stays ``fixed`` so a re-queue re-uses its cached caption), and a saved
    viewport (``extra.ds``, framing the whole graph: tests/test_canvas.py checks it on screen)."""
    ui = load_ui(mode)
    title = ui_path(mode).stem
    assert title.startswith("Cosmos3 ") and len(title) <= MAX_TITLE_CHARS, title
    heading, description, *rest = readme_note(ui).split("\n\n")
    assert heading == f"## {title}", heading
    assert "\n" not in description and 20 <= len(description) <= 120, description
    short = title.removeprefix("Cosmos3 ").lower()
    assert short not in description.lower() and not description.startswith("Cosmos3"), (title, description)
    assert rest and rest[-1] == f"API version (for `/prompt`): `example_workflows/api/{api_path(mode).name}`"
    controls = {}  # (node id, type, input) -> control_after_generate value
    for n in ui["nodes"]:
        if n["type"] not in FRONTEND_ONLY:
            for (name, kind), value in zip(widget_slots(node_info(host, n["type"])), n.get("widgets_values") or []):
                if kind == "control":
                    controls[(n["id"], n["type"], name)] = value
    want = {key: "fixed" if key[1] in KEEP_FIXED else "randomize" for key in controls}
    assert controls == want and "randomize" in controls.values(), controls
    ds = ui["extra"]["ds"]
    assert MIN_SCALE <= ds["scale"] <= 1.0 and len(ds["offset"]) == 2, ds


@pytest.mark.parametrize("mode", ALL_WORKFLOWS)
def test_ui_and_api_agree(host, mode):
    """(a) Same ids, class types, links and widget values (mapped through the live schemas)."""
    ui, api = load_ui(mode), load_api(mode)
    for n in ui["nodes"]:
        assert n["type"] in FRONTEND_ONLY or n["type"] in host.node_class_mappings, \
            f"UI node {n['id']}: {n['type']} is not registered in ComfyUI 0.3.75"
    ui_nodes = {str(n["id"]): n for n in ui["nodes"] if n["type"] not in FRONTEND_ONLY}
    for n in ui["nodes"]:
        if n["type"] in FRONTEND_ONLY:
            assert not n.get("inputs") and not n.get("outputs"), f"{n['type']} {n['id']} must not be wired"
    assert sorted(ui_nodes, key=int) == sorted(api, key=int), "node ids differ"
    for nid, n in ui_nodes.items():
        assert n["type"] == api[nid]["class_type"], nid
        assert n.get("mode", 0) == 0, f"node {nid} is muted/bypassed in the shipped UI workflow"
        title = n.get("title")
        if title:
            assert api[nid].get("_meta", {}).get("title") == title, nid

    links = ui_links(ui)
    # UI links <-> API [node, slot] inputs
    api_links = {}
    for nid, node in api.items():
        for name, value in node["inputs"].items():
            if source_node(api, value) is not None:
                api_links[(nid, name)] = (value[0], value[1])
    seen = set()
    for lid, (src, src_slot, dst, dst_slot, typ) in links.items():
        assert str(dst) in ui_nodes and str(src) in ui_nodes, f"link {lid} joins unknown nodes {src} -> {dst}"
        dnode, snode = ui_nodes[str(dst)], ui_nodes[str(src)]
        assert 0 <= dst_slot < len(dnode["inputs"]), f"link {lid}: node {dst} has no input slot {dst_slot}"
        assert 0 <= src_slot < len(snode["outputs"]), f"link {lid}: node {src} has no output slot {src_slot}"
        entry = dnode["inputs"][dst_slot]
        assert entry["link"] == lid, f"link {lid}: node {dst} input {dst_slot} says link {entry['link']}"
        assert lid in (snode["outputs"][src_slot]["links"] or []), f"link {lid} missing on node {src} output"
        # the frontend stores the input's type on the link: "*" for an any-type input (PreviewAny's source)
        assert entry["type"] == typ and typ in (snode["outputs"][src_slot]["type"], "*"), (lid, entry, typ)
        if entry.get("widget"):  # a widget converted to an input: same name, and the schema has that widget
            assert entry["widget"] == {"name": entry["name"]}, (lid, entry)
            assert entry["name"] in {name for name, _ in widget_slots(node_info(host, dnode["type"]))}, (lid, entry)
        key = (str(dst), entry["name"])
        assert api_links.get(key) == (str(src), src_slot), f"link {lid} {key} not in the API twin"
        seen.add(key)
    assert seen == set(api_links), f"API links without a UI link: {set(api_links) - seen}"
    for n in ui_nodes.values():  # no dangling link ids on either end
        for e in n.get("inputs", []):
            assert e["link"] is None or e["link"] in links, (n["id"], e)
        for o in n.get("outputs", []):
            assert all(link in links for link in (o.get("links") or [])), (n["id"], o)

    # widgets_values <-> API literal inputs
    for nid, n in ui_nodes.items():
        info = node_info(host, n["type"])
        slots = widget_slots(info)
        values = n.get("widgets_values", [])
        # a workflow saved before an optional widget was appended has fewer values: the frontend gives the new
        # widgets their defaults (and the API twin leaves those inputs out), so old saved values keep their slots
        optional = schema_inputs(info)
        assert len(values) <= len(slots) and all(optional[name]["optional"] for name, _ in slots[len(values):]), \
            f"{n['type']} {nid}: {len(values)} widgets_values, the live schema has {len(slots)} widgets {slots}"
        for name, _ in slots[len(values):]:
            assert name not in api[nid]["inputs"], f"{nid}.{name}: no UI value but an API value"
        slots = slots[:len(values)]
        linked_widgets = {e["name"] for e in n.get("inputs", []) if e.get("widget") and e["link"] is not None}
        api_inputs = api[nid]["inputs"]
        for (name, kind), value in zip(slots, values):
            if kind == "control":
                assert value in CONTROL_VALUES, (nid, name, value)
            elif kind == "upload":
                assert value == "image", (nid, name, value)  # what the frontend stores for its upload button
            elif name in linked_widgets:
                src = source_node(api, api_inputs[name])
                assert src is not None, f"{nid}.{name} linked in UI, literal in API"
                if api[src]["class_type"].startswith("Primitive"):  # the frontend mirrors a primitive's value
                    assert same_value(resolve(api, nid, name), value), f"{nid}.{name}: stale widget value {value!r}"
                else:  # fed by a computed value (the reasoner's caption): the hidden widget keeps a plain value
                    s_type = schema_inputs(node_info(host, n["type"]))[name]["type"]
                    assert s_type != "STRING" or isinstance(value, str), (nid, name, value)
            else:
                assert name in api_inputs, f"{nid}.{name} missing in the API twin"
                assert same_value(api_inputs[name], value), \
                    f"{n['type']} {nid}.{name}: UI {value!r} != API {api_inputs[name]!r}"
        widget_names = {name for name, _ in slots}
        for name in api_inputs:
            assert name in widget_names or (str(nid), name) in api_links, f"API {nid}.{name} has no UI counterpart"


@pytest.mark.parametrize("mode", ALL_WORKFLOWS)
def test_nodes_and_inputs_exist_in_host(host, mode):
    """(b) Node types, input names, required inputs, combo options, ranges and link types vs the live host."""
    api = load_api(mode)
    for nid, node in api.items():
        ct = node["class_type"]
        assert ct in host.node_class_mappings, f"node {nid}: {ct} is not registered in ComfyUI 0.3.75"
        info = node_info(host, ct)
        inputs = schema_inputs(info)
        for name, value in node["inputs"].items():
            assert name in inputs, f"{ct} {nid}: no input {name!r} (schema: {list(inputs)})"
            s = inputs[name]
            src = source_node(api, value)
            if src is not None:
                out_types = node_info(host, api[src]["class_type"])["output"]
                got = out_types[value[1]]
                assert got == s["type"] or s["type"] == "*", f"{ct} {nid}.{name}: {got} linked into {s['type']}"
                continue
            assert s["widget"], f"{ct} {nid}.{name} is a socket ({s['type']}) but has a literal value"
            if s["type"] == "COMBO":
                if (ct, name) in REAL_WORLD_COMBOS:
                    assert isinstance(value, str) and value
                else:
                    assert value in s["options"], f"{ct} {nid}.{name}={value!r} not in {s['options']}"
            elif s["type"] in ("INT", "FLOAT"):
                assert isinstance(value, (int, float)) and not isinstance(value, bool), (nid, name, value)
                if s["type"] == "INT":
                    assert isinstance(value, int), (nid, name, value)
                lo, hi = s["opts"].get("min", -math.inf), s["opts"].get("max", math.inf)
                assert lo <= value <= hi, f"{ct} {nid}.{name}={value} outside [{lo}, {hi}]"
            elif s["type"] == "BOOLEAN":
                assert isinstance(value, bool), (nid, name, value)
            elif s["type"] == "STRING":
                assert isinstance(value, str), (nid, name, value)
        missing = [n for n, s in inputs.items() if not s["optional"] and n not in node["inputs"]]
        assert not missing, f"{ct} {nid}: required inputs missing: {missing}"


@pytest.mark.parametrize("mode", MODES)
def test_shipped_real_use_defaults(mode):
    api = load_api(mode)
    (loader,) = nodes_of(api, "Cosmos3Loader")
    checkpoint = {**DISTILLED_CHECKPOINTS, "edge_i2v": EDGE_CHECKPOINT}.get(mode, REAL_CHECKPOINT)
    assert api[loader]["inputs"] == {"checkpoint": checkpoint, "dtype": "auto", "device": "default"}
    base = {"distilled_t2i": "t2i", "distilled_i2v": "i2v", "edge_i2v": "i2v"}.get(mode, mode)
    if base != mode:  # a variant: as its base mode but for its checkpoint's own settings
        api = json.loads(json.dumps(api))
        (ks,) = nodes_of(api, "Cosmos3KSamplerUniPCDualTower")
        (te,) = nodes_of(api, "Cosmos3TextEncode")
        k = api[ks]["inputs"]
        if mode == "edge_i2v":  # Edge's published recipe (model card, 2026-08-25)
            got = dict(width=resolve(api, te, "width"), height=resolve(api, te, "height"),
                       num_frames=api[te]["inputs"]["num_frames"], steps=k["steps"], cfg=k["cfg"],
                       schedule=k["schedule"], shift=k["shift"])
            assert got == EDGE_RECIPE, got
            _set(api, te, "width", 1280)
            _set(api, te, "height", 720)
            api[te]["inputs"]["num_frames"] = 189
            k.update(shift=0.0)
        else:  # distilled: 4 steps and cfg 1 (the checkpoint's fixed schedule, guidance baked in)
            assert (k["steps"], k["cfg"]) == (4, 1.0)
        k.update(steps=load_api(base)[ks]["inputs"]["steps"], cfg=6.0)
        mode = base
    (te,) = nodes_of(api, "Cosmos3TextEncode")
    t = api[te]["inputs"]
    assert (resolve(api, te, "width"), resolve(api, te, "height")) == (1280, 720)
    assert t["negative_prompt"] == ""
    if mode in REASONER_MODES:  # the prompt is the reasoner's caption of the start image, also shown as text
        (rs,) = nodes_of(api, "Cosmos3Reasoner")
        r = api[rs]["inputs"]
        assert t["prompt"] == [rs, 0], t["prompt"]
        assert {k: v for k, v in r.items() if k not in ("model", "image", "prompt")} == dict(
            task="caption", max_new_tokens=512, temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.0,
            seed=42, fps=24.0), r
        assert isinstance(r["prompt"], str) and r["model"] == t["model"]
        (ec,) = nodes_of(api, "Cosmos3VAEEncodeCond")
        assert r["image"] == api[ec]["inputs"]["image"], "the reasoner must caption the start frame itself"
        previews = nodes_of(api, "PreviewAny")
        assert [api[p]["inputs"]["source"] for p in previews] == [[rs, 0]], previews
    else:
        assert len(t["prompt"]) > 80
    assert t["num_frames"] == (1 if mode == "t2i" else 189) and t["fps"] == 24.0
    (ks,) = nodes_of(api, "Cosmos3KSamplerUniPCDualTower")
    k = api[ks]["inputs"]
    assert (k["seed"], k["steps"], k["cfg"], k["schedule"], k["shift"]) == \
        (42, 50 if mode == "t2i" else 35, 6.0, "flow_shift", 0.0)
    assert k["sound"] is (mode == "t2av")
    conditioned = mode in ("i2v", "v2v", "flf2v") + REASONER_MODES
    assert ("condition" in k) is conditioned
    if mode == "t2i":
        assert nodes_of(api, "SaveImage") and not nodes_of(api, "SaveVideo")
    else:
        (sv,) = nodes_of(api, "SaveVideo")
        assert api[sv]["inputs"]["format"] == "mp4" and api[sv]["inputs"]["codec"] == "h264"
        (cv,) = nodes_of(api, "CreateVideo")
        assert api[cv]["inputs"]["fps"] == t["fps"], "Create Video fps must equal the Text Encode fps"
        assert ("audio" in api[cv]["inputs"]) is (mode == "t2av")
    if conditioned:
        (ec,) = nodes_of(api, "Cosmos3VAEEncodeCond") + nodes_of(api, "Cosmos3FirstLastFrame")
        if mode == "flf2v":  # the keyframes are made for the Text Encode's clip length
            assert api[ec]["inputs"]["num_frames"] == t["num_frames"] and api[ec]["inputs"]["frame_indexes"] == ""
        for name in ("width", "height"):  # one source of truth: the same PrimitiveInt feeds both nodes
            a, b = api[te]["inputs"][name], api[ec]["inputs"][name]
            assert source_node(api, a) is not None and a == b, (name, a, b)
            assert api[a[0]]["class_type"] == "PrimitiveInt"
        loaders = nodes_of(api, "LoadImage") + nodes_of(api, "LoadVideo")
        assert [api[i]["inputs"].get("image", api[i]["inputs"].get("file")) for i in loaders] == \
            (["example.mp4"] if mode == "v2v" else ["example.png"] * (2 if mode == "flf2v" else 1))


@pytest.mark.parametrize("mode", ALL_WORKFLOWS)
def test_api_validates_in_host(host, mode):
    """(c) ``execution.validate_prompt`` accepts the graphs with the tiny checkpoint and test inputs."""
    api = load_api(mode)
    as_shipped = json.loads(json.dumps(api))  # shipped sizes and steps; only the real-world names replaced
    for node in as_shipped.values():
        replace = {"Cosmos3Loader": ("checkpoint", tiny_checkpoint_for(api)), "LoadImage": ("image", TEST_IMAGE),
                   "LoadVideo": ("file", TEST_CLIP), "Cosmos3LoadActions": ("file", TEST_ACTIONS)}.get(node["class_type"])
        if replace:
            node["inputs"][replace[0]] = replace[1]
    for graph in (as_shipped, shrink_api(api)):
        ok, err, outputs, node_errors = host.validate(graph)
        assert ok, f"{mode}: {json.dumps(err, indent=1)}\n{json.dumps(node_errors, indent=1, default=str)}"
        saves = [nid for s in SAVE_NODES for nid in nodes_of(graph, s)]
        previews = [nid for p in PREVIEW_NODES for nid in nodes_of(graph, p)]
        assert sorted(outputs) == sorted(saves + previews)
        assert len(previews) == (1 if mode in REASONER_MODES else 0), previews
    # and the host really rejects a graph naming a node it lacks (the check above is not vacuous)
    bad = shrink_api(api)
    bad["99"] = {"class_type": "Cosmos3NoSuchNode", "inputs": {}}
    assert not host.validate(bad)[0]


@pytest.mark.parametrize("mode", ACTION_WORKFLOWS)
def test_action_workflow_real_use_defaults(mode):
    """The action models' settings (defaults.ACTION_*): 5 fps, 30 steps, cfg 1, shift 10, the condition node's
    text and action both wired into the sampler; policy / inverse dynamics save their actions."""
    from cosmos3_core import defaults

    api = load_api(mode)
    (loader,) = nodes_of(api, "Cosmos3Loader")
    assert api[loader]["inputs"] == {"checkpoint": REAL_CHECKPOINT, "dtype": "auto", "device": "default"}
    (ac,) = nodes_of(api, "Cosmos3ActionCondition")
    a = api[ac]["inputs"]
    assert a["mode"] == mode.removeprefix("action_") and a["fps"] == defaults.ACTION_FPS
    assert a["chunk_size"] == defaults.ACTION_CHUNK_SIZE and a["resolution_tier"] == str(defaults.ACTION_RESOLUTION_TIER)
    assert a["use_system_prompt"] is defaults.ACTION_USE_SYSTEM_PROMPT and a["negative_prompt"] == ""
    assert ("actions" in a) is (mode == "action_forward_dynamics")
    (ks,) = nodes_of(api, "Cosmos3KSamplerUniPCDualTower")
    k = api[ks]["inputs"]
    assert (k["steps"], k["cfg"], k["schedule"], k["shift"], k["sound"]) == (
        defaults.ACTION_STEPS, defaults.ACTION_GUIDANCE, defaults.ACTION_SCHEDULE, defaults.ACTION_SHIFT, False)
    assert k["text"] == [ac, 0] and k["action"] == [ac, 1] and "condition" not in k
    saves = nodes_of(api, "Cosmos3SaveActions")
    assert [api[s]["inputs"]["actions"] for s in saves] == ([] if mode == "action_forward_dynamics" else [[ks, 2]])
    if mode != "action_inverse_dynamics":
        (cv,) = nodes_of(api, "CreateVideo")
        assert api[cv]["inputs"]["fps"] == a["fps"], "Create Video fps must equal the action fps"

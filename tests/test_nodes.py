"""The Cosmos3 nodes in a real in-process ComfyUI 0.3.75 executor (UltimateSDUpscale-style: no mocks).

One process-wide host (tests/support/comfy_host.get_executor) with tiny random Nano (with sound) and Edge checkpoints
in its models/diffusers. Every shipped API workflow runs shrunk (96x64, 9 frames, 2 steps, fp32) and its output file
is read back; the text encode is cached across seeds; bad inputs give clear errors and the next run succeeds; an
interrupt during sampling ends the run as interrupted; the reasoner runs text-only and says clearly when it cannot
look at an image (no vision_encoder/ in the checkpoint); with vision_encoder/ (the ``*-vlm`` tiny checkpoints) the
reasoner_to_i2v workflow captions the image and its caption is the prompt the text encode runs on.

The progress-bar hook installed here is the one ``main.py`` installs (``hijack_progress``): it checks for an
interrupt at every progress update, so the sampler's per-step progress is its cancel point, as in the server.
"""
from __future__ import annotations

import re
import shutil
import sys
import unittest.mock
import uuid

import pytest
import torch

from cosmos3_core import api
from support import comfy_host
from test_workflows import (
    MODES,
    PACK_NODE_IDS,
    REASONER_MODES,
    TEST_IMAGE,
    TINY_DISTILLED,
    TINY_EDGE,
    TINY_EDGE_VLM,
    TINY_NANO,
    TINY_NANO_VLM,
    check_outputs,
    load_api,
    nodes_of,
    output_files,
    prepared_executor,
    shrink_api,
    tiny_checkpoint_for,
)

pytestmark = pytest.mark.comfy


class _Recorder:
    """Collects what the executor sends to the (never started) server: executing / executed events."""

    def __init__(self):
        self.events: list[tuple[str, dict]] = []

    def send_sync(self, event, data, sid=None):
        self.events.append((event, data))

    def executing(self) -> list[str]:
        return [d["node"] for e, d in self.events if e == "executing" and d.get("node") is not None]


@pytest.fixture(scope="module")
def host(tiny_checkpoint):
    h = prepared_executor(tiny_checkpoint)  # the node tests fail (with the import traceback) if the pack did not load

    import comfy.model_management as mm
    import comfy.utils
    from comfy_execution.utils import get_executing_context

    progress = []
    h.progress = progress
    h.on_progress = None  # a test may set a callback(node_id, value, total)

    def hook(value, total, preview_image, prompt_id=None, node_id=None):  # as main.hijack_progress
        ctx = get_executing_context()
        node_id = node_id or (ctx.node_id if ctx is not None else None)
        progress.append((node_id, value, total, preview_image))
        if h.on_progress is not None:
            h.on_progress(node_id, value, total)
        mm.throw_exception_if_processing_interrupted()

    old = comfy.utils.PROGRESS_BAR_HOOK
    comfy.utils.set_progress_bar_global_hook(hook)
    yield h
    comfy.utils.set_progress_bar_global_hook(old)
    del h.progress, h.on_progress


def run(host, graph: dict):
    """Run a graph, recording the executor's events. Returns (success, outputs, status_messages, recorder)."""
    rec = _Recorder()
    host.prompt_server.send_sync = rec.send_sync  # instance attribute shadows PromptServer.send_sync
    try:
        success, outputs, messages = host.run(graph, extra_data={"client_id": "cosmos3-tests"})
    finally:
        del host.prompt_server.send_sync
    return success, outputs, messages, rec


def error_of(messages) -> dict:
    errs = [d for e, d in messages if e == "execution_error"]
    assert errs, f"expected an execution_error, got {messages}"
    return errs[0]


def t2i_graph(**kw) -> dict:
    return shrink_api(load_api("t2i"), prefix="cosmos3_tests/ok", **kw)


def assert_next_run_succeeds(host):
    success, outputs, messages, _ = run(host, t2i_graph(seed=7))
    assert success, messages
    check_outputs(host.base_dir, "t2i", t2i_graph(), outputs)


# --------------------------------------------------------------------------------------------

def test_pack_registers_all_nodes(host):
    ids = host.assert_pack_loaded()
    assert set(PACK_NODE_IDS) <= set(ids), ids  # the seven frozen node ids (new nodes may be added)
    options = host.node_class_mappings["Cosmos3Loader"].INPUT_TYPES()["required"]["checkpoint"][1]["options"]
    assert TINY_NANO in options and TINY_EDGE in options, options


CASES = [(m, tiny_checkpoint_for(load_api(m))) for m in MODES if m not in REASONER_MODES] + \
    [("t2v", TINY_EDGE), ("i2v", TINY_EDGE)]


@pytest.mark.parametrize("mode,checkpoint", CASES, ids=[f"{m}-{c.rsplit('-', 1)[1]}" for m, c in CASES])
def test_workflow_runs_and_writes_media(host, mode, checkpoint):
    graph = shrink_api(load_api(mode), checkpoint=checkpoint, prefix=f"cosmos3_tests/{mode}_{checkpoint}")
    del host.progress[:]
    success, outputs, messages, rec = run(host, graph)
    assert success, comfy_host._execution_error_text(messages)
    assert any(e == "execution_success" for e, _ in messages), messages
    check_outputs(host.base_dir, mode, graph, outputs)
    # the sampler reports every denoise step (its cancel point) when it ran in this prompt
    (ks,) = nodes_of(graph, "Cosmos3KSamplerUniPCDualTower")
    if ks in rec.executing():
        steps = graph[ks]["inputs"]["steps"]
        ticks = [(v, t) for n, v, t, _ in host.progress if n == ks]
        assert [v for v, _ in ticks][-1] == steps and all(t == steps for _, t in ticks), ticks


def test_sampler_batch_size_makes_one_result_per_seed(host):
    """batch_size 2 on the T2I workflow: two different images from one sampler run (seeds s and s+1)."""
    import numpy as np
    from PIL import Image

    g = shrink_api(load_api("t2i"), prefix="cosmos3_tests/batch", seed=11)
    (ks,) = nodes_of(g, "Cosmos3KSamplerUniPCDualTower")
    g[ks]["inputs"]["batch_size"] = 2
    success, outputs, messages, _ = run(host, g)
    assert success, comfy_host._execution_error_text(messages)
    files = output_files(host.base_dir, outputs[nodes_of(g, "SaveImage")[0]])
    assert len(files) == 2, files
    a, b = (np.asarray(Image.open(f), dtype=np.float64) for f in files)
    assert a.shape == b.shape == (64, 96, 3) and np.abs(a - b).mean() > 1.0


def test_text_encode_runs_once_across_seeds(host):
    """Re-queuing with another seed re-uses the cached text K/V: loader and text encode cached, sampler runs."""
    tag = f" (cache probe {uuid.uuid4().hex[:8]})"  # a prompt no earlier test encoded
    first = shrink_api(load_api("t2av"), seed=1, prompt_suffix=tag, prefix="cosmos3_tests/seed")
    second = shrink_api(load_api("t2av"), seed=2, prompt_suffix=tag, prefix="cosmos3_tests/seed")
    ok1, out1, msgs1, rec1 = run(host, first)
    assert ok1, comfy_host._execution_error_text(msgs1)
    assert "2" in rec1.executing() and "3" in rec1.executing(), rec1.executing()
    ok2, out2, msgs2, rec2 = run(host, second)
    assert ok2, comfy_host._execution_error_text(msgs2)
    cached = next(d["nodes"] for e, d in msgs2 if e == "execution_cached")
    ran = rec2.executing()
    assert "1" in cached and "2" in cached, cached  # Cosmos3Loader, Cosmos3TextEncode
    assert "1" not in ran and "2" not in ran, ran
    for nid in ("3", "4", "5", "6", "7"):  # sampler, decoders, CreateVideo, SaveVideo ran again
        assert nid in ran, (nid, ran)
    f1 = check_outputs(host.base_dir, "t2av", first, out1)[0]
    f2 = check_outputs(host.base_dir, "t2av", second, out2)[0]
    assert f1 != f2 and f1.read_bytes() != f2.read_bytes(), "a new seed must give a new video"


def test_sampler_sends_latent_previews_when_enabled(host):
    """With ``--preview-method auto`` every denoise step carries a preview image (Wan2.2 latent -> RGB)."""
    from comfy.cli_args import LatentPreviewMethod, args

    g = shrink_api(load_api("t2v"), steps=3, prompt_suffix=f" (preview {uuid.uuid4().hex[:6]})",
                   prefix="cosmos3_tests/preview")
    (ks,) = nodes_of(g, "Cosmos3KSamplerUniPCDualTower")
    old = args.preview_method
    args.preview_method = LatentPreviewMethod.Auto
    del host.progress[:]
    try:
        success, outputs, messages, _ = run(host, g)
    finally:
        args.preview_method = old
    assert success, comfy_host._execution_error_text(messages)
    previews = [p for n, _, _, p in host.progress if n == ks]
    assert len(previews) == 3 and all(p is not None for p in previews), previews
    fmt, image, max_size = previews[-1]
    assert fmt == "JPEG" and image.size[0] > 0 and image.size[1] > 0, previews[-1]


# -- bad inputs: a clear message (node, value, fix), then the next run succeeds ---------------

def _expect_error(host, graph, node_type, *needles):
    success, outputs, messages, _ = run(host, graph)
    assert not success, f"expected {node_type} to fail"
    err = error_of(messages)
    msg = err["exception_message"]
    assert err["node_type"] == node_type, err
    assert msg.startswith(node_type), msg  # the message itself names the node (the UI shows only the message)
    for needle in needles:
        assert needle in msg, f"{needle!r} not in {msg!r}"
    assert_next_run_succeeds(host)
    return msg


def test_compiled_vae_decode_at_many_sizes_across_prompts(host, monkeypatch):
    """Cosmos3VAEDecode with compile on, three prompts at three video sizes: ComfyUI runs each prompt in a fresh
    asyncio task (a copy of its worker's context) and torch keeps compile settings per context, so each compiled
    decode must raise Dynamo's recompile limit itself (3 sizes × 4 graphs of the decoder's up-block stage are over
    the default 8, which fails a full-graph compile). The decoder compiles with aot_eager here (seconds, not
    inductor's minutes on a CPU)."""
    import sys

    import torch._dynamo.config

    for name, module in list(sys.modules.items()):  # the pack's copy of the core, and the tests' own
        if name.endswith("cosmos3_core.vae.video") and hasattr(module, "Cosmos3VAE"):
            original = module.Cosmos3VAE.frame_decoder

            def frame_decoder(self, compile=False, compile_backend="inductor", original=original):
                return original(self, compile, "aot_eager")

            monkeypatch.setattr(module.Cosmos3VAE, "frame_decoder", frame_decoder)
    with torch._dynamo.config.patch(recompile_limit=8):  # torch's default, whatever earlier tests set here
        for width, height in ((96, 64), (64, 64), (64, 96)):
            graph = shrink_api(load_api("t2v"), width=width, height=height, prefix=f"cosmos3_tests/cd{width}x{height}")
            (decode_id,) = nodes_of(graph, "Cosmos3VAEDecode")
            graph[decode_id]["inputs"]["compile"] = "on"
            success, outputs, messages, _ = run(host, graph)
            assert success, error_of(messages)["exception_message"]


@pytest.mark.parametrize("name, why", [("Cosmos3-Nano-missing", r"was not found;"),
                                       ("Cosmos3-Nano", r"was not found and \d+ Nano checkpoints were;")])
def test_missing_checkpoint_is_refused_at_validation(host, name, why):
    """ComfyUI 0.3.75 does not check a V3 combo's value against its options: the loader's ``validate_inputs``
    refuses a name that stands for no folder before anything runs, listing what it found and where it looked. The
    shipped name ``Cosmos3-Nano`` would stand for the one Nano checkpoint found; this host has several."""
    g = t2i_graph(checkpoint=name)
    ok, _, _, node_errors = host.validate(g)
    (loader,) = nodes_of(g, "Cosmos3Loader")
    assert not ok and list(node_errors) == [loader], node_errors
    (error,) = node_errors[loader]["errors"]
    assert error["type"] == "custom_validation_failed", error
    msg = error["details"]
    assert msg.startswith(f"checkpoint - Cosmos3Loader: checkpoint {name!r} "), msg
    assert re.search(f"{re.escape(repr(name))} {why} pick one in Load Cosmos3 Checkpoint — in ", msg), msg
    models = host.base_dir / "models"
    for needle in (f"in {models / 'cosmos3'}: none; in {models / 'diffusers'}: '", f"'{TINY_NANO}' (Nano)",
                   f"'{TINY_EDGE}' (Edge)", f"'{TINY_DISTILLED}' (distilled 4-step)",
                   "put its folder (with transformer/config.json) in one of those folders and press r to refresh"):
        assert needle in msg, f"{needle!r} not in {msg!r}"
    assert_next_run_succeeds(host)


def test_a_shipped_name_means_a_checkpoint_of_its_own_model(host, monkeypatch, tmp_path):
    """A template's ``Cosmos3-Nano`` stands for the one Nano found under another name and ``Cosmos3-Super`` for the
    one Super (told apart by their geometry: 64/8 heads against 32/8, the tiny checkpoints 8/1 against 4/2) — never
    Super for a Nano workflow, which would load a 64 B model onto a desktop card."""
    import folder_paths

    from cosmos3_core.testing.tiny import build_tiny_checkpoint

    loader = sys.modules[host.node_class_mappings["Cosmos3Loader"].__module__]
    root = tmp_path / "cosmos3"
    build_tiny_checkpoint(root / "my-super", variant="super", seed=0)
    monkeypatch.setitem(folder_paths.folder_names_and_paths, "cosmos3", ([str(root)], set()))
    monkeypatch.setitem(folder_paths.folder_names_and_paths, "diffusers", ([str(tmp_path / "none")], set()))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert loader.checkpoint_kind(root / "my-super") == "Super"
    assert loader.resolve_checkpoint("Cosmos3-Super") == ("my-super", root / "my-super")
    assert loader.resolve_checkpoint("Cosmos3-Nano") is None
    assert "'my-super' (Super)" in loader.missing_checkpoint_message("Cosmos3-Nano")
    shutil.copytree(host.base_dir / "models" / "diffusers" / TINY_NANO, root / "my-nano")
    assert loader.resolve_checkpoint("Cosmos3-Nano") == ("my-nano", root / "my-nano")
    assert loader.resolve_checkpoint("Cosmos3-Super") == ("my-super", root / "my-super")


def test_partial_checkpoint_without_transformer_config(host):
    root = host.base_dir / "models" / "diffusers"
    partial = root / "cosmos3-partial"
    shutil.copytree(root / TINY_NANO, partial)
    try:
        (partial / "transformer" / "config.json").unlink()
        options = host.node_class_mappings["Cosmos3Loader"].INPUT_TYPES()["required"]["checkpoint"][1]["options"]
        assert "cosmos3-partial" not in options and TINY_NANO in options, options
        _expect_error(host, t2i_graph(checkpoint="cosmos3-partial"), "Cosmos3Loader",
                      "'cosmos3-partial'", "transformer/config.json")
    finally:
        shutil.rmtree(partial)


def test_partial_checkpoint_missing_weights(host):
    root = host.base_dir / "models" / "diffusers"
    partial = root / "cosmos3-no-weights"
    shutil.copytree(root / TINY_NANO, partial)
    try:
        for f in (partial / "transformer").glob("*.safetensors"):
            f.unlink()
        _expect_error(host, t2i_graph(checkpoint="cosmos3-no-weights"), "Cosmos3Loader",
                      "'cosmos3-no-weights'", "cannot be loaded", "missing", "fetch the missing files")
    finally:
        shutil.rmtree(partial)


def test_sound_on_edge(host):
    g = shrink_api(load_api("t2av"), checkpoint=TINY_EDGE)
    _expect_error(host, g, "Cosmos3KSamplerUniPCDualTower", "sound=True", TINY_EDGE, "set sound to false")


def test_width_not_multiple_of_16(host):
    g = t2i_graph()
    g["2"]["inputs"]["width"] = 100
    # min/max pass (16..4096) and 0.3.75's validate_prompt does not enforce `step`: the node must catch it
    assert host.validate(g)[0]
    _expect_error(host, g, "Cosmos3TextEncode", "width=100", "multiple of 16", "try 96")
    g["2"]["inputs"]["width"] = 8  # below min: ComfyUI's own validation names node, input and limit
    with pytest.raises(comfy_host.PromptValidationError) as e:
        run(host, g)
    err = e.value.node_errors["2"]
    assert err["class_type"] == "Cosmos3TextEncode"
    assert "Value 8 smaller than min of 16" in err["errors"][0]["message"] and err["errors"][0]["details"] == "width"


def test_width_not_multiple_of_16_in_condition(host):
    g = shrink_api(load_api("i2v"), width=100)  # the Width primitive feeds both nodes
    success, _, messages, _ = run(host, g)
    assert not success
    msg = error_of(messages)["exception_message"]
    assert any(msg.startswith(n) for n in ("Cosmos3TextEncode", "Cosmos3VAEEncodeCond")), msg
    assert "100" in msg and "multiple of 16" in msg and "96" in msg, msg
    assert_next_run_succeeds(host)


def test_num_frames_not_4k_plus_1(host):
    g = shrink_api(load_api("t2v"))
    g["2"]["inputs"]["num_frames"] = 10
    assert host.validate(g)[0]  # `step` is not enforced by the host
    _expect_error(host, g, "Cosmos3TextEncode", "num_frames=10", "4k+1", "try 9")


def test_wrong_image_shape_into_condition(host):
    """A mask-like [1, H, W] tensor on an IMAGE socket (a test-only node emits it through the real executor)."""

    class Cosmos3TestMaskAsImage:
        @classmethod
        def INPUT_TYPES(cls):
            return {"required": {}}

        RETURN_TYPES = ("IMAGE",)
        FUNCTION = "make"
        CATEGORY = "testing"

        def make(self):
            return (torch.zeros(1, 64, 96),)

    host.node_class_mappings["Cosmos3TestMaskAsImage"] = Cosmos3TestMaskAsImage
    try:
        g = shrink_api(load_api("i2v"))
        g["9"] = {"class_type": "Cosmos3TestMaskAsImage", "inputs": {}}
        _expect_error(host, g, "Cosmos3VAEEncodeCond", "(1, 64, 96)", "[frames, H, W, 3]")
    finally:
        del host.node_class_mappings["Cosmos3TestMaskAsImage"]
    # the node class itself, called directly, says the same for a 1-channel batch
    cls = host.node_class_mappings["Cosmos3VAEEncodeCond"]
    with pytest.raises(ValueError, match=r"Cosmos3VAEEncodeCond: image has shape \(2, 64, 96, 1\)"):
        cls.execute(model=None, image=torch.zeros(2, 64, 96, 1), width=96, height=64)


def test_condition_size_mismatch(host):
    g = shrink_api(load_api("i2v"))
    # encode the condition at 128x64 while the text describes 96x64
    g["8"]["inputs"]["width"] = 128
    _expect_error(host, g, "Cosmos3KSamplerUniPCDualTower", "128x64", "96x64", "same width and height")


def test_condition_covering_the_whole_clip(host):
    g = shrink_api(load_api("v2v"))  # 9 frames = 3 latent frames
    g["8"]["inputs"]["clean_latent_frames"] = 3
    _expect_error(host, g, "Cosmos3KSamplerUniPCDualTower", "3 clean latent frames", "nothing would be generated",
                  "Lower clean_latent_frames")


def test_unknown_dtype(host):
    """0.3.75 does not check V3 combo values in validate_prompt, so the loader must name a bad dtype itself."""
    g = t2i_graph()
    g["1"]["inputs"]["dtype"] = "bf17"
    success, _, messages, _ = run(host, g)
    assert not success
    _expect_error(host, g, "Cosmos3Loader", "'bf17'", "fp32")


# -- cancel -----------------------------------------------------------------------------------

def test_interrupt_during_sampling_then_next_run_succeeds(host):
    import comfy.model_management as mm

    g = shrink_api(load_api("t2v"), steps=3, prompt_suffix=f" (interrupt {uuid.uuid4().hex[:6]})")
    (ks,) = nodes_of(g, "Cosmos3KSamplerUniPCDualTower")
    hits = []

    def interrupt_at_step_1(node_id, value, total):
        if node_id == ks and value >= 1 and not hits:
            hits.append(value)
            mm.interrupt_current_processing(True)  # what POST /interrupt does

    host.on_progress = interrupt_at_step_1
    try:
        success, outputs, messages, rec = run(host, g)
    finally:
        host.on_progress = None
    assert hits == [1], hits
    assert not success
    events = [e for e, _ in messages]
    assert "execution_interrupted" in events and "execution_error" not in events, events
    data = next(d for e, d in messages if e == "execution_interrupted")
    assert data["node_id"] == ks and data["node_type"] == "Cosmos3KSamplerUniPCDualTower", data
    assert "7" not in outputs, "nothing may be saved after an interrupt"
    assert "4" not in rec.executing(), "the decoder must not run after an interrupt"
    # the next queued prompt runs normally (the executor clears the interrupt flag)
    ok, out, msgs, _ = run(host, shrink_api(load_api("t2v"), prefix="cosmos3_tests/after_interrupt"))
    assert ok, comfy_host._execution_error_text(msgs)
    check_outputs(host.base_dir, "t2v", shrink_api(load_api("t2v")), out)


# -- reasoner ---------------------------------------------------------------------------------

def reasoner_graph(**inputs) -> dict:
    return {
        "1": {"class_type": "Cosmos3Loader", "inputs": {"checkpoint": TINY_NANO, "dtype": "fp32", "device": "default"}},
        "2": {"class_type": "Cosmos3Reasoner", "inputs": {"model": ["1", 0], "prompt": "a fox in the snow", **inputs}},
        "3": {"class_type": "PreviewAny", "inputs": {"source": ["2", 0]}},
    }


def test_reasoner_text_only_runs(host):
    """The stub-era API graph (model + prompt only) still runs: the reasoner expands the idea into text."""
    success, outputs, messages, _ = run(host, reasoner_graph())
    assert success, comfy_host._execution_error_text(messages)
    text = outputs["3"]["text"]
    assert isinstance(text, list) and len(text) == 1 and isinstance(text[0], str), outputs


def test_reasoner_without_vision_encoder_says_so(host):
    """An image needs the checkpoint's vision_encoder/ (the tiny checkpoint has none): a clear "cannot" error
    naming the node, the folder and the fix; the next run succeeds."""
    g = reasoner_graph(task="caption")
    g["2"]["inputs"]["image"] = ["9", 0]
    g["9"] = {"class_type": "LoadImage", "inputs": {"image": TEST_IMAGE}}
    success, _, messages, _ = run(host, g)
    assert not success
    err = error_of(messages)
    assert err["node_type"] == "Cosmos3Reasoner", err
    msg = err["exception_message"]
    assert msg.startswith("Cosmos3Reasoner") and "vision_encoder/" in msg and "cannot" in msg, msg
    assert_next_run_succeeds(host)


@pytest.mark.parametrize("checkpoint", [TINY_NANO_VLM, TINY_EDGE_VLM], ids=["nano", "edge"])
def test_reasoner_to_i2v_caption_is_the_prompt(host, checkpoint, monkeypatch):
    """The shipped reasoner_to_i2v graph (shrunk, 8 new tokens) on a checkpoint with vision_encoder/: it runs, writes
    the mp4, and the STRING the reasoner produced (shown by PreviewAny) is exactly the prompt Cosmos3TextEncode got."""
    graph = shrink_api(load_api("reasoner_to_i2v"), checkpoint=checkpoint,
                       prefix=f"cosmos3_tests/reasoner_to_i2v_{checkpoint}")
    (rs,) = nodes_of(graph, "Cosmos3Reasoner")
    (te,) = nodes_of(graph, "Cosmos3TextEncode")
    (pv,) = nodes_of(graph, "PreviewAny")
    assert graph[rs]["inputs"]["task"] == "caption" and graph[rs]["inputs"]["max_new_tokens"] == 8
    assert graph[te]["inputs"]["prompt"] == [rs, 0]

    # a spy around the real node (V3 runs a clone of the class made at execution time, so it sees the spy)
    cls = host.node_class_mappings["Cosmos3TextEncode"]
    original = cls.__dict__["execute"].__func__
    seen = []

    def spy(c, *args, **kwargs):
        seen.append(kwargs.get("prompt"))
        return original(c, *args, **kwargs)

    monkeypatch.setattr(cls, "execute", classmethod(spy))
    success, outputs, messages, rec = run(host, graph)
    assert success, comfy_host._execution_error_text(messages)
    assert rs in rec.executing() and te in rec.executing(), rec.executing()
    check_outputs(host.base_dir, "reasoner_to_i2v", graph, outputs)
    (caption,) = outputs[pv]["text"]
    assert isinstance(caption, str) and caption.strip(), outputs[pv]
    assert seen == [caption], (seen, caption)


# -- weight streaming ---------------------------------------------------------------------------------------------
def test_partially_loaded_generation_tower_streams_weights_and_matches(host):
    """With ComfyUI's lowvram partial load (as on a small GPU), the generation tower's linear layers keep their
    weights on the offload device and cast them per call; the result equals the fully loaded one."""
    loader = host.node_class_mappings["Cosmos3Loader"]
    handle = loader.execute(checkpoint=TINY_NANO, dtype="fp32", device="default").args[0]
    pipe = handle.pipeline
    text = pipe.encode_text("a red robot", None, num_frames=9, height=64, width=96, fps=24.0)
    full = pipe.run(api.plan(pipe, text, seed=3, steps=2))
    patcher = handle.generation_patcher
    patcher.patch_model(device_to=patcher.load_device, lowvram_model_memory=1, load_weights=True)
    try:
        streamed = [m for m in patcher.model.modules() if getattr(m, "comfy_cast_weights", False)]
        assert len(streamed) >= 10  # the big linears were left to stream
        partial = pipe.run(api.plan(pipe, text, seed=3, steps=2))
    finally:
        patcher.unpatch_model(patcher.offload_device)
    assert torch.allclose(partial.latents, full.latents, rtol=1e-5, atol=1e-6)


def test_compiled_layer_survives_a_partial_load(host, monkeypatch, tmp_path):
    """A compiled generation layer is reused after a lowvram episode. ComfyUI's unpatch after a partial load leaves
    ``comfy_cast_weights`` / ``weight_function`` / ``bias_function`` as instance attributes where the layer had only
    its class's; the graph's guards read them (``comfy.ops`` forward), so without the pack's layers holding them from
    the start every kind of job compiled its graph again after a small-card episode, and the file kept on disk was
    overwritten with that variant, which the next server then compiled again (found by the soak on an H100:
    "does not fit this call's inputs ... ___dict_contains('comfy_cast_weights', ...)")."""
    import sys

    from cosmos3_core.runtime import RuntimeOptions

    monkeypatch.setenv("COSMOS3_CACHE_DIR", str(tmp_path))
    handle = host.node_class_mappings["Cosmos3Loader"].execute(checkpoint=TINY_NANO, dtype="fp32",
                                                               device="default").args[0]
    pipe = handle.pipeline
    core = type(pipe).__module__.rsplit(".", 1)[0]  # the pack's copy of the core, which the pipeline runs
    options = RuntimeOptions(compile="on", compile_backend="aot_eager", device_type="cpu")
    layer = sys.modules[f"{core}.model.transformer"].generation_layer_fn(options)
    text = pipe.encode_text("a red robot", None, num_frames=9, height=64, width=96, fps=24.0)
    first = pipe.run(api.plan(pipe, text, seed=3, steps=2, options=options)).latents
    graphs = sum(len(v) for v in layer._by_key.values())
    made = layer.compiled + layer.loaded
    patcher = handle.generation_patcher
    patcher.patch_model(device_to=patcher.load_device, lowvram_model_memory=1, load_weights=True)
    patcher.unpatch_model(patcher.offload_device)
    again = pipe.run(api.plan(pipe, text, seed=3, steps=2, options=options)).latents
    assert (layer.compiled + layer.loaded, sum(len(v) for v in layer._by_key.values())) == (made, graphs)
    assert torch.equal(again, first)


def test_partial_load_brings_unstreamable_modules_along(host):
    """ComfyUI's partial load leaves whatever does not fit on the offload device; only comfy.ops layers can stream
    from there. The handle picks the rest (norms, embeddings, loose parameters) to follow the tower to the load
    device. A real ModelPatcher whose load device is "meta" shows the choice on the CPU (the move itself, and the
    streamed run it enables, were checked on the H200: BENCHMARKS.md "Small GPUs")."""
    import sys

    import comfy.model_patcher
    import comfy.ops

    from cosmos3_core.config import Cosmos3Config
    from cosmos3_core.model.towers import tower_module
    from cosmos3_core.model.transformer import Cosmos3Transformer

    handle_module = sys.modules[type(host.node_class_mappings["Cosmos3Loader"].execute(
        checkpoint=TINY_NANO, dtype="fp32", device="default").args[0]).__module__]
    model = Cosmos3Transformer(Cosmos3Config(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                             num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                             vocab_size=100, rope_scaling={"mrope_section": [4, 2, 2]}),
                               linear=comfy.ops.disable_weight_init.Linear)
    holder = torch.nn.Module()
    holder.add_module("inner", tower_module(model, "generation"))
    patcher = comfy.model_patcher.ModelPatcher(holder, load_device=torch.device("meta"),
                                               offload_device=torch.device("cpu"))
    chosen = {id(t) for *_, t in handle_module._unstreamable_tensors(patcher)}
    streamable = unstreamable = 0
    for module in holder.modules():
        for param in module.parameters(recurse=False):
            if hasattr(module, "comfy_cast_weights"):
                assert id(param) not in chosen, type(module).__name__  # left to ComfyUI (it streams these)
                streamable += 1
            else:
                assert id(param) in chosen, type(module).__name__
                unstreamable += 1
    assert streamable >= 14 and unstreamable >= 8, (streamable, unstreamable)
    assert id(model.norm_moe_gen.weight) in chosen  # the tower view shares the model's own parameters
    # what ComfyUI's own partial unload pinned on the host (ModelPatcher.pinned; cudaHostRegister on CUDA, stubbed
    # here) is unpinned through its bookkeeping before the handle moves it: never host storage freed while registered
    import comfy.model_management as mm

    patcher.load_device = torch.device("cpu")
    patcher.load(torch.device("cpu"), full_load=True)
    registered = set()
    with unittest.mock.patch.object(mm, "pin_memory", lambda t: registered.add(t.data_ptr()) or True), \
            unittest.mock.patch.object(mm, "unpin_memory", lambda t: registered.discard(t.data_ptr()) or True):
        patcher.partially_unload(torch.device("cpu"), memory_to_free=2**40)
        pinned_by_comfy = set(patcher.pinned)
        patcher.load_device = torch.device("meta")
        assert handle_module._unpin_unstreamable(
            patcher, list(handle_module._unstreamable_tensors(patcher))) == unstreamable
    params = dict(holder.named_parameters())
    assert len(pinned_by_comfy) == streamable + unstreamable  # ComfyUI pinned every module it moved
    assert {id(params[k]) for k in patcher.pinned} == {id(p) for m in holder.modules()
                                                       if hasattr(m, "comfy_cast_weights")
                                                       for p in m.parameters(recurse=False)}  # streamed: kept
    assert registered == {p.data_ptr() for k, p in params.items() if k in patcher.pinned}
    # an unpin CUDA refused (the weight still registered after ComfyUI's unpin): one message with the fix
    patcher.pinned.add(next(iter(pinned_by_comfy - patcher.pinned)))
    patcher.load_device = torch.device("meta")
    with unittest.mock.patch.object(torch.Tensor, "is_pinned", lambda t: True), \
            pytest.raises(RuntimeError, match="could not unpin 1 host weights .*--disable-pinned-memory"):
        handle_module._unpin_unstreamable(patcher, list(handle_module._unstreamable_tensors(patcher)))
    patcher.load_device = torch.device("cpu")  # everything already where it should be: nothing to move
    assert not list(handle_module._unstreamable_tensors(patcher))

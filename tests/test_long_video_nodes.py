"""Cosmos3LongVideo in the real in-process ComfyUI 0.3.75 executor (no mocks), on the tiny Nano checkpoint.

The shipped long-video workflows run shrunk (windows of 9 frames): the node writes the mp4 itself (read back here:
frames, size, rate), returns it as a VIDEO, previews each finished window and reports progress per window and step;
an interrupt in the second window leaves a playable mp4 of the first; bad inputs name the node, the value and the
fix, and the next run works.
"""
from __future__ import annotations

import uuid

import pytest

from cosmos3_core.kernels.attention import flash4_unavailable_reason
from support import comfy_host
from test_workflows import check_mp4, load_api, nodes_of, output_files, prepared_executor, shrink_api

pytestmark = pytest.mark.comfy


@pytest.fixture(scope="module")
def host(tiny_checkpoint):
    h = prepared_executor(tiny_checkpoint)

    import comfy.model_management as mm
    import comfy.utils

    h.long_progress, h.on_long_progress = [], None

    def hook(value, total, preview, prompt_id=None, node_id=None):  # as main.hijack_progress
        h.long_progress.append((value, total, preview))
        if h.on_long_progress is not None:
            h.on_long_progress(value, total)
        mm.throw_exception_if_processing_interrupted()

    old = comfy.utils.PROGRESS_BAR_HOOK
    comfy.utils.set_progress_bar_global_hook(hook)
    yield h
    comfy.utils.set_progress_bar_global_hook(old)


def long_file(host, graph, outputs):
    (nid,) = nodes_of(graph, "Cosmos3LongVideo")
    assert nid in outputs, outputs
    (path,) = output_files(host.base_dir, outputs[nid])
    return path


@pytest.mark.parametrize("mode,frames", [("long_t2v", 17), ("transfer", 13)])
def test_long_video_workflow_writes_the_mp4_and_previews_windows(host, mode, frames):
    graph = shrink_api(load_api(mode), prefix=f"cosmos3_tests/{mode}", prompt_suffix=f" {uuid.uuid4().hex[:6]}")
    del host.long_progress[:]
    success, outputs, messages = host.run(graph)
    assert success, comfy_host._execution_error_text(messages)
    check_mp4(long_file(host, graph, outputs), 96, 64, frames, 24.0, audio=False)  # 17: 3 windows; 13: the clip
    windows = 3 if mode == "long_t2v" else 2
    steps = [(v, t) for v, t, p in host.long_progress if t == windows * 2]
    assert steps[-1] == (windows * 2, windows * 2)  # every step of every window, 2 steps each
    window_previews = [p for _, _, p in host.long_progress if p is not None and p[1].size == (96, 64)]
    assert len(window_previews) == windows  # each finished window's last frame


def test_interrupt_in_window_two_keeps_a_playable_file_of_window_one(host):
    import comfy.model_management as mm

    graph = shrink_api(load_api("long_t2v"), prefix="cosmos3_tests/long_cut", prompt_suffix=f" {uuid.uuid4().hex}")
    hits = []

    def interrupt_in_window_two(value, total):
        if total == 6 and value == 3 and not hits:  # window 2 (of 3), first step
            hits.append(value)
            mm.interrupt_current_processing(True)

    host.on_long_progress = interrupt_in_window_two
    try:
        success, outputs, messages = host.run(graph)
    finally:
        host.on_long_progress = None
    assert hits and not success
    assert "execution_interrupted" in [e for e, _ in messages]
    written = sorted((host.base_dir / "output" / "cosmos3_tests").glob("long_cut_*.mp4"))
    assert written, "the node must leave the finished windows on disk"
    check_mp4(written[-1], 96, 64, 9, 24.0, audio=False)  # window 1 only, playable
    success, outputs, messages = host.run(shrink_api(load_api("long_t2v"), prefix="cosmos3_tests/long_after"))
    assert success, comfy_host._execution_error_text(messages)


@pytest.mark.parametrize("change, message", [
    (dict(num_frames=20), "Cosmos3LongVideo: num_frames=20 must be 4k+1"),
    (dict(conditional_frames=9), "conditional_frames=9 must be smaller than frames_per_chunk=9"),
    (dict(prompt="a fox\n---\nthe fox sleeps"), "2 prompts were given for 3 windows"),
    pytest.param(dict(attention="flash4"), "Cosmos3LongVideo: attention='flash4': FlashAttention-4 cannot run here",
                 marks=pytest.mark.skipif(not flash4_unavailable_reason(), reason="FlashAttention-4 runs here")),
])
def test_bad_input_is_one_clear_message(host, change, message):
    graph = shrink_api(load_api("long_t2v"), prefix="cosmos3_tests/long_bad")
    (nid,) = nodes_of(graph, "Cosmos3LongVideo")
    graph[nid]["inputs"].update(change)
    success, _, messages = host.run(graph)
    assert not success
    text = comfy_host._execution_error_text(messages)
    assert message in text and "Traceback" not in text.split("\n")[0], text


def test_num_frames_below_one_window_is_refused_by_the_host(host):
    """num_frames's range starts at 5 (the canvas offers 5, 9, 13, …: the valid lengths); ComfyUI refuses 1."""
    graph = shrink_api(load_api("long_t2v"), prefix="cosmos3_tests/long_bad")
    (nid,) = nodes_of(graph, "Cosmos3LongVideo")
    graph[nid]["inputs"]["num_frames"] = 1
    with pytest.raises(comfy_host.PromptValidationError) as err:
        host.run(graph)
    assert "num_frames" in str(err.value) and "smaller than min of 5" in str(err.value), err.value


def test_control_videos_of_different_sizes_are_refused(host):
    graph = shrink_api(load_api("transfer"), prefix="cosmos3_tests/transfer_bad")
    (nid,) = nodes_of(graph, "Cosmos3LongVideo")
    (canny,) = nodes_of(graph, "Canny")
    graph["90"] = {"class_type": "ImageScale", "inputs": {"image": [canny, 0], "upscale_method": "nearest-exact",
                                                          "width": 64, "height": 64, "crop": "disabled"}}
    graph[nid]["inputs"]["depth"] = ["90", 0]
    success, _, messages = host.run(graph)
    assert not success
    text = comfy_host._execution_error_text(messages)
    assert "Cosmos3LongVideo: control depth is 64x64 but control edge is 112x64" in text, text

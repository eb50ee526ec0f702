"""``resolve.resolve``: one request, every default and every check decided once, by mode and by checkpoint.

The defaults asserted here are the reference's (diffusers 0.42.1 ``Cosmos3OmniPipeline.__call__``: guidance 6, 35
video / 50 image steps, flow shift by tier; the modular Transfer pipeline: one conditional frame, no negative
prompt, the Transfer system prompt; the modular action examples: 5 fps, 30 steps, guidance 1, shift 10, no system
prompt; the distilled pipeline: the checkpoint's schedule, guidance 1) and the pack's documented windowing (a clip
above 189 frames runs as 189-frame windows overlapping by 5 frames, unless one pass is asked for).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cosmos3_core import defaults
from cosmos3_core.request import ActionRequest, CheckpointInfo, Request
from cosmos3_core.resolve import resolve, resolve_clip

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def nano(tiny_checkpoint):
    return tiny_checkpoint("nano", sound=True, seed=1)


@pytest.fixture(scope="module")
def edge(tiny_checkpoint):
    return tiny_checkpoint("edge", sound=False, seed=2)


@pytest.fixture(scope="module")
def distilled(tiny_checkpoint):
    return tiny_checkpoint("super", sound=False, seed=3, distilled=True)


def test_clip_defaults_follow_the_reference(nano):
    run = resolve(Request(prompt="a car"), nano)
    s = run.sampling
    assert (run.mode, run.num_frames, run.height, run.width, run.fps) == ("clip", 189, 720, 1280, 24.0)
    assert (s.steps, s.guidance, s.shift, s.schedule, s.distilled) == (35, 6.0, 10.0, "flow_shift", False)
    image = resolve(Request(prompt="a car", num_frames=1, height=480, width=832), nano)
    assert (image.sampling.steps, image.sampling.shift) == (50, 5.0)
    info = CheckpointInfo.read(nano)
    assert run.use_system_prompt is info.default_use_system_prompt is True and run.negative_prompt is None


def test_long_clips_run_as_windows_by_default(nano):
    run = resolve(Request(prompt="a car", num_frames=381, height=480, width=832), nano)
    g = run.windows
    assert run.mode == "windows" and (g.chunk_frames, g.conditional_frames, g.total_frames) == (189, 5, 381)
    assert g.num_windows == 3 and run.sampling.steps == 35
    assert resolve(Request(prompt="a car", num_frames=189, height=480, width=832), nano).mode == "clip"
    one = resolve(Request(prompt="a car", num_frames=381, height=480, width=832, one_pass=True), nano)
    assert one.mode == "clip" and one.windows is None and one.num_frames == 381
    with pytest.raises(ValueError, match="num_frames=383 must be 4k\\+1"):
        resolve(Request(prompt="a car", num_frames=383, height=480, width=832), nano)


def test_a_text_encode_above_one_clip_points_to_windows(nano):
    info = CheckpointInfo.read(nano)
    with pytest.raises(ValueError, match="num_frames=381 is longer than one Cosmos3 clip .*Cosmos3 Long Video"):
        resolve_clip("a car", None, num_frames=381, height=480, width=832, fps=24.0, checkpoint=info)
    resolve_clip("a car", None, num_frames=381, height=480, width=832, fps=24.0, checkpoint=info, one_pass=True)


def test_transfer_defaults(nano):
    controls = {"edge": np.zeros((9, 32, 48, 3), np.float32)}
    run = resolve(Request(prompt="a car", controls=controls, height=32, width=48, frames_per_chunk=5), nano)
    assert run.mode == "transfer" and run.windows.conditional_frames == defaults.TRANSFER_CONDITIONAL_FRAMES == 1
    assert run.num_frames == 9 and run.use_system_prompt is True and run.negative_prompt is None
    with pytest.raises(ValueError, match="Transfer .* generates no sound"):
        resolve(Request(prompt="a car", controls=controls, height=32, width=48, sound=True), nano)


def test_action_defaults(nano):
    request = ActionRequest(mode="policy", chunk_size=4, domain_name="bridge_orig_lerobot", resolution_tier=256,
                            image=np.zeros((64, 96, 3), np.float32))
    run = resolve(Request(prompt="pick up the cup", action=request), nano)
    s = run.sampling
    assert (run.mode, run.fps, s.steps, s.guidance, s.shift) == ("action", 5.0, 30, 1.0, 10.0)
    assert run.use_system_prompt is False and run.negative_prompt == ""
    with pytest.raises(ValueError, match="guidance_interval does not apply to an action mode"):
        resolve(Request(prompt="x", action=request, guidance=6.0, guidance_interval=(800, 1000)), nano)


def test_the_checkpoint_decides_sound_and_the_distilled_schedule(edge, distilled):
    with pytest.raises(ValueError, match="sound=True, but checkpoint 'edge' has no sound_tokenizer/"):
        resolve(Request(prompt="a car", num_frames=9, height=32, width=48, sound=True), edge)
    run = resolve(Request(prompt="a car", num_frames=1, height=32, width=48), distilled)
    info = CheckpointInfo.read(distilled)
    assert (run.sampling.steps, run.sampling.guidance, run.sampling.distilled) == (info.distilled.steps, 1.0, True)
    with pytest.raises(ValueError, match="guidance_interval=.* has no effect on distilled checkpoint"):
        resolve(Request(prompt="a car", num_frames=1, height=32, width=48, guidance_interval=(800, 1000)), distilled)
    with pytest.raises(ValueError, match="is distilled .* the windows mode needs a base"):
        resolve(Request(prompt="a car", num_frames=13, frames_per_chunk=9, height=32, width=48), distilled)


def test_guidance_interval_without_guidance_is_refused_not_ignored(nano):
    with pytest.raises(ValueError, match="has no effect with guidance 1"):
        resolve(Request(prompt="a car", num_frames=9, height=32, width=48, guidance=1.0,
                        guidance_interval=(800, 1000)), nano)


def test_checks_that_need_no_checkpoint_come_first(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="^fps=0.0 must be a number"):
        resolve(Request(prompt="a car", fps=0.0), tmp_path / "empty")


def test_cli_windows_a_long_clip_by_default(nano, tmp_path):
    """``--num-frames 193`` on the CLI: two 189-frame windows (5 frames overlap) streamed into one 193-frame mp4."""
    out = tmp_path / "long.mp4"
    r = subprocess.run([sys.executable, "-m", "cosmos3_core.generate", "--checkpoint", str(nano), "--prompt", "a car",
                        "--num-frames", "193", "--height", "32", "--width", "48", "--steps", "1", "--device", "cpu",
                        "--dtype", "fp32", "--out", str(out)], capture_output=True, text=True, timeout=600,
                       cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert "window 2/2" in r.stderr
    from cosmos3_core.media import probe_media

    assert probe_media(out)["video_frames"] == 193


def test_edge_image_to_video_follows_its_published_recipe(edge, nano):
    """Cosmos3-Edge's model card (2026-08-25): image-to-video at 832x480, 121 frames, 20 steps, guidance 6, flow shift
    12. Each value the request leaves unset comes from it on an Edge checkpoint; a value given wins."""
    image = np.zeros((64, 96, 3), np.float32)
    run = resolve(Request(prompt="a car", image=image), edge)
    s = run.sampling
    assert (run.mode, run.width, run.height, run.num_frames, run.fps) == ("clip", 832, 480, 121, 24.0)
    assert (s.steps, s.guidance, s.shift, s.schedule) == (20, 6.0, 12.0, "flow_shift")
    assert run.recipe == "Cosmos3-Edge image-to-video"
    assert dict(run.recipe_defaults) == {"width": 832, "height": 480, "num_frames": 121, "steps": 20, "guidance": 6.0,
                                         "shift": 12.0}
    given = resolve(Request(prompt="a car", image=image, num_frames=61, width=640, steps=8, guidance=4.0), edge)
    assert (given.width, given.height, given.num_frames) == (640, 480, 61)
    assert (given.sampling.steps, given.sampling.guidance, given.sampling.shift) == (8, 4.0, 12.0)
    assert dict(given.recipe_defaults) == {"height": 480, "shift": 12.0}
    assert resolve(Request(prompt="a car", image=image, shift=5.0), edge).sampling.shift == 5.0


def test_other_modes_and_checkpoints_keep_the_general_defaults(edge, nano):
    image = np.zeros((64, 96, 3), np.float32)
    video = np.zeros((9, 64, 96, 3), np.float32)
    general = (1280, 720, 189, 35, 6.0, 10.0)
    for checkpoint, request in [(edge, Request(prompt="a car")),  # Edge text-to-video
                                (edge, Request(prompt="a car", video=video)),  # Edge video-to-video
                                (nano, Request(prompt="a car", image=image))]:  # Nano image-to-video
        run = resolve(request, checkpoint)
        s = run.sampling
        assert (run.width, run.height, run.num_frames, s.steps, s.guidance, s.shift) == general
        assert run.recipe is None and run.recipe_defaults == ()
    edge_image = resolve(Request(prompt="a car", num_frames=1), edge)
    assert (edge_image.width, edge_image.height, edge_image.sampling.steps) == (1280, 720, 50)


def test_cli_names_the_recipe_values_it_used(edge, tmp_path):
    """``--image`` on an Edge checkpoint, no size given: an 832x480 clip, and one line saying which values came from
    the recipe (not the ones the flags gave)."""
    from cosmos3_core.media import probe_media, write_png

    image, out = tmp_path / "start.png", tmp_path / "edge_i2v.mp4"
    write_png(image, np.full((120, 200, 3), 0.5, np.float32))
    r = subprocess.run([sys.executable, "-m", "cosmos3_core.generate", "--checkpoint", str(edge), "--prompt", "a car",
                        "--image", str(image), "--num-frames", "5", "--steps", "1", "--device", "cpu", "--dtype",
                        "fp32", "--out", str(out)], capture_output=True, text=True, timeout=600, cwd=ROOT,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert "Cosmos3-Edge image-to-video: width 832, height 480, guidance 6, shift 12 (" in r.stderr
    info = probe_media(out)
    assert (info["width"], info["height"], info["video_frames"]) == (832, 480, 5)

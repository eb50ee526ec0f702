"""Windowed text/image-to-video past one clip, streamed to an mp4 (tiny checkpoint, fp32, CPU).

diffusers has no windowed T2V; what is checked here: window 1 is today's single-clip generation (itself tested
against ``Cosmos3OmniPipeline``), every later window's clean latents are the VAE encoding of the previous window's
decoded tail (the seeding Transfer's reference chunk loop does), the text tower runs once per distinct prompt, the
streamed mp4 holds exactly the stitched frames, and a cancel leaves a playable file of the finished windows.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from cosmos3_core import media
from cosmos3_core.api import generate
from cosmos3_core.checks import window_geometry
from cosmos3_core.modes.long_video import generate_long
from cosmos3_core.modes.stream_decode import FrameCollector
from cosmos3_core.pipeline import Cosmos3Pipeline
from cosmos3_core.request import Request
from cosmos3_core.resolve import resolve
from support.compare import rel

H, W, CHUNK, SEED = 32, 48, 9, 21
PROMPT = "a red robot walking on the street at night"
NEGATIVE = "blurry low quality video"
COMMON = dict(height=H, width=W, steps=2, seed=SEED, frames_per_chunk=CHUNK, shift=3.0, negative_prompt=NEGATIVE)


@pytest.fixture(scope="module")
def checkpoint(tiny_checkpoint):
    return tiny_checkpoint("nano", sound=True, seed=9)


@pytest.fixture(scope="module")
def pipe(checkpoint):
    return Cosmos3Pipeline.load(checkpoint, dtype=torch.float32, device="cpu")


def same_encoding(decoded, reference, frames) -> bool:
    """``decoded`` holds ``frames`` as well as ``reference`` (the same frames through ``write_video``) does: equal
    files when x264 is deterministic; under heavy CPU load its frame threads may choose differently, so the check
    is the error against the float frames, not the bytes."""
    frames = np.asarray(frames)
    return decoded.shape == reference.shape and (
        np.array_equal(decoded, reference)
        or np.abs(decoded - frames).mean() <= 1.25 * np.abs(reference - frames).mean())


def windows(pipe, **kwargs):
    """The resolved windowed (or Transfer) request ``COMMON | kwargs``."""
    return resolve(Request(**(COMMON | kwargs)), pipe.info)


def run(pipe, **kwargs):
    collector, latents = FrameCollector(), []
    result = generate_long(pipe, windows(pipe, **kwargs), [collector],
                           latents_sink=lambda k, lat: latents.append(lat.clone()))
    return result, collector, latents


def test_geometry_matches_the_reference_chunking():
    g = window_geometry(21, 9, 5)  # stride 4: windows start at 0, 4, 8, 12
    assert (g.stride, g.num_windows) == (4, 4)
    assert [g.keep_range(k) for k in range(4)] == [(0, 9), (5, 9), (5, 9), (5, 9)]
    g = window_geometry(22, 9, 1)  # the last window is generated whole and cut
    assert (g.num_windows, g.keep_range(2)) == (3, (1, 6))
    assert window_geometry(7, 9, 1).num_windows == 1


@pytest.mark.parametrize("mode", ["t2v", "i2v"])
def test_window_one_equals_single_clip_and_later_windows_are_seeded_by_the_tail(pipe, mode):
    image = np.random.default_rng(3).random((40, 60, 3), dtype=np.float32) if mode == "i2v" else None
    result, collector, latents = run(pipe, prompt=PROMPT, num_frames=21, conditional_frames=5, image=image)
    single = generate(pipe, Request(prompt=PROMPT, negative_prompt=NEGATIVE, num_frames=CHUNK, height=H, width=W,
                                    steps=2, seed=SEED, shift=3.0, image=image))
    assert result.geometry.num_windows == len(latents) == 4
    # the same computation (bit-identical when run alone; MKL may pick other thread counts on a busy machine)
    assert rel(latents[0], single.latents) <= 1e-6
    frames = collector.frames()
    assert frames.shape == (21, H, W, 3) and result.frames_written == 21
    assert rel(frames[:CHUNK], single.frames) <= 1e-6
    for k in range(1, 4):  # clean latents 0, 1 of window k = encode(last 5 decoded frames of window k-1)
        tail = pipe.vae.decode(latents[k - 1])[-5:] * 2 - 1
        seed = pipe.vae.encode(tail.permute(3, 0, 1, 2).unsqueeze(0))
        assert rel(latents[k][:, :, :2], seed[:, :, :2]) <= 1e-5
        assert rel(latents[k][:, :, 2:], latents[k - 1][:, :, 2:]) > 1e-2  # new content after the seed
        assert rel(frames[CHUNK + 4 * (k - 1): CHUNK + 4 * k], pipe.vae.decode(latents[k])[5:]) <= 1e-6


def test_text_tower_runs_once_per_distinct_prompt(pipe):
    before = pipe.prefill_count
    run(pipe, prompt=PROMPT, num_frames=17, conditional_frames=1)  # 2 windows
    assert pipe.prefill_count - before == 2  # prompt + negative, reused by both windows
    before = pipe.prefill_count
    prompts = ["a red robot walking", "a blue car driving at night", "a red robot walking"]
    _, _, latents = run(pipe, prompt=prompts, num_frames=25, conditional_frames=1)  # 3 windows
    assert len(latents) == 3 and pipe.prefill_count - before == 3  # 2 distinct prompts + negative


def test_fp8_windows_share_the_text_towers_w8a8_run(checkpoint, tmp_path):
    """NVIDIA's FP8 policy re-runs the text tower in the W8A8 steps' modes: once for the whole video (the windows of
    one run share its model and prompts), not once per window."""
    from cosmos3_core.runtime import RuntimeOptions
    from cosmos3_core.testing.fp8 import build_fp8_checkpoint

    fp8 = Cosmos3Pipeline.load(build_fp8_checkpoint(checkpoint, tmp_path / "fp8"), dtype=torch.float32,
                               device="cpu")
    request = windows(fp8, prompt=PROMPT, num_frames=17, conditional_frames=1, steps=7,  # 2 windows
                      options=RuntimeOptions(fp8_gemm="emulate", compile="off"))
    plans = []
    real = fp8.run
    fp8.run = lambda plan, *a, **kw: (plans.append(plan), real(plan, *a, **kw))[1]
    generate_long(fp8, request, [FrameCollector()])
    assert len(plans) == 2 and all(p.guidance[3].precision.generation == "W8A8" for p in plans)
    assert fp8.prefill_count == 4  # prompt + negative, then both again in the W8A8 modes, for both windows
    assert plans[0].guidance[3].text == plans[1].guidance[3].text


def test_sound_track_is_streamed_with_the_frames(pipe, tmp_path):
    path = tmp_path / "long.mp4"
    with media.VideoWriter(path, 24.0, W, H, audio=True) as writer:
        result = generate_long(pipe, windows(pipe, prompt=PROMPT, num_frames=17, sound=True, conditional_frames=1),
                               [writer.append])
    info = media.probe_media(path)
    assert info["video_frames"] == result.frames_written == 17
    assert abs(info["audio_stream_duration"] - 17 / 24.0) < 0.03


def test_streamed_mp4_holds_the_stitched_frames_and_cancel_keeps_finished_windows(pipe, tmp_path):
    collector = FrameCollector()
    path = tmp_path / "stream.mp4"
    request = windows(pipe, prompt=PROMPT, num_frames=17, conditional_frames=1)
    with media.VideoWriter(path, 24.0, W, H) as writer:
        generate_long(pipe, request, [writer.append, collector])
    frames = collector.frames()
    whole = media.write_video(tmp_path / "whole.mp4", frames, 24.0)
    streamed, _ = media.read_video(path)
    assert streamed.shape == (17, H, W, 3)
    assert same_encoding(streamed, media.read_video(whole)[0], frames)

    class Cancel(Exception):
        pass

    def cancel_in_window_two(k, n, step, steps, preview):
        if k == 1 and step == 1:
            raise Cancel

    cut, finished = tmp_path / "cut.mp4", FrameCollector()
    with pytest.raises(Cancel):
        with media.VideoWriter(cut, 24.0, W, H) as writer:
            generate_long(pipe, request, [writer.append, finished], progress=cancel_in_window_two)
    kept, _ = media.read_video(cut)
    assert kept.shape[0] == CHUNK and finished.frames().shape[0] == CHUNK  # window 1 only, playable
    window_one = media.write_video(tmp_path / "window_one.mp4", finished.frames(), 24.0)
    assert same_encoding(kept, media.read_video(window_one)[0], finished.frames())
    # (a second generation may differ from the first in the last float bits: MKL picks its threads by load)
    assert rel(finished.frames(), frames[:CHUNK]) <= 1e-5


@pytest.mark.parametrize("kwargs, message", [
    (dict(num_frames=20), "num_frames=20 must be 4k+1"),
    (dict(num_frames=21, conditional_frames=9), "conditional_frames=9 must be smaller than frames_per_chunk=9"),
    (dict(num_frames=21, frames_per_chunk=8), "frames_per_chunk=8 must be 4k+1"),
    (dict(num_frames=21, prompt=["a", "b"]), "2 prompts were given for 4 windows"),
    (dict(num_frames=21, controls={"edge": np.zeros((9, 32, 48, 3), np.float32),
                                   "canny": np.zeros((9, 32, 48, 3), np.float32)}), "key 'canny' is not"),
    (dict(controls={"edge": np.zeros((9, 32, 48, 3), np.float32), "depth": np.zeros((8, 32, 48, 3), np.float32)}),
     "depth has 8 frames but control edge has 9"),
    (dict(controls={"edge": np.zeros((9, 32, 48, 3), np.float32), "depth": np.zeros((9, 64, 48, 3), np.float32)}),
     "depth is 48x64 but control edge is 48x32"),
])
def test_bad_input_names_the_argument_value_and_fix(pipe, kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        run(pipe, **(dict(prompt=PROMPT) | kwargs))


@pytest.mark.parametrize("args, message", [
    (["--control", "canny={clip}"], "--control 'canny={clip}': 'canny' is not a Cosmos3 Transfer control"),
    (["--control", "edge={clip}", "--control", "depth={short}"], "control depth has 5 frames but control edge has 9"),
    (["--frames-per-chunk", "9", "--num-frames", "21", "--prompt", "b"], "2 prompts were given for 4 windows"),
    (["--frames-per-chunk", "9", "--num-frames", "21", "--conditional-frames", "9"],
     "conditional_frames=9 must be smaller than frames_per_chunk=9"),
    (["--conditional-frames", "3"], "conditional_frames applies to windows only"),
])
def test_cli_bad_input_is_one_error_line(checkpoint, tmp_path, args, message):
    import os
    import subprocess
    import sys
    from pathlib import Path

    clip = media.write_video(tmp_path / "c.mp4", np.zeros((9, H, W, 3), np.float32), 24.0)
    short = media.write_video(tmp_path / "s.mp4", np.zeros((5, H, W, 3), np.float32), 24.0)
    args = [a.format(clip=clip, short=short) for a in args]
    root = Path(__file__).resolve().parents[1]
    r = subprocess.run([sys.executable, "-m", "cosmos3_core.generate", "--checkpoint", str(checkpoint), "--prompt",
                        "a", "--out", str(tmp_path / "o.mp4"), "--device", "cpu", "--height", str(H), "--width",
                        str(W), *args], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(root)})
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert message.format(clip=clip) in lines[0], lines[0]

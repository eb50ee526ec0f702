"""``python -m cosmos3_core.generate``: real files read back with PyAV, and one clear message per bad input."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

from cosmos3_core.media import probe_media

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def nano(tiny_checkpoint):
    return tiny_checkpoint("nano", seed=2)


@pytest.fixture(scope="module")
def edge(tiny_checkpoint):
    return tiny_checkpoint("edge", seed=2)


def cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "cosmos3_core.generate", *args], capture_output=True, text=True, env=env, timeout=300
    )


BASE = ["--prompt", "a red car on a street", "--height", "64", "--width", "96", "--steps", "2", "--device", "cpu",
        "--dtype", "fp32"]


def test_t2av_writes_mp4_with_video_and_sound(nano, tmp_path):
    out, latents = tmp_path / "clip.mp4", tmp_path / "lat.safetensors"
    r = cli("--checkpoint", str(nano), *BASE, "--num-frames", "9", "--fps", "24", "--sound", "--out", str(out),
            "--latents-out", str(latents))
    assert r.returncode == 0, r.stderr
    for stage in ("model_load", "preprocess", "inference", "to_cpu", "encode"):
        assert stage in r.stdout
    info = probe_media(out)
    assert (info["video_frames"], info["width"], info["height"]) == (9, 96, 64)
    assert info["fps"] == pytest.approx(24.0)
    assert info["audio_sample_rate"] == 48000 and info["audio_channels"] == 2
    assert info["audio_stream_duration"] == pytest.approx(9 / 24, abs=0.03)
    saved = load_file(latents)
    assert tuple(saved["video_latent"].shape) == (1, 48, 3, 4, 6)
    assert tuple(saved["sound_latent"].shape) == (64, 10)


def test_i2v_video_without_sound_and_t2i_png(nano, tmp_path):
    img = tmp_path / "in.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (70, 90, 3), dtype=np.uint8)).save(img)
    out = tmp_path / "i2v.mp4"
    r = cli("--checkpoint", str(nano), *BASE, "--num-frames", "5", "--fps", "12", "--image", str(img), "--out", str(out))
    assert r.returncode == 0, r.stderr
    info = probe_media(out)
    assert info["video_frames"] == 5 and info["audio_channels"] in (None, 0)
    png = tmp_path / "t2i.png"
    r = cli("--checkpoint", str(nano), *BASE, "--num-frames", "1", "--out", str(png))
    assert r.returncode == 0, r.stderr
    assert Image.open(png).size == (96, 64)


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--width", "100"], "width=100 must be a positive multiple of 16; try 96"),
        (["--num-frames", "10"], "num_frames=10 must be 1 (an image) or 4k+1"),
        (["--image", "/nonexistent.png"], "--image /nonexistent.png does not exist"),
        (["--out", "x.png"], "the output is a .mp4 file"),
        (["--attention", "flash4"], "attention='flash4': FlashAttention-4 cannot run here"),  # CI: no Hopper GPU
    ],
)
def test_bad_input_gives_one_clear_message(nano, tmp_path, extra, message):
    args = ["--checkpoint", str(nano), *BASE, "--num-frames", "9", "--out", str(tmp_path / "o.mp4"), *extra]
    r = cli(*args)
    assert r.returncode == 2
    assert message in r.stderr
    assert "Traceback" not in r.stderr


def test_sound_on_edge_and_missing_checkpoint(edge, tmp_path):
    r = cli("--checkpoint", str(edge), *BASE, "--num-frames", "9", "--sound", "--out", str(tmp_path / "o.mp4"))
    assert r.returncode == 2 and "has no sound_tokenizer/" in r.stderr and "Traceback" not in r.stderr
    r = cli("--checkpoint", str(tmp_path / "nope"), *BASE, "--num-frames", "9", "--out", str(tmp_path / "o.mp4"))
    assert r.returncode == 2 and "does not exist; give the downloaded Cosmos3 checkpoint folder" in r.stderr


def test_unreadable_video_is_reported(nano, tmp_path):
    bad = tmp_path / "bad.mp4"
    bad.write_bytes(b"not a video")
    r = cli("--checkpoint", str(nano), *BASE, "--num-frames", "9", "--video", str(bad), "--out", str(tmp_path / "o.mp4"))
    assert r.returncode == 2 and str(bad) in r.stderr and "Traceback" not in r.stderr


def _encoded_blocks(monkeypatch) -> list[torch.Tensor]:
    """Record (copies of) the frame blocks the CLI hands to the mp4 encoder's thread."""
    from cosmos3_core import media

    blocks: list[torch.Tensor] = []
    real = media.BackgroundVideoWriter.append

    def append(self, frames):
        blocks.append(frames.clone())
        real(self, frames)

    monkeypatch.setattr(media.BackgroundVideoWriter, "append", append)
    return blocks


def _video_frames(path) -> int:
    import av

    with av.open(str(path)) as c:
        return sum(1 for _ in c.decode(video=0))


def test_mp4_is_encoded_while_the_video_decodes(nano, tmp_path, monkeypatch):
    """Each decoded chunk goes to the encoder as it lands (1 frame, then 4 per latent frame): the blocks are the
    final frames (``--frames-out``) in order, bit for bit, and the mp4 holds all of them. (Not compared byte for byte
    with ``write_video`` of the clip: x264 does not always give identical bytes for identical frames when the machine
    is busy, with one thread or several; ``tests/test_media.py`` checks the writer itself.)"""
    from cosmos3_core.cli.main import main

    blocks = _encoded_blocks(monkeypatch)
    out, frames = tmp_path / "clip.mp4", tmp_path / "frames.safetensors"
    assert main(["--checkpoint", str(nano), *BASE, "--num-frames", "9", "--fps", "24", "--out", str(out),
                 "--frames-out", str(frames)]) == 0
    assert [b.shape[0] for b in blocks] == [1, 4, 4]
    assert torch.equal(torch.cat(blocks), load_file(frames)["frames"])
    assert _video_frames(out) == 9


def test_decode_that_restarts_tiled_still_writes_the_whole_clip(nano, tmp_path, monkeypatch):
    """An untiled decode that runs out of memory after two chunks were encoded starts again tiled; the mp4 is then
    written from the final frames, not from a mix of both attempts."""
    import torch

    from cosmos3_core import media
    from cosmos3_core.cli.main import main
    from cosmos3_core.media import write_video
    from cosmos3_core.vae.video import Cosmos3VAE

    blocks = _encoded_blocks(monkeypatch)
    real = Cosmos3VAE._decode_chunks
    attempts = []

    def out_of_memory_after_two_chunks(self, out, z, grid, chunk, on_chunk, **kw):
        attempts.append(grid)
        if len(attempts) > 1:  # the retry (this small clip fits one tile, so it runs the same decode)
            return real(self, out, z, grid, chunk, on_chunk, **kw)

        def report_then_fail(done, total):
            on_chunk(done, total)
            if done == 2:
                raise torch.OutOfMemoryError("CUDA out of memory (injected)")
        return real(self, out, z, grid, chunk, report_then_fail, **kw)

    monkeypatch.setattr(Cosmos3VAE, "_decode_chunks", out_of_memory_after_two_chunks)
    written = []  # the clips write_video writes whole
    monkeypatch.setattr(media, "write_video", lambda path, clip, *a, **k: written.append(torch.as_tensor(clip).clone())
                        or write_video(path, clip, *a, **k))
    out, frames = tmp_path / "clip.mp4", tmp_path / "frames.safetensors"
    assert main(["--checkpoint", str(nano), *BASE, "--num-frames", "9", "--fps", "24", "--out", str(out),
                 "--frames-out", str(frames)]) == 0
    assert len(attempts) == 2 and attempts[0] is None
    assert [b.shape[0] for b in blocks] == [1, 4]  # the untiled attempt's; none after the restart
    assert len(written) == 1 and torch.equal(written[0], load_file(frames)["frames"])  # the final frames, whole
    assert _video_frames(out) == 9

"""cosmos3_core.media: mp4 (H.264 + AAC) / PNG round trips, fractional fps, read errors. CPU, ~1 s.

Run: ``/root/.cache/cosmos3/venv/bin/python -m pytest -q tests/test_media.py``
"""

from __future__ import annotations

from fractions import Fraction

import av
import numpy as np
import pytest

from cosmos3_core.media import as_fraction, probe_media, read_image, read_video, write_png, write_video

AAC_FRAME = 1024 / 48_000  # one AAC frame, seconds


def _smooth_frames(f: int, h: int, w: int) -> np.ndarray:
    """Gradients that move per frame: compress well, so a round trip stays close."""
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    out = [np.stack([xx / w, yy / h, np.full_like(xx, (i + 0.5) / f)], -1) for i in range(f)]
    return np.stack(out).astype(np.float32)  # [F, H, W, 3]


def _decode_audio(path) -> np.ndarray:
    with av.open(str(path)) as c:
        return np.concatenate([fr.to_ndarray() for fr in c.decode(audio=0)], axis=1)  # [C, N] fltp


def test_video_with_stereo_audio_round_trip(tmp_path):
    frames = _smooth_frames(9, 64, 96)
    n = 48_000 * 9 // 24  # 9/24 s
    t = np.arange(n) / 48_000
    audio = np.stack([0.5 * np.sin(2 * np.pi * 440 * t), 0.25 * np.sin(2 * np.pi * 880 * t)]).astype(np.float32)
    path = write_video(tmp_path / "out" / "clip.mp4", frames, 24, audio=audio)
    info = probe_media(path)
    assert info["video_frames"] == 9
    assert (info["width"], info["height"]) == (96, 64)
    assert info["fps_fraction"] == 24 and info["fps"] == 24.0
    assert (info["video_codec"], info["pix_fmt"]) == ("h264", "yuv420p")
    assert (info["audio_sample_rate"], info["audio_channels"]) == (48_000, 2)
    assert abs(info["audio_duration"] - 9 / 24) <= AAC_FRAME
    assert abs(info["audio_stream_duration"] - 9 / 24) <= AAC_FRAME

    got, fps = read_video(path)
    assert got.shape == frames.shape and got.dtype == np.float32 and fps == 24.0
    assert np.abs(got - frames).mean() < 0.02  # lossy H.264 + yuv420p, on smooth content
    assert np.allclose(got.mean(axis=(1, 2, 3)), frames.mean(axis=(1, 2, 3)), atol=0.02)  # frame order kept

    dec = _decode_audio(path)[:, 2048:n - 2048]  # skip AAC edge transients
    rms = np.sqrt((dec ** 2).mean(axis=1))
    assert np.allclose(rms, [0.5 / np.sqrt(2), 0.25 / np.sqrt(2)], rtol=0.05)  # channels kept apart, in order

    first, _ = read_video(path, max_frames=3)
    assert first.shape[0] == 3 and np.allclose(first, got[:3])


def test_mono_audio_uint8_frames_and_torch_input(tmp_path):
    torch = pytest.importorskip("torch")
    frames = torch.from_numpy((_smooth_frames(5, 32, 48) * 255).round().astype(np.uint8))
    mono = torch.full((1, 9000), 0.3)
    info = probe_media(write_video(tmp_path / "m.mp4", frames, 25.0, audio=mono))
    assert info["video_frames"] == 5 and info["fps"] == 25.0 and info["audio_channels"] == 2
    assert abs(info["audio_stream_duration"] - 9000 / 48_000) <= AAC_FRAME
    left, right = _decode_audio(tmp_path / "m.mp4")
    assert np.abs(left - right).max() < 0.01  # mono duplicated to both channels (AAC is lossy)


def test_audio_resampled_to_48k(tmp_path):
    audio = np.zeros((2, 44_100 // 4), np.float32)  # 0.25 s at 44.1 kHz
    info = probe_media(write_video(tmp_path / "r.mp4", _smooth_frames(6, 32, 32), 24, audio, sample_rate=44_100))
    assert info["audio_sample_rate"] == 48_000
    assert abs(info["audio_stream_duration"] - 0.25) <= AAC_FRAME


@pytest.mark.parametrize("fps, expect", [(Fraction(30000, 1001), Fraction(30000, 1001)),
                                         (29.97, Fraction(30000, 1001)), (23.976, Fraction(24000, 1001)),
                                         (12.5, Fraction(25, 2))])
def test_fractional_fps(tmp_path, fps, expect):
    assert as_fraction(fps) == expect
    info = probe_media(write_video(tmp_path / "f.mp4", _smooth_frames(7, 32, 64), fps))
    assert info["video_frames"] == 7
    assert info["fps_fraction"] == expect
    _, got_fps = read_video(tmp_path / "f.mp4")
    assert got_fps == pytest.approx(float(expect))


def test_png_round_trip(tmp_path):
    frame = _smooth_frames(1, 40, 56)[0]
    path = write_png(tmp_path / "img" / "f.png", frame)
    got = read_image(path)
    assert got.shape == (40, 56, 3) and got.dtype == np.float32
    assert np.abs(got - frame).max() <= 0.5 / 255 + 1e-6  # lossless up to uint8 rounding
    u8 = (frame * 255).round().astype(np.uint8)
    assert np.array_equal((read_image(write_png(tmp_path / "u8.png", u8)) * 255).round().astype(np.uint8), u8)


def test_write_validation(tmp_path):
    with pytest.raises(ValueError, match="even height and width, got 63x96"):
        write_video(tmp_path / "odd.mp4", np.zeros((2, 63, 96, 3), np.float32), 24)
    with pytest.raises(ValueError, match=r"frames must be \[F, H, W, 3\]"):
        write_video(tmp_path / "bad.mp4", np.zeros((2, 64, 96), np.float32), 24)
    with pytest.raises(ValueError, match=r"audio must be \[C, N\] with C = 1 or 2"):
        write_video(tmp_path / "a.mp4", np.zeros((2, 64, 96, 3), np.float32), 24, audio=np.zeros((6, 100)))
    with pytest.raises(ValueError, match="fps must be positive"):
        write_video(tmp_path / "z.mp4", np.zeros((2, 64, 96, 3), np.float32), 0)
    with pytest.raises(ValueError, match=r"frame must be \[H, W, 3\]"):
        write_png(tmp_path / "x.png", np.zeros((1, 8, 8, 3), np.float32))


def test_read_errors_name_the_path(tmp_path):
    missing = tmp_path / "nope.mp4"
    for fn in (read_video, read_image, probe_media):
        with pytest.raises(FileNotFoundError, match="nope.mp4"):
            fn(missing)
    junk = tmp_path / "junk.mp4"
    junk.write_bytes(b"this is not a video file at all" * 10)
    with pytest.raises(ValueError, match=r"read_video: could not decode .*junk\.mp4"):
        read_video(junk)
    with pytest.raises(ValueError, match=r"read_image: could not read .*junk\.mp4 as an image"):
        read_image(junk)
    with pytest.raises(ValueError, match=r"probe_media: could not read .*junk\.mp4"):
        probe_media(junk)
    audio_only = tmp_path / "a.m4a"
    with av.open(str(audio_only), "w") as c:  # a valid file with no video stream
        s = c.add_stream("aac", rate=48_000, layout="stereo")
        fr = av.AudioFrame.from_ndarray(np.zeros((2, 1024), np.float32), format="fltp", layout="stereo")
        fr.sample_rate = 48_000
        for p in list(s.encode(fr)) + list(s.encode(None)):
            c.mux(p)
    with pytest.raises(ValueError, match="has no video stream"):
        read_video(audio_only)


def test_background_writer_makes_the_same_file_as_write_video(tmp_path):
    """Blocks appended to ``BackgroundVideoWriter`` (encoded on its thread) give the file ``write_video`` writes for
    the whole clip at once: same streams, frames in order, the whole audio track. Compared by content, not bytes:
    x264 does not always repeat its bytes for identical frames on a busy machine, even with one thread (measured:
    4 in 100 encodes of this clip under load)."""
    from cosmos3_core.media import BackgroundVideoWriter

    frames = _smooth_frames(17, 64, 96)
    t = np.arange(48_000 * 17 // 24) / 48_000
    audio = np.stack([0.5 * np.sin(2 * np.pi * 440 * t), 0.25 * np.sin(2 * np.pi * 660 * t)]).astype(np.float32)
    whole = write_video(tmp_path / "whole.mp4", frames, 24, audio=audio)
    writer = BackgroundVideoWriter(tmp_path / "blocks.mp4", 24, 96, 64, audio=audio)
    for a, b in ((0, 1), (1, 5), (5, 9), (9, 17)):  # as the VAE decode hands them on: 1 frame, then 4 per latent
        writer.append(frames[a:b])
    blocks = writer.close()
    assert probe_media(blocks) == probe_media(whole)
    assert probe_media(blocks)["video_frames"] == 17
    got, want = read_video(blocks)[0], read_video(whole)[0]
    assert got.shape == want.shape == frames.shape
    assert np.abs(got - want).mean() < 0.005 and np.abs(got - frames).mean() < 0.02
    assert np.allclose(got.mean(axis=(1, 2, 3)), frames.mean(axis=(1, 2, 3)), atol=0.01)  # every frame, in order
    assert np.allclose(_decode_audio(blocks), _decode_audio(whole), atol=1e-3)


def test_background_writer_reports_the_workers_error_and_abort_deletes(tmp_path):
    from cosmos3_core.media import BackgroundVideoWriter

    writer = BackgroundVideoWriter(tmp_path / "bad.mp4", 24, 96, 64)
    writer.append(_smooth_frames(2, 64, 96))
    writer.append(_smooth_frames(2, 32, 96))  # the wrong height: fails on the worker thread
    with pytest.raises(ValueError, match=r"frames must be \[F, 64, 96, 3\], got shape \(2, 32, 96, 3\)"):
        writer.close()
    writer = BackgroundVideoWriter(tmp_path / "aborted.mp4", 24, 96, 64)
    writer.append(_smooth_frames(3, 64, 96))
    writer.abort()
    assert not (tmp_path / "aborted.mp4").exists()
    with pytest.raises(ValueError, match="even height and width"):
        BackgroundVideoWriter(tmp_path / "odd.mp4", 24, 95, 64)

"""Issue 30, a full disk: every output the CLI writes meets ENOSPC at its Nth write, through the real writers.

The disk is the only thing replaced: ``media.os_write`` — the one call that puts output bytes on a disk (the mp4
muxer's buffers through ``media.VideoWriter``, every whole-file output through ``media.write_file``) — raises
``OSError(ENOSPC)`` from its Nth call on, as ``write(2)`` does on a full disk. Everything above it (PyAV's muxer, the
writers, the CLI) is the code that runs for users.

* A streamed long video (``--num-frames`` in windows) stops at the first failed write (no write and no window
  after it), says so in one ``error:`` line naming ``--out``, and leaves a playable file of the windows that
  reached the disk whole (a fragmented mp4 cut back to its whole fragments: a prefix of the video) — or no file.
* A single clip (mp4 or PNG), ``--latents-out`` and ``--actions-out``: one line naming the flag and no file at all
  (no empty or partial file, no leftover temporary).

The node side (Cosmos3 Long Video, Cosmos3 Save Actions) is in tests/test_bad_input_nodes.py.
"""
from __future__ import annotations

import errno
import os
from pathlib import Path

import numpy as np
import pytest

from cosmos3_core import media
from cosmos3_core.cli import common
from cosmos3_core.cli import main as generate

DISK_FULL = "the disk is full (No space left on device)"


@pytest.fixture(scope="module")
def nano(tiny_checkpoint):
    return tiny_checkpoint("nano", seed=3)


@pytest.fixture(scope="module")
def loaded(nano):
    """The pipeline, loaded once for the module (every CLI run below takes it instead of loading it again)."""
    import torch

    from cosmos3_core.pipeline import Cosmos3Pipeline

    return Cosmos3Pipeline.load(nano, dtype=torch.float32, device="cpu", with_sound=False)


@pytest.fixture()
def cli(nano, loaded, monkeypatch, capsys):
    """``cli(*flags)`` runs the generation CLI in-process on the tiny Nano → ``(returncode, stderr)``."""
    def load_pipeline(args, timings, *, sound, device=None):
        timings["model_load"] = 0.0
        return loaded

    monkeypatch.setattr(common, "load_pipeline", load_pipeline)

    def run(*flags):
        size = [] if "--action-mode" in flags else ["--height", "32", "--width", "32"]
        code = generate.main(["--checkpoint", str(nano), "--prompt", "a red car", *size, "--steps", "1",
                              "--device", "cpu", "--dtype", "fp32", *flags])
        return code, capsys.readouterr().err
    return run


class Disk:
    """``os_write`` of a disk that fills up at the ``fail_at``-th write (of the files under ``only``, if given); it
    counts the writes, and the writes tried after the first failure."""

    def __init__(self, fail_at: int | None = None, only: Path | None = None):
        self.fail_at, self.only, self.writes, self.after_failure = fail_at, only, 0, 0

    def __call__(self, fd: int, data) -> int:
        if self.only is not None and not os.readlink(f"/proc/self/fd/{fd}").startswith(str(self.only)):
            return os.write(fd, data)
        self.writes += 1
        if self.fail_at is not None and self.writes >= self.fail_at:
            if self.writes > self.fail_at:
                self.after_failure += 1
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return os.write(fd, data)


def one_error(code: int, err: str) -> str:
    errors = [line.strip() for line in err.splitlines() if line.strip().startswith("error: ")]
    assert code == 2 and len(errors) == 1 and "Traceback" not in err, (code, err)
    return errors[0]


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


# three windows of 49 frames overlapping by 5: long enough that x264 hands each window's packets out while the next
# window is written, so the writes reach the disk window by window (as in a real long video), not all at the end
LONG = ["--num-frames", "137", "--frames-per-chunk", "49", "--conditional-frames", "5"]
WINDOW_ENDS = (49, 93, 137)


def test_streamed_long_video_stops_at_the_first_failed_write_and_keeps_whole_windows(cli, tmp_path, monkeypatch):
    reference = tmp_path / "reference.mp4"
    disk = Disk()
    monkeypatch.setattr(media, "os_write", disk)
    code, err = cli(*LONG, "--out", str(reference))
    assert code == 0, err
    full, _ = media.read_video(reference)
    assert full.shape[0] == 137
    total_writes = disk.writes
    assert total_writes >= 5  # header, fragments while windows 2 and 3 are written, the last fragment at the end

    kept_by_n = []
    for n in range(1, total_writes + 1):
        out = tmp_path / f"full_at_{n}" / "long.mp4"
        disk = Disk(fail_at=n)
        monkeypatch.setattr(media, "os_write", disk)
        msg = one_error(*cli(*LONG, "--out", str(out)))
        assert msg.startswith(f"error: --out {out}: {DISK_FULL}: generation stopped at the first failed write; "), msg
        assert msg.endswith("free space on that disk (or choose another folder) and run again."), msg
        assert disk.after_failure == 0  # nothing more was written after the disk refused a write
        if "no file was left" in msg:
            assert leftovers(out.parent) == [], (n, msg)
            kept_by_n.append(0)
            continue
        kept = media.read_video(out)[0]
        windows = sum(end <= len(kept) for end in WINDOW_ENDS)
        assert f"long.mp4 keeps the first {len(kept)} of 137 frames ({windows} of 3 windows whole) and plays" in msg
        assert np.abs(kept - full[: len(kept)]).mean() < 0.02, n  # a prefix of the video
        assert leftovers(out.parent) == ["long.mp4"]
        kept_by_n.append(len(kept))
    assert kept_by_n[0] == 0  # the first write is the header: nothing to keep
    assert kept_by_n == sorted(kept_by_n)  # a later failure never keeps less
    assert kept_by_n[-1] >= WINDOW_ENDS[1]  # failing at the very end: every window but the last is whole
    assert any(WINDOW_ENDS[0] <= k < WINDOW_ENDS[-1] for k in kept_by_n)  # failures in the middle keep window 1


def test_a_failure_in_window_two_stops_the_run_there(cli, tmp_path, monkeypatch):
    """The disk fills while window 2 is written: window 3 is never generated."""
    from cosmos3_core.modes import stream_decode

    committed, writes_at_commit = [], []
    real_commit = stream_decode.StreamDecoder.commit

    def commit(self, index, *args, **kwargs):  # observes which window each write belongs to
        committed.append(index)
        writes_at_commit.append(disk.writes)
        return real_commit(self, index, *args, **kwargs)

    monkeypatch.setattr(stream_decode.StreamDecoder, "commit", commit)
    disk = Disk()
    monkeypatch.setattr(media, "os_write", disk)
    assert cli(*LONG, "--out", str(tmp_path / "reference.mp4"))[0] == 0
    first_write_of_window_two = writes_at_commit[1] + 1
    committed.clear()
    disk = Disk(fail_at=first_write_of_window_two)
    monkeypatch.setattr(media, "os_write", disk)
    code, err = cli(*LONG, "--out", str(tmp_path / "long.mp4"))
    one_error(code, err)
    assert committed == [0, 1], committed  # window 3 was never committed (nor, so, generated)
    assert "window 3/3" not in err


@pytest.mark.parametrize("fail_at", ["first", "last"])
def test_single_clip_on_a_full_disk_leaves_no_file(cli, tmp_path, monkeypatch, fail_at):
    disk = Disk()
    monkeypatch.setattr(media, "os_write", disk)
    assert cli("--num-frames", "9", "--out", str(tmp_path / "ok.mp4"))[0] == 0
    n = 1 if fail_at == "first" else disk.writes
    out = tmp_path / "full" / "clip.mp4"
    monkeypatch.setattr(media, "os_write", Disk(fail_at=n))
    msg = one_error(*cli("--num-frames", "9", "--out", str(out)))
    assert msg == (f"error: --out {out}: {DISK_FULL}; stopped there and left no file (nothing playable was "
                   "written); free space on that disk (or choose another folder) and run again."), msg
    assert leftovers(out.parent) == []


def test_image_on_a_full_disk_leaves_no_file(cli, tmp_path, monkeypatch):
    out = tmp_path / "full" / "image.png"
    monkeypatch.setattr(media, "os_write", Disk(fail_at=1))
    msg = one_error(*cli("--num-frames", "1", "--out", str(out)))
    assert msg == (f"error: --out {out}: {DISK_FULL}; nothing was written; free space on that disk (or choose "
                   "another folder) and run again."), msg
    assert leftovers(out.parent) == []


def test_latents_on_a_full_disk_leave_no_file(cli, tmp_path, monkeypatch):
    """The clip was written; the disk fills on the latents: they say so, and no partial .safetensors is left."""
    lat = tmp_path / "lat"
    lat.mkdir()
    monkeypatch.setattr(media, "os_write", Disk(fail_at=1, only=lat))
    msg = one_error(*cli("--num-frames", "5", "--out", str(tmp_path / "clip.mp4"), "--latents-out",
                         str(lat / "latents.safetensors")))
    assert msg.startswith(f"error: --latents-out {lat / 'latents.safetensors'}: {DISK_FULL}; nothing was written"), msg
    assert leftovers(lat) == [] and (tmp_path / "clip.mp4").stat().st_size > 0


def test_actions_on_a_full_disk_leave_no_file(cli, tmp_path, monkeypatch):
    from PIL import Image

    image = tmp_path / "start.png"
    Image.fromarray(np.zeros((64, 96, 3), np.uint8)).save(image)
    actions = tmp_path / "actions"
    actions.mkdir()
    monkeypatch.setattr(media, "os_write", Disk(fail_at=1, only=actions))
    code, err = cli("--action-mode", "policy", "--domain-name", "bridge_orig_lerobot", "--chunk-size", "4",
                    "--resolution-tier", "256", "--image", str(image), "--out", str(tmp_path / "policy.mp4"),
                    "--actions-out", str(actions / "predicted.json"))
    msg = one_error(code, err)
    assert msg.startswith(f"error: --actions-out {actions / 'predicted.json'}: {DISK_FULL}; nothing was written"), msg
    assert leftovers(actions) == []


def test_an_older_file_survives_a_failed_write(tmp_path, monkeypatch):
    """write_file writes beside the target and renames: a full disk leaves an existing file as it was."""
    target = tmp_path / "a.json"
    target.write_text("old")
    monkeypatch.setattr(media, "os_write", Disk(fail_at=1))
    with pytest.raises(media.OutputError, match="the disk is full"):
        media.write_file(target, b"new" * 1000)
    assert target.read_text() == "old" and leftovers(tmp_path) == ["a.json"]

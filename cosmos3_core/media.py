"""Media file IO for the CLI and tests: H.264/AAC mp4 writing, PNG, image/video reading, probing.

PyAV, PIL and numpy only (no torch import; torch tensors are accepted by duck typing). Layouts follow the
pipeline outputs: frames ``[F, H, W, 3]`` RGB, float in ``[0, 1]`` or uint8; audio ``[C, N]`` float in
``[-1, 1]`` with ``C`` = 1 or 2 (Cosmos3's AVAE decodes 48 kHz stereo).

Plays the role of diffusers' ``export_to_video`` / ``encode_video`` (diffusers/utils/export_utils.py) and the
PhyAI ``Cosmos3GenerationPostProcessor.save_mp4`` (frames to uint8 RGB, waveform muxed into the same mp4), with
these choices of our own:

* video: libx264, yuv420p (so H and W must be even) tagged BT.709 limited range, CRF 18, one frame per ``1/fps`` tick,
  so the file holds exactly ``F`` frames and ``average_rate == fps``. Fractional rates are exact ``Fraction``s; floats
  within 1e-3 of an NTSC rate ``k·1000/1001`` (23.976, 29.97, 59.94) snap to it.
* float -> uint8 rounds to nearest (``round(clip(x, 0, 1) * 255)``), not diffusers' truncation.
* audio: AAC-LC, 48 kHz, stereo (mono is duplicated; other input rates are resampled to 48 kHz). The mp4
  muxer records the encoder delay, so a decoder returns N samples (up to one 1024-sample AAC frame of padding).
* writing: every output byte goes through one call, ``os_write``; a write the disk refuses (a full disk) is one
  ``OutputError`` and leaves no partial file — whole files (PNG, ``write_file``) are written beside their name and
  renamed into place; a streamed ``VideoWriter(fragmented=True)`` (a long video) is cut back to the fragments that
  reached the disk whole, so it plays. Reading refuses folders by name and images above PIL's decompression-bomb
  limit before decoding them.
"""

from __future__ import annotations

import errno
import io
import math
import os
import queue
import threading
import warnings
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
from av.video.frame import PictureType
from av.video.reformatter import ColorRange, Colorspace
from PIL import Image, ImageOps, UnidentifiedImageError

AUDIO_RATE = 48_000
DEFAULT_CRF = 18
_BT709 = 1  # AVCOL_PRI_BT709 == AVCOL_TRC_BT709 == AVCOL_SPC_BT709


# --------------------------------------------------------------------------------------------------------------
# array helpers


def _to_numpy(x, name: str) -> np.ndarray:
    if hasattr(x, "detach"):  # torch.Tensor, without importing torch
        x = x.detach().cpu()
        x = x if str(x.dtype) == "torch.uint8" else x.float()
        x = x.numpy()
    try:
        return np.asarray(x)
    except Exception as e:  # noqa: BLE001 - anything unconvertible gets one clear message
        raise TypeError(f"{name}: expected an array, got {type(x).__name__}.") from e


def _to_uint8(x: np.ndarray, who: str) -> np.ndarray:
    if x.dtype == np.uint8:
        return x
    if not np.issubdtype(x.dtype, np.floating):
        raise TypeError(f"{who}: expected float frames in [0, 1] or uint8, got dtype {x.dtype}.")
    return np.round(np.clip(x.astype(np.float32), 0.0, 1.0) * 255.0).astype(np.uint8)


def as_fraction(fps) -> Fraction:
    """``fps`` as an exact rational frame rate (NTSC floats such as 23.976 snap to 24000/1001)."""
    if isinstance(fps, bool) or not isinstance(fps, (int, float, Fraction, np.integer, np.floating)):
        raise TypeError(f"fps must be a number or Fraction, got {type(fps).__name__}.")
    if isinstance(fps, (Fraction, int, np.integer)):
        r = Fraction(fps)
    else:
        f = float(fps)
        if not math.isfinite(f):
            raise ValueError(f"fps must be finite, got {fps!r}.")
        k = round(f * 1.001)
        ntsc = Fraction(k * 1000, 1001)
        r = ntsc if f != int(f) and abs(f - float(ntsc)) < 1e-3 else Fraction(f).limit_denominator(10_000)
    if r <= 0:
        raise ValueError(f"fps must be positive, got {fps!r}.")
    return r


# --------------------------------------------------------------------------------------------------------------
# writing


def _stereo48k(audio, sample_rate: int) -> np.ndarray:
    """``[C, N]`` float in [-1, 1] -> contiguous float32 ``[2, N']`` at 48 kHz."""
    a = _to_numpy(audio, "write_video: audio").astype(np.float32)
    if a.ndim == 1:
        a = a[None]
    if a.ndim != 2 or a.shape[0] not in (1, 2):
        raise ValueError(f"write_video: audio must be [C, N] with C = 1 or 2, got shape {tuple(a.shape)}.")
    if a.shape[1] == 0:
        raise ValueError("write_video: audio has no samples.")
    if isinstance(sample_rate, bool) or not isinstance(sample_rate, (int, np.integer)) or sample_rate <= 0:
        raise ValueError(f"write_video: sample_rate must be a positive int, got {sample_rate!r}.")
    a = np.clip(a, -1.0, 1.0)
    if a.shape[0] == 1:
        a = np.repeat(a, 2, axis=0)
    if sample_rate != AUDIO_RATE:  # linear interpolation is enough for previews; ours is 48 kHz already
        n_out = max(1, round(a.shape[1] * AUDIO_RATE / sample_rate))
        t_in = np.arange(a.shape[1]) / sample_rate
        t_out = np.arange(n_out) / AUDIO_RATE
        a = np.stack([np.interp(t_out, t_in, ch) for ch in a]).astype(np.float32)
    return np.ascontiguousarray(a)


class _AudioEncoder:
    """AAC 48 kHz stereo stream fed in 1024-sample frames, so its packets can interleave with the video's.

    Samples arrive in pieces (``push``); ``feed_until`` encodes the whole frames available up to a sample index,
    ``finish`` the rest (a last partial frame included)."""

    def __init__(self, container):
        self.container, self.pos = container, 0
        self.pending = np.zeros((2, 0), np.float32)
        self.stream = container.add_stream("aac", rate=AUDIO_RATE, layout="stereo")
        self.stream.bit_rate = 192_000

    def push(self, a: np.ndarray) -> None:
        self.pending = np.concatenate([self.pending, a], axis=1)

    def _encode(self, chunk) -> None:
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(chunk), format="fltp", layout="stereo")
        frame.sample_rate, frame.pts = AUDIO_RATE, self.pos
        self.pos += chunk.shape[1]
        for packet in self.stream.encode(frame):
            self.container.mux(packet)

    def feed_until(self, end: int, *, final: bool = False) -> None:
        frame_size = self.stream.codec_context.frame_size or 1024
        while self.pos < end and (self.pending.shape[1] >= frame_size or (final and self.pending.shape[1])):
            n = min(frame_size, self.pending.shape[1])
            chunk, self.pending = self.pending[:, :n], self.pending[:, n:]
            self._encode(chunk)

    def finish(self) -> None:
        self.feed_until(self.pos + self.pending.shape[1], final=True)
        for packet in self.stream.encode(None):
            self.container.mux(packet)


class OutputError(ValueError):
    """An output file that could not be written (a full disk, no permission). ``path``; ``cause`` (what the system
    said); ``frames_kept`` (a streamed video: the frames the file still plays; 0: no file was left behind); ``fix``;
    ``reason``: all of it in a sentence. A ``ValueError``, so the boundaries (CLI, nodes) report it as one message,
    with their own name for the path in front."""

    fix = "free space on that disk (or choose another folder) and run again"

    def __init__(self, path, cause: str, left: str, frames_kept: int = 0):
        self.path, self.cause, self.frames_kept = Path(path), cause, frames_kept
        self.reason = f"{cause}; {left}; {self.fix}."
        super().__init__(f"could not write {path}: {self.reason}")


os_write = os.write  # the one call that puts output bytes on a disk (the tests make it fail as a full disk does)


def _cause(exc: OSError) -> str:
    if exc.errno == errno.ENOSPC:
        return "the disk is full (No space left on device)"
    if exc.errno == getattr(errno, "EDQUOT", None):
        return "the disk quota is used up (Disk quota exceeded)"
    return f"the system refused the write ({exc.strerror or exc})"


class _OutputFile:
    """A file written through ``os_write``: whole buffers (short writes resumed), seekable (for the mp4 muxer).
    After a failed write ``failed`` holds the error and further bytes are dropped, so that a muxer can be shut down
    without touching the disk again: the file stays as it was at the failure."""

    def __init__(self, path: Path):
        self.path = path
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
        self.failed: OSError | None = None
        self.closed = False

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        size = len(view)
        if self.failed is None and not self.closed:
            try:
                while view:
                    view = view[os_write(self.fd, view):]
            except OSError as exc:
                self.failed = exc
                raise
        return size

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        return os.lseek(self.fd, offset, whence)

    def tell(self) -> int:
        return os.lseek(self.fd, 0, os.SEEK_CUR)

    def seekable(self) -> bool:
        return True

    def writable(self) -> bool:
        return True

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            os.close(self.fd)


def write_file(path, data) -> Path:
    """Write ``data`` (bytes) as the file ``path``: written beside it and renamed into place, so a failed write
    (a full disk) leaves neither a partial nor an empty file, and an older file of that name stays as it was; the
    failure is one ``OutputError``. Returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(f".{path.name}.{os.getpid()}.part")
    out = None
    try:
        out = _OutputFile(part)
        out.write(data)
        out.close()
        os.replace(part, path)
    except OSError as exc:
        if out is not None:
            out.close()
        part.unlink(missing_ok=True)
        raise OutputError(path, _cause(exc), "nothing was written") from None
    except BaseException:
        if out is not None:
            out.close()
        part.unlink(missing_ok=True)
        raise
    return path


def _playable_prefix(path: Path) -> int:
    """Bytes of a fragmented mp4 that play: its header (``ftyp`` + ``moov``) and every ``moof`` + ``mdat`` pair
    on disk whole (0: not even the header is whole)."""
    size, good, header, fragment = path.stat().st_size, 0, False, False
    with path.open("rb") as f:
        pos = 0
        while pos + 8 <= size:
            f.seek(pos)
            head = f.read(16)
            n, kind = int.from_bytes(head[:4], "big"), head[4:8]
            if n == 1 and len(head) == 16:
                n = int.from_bytes(head[8:16], "big")
            if n < 8 or pos + n > size:
                break
            pos += n
            if kind == b"moov":
                header, good = True, pos
            elif kind == b"moof":
                fragment = True
            elif kind == b"mdat" and fragment:
                fragment, good = False, pos
            elif kind == b"mfra" and header and not fragment:
                good = pos
    return good if header else 0


class VideoWriter:
    """An mp4 written while it is produced: ``append(frames, audio=None)`` any number of times, then ``close()``.

    Same encoding as ``write_video`` (which is this writer fed once). Each ``append`` encodes and muxes its frames
    at once, so memory does not grow with the video's length; ``close`` (also on an exception, via ``with``)
    flushes the encoders and writes the index, so whatever was appended before a cancel is a playable file.
    ``audio=True`` declares the AAC track up front (an mp4 cannot add a stream once packets are written); its
    samples then come with each ``append``. ``threads``: x264's threads (0 = its automatic choice). x264 does not
    always repeat its bytes for identical frames on a busy machine, with one thread or several (measured here), so
    two files of the same frames are compared by their decoded content, never by bytes.

    ``fragmented=True`` (a long video streamed window by window): a fragmented mp4 (``empty_moov``, an edit list
    for the AAC priming) whose every ``append`` starts with a key frame and so a new fragment; each fragment reaches
    the disk whole when the next one starts. The file then plays at every moment up to its last whole fragment.

    A write the disk refuses (a full disk) stops the writer at once — that ``append`` or ``close`` raises
    ``OutputError`` and nothing more is written. A fragmented file is cut back to its whole fragments, so it keeps
    the appends written before the failure, playable (``OutputError.frames_kept``); any other file is deleted (an
    mp4 without its index does not play), as is a fragmented one that kept no frame.
    """

    def __init__(self, path, fps, width: int, height: int, *, audio: bool = False, sample_rate: int = AUDIO_RATE,
                 crf: int = DEFAULT_CRF, threads: int = 0, fragmented: bool = False):
        self.path = Path(path)
        if height % 2 or width % 2:
            raise ValueError(f"write_video: H.264 yuv420p needs even height and width, got {height}x{width}; "
                             "crop or pad to even sizes (Cosmos3 sizes are multiples of 16).")
        self.rate = as_fraction(fps)
        self.width, self.height, self.sample_rate = width, height, sample_rate
        self.fragmented = fragmented
        self.frames_written = 0
        self.error: OutputError | None = None
        self.container = None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._file = _OutputFile(self.path)
        except OSError as exc:
            raise OutputError(self.path, _cause(exc), "nothing was written") from None
        options = {"movflags": "frag_keyframe+empty_moov+default_base_moof", "use_editlist": "1"} if fragmented \
            else {}
        try:
            self.container = av.open(self._file, mode="w", format="mp4", options=options)
            vs = self.container.add_stream("libx264", rate=self.rate)
            vs.width, vs.height, vs.pix_fmt = width, height, "yuv420p"
            vs.codec_context.time_base = 1 / self.rate  # one tick per frame: pts = frame index
            vs.options = {"crf": str(crf), "preset": "medium", "threads": str(threads),
                          **({"forced-idr": "1"} if fragmented else {})}  # a forced key frame is an IDR frame
            cc = vs.codec_context  # tag what we convert to: BT.709, limited range (HD default of players)
            cc.colorspace, cc.color_primaries, cc.color_trc, cc.color_range = _BT709, _BT709, _BT709, ColorRange.MPEG
        except av.FFmpegError as e:
            self._file.close()
            self.path.unlink(missing_ok=True)
            raise ValueError(f"write_video: could not write {self.path}: {e}") from e
        self.stream = vs
        self.audio = _AudioEncoder(self.container) if audio else None

    def append(self, frames, audio=None) -> None:
        """Encode ``frames`` ``[F, H, W, 3]`` (float [0, 1] or uint8) and, with an audio track, their samples."""
        if self.error is not None:
            raise self.error
        x = _to_numpy(frames, "write_video: frames")
        if x.ndim != 4 or x.shape[-1] != 3 or x.shape[1:3] != (self.height, self.width):
            raise ValueError(f"write_video: frames must be [F, {self.height}, {self.width}, 3], got shape "
                             f"{tuple(x.shape)}.")
        if audio is not None:
            if self.audio is None:
                raise ValueError("write_video: audio given, but the writer was opened without an audio track.")
            self.audio.push(_stereo48k(audio, self.sample_rate))
        try:
            for i, frame_rgb in enumerate(x):
                frame = av.VideoFrame.from_ndarray(_to_uint8(frame_rgb, "write_video"), format="rgb24").reformat(
                    format="yuv420p", dst_colorspace=Colorspace.ITU709, dst_color_range=ColorRange.MPEG,
                    dst_color_trc=_BT709, dst_color_primaries=_BT709)
                frame.pts = self.frames_written
                if self.fragmented and i == 0:
                    frame.pict_type = PictureType.I  # a new fragment per append
                for packet in self.stream.encode(frame):
                    self.container.mux(packet)
                self.frames_written += 1
                if self.audio is not None:  # audio up to the end of this frame
                    self.audio.feed_until(math.ceil(self.frames_written * AUDIO_RATE / self.rate))
        except (OSError, av.FFmpegError) as e:
            if self._file.failed is not None:
                raise self._write_failed() from None
            raise ValueError(f"write_video: could not write {self.path}: {e}") from e

    def close(self) -> Path:
        if self.container is None:
            return self.path
        try:
            try:
                for packet in self.stream.encode(None):
                    self.container.mux(packet)
                if self.audio is not None:
                    self.audio.finish()
            finally:
                container, self.container = self.container, None
                container.close()  # the trailer: the index, or the last fragment
        except (OSError, av.FFmpegError) as e:
            if self._file.failed is not None:
                raise self._write_failed() from None
            self._file.close()
            raise ValueError(f"write_video: could not write {self.path}: {e}") from e
        self._file.close()
        return self.path

    def _write_failed(self) -> OutputError:
        """The disk refused a write: shut the muxer without another write, keep what plays, say so."""
        self._file.close()  # closed: the muxer skips its trailer, buffered packets are dropped
        if self.container is not None:
            container, self.container = self.container, None
            try:
                container.close()
            except (OSError, av.FFmpegError):
                pass
        kept = 0
        if self.fragmented and self.path.is_file():
            os.truncate(self.path, _playable_prefix(self.path))
            try:
                with av.open(str(self.path)) as c:
                    kept = sum(1 for p in c.demux(c.streams.video[0]) if p.size) if c.streams.video else 0
            except av.FFmpegError:
                kept = 0
        if kept:
            left = (f"stopped there; {self.path.name} keeps the first {kept} of the {self.frames_written} frames "
                    f"({float(kept / self.rate):.1f} s) and plays")
        else:
            self.path.unlink(missing_ok=True)
            left = "stopped there and left no file (nothing playable was written)"
        self.error = OutputError(self.path, _cause(self._file.failed), left, frames_kept=kept)
        return self.error

    def __enter__(self) -> "VideoWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class BackgroundVideoWriter:
    """A ``VideoWriter`` fed by a worker thread, so that encoding overlaps what the caller does next (the CLI:
    decoding the next chunk of frames on the GPU). Same encoding as ``write_video`` of the same frames (the same
    calls into the same encoders, in the same order).

    ``append(frames)`` queues a block of frames and returns at once; the caller leaves the block unchanged until
    ``close()``. ``audio`` ``[C, N]`` (the whole track) is given up front and muxed along with the frames. ``close()``
    waits for the queue, finishes the file and returns its path; an error of the worker is raised from the next
    ``append`` or from ``close``. ``abort()`` stops the worker and deletes the file (a failed or abandoned run).
    """

    def __init__(self, path, fps, width: int, height: int, *, audio=None, sample_rate: int = AUDIO_RATE,
                 crf: int = DEFAULT_CRF, threads: int = 0):
        self._audio = None if audio is None else _stereo48k(audio, sample_rate)  # a bad track fails here
        self._writer = VideoWriter(path, fps, width, height, audio=audio is not None, crf=crf,  # as do bad sizes
                                   threads=threads)
        self._queue: queue.Queue = queue.Queue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._work, name="cosmos3-mp4-encode", daemon=True)
        self._thread.start()

    def _work(self) -> None:
        while (frames := self._queue.get()) is not None:
            if self._error is not None:
                continue  # drain: the caller learns of the error at its next append or close
            try:
                self._writer.append(frames, audio=self._audio)
                self._audio = None  # the whole track went in with the first block
            except BaseException as e:  # noqa: BLE001 — handed to the caller's thread
                self._error = e

    def append(self, frames) -> None:
        if self._error is not None:
            raise self._error
        self._queue.put(frames)

    def _stop(self) -> None:
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()

    def close(self) -> Path:
        self._stop()
        try:
            if self._error is not None:
                raise self._error
        finally:
            path = self._writer.close()
        return path

    def abort(self) -> None:
        self._stop()
        try:
            self._writer.close()
        except Exception:  # noqa: BLE001 — the file is deleted either way
            pass
        self._writer.path.unlink(missing_ok=True)


def write_video(path, frames, fps, audio=None, sample_rate: int = AUDIO_RATE, *, crf: int = DEFAULT_CRF,
                threads: int = 0) -> Path:
    """Write ``frames`` ``[F, H, W, 3]`` (float [0, 1] or uint8) as H.264 yuv420p at ``fps`` (int, float or
    Fraction), plus an AAC 48 kHz stereo track when ``audio`` ``[C, N]`` is given (``threads``: see
    ``VideoWriter``). Returns the path."""
    x = _to_numpy(frames, "write_video: frames")
    if x.ndim != 4 or x.shape[-1] != 3 or x.shape[0] < 1:
        raise ValueError(f"write_video: frames must be [F, H, W, 3] with F >= 1, got shape {tuple(x.shape)}.")
    as_fraction(fps)  # a bad rate fails before the file is created
    if audio is not None:
        _stereo48k(audio, sample_rate)  # likewise a bad track
    with VideoWriter(path, fps, x.shape[2], x.shape[1], audio=audio is not None, sample_rate=sample_rate,
                     crf=crf, threads=threads) as writer:
        writer.append(x, audio=audio)
    return Path(path)


def write_png(path, frame) -> Path:
    """Write one RGB frame ``[H, W, 3]`` (float [0, 1] or uint8) as PNG. Returns the path."""
    path = Path(path)
    x = _to_numpy(frame, "write_png: frame")
    if x.ndim != 3 or x.shape[-1] != 3:
        raise ValueError(f"write_png: frame must be [H, W, 3], got shape {tuple(x.shape)}.")
    data = io.BytesIO()
    Image.fromarray(_to_uint8(x, "write_png")).save(data, format="PNG")
    return write_file(path, data.getbuffer())


# --------------------------------------------------------------------------------------------------------------
# reading


def _existing(path, who: str) -> Path:
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{who}: {path} is a folder, not a file; give the file inside it.")
    if not path.is_file():
        raise FileNotFoundError(f"{who}: no such file: {path}")
    return path


def read_image(path) -> np.ndarray:
    """RGB float32 ``[H, W, 3]`` in [0, 1] (EXIF orientation applied, alpha dropped). An image above PIL's
    decompression-bomb limit (``Image.MAX_IMAGE_PIXELS``, ~89 megapixels) is refused before it is decoded."""
    path = _existing(path, "read_image")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as im:
                im = ImageOps.exif_transpose(im).convert("RGB")
                return np.asarray(im, dtype=np.float32) / 255.0
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise ValueError(f"read_image: {path} has more than {Image.MAX_IMAGE_PIXELS / 1e6:.0f} megapixels, which "
                         "this reader refuses (a decompression-bomb guard); downscale it first (Cosmos3 generates "
                         "at most 4096 pixels a side).") from None
    except (UnidentifiedImageError, OSError, ValueError) as e:
        raise ValueError(f"read_image: could not read {path} as an image: {e}") from e


def read_video(path, max_frames: int | None = None) -> tuple[np.ndarray, float]:
    """``(frames float32 [F, H, W, 3] in [0, 1], fps)`` of the first video stream; at most ``max_frames``."""
    path = _existing(path, "read_video")
    if max_frames is not None and max_frames < 1:
        raise ValueError(f"read_video: max_frames must be >= 1 or None, got {max_frames!r}.")
    out = []
    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise ValueError(f"read_video: {path} has no video stream.")
            stream = container.streams.video[0]
            rate = stream.average_rate or stream.guessed_rate or stream.base_rate
            for frame in container.decode(stream):
                out.append(frame.to_ndarray(format="rgb24"))
                if max_frames is not None and len(out) >= max_frames:
                    break
    except av.FFmpegError as e:
        raise ValueError(f"read_video: could not decode {path}: {e}") from e
    if not out:
        raise ValueError(f"read_video: {path} contains no decodable video frames.")
    fps = float(rate) if rate else float("nan")
    return np.stack(out).astype(np.float32) / 255.0, fps


def probe_media(path) -> dict:
    """Decode ``path`` fully and describe it (meant for tests and small outputs):

    ``video_frames``, ``width``, ``height``, ``fps`` (float), ``fps_fraction``, ``video_codec``, ``pix_fmt``;
    ``audio_sample_rate``, ``audio_channels``, ``audio_samples`` and ``audio_duration`` (decoded samples / rate,
    seconds; AAC decodes whole 1024-sample frames), ``audio_stream_duration`` (seconds the container declares,
    which honours the encoder's trim) — audio keys are None without an audio stream, video keys likewise.
    """
    path = _existing(path, "probe_media")
    info = dict.fromkeys(("video_frames", "width", "height", "fps", "fps_fraction", "video_codec", "pix_fmt",
                          "audio_sample_rate", "audio_channels", "audio_samples", "audio_duration",
                          "audio_stream_duration"))
    try:
        with av.open(str(path)) as container:  # one pass per stream: decode() of one stream is simplest
            if container.streams.video:
                vs = container.streams.video[0]
                rate = vs.average_rate or vs.guessed_rate
                info.update(width=vs.codec_context.width, height=vs.codec_context.height,
                            fps=float(rate) if rate else None, fps_fraction=Fraction(rate) if rate else None,
                            video_codec=vs.codec_context.name, pix_fmt=vs.codec_context.pix_fmt,
                            video_frames=sum(1 for _ in container.decode(vs)))
        with av.open(str(path)) as container:
            if container.streams.audio:
                aus = container.streams.audio[0]
                n = sum(fr.samples for fr in container.decode(aus))
                rate = aus.codec_context.sample_rate
                declared = float(aus.duration * aus.time_base) if aus.duration else None
                info.update(audio_sample_rate=rate, audio_channels=aus.codec_context.channels, audio_samples=n,
                            audio_duration=n / rate, audio_stream_duration=declared)
    except av.FFmpegError as e:
        raise ValueError(f"probe_media: could not read {path}: {e}") from e
    return info

"""Decode one video into frames: decord or OpenCV, frame selection by fps or stride, resize.

``read_video(path, ...)`` walks a video once, in display order, and hands each selected
frame (BGR uint8, upright, resized) to a ``process`` callable; frames the selection skips
are not colour-converted. Backends: ``decord`` (when importable) and ``opencv``; ``auto``
tries decord and falls back to OpenCV when decord cannot open the file or stops early,
keeping whichever decoded more frames.

Rotation: decord 0.6 and OpenCV 5 both return videos with a rotation matrix upright, so
frames are never rotated here (rotating again would turn them sideways); the rotation is
only recorded. Timestamps: a backend's presentation timestamps are used for ``fps``
resampling when they are sane (finite, increasing); otherwise ``index / fps``.
"""
from __future__ import annotations

import logging
import math
import os
import re
import stat
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional

import cv2
import numpy as np

from packer.errors import CorruptSample, UsageError

__all__ = ["BACKENDS", "PARTIAL_SLACK", "FrameSelection", "Resize", "VideoInfo", "VideoFrames",
           "read_video", "probe_video", "sample_frame", "decord_available", "parse_size"]

log = logging.getLogger(__name__)

BACKENDS = ("auto", "decord", "opencv")
# A video is a partial decode when it yields fewer frames than its container claims, beyond
# this slack: OpenCV estimates the count of containers without one (duration x fps), which
# overshoots by one on ordinary files (e.g. 311 claimed for 310 frames in a Matroska file).
PARTIAL_SLACK = 1
# A target time half-way between two frames goes to the earlier one; timestamps carry float32
# noise (decord), so "half-way" is judged to within this many seconds.
_TIE = 1e-4


def decord_available() -> bool:
    """True when ``import decord`` works in this process."""
    try:
        import decord  # noqa: F401
    except Exception:  # ImportError, or a broken binary wheel
        return False
    return True


# -- options ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class FrameSelection:
    """Which frames to keep: every frame, every ``stride``-th, or resampled to ``fps``
    (by timestamps: output frame k shows the source frame nearest to time k/fps); at most
    ``max_frames``."""

    fps: Optional[float] = None
    stride: Optional[int] = None
    max_frames: Optional[int] = None

    def __post_init__(self) -> None:
        if self.fps is not None and self.stride is not None:
            raise UsageError("--fps and --stride exclude each other")
        if self.fps is not None and not (self.fps > 0 and math.isfinite(self.fps)):
            raise UsageError(f"--fps must be a positive number, not {self.fps}")
        if self.stride is not None and self.stride < 1:
            raise UsageError(f"--stride must be >= 1, not {self.stride}")
        if self.max_frames is not None and self.max_frames < 1:
            raise UsageError(f"--max-frames must be >= 1, not {self.max_frames}")

    def output_fps(self, source_fps: float) -> float:
        """The frame rate of the selected frames."""
        if self.fps is not None:
            return float(self.fps)
        return source_fps / (self.stride or 1)

    def count(self, frames: int, source_fps: float) -> int:
        """How many frames the selection keeps from ``frames`` evenly spaced source frames."""
        if self.fps is not None and source_fps > 0:
            last = (frames - 0.5) / source_fps + _TIE  # the last target the last frame takes
            n = int(math.floor(last * self.fps)) + 1 if frames else 0
        else:
            n = -(-frames // (self.stride or 1))
        return min(n, self.max_frames) if self.max_frames else n

    def selector(self, source_fps: float) -> "_Selector":
        return _Selector(self, source_fps)


class _Selector:
    """Streaming frame selection: ``take(pts)`` says how many copies of this frame to emit."""

    def __init__(self, sel: FrameSelection, source_fps: float):
        self.sel = sel
        self.half = 0.5 / source_fps if source_fps > 0 else 0.0
        self.index = 0  # source frames seen
        self.emitted = 0
        self.done = False

    def take(self, pts: float) -> int:
        i = self.index
        self.index += 1
        if self.sel.fps is not None:
            # targets k/fps not yet emitted whose nearest frame is this one (pts within half a
            # source frame of the target, or later)
            n = 0
            while (self.emitted + n) / self.sel.fps <= pts + self.half + _TIE:
                n += 1
        else:
            n = 1 if i % (self.sel.stride or 1) == 0 else 0
        if self.sel.max_frames is not None:
            n = min(n, self.sel.max_frames - self.emitted)
            if self.emitted + n >= self.sel.max_frames:
                self.done = True
        self.emitted += n
        return n


def parse_size(text: str) -> tuple[int, int]:
    """``"WxH"`` -> (W, H); 0 on one side means "from the aspect ratio"."""
    try:
        w, h = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise UsageError(f"--size must look like WxH (e.g. 340x256), not {text!r}") from None
    if w < 0 or h < 0 or (w == 0 and h == 0):
        raise UsageError(f"--size {text!r}: sides must be >= 0 and not both 0")
    return w, h


@dataclass(frozen=True)
class Resize:
    """Rescale frames up or down (as mmaction2's ``--new-short``): ``short_side`` N, or
    ``size`` (W, H) fitted inside with the aspect kept (``keep_aspect=False``: exactly WxH;
    a 0 side is derived from the aspect)."""

    short_side: Optional[int] = None
    size: Optional[tuple[int, int]] = None
    keep_aspect: bool = True

    def __post_init__(self) -> None:
        if self.short_side is not None and self.size is not None:
            raise UsageError("--short-side and --size exclude each other")
        if self.short_side is not None and self.short_side < 1:
            raise UsageError(f"--short-side must be >= 1, not {self.short_side}")

    @property
    def active(self) -> bool:
        return self.short_side is not None or self.size is not None

    def target(self, height: int, width: int) -> tuple[int, int]:
        """Output (height, width) for a ``height`` x ``width`` frame."""
        if self.short_side is not None:
            s = self.short_side / min(height, width)
        elif self.size is not None:
            w, h = self.size
            if w == 0:
                s = h / height
            elif h == 0:
                s = w / width
            elif not self.keep_aspect:
                return h, w
            else:
                s = min(w / width, h / height)
        else:
            return height, width
        return max(1, int(round(height * s))), max(1, int(round(width * s)))

    def __call__(self, frame: np.ndarray) -> np.ndarray:
        h, w = frame.shape[:2]
        th, tw = self.target(h, w)
        if (th, tw) == (h, w):
            return frame
        interp = cv2.INTER_AREA if th * tw < h * w else cv2.INTER_LINEAR
        return cv2.resize(frame, (tw, th), interpolation=interp)


# -- results ----------------------------------------------------------------------------------
@dataclass
class VideoInfo:
    """What the container says: frame count (None when unknown), fps, upright size, rotation."""

    container_frames: Optional[int]
    fps: float
    height: int
    width: int
    rotation: int = 0


@dataclass
class VideoFrames:
    """One decoded video: the processed frames in output order plus what describes them."""

    frames: list[Any]
    info: VideoInfo
    backend: str
    decoded_frames: int  # source frames decoded (before selection)
    stopped_early: bool  # the selection was satisfied before the end (--max-frames)
    error: Optional[str] = None  # why decoding stopped early, if it did
    height: int = 0  # of the processed frames
    width: int = 0
    tried: list[str] = field(default_factory=list)

    @property
    def partial(self) -> bool:
        """Fewer frames than the container claims (beyond ``PARTIAL_SLACK``), not by choice."""
        claimed = self.info.container_frames
        return (not self.stopped_early and claimed is not None
                and self.decoded_frames < claimed - PARTIAL_SLACK)


# -- backends ---------------------------------------------------------------------------------
def _cv2_capture(path: str) -> "cv2.VideoCapture":
    # one decoding thread: decode-frames runs one video per worker process
    cap = cv2.VideoCapture(path, cv2.CAP_FFMPEG, [cv2.CAP_PROP_N_THREADS, 1])
    if cap.isOpened():
        cap.set(cv2.CAP_PROP_ORIENTATION_AUTO, 1)  # the default; frames come out upright
    return cap


def _cv2_info(cap: "cv2.VideoCapture") -> VideoInfo:
    n = int(cap.get(cv2.CAP_PROP_FRAME_COUNT))
    return VideoInfo(container_frames=n if n > 0 else None, fps=float(cap.get(cv2.CAP_PROP_FPS) or 0.0),
                     height=int(cap.get(cv2.CAP_PROP_FRAME_HEIGHT)),
                     width=int(cap.get(cv2.CAP_PROP_FRAME_WIDTH)),
                     rotation=int(cap.get(cv2.CAP_PROP_ORIENTATION_META)) % 360)


def probe_video(path: str | os.PathLike) -> VideoInfo:
    """Container metadata through OpenCV (fast: no frame is decoded). Raises ValueError."""
    cap = _cv2_capture(str(path))
    try:
        if not cap.isOpened():
            raise ValueError(f"{path}: OpenCV cannot open it")
        return _cv2_info(cap)
    finally:
        cap.release()


def sample_frame(path: str | os.PathLike, seconds: float = 2.0) -> Optional[np.ndarray]:
    """One typical frame (BGR, upright) through OpenCV, or None: ``seconds`` in (past fade-ins),
    at most half-way, so that finding it decodes a few dozen frames, not half the video."""
    cap = _cv2_capture(str(path))
    try:
        n = int(cap.get(cv2.CAP_PROP_FRAME_COUNT))
        at = min(n // 2, int(seconds * (cap.get(cv2.CAP_PROP_FPS) or 25.0)))
        if at > 0:
            cap.set(cv2.CAP_PROP_POS_FRAMES, at)
        ok, frame = cap.read()
        return frame if ok else None
    finally:
        cap.release()


class _Source:
    """One backend over one file: ``info`` and ``frames()`` -> (raw pts or None, fetch())."""

    name = ""
    info: VideoInfo

    def frames(self) -> Iterator[tuple[Optional[float], Callable[[], np.ndarray]]]:
        raise NotImplementedError

    def close(self) -> None:
        pass


class _OpenCVSource(_Source):
    name = "opencv"

    def __init__(self, path: str):
        self.cap = _cv2_capture(path)
        if not self.cap.isOpened():
            raise ValueError("cannot open the file")
        self.info = _cv2_info(self.cap)

    def frames(self):
        fetch = lambda: self.cap.retrieve()[1]  # noqa: E731 - BGR, upright
        while self.cap.grab():
            yield self.cap.get(cv2.CAP_PROP_POS_MSEC) / 1000.0, fetch

    def close(self) -> None:
        self.cap.release()


class _DecordSource(_Source):
    name = "decord"

    def __init__(self, path: str, probe: Optional[VideoInfo]):
        import decord

        self.vr = decord.VideoReader(path, ctx=decord.cpu(0), num_threads=1)
        self.n = n = len(self.vr)
        if probe is not None:
            height, width, rotation = probe.height, probe.width, probe.rotation
        else:  # OpenCV could not read the header: take the size from the first frame
            shape = self.vr[0].shape if n else (0, 0, 3)
            self.vr.seek(0)
            height, width, rotation = int(shape[0]), int(shape[1]), 0
        self.info = VideoInfo(container_frames=n or None, fps=float(self.vr.get_avg_fps() or 0.0),
                              height=height, width=width, rotation=rotation)

    def frames(self):
        try:
            pts = self.vr.get_frame_timestamp(range(self.n))[:, 0].tolist() if self.n else []
        except Exception:  # timestamps are a nicety; index / fps works too
            pts = [None] * self.n
        pos = [0]  # the frame the reader returns next

        def fetch() -> np.ndarray:
            frame = self.vr.next().asnumpy()
            pos[0] += 1
            return cv2.cvtColor(frame, cv2.COLOR_RGB2BGR)

        for i in range(self.n):
            yield pts[i], fetch
            if pos[0] <= i:  # not fetched: step past it without converting it
                self.vr.skip_frames(i + 1 - pos[0])
                pos[0] = i + 1


def _open(backend: str, path: str, probe: Optional[VideoInfo]) -> _Source:
    if backend == "decord":
        return _DecordSource(path, probe)
    return _OpenCVSource(path)


def _run(src: _Source, selection: FrameSelection, resize: Optional[Resize],
         process: Callable[[np.ndarray], Any]) -> VideoFrames:
    fps = src.info.fps
    sel = selection.selector(fps if fps > 0 else 25.0)
    out: list[Any] = []
    decoded = 0
    error = None
    t0 = prev = None
    step = 1.0 / fps if fps > 0 else 0.04
    height = width = 0
    try:
        for raw, fetch in src.frames():
            decoded += 1
            # presentation time relative to the first frame, repaired where not increasing
            if t0 is None:
                t0 = raw if raw is not None and math.isfinite(raw) else 0.0
                t = 0.0
            else:
                t = (raw - t0) if raw is not None and math.isfinite(raw) else math.nan
                if not (t > prev) or t > prev + 100 * step:
                    t = prev + step
            prev = t
            copies = sel.take(t)
            if copies:
                frame = fetch()
                if frame is None:
                    raise ValueError(f"frame {decoded - 1} could not be retrieved")
                if resize is not None and resize.active:
                    frame = resize(frame)
                height, width = frame.shape[:2]
                value = process(frame)
                out.extend([value] * copies)
            if sel.done:
                break
    except Exception as e:  # a decoder error mid-stream: keep what decoded (a partial decode)
        error = _short(e)
        decoded -= 1  # the frame that raised did not decode
    return VideoFrames(out, src.info, src.name, decoded, sel.done, error, height, width)


def read_video(path: str | os.PathLike, *, backend: str = "auto",
               selection: FrameSelection = FrameSelection(), resize: Optional[Resize] = None,
               process: Callable[[np.ndarray], Any] = lambda f: f, key: str = "",
               prefer: str = "decord") -> VideoFrames:
    """Decode ``path`` once and return the selected frames, each passed through ``process``.

    Frames are BGR uint8 HxWx3, upright, resized by ``resize`` before ``process``.
    Raises ``CorruptSample`` (stage ``read`` or ``decode``) when the file is missing or no
    frame decodes with any backend tried; a decode that stops early is returned with
    ``error`` set (see ``VideoFrames.partial``).
    """
    if backend not in BACKENDS:
        raise UsageError(f"--backend must be one of {', '.join(BACKENDS)}, not {backend!r}")
    path = str(path)
    try:
        st = os.stat(path)
    except OSError as e:
        raise CorruptSample(key, path, "file not found" if isinstance(e, FileNotFoundError)
                            else f"cannot read file ({e.strerror or e})", stage="read") from None
    if stat.S_ISDIR(st.st_mode):
        raise CorruptSample(key, path, "is a folder, not a video file", stage="read")
    if stat.S_ISREG(st.st_mode) and st.st_size == 0:
        raise CorruptSample(key, path, "empty file (0 bytes)", stage="read")
    if prefer not in ("decord", "opencv"):
        raise ValueError(f"prefer must be 'decord' or 'opencv', not {prefer!r}")
    auto = ["decord", "opencv"] if decord_available() else ["opencv"]
    if prefer == "opencv":
        auto.reverse()
    order = {"auto": auto,
             "decord": ["decord"], "opencv": ["opencv"]}[backend]
    if backend == "decord" and not decord_available():
        raise UsageError("--backend decord: decord is not importable here (pip install decord)")
    probe = None
    best: Optional[VideoFrames] = None
    notes = []
    for name in order:
        if name == "decord":  # decord does not report rotation or the container's own size
            try:
                probe = probe_video(path)
            except ValueError:
                pass
        try:
            src = _open(name, path, probe)
        except Exception as e:
            notes.append(f"{name}: cannot open ({_short(e)})")
            continue
        try:
            result = _run(src, selection, resize, process)
        finally:
            src.close()
        if result.error:
            notes.append(f"{name}: stopped after {result.decoded_frames} frames ({result.error})")
        elif not result.frames:
            claimed = result.info.container_frames
            notes.append(f"{name}: decoded {result.decoded_frames} of {claimed if claimed else '?'} frames")
        # decord's threaded decoder stops at a varying frame on corrupt input; OpenCV is
        # deterministic, so once decord has stopped early OpenCV's frames win when it has any.
        if best is None or (result.frames and (best.error or result.decoded_frames >= best.decoded_frames)):
            best = result
        if result.frames and not result.error and not result.partial:
            break
    if best is None or not best.frames:
        raise CorruptSample(key, path, "no decodable video frames (" + "; ".join(notes) + ")")
    best.tried = notes
    return best


_NOISE = re.compile(r"\[\d\d:\d\d:\d\d\] |\S+\.(?:cc|cpp|h|hpp):\d+: ")


def _short(e: Exception) -> str:
    """A decoder error as one stable line (decord prefixes wall-clock times and source paths)."""
    text = _NOISE.sub("", " ".join(str(e).split())).strip()
    return (f"{type(e).__name__}: {text}" if text else type(e).__name__)[:240]

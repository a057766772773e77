"""Video decoding backends: decord and OpenCV sources over one file, container probing.

A source yields ``(raw presentation time or None, fetch())`` per frame in display order;
``fetch()`` returns the frame BGR uint8, upright, and is called only for frames kept.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Iterator, Optional

import cv2
import numpy as np

from packer.fileio import not_regular

__all__ = ["VideoInfo", "VideoSource", "decord_available", "probe_video", "presented_frames", "sample_frame",
           "open_source"]


def decord_available() -> bool:
    """True when ``import decord`` works in this process."""
    try:
        import decord  # noqa: F401
    except Exception:  # ImportError, or a broken binary wheel
        return False
    return True



@dataclass
class VideoInfo:
    """What the container says: frame count (None when unknown), fps, upright size, rotation."""

    container_frames: Optional[int]
    fps: float
    height: int
    width: int
    rotation: int = 0


def regular_video(path: str) -> None:
    """Refuse (ValueError) a path that is not a regular file before a decoder opens it: FFmpeg
    waits forever on a named pipe. (The decoders stream a video, so no size cap applies here.)"""
    try:
        kind = not_regular(os.stat(path).st_mode)
    except OSError:
        return  # missing or unreadable: the decoder's own error says so
    if kind is not None:
        raise ValueError(f"{path}: is {kind}, not a regular file")


def _cv2_capture(path: str) -> "cv2.VideoCapture":
    regular_video(path)
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


def presented_frames(path: str | os.PathLike) -> Optional[int]:
    """Frames the container presents when its edit list hides some (None when it hides none, or
    PyAV is not importable to tell): its video packets less those FFmpeg's demuxer marks discarded.

    An MP4 cut with stream copy (``ffmpeg -ss``) keeps the GOP before the cut and hides its first
    frames with an edit list: the container's frame count (what OpenCV reports) includes them, but
    a decode that honours the edit list (OpenCV's) presents fewer. Demuxing only, no decoding."""
    try:
        import av
    except ImportError:
        return None
    try:
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            packets = discarded = 0
            for packet in container.demux(stream):
                if packet.size:
                    packets += 1
                    discarded += bool(packet.is_discard)
    except (av.error.FFmpegError, IndexError, OSError):
        return None
    return packets - discarded if discarded else None


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


class VideoSource:
    """One backend over one file: ``info`` and ``frames()`` -> (raw pts or None, fetch())."""

    name = ""
    info: VideoInfo

    def frames(self) -> Iterator[tuple[Optional[float], Callable[[], np.ndarray]]]:
        raise NotImplementedError

    def close(self) -> None:
        pass


class _OpenCVSource(VideoSource):
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


class _DecordSource(VideoSource):
    name = "decord"

    def __init__(self, path: str, probe: Optional[VideoInfo]):
        import decord

        regular_video(path)
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


def open_source(backend: str, path: str, probe: Optional[VideoInfo]) -> VideoSource:
    """The ``backend`` (``decord`` or ``opencv``) source over ``path``; raises when it cannot open it."""
    if backend == "decord":
        return _DecordSource(path, probe)
    return _OpenCVSource(path)

"""Decode one video into frames: decord or OpenCV, frame selection by fps or stride, resize.

``read_video(path, ...)`` walks a video once, in display order, and hands each selected
frame (BGR uint8, upright, resized) to a ``process`` callable; frames the selection skips
are not colour-converted. A source frame the selection takes several times (``--fps`` above
the source's rate) is processed once and its value fills each of its output frames; the
result's ``sources`` is the frame list (the source frame index of each output frame), the
one ``FrameSelection.select`` gives for the same timestamps. Backends: ``decord`` (when importable) and ``opencv``; ``auto``
tries ``prefer`` first (OpenCV unless told: less CPU per frame, see docs/writing.md) and falls
back to the other when it cannot open the file or decodes fewer frames than the container
claims, keeping whichever decoded more frames. A video is held to the largest frame count
any reader reported, so a fallback that counts less never turns a partial decode whole. The
exception is an edit list that hides frames (an MP4 cut with stream copy): a clean decode of
exactly the frames it presents (``presented_frames``, PyAV's demuxer) is whole, and no fallback
runs (decord ignores edit lists and repeats the last frame in place of the hidden ones).

Rotation: decord 0.6 and OpenCV 5 both return videos with a rotation matrix upright, so
frames are never rotated here (rotating again would turn them sideways); the rotation is
only recorded. Timestamps: a backend's presentation timestamps are used for ``fps``
resampling when they are sane (finite, increasing); otherwise ``index / fps``.

The selection and resize arithmetic lives in ``packer.codecs.frame_selection``, the decord
and OpenCV sources in ``packer.codecs.video_sources`` (both re-exported here).
"""
from __future__ import annotations

import dataclasses
import math
import os
import re
import stat
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import numpy as np

from packer.codecs.frame_selection import FrameSelection, Resize
from packer.codecs.video_sources import (VideoInfo, VideoSource, decord_available, open_source, presented_frames,
                                         probe_video, sample_frame)
from packer.errors import CorruptSample, UsageError
from packer.fileio import not_regular

__all__ = ["BACKENDS", "PARTIAL_SLACK", "FrameSelection", "Resize", "VideoInfo", "VideoFrames",
           "read_video", "probe_video", "sample_frame", "decord_available"]

BACKENDS = ("auto", "decord", "opencv")
# A video is a partial decode when it yields fewer frames than its container claims, beyond
# this slack: OpenCV estimates the count of containers without one (duration x fps), which
# overshoots by one on ordinary files (e.g. 311 claimed for 310 frames in a Matroska file).
PARTIAL_SLACK = 1


@dataclass
class VideoFrames:
    """One decoded video: the processed frames in output order plus what describes them."""

    frames: list[Any]  # one value per output frame (empty when ``read_video`` was given ``emit``)
    info: VideoInfo
    backend: str
    decoded_frames: int  # source frames decoded (before selection)
    stopped_early: bool  # the selection was satisfied before the end (--max-frames)
    error: Optional[str] = None  # why decoding stopped early, if it did
    height: int = 0  # of the processed frames
    width: int = 0
    tried: list[str] = field(default_factory=list)
    sources: list[int] = field(default_factory=list)  # the source frame index of each output frame

    @property
    def partial(self) -> bool:
        """Fewer frames than the container claims (beyond ``PARTIAL_SLACK``), not by choice."""
        claimed = self.info.container_frames
        return (not self.stopped_early and claimed is not None
                and self.decoded_frames < claimed - PARTIAL_SLACK)


def _run(src: VideoSource, selection: FrameSelection, resize: Optional[Resize],
         process: Callable[[np.ndarray], Any], emit: Optional[Callable[[Any], None]]) -> VideoFrames:
    fps = src.info.fps
    sel = selection.selector(fps if fps > 0 else 25.0)
    out: list[Any] = []
    sources: list[int] = []
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
                if emit is None:
                    out.extend([value] * copies)
                else:
                    for _ in range(copies):
                        emit(value)
                sources.extend([decoded - 1] * copies)
            if sel.done:
                break
    except Exception as e:  # a decoder error mid-stream: keep what decoded (a partial decode)
        error = _short(e)
        decoded -= 1  # the frame that raised did not decode
    return VideoFrames(out, src.info, src.name, decoded, sel.done, error, height, width, sources=sources)


def read_video(path: str | os.PathLike, *, backend: str = "auto",
               selection: FrameSelection = FrameSelection(), resize: Optional[Resize] = None,
               process: Callable[[np.ndarray], Any] = lambda f: f, key: str = "",
               prefer: str = "opencv", on_attempt: Optional[Callable[[str], None]] = None,
               emit: Optional[Callable[[Any], None]] = None) -> VideoFrames:
    """Decode ``path`` once and return the selected frames, each passed through ``process``.

    ``process`` runs once per source frame kept; its value stands for every output frame that
    source frame fills (the result's ``frames``, in order; ``sources`` the frame list). With
    ``emit``, the values are not kept: ``emit(value)`` is called once per output frame instead,
    in order (a consumer that streams them, such as an encoder, sees a repeated frame repeated).
    Frames are BGR uint8 HxWx3, upright, resized by ``resize`` before ``process``. A fallback
    decodes the video again with another backend, through ``process`` again: ``on_attempt(name)``
    is called before each backend's frames, so a ``process`` with side effects (an encoder) can
    start afresh; the result's ``backend`` names the attempt whose frames it holds.
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
                            else f"cannot read file ({e.strerror or e})", stage="read") from e
    if stat.S_ISDIR(st.st_mode):
        raise CorruptSample(key, path, "is a folder, not a video file", stage="read")
    kind = not_regular(st.st_mode)
    if kind is not None:  # a decoder would wait forever on a named pipe
        raise CorruptSample(key, path, f"is {kind}, not a regular file", stage="read")
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
    claims = []  # every frame count a container reader reported (see below)
    presented = None  # the frames an edit list presents, once a clean decode came out short
    for name in order:
        if name == "decord" and probe is None:  # decord does not report rotation or the container's own size
            try:
                probe = probe_video(path)
            except ValueError:
                pass
            else:
                claims.append(probe.container_frames)
        try:
            src = open_source(name, path, probe)
        except Exception as e:
            notes.append(f"{name}: cannot open ({_short(e)})")
            continue
        if on_attempt is not None:
            on_attempt(name)
        try:
            result = _run(src, selection, resize, process, emit)
        finally:
            src.close()
        claims.append(result.info.container_frames)
        if result.partial and not result.error and presented is None:
            # A clean decode short of the container's count: an edit list that hides frames (which
            # OpenCV honours) is not a partial decode. decord ignores edit lists and pads the end
            # with the last frame repeated: falling back to it would store wrong frames.
            presented = presented_frames(path) or 0
        if presented and result.decoded_frames >= presented - PARTIAL_SLACK and not result.error:
            result.info = dataclasses.replace(result.info, container_frames=presented)
        if result.error:
            notes.append(f"{name}: stopped after {result.decoded_frames} frames ({result.error})")
        elif not result.sources:
            claimed = result.info.container_frames
            notes.append(f"{name}: decoded {result.decoded_frames} of {claimed if claimed else '?'} frames")
        # decord's threaded decoder stops at a varying frame on corrupt input; OpenCV is
        # deterministic, so once decord has stopped early OpenCV's frames win when it has any.
        # Otherwise a later backend wins only with more frames: a tie keeps the first.
        if best is None or (result.sources and (not best.sources or best.error
                                                or result.decoded_frames > best.decoded_frames)):
            best = result
        if result.sources and not result.error and not result.partial:
            break
    if best is None or not best.sources:
        raise CorruptSample(key, path, "no decodable video frames (" + "; ".join(notes) + ")")
    # The claim is the largest count any reader gave. decord counts the packets it finds, so
    # of an AVI cut short (its index gone) it claims only what is left (15 where the header
    # OpenCV reads says 30): taking its count alone would keep a truncated video as whole.
    claimed = max((n for n in claims if n), default=None)
    if presented and best.info.container_frames == presented:
        claimed = presented  # the edit list's count: the container's own is of frames it hides
    if claimed is not None and claimed != best.info.container_frames:
        best.info = dataclasses.replace(best.info, container_frames=claimed)
    best.tried = notes
    return best


_NOISE = re.compile(r"\[\d\d:\d\d:\d\d\] |\S+\.(?:cc|cpp|h|hpp):\d+: ")


def _short(e: Exception) -> str:
    """A decoder error as one stable line (decord prefixes wall-clock times and source paths)."""
    text = _NOISE.sub("", " ".join(str(e).split())).strip()
    return (f"{type(e).__name__}: {text}" if text else type(e).__name__)[:240]

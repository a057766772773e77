"""Frame selection and resize arithmetic for decoded video: which frames to keep (every
frame, every ``stride``-th, resampled to ``fps`` by timestamps, at most ``max_frames``) and
what size they come out at.

The selection rule has one home, ``_Selector.take``: every command that selects frames
(``decode-frames``, ``pack-videos``, through ``packer.codecs.video.read_video``) and every
figure derived from a selection (``FrameSelection.count``, ``FrameSelection.select``) goes
through it. Its result is a frame list: the source frame index of each output frame, in
order; a source frame appears as many times as the selection takes it (``--fps`` above the
source's rate repeats frames)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Optional

import cv2
import numpy as np

from packer.errors import UsageError

__all__ = ["FrameSelection", "Resize"]

# A target time half-way between two frames goes to the earlier one; timestamps carry float32
# noise (decord), so "half-way" is judged to within this many seconds.
_TIE = 1e-4



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
        """How many frames the selection keeps from ``frames`` evenly spaced source frames
        (``len(select(...))`` of their times, without the list)."""
        if self.fps is not None and source_fps <= 0:
            return min(frames, self.max_frames) if self.max_frames else frames  # no times to resample by
        sel = self.selector(source_fps)
        n = 0
        for i in range(frames):
            n += sel.take(i / source_fps if source_fps > 0 else 0.0)
            if sel.done:
                break
        return n

    def select(self, times: Iterable[float], source_fps: float) -> list[int]:
        """The frame list: for each output frame in order, the index of the source frame it
        shows, given the source frames' presentation ``times`` (seconds from the first, in
        display order) and the source's nominal rate (which sets "nearest" for ``fps``)."""
        sel = self.selector(source_fps)
        out: list[int] = []
        for i, t in enumerate(times):
            out.extend([i] * sel.take(t))
            if sel.done:
                break
        return out

    def selector(self, source_fps: float) -> "_Selector":
        """The streaming form of the rule: ``take(time)`` once per source frame, in display
        order, says how many output frames that source frame fills (0: skipped)."""
        return _Selector(self, source_fps)


class _Selector:
    """Streaming frame selection, the one home of the rule: ``take(pts)`` says how many output
    frames this source frame fills. ``fps``: output frame k shows the source frame nearest to
    time k/fps (within half a source frame; a tie goes to the earlier frame), so a source frame
    is taken 0, 1 or several times; ``stride`` K: every K-th frame once, from the first; at
    most ``max_frames`` in all."""

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

"""Frame selection and resize arithmetic for decoded video: which frames to keep (every
frame, every ``stride``-th, resampled to ``fps`` by timestamps, at most ``max_frames``) and
what size they come out at."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

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

"""Estimate an output's size and file count before a conversion, and refuse when it won't fit."""
from __future__ import annotations

import logging
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

import cv2
import numpy as np

from .errors import UsageError
from .sources import Item
from .video import FrameSelection, Resize, probe_video

__all__ = ["Estimate", "estimate_frames", "free_space", "check_space", "human_bytes"]

log = logging.getLogger(__name__)


def human_bytes(n: float) -> str:
    """1234567 -> '1.2 MB' (decimal units, as disk vendors and ``df -H`` count)."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"  # pragma: no cover


@dataclass
class Estimate:
    """Expected output: bytes on disk and files (frames plus folders), from ``sampled`` videos."""

    bytes: int
    files: int
    frames: int
    sampled: int
    videos: int

    def describe(self) -> str:
        files = f" in {self.files:,} files" if self.files else ""
        return (f"about {human_bytes(self.bytes)}{files} ({self.frames:,} frames, "
                f"estimated from {self.sampled} of {self.videos} videos)")


def _sample_frame(path: str) -> Optional[np.ndarray]:
    """A frame from the middle of the video (BGR), or None."""
    cap = cv2.VideoCapture(path)
    try:
        n = int(cap.get(cv2.CAP_PROP_FRAME_COUNT))
        if n > 2:
            cap.set(cv2.CAP_PROP_POS_FRAMES, n // 2)
        ok, frame = cap.read()
        return frame if ok else None
    finally:
        cap.release()


def estimate_frames(items: Sequence[Item], *, selection: FrameSelection, resize: Optional[Resize],
                    encode: Callable[[np.ndarray], bytes], per_file_files: bool = True,
                    sample: int = 24, block: int = 4096, seed: int = 0) -> Estimate:
    """Estimate what decoding ``items`` writes: probe a seeded sample of videos (container
    frame count and fps through the selection, one middle frame resized and encoded) and
    extrapolate to all. With ``per_file_files`` every frame is a file rounded up to ``block``
    bytes plus one folder per video (frame folders); else one packed stream."""
    picks = random.Random(seed).sample(list(items), min(sample, len(items)))
    frames, sizes, probed = [], [], 0
    for it in picks:
        try:
            info = probe_video(it.path)
        except ValueError:
            continue
        frame = _sample_frame(it.path)
        if frame is None or not info.container_frames:
            continue
        probed += 1
        n = selection.count(info.container_frames, info.fps)
        h, w = frame.shape[:2]
        th, tw = resize.target(h, w) if resize is not None else (h, w)
        scale = 1.0
        if th * tw > h * w:  # encode at the source size and scale: no giant frames here
            scale, small = th * tw / (h * w), frame
        else:
            small = resize(frame) if resize is not None else frame
        size = len(encode(small)) * scale
        if per_file_files:
            size = -(-size // block) * block
        frames.append(n)
        sizes.append(size * n)
    n_videos = len(items)
    if not probed:
        return Estimate(0, 0, 0, 0, n_videos)
    mean_frames = sum(frames) / probed
    total_frames = int(mean_frames * n_videos)
    total = sum(sizes) / probed * n_videos
    files = total_frames + n_videos if per_file_files else 0  # packed: a handful of files
    if per_file_files:
        total += n_videos * block  # one folder per video
    return Estimate(int(total), int(files), total_frames, probed, n_videos)


def free_space(path: str | os.PathLike) -> tuple[int, Optional[int], Path]:
    """(free bytes, free inodes or None where the file system does not count them, the
    existing folder measured) for where ``path`` would be created."""
    p = Path(path).absolute()
    while not p.exists():
        p = p.parent
    st = os.statvfs(p)
    inodes = st.f_favail if st.f_files > 0 else None
    return st.f_bavail * st.f_frsize, inodes, p


def check_space(out: str | os.PathLike, estimate: Estimate, *, force: bool = False,
                margin: float = 1.05) -> None:
    """Refuse (UsageError, with the numbers) when ``estimate`` does not fit where ``out`` goes."""
    free, inodes, where = free_space(out)
    need = int(estimate.bytes * margin)
    short_bytes = need > free
    short_files = inodes is not None and estimate.files > inodes
    if not (short_bytes or short_files):
        return
    have = f"{human_bytes(free)}" + (f" and {inodes:,} inodes" if inodes is not None else "")
    msg = f"{out}: the output needs {estimate.describe()}, but {where} has {have} free"
    if force:
        log.warning("%s; going on (--force)", msg)
        return
    raise UsageError(msg + "; free some space or pass --force")

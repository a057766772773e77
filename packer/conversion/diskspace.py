"""Estimate an output's size and file count before a conversion, and refuse when it won't fit."""
from __future__ import annotations

import logging
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from packer.errors import UsageError
from packer.conversion.inputs import Item

__all__ = ["Estimate", "estimate_output", "sample_items", "free_space", "fits", "check_space", "human_bytes",
           "encoded_bound", "disk_used"]

log = logging.getLogger(__name__)


def human_bytes(n: float) -> str:
    """1234567 -> '1.2 MB' (decimal units, as disk vendors and ``df -H`` count)."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"  # pragma: no cover


# Shaped like commands.merge.MergeReport (counts + a one-line summary) on purpose: two unrelated results.
@dataclass
class Estimate:
    """Expected output: bytes on disk and files (frames plus folders), from ``sampled`` videos."""

    bytes: int
    files: int
    frames: int
    sampled: int
    videos: int
    bound: bool = False  # bytes is an upper bound (from the containers' headers), not a probe

    def describe(self) -> str:
        files = f" in {self.files:,} files" if self.files else ""
        how = "bounded from the headers of" if self.bound else "estimated from"
        return (f"{'at most' if self.bound else 'about'} {human_bytes(self.bytes)}{files} ({self.frames:,} "
                f"frames, {how} {self.sampled} of {self.videos} videos)")


def estimate_output(probes: Sequence[tuple[int, float]], items: int, *, per_file: bool,
                    block: int = 4096) -> Estimate:
    """Extrapolate probed items, each ``(frames, bytes per frame)``, to ``items`` items.

    With ``per_file`` every frame is one file rounded up to ``block`` bytes and every item
    one folder (frame folders); else the frames go into a few packed files."""
    if not probes:
        return Estimate(0, 0, 0, 0, items)
    mean_frames = sum(n for n, _ in probes) / len(probes)
    per_item = []
    for n, size in probes:
        if per_file:
            size = -(-size // block) * block
        per_item.append(n * size)
    total = sum(per_item) / len(probes) * items
    frames = int(mean_frames * items)
    if per_file:
        total += items * block  # one folder per item
    return Estimate(int(total), frames + items if per_file else 0, frames, len(probes), items)


def sample_items(items: Sequence[Item], count: int = 24, seed: int = 0) -> list[Item]:
    """A seeded sample of ``items`` to probe for an estimate: ``count``, or one in 20 of a small
    input (at least 4), so probing stays a small part of the job."""
    n = min(count, max(4, len(items) // 20), len(items))
    return random.Random(seed).sample(list(items), n)


def free_space(path: str | os.PathLike) -> tuple[int, Optional[int], Path]:
    """(free bytes, free inodes or None where the file system does not count them, the
    existing folder measured) for where ``path`` would be created."""
    p = Path(path).absolute()
    while not p.exists():
        p = p.parent
    st = os.statvfs(p)
    inodes = st.f_favail if st.f_files > 0 else None
    return st.f_bavail * st.f_frsize, inodes, p


def fits(out: str | os.PathLike, estimate: Estimate, *, margin: float = 1.05) -> bool:
    """True when ``estimate`` (its bytes times ``margin``, its files) fits where ``out`` goes."""
    free, inodes, _ = free_space(out)
    return int(estimate.bytes * margin) <= free and (inodes is None or estimate.files <= inodes)


def check_space(out: str | os.PathLike, estimate: Estimate, *, force: bool = False,
                margin: float = 1.05) -> None:
    """Refuse (UsageError, with the numbers) when ``estimate`` does not fit where ``out`` goes."""
    if fits(out, estimate, margin=margin):
        return
    free, inodes, where = free_space(out)
    have = f"{human_bytes(free)}" + (f" and {inodes:,} inodes" if inodes is not None else "")
    msg = f"{out}: the output needs {estimate.describe()}, but {where} has {have} free"
    if force:
        log.warning("%s; going on (--force)", msg)
        return
    raise UsageError(msg + "; free some space or pass --force")


def encoded_bound(pixels: int, channels: int) -> int:
    """Bytes one encoded frame of ``pixels`` x ``channels`` never exceeds: twice the raw
    pixels plus 4 kB. JPEG (OpenCV's 4:2:0, any quality) stays below 0.7x the raw pixels even on
    uniform noise (0.67x at q100), PNG (level 3) at 1.01x plus a filter byte per row; the 4 kB
    cover the headers (JPEG's tables are ~620 B: an 8x8 frame takes ~860 B)."""
    return 2 * pixels * channels + 4096


def disk_used(path: str | os.PathLike) -> int:
    """Bytes allocated on disk below ``path`` (st_blocks), walking with ``os.scandir``."""
    path = Path(path)
    if path.is_file():
        return path.stat().st_blocks * 512
    total, stack = 0, [str(path)]
    while stack:
        with os.scandir(stack.pop()) as it:
            for e in it:
                if e.is_dir(follow_symlinks=False):
                    stack.append(e.path)
                    total += e.stat(follow_symlinks=False).st_blocks * 512
                else:
                    total += e.stat(follow_symlinks=False).st_blocks * 512
    return total

"""mmaction2 rawframes list files: ``frame_dir [offset] total_frames [label ...]`` lines, parsed as
mmaction2's ``RawframeDataset.load_data_list`` parses them."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from packer.errors import CorruptData, UsageError

__all__ = ["RawframeInfo", "parse_rawframes"]


@dataclass(frozen=True)
class RawframeInfo:
    """One line of an mmaction2 rawframes list (``label`` -1 for a label-less line; ``labels``
    holds every label of a multi-label line)."""

    frame_dir: str
    total_frames: int
    label: int
    offset: int = 0
    labels: tuple[int, ...] = ()


def parse_rawframes(list_file: str | os.PathLike, *, with_offset: bool = False) -> list[RawframeInfo]:
    """Parse an mmaction2 rawframes list as ``RawframeDataset.load_data_list`` does: each line
    split on whitespace into ``frame_dir [offset] total_frames [label ...]`` (blank lines
    skipped; no label reads as -1, several as a multi-label line)."""
    list_file = Path(list_file)
    try:
        lines = list_file.read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise UsageError(f"{list_file}: cannot read list file ({e.strerror or e})") from None
    infos = []
    for lineno, line in enumerate(lines, 1):
        parts = line.strip().split()
        if not parts:
            continue
        want = 3 if with_offset else 2
        where = f"{list_file}:{lineno}"
        if len(parts) < want:
            raise CorruptData(where, f"expected 'frame_dir {'offset ' if with_offset else ''}"
                                     f"total_frames [label ...]', got {line.strip()!r}")
        try:
            numbers = [int(p) for p in parts[1:]]
        except ValueError:
            raise CorruptData(where, f"non-integer field in {line.strip()!r}") from None
        offset = numbers.pop(0) if with_offset else 0
        total, labels = numbers[0], tuple(numbers[1:]) or (-1,)
        if total < 1:
            raise CorruptData(where, f"{parts[0]} has {total} frames")
        infos.append(RawframeInfo(parts[0], total, labels[0], offset, labels))
    return infos

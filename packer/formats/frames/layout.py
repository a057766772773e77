"""Frames format: names and the list file (shared by the writer and the reader)."""
from __future__ import annotations

from typing import Any

from packer.errors import UsageError

__all__ = ["LIST_NAME", "DEFAULT_TEMPLATE", "VIDEOS_JOURNAL", "check_template", "rawframes_lines"]

LIST_NAME = "rawframes.txt"
DEFAULT_TEMPLATE = "img_{:05d}.jpg"
VIDEOS_JOURNAL = ".videos.journal"
_EXT_FMT = {"jpg": "jpeg", "jpeg": "jpeg", "png": "png"}


def check_template(tmpl: str) -> str:
    """Validate a frame file name template (``img_{:05d}.jpg``); return its image format."""
    try:
        a, b = tmpl.format(1), tmpl.format(2)
    except (IndexError, KeyError, ValueError) as e:
        raise UsageError(f"--tmpl {tmpl!r} is not a format string with one number field ({e})") from None
    if a == b or "/" in a or "\\" in a or a.startswith("."):
        raise UsageError(f"--tmpl {tmpl!r} must put the frame number in a plain file name")
    ext = a.rsplit(".", 1)[-1].lower() if "." in a else ""
    if ext not in _EXT_FMT:
        raise UsageError(f"--tmpl {tmpl!r} must end in .jpg or .png")
    return _EXT_FMT[ext]


def rawframes_lines(videos: list[dict[str, Any]]) -> str:
    """The mmaction2 rawframes list: ``{frame_dir} {total_frames} {label}`` per video."""
    return "".join(f"{v['frame_dir']} {v['length']} {v['label']}\n" for v in videos)

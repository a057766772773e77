"""Frames format: names and the list file (shared by the writer and the reader)."""
from __future__ import annotations

from typing import Any

from packer.errors import UsageError

__all__ = ["LIST_NAME", "FLOW_LIST_NAME", "DEFAULT_TEMPLATE", "VIDEOS_JOURNAL", "check_template",
           "rawframes_lines", "video_streams", "list_files", "EXT_FMT"]

LIST_NAME = "rawframes.txt"
FLOW_LIST_NAME = "rawframes_flow.txt"
DEFAULT_TEMPLATE = "img_{:05d}.jpg"
VIDEOS_JOURNAL = ".videos.journal"
EXT_FMT = _EXT_FMT = {"jpg": "jpeg", "jpeg": "jpeg", "png": "png"}


def check_template(tmpl: str) -> str:
    """Validate a frame file name template (``img_{:05d}.jpg``); return its image format."""
    try:
        a, b = tmpl.format(1), tmpl.format(2)
    except (IndexError, KeyError, ValueError) as e:
        raise UsageError(f"--tmpl {tmpl!r} is not a format string with one number field ({e})") from e
    if a == b or "/" in a or "\\" in a or a.startswith("."):
        raise UsageError(f"--tmpl {tmpl!r} must put the frame number in a plain file name")
    ext = a.rsplit(".", 1)[-1].lower() if "." in a else ""
    if ext not in _EXT_FMT:
        raise UsageError(f"--tmpl {tmpl!r} must end in .jpg or .png")
    return _EXT_FMT[ext]


def video_streams(v: dict[str, Any]) -> tuple[int, int]:
    """(RGB frames, flow frames) of a manifest video entry. Its samples are the RGB frames,
    then ``x``, ``y`` of each flow frame; entries without ``flow_frames`` hold RGB only."""
    return int(v.get("rgb_frames", v["length"])), int(v.get("flow_frames", 0))


def rawframes_lines(videos: list[dict[str, Any]], modality: str = "RGB") -> str:
    """The mmaction2 rawframes list: ``{frame_dir} {total_frames} {label}`` per video (the
    flow frame count for ``modality="Flow"``; every label of a multi-label video)."""
    col = 0 if modality == "RGB" else 1
    return "".join(f"{v['frame_dir']} {video_streams(v)[col]} "
                   f"{' '.join(str(x) for x in v.get('labels') or [v['label']])}\n" for v in videos)


def list_files(videos: list[dict[str, Any]], flow: bool) -> dict[str, str]:
    """The list files of a frames output: ``rawframes.txt`` unless it holds flow only, and
    ``rawframes_flow.txt`` when it holds flow."""
    out = {}
    if not flow or not videos or any(video_streams(v)[0] for v in videos):
        out[LIST_NAME] = rawframes_lines(videos)
    if flow:
        out[FLOW_LIST_NAME] = rawframes_lines(videos, modality="Flow")
    return out

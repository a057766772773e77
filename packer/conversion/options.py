"""Option objects shared by the conversion commands: one small frozen dataclass per concern.

The library call (``packer.pack``, ``packer.decode_frames``, ...) builds them once from its
keywords, which validates them, and hands them down: a command takes the objects it uses
(``pack_images(src, out, input_options=..., run_options=...)``), ``conversion.runner.run`` its
``RunOptions``.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

from packer.errors import UsageError

__all__ = ["InputOptions", "RunOptions", "VIDEO_RUN", "DEFAULT_IMAGE_EXTS", "DEFAULT_VIDEO_EXTS", "EXECUTORS",
           "SOURCE_FORMATS"]

# Option defaults and choices, here so that the CLI and packer.api show them without importing
# the engine (``packer --help`` stays fast).
DEFAULT_IMAGE_EXTS = ("jpg", "jpeg", "png", "webp", "bmp")
DEFAULT_VIDEO_EXTS = ("mp4", "avi", "mkv", "mov", "webm", "m4v", "mpg", "mpeg", "flv", "wmv", "3gp", "ogv")
EXECUTORS = ("local", "ray")  # the names make_executor and --executor take
# what a pack's SRC may be (packer.conversion.sources.detect_source)
SOURCE_FORMATS = ("folder", "wds", "hf", "parquet")


@dataclasses.dataclass(frozen=True)
class InputOptions:
    """Which inputs, in which order, and which part of them.

    Args:
        list_path: a list file (``relative/path label`` lines) instead of walking ``src``.
        csv_path: a Kinetics CSV over the videos in ``src`` (videos only).
        class_index: the classes by label: a class index file (``1 ApplyEyeMakeup`` lines), a
            label map, a Kinetics training CSV or a built-in map's name (``ucf101``, ...); for
            image packs, class-folder trees only.
        exts: comma-separated extensions to take (default: the command's).
        num_shards: split the inputs into this many contiguous parts ...
        shard_index: ... and convert this one (``packer merge`` joins them).
    """

    list_path: Optional[str] = None
    csv_path: Optional[str] = None
    class_index: Optional[str] = None
    exts: Optional[str] = None
    num_shards: int = 1
    shard_index: int = 0


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """How a conversion runs: where the work goes, what failures cost, what an existing output means.

    Args:
        workers: worker processes (None: all cores; 0: in this process).
        executor: ``local`` or ``ray`` (``ray:ADDRESS`` joins a cluster).
        max_failures: failed inputs tolerated before the command exits 1.
        resume: continue a partial output (or check a finished one).
        overwrite: replace an existing output when done.
        strict: partial decodes count toward ``max_failures``.
        timeout: seconds one item may take in its worker (None or 0: no limit).
        commit_every: samples per durable commit (what a resume after a kill redoes at most;
            None: the format's default).
        force: start even when the disk space estimate says the output will not fit.
        break_lock: take the claim on the output even from a run that may be alive
            (``--break-lock``; see ``packer.claim``).
        append: add the inputs not in the existing output as its next version (docs/append.md;
            an interrupted append is continued); a missing output is packed as by a plain run.
        prune: with ``append``: the next version leaves out the stored samples whose inputs are
            gone or changed (a changed input is packed anew).
    """

    workers: Optional[int] = None
    executor: str = "local"
    max_failures: int = 0
    resume: bool = False
    overwrite: bool = False
    strict: bool = False
    timeout: Optional[float] = None
    commit_every: Optional[int] = None
    force: bool = False
    break_lock: bool = False
    append: bool = False
    prune: bool = False

    def __post_init__(self) -> None:
        if self.max_failures < 0:
            raise UsageError("--max-failures must be >= 0")
        if self.resume and self.overwrite:
            raise UsageError("--resume and --overwrite exclude each other")
        if self.append and self.overwrite:
            raise UsageError("--append and --overwrite exclude each other")
        if self.prune and not self.append:
            raise UsageError("--prune goes with --append")
        if self.commit_every is not None and self.commit_every < 1:
            raise UsageError("--commit-every must be >= 1")
        if self.timeout is not None and self.timeout <= 0:  # 0: no limit, as every command says
            object.__setattr__(self, "timeout", None)


# The video commands' run: each video in a worker with a 600 s limit unless told otherwise.
VIDEO_RUN = RunOptions(timeout=600.0)

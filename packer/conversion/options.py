"""Option objects shared by the conversion commands: one small frozen dataclass per concern.

The CLI builds them from its flags and the library functions take them, so a command's
signature stays short however many flags it has. Each library call also accepts the fields as
keywords (``pack_images(src, out, workers=2)``) for scripts and tests: ``split_options`` routes
each keyword to the dataclass that declares it and refuses names none declares.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

from packer.errors import UsageError

__all__ = ["InputOptions", "RunOptions", "split_options", "DEFAULT_IMAGE_EXTS", "DEFAULT_VIDEO_EXTS", "EXECUTORS"]

# Option defaults and choices, here so that the CLI and packer.api show them without importing
# the engine (``packer --help`` stays fast).
DEFAULT_IMAGE_EXTS = ("jpg", "jpeg", "png", "webp", "bmp")
DEFAULT_VIDEO_EXTS = ("mp4", "avi", "mkv", "mov", "webm", "m4v", "mpg", "mpeg", "flv", "wmv", "3gp", "ogv")
EXECUTORS = ("local", "ray")  # the names make_executor and --executor take


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

    def __post_init__(self) -> None:
        if self.max_failures < 0:
            raise UsageError("--max-failures must be >= 0")
        if self.resume and self.overwrite:
            raise UsageError("--resume and --overwrite exclude each other")
        if self.commit_every is not None and self.commit_every < 1:
            raise UsageError("--commit-every must be >= 1")
        if self.timeout is not None and self.timeout <= 0:  # 0: no limit, as every command says
            object.__setattr__(self, "timeout", None)


def split_options(given: dict[str, Any], *classes: type) -> list[Any]:
    """One instance of each dataclass in ``classes`` from the keywords in ``given``.

    A value that already is an instance of one of the classes (keyed by any name) is used as
    that class's base, and the loose keywords for it are applied on top. A keyword that no
    class declares is a ``TypeError``, as for any function.
    """
    given = dict(given)
    bases: dict[type, Any] = {}
    for name, value in list(given.items()):
        if isinstance(value, classes):
            bases[type(value)] = given.pop(name)
    fields = {cls: {f.name for f in dataclasses.fields(cls)} for cls in classes}
    unknown = set(given) - set().union(*fields.values())
    if unknown:
        raise TypeError(f"unexpected option(s): {', '.join(sorted(unknown))}")
    out = []
    for cls in classes:
        mine = {k: v for k, v in given.items() if k in fields[cls]}
        base = bases.get(cls)
        out.append(dataclasses.replace(base, **mine) if base is not None else cls(**mine))
    return out

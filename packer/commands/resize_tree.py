"""``packer resize``: mirror an image tree through ``resize_image``, incrementally.

Why this is not a ``convert.run`` conversion: ``run`` exists to funnel samples, in input order,
into ONE output through a Writer, and to resume that output exactly. A mirror has no single
output to order or resume: every image is its own file, made atomic by a temporary name and a
rename. So the worker that resizes an image also writes it (the bytes never travel back to
the parent), and "resume" is the incremental rule: an output made with the same options from
the source file whose identity was recorded then (``source_identity``) is up to date.
``resize_tree`` reuses what does apply unchanged: the executors (same process pool, same
exception -> failed ``Outcome`` policy), ``convert.Report`` for the summary and exit status,
``formats.sidecars.write_failures`` for ``failures.jsonl``, ``inputs.read_item_bytes``,
``sources`` for walking, and ``resize`` for the image itself.
"""
from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from tqdm import tqdm

from packer.conversion.runner import Report
from packer.errors import CorruptSample, UsageError, WriteError
from packer.conversion.executors import make_executor
from packer.formats.sidecars import write_failures
from packer.manifest import FAILURES_NAME, atomic_write_bytes
from packer.conversion.inputs import read_item_bytes
from packer.codecs.resize import FORMAT_EXT, ResizeSpec, resize_image
from packer.conversion.inputs import InputFailure, Item, list_file, parse_exts, image_tree

__all__ = ["STATE_NAME", "MirrorReport", "MirrorTask", "ResizeFileJob", "resize_tree", "output_path"]

log = logging.getLogger(__name__)

STATE_NAME = ".packer-resize.json"  # the last run's options and sources (hidden: walkers skip it)


@dataclass
class MirrorReport(Report):
    """What a ``packer resize`` run did."""

    resized: int = 0
    kept: int = 0
    skipped: int = 0

    def summary(self) -> str:
        """One line for the terminal."""
        return (f"{self.out}: {self.items} images: {self.resized} resized, {self.kept} kept as they were, "
                f"{self.skipped} up to date, {self.failed} failed "
                f"({self.bytes / 1e6:.1f} MB written in {self.elapsed:.1f}s)")


@dataclass(frozen=True)
class MirrorTask:
    """One image to resize into ``dest``."""

    item: Item
    dest: str


@dataclass(frozen=True)
class ResizeFileJob:
    """Read, resize and atomically write one image (picklable; runs in worker processes).

    Returns ``(status, bytes written, the source's identity)`` with status ``resized`` or
    ``kept``; the identity (``source_identity``) is taken before the read, so a source replaced
    while it is read is seen as changed on the next run. A source that fails also removes an
    existing output of it, which no longer mirrors the source.
    """

    spec: ResizeSpec

    def __call__(self, task: MirrorTask) -> tuple[str, int, list[int] | None]:
        item, dest = task.item, Path(task.dest)
        try:
            identity = source_identity(item.path)
            result = resize_image(read_item_bytes(item), self.spec, key=item.key, source=item.path)
        except CorruptSample:
            if dest.exists():
                dest.unlink()
            raise
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(dest, result.data)
        except OSError as e:
            raise CorruptSample(item.key, item.path, f"cannot write {dest} ({e.strerror or e})",
                                stage="write") from e
        return ("kept" if result.kept else "resized"), len(result.data), identity


def source_identity(path: str) -> list[int] | None:
    """What identifies a source's content without reading it: ``[size, mtime_ns, ctime_ns]``
    (None when it cannot be stat'ed). Any difference from the recorded one means changed,
    whichever way the times moved: a source replaced by an OLDER file (``cp -p``) has another
    mtime, and a rewrite in place that restores the mtime still has a new ctime (which the
    kernel sets on every change and nobody can set back)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _remove_stale_temporaries(out: Path, todo: list[MirrorTask]) -> None:
    """Temporary files of outputs a killed run was writing (``.{name}.tmp-{pid}``)."""
    for d in {Path(t.dest).parent for t in todo} | {out}:
        for stale in d.glob(".*.tmp-*") if d.is_dir() else ():
            stale.unlink(missing_ok=True)


def output_path(out: Path, key: str, spec: ResizeSpec) -> Path:
    """Where the output of ``key`` goes: the same relative path, with the new format's extension."""
    if spec.format == "keep":
        return out / key
    stem = key.rsplit(".", 1)[0] if "." in key.rsplit("/", 1)[-1] else key
    return out / f"{stem}.{FORMAT_EXT[spec.format]}"


def _up_to_date(source: str, dest: Path, recorded: Any) -> bool:
    """The output exists and its source is the very file it was made from (the identity the
    run that made it recorded); by identity, not by age: an older replacement is a change too."""
    if recorded is None or not dest.exists():
        return False
    return source_identity(source) == recorded


def _check_paths(src: Path, out: Path) -> None:
    if not src.is_dir():
        raise UsageError(f"{src}: input folder does not exist")
    if out.exists() and not out.is_dir():
        raise UsageError(f"{out}: exists and is not a folder")


def _tasks(items: Sequence[Item], out: Path, spec: ResizeSpec) -> list[MirrorTask]:
    seen: dict[Path, str] = {}
    tasks = []
    for it in items:
        dest = output_path(out, it.key, spec)
        if dest in seen:
            raise UsageError(f"{it.path}: its output {dest} is also the output of {seen[dest]!r}; "
                             "rename one or keep --format keep")
        seen[dest] = it.key
        tasks.append(MirrorTask(it, str(dest)))
    return tasks


def _changed(path: Path, failures: list[dict[str, Any]]) -> bool:
    """False when ``path`` already lists exactly ``failures`` (a rerun then rewrites nothing)."""
    try:
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()] != failures
    except (OSError, ValueError):
        return True


def _load_state(out: Path) -> dict[str, Any] | None:
    try:
        return json.loads((out / STATE_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def resize_tree(src: str | os.PathLike, out: str | os.PathLike, spec: ResizeSpec, *,
                list_path: str | os.PathLike | None = None, exts: str | Sequence[str] | None = None,
                workers: int | None = None, executor: str = "local", max_failures: int = 0) -> MirrorReport:
    """Mirror the images under ``src`` (any tree, or the ``list_path`` entries) into ``out``, resized.

    Incremental: an output made with the same options from the very source file there now (its
    size, mtime and ctime as recorded in ``{out}/.packer-resize.json``, compared for equality,
    never by age) is left alone, so a rerun does no work and changes no byte. Each output is
    written under a temporary name and renamed; unreadable inputs are listed in
    ``{out}/failures.jsonl`` (rewritten each run). ``packer.api.resize`` holds the claim on
    ``out`` meanwhile (one left by a dead run is taken over: the mirror is incremental).
    """
    src, out = Path(src), Path(out)
    if max_failures < 0:
        raise UsageError("--max-failures must be >= 0")
    _check_paths(src, out)
    exts = parse_exts(exts)
    bad: list[InputFailure] = []  # list lines that cannot be inputs: recorded, never dropped
    items = (list_file(list_path, src, exts, failures=bad)[0] if list_path is not None
             else image_tree(src, exts, failures=bad))
    if not items:
        raise UsageError(f"{src}: no input images found (extensions: {', '.join(exts)})")
    tasks = _tasks(items, out, spec)
    start = time.monotonic()
    state: dict[str, Any] = {"options": spec.to_dict()}
    previous = _load_state(out)
    # each output's source identity, as recorded by the run that made it (an older packer's
    # state has none: everything is made again once)
    made: dict[str, Any] = {}
    if previous is not None and previous.get("options") != state["options"]:
        log.info("%s: options changed since the last run; redoing every image", out)
        todo = tasks
    else:
        recorded = (previous or {}).get("sources")
        recorded = recorded if isinstance(recorded, dict) else {}
        todo = []
        for t in tasks:
            if _up_to_date(t.item.path, Path(t.dest), recorded.get(t.item.key)):
                made[t.item.key] = recorded[t.item.key]
            else:
                todo.append(t)
    report = MirrorReport(str(out), items=len(tasks) + len(bad), skipped=len(tasks) - len(todo),
                          failures=[f.record() for f in bad])
    out.mkdir(parents=True, exist_ok=True)
    _remove_stale_temporaries(out, todo)
    if todo:
        with make_executor(executor, workers=min(workers if workers is not None else os.cpu_count() or 1,
                                                 len(todo))) as ex, \
                tqdm(total=len(todo), unit="img", desc="resize", dynamic_ncols=True, disable=None) as bar:
            for task, outcome in zip(todo, ex.map(ResizeFileJob(spec), todo)):
                if outcome.ok:
                    status, nbytes, identity = outcome.value
                    setattr(report, status, getattr(report, status) + 1)
                    report.bytes += nbytes
                    if identity is not None:
                        made[task.item.key] = identity
                elif outcome.stage == "write":  # disk full, read-only: stop, don't fail every image
                    raise WriteError(outcome.reason)
                else:
                    report.failures.append({"key": task.item.key, "source": task.item.path,
                                            "stage": outcome.stage, "reason": outcome.reason})
                    log.warning("%s: %s", task.item.path, outcome.reason)
                bar.update(1)
    state["sources"] = {key: made[key] for key in sorted(made)}
    target = out / FAILURES_NAME
    try:  # disk full, a file size limit, read-only: one line naming the file
        if _changed(target, report.failures):
            write_failures(target, report.failures)
        target = out / STATE_NAME
        if previous != state:
            atomic_write_bytes(target, json.dumps(state, sort_keys=True).encode())
    except OSError as e:
        raise WriteError(f"{target}: cannot write ({e.strerror or e})") from None
    report.count = report.items - report.failed
    report.elapsed = time.monotonic() - start
    return report

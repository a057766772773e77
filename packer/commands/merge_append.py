"""``packer merge PART... OUT --append``: add the parts of a split append to ``OUT`` as its next version.

A split append (``to-lmdb SRC PART_i --append-to OUT --num-shards N --shard-index i``, docs/append.md)
plans the append to ``OUT`` in every job alike (the inputs ``OUT`` lacks by the resume identity,
the new classes labelled after its own), and packs the ``i``-th block of the new inputs into the
part ``PART_i``, which records the version of ``OUT`` it was planned against
(``created_by.options.append_to``: that version's number, ``identity()`` and stored positions).
Merging them with ``append`` checks the parts as a plain merge does (every part ``0..N-1`` once,
the same options and listing), then that every part was planned against the version ``OUT``
holds now (naming both when not), and adds their samples through the format's append path
(``Writer.append_to``): records in new shards, LMDB under the keys after the last, HDF5 in a new
part file; the version is published atomically, as by ``--append``, and reads like one.

A merge is not resumable: a killed one is run again (its partial is started over; the published
version is untouched until the new one's manifest replaces it). A rerun that finds the version
already published from these parts says so and removes what the killed run left.
"""
from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any, Sequence

from tqdm import tqdm

from packer.claim import Claim
from packer.commands.merge import (MergeReport, combined_videos, open_parts, part_paths, read_failures,
                                   remove_partial, run_options, writer_of)
from packer.conversion.append import open_base
from packer.errors import OutputClaimed, UsageError
from packer.formats import Reader
from packer.formats.versions import AppendBase, next_video_index
from packer.manifest import created_by
from packer.remote.url import is_url

__all__ = ["append_parts"]

log = logging.getLogger(__name__)


def _planned(readers: Sequence[Reader]) -> dict[str, Any]:
    """The version of the output every part was planned against (the same for all), else UsageError."""
    first = None
    for r in readers:
        base = (r.manifest.created_by.get("options") or {}).get("append_to")
        if not isinstance(base, dict):
            raise UsageError(f"{r.path}: is not a part of a split append (made without --append-to); "
                             "merge --append adds the parts of one to the output they were planned against")
        if first is None:
            first = (r, base)
        elif base != first[1]:
            raise UsageError(f"{r.path}: was planned against {_shown(base)}, {first[0].path} against "
                             f"{_shown(first[1])}; the parts of one split append share it")
    return first[1]


def _shown(base: dict[str, Any]) -> str:
    return f"version {base.get('version')} of {base.get('path')} (identity {base.get('identity')})"


def _identity(reader: Reader) -> dict[str, Any]:
    m = reader.manifest
    return {"version": m.version, "identity": m.identity(), "stored": m.physical}


def _done_before(reader: Reader, planned: dict[str, Any], merged_from: list[str]) -> bool:
    """Whether ``reader``'s version is the one these parts published (a rerun after its publish)."""
    m = reader.manifest
    return (m.parent == planned["version"] and m.created_by.get("merged_from") == merged_from
            and any(h.get("version") == planned["version"] and h.get("identity") == planned["identity"]
                    for h in m.history))


def _check_base(out: Path, reader: Reader, parts: Sequence[Reader], planned: dict[str, Any]) -> None:
    """The output can take the parts: the version they were planned against, format, kind, classes."""
    now = _identity(reader)
    if now != {k: planned.get(k) for k in now}:
        raise UsageError(f"{out}: holds version {now['version']} (identity {now['identity']}), but the parts "
                         f"were planned against {_shown(planned)}; pack the parts again against it "
                         "(rerun their commands with --overwrite)")
    first, m = parts[0], reader.manifest
    for what, a, b in (("format", m.format, first.manifest.format), ("kind", m.kind, first.manifest.kind)):
        if a != b:
            raise UsageError(f"{first.path}: {what} {b!r} differs from {out}'s {a!r}")
    if (m.schema or None) != (first.manifest.schema or None):
        raise UsageError(f"{first.path}: its fields differ from {out}'s; the parts of a split append hold its fields")
    if list(first.classes[:len(m.classes)]) != list(m.classes):
        raise UsageError(f"{first.path}: its classes do not begin with {out}'s (an existing label never changes)")


def append_parts(parts: Sequence[str | os.PathLike], out: str | os.PathLike, *, overwrite: bool = False,
                 any_parts: bool = False, claim: Claim | None = None) -> MergeReport:
    """Add the parts of a split append (any order) to ``out`` as its next version.

    Args:
        parts: the parts, each made with ``append_to=out`` (``packer.pack``) or ``--append-to``.
        out: the output they were planned against (local).
        overwrite, any_parts: refused (an append keeps the output; the parts are one run's).
        claim: the run's claim on ``out`` (``packer.api.merge`` takes it), which guards the publish.
    Returns:
        a MergeReport with the ``version`` published.
    Raises:
        UsageError: the parts do not belong together or were planned against another version.
    """
    start = time.monotonic()
    if overwrite or any_parts:
        raise UsageError("merge --append adds the parts of one split append to their output: not with "
                         "--overwrite or --any-parts")
    if is_url(out):
        raise UsageError(f"{out}: merge --append adds to a local output (append to a local copy, then upload it)")
    out = Path(out)
    paths = part_paths(parts, out)
    if not out.exists():
        raise UsageError(f"{out}: does not exist; merge --append adds the parts to the output they were planned against")
    readers = open_parts(paths, any_parts=False)
    try:
        planned = _planned(readers)
        reader, text = open_base(out)
        merged_from = [os.path.realpath(r.path) for r in readers]
        writer_cls = writer_of(readers[0])
        if _done_before(reader, planned, merged_from):
            remove_partial(writer_cls, out)  # what a run killed after its publish left
            log.info("%s: version %d was published from these parts already", out, reader.manifest.version)
            report = _report(out, readers, reader.manifest, 0, start)
            report.note = "published from these parts already; nothing to do"
            return report
        _check_base(out, reader, readers, planned)
        if not any(len(r) for r in readers):  # the output held every input: no new version, as --append
            report = _report(out, readers, reader.manifest, 0, start)
            report.note = "the parts hold no sample; nothing to append"
            return report
        return _append(out, readers, reader, text, merged_from, claim, start)
    finally:
        for r in readers:
            r.close()


def _append(out: Path, parts: Sequence[Reader], reader: Reader, text: str, merged_from: list[str],
            claim: Claim | None, start: float) -> MergeReport:
    """Write the parts' samples through the format's append path and publish the version."""
    import numpy as np

    writer_cls = writer_of(parts[0])
    options = run_options(parts[0])
    settings = {k: v for k, v in (options.get("writer") or {}).items() if k not in ("commit_every", "commit_bytes")}
    made_by = created_by(options)
    made_by["merged_from"] = merged_from
    writer = writer_cls(out, classes=parts[0].classes, kind=parts[0].manifest.kind, created_by=made_by,
                        **{**settings, **writer_cls.merge_options(parts)})
    if writer.resume_state_path().exists():  # an interrupted --append's (or rewrite's) work: never ours to drop
        raise UsageError(f"{out}: an interrupted run's {writer.resume_state_path().parent.name} is beside it; "
                         "finish that run (rerun it with --append or --resume), then merge")
    writer.schema = getattr(parts[0], "schema", None)  # a field pack's parts: its fields, as merge_parts
    if writer.schema is not None:
        writer.manifest_extra = dict(parts[0].manifest.extra)
    writer.append_to = AppendBase(reader, text)
    if claim is not None:
        writer.guard = claim.partial(writer.workdir, writer.journal_dir)
    tables = [r.sources() for r in parts]
    if all(t is not None for t in tables):
        writer.sources = np.concatenate([t[r.positions()] for t, r in zip(tables, parts)])
    failures = [f for r in parts for f in read_failures(r)]
    total = sum(len(r) for r in parts)
    log.info("appending %d parts (%d samples) to %s", len(parts), total, out)
    try:
        writer.open()
        videos_before = next_video_index(reader.manifest.videos)  # a sample's video_index, as --append numbers it
        with tqdm(total=total, unit="sample", desc="merge --append", dynamic_ncols=True, disable=None) as bar:
            for r in parts:
                for i in range(len(r)):
                    sample = r.sample(i)
                    if "video_index" in sample.extra:
                        sample.extra["video_index"] += videos_before
                    writer.add(sample)
                    bar.update(1)
                videos_before += len(r.manifest.videos)
        version = writer.close(failures=failures, videos=combined_videos(parts))
    except OutputClaimed:
        writer.abort()
        raise  # the partial is not (or no longer) this run's to remove
    except BaseException:
        writer.abort()
        remove_partial(writer_cls, out)
        raise
    return _report(out, parts, version, total, start)


def _report(out: Path, parts: Sequence[Reader], version: Any, added: int, start: float) -> MergeReport:
    return MergeReport(str(out), parts=len(parts), count=version.count, failures=version.failures,
                       videos=len(version.videos), elapsed=time.monotonic() - start, version=version.version,
                       added=added)

"""``packer export PACK OUT --to wds|parquet``: a pack as WebDataset tar shards or Parquet files.

Every sample is read through the pack's checked reader (each stored value's CRC32C, the keys
and labels against the manifest), in stored order, and written as it is: encoded image bytes
are copied, never re-encoded; keys, labels and field values keep their order and values. A
pack of raw pixels (HDF5 ``--raw``) has no encoded bytes to copy: its images are encoded
losslessly as PNG (the pixels are the pack's; ``export.json`` says so). A sample the reader
finds damaged is never exported: it is a failure recorded in ``failures.jsonl`` with its
position and key, and the run fails (``TooManyFailures``, exit 1) when there are more than
``max_failures``, after publishing, as a conversion does.

The folder OUT is built at ``OUT.partial`` and renamed when complete, under the run's claim
(``packer.claim``: the guard's run token in the partial, checked before the rename). Shards
are written under hidden temporary names, fsynced and renamed to ``shard-000000.tar`` (or
``.parquet``), each then journaled with its sample range, size and sha256 in
``.export-journal.jsonl``; ``--resume`` keeps the journaled shards whose bytes still match
and goes on from the next sample (a resume of another pack or with other options is refused),
and, the shards being written the same way every time, a resumed export is byte-identical to
an uninterrupted one. The finished folder holds ``export.json`` (the source pack's identity,
the shards with their sizes and sha256, the counts, the options; under a CRC32C ``checksum``
like a pack's manifest) and ``failures.jsonl``.

Why not ``conversion.runner.run``: it funnels input files through a pack ``Writer`` (keys and
CRC journals, ``packer.json``) and fingerprints the input files; an export writes no packed
format and reads one pack, whose manifest identity is its whole fingerprint. The loop here is
sequential: it copies bytes, and one process reads LMDB and writes tar at disk speed
(``python -m scripts.bench.export``).
"""
from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

from tqdm import tqdm

from packer.claim import Claim
from packer.codecs.fields import BLOB_FMT
from packer.commands.export_shards import (SHARD_WRITERS, Column, ExportFailure, MalformedField, ShardWriter,
                                           columns_of, image_columns, int64_bytes, tar_key)
from packer.conversion.runner import Report, check_output_arg
from packer.errors import CorruptData, ResumeRefused, UsageError, WriteError
from packer.fileio import file_sha256, fsync_path, parse_bytes, remove_path
from packer.formats import Reader
from packer.formats.sample import Record
from packer.formats.sidecars import fsync_append, partial_path, write_failures
from packer.manifest import FAILURES_NAME, atomic_write_bytes, created_by, manifest_checksum
from packer.remote import open_reader
from packer.remote.url import is_url, redact

__all__ = ["EXPORT_NAME", "EXPORT_VERSION", "TARGETS", "DEFAULT_SHARD_SIZE", "ExportOptions", "ExportReport",
           "export_pack", "load_export", "source_identity"]

log = logging.getLogger(__name__)

EXPORT_NAME = "export.json"
EXPORT_VERSION = 1
TARGETS = tuple(SHARD_WRITERS)
DEFAULT_SHARD_SIZE = "256MB"
_STATE = ".export-state.json"  # the run's source identity and options (hidden: never published)
_JOURNAL = ".export-journal.jsonl"  # one line per finished shard
_READ_BATCH = 256  # samples per read_many (one LMDB transaction)


@dataclass(frozen=True)
class ExportOptions:
    """What an export writes (checked here, once, before any work).

    Args:
        to: ``wds`` (WebDataset tar shards) or ``parquet``.
        shard_size: start a new shard before a sample would take it past this many bytes
            (``"256MB"``, ``"1GiB"``, an int). None: 256MB unless ``samples_per_shard`` is given.
        samples_per_shard: at most this many samples per shard (with ``shard_size``: whichever
            comes first).
    """

    to: str
    shard_size: Optional[int | str] = None
    samples_per_shard: Optional[int] = None

    def __post_init__(self) -> None:
        if self.to not in SHARD_WRITERS:
            raise UsageError(f"to must be one of {', '.join(TARGETS)}, not {self.to!r}")
        if self.samples_per_shard is not None and self.samples_per_shard < 1:
            raise UsageError(f"samples_per_shard must be >= 1, not {self.samples_per_shard}")
        if self.shard_size is not None:
            parse_bytes(self.shard_size)
        SHARD_WRITERS[self.to].check_available()  # a missing extra is refused before any work

    @property
    def max_bytes(self) -> int | None:
        """The shard size in bytes (None: by sample count only)."""
        if self.shard_size is None:
            return None if self.samples_per_shard is not None else parse_bytes(DEFAULT_SHARD_SIZE)
        return parse_bytes(self.shard_size)

    def recorded(self) -> dict[str, Any]:
        """What decides the exported bytes (``export.json``'s options; a resume must match them)."""
        return {"to": self.to, "shard_bytes": self.max_bytes, "samples_per_shard": self.samples_per_shard,
                "export_version": EXPORT_VERSION}


@dataclass
class ExportReport(Report):
    """The outcome of an export: a ``Report`` (``count`` samples exported of ``items`` in the
    pack, ``failures``, ``bytes``) with the format and the shards written."""

    to: str = ""
    shards: int = 0

    def summary(self) -> str:
        """One line for the terminal."""
        if self.status == "complete":
            return f"{self.out}: complete and verified ({self.count} samples, {self.note}); nothing to do"
        rate = self.count / self.elapsed if self.elapsed > 0 else 0.0
        return (f"{self.out}: {self.count} of {self.items} samples exported to {self.shards} {self.to} shards, "
                f"{self.failed} failed, {self.bytes / 1e6:.1f} MB in {self.elapsed:.1f}s ({rate:.0f} samples/s)")


def source_identity(pack: str | os.PathLike, reader: Reader) -> dict[str, Any]:
    """Which pack an export came from: its path, format, count, and its manifest's ``identity()``
    (every field but ``created_by``) and ``checksum`` (every field), and its ``created_by``."""
    m = reader.manifest
    text = json.loads(m.to_json())
    return {"path": redact(str(pack)) if is_url(pack) else str(pack), "format": m.format, "count": len(reader),
            "identity": m.identity(), "checksum": text["checksum"], "created_by": m.created_by}


def load_export(out: str | os.PathLike) -> dict[str, Any]:
    """An export folder's ``export.json``, its checksum checked (CorruptData naming it otherwise)."""
    path = Path(out) / EXPORT_NAME
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"{out}: no {EXPORT_NAME} (not a packer export)") from None
    except (OSError, ValueError) as e:
        raise CorruptData(str(path), f"unreadable ({e})") from e
    if not isinstance(record, dict) or record.get("checksum") != manifest_checksum(record):
        raise CorruptData(str(path), "checksum mismatch: the export's record was changed or damaged")
    return record


def _columns(reader: Reader) -> tuple[list[Column], bool]:
    """The pack's columns and whether it is an image-and-label pack (plain WebDataset names)."""
    m = reader.manifest
    if m.holds != "images":
        raise UsageError(f"{reader.path}: holds {m.holds} (a {'decode-frames' if m.holds == 'frames' else 'pack-videos'} "
                         "output); export takes image packs and field packs")
    if reader.schema is not None:
        return columns_of(reader.schema, reader.classes), False
    return image_columns(reader.classes), True


def _png(rec: Record) -> bytes:
    """Raw HxWxC pixels encoded losslessly as PNG."""
    import io

    import numpy as np
    from PIL import Image

    if rec.channels not in (1, 3, 4) or len(rec.data) != rec.height * rec.width * rec.channels:
        raise MalformedField(f"{len(rec.data)} raw bytes do not make {rec.height}x{rec.width}x{rec.channels}")
    arr = np.frombuffer(rec.data, dtype=np.uint8).reshape(rec.height, rec.width, rec.channels)
    buf = io.BytesIO()
    Image.fromarray(arr[:, :, 0] if rec.channels == 1 else arr).save(buf, format="PNG")
    return buf.getvalue()


def _values(reader: Reader, rec: Record, plain: bool, position: int, key: str) -> list[bytes | memoryview]:
    """A record's column bytes (the field blob split, or the image and its label); CorruptData
    naming the sample when a field pack's record is no well-formed blob."""
    if not plain:
        try:
            if rec.fmt != BLOB_FMT:
                raise ValueError(f"a field pack's record is {rec.fmt!r}, not a field blob")
            return list(reader.schema.split(rec.data).values())
        except ValueError as e:
            raise CorruptData(str(reader.path), f"malformed field blob ({e})", position=f"sample {position}",
                              key=key) from e
    data = _png(rec) if rec.fmt == "raw" else rec.data
    return [data, int64_bytes(rec.label)]


def _records(reader: Reader, start: int) -> Iterator[tuple[int, Record | CorruptData]]:
    """``(position, record or the CorruptData reading it raised)`` from ``start`` on, read in
    batches (one LMDB transaction each); a damaged sample does not end the stream."""
    n = len(reader)
    i = start
    while i < n:
        stop = min(n, i + _READ_BATCH)
        try:
            for rec in reader.read_many(range(i, stop)):
                yield i, rec
                i += 1
        except CorruptData as e:
            yield i, e
            i += 1


def _repeats(keys: Sequence[str]) -> dict[int, int]:
    """``{position: earlier samples with its key}`` for the keys a pack holds more than once."""
    if len(set(keys)) == len(keys):
        return {}
    seen: dict[str, int] = {}
    out = {}
    for i, key in enumerate(keys):
        n = seen.get(key, 0)
        if n:
            out[i] = n
        seen[key] = n + 1
    return out


def _failure(pack: str, position: int, key: str | None, stage: str, reason: str) -> dict[str, Any]:
    return {"key": key, "source": pack, "position": position, "stage": stage, "reason": reason}


def _shard_name(index: int, suffix: str) -> str:
    return f"shard-{index:06d}{suffix}"


@dataclass
class _Progress:
    """The journaled shards and the failures so far; where the next sample is read."""

    shards: list[dict[str, Any]] = field(default_factory=list)
    failures: list[dict[str, Any]] = field(default_factory=list)  # before ``position``
    position: int = 0
    overwrite: bool = False
    resumed: bool = False


def _differences(recorded: dict[str, Any], source: dict[str, Any], options: dict[str, Any]) -> list[str]:
    diff = []
    was = recorded.get("source") or {}
    if was.get("identity") != source["identity"]:
        diff.append(f"source pack: identity {was.get('identity')} ({was.get('path')}) -> {source['identity']} "
                    f"({source['path']})")
    was_opts = recorded.get("options") or {}
    for k in sorted(set(was_opts) | set(options)):
        if was_opts.get(k) != options.get(k):
            diff.append(f"{k}: {was_opts.get(k)!r} -> {options.get(k)!r}")
    return diff


def _resume_progress(work: Path, source: dict[str, Any], options: dict[str, Any], out: Path) -> _Progress:
    """The journaled shards of a partial export that still match, and where to go on from;
    a partial of another pack or other options is refused (ResumeRefused), the partial untouched."""
    try:
        state = json.loads((work / _STATE).read_text())
    except FileNotFoundError:
        return _Progress()
    except (OSError, ValueError) as e:
        raise CorruptData(str(work / _STATE), f"unreadable export state ({e}); use --overwrite") from e
    diff = _differences(state, source, options)
    if diff:
        raise ResumeRefused(f"{out}: cannot resume, this export differs from the interrupted one:\n  "
                            + "\n  ".join(diff) + "\n(rerun with the first run's pack and options, or use --overwrite)")
    progress = _Progress(overwrite=bool(state.get("overwrite")), resumed=True)
    try:
        lines = (work / _JOURNAL).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        lines = []
    for line in lines:
        try:
            entry = json.loads(line)
            path = work / entry["file"]
            intact = path.stat().st_size == entry["bytes"] and file_sha256(path) == entry["sha256"]
        except (OSError, ValueError, KeyError, TypeError):
            intact = False  # a torn last line, or a shard changed since: redo from here
        if not intact:
            break
        progress.shards.append(entry)
        progress.failures.extend(entry.get("failures", []))
        progress.position = entry["stop"]
    log.info("resuming %s at sample %d (%d shards kept)", out, progress.position, len(progress.shards))
    return progress


class _Export:
    """One export run into ``work`` (see the module docstring)."""

    def __init__(self, reader: Reader, pack: str, work: Path, *, options: ExportOptions,
                 columns: list[Column], plain: bool, source: dict[str, Any], progress: _Progress,
                 claim: Claim | None, guard: Any):
        self.reader = reader
        self.pack = pack
        self.work = work
        self.options = options
        self.columns = columns
        self.plain = plain
        self.source = source
        self.progress = progress
        self.claim = claim
        self.guard = guard  # the claim's PartialGuard of ``work`` (None: unclaimed)
        self.writer_cls = SHARD_WRITERS[options.to]
        self.max_bytes = options.max_bytes
        self.shard: ShardWriter | None = None
        self.shard_start = progress.position
        self.pending_failures: list[dict[str, Any]] = []

    def _open_shard(self, start: int) -> ShardWriter:
        index = len(self.progress.shards)
        tmp = self.work / f".{_shard_name(index, self.writer_cls.suffix)}.tmp"
        kwargs: dict[str, Any] = {"columns": self.columns}
        if self.writer_cls.suffix == ".parquet":
            kwargs["metadata"] = {"source": {k: v for k, v in self.source.items() if k != "created_by"}}
        self.shard_start = start
        return self.writer_cls(tmp, **kwargs)

    def _finish_shard(self, stop: int) -> None:
        """Close the open shard, publish it in the partial folder and journal it."""
        shard, self.shard = self.shard, None
        if shard is None:
            return
        shard.close()
        name = _shard_name(len(self.progress.shards), shard.suffix)
        os.replace(shard.path, self.work / name)
        fsync_path(self.work)
        path = self.work / name
        entry = {"file": name, "start": self.shard_start, "stop": stop, "count": shard.count,
                 "bytes": path.stat().st_size, "sha256": file_sha256(path), "failures": self.pending_failures}
        fsync_append(self.work / _JOURNAL, (json.dumps(entry, ensure_ascii=False) + "\n").encode())
        self.progress.shards.append(entry)
        self.progress.failures.extend(self.pending_failures)
        self.pending_failures = []
        self.progress.position = stop
        if self.claim is not None:
            self.claim.check()  # a run whose claim was broken stops at its next shard

    def run(self) -> None:
        """Export every sample from ``progress.position`` on."""
        reader, keys = self.reader, self.reader.keys
        repeats = _repeats(keys)
        n = len(reader)
        done_bytes = sum(s["bytes"] for s in self.progress.shards)
        with tqdm(total=n, initial=self.progress.position, unit="sample", desc=f"export {self.options.to}",
                  dynamic_ncols=True, disable=None) as bar:
            for position, rec in _records(reader, self.progress.position):
                key = keys[position]
                try:
                    if isinstance(rec, CorruptData):
                        raise rec
                    values = _values(reader, rec, self.plain, position, key)
                    tkey = tar_key(key, repeats.get(position, 0))
                    self._add(position, key, tkey, values)
                except CorruptData as e:  # str(e) names the file, the position and the key
                    self.pending_failures.append(_failure(self.pack, position, key, "read", str(e)))
                except MalformedField as e:
                    where = CorruptData(str(reader.path), f"malformed field ({e})", position=f"sample {position}",
                                        key=key)
                    self.pending_failures.append(_failure(self.pack, position, key, "read", str(where)))
                except ExportFailure as e:
                    self.pending_failures.append(_failure(self.pack, position, key, "export",
                                                          f"sample {position} (key {key!r}): {e}"))
                bar.update(1)
                if self.shard is not None and bar.disable is False:
                    bar.set_postfix_str(f"{(done_bytes + self.shard.size) / 1e6:.0f} MB", refresh=False)
            self._finish_shard(n)
        self.progress.failures.extend(self.pending_failures)
        self.pending_failures = []
        self.progress.position = n

    def _add(self, position: int, key: str, tkey: str, values: list[bytes | memoryview]) -> None:
        """Store one sample (prepared first: one that cannot be stored touches no shard)."""
        prepared = self.writer_cls.prepare(self.columns, plain=self.plain, key=key, tkey=tkey, values=values)
        shard = self.shard
        if shard is not None and shard.count and (
                (self.options.samples_per_shard is not None and shard.count >= self.options.samples_per_shard)
                or (self.max_bytes is not None and shard.size + shard.cost(prepared) > self.max_bytes)):
            self._finish_shard(position)
            shard = None
        if shard is None:
            shard = self.shard = self._open_shard(position)
        shard.add(prepared)

    def abort(self) -> None:
        if self.shard is not None:
            self.shard.abort()
            self.shard = None


def _check_finished(out: Path, source: dict[str, Any], options: dict[str, Any], items: int) -> ExportReport:
    """``--resume`` of a finished export: its record, every shard's sha256 and the source and
    options it was made from, checked; refuse naming what differs, or report it verified."""
    record = load_export(out)
    diff = _differences(record, source, options)
    if diff:
        raise ResumeRefused(f"{out}: is complete but was made differently from this run:\n  "
                            + "\n  ".join(diff) + "\n(use --overwrite to make it again)")
    for shard in record.get("shards", []):
        path = out / shard["file"]
        try:
            ok = file_sha256(path) == shard["sha256"]
        except OSError:
            ok = False
        if not ok:
            raise CorruptData(str(path), "missing or changed since the export (sha256 differs from export.json); "
                                         "use --overwrite to make it again")
    return ExportReport(str(out), count=int(record.get("count", 0)), items=items, status="complete",
                        note="every shard's sha256 and the source pack's identity checked",
                        to=str(record.get("format")), shards=len(record.get("shards", [])))


def _record(out_name: str, exp: _Export, options: dict[str, Any]) -> dict[str, Any]:
    """``export.json``: what a reader of the export, or a later ``--resume``, needs to know."""
    progress = exp.progress
    reader = exp.reader
    columns = []
    for c in exp.columns:
        column: dict[str, Any] = {"name": c.name, "type": c.field.spec()}
        if c.classes:
            column["class_label"] = True
        columns.append(column)
    record: dict[str, Any] = {
        "format": exp.options.to, "export_version": EXPORT_VERSION,
        "count": sum(s["count"] for s in progress.shards), "failures": len(progress.failures),
        "source": exp.source, "classes": list(reader.classes), "columns": columns,
        "images": "png from raw pixels" if _raw_pack(reader) else "the pack's encoded bytes, copied",
        "shards": [{k: s[k] for k in ("file", "start", "count", "bytes", "sha256")} for s in progress.shards],
        "options": options, "created_by": created_by({**options, "pack": exp.source["path"], "out": out_name}),
    }
    if exp.options.to == "wds":
        record["keys"] = ("urllib.parse.unquote(__key__.split('#')[0]) is the pack's key; '#N' marks the N-th "
                          "sample of a key the pack holds more than once")
        record["members"] = ("{key}.{ext}: the image by its format, .cls the label" if exp.plain else
                             "{key}.{field}.{ext}: ext by the field's type (image: its format)")
    else:
        record["keys"] = "the __key__ column holds the pack's key"
    record["checksum"] = manifest_checksum(record)
    return record


def _raw_pack(reader: Reader) -> bool:
    """Whether the pack stores raw pixels (HDF5 ``--raw``): its images are exported as PNG."""
    return bool((reader.manifest.created_by.get("options") or {}).get("raw"))


def _publish(exp: _Export, out: Path, work: Path, options: dict[str, Any], overwrite: bool) -> None:
    write_failures(work / FAILURES_NAME, exp.progress.failures)
    record = _record(out.name, exp, options)
    atomic_write_bytes(work / EXPORT_NAME, (json.dumps(record, indent=1, ensure_ascii=False) + "\n").encode())
    recheck = exp.guard.before_publish() if exp.guard is not None else (lambda: None)
    (work / _STATE).unlink(missing_ok=True)
    (work / _JOURNAL).unlink(missing_ok=True)
    fsync_path(work)
    if out.exists() or out.is_symlink():
        if not overwrite:
            raise UsageError(f"{out}: exists (use --overwrite or --resume)")
        remove_path(out)
    recheck()
    os.replace(work, out)
    fsync_path(out.parent)


def export_pack(pack: str | os.PathLike, out: str | os.PathLike, *, options: ExportOptions, resume: bool = False,
                overwrite: bool = False, claim: Claim | None = None, remote: Any = None) -> ExportReport:
    """Export the pack at ``pack`` (a path or URL) into the folder ``out`` as ``options`` say.

    Args:
        pack: any packed output (lmdb, records, hdf5; a URL through the node cache).
        out: the export folder (built at ``out.partial``, renamed when complete).
        options: the target format and shard sizes.
        resume: continue an interrupted export of the same pack with the same options (a
            finished one is checked and kept).
        overwrite: replace an existing export (or packer output) at ``out`` when done.
        claim: the run's claim on ``out`` (``packer.api.export`` takes it); None: unclaimed.
        remote: ``packer.remote.RemoteOptions`` for a URL ``pack``.

    Returns:
        The ExportReport (``failures`` holds every sample that was not exported, and why).
    """
    start = time.monotonic()
    out = Path(out)
    check_output_arg(out, resume=resume, overwrite=overwrite)
    name = redact(str(pack)) if is_url(pack) else str(pack)
    reader = open_reader(pack, check_crc=True, remote=remote)
    try:
        columns, plain = _columns(reader)
        source = source_identity(pack, reader)
        recorded = options.recorded()
        work = partial_path(out)
        if resume and not work.exists() and out.exists():
            return _check_finished(out, source, recorded, len(reader))
        guard = claim.partial(work, work) if claim is not None else None
        if guard is not None:
            guard.adopt()  # a partial another live run writes is never touched
        progress = _resume_progress(work, source, recorded, out) if resume and work.exists() else _Progress()
        try:
            if not progress.resumed:
                remove_path(work)
                work.mkdir(parents=True)
                state = {"source": source, "options": recorded, "overwrite": overwrite}
                atomic_write_bytes(work / _STATE, json.dumps(state, ensure_ascii=False).encode())
            else:  # what the kill left past the journal: temporary and unjournaled shards
                kept = {s["file"] for s in progress.shards}
                for p in work.iterdir():
                    if p.name.endswith(".tmp") or (p.name.startswith("shard-") and p.name not in kept):
                        p.unlink()
            (work / _JOURNAL).write_text("".join(json.dumps(s, ensure_ascii=False) + "\n" for s in progress.shards),
                                         encoding="utf-8")
            if guard is not None:
                guard.stamp()
        except OSError as e:
            raise WriteError(f"{work}: cannot open the export ({e.strerror or e})") from e
        exp = _Export(reader, name, work, options=options, columns=columns, plain=plain, source=source,
                      progress=progress, claim=claim, guard=guard)
        try:
            exp.run()
            _publish(exp, out, work, recorded, overwrite or progress.overwrite)
        except OSError as e:
            exp.abort()
            raise WriteError(f"{work}: export failed ({e.strerror or e})") from e
        except BaseException:
            exp.abort()
            raise
    finally:
        reader.close()
    shards = exp.progress.shards
    return ExportReport(str(out), count=sum(s["count"] for s in shards), items=len(reader),
                        failures=exp.progress.failures, elapsed=time.monotonic() - start,
                        bytes=sum(s["bytes"] for s in shards), status="resumed" if progress.resumed else "done",
                        to=options.to, shards=len(shards))


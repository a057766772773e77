"""Pack commands whose workers store the samples themselves (no single writer): ``to-records``
and ``to-hdf5`` with several workers.

``ShardedExecutor.map(fn, items)`` splits the inputs into segments (consecutive ranges) and
runs each in a worker of a ``RangePool`` as a ``SegmentTask``: the per-item work, then each
sample's stored bytes (the writer's ``Segments.record``: a framed TFRecord, or the bytes
themselves) appended to the worker's own part file in the writer's ``segment_dir`` (through a
1 MB buffer, its writeback started every 4 MB: ``packer.writeback``; for records a shard,
sha256'd as it goes and indexed); fsync at the end. What comes back is small: a row of plain
values per stored sample (no bytes), and the inputs that did not give one sample each. The
runner gets a records segment's consecutive one-sample inputs as one ``StoredSamples``
(``map_runs``), which the writer takes at once (``Writer.add_stored``: it only extends its key
and CRC32C lists and adopts each shard file where it ends), the rest (and an HDF5 writer's
samples) as ``Outcome``s; the writer takes each part file over in input order
(``packer.formats.segments``). The checkpoint,
failure records and ``--resume`` work as with any executor.
"""
from __future__ import annotations

import hashlib
import itertools
import os
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

from packer.codecs.tfrecord import index_bytes
from packer.conversion.executors.base import Executor, Outcome, call_safely
from packer.conversion.plans.ranges import RangePool, even_ranges
from packer.conversion.executors.base import WorkResult, as_result
from packer.errors import WriteError
from packer.formats.segments import (SegmentShard, SegmentWriteError, StoredSamples, segment_file,
                                     segment_index_file)
from packer.formats.sample import Sample
from packer.writeback import WRITE_BUFFER, Writeback

__all__ = ["ShardedExecutor", "SegmentTask", "segment_size"]


def segment_size(n: int, workers: int, *, lo: int = 256, hi: int = 8192, per_worker: int = 2) -> int:
    """Inputs per segment: about ``per_worker`` segments per worker, ``lo`` to ``hi`` (the
    format's ``Segments``: 2 a worker, 256 to 8,192 inputs, for records). For records each
    segment ends a shard, and a shard's commit is several fsyncs (data, index, folder,
    journals): small segments spend the run waiting on the disk (measured: 16 segments for
    3,000 inputs ran at 0.67x in-process; see docs/writing.md)."""
    return max(lo, min(hi, -(-n // (workers * per_worker))))


@dataclass
class _Segment:
    """The shard files of one segment as they are written."""

    workdir: Path
    tag: str
    shard_size: int
    indexed: bool = True  # sha256 and a DALI index per file (records); else bytes only (HDF5)
    done: list[SegmentShard] = field(default_factory=list)
    _fh: Any = None
    _offsets: list[int] = field(default_factory=list)
    _sizes: list[int] = field(default_factory=list)
    _bytes: int = 0
    _count: int = 0
    _writeback: Writeback = field(default_factory=Writeback)

    def append(self, record: bytes) -> tuple[int, int]:
        """Append one record; the number of the part file it went to and its offset there."""
        if self._fh is not None and self._bytes + len(record) > self.shard_size:
            self.close_shard()
        if self._fh is None:
            self._path = self.workdir / segment_file(self.tag, len(self.done))
            self._fh = open(self._path, "wb", buffering=WRITE_BUFFER)
            self._hash = hashlib.sha256() if self.indexed else None
            self._writeback.reset()
        at = self._bytes
        self._fh.write(record)
        if self._hash is not None:
            self._hash.update(record)
            self._offsets.append(at)
            self._sizes.append(len(record))
        self._bytes = at + len(record)
        self._count += 1
        if self.indexed:
            self._writeback.wrote(self._fh, self._bytes)  # the disk works while we go on; fsync stays
        return len(self.done), at

    def close_shard(self) -> None:
        # A records shard: the same flush/fsync/close as RecordsWriter._commit; the index is
        # written here too (and fsynced), so the writer's adoption is two renames and a folder
        # fsync. A part the writer copies (HDF5) is only flushed: it is read back from the page
        # cache once, CRC-checked against what the worker computed, and deleted once the file
        # holds it durably; a crash before then reruns its inputs (a resume removes old parts).
        # Written back and fsynced, every byte would go to the disk twice, the worker waiting.
        if self._fh is None:
            return
        if self.indexed:
            self._writeback.wrote(self._fh, self._bytes, last=True)  # the disk takes the rest while
        table = index_bytes(self._offsets, self._sizes) if self.indexed else b""  # the index is made
        self._fh.flush()
        if self.indexed:
            os.fsync(self._fh.fileno())
        self._fh.close()
        self._fh = None
        index = ""
        if self.indexed:
            index = str(self.workdir / segment_index_file(self.tag, len(self.done)))
            with open(index, "wb") as f:
                f.write(table)
                f.flush()
                os.fsync(f.fileno())
        self.done.append(SegmentShard(str(self._path), index, self._count, self._bytes,
                                      self._hash.hexdigest() if self._hash is not None else ""))
        self._offsets, self._sizes, self._bytes, self._count = [], [], 0, 0

    def abandon(self) -> None:
        if self._fh is not None:
            fh, self._fh = self._fh, None
            try:
                fh.close()  # flushes what is buffered, which fails again on a full disk
            except OSError:
                pass  # the file is never adopted: removed at the end or on resume


class SegmentTask:
    """Runs in a worker: the work of inputs ``start:stop``, stored into the worker's own shards.

    Returns a ``_Result`` (a row per stored sample, the inputs that did not give one plain
    sample each), or a ``SegmentWriteError`` when the shard cannot be written.
    """

    def __init__(self, work_fn: Any, *, workdir: str | os.PathLike, shard_size: int, prepare: Any,
                 indexed: bool = True, owner: int | None = None):
        self.owner = owner if owner is not None else os.getpid()  # the writer's process
        self.work_fn = work_fn
        self.workdir = Path(workdir)
        self.shard_size = shard_size
        self.prepare = prepare
        self.indexed = indexed

    def __call__(self, items: Sequence[Any], start: int, stop: int) -> _Result | SegmentWriteError:
        # the writer's pid in the names: a worker orphaned by a killed run never shares a file
        # with the run that resumes it (and stops at its next input, below)
        seg = _Segment(self.workdir, f"{self.owner}-{start:012d}-{stop:012d}", self.shard_size, self.indexed)
        rows: list[tuple] = []  # per stored sample, plain values: they cross back cheaply
        odd: dict[int, tuple] = {}  # inputs (by position) that did not give one plain sample
        append, prepare, work_fn, store = rows.append, self.prepare, self.work_fn, seg.append
        try:
            for i in range(start, stop):
                if os.getppid() != self.owner:  # the run that wanted this segment is gone
                    seg.abandon()
                    os._exit(1)
                outcome = call_safely(work_fn, items[i])
                if not outcome.ok:
                    odd[i - start] = (False, outcome.stage, outcome.reason)
                    continue
                value = outcome.value
                if type(value) is Sample:  # the usual input: one sample
                    samples = (value,)
                else:
                    result = as_result(value)
                    samples = result.samples
                    if len(samples) != 1 or result.entry is not None or result.note is not None:
                        odd[i - start] = (True, len(samples), result.entry, result.note)
                for s in samples:
                    record, crc = prepare(s)
                    k, at = store(record)
                    append((s.key, s.fmt, s.label, s.height, s.width, s.channels, s.extra or None, crc,
                            len(s.data), k, s.source_stat, at))
            seg.close_shard()
        except OSError as e:
            seg.abandon()
            return SegmentWriteError(f"{self.workdir}: write failed ({e.strerror or e})")
        return _Result(stop - start, rows, odd, seg.done)


@dataclass
class _Result:
    """What a segment hands back: its number of inputs; a row per stored sample in input order
    (``StoredSamples.rows``); the inputs, by position, that did not give one sample without a
    manifest entry or note: ``(True, samples, entry, note)`` (their rows are among the rows) or
    ``(False, stage, reason)``; the shard files it completed, by number."""

    count: int
    rows: list[tuple]
    odd: dict[int, tuple]
    shards: list[SegmentShard]

    def runs(self) -> Iterator[Outcome | StoredSamples]:
        """In input order: each stretch of inputs that gave one plain sample each as one
        ``StoredSamples``, every other input as its ``Outcome`` (a ``WorkResult`` of stored
        samples, or a failure). The last sample of each file adopts it."""
        ends = list(itertools.accumulate(s.count for s in self.shards))  # rows up to each file's end
        done = rows = 0  # inputs and rows so far
        for i in [*sorted(self.odd), self.count]:
            if i > done:  # inputs done..i-1: a row each
                yield self._stored(rows, rows + i - done, ends)
                rows += i - done
            if i == self.count:
                return
            entry, done = self.odd[i], i + 1
            if not entry[0]:
                yield Outcome(False, stage=entry[1], reason=entry[2])
                continue
            samples = list(self._stored(rows, rows + entry[1], ends).samples())
            rows += entry[1]
            yield Outcome(True, WorkResult(samples, entry[2], entry[3]))

    def _stored(self, start: int, stop: int, ends: list[int]) -> StoredSamples:
        return StoredSamples(self.rows[start:stop], self.shards,
                             [(n - start, k) for k, n in enumerate(ends) if start < n <= stop])


def _crashed(start: int, stop: int, why: str) -> _Result:
    return _Result(stop - start, [], {i: (False, "crash", why) for i in range(stop - start)}, [])


def _join(parts: list[Any]) -> Any:
    """A crashed segment rerun one input per range: its parts' results as one (files renumbered)."""
    count, rows, odd, shards = 0, [], {}, []
    for part in parts:
        if isinstance(part, SegmentWriteError):
            return part
        base = len(shards)
        shards += part.shards
        rows += [(*r[:9], r[9] + base, *r[10:]) for r in part.rows]
        odd.update((count + i, e) for i, e in part.odd.items())
        count += part.count
    return _Result(count, rows, odd, shards)


def _one_by_one(runs: Iterable[Outcome | StoredSamples]) -> Iterator[Outcome]:
    """``runs`` with each ``StoredSamples`` as an Outcome per input."""
    for x in runs:
        if type(x) is StoredSamples:
            yield from (Outcome(True, s) for s in x.samples())
        else:
            yield x


class ShardedExecutor(Executor):
    """Runs the work and the storing of ``to-records`` / ``to-hdf5`` in ``workers`` processes.

    Args:
        workers: worker processes (>= 1).
        writer: the (unopened) writer, of a format with ``Segments``, whose ``segment_dir`` the
            part files go to.
        segment: inputs per segment (default: ``segment_size``).
    """

    name = "sharded"

    def __init__(self, *, workers: int, writer: Any, segment: int | None = None, start_method: str | None = None):
        # Each executor validates its own knobs (the same shape as StagedExecutor's, other fields).
        if workers < 1:
            raise ValueError("workers must be >= 1")
        if segment is not None and segment < 1:
            raise ValueError("segment must be >= 1")
        if type(writer).segments is None:
            raise ValueError(f"{writer.format_name}: its workers cannot store samples themselves")
        self.workers = workers
        self.writer = writer
        self.segment = segment
        self.start_method = start_method

    def map(self, fn: Callable[[Any], Any], items: Iterable[Any]) -> Iterator[Outcome]:
        return _one_by_one(self.map_runs(fn, items))

    def map_runs(self, fn: Callable[[Any], Any], items: Iterable[Any]) -> Iterator[Outcome | StoredSamples]:
        items = list(items)
        if not items:
            return
        w = self.writer
        layout = type(w).segments
        w.segment_dir.mkdir(parents=True, exist_ok=True)
        task = SegmentTask(fn, workdir=w.segment_dir, shard_size=getattr(w, "shard_size", sys.maxsize),
                           prepare=w.segment_record(), indexed=layout.indexed)
        pool = RangePool(workers=self.workers, task=task, items=items, on_crash=_crashed, join=_join,
                         window=2, start_method=self.start_method)  # forks with the heap gc-frozen
        closing = None
        try:
            lo, hi = layout.inputs
            size = self.segment or segment_size(len(items), self.workers, lo=lo, hi=hi, per_worker=layout.per_worker)
            bounds = even_ranges(len(items), size)
            results = pool.map(bounds)
            for k in range(len(bounds)):
                result = next(results)
                if k == len(bounds) - 1:  # every range is done: the workers may go while the last
                    next(results, None)  # shards are adopted (ends the pool's map first)
                    closing = threading.Thread(target=pool.close, name="packer-sharded-close", daemon=True)
                    closing.start()
                if isinstance(result, SegmentWriteError):
                    raise WriteError(result.message)
                # records: a segment's one-sample inputs at once. An HDF5 writer copies each sample
                # in from its part and commits every --commit-every samples: one by one, as it was
                # (handed over at once, a kill-and-resume test tripped HDF5; see docs/writing.md)
                yield from result.runs() if layout.indexed else _one_by_one(result.runs())
        finally:
            if closing is None:
                pool.close()
            else:
                closing.join()

"""``to-records`` with several workers: each worker writes its own shards (no single writer).

``ShardedExecutor.map(fn, items)`` splits the inputs into segments (consecutive ranges) and
runs each in a worker of a ``RangePool`` as a ``SegmentTask``: the per-item work, then each
sample framed and appended to the worker's own shard file in the output's working folder
(through a 1 MB buffer, its writeback started every 4 MB: ``packer.writeback``; sha256 as it
goes; fsync at the end, then its index written and fsynced). Outcomes come back per input, in
order, holding *stored* samples (no bytes); ``RecordsWriter.add`` adopts each shard file when
its last sample arrives. The runner, the checkpoint, failure records and ``--resume`` work as
with any executor. See ``packer.formats.records_segments`` for what the writer does.
"""
from __future__ import annotations

import hashlib
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

from packer.codecs.tfrecord import index_bytes
from packer.conversion.executors.base import Executor, Outcome, call_safely
from packer.conversion.executors.ranges import RangePool, even_ranges
from packer.conversion.runner import as_result, WorkResult
from packer.errors import WriteError
from packer.formats.records_segments import (SegmentShard, SegmentWriteError, segment_file,
                                               segment_index_file)
from packer.formats.sample import Sample, Stored
from packer.writeback import WRITE_BUFFER, Writeback

__all__ = ["ShardedExecutor", "SegmentTask", "segment_size"]


def segment_size(n: int, workers: int, *, lo: int = 256, hi: int = 8192) -> int:
    """Inputs per segment: about 2 segments per worker, 256 to 8,192. Each segment ends a shard,
    and a shard's commit is several fsyncs (data, index, folder, journals): small segments
    spend the run waiting on the disk (measured: 16 segments for 3,000 inputs ran at 0.67x
    in-process; see docs/writing.md)."""
    return max(lo, min(hi, -(-n // (workers * 2))))


@dataclass
class _Segment:
    """The shard files of one segment as they are written."""

    workdir: Path
    tag: str
    shard_size: int
    done: list[SegmentShard] = field(default_factory=list)
    _fh: Any = None
    _offsets: list[int] = field(default_factory=list)
    _sizes: list[int] = field(default_factory=list)
    _bytes: int = 0
    _writeback: Writeback = field(default_factory=Writeback)

    def append(self, record: bytes) -> int:
        """Append one framed record; the number of the shard file it went to."""
        if self._fh is not None and self._bytes + len(record) > self.shard_size:
            self.close_shard()
        if self._fh is None:
            self._path = self.workdir / segment_file(self.tag, len(self.done))
            self._fh = open(self._path, "wb", buffering=WRITE_BUFFER)
            self._hash = hashlib.sha256()
            self._writeback.reset()
        self._fh.write(record)
        self._hash.update(record)
        self._offsets.append(self._bytes)
        self._sizes.append(len(record))
        self._bytes += len(record)
        self._writeback.wrote(self._fh, self._bytes)  # the disk works while we go on; fsync stays
        return len(self.done)

    def close_shard(self) -> None:
        # The same flush/fsync/close as RecordsWriter._commit; the index is written here too (and
        # fsynced), so the writer's adoption is two renames and a folder fsync.
        if self._fh is None:
            return
        self._writeback.wrote(self._fh, self._bytes, last=True)  # the disk takes the rest while
        table = index_bytes(self._offsets, self._sizes)  # the index is made
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._fh.close()
        self._fh = None
        index = self.workdir / segment_index_file(self.tag, len(self.done))
        with open(index, "wb") as f:
            f.write(table)
            f.flush()
            os.fsync(f.fileno())
        self.done.append(SegmentShard(str(self._path), str(index), len(self._offsets), self._bytes,
                                      self._hash.hexdigest()))
        self._offsets, self._sizes, self._bytes = [], [], 0

    def abandon(self) -> None:
        if self._fh is not None:
            fh, self._fh = self._fh, None
            try:
                fh.close()  # flushes what is buffered, which fails again on a full disk
            except OSError:
                pass  # the file is never adopted: removed at the end or on resume


class SegmentTask:
    """Runs in a worker: the work of inputs ``start:stop``, stored into the worker's own shards.

    Returns one ``Outcome`` per input (ok ones hold a ``WorkResult`` of stored samples), or a
    ``SegmentWriteError`` when the shard cannot be written.
    """

    def __init__(self, work_fn: Any, *, workdir: str | os.PathLike, shard_size: int, prepare: Any,
                 owner: int | None = None):
        self.owner = owner if owner is not None else os.getpid()  # the writer's process
        self.work_fn = work_fn
        self.workdir = Path(workdir)
        self.shard_size = shard_size
        self.prepare = prepare

    def __call__(self, items: Sequence[Any], start: int, stop: int) -> _Result | SegmentWriteError:
        # the writer's pid in the names: a worker orphaned by a killed run never shares a file
        # with the run that resumes it (and stops at its next input, below)
        seg = _Segment(self.workdir, f"{self.owner}-{start:012d}-{stop:012d}", self.shard_size)
        done: list[tuple] = []  # per input, plain tuples: they cross back cheaply
        try:
            for i in range(start, stop):
                if os.getppid() != self.owner:  # the run that wanted this segment is gone
                    seg.abandon()
                    os._exit(1)
                outcome = call_safely(self.work_fn, items[i])
                if not outcome.ok:
                    done.append((False, outcome.stage, outcome.reason))
                    continue
                result = as_result(outcome.value)
                stored = []
                for s in result.samples:
                    record, crc = self.prepare(s)
                    k = seg.append(record)
                    stored.append((s.key, s.fmt, s.label, s.height, s.width, s.channels, s.extra, crc,
                                   len(s.data), k, s.source_stat))
                done.append((True, stored, result.entry, result.note))
            seg.close_shard()
        except OSError as e:
            seg.abandon()
            return SegmentWriteError(f"{self.workdir}: write failed ({e.strerror or e})")
        return _Result(done, seg.done)


@dataclass
class _Result:
    """What a segment hands back: per input ``(True, stored samples, entry, note)`` or
    ``(False, stage, reason)``; the shard files it completed, by number."""

    inputs: list[tuple]
    shards: list[SegmentShard]

    def outcomes(self) -> Iterator[Outcome]:
        """Per input an Outcome of stored samples (a lone ``Sample`` for the usual input of one
        sample, no manifest entry, no note); the last sample of each file adopts it."""
        last = {}
        for i, entry in enumerate(self.inputs):
            if entry[0]:
                for j, s in enumerate(entry[1]):
                    last[s[9]] = (i, j)
        shards = self.shards
        for i, entry in enumerate(self.inputs):
            if not entry[0]:
                yield Outcome(False, stage=entry[1], reason=entry[2])
                continue
            samples = [Sample(key, b"", fmt, label, h, w, c, extra,
                              Stored(crc, size, shards[k] if last[k] == (i, j) else None), stat)
                       for j, (key, fmt, label, h, w, c, extra, crc, size, k, stat) in enumerate(entry[1])]
            if len(samples) == 1 and entry[2] is None and entry[3] is None:
                yield Outcome(True, samples[0])
            else:
                yield Outcome(True, WorkResult(samples, entry[2], entry[3]))


def _crashed(start: int, stop: int, why: str) -> _Result:
    return _Result([(False, "crash", why) for _ in range(start, stop)], [])


def _join(parts: list[Any]) -> Any:
    """A crashed segment rerun one input per range: its parts' results as one (files renumbered)."""
    inputs, shards = [], []
    for part in parts:
        if isinstance(part, SegmentWriteError):
            return part
        base = len(shards)
        shards += part.shards
        inputs += [e if not e[0] else (True, [(*s[:9], s[9] + base, *s[10:]) for s in e[1]], e[2], e[3])
                   for e in part.inputs]
    return _Result(inputs, shards)


class ShardedExecutor(Executor):
    """Runs the work and the shard writing of ``to-records`` in ``workers`` processes.

    Args:
        workers: worker processes (>= 1).
        writer: the (unopened) ``RecordsWriter`` whose working folder the shards go to.
        segment: inputs per segment (default: ``segment_size``).
    """

    name = "sharded"

    def __init__(self, *, workers: int, writer: Any, segment: int | None = None, start_method: str | None = None):
        # Each executor validates its own knobs (the same shape as StagedExecutor's, other fields).
        if workers < 1:
            raise ValueError("workers must be >= 1")
        if segment is not None and segment < 1:
            raise ValueError("segment must be >= 1")
        self.workers = workers
        self.writer = writer
        self.segment = segment
        self.start_method = start_method

    def map(self, fn: Callable[[Any], Any], items: Iterable[Any]) -> Iterator[Outcome]:
        items = list(items)
        if not items:
            return
        w = self.writer
        w.workdir.mkdir(parents=True, exist_ok=True)
        task = SegmentTask(fn, workdir=w.workdir, shard_size=w.shard_size, prepare=type(w).prepare)
        pool = RangePool(workers=self.workers, task=task, items=items, on_crash=_crashed, join=_join,
                         window=2, start_method=self.start_method)  # forks with the heap gc-frozen
        closing = None
        try:
            bounds = even_ranges(len(items), self.segment or segment_size(len(items), self.workers))
            results = pool.map(bounds)
            for k in range(len(bounds)):
                result = next(results)
                if k == len(bounds) - 1:  # every range is done: the workers may go while the last
                    next(results, None)  # shards are adopted (ends the pool's map first)
                    closing = threading.Thread(target=pool.close, name="packer-sharded-close", daemon=True)
                    closing.start()
                if isinstance(result, SegmentWriteError):
                    raise WriteError(result.message)
                yield from result.outcomes()
        finally:
            if closing is None:
                pool.close()
            else:
                closing.join()

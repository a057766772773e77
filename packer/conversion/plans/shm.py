"""``SharedMemoryExecutor``: workers do the work *and* the writer's encoding; the bytes come back
through memory shared with them, so the writer's process only stores them.

A process pool that returns each sample pickles its bytes into a pipe and out again (four
copies and a dozen system calls per 50 kB image), and the single writer spends as long
receiving a sample as a bare loop spends reading it from disk. Here the workers (a
``RangePool`` started with ``fork``) run, per input, the work function and then the writer's
``prepare`` (its stored value and CRC32C: a Caffe Datum, a framed record), and copy the bytes
into a slot of one anonymous shared mapping made before the workers start. Only a small
description per sample crosses the pipe; the writer's process gets memoryviews into the slot
and puts them (LMDB copies a value into its own pages during the put).

A slot is reused only after the writer has stored every sample of its range, and every view of
it handed out is released first, so a view object a writer kept raises ``ValueError`` on its
next use instead of showing a later sample's bytes. A buffer made *from* a view (a numpy
array over it) is not tracked by the release, so views go only to writers whose ``add`` copies
the bytes before it returns (``Writer.keeps_samples`` False: LMDB's put); for the others the
bytes are copied out of the slot once, in this process.

A worker that dies is replaced and its range rerun one item at a time (``RangePool``): only the
item that kills a worker fails, with stage ``crash``. Linux and other ``fork`` platforms only
(``available()``); elsewhere the plan falls back to in-process work.
"""
from __future__ import annotations

import mmap
import multiprocessing as mp
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Sequence

from packer.conversion.executors.base import Executor, Outcome, call_safely
from packer.conversion.plans.ranges import RangePool, concat_items, crashed_items, even_ranges
from packer.errors import WriteError
from packer.formats.sample import Sample

__all__ = ["SharedMemoryExecutor", "available"]

_TAIL = 24  # how far from its end a stored value may hold the sample's bytes (a Datum: <= 13)


def available() -> bool:
    """Whether this platform can share an anonymous mapping with forked workers."""
    return "fork" in mp.get_all_start_methods() and hasattr(mmap, "MAP_SHARED")


# One good sample as a worker describes it, a plain tuple (it unpickles ten times faster than a
# dataclass): its fields, where its bytes are (an ``(offset, length)`` in the mapping, or the
# bytes themselves when the slot was full), where the prepared value's bytes are (likewise, or
# None when ``prepare`` made no bytes), the rest of what ``prepare`` gave (its CRC32C) and the
# source file's ``(size, mtime_ns)`` as the worker read it (``Sample.source_stat``).
_KEY, _FMT, _LABEL, _H, _W, _C, _EXTRA, _DATA, _VALUE, _REST, _STAT = range(11)


class _Task:
    """Runs in a worker: ``fn`` then ``prepare`` for each item of a range, bytes into ``slot``."""

    def __init__(self, fn: Callable[[Any], Any], prepare: Callable[[Sample], Any] | None, ring: mmap.mmap,
                 slot_bytes: int, pieces: Callable[[Sample], Any] | None = None):
        self.fn, self.prepare, self.ring, self.slot_bytes = fn, prepare, ring, slot_bytes
        self.pieces = pieces

    def __call__(self, items: Sequence[Any], start: int, stop: int, slot: int) -> list[Any]:
        pos = slot * self.slot_bytes
        end = pos + self.slot_bytes
        out: list[Any] = []
        for i in range(start, stop):
            outcome = call_safely(self._work, items[i])
            if not outcome.ok or not isinstance(outcome.value, _Prepared):
                out.append(outcome)  # a failure, or a result that is not one sample: pickled
                continue
            sample, prepared, pieces = outcome.value.sample, outcome.value.prepared, outcome.value.pieces
            if pieces is not None:  # the value in pieces, written one after the other: no joined copy
                parts, data_at, crc = pieces
                total = sum(len(part) for part in parts)
                if pos + total <= end:
                    at, data_ref = pos, None
                    for k, part in enumerate(parts):
                        if k == data_at:
                            data_ref = (at, len(part))
                        self.ring[at:at + len(part)] = part
                        at += len(part)
                    out.append((sample.key, sample.fmt, sample.label, sample.height, sample.width, sample.channels,
                                sample.extra, data_ref, (pos, total), (crc,), sample.source_stat))
                    pos = at
                    continue
                prepared = (b"".join(parts), crc)  # (the slot is full: as ``prepare`` gives it)
            value = prepared[0] if isinstance(prepared, tuple) and isinstance(prepared[0], (bytes, bytearray)) else None
            data, n = sample.data, len(sample.data)
            inner = _find_inside(value, data) if value is not None else -1
            if value is not None and pos + len(value) <= end:
                self.ring[pos:pos + len(value)] = value
                value_ref = (pos, len(value))
                data_ref = (pos + inner, n) if inner >= 0 else None
                pos += len(value)
            else:
                value_ref, data_ref = value, None
            if data_ref is None and isinstance(data, bytes) and pos + n <= end:
                self.ring[pos:pos + n] = data
                data_ref = (pos, n)
                pos += n
            elif data_ref is None:
                data_ref = bytes(data)
            rest = prepared[1:] if value is not None else prepared
            out.append((sample.key, sample.fmt, sample.label, sample.height, sample.width, sample.channels,
                        sample.extra, data_ref, value_ref, rest, sample.source_stat))
        return out

    def _work(self, item: Any) -> Any:
        value = self.fn(item)
        if not isinstance(value, Sample):
            return value  # several samples, a video's result: shipped whole
        pieces = self.pieces(value) if self.pieces is not None else None
        if pieces is not None:
            return _Prepared(value, None, pieces)
        return _Prepared(value, self.prepare(value) if self.prepare is not None else None)


@dataclass(frozen=True)
class _Prepared:
    sample: Sample
    prepared: Any
    pieces: Any = None  # the writer's ``prepare_pieces``: (pieces, which is the sample's bytes, CRC32C)


def _find_inside(value: bytes, data: Any) -> int:
    """Where ``data`` sits in ``value`` when it ends at most ``_TAIL`` bytes before its end (so
    the slot holds it once), else -1. Compared in place (``startswith`` at an offset)."""
    n = len(data)
    if not isinstance(data, bytes) or n > len(value):
        return -1
    for k in range(len(value) - n, max(-1, len(value) - n - _TAIL - 1), -1):
        if value.startswith(data, k):
            return k
    return -1


def _detached(entry: Any, base: memoryview) -> Any:
    """``entry`` with its bytes copied out of the mapping (a crash rerun's: it holds no slot)."""
    if isinstance(entry, Outcome):
        return entry
    def out(ref: Any) -> Any:
        return bytes(base[ref[0]:ref[0] + ref[1]]) if isinstance(ref, tuple) else ref
    return entry[:_DATA] + (out(entry[_DATA]), out(entry[_VALUE])) + entry[_REST:]


class SharedMemoryExecutor(Executor):
    """Work and the writer's ``prepare`` in ``workers`` forked processes; bytes back through a
    shared mapping of ``slots`` x ``slot_bytes`` (see the module docstring).

    Args:
        workers: worker processes (>= 1).
        prepare: the writer class's ``prepare`` (None: only the work runs in the workers).
        pieces: the writer class's ``prepare_pieces``, where it has one: the value written into
            the mapping piece by piece (no joined copy of the sample's bytes).
        views: hand the writer views into the mapping (its ``add`` copies them) instead of bytes.
        chunk_size: items per range.
        window: ranges in flight per worker.
        slot_bytes: bytes per slot; a sample that does not fit crosses the pipe instead.
    """

    name = "shm"

    def __init__(self, *, workers: int, prepare: Callable[[Sample], Any] | None = None, views: bool = False,
                 chunk_size: int = 32, window: int = 2, slot_bytes: int = 8 << 20,
                 pieces: Callable[[Sample], Any] | None = None):
        # (the same shape as StagedExecutor's knob checks; the knobs differ, so each says its own)
        if workers < 1 or chunk_size < 1 or window < 1 or slot_bytes < 1:
            raise ValueError("workers, chunk_size, window and slot_bytes must be >= 1")
        if not available():
            raise ValueError("shared-memory workers need the fork start method (Linux)")
        self.workers = workers
        self.prepare = prepare
        self.pieces = pieces
        self.views = views
        self.chunk_size = chunk_size
        self.window = window
        self.slot_bytes = slot_bytes
        self.slots = workers * window + 2  # the ranges in flight, plus the one being stored

    def map(self, fn: Callable[[Any], Any], items: Iterable[Any]) -> Iterator[Outcome]:
        items = list(items)
        if not items:
            return
        ring = mmap.mmap(-1, self.slots * self.slot_bytes, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_ANONYMOUS", 0))
        base = memoryview(ring)
        pool = RangePool(workers=self.workers, task=_Task(fn, self.prepare, ring, self.slot_bytes, self.pieces), items=items,
                         on_crash=crashed_items, join=concat_items, window=self.window, start_method="fork",
                         slots=self.slots, detach=lambda shipped: [_detached(e, base) for e in shipped])
        bounds = even_ranges(len(items), self.chunk_size)
        try:
            for job, shipped in zip(bounds, pool.map(bounds)):
                lent: list[memoryview] = []
                for entry in shipped:
                    yield entry if isinstance(entry, Outcome) else Outcome(True, self._sample(entry, base, lent))
                _release(lent)  # the writer has stored every sample of the range
                pool.release(job)
        finally:
            pool.close()
            base.release()
            try:
                ring.close()
            except BufferError:  # a view is still held somewhere: the mapping goes when it does
                pass

    def _sample(self, s: tuple, base: memoryview, lent: list[memoryview]) -> Sample:
        data = self._bytes(s[_DATA], base, lent)
        prepared = s[_REST] if s[_VALUE] is None else (self._bytes(s[_VALUE], base, lent), *s[_REST])
        return Sample(s[_KEY], data, s[_FMT], s[_LABEL], s[_H], s[_W], s[_C], s[_EXTRA], prepared, s[_STAT])

    def _bytes(self, ref: Any, base: memoryview, lent: list[memoryview]) -> Any:
        if not isinstance(ref, tuple):
            return ref
        view = base[ref[0]:ref[0] + ref[1]]
        if not self.views:
            data = bytes(view)
            view.release()
            return data
        lent.append(view)
        return view


def _release(views: list[memoryview]) -> None:
    """Release every view of a slot before it is reused (a kept view then raises on use); one a
    C consumer still holds a buffer of would later show another sample's bytes: refused."""
    for view in views:
        try:
            view.release()
        except BufferError:
            raise WriteError("a writer kept a view of a shared-memory sample past its add(); "
                             "its bytes would change under it (packer bug: report it)") from None

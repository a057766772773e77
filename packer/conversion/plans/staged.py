"""The ``staged`` plan: checks in worker processes, completions on threads of the writer's process.

Worker processes (a ``RangePool``: the items go to each worker once, then only ranges) run
the per-item work. A work function with ``verdict(item)`` and ``complete(item, verdict)``
(``VerdictJob``) runs only its ``verdict`` there, so just a small result crosses back, and
its ``complete`` on threads here, where the writer is: file reads and CRC32C release the
GIL, so the writer's thread keeps appending meanwhile. Any other work function runs whole
in the workers (its result crosses back once).
"""
from __future__ import annotations

import collections
import os
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Sequence

from packer.codecs.image import probe
from packer.conversion.executors.base import Executor, Outcome, call_safely
from packer.conversion.inputs import read_item, read_item_bytes
from packer.conversion.plans.ranges import RangePool, concat_items, crashed_items, even_ranges, pick_chunk
from packer.errors import CorruptSample
from packer.formats.sample import Sample
from packer.integrity import crc32c

__all__ = ["StagedExecutor", "Verdict", "VerdictJob"]


@dataclass(frozen=True)
class Verdict:
    """What a worker hands back for one good image: its description and the fingerprint
    (length, CRC32C) of the exact bytes it checked."""

    fmt: str
    height: int
    width: int
    channels: int
    size: int
    crc: int


class VerdictJob:
    """Split an image job (no resize, no raw pixels) into a verdict and a completion.

    ``verdict(item)`` runs in a worker: read + check, a ``Verdict`` back. ``complete(item,
    verdict)`` runs in the writer's process: read the file again (page cache), check it is the
    same bytes, build the ``Sample``. Calling the job itself does both (in-process work).
    """

    def __init__(self, job: Any):
        if getattr(job, "resize", None) is not None or getattr(job, "raw", False):
            raise ValueError("a resizing job stores new bytes: it has no verdict-only form")
        self.job = job

    def __call__(self, item: Any) -> Sample:
        return self.job(item)

    def verdict(self, item: Any) -> Verdict:
        """Read and check one input; the small description the writer needs."""
        data = read_item_bytes(item)
        sample = self._describe(item, data)
        return Verdict(sample.fmt, sample.height, sample.width, sample.channels, len(data), crc32c(data))

    def complete(self, item: Any, verdict: Verdict) -> Sample:
        """The sample for ``item`` from its verdict and the bytes read here."""
        data, stat = read_item(item)
        if len(data) != verdict.size or crc32c(data) != verdict.crc:
            raise CorruptSample(item.key, item.path, "file changed while it was being packed "
                                                     "(the bytes read differ from the bytes checked)",
                                stage="read")
        return Sample(item.key, data, verdict.fmt, item.label, verdict.height, verdict.width, verdict.channels,
                      source_stat=stat)

    def _describe(self, item: Any, data: bytes) -> Sample:
        from packer.codecs.image import EXT_FORMATS

        ext = item.key.rsplit(".", 1)[-1].lower()
        info = probe(data, check=self.job.check, key=item.key, source=item.path, ext_fmt=EXT_FORMATS.get(ext))
        return Sample(item.key, b"", info.fmt, item.label, info.height, info.width, info.channels)


class _Task:
    """Runs in a worker: one Outcome per item of a range (``verdict`` only, when staged)."""

    def __init__(self, fn: Any, staged: bool):
        self.fn, self.staged = fn, staged

    def __call__(self, items: Sequence[Any], start: int, stop: int) -> list[Outcome]:
        work = self.fn.verdict if self.staged else self.fn
        return [call_safely(work, items[i]) for i in range(start, stop)]


class StagedExecutor(Executor):
    """Work in ``workers`` processes fed by ranges; staged completions on ``threads`` threads.

    Outcomes come in input order; failures of either stage become failed Outcomes, and an
    item whose worker dies fails with stage ``crash`` (the others of its range are rerun).

    Args:
        workers: worker processes (>= 1).
        threads: completion threads in this process (>= 1).
        chunk_size: items per range (default: about 16 ranges per worker, 8 to 256 items).
        window: ranges in flight per worker.
    """

    name = "staged"

    def __init__(self, *, workers: int, threads: int = 1, chunk_size: int | None = None, window: int = 2,
                 start_method: str | None = None):
        if workers < 1 or threads < 1 or window < 1:
            raise ValueError("workers, threads and window must be >= 1")
        if chunk_size is not None and chunk_size < 1:
            raise ValueError("chunk_size must be >= 1")
        self.workers = workers
        self.threads = threads
        self.chunk_size = chunk_size
        self.window = window
        self.start_method = start_method
        self._threads = ThreadPoolExecutor(threads, thread_name_prefix="packer-complete")

    def map(self, fn: Callable[[Any], Any], items: Iterable[Any]) -> Iterator[Outcome]:
        items = list(items)
        if not items:
            return
        staged = hasattr(fn, "verdict") and hasattr(fn, "complete")
        pool = RangePool(workers=self.workers, task=_Task(fn, staged), items=items, on_crash=crashed_items,
                         join=concat_items, window=self.window, start_method=self.start_method)
        bounds = even_ranges(len(items), self.chunk_size or pick_chunk(len(items), self.workers))
        pending: collections.deque = collections.deque()
        limit = 64 * self.threads
        try:
            for (start, _), outcomes in zip(bounds, pool.map(bounds)):
                for k, outcome in enumerate(outcomes):
                    if staged and outcome.ok:
                        pending.append(self._threads.submit(_complete, fn, items[start + k], outcome.value))
                    else:
                        pending.append(outcome)
                while len(pending) > limit or (pending and _ready(pending[0])):
                    yield _result(pending.popleft())
            while pending:
                yield _result(pending.popleft())
        finally:
            for entry in pending:
                if isinstance(entry, Future):
                    entry.cancel()
            pool.close()

    def close(self) -> None:
        self._threads.shutdown(wait=True)


def _complete(fn: Any, item: Any, verdict: Any) -> Outcome:
    return call_safely(lambda it: fn.complete(it, verdict), item)


def _ready(entry: Outcome | Future) -> bool:
    return isinstance(entry, Outcome) or entry.done()


def _result(entry: Outcome | Future) -> Outcome:
    return entry if isinstance(entry, Outcome) else entry.result()


def default_threads() -> int:
    """Completion threads: one per core, at most 4 (they mostly wait on reads)."""
    return max(1, min(4, os.cpu_count() or 1))

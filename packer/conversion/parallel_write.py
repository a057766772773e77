"""The write path that uses every core: what runs where, and the executor that runs it.

The writer (one process) only appends or puts. Everything else runs beside it:

* **verdicts** (``StagedExecutor``): worker processes read each file and check it (header
  parse or full decode) and hand back only a small ``Verdict`` (format, size, length, CRC32C
  of the bytes they checked); the writer process reads the page-cached file again in a
  thread (file reads and CRC32C release the GIL), checks that its length and CRC32C match
  the verdict (a file changed in between is a recorded failure, never a silent mismatch)
  and builds the sample. No sample's bytes cross a process boundary.
* **sharded writers** (records: ``packer.formats.records_segments``): the workers write whole
  shards themselves; the writer only adopts them (rename, index, journal).

``choose_plan`` picks between those, a plain process pool and in-process work from what the
command asks (format, ``--check``, resize) and the cores there are, from the measurements in
``docs/writing.md``; ``--workers 0`` always means in this process.
"""
from __future__ import annotations

import collections
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

from packer.errors import CorruptSample
from packer.executors import Executor, InlineExecutor, LocalExecutor, Outcome, call_safely
from packer.formats.base import Sample
from packer.integrity import crc32c

__all__ = ["Verdict", "VerdictJob", "StagedExecutor", "Plan", "choose_plan", "CHEAP_CHECKS"]

log = logging.getLogger(__name__)

CHEAP_CHECKS = ("none", "header")


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
        from packer.pack import read_item_bytes

        data = read_item_bytes(item)
        sample = self._describe(item, data)
        return Verdict(sample.fmt, sample.height, sample.width, sample.channels, len(data), crc32c(data))

    def complete(self, item: Any, verdict: Verdict) -> Sample:
        """The sample for ``item`` from its verdict and the bytes read here."""
        from packer.pack import read_item_bytes

        data = read_item_bytes(item)
        if len(data) != verdict.size or crc32c(data) != verdict.crc:
            raise CorruptSample(item.key, item.path, "file changed while it was being packed "
                                                     "(the bytes read differ from the bytes checked)",
                                stage="read")
        return Sample(item.key, data, verdict.fmt, item.label, verdict.height, verdict.width, verdict.channels)

    def _describe(self, item: Any, data: bytes) -> Sample:
        from packer.imaging import probe
        from packer.pack import _EXT_FMT

        ext = item.key.rsplit(".", 1)[-1].lower()
        info = probe(data, check=self.job.check, key=item.key, source=item.path, ext_fmt=_EXT_FMT.get(ext))
        return Sample(item.key, b"", info.fmt, item.label, info.height, info.width, info.channels)


class _VerdictOf:
    """Picklable ``fn.verdict`` (a bound method of a plain object pickles too; this is explicit)."""

    def __init__(self, job: VerdictJob):
        self.job = job

    def __call__(self, item: Any) -> Verdict:
        return self.job.verdict(item)


class StagedExecutor(Executor):
    """Verdicts from worker processes, completions on threads of this process, in input order.

    A work function with ``verdict``/``complete`` (``VerdictJob``) runs its ``verdict`` in a
    process pool and its ``complete`` on ``threads`` threads here; any other work function
    runs whole in the pool. Failures of either stage become failed Outcomes as everywhere.

    Args:
        workers: worker processes (>= 1).
        threads: completion threads in this process (>= 1).
        chunk_size: items per pool task.
        window: chunks in flight per worker.
    """

    name = "staged"

    def __init__(self, *, workers: int, threads: int = 2, chunk_size: int = 32, window: int = 4,
                 start_method: str | None = None):
        if threads < 1:
            raise ValueError("threads must be >= 1")
        self.workers = workers
        self.threads = threads
        self._pool = LocalExecutor(workers=workers, chunk_size=chunk_size, window=window,
                                   start_method=start_method)
        self._threads = ThreadPoolExecutor(threads, thread_name_prefix="packer-complete")

    def map(self, fn: Callable[[Any], Any], items: Iterable[Any]) -> Iterator[Outcome]:
        if not hasattr(fn, "verdict"):
            yield from self._pool.map(fn, items)
            return
        items = list(items)
        pending: collections.deque = collections.deque()
        limit = 4 * self.threads
        for item, outcome in zip(items, self._pool.map(_VerdictOf(fn), items)):
            if outcome.ok:
                pending.append(self._threads.submit(_complete_safely, fn, item, outcome.value))
            else:
                pending.append(outcome)
            while len(pending) > limit or (pending and _ready(pending[0])):
                yield _result(pending.popleft())
        while pending:
            yield _result(pending.popleft())

    def close(self) -> None:
        self._threads.shutdown(wait=True)
        self._pool.close()


def _complete_safely(fn: Any, item: Any, verdict: Verdict) -> Outcome:
    return call_safely(lambda it: fn.complete(it, verdict), item)


def _ready(entry: Any) -> bool:
    return isinstance(entry, Outcome) or entry.done()


def _result(entry: Any) -> Outcome:
    return entry if isinstance(entry, Outcome) else entry.result()


@dataclass(frozen=True)
class Plan:
    """How a pack command runs: ``mode`` is ``inline`` (this process), ``pool`` (worker
    processes hand back whole samples), ``staged`` (verdicts, see ``StagedExecutor``) or
    ``sharded`` (the workers write record shards themselves); ``workers`` processes."""

    mode: str
    workers: int
    why: str


def choose_plan(*, format: str, check: str, workers: int | None, resizing: bool, executor: str = "local",
                cores: int | None = None, resuming_inside_shard: bool = False) -> Plan:
    """The fastest way to run a pack command, from what it asks and the cores there are.

    ``workers`` is ``--workers`` (None: the default, every core). The rules come from
    ``scripts/bench_write.py`` (see ``docs/writing.md``):

    * ``--workers 0`` (or 1, or one core): in this process, as always.
    * records: the workers write their own shards (``sharded``): no single writer to wait on.
    * a cheap check (``header``/``none``) into LMDB/HDF5 without resize: in this process by
      default. The per-sample work (a header parse) costs about what handing it to another
      process and back costs, so the single writer is fastest alone; an explicit ``--workers
      N`` >= 2 gets verdict workers.
    * a full check without resize: verdict workers (only a small description crosses back).
    * resize (new bytes are made in the worker): the plain pool; the new bytes cross once.
    """
    cores = cores or os.cpu_count() or 1
    if executor.partition(":")[0] != "local":
        return Plan("pool", workers or 0, f"--executor {executor}: the work goes to its workers")
    n = cores if workers is None else workers
    if n <= 1:
        return Plan("inline", 0, "one worker or none: in this process")
    if format == "records" and not resizing:
        return Plan("sharded", n, "records: each worker writes its own shards")
    if resizing:
        return Plan("pool", n, "resize: workers make the new bytes and hand them back once")
    if check in CHEAP_CHECKS and workers is None:
        return Plan("inline", 0, f"--check {check}: a header parse costs less than handing it to "
                                 "another process; the writer is fastest alone")
    return Plan("staged", n, f"--check {check}: workers check, hand back a verdict; the writer reads "
                             "the page-cached file")


def make_pack_executor(plan: Plan) -> Executor:
    """The executor a ``Plan`` names (``sharded`` plans build theirs in the records writer)."""
    if plan.mode == "inline":
        return InlineExecutor()
    if plan.mode == "staged":
        return StagedExecutor(workers=plan.workers)
    return LocalExecutor(workers=plan.workers)


def job_for(plan: Plan, job: Any) -> Any:
    """The work function a plan runs: ``VerdictJob`` for ``staged``."""
    return VerdictJob(job) if plan.mode == "staged" else job


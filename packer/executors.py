"""Executors run one work function over many items and yield outcomes in input order.

Every executor has the same signature (``map(fn, items)``), so the converter never knows
whether work runs inline, in a local process pool or elsewhere. A work function's
exceptions never escape: each becomes a failed ``Outcome`` for that item.
"""
from __future__ import annotations

import collections
import logging
import multiprocessing as mp
import os
import signal
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Sequence

from .errors import CorruptSample, UsageError

__all__ = ["Outcome", "Executor", "InlineExecutor", "LocalExecutor", "make_executor", "call_safely"]

log = logging.getLogger(__name__)


@dataclass
class Outcome:
    """What one item's work gave: ``value`` when ``ok``, else a failure ``stage`` and ``reason``."""

    ok: bool
    value: Any = None
    stage: str = ""
    reason: str = ""


def call_safely(fn: Callable[[Any], Any], item: Any) -> Outcome:
    """Run ``fn(item)``; turn any exception into a failed Outcome (the error policy)."""
    try:
        return Outcome(True, fn(item))
    except CorruptSample as e:
        return Outcome(False, stage=e.stage, reason=e.reason)
    except MemoryError:
        return Outcome(False, stage="internal", reason="out of memory")
    except Exception as e:  # a decoder bug must cost one item, not the job
        return Outcome(False, stage="internal", reason=f"{type(e).__name__}: {e}")


def _run_chunk(fn: Callable[[Any], Any], chunk: Sequence[Any]) -> list[Outcome]:
    return [call_safely(fn, item) for item in chunk]


def _worker_init() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C
    try:
        import cv2

        cv2.setNumThreads(1)
    except ImportError:  # pragma: no cover
        pass


class Executor:
    """Interface: ``map(fn, items)`` yields one Outcome per item, in input order."""

    name = "base"
    workers = 1

    def map(self, fn: Callable[[Any], Any], items: Iterable[Any]) -> Iterator[Outcome]:
        raise NotImplementedError

    def close(self) -> None:
        """Release workers."""

    def __enter__(self) -> "Executor":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class InlineExecutor(Executor):
    """Runs work in this process (``--workers 0`` or 1): simplest to debug and profile."""

    name = "inline"

    def map(self, fn: Callable[[Any], Any], items: Iterable[Any]) -> Iterator[Outcome]:
        for item in items:
            yield call_safely(fn, item)


class LocalExecutor(Executor):
    """A local process pool. Items go out in chunks with a bounded window in flight, so
    memory stays flat however slow the consumer (the writer) is.

    Args:
        workers: worker processes (>= 1).
        chunk_size: items per task (amortises inter-process overhead).
        window: chunks in flight per worker.
    """

    name = "local"

    def __init__(self, *, workers: int, chunk_size: int = 8, window: int = 4,
                 start_method: str | None = None):
        if workers < 1:
            raise ValueError("workers must be >= 1")
        if chunk_size < 1 or window < 1:
            raise ValueError("chunk_size and window must be >= 1")
        self.workers = workers
        self.chunk_size = chunk_size
        self.window = window
        ctx = mp.get_context(start_method) if start_method else mp.get_context()
        self._pool = ctx.Pool(workers, initializer=_worker_init)

    def map(self, fn: Callable[[Any], Any], items: Iterable[Any]) -> Iterator[Outcome]:
        inflight: collections.deque = collections.deque()
        it = iter(items)
        limit = self.workers * self.window

        def submit() -> bool:
            chunk = []
            for item in it:
                chunk.append(item)
                if len(chunk) >= self.chunk_size:
                    break
            if not chunk:
                return False
            inflight.append(self._pool.apply_async(_run_chunk, (fn, chunk)))
            return True

        more = True
        while more and len(inflight) < limit:
            more = submit()
        while inflight:
            outcomes = inflight.popleft().get()
            if more:
                more = submit()
            yield from outcomes

    def close(self) -> None:
        self._pool.terminate()
        self._pool.join()


def make_executor(name: str = "local", *, workers: int | None = None, **options: Any) -> Executor:
    """Build an executor by name: ``local`` (process pool; inline when workers <= 1)."""
    if workers is None:
        workers = os.cpu_count() or 1
    if workers < 0:
        raise UsageError("--workers must be >= 0")
    if name == "local":
        if workers <= 1:
            return InlineExecutor()
        return LocalExecutor(workers=workers)
    raise UsageError(f"unknown executor {name!r} (known: local)")

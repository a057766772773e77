"""``LocalExecutor``: a local process pool fed in chunks with a bounded window, where a worker
that dies costs the item it held, never the job.

Why pebble: ``multiprocessing.Pool`` loses the task of a worker that dies (a decoder segfault,
the OOM killer) and waits for it forever, which hung image packing. ``concurrent.futures``'
``ProcessPoolExecutor`` notices the death but then fails *every* pending future with
``BrokenProcessPool`` and must be rebuilt, so it cannot say which item killed the worker
without rerunning everything in flight one at a time. ``pebble.ProcessPool`` (maintained,
pure Python, one small dependency) fails only the future whose worker died, with
``ProcessExpired`` carrying the exit code or signal, replaces that worker and keeps the other
tasks running; it also enforces per-task timeouts (counted from when the task starts), which
``IsolatedExecutor`` uses.
"""
from __future__ import annotations

import logging
import multiprocessing as mp
from concurrent.futures import CancelledError, TimeoutError as FutureTimeout
from typing import Any, Callable, Iterable, Iterator

from pebble import ProcessExpired, ProcessPool

from packer.conversion.executors.base import (Executor, Outcome, exit_text, run_chunk, windowed,
                                              worker_init)

__all__ = ["LocalExecutor", "make_pool", "chunk_outcomes"]

log = logging.getLogger(__name__)


def make_pool(workers: int, start_method: str | None) -> ProcessPool:
    """A pebble process pool of ``workers`` with packer's worker start-up hook."""
    ctx = mp.get_context(start_method) if start_method else mp.get_context()
    return ProcessPool(max_workers=workers, initializer=worker_init, context=ctx)


def chunk_outcomes(pool: ProcessPool, fn: Callable[[Any], Any], future: Any, chunk: list[Any],
                   timeout: float | None = None, last_try: bool = False) -> list[Outcome]:
    """The outcomes of one ``run_chunk`` task. A chunk whose worker died is rerun one item per
    task, and a single item whose worker died is run once more, so exactly the items that kill
    a worker twice fail (stage ``crash``, with the signal or exit status) and an item whose
    worker died for another reason (the OOM killer picking it while a neighbour grew) gets a
    second chance; an item past ``timeout`` fails with stage ``timeout`` (its worker is killed)."""
    try:
        return future.result()
    except ProcessExpired as e:
        if len(chunk) > 1:
            log.info("a worker died running %d items; rerunning them one per task", len(chunk))
            singles = [pool.schedule(run_chunk, (fn, [item]), timeout=timeout) for item in chunk]
            return [o for f, item in zip(singles, chunk) for o in chunk_outcomes(pool, fn, f, [item], timeout)]
        if not last_try:
            again = pool.schedule(run_chunk, (fn, chunk), timeout=timeout)
            return chunk_outcomes(pool, fn, again, chunk, timeout, last_try=True)
        return [Outcome(False, stage="crash", reason=f"worker process died ({exit_text(e.exitcode)})")]
    except FutureTimeout:
        return [Outcome(False, stage="timeout", reason=f"no result after {timeout:g}s; worker killed")
                for _ in chunk]
    except CancelledError:
        return [Outcome(False, stage="internal", reason="cancelled") for _ in chunk]
    except Exception as e:  # the task could not be sent or its result not returned (pickling)
        return [Outcome(False, stage="internal", reason=f"{type(e).__name__}: {e}") for _ in chunk]


class LocalExecutor(Executor):
    """A local process pool. Items go out in chunks with a bounded window in flight, so
    memory stays flat however slow the consumer (the writer) is. A worker that dies fails
    only the item it was running (stage ``crash``); a fresh worker takes its place.

    Args:
        workers: worker processes (>= 1).
        chunk_size: items per task (amortises inter-process overhead).
        window: chunks in flight per worker.
        start_method: multiprocessing start method (default: the platform's).
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
        self._pool = make_pool(workers, start_method)

    def map(self, fn: Callable[[Any], Any], items: Iterable[Any]) -> Iterator[Outcome]:
        return windowed(items, chunk_size=self.chunk_size, limit=self.workers * self.window,
                        submit=lambda chunk: self._pool.schedule(run_chunk, (fn, chunk)),
                        collect=lambda fut, chunk: chunk_outcomes(self._pool, fn, fut, chunk),
                        cancel=lambda fut: fut.cancel())

    def close(self) -> None:
        self._pool.stop()
        self._pool.join()

"""``IsolatedExecutor``: each item its own task in a worker process with a time limit, so a hang
or a crash costs one item (pebble's pool: see ``local`` for why)."""
from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator, Optional

from packer.conversion.executors.base import Executor, Outcome, run_chunk, windowed
from packer.conversion.executors.local import chunk_outcomes, make_pool

__all__ = ["IsolatedExecutor"]


class IsolatedExecutor(Executor):
    """A local process pool where each item runs alone as one task with a time limit: an item
    that hangs past ``timeout`` seconds or kills its worker (a decoder segfault) becomes a
    failed Outcome (stage ``timeout`` / ``crash``) and a fresh worker takes its place, so one
    bad input costs one item, never the job. One item per task, so use it for heavy items
    (videos); results come back in input order with at most ``workers * window`` in flight.

    Args:
        workers: worker processes (>= 1).
        timeout: seconds one item may take, counted from when it starts in a worker (None: no
            limit, crashes are still contained).
        window: items in flight per worker (bounds memory when the consumer is slow).
        start_method: multiprocessing start method (default: the platform's).
    """

    name = "local-isolated"

    def __init__(self, *, workers: int, timeout: Optional[float] = None, window: int = 2,
                 start_method: str | None = None):
        if workers < 1:
            raise ValueError("workers must be >= 1")
        if timeout is not None and not timeout > 0:
            raise ValueError("timeout must be > 0 seconds (or None)")
        if window < 1:
            raise ValueError("window must be >= 1")
        self.workers = workers
        self.timeout = timeout
        self.window = window
        self._pool = make_pool(workers, start_method)

    def map(self, fn: Callable[[Any], Any], items: Iterable[Any]) -> Iterator[Outcome]:
        # A future cancelled while running (an abandoned map) has its worker killed by pebble.
        return windowed(items, chunk_size=1, limit=self.workers * self.window,
                        submit=lambda chunk: self._pool.schedule(run_chunk, (fn, chunk), timeout=self.timeout),
                        collect=lambda fut, chunk: chunk_outcomes(self._pool, fn, fut, chunk, self.timeout),
                        cancel=lambda fut: fut.cancel())

    def close(self) -> None:
        self._pool.stop()
        self._pool.join()

"""``LocalExecutor``: a local process pool fed in chunks with a bounded window."""
from __future__ import annotations

import collections
import multiprocessing as mp
from typing import Any, Callable, Iterable, Iterator

from packer.conversion.executors.base import Executor, Outcome, run_chunk, worker_init

__all__ = ["LocalExecutor"]


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
        self._pool = ctx.Pool(workers, initializer=worker_init)

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
            inflight.append(self._pool.apply_async(run_chunk, (fn, chunk)))
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


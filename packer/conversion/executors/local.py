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

pebble learns which task a worker runs from the worker's acknowledgement, read by one thread
of the pool, and sees a worker die on another. When a worker dies before its acknowledgement
has been read (a task that kills its worker at once, on a busy machine), pebble 5 either never
fails that task (its future never completes: the run hangs) or, when no other task's
acknowledgement has been read either, declares the whole pool broken. ``_Pool`` closes that
race: a death it cannot match to a task yet is kept, and once every message the dead worker
sent has been read (the channel ran dry), the task it acknowledged last without a result fails
with ``ProcessExpired`` like any other dead worker's task.
"""
from __future__ import annotations

import itertools
import logging
import multiprocessing as mp
import threading
from concurrent.futures import CancelledError, TimeoutError as FutureTimeout
from typing import Any, Callable, Iterable, Iterator

from pebble import ProcessExpired, ProcessPool
from pebble.common import Result, ResultStatus
from pebble.pool import process as pebble_process

from packer.conversion.executors.base import (Executor, Outcome, exit_text, run_chunk, windowed,
                                              worker_init)

__all__ = ["LocalExecutor", "make_pool", "chunk_outcomes"]

log = logging.getLogger(__name__)


#: deaths in a row before any acknowledgement after which workers are taken to die on start-up
_IDLE_DEATHS = 16


class _Manager(pebble_process.PoolManager):
    """pebble's pool manager, where a worker killed by a signal before its acknowledgement was
    read still fails the task it took (see the module docstring)."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._lock = threading.Lock()
        self._seq = itertools.count(1)
        self._dead: dict[int, tuple[int, int]] = {}  # pid -> (exit code, sequence number of the death)
        self._idle_deaths = 0  # deaths matched to no task since the last acknowledgement

    def handle_worker_expiration(self, expiration: tuple) -> None:
        pid, code = expiration
        with self._lock:
            task = next((t for t in pebble_process.dictionary_values(self.task_manager.tasks)
                         if t.worker_id == pid), None)
            if task is None:
                self._idle_deaths += 1
                if self._idle_deaths <= _IDLE_DEATHS:  # its acknowledgement, if any, is not read yet
                    self._dead[pid] = (code, next(self._seq))
                    return
        if task is None:  # workers keep dying before they take a task (an initializer that fails)
            return super().handle_worker_expiration(expiration)  # pebble's verdict: a broken pool
        self._expire(task.id, pid, code)

    def process_next_message(self, timeout: float) -> None:
        with self._lock:
            started = next(self._seq)  # deaths numbered below this happened before this read began
        message = self.worker_manager.receive(timeout)
        if isinstance(message, pebble_process.NoMessage):
            self._sweep(started)
        elif isinstance(message, pebble_process.Acknowledgement):
            with self._lock:
                self.task_manager.task_start(message.task, message.worker)
                self._idle_deaths = 0
        elif isinstance(message, pebble_process.TaskResult):
            self.task_manager.task_done(message.task, message.result)
        elif isinstance(message, pebble_process.TaskProblem):
            self.task_manager.task_problem(message.task, message.error)

    def _sweep(self, started: int) -> None:
        """The channel stayed empty for a whole read: every message of a worker that died before
        the read began has been handled, so a task it still holds has no result coming."""
        with self._lock:
            done = {pid: code for pid, (code, seq) in self._dead.items() if seq < started}
            if not done:
                return
            for pid in done:
                del self._dead[pid]
            held = [(t.id, t.worker_id) for t in pebble_process.dictionary_values(self.task_manager.tasks)
                    if t.worker_id in done]
        for task_id, pid in held:
            self._expire(task_id, pid, done[pid])

    def _expire(self, task_id: int, pid: int, code: int) -> None:
        error = ProcessExpired("Abnormal termination", code=code, pid=pid)
        self.task_manager.task_done(task_id, Result(ResultStatus.ERROR, error))


class _Pool(ProcessPool):
    """``pebble.ProcessPool`` with ``_Manager``: a dead worker's task always fails, never hangs."""

    def __init__(self, *, context: Any, **kwargs: Any) -> None:
        super().__init__(context=context, **kwargs)
        self._pool_manager = _Manager(self._context, context)


def make_pool(workers: int, start_method: str | None) -> ProcessPool:
    """A pebble process pool of ``workers`` with packer's worker start-up hook, where a worker
    that dies always fails the task it ran (``_Pool``)."""
    ctx = mp.get_context(start_method) if start_method else mp.get_context()
    return _Pool(max_workers=workers, initializer=worker_init, context=ctx)


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

"""``RangePool``: worker processes that get the work and the items once, then only ranges.

A plain process pool pickles every item out and every result back; for cheap per-item work
that shipping costs the writer's process as much as doing the work itself. Here each worker
receives the task and the whole item list once when it starts (inherited through ``fork``;
pickled once per worker under ``spawn``), then only ``(start, stop)`` ranges go out and one
result per range comes back. Ranges are handed out in order, a bounded number in flight per
worker, and results are yielded in order.

With ``slots`` each range also gets a buffer slot number (a region of memory shared with the
workers, see ``packer.conversion.plans.shm``): a range goes out only when a slot is free,
the task is called as ``task(items, start, stop, slot)``, and the slot stays the range's until
the consumer calls ``release((start, stop))`` after it has used the range's result. The
one-item reruns of a crashed range hold no slot: ``detach(result)`` turns each into a result
that needs none as it arrives (the joined range would otherwise wait for slots its own parts
hold).

A worker that dies (a decoder segfault, the OOM killer) is replaced; the range it was running
is split into one-item ranges and run again (the ranges queued behind it go out as they
were), so only the item that kills a worker again fails, through ``on_crash(start, stop,
why)`` which gives the result for it.
"""
from __future__ import annotations

import collections
import gc
import multiprocessing as mp
from multiprocessing.connection import wait as wait_ready
from typing import Any, Callable, Iterator, Sequence

from packer.conversion.executors.base import Outcome, exit_text, worker_init

__all__ = ["RangePool", "even_ranges", "pick_chunk", "crashed_items", "concat_items"]


def _worker_main(conn: Any, parent_end: Any, task: Callable[[Sequence[Any], int, int], Any],
                 items: Sequence[Any]) -> None:
    parent_end.close()  # inherited through fork: only the parent may hold it, or a dead parent is never seen
    worker_init()
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):  # the parent went away
            return
        if job is None:
            return
        result = task(items, *job)
        try:
            conn.send(result)
        except (BrokenPipeError, EOFError, OSError):
            return


class _Worker:
    def __init__(self, ctx: Any, task: Any, items: Sequence[Any]):
        self.conn, child = ctx.Pipe(duplex=True)
        self.proc = ctx.Process(target=_worker_main, args=(child, self.conn, task, items), daemon=True)
        # A forked worker's collector would walk (and so copy, page by page) the parent's whole
        # heap at its first full collection: frozen objects are never walked (the Python docs'
        # advice for fork without exec; measured ~90 ms of a 3,000-input run, docs/writing.md).
        gc.freeze()
        try:
            self.proc.start()
        finally:
            gc.unfreeze()
        child.close()
        self.jobs: collections.deque = collections.deque()  # (start, stop) sent, in order

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join()
        self.conn.close()


class RangePool:
    """Run ``task(items, start, stop)`` over consecutive ranges of ``items`` in ``workers``
    processes; ``map`` yields the results in range order.

    Args:
        workers: worker processes (>= 1).
        task: a picklable callable ``(items, start, stop) -> result`` (run in the workers).
        items: the whole item list (sent once per worker).
        on_crash: ``(start, stop, why) -> result`` for a one-item range whose worker died.
        join: one result from the results of a crashed range's one-item ranges, in order.
        window: ranges in flight per worker.
        start_method: multiprocessing start method (default: the platform's).
        slots: buffer slots shared by all workers (None: no slots); see the module docstring.
        detach: with ``slots``, ``result -> result`` that uses no slot (for crash reruns).
    """

    def __init__(self, *, workers: int, task: Callable[[Sequence[Any], int, int], Any], items: Sequence[Any],
                 on_crash: Callable[[int, int, str], Any], join: Callable[[list[Any]], Any],
                 window: int = 2, start_method: str | None = None, slots: int | None = None,
                 detach: Callable[[Any], Any] | None = None):
        if workers < 1 or window < 1:
            raise ValueError("workers and window must be >= 1")
        if slots is not None and slots < 1:
            raise ValueError("slots must be >= 1")
        self._free: list[int] | None = None if slots is None else list(range(slots - 1, -1, -1))
        self._held: dict[tuple[int, int], list[int]] = {}  # a range -> the slots its result uses
        if slots is not None and detach is None:
            raise ValueError("slots need detach (the crash reruns must not hold slots)")
        self._detach = detach
        self._parts: set[tuple[int, int]] = set()  # one-item reruns of crashed ranges
        self._ctx = mp.get_context(start_method) if start_method else mp.get_context()
        self._task, self._items, self._on_crash, self._join = task, items, on_crash, join
        self._window = window
        self._workers = [_Worker(self._ctx, task, items) for _ in range(min(workers, max(1, len(items))))]

    def map(self, bounds: Sequence[tuple[int, int]]) -> Iterator[Any]:
        """The result of each ``(start, stop)`` range of ``bounds``, in order."""
        todo = collections.deque(bounds)
        done: dict[tuple[int, int], Any] = {}
        order = collections.deque(bounds)
        redo: dict[tuple[int, int], list[tuple[int, int]]] = {}  # a crashed range -> its one-item ranges
        try:
            while order:
                head = order[0]
                parts = redo.get(head)
                if parts is not None and all(p in done for p in parts):
                    joined = self._join([done.pop(p) for p in parts])  # a crashed range, from its parts
                    self._held[head] = [s for p in parts for s in self._held.pop(p, [])]
                    del redo[head]
                    order.popleft()
                    yield joined
                    continue
                if parts is None and head in done:
                    order.popleft()
                    yield done.pop(head)
                    continue
                for w in self._workers:
                    while todo and len(w.jobs) < self._window and self._free != []:
                        job = todo.popleft()
                        if self._free is not None:
                            self._held[job] = [self._free.pop()]
                        try:
                            w.conn.send(job if self._free is None else (*job, self._held[job][0]))
                        except (BrokenPipeError, OSError):  # it died: its sentinel says so below
                            todo.appendleft(job)
                            self.release(job)
                            break
                        w.jobs.append(job)
                busy = [w for w in self._workers if w.jobs]
                ready = set(wait_ready([w.conn for w in busy] + [w.proc.sentinel for w in self._workers]))
                for i, w in enumerate(list(self._workers)):
                    if w.jobs and w.conn in ready:
                        try:
                            result = w.conn.recv()
                        except (EOFError, OSError):
                            pass  # died mid-send
                        else:
                            job = w.jobs.popleft()
                            if job in self._parts and self._detach is not None:
                                result = self._detach(result)
                                self.release(job)
                            done[job] = result
                            continue
                    if w.conn in ready or w.proc.sentinel in ready:
                        w.proc.join()
                        why = f"worker process died ({exit_text(w.proc.exitcode)})"
                        lost = list(w.jobs)
                        for job in lost:  # no result will use their slots: resent ones get new ones
                            self.release(job)
                        w.kill()
                        self._workers[i] = _Worker(self._ctx, self._task, self._items)
                        if not lost:  # died idle (killed from outside): nothing to redo
                            continue
                        todo.extendleft(reversed(lost[1:]))  # queued behind it, not started: as they were
                        start, stop = lost[0]  # the range it was running when it died
                        if stop - start == 1:  # that item killed its worker: it fails
                            done[(start, stop)] = self._on_crash(start, stop, why)
                        else:  # find the item(s) that kill: rerun one item per range
                            parts = [(k, k + 1) for k in range(start, stop)]
                            redo[(start, stop)] = parts
                            self._parts.update(parts)
                            todo.extendleft(reversed(parts))
        finally:
            if order or any(w.jobs for w in self._workers):  # abandoned mid-way: stop stale work
                for i, w in enumerate(self._workers):
                    if w.jobs:
                        w.kill()
                        self._workers[i] = _Worker(self._ctx, self._task, self._items)

    def release(self, job: tuple[int, int]) -> None:
        """The consumer is done with the result of range ``job``: its slots may be reused."""
        if self._free is not None:
            self._free.extend(self._held.pop(job, []))

    def close(self) -> None:
        for w in self._workers:
            try:
                if not w.jobs:
                    w.conn.send(None)
            except OSError:
                pass
        for w in self._workers:
            w.proc.join(2.0)
            w.kill()
        self._workers = []


def even_ranges(n: int, size: int) -> list[tuple[int, int]]:
    """``[(0, size), (size, 2 size), ...]`` covering ``range(n)``."""
    return [(s, min(s + size, n)) for s in range(0, n, size)]


def pick_chunk(n: int, workers: int, *, lo: int = 8, hi: int = 256) -> int:
    """Items per range: about 16 ranges per worker, within [lo, hi]."""
    return max(lo, min(hi, n // max(1, workers * 16) or lo))


def crashed_items(start: int, stop: int, why: str) -> list[Outcome]:
    """``on_crash`` for pools whose range result is one entry per item: a ``crash`` failure each."""
    return [Outcome(False, stage="crash", reason=why) for _ in range(start, stop)]


def concat_items(parts: list[list[Any]]) -> list[Any]:
    """``join`` for pools whose range result is one entry per item: the parts' entries in order."""
    return [entry for part in parts for entry in part]

"""``IsolatedExecutor``: each item alone in a worker process with a time limit, so a hang or a
crash costs one item."""
from __future__ import annotations

import multiprocessing as mp
import time
from multiprocessing.connection import wait as _wait_ready
from typing import Any, Callable, Iterable, Iterator, Optional

from packer.conversion.executors.base import Executor, Outcome, call_safely, exit_text, worker_init

__all__ = ["IsolatedExecutor"]


def _isolated_main(conn: Any) -> None:
    """Worker loop of IsolatedExecutor: receive (fn, item), send back its Outcome."""
    worker_init()
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):  # the parent went away
            return
        if task is None:
            return
        fn, item = task
        outcome = call_safely(fn, item)
        try:
            conn.send(outcome)
        except (BrokenPipeError, EOFError, OSError):
            return
        except Exception as e:  # an unpicklable result costs this item only
            conn.send(Outcome(False, stage="internal", reason=f"result cannot be sent back ({e})"))


class _Slot:
    """One isolated worker process and the task it is running."""

    def __init__(self, ctx: Any):
        self.conn, child = ctx.Pipe(duplex=True)
        self.proc = ctx.Process(target=_isolated_main, args=(child,), daemon=True)
        self.proc.start()
        child.close()
        self.task: Optional[int] = None  # position of the item it runs
        self.deadline = float("inf")

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join()
        self.conn.close()


class IsolatedExecutor(Executor):
    """A local process pool where each item runs alone in a worker with a time limit: an item
    that hangs past ``timeout`` seconds or kills its worker (a decoder segfault) becomes a
    failed Outcome (stage ``timeout`` / ``crash``) and a fresh worker takes its place, so one
    bad input costs one item, never the job. One item per task, so use it for heavy items
    (videos); results come back in input order with at most ``workers * window`` in flight.

    Args:
        workers: worker processes (>= 1).
        timeout: seconds one item may take (None: no limit, crashes are still contained).
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
        self._ctx = mp.get_context(start_method) if start_method else mp.get_context()
        self._slots: list[_Slot] = []

    def _slot_for_work(self) -> Optional[_Slot]:
        for i, slot in enumerate(self._slots):
            if slot.task is None:
                if not slot.proc.is_alive():  # died while idle: replace it
                    slot.kill()
                    self._slots[i] = slot = _Slot(self._ctx)
                return slot
        if len(self._slots) < self.workers:
            self._slots.append(_Slot(self._ctx))
            return self._slots[-1]
        return None

    def _replace(self, slot: _Slot) -> None:
        slot.kill()
        self._slots[self._slots.index(slot)] = _Slot(self._ctx)

    def map(self, fn: Callable[[Any], Any], items: Iterable[Any]) -> Iterator[Outcome]:
        for slot in list(self._slots):  # a task left over from an abandoned map
            if slot.task is not None:
                self._replace(slot)
        it = enumerate(items)
        done: dict[int, Outcome] = {}
        next_out = submitted = 0
        exhausted = False
        limit = self.workers * self.window
        try:
            while True:
                while not exhausted and submitted - next_out < limit:
                    slot = self._slot_for_work()
                    if slot is None:
                        break
                    try:
                        index, item = next(it)
                    except StopIteration:
                        exhausted = True
                        break
                    try:
                        slot.conn.send((fn, item))
                    except (BrokenPipeError, OSError):
                        self._replace(slot)
                        done[index] = Outcome(False, stage="crash",
                                              reason="worker died before the item started")
                        submitted += 1
                        continue
                    slot.task = index
                    slot.deadline = time.monotonic() + self.timeout if self.timeout else float("inf")
                    submitted += 1
                while next_out in done:
                    yield done.pop(next_out)
                    next_out += 1
                busy = [s for s in self._slots if s.task is not None]
                if not busy:
                    if exhausted and next_out == submitted:
                        return
                    continue
                wait_s = max(0.0, min(s.deadline for s in busy) - time.monotonic())
                ready = set(_wait_ready([s.conn for s in busy] + [s.proc.sentinel for s in busy],
                                        timeout=None if wait_s == float("inf") else wait_s))
                now = time.monotonic()
                for slot in busy:
                    if slot.conn in ready:
                        try:
                            done[slot.task] = slot.conn.recv()
                            slot.task = None
                            continue
                        except (EOFError, OSError):
                            pass  # died mid-send: a crash
                    if slot.conn in ready or slot.proc.sentinel in ready:
                        slot.proc.join()
                        why = exit_text(slot.proc.exitcode)
                        done[slot.task] = Outcome(False, stage="crash", reason=f"worker process died ({why})")
                        self._replace(slot)
                    elif now >= slot.deadline:
                        done[slot.task] = Outcome(False, stage="timeout",
                                                  reason=f"no result after {self.timeout:g}s; worker killed")
                        self._replace(slot)
        finally:
            for slot in list(self._slots):  # abandoned mid-way: don't leave stale work running
                if slot.task is not None:
                    self._replace(slot)

    def close(self) -> None:
        for slot in self._slots:
            try:
                if slot.task is None:
                    slot.conn.send(None)
            except OSError:
                pass
        deadline = time.monotonic() + 2.0
        for slot in self._slots:
            slot.proc.join(max(0.0, deadline - time.monotonic()))
            slot.kill()
        self._slots = []


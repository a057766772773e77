"""Executors run one work function over many items and yield outcomes in input order.

Every executor has the same signature (``map(fn, items)``), so the converter never knows
whether work runs inline, in a local process pool or elsewhere. A work function's
exceptions never escape: each becomes a failed ``Outcome`` for that item.
"""
from __future__ import annotations

import collections
import itertools
import logging
import multiprocessing as mp
import os
import signal
import time
from dataclasses import dataclass
from multiprocessing.connection import wait as _wait_ready
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence

from .errors import CorruptSample, UsageError

__all__ = ["Outcome", "Executor", "InlineExecutor", "LocalExecutor", "IsolatedExecutor", "RayExecutor",
           "EXECUTORS", "make_executor", "call_safely"]

EXECUTORS = ("local", "ray")  # the names make_executor and --executor take

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


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise UsageError("--executor ray needs Ray: pip install 'packer[ray]'") from None
    return ray


def _run_timed(fn: Callable[[Any], Any], item: Any) -> Iterator[Any]:
    """A Ray generator task: first a start marker (a timeout counts from it), then the Outcome."""
    yield None
    yield call_safely(fn, item)


class _Timed:
    """One single-item task of RayExecutor's timeout mode."""

    def __init__(self, gen: Any):
        self.gen = gen
        self.started: float | None = None  # when its start marker was seen
        self.outcome: Outcome | None = None  # set early when it died before starting


_CRASH = "worker process died (a crash or a kill)"


class RayExecutor(Executor):
    """Runs the work as Ray tasks, on a Ray cluster or a local Ray instance, with the local pool's
    contract: outcomes in input order, a bounded window in flight, a work function's exceptions
    become failed Outcomes (``call_safely`` runs inside the task). Only the per-item work moves;
    the caller keeps writing, so output, progress, failures and ``--resume`` are the same. Every
    node needs packer installed and the input paths readable (a shared file system).

    A task whose worker dies (a decoder segfault, a lost node) is retried once by Ray; a chunk
    that still fails is rerun one item per task, so only the items that crash fail (stage
    ``crash``).

    Args:
        workers: tasks running at once (default: the cluster's CPUs).
        address: the cluster to join (``auto``, ``ray://head:10001``, ``host:6379``); None
            follows ``ray.init`` (``RAY_ADDRESS``, else a cluster ``ray start`` runs on this
            machine, else a new local instance). Ignored when Ray is already initialised in this
            process (its cluster is used as it is).
        timeout: seconds one item may run, counted from when it starts on a worker (so queueing
            and worker start-up do not count). Items then go one per task, ``workers`` at once;
            an item past its time is cancelled (its worker killed) and fails with stage
            ``timeout``; one whose worker dies fails with stage ``crash`` (not retried).
        chunk_size: items per task without a timeout (amortises scheduling overhead).
        window: chunks in flight per worker.
        init_options: extra ``ray.init`` keywords (``num_cpus``, ``runtime_env``, ...).
    """

    name = "ray"

    def __init__(self, *, workers: int | None = None, address: str | None = None,
                 timeout: float | None = None, chunk_size: int = 8, window: int = 4,
                 init_options: dict[str, Any] | None = None):
        if workers is not None and workers < 1:
            raise ValueError("workers must be >= 1 (or None for the cluster's CPUs)")
        if chunk_size < 1 or window < 1:
            raise ValueError("chunk_size and window must be >= 1")
        if timeout is not None and not timeout > 0:
            raise ValueError("timeout must be > 0 seconds (or None)")
        ray = _import_ray()
        self._started = False
        if not ray.is_initialized():
            options = {"include_dashboard": False, "log_to_driver": False,
                       "logging_level": logging.WARNING, **(init_options or {})}
            try:
                ray.init(address=address, **options)
            except (ConnectionError, RuntimeError, ValueError) as e:
                raise UsageError(f"cannot start or join Ray at {address or 'RAY_ADDRESS/local'}: {e}") from None
            self._started = True
        elif address is not None:
            log.info("Ray is already initialised in this process; --ray-address %s is not used", address)
        cpus = int(ray.cluster_resources().get("CPU", 1))
        self.workers = workers or max(1, cpus)
        self.timeout = timeout
        self.chunk_size = chunk_size
        self.window = window
        self._task = ray.remote(num_cpus=1, max_retries=1)(_run_chunk)
        self._timed = ray.remote(num_cpus=1, max_retries=0)(_run_timed)
        log.info("Ray executor: %d tasks at once on the cluster at %s (%d CPUs)", self.workers,
                 ray.get_runtime_context().gcs_address, cpus)

    def map(self, fn: Callable[[Any], Any], items: Iterable[Any]) -> Iterator[Outcome]:
        ray = _import_ray()
        fn_ref = ray.put(fn)  # shipped once, not with every task
        it = iter(items)
        inflight: collections.deque = collections.deque()
        timed = self.timeout is not None

        def submit() -> bool:
            if timed:
                for item in it:
                    inflight.append(_Timed(self._timed.remote(fn_ref, item)))
                    return True
                return False
            chunk = list(itertools.islice(it, self.chunk_size))
            if chunk:
                inflight.append((self._task.remote(fn_ref, chunk), chunk))
            return bool(chunk)

        more = True
        try:
            while more and len(inflight) < self.workers * (1 if timed else self.window):
                more = submit()
            while inflight:
                head = inflight[0]
                outcomes = ([self._await_timed(ray, inflight)] if timed
                            else self._collect(ray, fn_ref, *head))
                inflight.popleft()
                if more:
                    more = submit()
                yield from outcomes
        finally:
            for entry in inflight:  # abandoned (Ctrl-C, a writer error): stop the work
                ray.cancel(entry.gen if timed else entry[0], force=True)

    def _collect(self, ray: Any, fn_ref: Any, ref: Any, chunk: list[Any]) -> list[Outcome]:
        try:
            return ray.get(ref)
        except ray.exceptions.RayError as e:
            if len(chunk) > 1:  # find the item(s) that crash: rerun one item per task
                refs = [self._task.remote(fn_ref, [item]) for item in chunk]
                return [o for r, item in zip(refs, chunk) for o in self._collect(ray, fn_ref, r, [item])]
            log.warning("Ray task failed: %s", e)  # the details (pid, traceback) go to the log only
            if isinstance(e, ray.exceptions.WorkerCrashedError):
                return [Outcome(False, stage="crash", reason=_CRASH)]
            return [Outcome(False, stage="crash", reason=f"Ray task failed ({type(e).__name__})")]

    def _await_timed(self, ray: Any, inflight: collections.deque) -> Outcome:
        """The head task's Outcome; meanwhile note when each task in flight starts."""
        head = inflight[0]
        while head.outcome is None:
            waiting = [t for t in inflight if t.started is None and t.outcome is None]
            remaining = None
            if head.started is not None:
                remaining = head.started + self.timeout - time.monotonic()
                if remaining <= 0:
                    ray.cancel(head.gen, force=True)
                    return Outcome(False, stage="timeout", reason=f"took longer than {self.timeout:g}s")
                waiting.append(head)
            ready, _ = ray.wait([t.gen for t in waiting], num_returns=1, timeout=remaining)
            for t in waiting:
                if any(r is t.gen for r in ready):
                    value = self._next(ray, t.gen)
                    if t.started is None and value is None:
                        t.started = time.monotonic()
                    else:  # the result, or a crash before or after the start marker
                        t.outcome = value if isinstance(value, Outcome) else Outcome(
                            False, stage="crash", reason=_CRASH)
        return head.outcome

    @staticmethod
    def _next(ray: Any, gen: Any) -> Any:
        try:
            return ray.get(next(gen))
        except StopIteration:
            return False
        except ray.exceptions.RayError as e:
            log.warning("Ray task failed: %s", e)
            return False

    def close(self) -> None:
        if self._started:
            _import_ray().shutdown()
            self._started = False


def _isolated_main(conn: Any) -> None:
    """Worker loop of IsolatedExecutor: receive (fn, item), send back its Outcome."""
    _worker_init()
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
                        why = _exit_text(slot.proc.exitcode)
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


def _exit_text(code: Optional[int]) -> str:
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}"


def make_executor(name: str = "local", *, workers: int | None = None, timeout: float | None = None,
                  isolate: bool = False, **options: Any) -> Executor:
    """Build an executor by name: ``local`` (process pool; inline when workers <= 1) or ``ray``
    (``ray:ADDRESS`` or ``address=`` joins a cluster; workers None or 0 = the cluster's CPUs).

    With ``timeout`` (seconds per item) or ``isolate``, ``local`` runs each item alone in a
    worker (``IsolatedExecutor``, even for one worker), so a hang or a crash costs one item;
    ``workers=0`` still runs in this process, where neither can be contained. ``ray`` always
    runs items in Ray's worker processes (crashes are contained) and enforces ``timeout``.
    """
    name, _, address = name.partition(":")
    if workers is not None and workers < 0:
        raise UsageError("--workers must be >= 0")
    if timeout is not None and not timeout > 0:
        raise UsageError("--timeout must be > 0 seconds")
    if name == "ray":
        return RayExecutor(workers=workers or None, address=options.pop("address", None) or address or None,
                           timeout=timeout, **options)
    if workers is None:
        workers = os.cpu_count() or 1
    if name == "local":
        if (timeout is not None or isolate) and workers >= 1:
            return IsolatedExecutor(workers=workers, timeout=timeout)
        if workers <= 1:
            if timeout is not None:
                log.warning("--workers 0 runs in this process: the per-item timeout is not enforced")
            return InlineExecutor()
        return LocalExecutor(workers=workers)
    raise UsageError(f"unknown executor {name!r} (known: {', '.join(EXECUTORS)})")

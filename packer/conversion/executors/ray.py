"""``RayExecutor``: the per-item work as Ray tasks, on a cluster or a local Ray instance."""
from __future__ import annotations

import collections
import logging
import time
from typing import Any, Callable, Iterable, Iterator

from packer.conversion.executors.base import CRASH, Executor, Outcome, call_safely, run_chunk, windowed
from packer.errors import UsageError

__all__ = ["RayExecutor"]

log = logging.getLogger(__name__)


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
                raise UsageError(f"cannot start or join Ray at {address or 'RAY_ADDRESS/local'}: {e}") from e
            self._started = True
        elif address is not None:
            log.info("Ray is already initialised in this process; --ray-address %s is not used", address)
        cpus = int(ray.cluster_resources().get("CPU", 1))
        self.workers = workers or max(1, cpus)
        self.timeout = timeout
        self.chunk_size = chunk_size
        self.window = window
        self._task = ray.remote(num_cpus=1, max_retries=1)(run_chunk)
        self._timed = ray.remote(num_cpus=1, max_retries=0)(_run_timed)
        log.info("Ray executor: %d tasks at once on the cluster at %s (%d CPUs)", self.workers,
                 ray.get_runtime_context().gcs_address, cpus)

    def map(self, fn: Callable[[Any], Any], items: Iterable[Any]) -> Iterator[Outcome]:
        ray = _import_ray()
        fn_ref = ray.put(fn)  # shipped once, not with every task
        if self.timeout is None:  # chunks through the shared in-order window
            return windowed(items, chunk_size=self.chunk_size, limit=self.workers * self.window,
                            submit=lambda chunk: self._task.remote(fn_ref, chunk),
                            collect=lambda ref, chunk: self._collect(ray, fn_ref, ref, chunk),
                            cancel=lambda ref: ray.cancel(ref, force=True))
        return self._map_timed(ray, fn_ref, items)

    def _map_timed(self, ray: Any, fn_ref: Any, items: Iterable[Any]) -> Iterator[Outcome]:
        """One item per task, ``workers`` at once, each timed from its start marker."""
        it = iter(items)
        inflight: collections.deque = collections.deque()

        def submit() -> bool:
            for item in it:
                inflight.append(_Timed(self._timed.remote(fn_ref, item)))
                return True
            return False

        more = True
        try:
            while more and len(inflight) < self.workers:
                more = submit()
            while inflight:
                outcome = self._await_timed(ray, inflight)
                inflight.popleft()
                if more:
                    more = submit()
                yield outcome
        finally:
            for entry in inflight:  # abandoned (Ctrl-C, a writer error): stop the work
                ray.cancel(entry.gen, force=True)

    def _collect(self, ray: Any, fn_ref: Any, ref: Any, chunk: list[Any]) -> list[Outcome]:
        try:
            return ray.get(ref)
        except ray.exceptions.RayError as e:
            if len(chunk) > 1:  # find the item(s) that crash: rerun one item per task
                refs = [self._task.remote(fn_ref, [item]) for item in chunk]
                return [o for r, item in zip(refs, chunk) for o in self._collect(ray, fn_ref, r, [item])]
            log.warning("Ray task failed: %s", e)  # the details (pid, traceback) go to the log only
            if isinstance(e, ray.exceptions.WorkerCrashedError):
                return [Outcome(False, stage="crash", reason=CRASH)]
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
                            False, stage="crash", reason=CRASH)
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


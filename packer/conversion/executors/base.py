"""The executor interface and what every executor shares: ``Outcome``, ``call_safely``,
the in-process executor, the worker start-up hook, the text for a dead worker's exit and
``windowed``, the one in-order window loop every pool-backed executor runs."""
from __future__ import annotations

import collections
import itertools
import logging
import signal
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence, TypeVar

from packer.errors import CorruptSample
from packer.formats.sample import Sample

__all__ = ["Outcome", "Executor", "InlineExecutor", "call_safely", "run_chunk", "worker_init", "exit_text",
           "CRASH", "windowed", "BackgroundClose"]

log = logging.getLogger(__name__)

CRASH = "worker process died (a crash or a kill)"


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


def run_chunk(fn: Callable[[Any], Any], chunk: Sequence[Any]) -> list[Outcome]:
    return [call_safely(fn, item) for item in chunk]


def worker_init() -> None:
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

    def map_runs(self, fn: Callable[[Any], Any], items: Iterable[Any]) -> Iterator[Any]:
        """``map`` as the conversion loop takes it: an executor whose workers store the samples
        themselves may hand back consecutive inputs that gave one stored sample each as one
        ``packer.formats.segments.StoredSamples`` (``Writer.add_stored`` takes them at once, with
        no ``Outcome`` or ``Sample`` per input); every other input as its ``Outcome``. The
        default: ``map``."""
        return self.map(fn, items)

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


H = TypeVar("H")


def windowed(items: Iterable[Any], *, chunk_size: int, limit: int, submit: Callable[[list[Any]], H],
             collect: Callable[[H, list[Any]], list[Outcome]],
             cancel: Optional[Callable[[H], None]] = None) -> Iterator[Outcome]:
    """The in-order window loop: cut ``items`` into chunks of ``chunk_size``, keep at most
    ``limit`` chunks in flight (``submit(chunk) -> handle``), and yield each chunk's outcomes
    (``collect(handle, chunk)``, one Outcome per item) in input order, submitting the next chunk
    as each one is collected. Memory stays flat however slow the consumer is. When the consumer
    stops early (Ctrl-C, a writer error), ``cancel(handle)`` is called for what is still in flight.
    """
    it = iter(items)
    inflight: collections.deque = collections.deque()

    def more() -> bool:
        chunk = list(itertools.islice(it, chunk_size))
        if chunk:
            inflight.append((submit(chunk), chunk))
        return bool(chunk)

    going = True
    try:
        while going and len(inflight) < limit:
            going = more()
        while inflight:
            handle, chunk = inflight[0]
            outcomes = collect(handle, chunk)
            inflight.popleft()
            if going:
                going = more()
            yield from outcomes
    finally:
        if cancel is not None:
            for handle, _ in inflight:
                cancel(handle)


def exit_text(code: Optional[int]) -> str:
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}"


class BackgroundClose:
    """Close an executor on a thread of its own once its work is done (``start``), and wait
    for that in ``wait`` (which closes it here when ``start`` never ran). A process pool's
    shutdown takes 50-100 ms (pebble's manager threads poll every 0.1 s); started when the
    last video's result is in, it runs beside the final commit and the summary instead of
    after them. An error closing it is raised by ``wait``."""

    def __init__(self, executor: Any):
        self.executor = executor
        self._thread: Optional[threading.Thread] = None
        self._error: Optional[BaseException] = None

    def _close(self) -> None:
        try:
            self.executor.close()
        except BaseException as e:  # handed to wait()
            self._error = e

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._close, name="executor-close", daemon=True)
            self._thread.start()

    def wait(self) -> None:
        if self._thread is None:
            self.executor.close()
            return
        self._thread.join()
        if self._error is not None:
            raise self._error


@dataclass
class WorkResult:
    """What one item's work produced: samples to pack, an optional manifest entry (a video)
    and an optional note that does not fail the item (``stage: "partial"``)."""

    samples: list[Sample]
    entry: dict[str, Any] | None = None
    note: dict[str, Any] | None = None


def as_result(value: Any) -> WorkResult:
    if isinstance(value, WorkResult):
        return value
    if isinstance(value, Sample):
        return WorkResult([value])
    return WorkResult(list(value))

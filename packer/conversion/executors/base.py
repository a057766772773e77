"""The executor interface and what every executor shares: ``Outcome``, ``call_safely``,
the in-process executor, the worker start-up hook and the text for a dead worker's exit."""
from __future__ import annotations

import logging
import signal
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence

from packer.errors import CorruptSample

__all__ = ["Outcome", "Executor", "InlineExecutor", "call_safely", "run_chunk", "worker_init", "exit_text",
           "CRASH"]

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


def exit_text(code: Optional[int]) -> str:
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}"


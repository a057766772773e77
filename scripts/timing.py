"""How long the suite waits before calling something hung, on a machine that may be busy.

Every wall-clock bound of the suite (a subprocess ``timeout=``, a polling deadline, the per-test
pytest timeout) is written for an idle machine and passed through :func:`scaled`, which
multiplies it by :func:`factor`: ``PACKER_TEST_TIME_FACTOR`` when set (>= 1), else the
one-minute load average per usable core (never below 1, at most ``MAX_FACTOR``). A bound only
decides when a wait that would never end is called a failure; no test asserts that something
was fast. CONTRIBUTING.md says how to run the suite under load. It lives in scripts/ because the test servers (`scripts/servers.py`) scale their waits the same way, and scripts import nothing from tests.
"""
from __future__ import annotations

import os

__all__ = ["factor", "scaled", "MAX_FACTOR"]

MAX_FACTOR = 8.0


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def factor() -> float:
    """How much slower than idle this machine runs now (>= 1)."""
    forced = os.environ.get("PACKER_TEST_TIME_FACTOR")
    if forced:
        return max(1.0, float(forced))
    try:
        load = os.getloadavg()[0]
    except OSError:  # pragma: no cover - no load average on this platform
        return 1.0
    return min(MAX_FACTOR, max(1.0, load / _cores()))


def scaled(seconds: float) -> float:
    """``seconds`` (an idle machine's bound) stretched by :func:`factor`."""
    return seconds * factor()

"""Item executors run one work function over many items and yield outcomes in input order.

Every executor has the same signature (``map(fn, items)``), so the converter never knows
whether work runs inline, in a local process pool, one item per isolated worker or on Ray.
A work function's exceptions never escape: each becomes a failed ``Outcome`` for that item.
The pack plans' executors (staged, sharded, shared memory) live with the plans, in
``packer.conversion.plans``, and share this interface (``base``).
"""
from __future__ import annotations

import logging
import os
from typing import Any

from packer.conversion.executors.base import Executor, InlineExecutor, Outcome, call_safely
from packer.conversion.options import EXECUTORS
from packer.errors import UsageError

__all__ = ["Outcome", "Executor", "InlineExecutor", "LocalExecutor", "IsolatedExecutor", "RayExecutor",
           "EXECUTORS", "make_executor", "call_safely"]


log = logging.getLogger(__name__)


def __getattr__(name: str) -> Any:
    # imported on first use: Ray is optional and heavy, and the pebble pools (with asyncio, ~26 ms
    # of a small pack's start) serve only item-by-item work, not the pack plans
    if name == "RayExecutor":
        from packer.conversion.executors.ray import RayExecutor

        return RayExecutor
    if name == "LocalExecutor":
        from packer.conversion.executors.local import LocalExecutor

        return LocalExecutor
    if name == "IsolatedExecutor":
        from packer.conversion.executors.isolated import IsolatedExecutor

        return IsolatedExecutor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def make_executor(name: str = "local", *, workers: int | None = None, timeout: float | None = None,
                  isolate: bool = False, address: str | None = None) -> Executor:
    """The item-executor factory, by name: ``local`` (process pool; inline when workers <= 1)
    or ``ray`` (``ray:ADDRESS`` or ``address=`` joins a cluster; workers None or 0 = the
    cluster's CPUs). A pack command's plan builds its own executor (``packer.conversion.plans``),
    using this one for its ``pool`` plan.

    With ``timeout`` (seconds per item) or ``isolate``, ``local`` runs each item alone in a
    worker (``IsolatedExecutor``, even for one worker), so a hang or a crash costs one item;
    ``workers=0`` still runs in this process, where neither can be contained. ``ray`` always
    runs items in Ray's worker processes (crashes are contained) and enforces ``timeout``.
    """
    name, _, named_address = name.partition(":")
    if workers is not None and workers < 0:
        raise UsageError("--workers must be >= 0")
    if timeout is not None and not timeout > 0:
        raise UsageError("--timeout must be > 0 seconds")
    if name == "ray":
        from packer.conversion.executors.ray import RayExecutor

        return RayExecutor(workers=workers or None, address=address or named_address or None, timeout=timeout)
    if workers is None:
        workers = os.cpu_count() or 1
    if name == "local":
        if (timeout is not None or isolate) and workers >= 1:
            from packer.conversion.executors.isolated import IsolatedExecutor

            return IsolatedExecutor(workers=workers, timeout=timeout)
        if workers <= 1:
            if timeout is not None:
                log.warning("--workers 0 runs in this process: the per-item timeout is not enforced")
            return InlineExecutor()
        from packer.conversion.executors.local import LocalExecutor

        return LocalExecutor(workers=workers)
    raise UsageError(f"unknown executor {name!r} (known: {', '.join(EXECUTORS)})")

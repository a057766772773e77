"""Executors run one work function over many items and yield outcomes in input order.

Every executor has the same signature (``map(fn, items)``), so the converter never knows
whether work runs inline, in a local process pool, one item per isolated worker or on Ray.
A work function's exceptions never escape: each becomes a failed ``Outcome`` for that item.
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
                  isolate: bool = False, mode: str = "pool", writer: Any = None, **options: Any) -> Executor:
    """The one executor factory: by name, ``local`` (process pool; inline when workers <= 1) or
    ``ray`` (``ray:ADDRESS`` or ``address=`` joins a cluster; workers None or 0 = the cluster's
    CPUs); or, for a pack command, the ``mode`` its ``plans.Plan`` chose, for ``writer``
    (an unopened Writer): ``inline``, ``staged`` (verdict workers), ``sharded`` (workers store
    the writer's segments), ``shm`` (workers encode into shared memory) or ``pool`` (by name).

    With ``timeout`` (seconds per item) or ``isolate``, ``local`` runs each item alone in a
    worker (``IsolatedExecutor``, even for one worker), so a hang or a crash costs one item;
    ``workers=0`` still runs in this process, where neither can be contained. ``ray`` always
    runs items in Ray's worker processes (crashes are contained) and enforces ``timeout``.
    """
    name, _, address = name.partition(":")
    if workers is not None and workers < 0:
        raise UsageError("--workers must be >= 0")
    if mode != "pool":
        return _plan_executor(mode, workers or 0, writer)
    if timeout is not None and not timeout > 0:
        raise UsageError("--timeout must be > 0 seconds")
    if name == "ray":
        from packer.conversion.executors.ray import RayExecutor

        return RayExecutor(workers=workers or None, address=options.pop("address", None) or address or None,
                           timeout=timeout, **options)
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


# Two pool engines, on purpose: ``LocalExecutor``/``IsolatedExecutor`` (pebble: one item or chunk
# per task, a per-item timeout, a crash costs its item) for work worth shipping item by item, and
# ``RangePool`` (ranges.py: the items go to each worker once, then only index ranges) for the pack
# plans' cheap per-item work, where pickling every item out and its sample back costs the
# writer's process as much as the work: to-lmdb --check header on 2 workers, 3,000 JPEGs, ran
# 1.70x faster on wall (1.21x in the CPU model, median of rounds) with RangePool verdicts than
# with the pebble pool handing back samples, in one run of ``python -m scripts.bench.write write``
# (a loaded 2-core machine; the row pair "2 workers: RangePool verdicts / pebble pool samples").
def _plan_executor(mode: str, workers: int, writer: Any) -> Executor:
    if mode == "inline":
        return InlineExecutor()
    if mode == "staged":
        from packer.conversion.plans.staged import StagedExecutor

        return StagedExecutor(workers=workers)
    if mode == "sharded":
        from packer.conversion.plans.sharded import ShardedExecutor

        return ShardedExecutor(workers=workers, writer=writer)
    if mode == "shm":
        from packer.conversion.plans.shm import SharedMemoryExecutor

        return SharedMemoryExecutor(workers=workers, prepare=type(writer).prepare, views=True)
    raise UsageError(f"unknown executor mode {mode!r} (inline, staged, sharded, shm, pool)")

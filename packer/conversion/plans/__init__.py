"""Pack plans: how a pack command uses every core, which plan it runs, and the executor and
work function each plan runs.

The writer (one process) only appends or puts. Everything else runs beside it:

* **verdicts** (``staged``: ``packer.conversion.plans.staged``): worker processes read each
  file and check it (header parse or full decode) and hand back only a small ``Verdict``
  (format, size, length, CRC32C of the bytes they checked); the writer process reads the
  page-cached file again in a thread (file reads and CRC32C release the GIL), checks that its
  length and CRC32C match the verdict (a file changed in between is a recorded failure, never a
  silent mismatch) and builds the sample. No sample's bytes cross a process boundary.
* **sharded writers** (``sharded``, records and HDF5: ``packer.conversion.plans.sharded``): the
  workers store the samples in part files themselves; the writer only takes them over (records:
  renames whole shards; HDF5: copies each commit's bytes in from the parts, CRC-checked).
* **shared memory** (``shm``, LMDB: ``packer.conversion.plans.shm``): the workers read, check
  and encode each sample (the writer's ``prepare``: its Datum and CRC32C) into memory shared
  with the writer, which only puts the values; each sample's bytes are copied into the shared
  mapping once and out of it once, by the put.

The three run on one pool engine, ``RangePool`` (``packer.conversion.plans.ranges``: the items
go to each worker once, then only index ranges). ``choose_plan`` picks between those, a plain
item executor (``pool``: ``packer.conversion.executors``, local or Ray) and in-process work
(``inline``) from what the command asks (``--check``, resize), what the Writer class declares
and the cores there are, from the measurements in ``docs/writing.md``; ``--workers 0`` always
means in this process. ``Plan.executor(writer)`` builds the plan's executor and
``Plan.job_for(job)`` the work function it runs.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

from packer.conversion.executors import Executor, InlineExecutor, make_executor
from packer.conversion.plans.shm import available as shm_available

__all__ = ["Plan", "choose_plan", "CHEAP_CHECKS"]

log = logging.getLogger(__name__)

CHEAP_CHECKS = ("none", "header")


# One pool engine under the plans, measured against the item executors' pebble pool: pickling
# every item out and its sample back costs the writer's process as much as the plans' cheap
# per-item work. to-lmdb --check header on 2 workers, 3,000 JPEGs, ran 1.70x faster on wall
# (1.21x in the CPU model, median of rounds) with RangePool verdicts than with the pebble pool
# handing back samples, in one run of ``python -m scripts.bench.write write`` (a loaded 2-core
# machine; the row pair "2 workers: RangePool verdicts / pebble pool samples").
@dataclass(frozen=True)
class Plan:
    """How a pack command runs: ``mode`` is ``inline`` (this process), ``pool`` (the item
    executor named ``item_executor``, ``--executor``: worker processes hand back whole samples),
    ``staged`` (verdicts, see ``StagedExecutor``), ``sharded`` (the workers write record shards
    themselves) or ``shm`` (the workers encode into shared memory, the writer puts); ``workers``
    processes."""

    mode: str
    workers: int
    why: str
    item_executor: str = "local"

    def executor(self, writer: Any) -> Executor:
        """This plan's executor for ``writer`` (an unopened Writer); ``pool`` builds the item
        executor by name (``make_executor``)."""
        if self.mode == "pool":
            return make_executor(self.item_executor, workers=self.workers)
        if self.mode == "inline":
            return InlineExecutor()
        if self.mode == "staged":
            from packer.conversion.plans.staged import StagedExecutor

            return StagedExecutor(workers=self.workers)
        if self.mode == "sharded":
            from packer.conversion.plans.sharded import ShardedExecutor

            return ShardedExecutor(workers=self.workers, writer=writer)
        if self.mode == "shm":
            from packer.conversion.plans.shm import SharedMemoryExecutor

            return SharedMemoryExecutor(workers=self.workers, prepare=type(writer).prepare, views=True,
                                        pieces=getattr(type(writer), "prepare_pieces", None))
        raise ValueError(f"unknown plan mode {self.mode!r} (inline, pool, staged, sharded, shm)")

    def job_for(self, job: Any) -> Any:
        """The work function this plan runs: ``VerdictJob`` for ``staged`` (the writer encodes
        each value itself: its ``prepare`` on the completion thread did not pay, to-records
        --samples-per-shard 250 --workers 2 spent the same CPU without it, 1.00x median of 21
        paired rounds), else ``job`` itself."""
        if self.mode == "staged":
            from packer.conversion.plans.staged import VerdictJob

            return VerdictJob(job)
        return job


def choose_plan(*, writer: type, check: str, workers: int | None, resizing: bool, executor: str = "local",
                cores: int | None = None, fixed_layout: bool = False, fields: bool = False) -> Plan:
    """The fastest way to run a pack command, from what it asks, what its ``writer`` class
    declares (``segments``: workers may store its samples in parts; ``keeps_samples``: it holds
    on to each sample after ``add``) and the cores there are.

    ``workers`` is ``--workers`` (None: the default, every core). ``fields``: the work builds
    each sample's bytes (a field pack's blob: its masks drawn, its fields encoded), so, as for
    a resize, there is no verdict-only form and no per-sample work cheap enough to keep in the
    writer's process. The rules come from ``python -m scripts.bench.write`` (see
    ``docs/writing.md``):

    * ``--workers 0`` (or 1, or one core): in this process, as always.
    * a writer whose parts are its output (``segments.indexed``: records): the workers write
      their own shards (``sharded``): no single writer to wait on; not with
      ``--samples-per-shard`` (``fixed_layout``: every shard holds exactly N records, which only
      one writer can promise when inputs fail).
    * a cheap check (``header``/``none``) into LMDB/HDF5 without resize, ``--workers`` not
      given: in this process. The per-sample work (a header parse) costs less than handing it
      to another process and back, so the single writer is fastest alone.
    * a field pack into a writer with parts (HDF5): the plain pool; the writer splits each blob
      into the fields' datasets itself, so workers cannot store parts for it.
    * otherwise a writer with parts (HDF5; a full check, a resize or an explicit ``--workers``): ``sharded`` too, the
      workers storing the samples in part files the writer copies into the one file at each
      commit (its process spent 99 against verdict workers' 131 µs per sample in
      ``python -m scripts.bench.write full``).
    * otherwise a writer that copies each value during ``add`` (LMDB), on a ``fork`` platform:
      ``shm``: workers read, check or resize and encode into shared memory, the writer's
      process only puts.
    * resize (new bytes are made in the worker): the plain pool; the new bytes cross once.
    * otherwise (``--samples-per-shard``, LMDB where ``fork`` is missing): verdict workers (only
      a small description crosses back).
    """
    cores = cores or os.cpu_count() or 1
    resizing = resizing or fields  # (below: "the work makes new bytes")
    if executor.partition(":")[0] != "local":
        return Plan("pool", workers or 0, f"--executor {executor}: the work goes to its workers", executor)
    n = cores if workers is None else workers
    if n <= 1:
        return Plan("inline", 0, "one worker or none: in this process")
    name = getattr(writer, "format_name", writer.__name__)
    segments = writer.segments if not fixed_layout else None
    if segments is not None and segments.indexed:  # records: the parts are the shards, nothing copied
        return Plan("sharded", n, f"{name}: each worker writes its own shards")
    if check in CHEAP_CHECKS and workers is None and not resizing:
        return Plan("inline", 0, f"--check {check}: a header parse costs less than handing it to "
                                 "another process; the writer is fastest alone")
    if segments is not None and fields:  # an HDF5 field pack: its writer splits each blob into the fields' datasets
        return Plan("pool", n, f"{name}: workers make the field blobs and hand them back once; the writer "
                               "splits them into the fields' datasets")
    if segments is not None:  # HDF5: the writer copies the parts in (less than reading and checking)
        return Plan("sharded", n, f"{name}: each worker stores its samples in part files of its own, "
                                  "the writer copies them in")
    if not writer.keeps_samples and shm_available():
        return Plan("shm", n, f"{name}: workers read, check and encode into shared memory; the writer "
                              "only stores")
    if resizing:
        made = "field blobs" if fields else "resize"
        return Plan("pool", n, f"{made}: workers make the new bytes and hand them back once")
    if fixed_layout:
        return Plan("staged", n, "--samples-per-shard: one writer keeps the layout; workers check")
    return Plan("staged", n, f"--check {check}: workers check, hand back a verdict; the writer reads "
                             "the page-cached file")

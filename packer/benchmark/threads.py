"""``packer bench`` extras: does the pipeline scale with threads, and how well do orders mix classes.

Thread scaling: the same samples loaded by ``packer.Loader`` with 1 thread and with N threads,
each in a fresh process (``packer.benchmark.fresh``), as a training script would load them.
JPEG decode, resize and copies release the GIL, so a packer pipeline scales with threads; a
Python-heavy transform holds the GIL and does not (then worker processes, the DataLoader, are
the right tool). Mixing: distinct classes per batch of the orders a training run would read
(stored order, ``StreamingDataset``'s default order) against a truly random batch.
"""
from __future__ import annotations

import importlib
import os
import threading
import time
from typing import Any, Callable

import numpy as np

from packer.errors import UsageError

__all__ = ["load_transform", "loader_rate", "thread_scaling", "gil_verdict", "order_mixing", "format_extras", "GIL_BOUND_BELOW"]

GIL_BOUND_BELOW = 1.3  # N threads must beat 1 thread by this much, or the pipeline holds the GIL
MIXING_LABEL_LIMIT = 200_000  # read every label up to this many samples; beyond, a strided sample


def load_transform(spec: str | None) -> Callable[[Any], Any] | None:
    """``"module:name"`` -> that callable (``--transform``); None stays None."""
    if spec is None:
        return None
    module, _, name = spec.partition(":")
    if not module or not name:
        raise UsageError(f"--transform must look like module:callable, not {spec!r}")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise UsageError(f"--transform {spec}: {e}") from e
    if not callable(fn):
        raise UsageError(f"--transform {spec}: not callable")
    return fn


def loader_rate(dataset: Any, *, threads: int, batch_size: int, batches: int) -> float:
    """samples/s of ``packer.Loader(num_threads=threads)`` over the first ``batches`` batches of
    ``dataset``, after the first (which opens storage and allocates buffers)."""
    from packer.data.loader import Loader

    n = min(len(dataset), batches * batch_size)
    sampler = list(range(n))
    loader = Loader(dataset, batch_size=batch_size, sampler=sampler, num_threads=threads, pin_memory=False)
    it = iter(loader)
    next(it)  # warm: open storage, allocate buffers
    start, count = time.perf_counter(), 0
    for images, *_ in it:
        count += len(images)
    return count / max(time.perf_counter() - start, 1e-9)


def _gil_free_scaling(threads: int, seconds: float = 0.25) -> float:
    """How much ``threads`` threads of work that never holds the GIL (SHA-256 of 1 MB, which
    releases it) beat one thread right now: the scaling this machine can give at the moment."""
    import hashlib

    data = bytes(1 << 20)

    def rate(n: int) -> float:
        counts = [0] * n
        stop = time.perf_counter() + seconds

        def work(k: int) -> None:
            while time.perf_counter() < stop:
                hashlib.sha256(data).digest()
                counts[k] += 1

        pool = [threading.Thread(target=work, args=(k,)) for k in range(n)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        return sum(counts) / seconds

    return rate(threads) / max(rate(1), 1e-9)


def thread_scaling(spec: dict[str, Any], *, runner: Any, batch_size: int, batches: int = 8,
                   threads: int | None = None) -> dict[str, Any]:
    """samples/s of ``packer.Loader`` with 1 and with ``threads`` threads over the same samples,
    each in a fresh process of ``runner`` (a ``packer.benchmark.fresh.FreshProcesses``;
    ``spec``: the dataset's ``path``, ``decode``, ``resize``, ``crop``, ``transform``, as
    ``fresh.child`` takes them), next to the scaling GIL-free work gets on this machine at
    the same time (``available``). ``process``: what each of the two processes cost, keyed by
    thread count (``FreshProcesses.run``'s figures with the ``window``)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    threads = threads or max(2, min(cpus, 4))
    runs = {n: runner.run({**spec, "kind": "threads", "threads": n, "batch_size": batch_size, "batches": batches + 1})
            for n in (1, threads)}
    one, many = runs[1]["samples_per_s"], runs[threads]["samples_per_s"]
    available = _gil_free_scaling(threads) if cpus >= 2 else 1.0
    scaling = many / max(one, 1e-9)
    return {"threads": threads, "one_thread_samples_per_s": one, "samples_per_s": many, "scaling": scaling,
            "available": available, "cpus": cpus,
            "process": {str(n): {**r["process"], "window": r["window"]} for n, r in runs.items()},
            **gil_verdict(scaling, cpus=cpus, threads=threads, available=available)}


def gil_verdict(scaling: float, *, cpus: int, threads: int, available: float | None = None) -> dict[str, Any]:
    """Whether a pipeline holds the GIL, from its thread scaling, and what to use.

    ``available``: the scaling GIL-free work got at the same time; when the machine is too busy
    to give threads a second core (< 1.3x), nothing can be concluded."""
    if cpus < 2:
        return {"holds_gil": None, "advice": "1 CPU: thread scaling cannot be measured here"}
    if available is not None and available < GIL_BOUND_BELOW:
        return {"holds_gil": None,
                "advice": (f"the CPUs are busy (GIL-free work gets only {available:.2f}x from {threads} threads "
                           f"now): thread scaling cannot be judged; re-run on a quieter machine")}
    if scaling < GIL_BOUND_BELOW:
        return {"holds_gil": True,
                "advice": (f"the pipeline holds the GIL ({threads} threads give {scaling:.2f}x one thread, "
                           f"below {GIL_BOUND_BELOW}x, where GIL-free work gets {available or 0:.2f}x): use the "
                           f"DataLoader with worker processes, not packer.Loader")}
    return {"holds_gil": False,
            "advice": (f"the pipeline releases the GIL ({threads} threads give {scaling:.2f}x one thread): "
                       f"packer.Loader(num_threads=...) avoids the workers' pickling and shared-memory copies")}


def _labels(reader: Any, indices: np.ndarray) -> np.ndarray:
    return np.array([reader.read(int(i)).label for i in indices], dtype=np.int64)


def order_mixing(dataset: Any, *, batch_size: int, batches: int = 50) -> dict[str, Any] | None:
    """Distinct classes per batch in stored order and in ``StreamingDataset``'s default order,
    against the iid expectation (exact, from the class frequencies). None with one class."""
    from packer.data.mixing import iid_distinct, mixing_report
    from packer.data.streaming import DEFAULT_BLOCK_SIZE, DEFAULT_BUFFER_SIZE, rank_order_array

    reader = dataset.reader
    n = len(reader)
    if len(reader.classes) < 2 or n < batch_size:
        return None
    if n <= MIXING_LABEL_LIMIT:
        all_labels = _labels(reader, np.arange(n))
        counts = np.bincount(all_labels, minlength=len(reader.classes))
        label_of = all_labels.__getitem__
    else:  # class frequencies from a strided sample, scaled up
        probe = np.linspace(0, n - 1, MIXING_LABEL_LIMIT // 10).astype(np.int64)
        counts = np.bincount(_labels(reader, probe), minlength=len(reader.classes)) * (n / len(probe))
        label_of = (lambda idx: _labels(reader, idx))
    shard_counts = list(getattr(reader, "shard_counts", None) or [n])
    take = min(n, batches * batch_size)
    orders = {"stored": np.arange(take),
              "streaming": rank_order_array(shard_counts, seed=0, epoch=0, shuffle=True, buffer_size=DEFAULT_BUFFER_SIZE,
                                            rank=0, world_size=1, drop_last=False, block_size=DEFAULT_BLOCK_SIZE)[:take]}
    out: dict[str, Any] = {"batch_size": batch_size, "iid": iid_distinct(np.round(counts).astype(int), batch_size)}
    for name, order in orders.items():
        rep = mixing_report(label_of(order), batch_size, class_counts=np.round(counts).astype(int))
        out[name] = {"median": rep["median"], "p10": rep["p10"], "ratio": rep["ratio"]}
    return out


def format_extras(r: dict[str, Any]) -> list[str]:
    """The report lines of ``threads`` and ``mixing``."""
    lines = []
    t, m = r.get("threads"), r.get("mixing")
    if t:
        lines.append(f"threads: packer.Loader {t['samples_per_s']:.0f} samples/s with {t['threads']}, "
                     f"{t['one_thread_samples_per_s']:.0f} with 1 (each a fresh process): {t['advice']}")
    if m:
        lines.append(f"mixing: distinct classes per {m['batch_size']}-batch (median): stored order "
                     f"{m['stored']['median']:.0f} ({m['stored']['ratio']:.2f}x iid), StreamingDataset default "
                     f"{m['streaming']['median']:.0f} ({m['streaming']['ratio']:.2f}x), iid {m['iid']:.1f}")
    return lines

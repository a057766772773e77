"""How well batches mix classes: distinct classes per batch against a truly random batch.

A class-sorted pack read shard by shard gives batches of few classes, which quietly hurts
BatchNorm and convergence. ``distinct_per_batch`` measures an order; ``iid_distinct`` is the
expectation for batches drawn uniformly at random without replacement, computed exactly from
the class frequencies (no simulation): ``sum_c 1 - C(N - n_c, B) / C(N, B)``.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

__all__ = ["distinct_per_batch", "iid_distinct", "mixing_report"]


def distinct_per_batch(labels: Sequence[int], batch_size: int) -> np.ndarray:
    """Distinct labels in each full batch of ``labels`` (in reading order; a partial tail is left out)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, not {batch_size}")
    arr = np.asarray(labels, dtype=np.int64)
    full = len(arr) // batch_size
    return np.array([len(np.unique(arr[k * batch_size:(k + 1) * batch_size])) for k in range(full)], dtype=np.int64)


def iid_distinct(class_counts: Sequence[int], batch_size: int) -> float:
    """Expected distinct classes in a batch of ``batch_size`` drawn uniformly without replacement
    from a dataset holding ``class_counts[c]`` samples of class ``c``."""
    counts = [int(c) for c in class_counts if int(c) > 0]
    n = sum(counts)
    if not 1 <= batch_size <= n:
        raise ValueError(f"batch_size must be in [1, {n}], not {batch_size}")

    def log_choose(a: int, b: int) -> float:
        return math.lgamma(a + 1) - math.lgamma(b + 1) - math.lgamma(a - b + 1)

    total = log_choose(n, batch_size)
    expected = 0.0
    for c in counts:
        absent = 0.0 if n - c < batch_size else math.exp(log_choose(n - c, batch_size) - total)
        expected += 1.0 - absent
    return expected


def mixing_report(labels: Sequence[int], batch_size: int, class_counts: Sequence[int] | None = None) -> dict:
    """Median/p10 distinct classes per batch of an order, the iid expectation and their ratio.

    ``class_counts`` defaults to the frequencies in ``labels`` (a whole epoch's order)."""
    arr = np.asarray(labels, dtype=np.int64)
    if class_counts is None:
        class_counts = np.bincount(arr).tolist() if len(arr) else []
    per = distinct_per_batch(arr, batch_size)
    if not len(per):
        raise ValueError(f"fewer than {batch_size} labels: no full batch to measure")
    iid = iid_distinct(class_counts, batch_size)
    median = float(np.median(per))
    return {"batch_size": batch_size, "batches": int(len(per)), "median": median,
            "p10": float(np.percentile(per, 10)), "iid": iid, "ratio": median / iid}

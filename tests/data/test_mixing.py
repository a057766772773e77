"""Distinct classes per batch and its iid expectation (exact, checked against enumeration)."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packer.data.mixing import distinct_per_batch, iid_distinct, mixing_report


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 3), min_size=1, max_size=4), st.integers(1, 6))
def test_iid_expectation_equals_enumeration(counts, batch):
    labels = [c for c, n in enumerate(counts) for _ in range(n)]
    if batch > len(labels):
        with pytest.raises(ValueError):
            iid_distinct(counts, batch)
        return
    combos = list(itertools.combinations(range(len(labels)), batch))
    exact = sum(len({labels[i] for i in combo}) for combo in combos) / len(combos)
    assert iid_distinct(counts, batch) == pytest.approx(exact, rel=1e-9)


def test_distinct_per_batch_and_report():
    assert distinct_per_batch([0, 0, 1, 2, 2, 2, 3], 3).tolist() == [2, 1]
    sorted_labels = np.repeat(np.arange(200), 300)
    report = mixing_report(sorted_labels, 256)
    assert report["median"] == 2 and report["iid"] == pytest.approx(144.72, abs=0.01)
    shuffled = mixing_report(np.random.default_rng(0).permutation(sorted_labels), 256)
    assert 0.97 <= shuffled["ratio"] <= 1.03
    with pytest.raises(ValueError):
        mixing_report([1, 2], 3)

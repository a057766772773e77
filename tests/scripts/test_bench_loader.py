"""scripts/bench_loader.py stays runnable: a smoke run of every part on tiny data."""
from __future__ import annotations

import importlib.util
import sys

import pytest

from tests.support import REPO



@pytest.mark.slow
def test_smoke_run(tmp_path, capsys, monkeypatch):
    spec = importlib.util.spec_from_file_location("bench_loader", REPO / "scripts" / "bench_loader.py")
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench_loader", mod)
    spec.loader.exec_module(mod)
    rc = mod.main(["--workdir", str(tmp_path), "--images", "40", "--batch-size", "8", "--batches", "2",
                   "--repeats", "1", "--classes", "4", "--per-class", "80", "--shard", "40"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "| lmdb-jpeg |" in out and "| hdf5-raw |" in out and "Loader vs DataLoader" in out
    assert "| default (block shuffle) |" in out and "iid expectation (exact)" in out
    assert "| hdf5-raw |" in out.split("## Parts")[1]

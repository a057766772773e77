"""scripts/bench_loaders.py stays runnable: a smoke run without peers on a few images."""
from __future__ import annotations

import importlib.util
import json
import sys

import pytest

from packer.formats import FORMATS
from tests.support import REPO


@pytest.mark.slow
def test_smoke_run(tmp_path, capsys, monkeypatch):
    spec = importlib.util.spec_from_file_location("bench_loaders", REPO / "scripts" / "bench_loaders.py")
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench_loaders", mod)  # its process pool pickles by module name
    spec.loader.exec_module(mod)
    out = tmp_path / "r.json"
    rc = mod.main(["--cache-dir", str(tmp_path), "--count", "12", "--classes", "2", "--batch-size", "4",
                   "--workers", "0", "--steps", "1", "--peers", "none", "--json", str(out)])
    assert rc == 0
    report = json.loads(out.read_text())
    kinds = {(r["kind"], r["decode"]) for r in report["results"]}
    for kind in ["ceiling", *(f"packer/{f}" for f in FORMATS)]:
        assert {(kind, "packer"), (kind, "pillow")} <= kinds
    assert report["host_cost"]["uint8_path_ms"] > 0 and report["host_cost"]["cpu_float32_ms"] > 0
    printed = capsys.readouterr().out
    assert "packer/lmdb" in printed and "host-side cost per batch" in printed


@pytest.mark.slow
def test_training_smoke_run(tmp_path, capsys, monkeypatch):
    """``--training`` with packer's rows only (the peers need the bench venv)."""
    spec = importlib.util.spec_from_file_location("bench_loaders", REPO / "scripts" / "bench_loaders.py")
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench_loaders", mod)
    spec.loader.exec_module(mod)
    rc = mod.main(["--training", "--cache-dir", str(tmp_path), "--count", "40", "--classes", "2",
                   "--batch-size", "4", "--steps", "2", "--repeats", "1", "--peers", "none"])
    assert rc == 0
    printed = capsys.readouterr().out
    for row in ("packer/lmdb Loader", "packer/lmdb DataLoader", "packer/hdf5 Loader"):
        assert f"| {row} |" in printed

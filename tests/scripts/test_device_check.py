"""scripts/device_check.sh on the CPU fallback: the same steps as on a GPU, a report that says so."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "device_check.sh"
SECTIONS = {"host_cost", "normalize", "h2d", "step_loop", "gpu_decode"}


def run_check(out: Path, **env: str) -> subprocess.CompletedProcess:
    # CUDA_VISIBLE_DEVICES="" hides any GPU: this test checks the CPU fallback everywhere.
    full = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHON": sys.executable, **env}
    return subprocess.run(["bash", str(SCRIPT), str(out)], cwd=REPO, env=full, capture_output=True,
                          text=True, timeout=280)


# The suite runs the CUDA test files' CPU halves itself; here a few of them (a CPU/CUDA pair and a
# test that checks the default device) prove the script runs, parses and reports its tests.
SOME_TESTS = "bad_batches or default_device"


@pytest.mark.slow
def test_device_check_runs_on_the_cpu_and_says_so(tmp_path):
    out = tmp_path / "check"
    proc = run_check(out, DEVICE_CHECK_K=SOME_TESTS)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["bench.log", "report.json", "tests.log", "tests.xml"]
    r = json.loads((out / "report.json").read_text())
    assert r["device"] == "cpu" and r["cuda"] is False and "CPU fallback" in r["note"]
    assert SECTIONS | {"tests", "targets", "sizes", "torch", "elapsed_s"} <= set(r)
    t = r["tests"]
    assert t["failed"] == t["errors"] == 0 and t["failures"] == []
    assert t["passed"] >= 1 and t["skipped"] >= 1 and t["cuda_passed"] == 0  # CPU halves ran, CUDA ones skipped
    assert t["skip_reasons"] == {"needs CUDA": t["skipped"]}
    for name in SECTIONS:
        assert "error" not in r[name], r[name]
    assert r["host_cost"]["cpu_normalize_ms"] > 0 and r["host_cost"]["prefetcher_pageable_ms"] > 0
    assert r["normalize"]["cpu_images_per_s"] > 0 and r["normalize"]["device_images_per_s"] > 0
    assert r["h2d"]["plain_pinned_copy_gb_s"] > 0 and "not bandwidths" in r["h2d"]["note"]
    loop = r["step_loop"]
    assert 0 <= loop["loader"]["wait_fraction"] < 1 and 0 <= loop["in_memory"]["wait_fraction"] < 1
    assert loop["bottleneck"] in ("device (the model step)", "loader (the CPU side)")
    assert loop["bottleneck"].startswith("device") == loop["loader_fast_enough"]
    gd = r["gpu_decode"]  # the CPU fallback: the CPU path's own pixels, bit for bit
    assert gd["nvjpeg"] is False and gd["nvdec"] is False
    assert gd["images"]["vs_cpu_transform"]["max_abs"] == 0 and gd["images"]["device"]["per_s"] > 0
    for case in ("tsn8", "dense32"):
        v = gd["video"][case]
        assert v["vs_cpu_path"] == {"max_abs": 0, "mean_abs": 0.0, "same_shape": True}
        assert v["device"]["per_s"] > 0 and v["cpu_path"]["per_s"] > 0 and v["source_video"]["per_s"] > 0
    # GPU targets are not judged on the CPU
    assert set(r["targets"]) == {"host_cost", "normalize", "wait", "wait_in_memory"}
    assert all(v is None for v in r["targets"].values())
    assert "device_check on cpu" in proc.stdout


def test_device_check_names_missing_packages(tmp_path):
    """A python that cannot import torch (shadowed by a module that raises, as a bare machine
    would) stops the check before it runs anything, naming the package."""
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "torch.py").write_text("raise ImportError('no torch here')\n")
    out = tmp_path / "check"
    proc = run_check(out, PYTHONPATH=str(shadow), DEVICE_CHECK_WHEELS=str(tmp_path / "no-wheels"))
    assert proc.returncode == 3
    assert "MISSING Python packages: torch" in proc.stderr
    r = json.loads((out / "report.json").read_text())
    assert r["error"] == "missing Python packages" and r["missing"].split() == ["torch"]
    assert not (out / "tests.xml").exists()


def test_device_check_needs_one_argument():
    proc = subprocess.run(["bash", str(SCRIPT)], cwd=REPO, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and "usage" in proc.stderr

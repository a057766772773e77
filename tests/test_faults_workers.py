"""Worker death: a worker process that dies for real (SIGKILL like the OOM killer, SIGSEGV like
a decoder crash) in the middle of a run never hangs the conversion. For every executor (the
local pool, the isolated pool of ``decode-frames``, Ray) the run completes within a bounded
time, with exactly that item recorded in ``failures.jsonl`` (stage ``crash``, the signal) and
every other input packed; ``--max-failures`` applies to it like to any failure."""
from __future__ import annotations

import dataclasses
import json
import time

import pytest

from faults import CONVERSIONS, sources  # noqa: F401
from killing import REPO, packer_env, run_packer
from packer.formats import open_reader

HOOK = REPO / "tests" / "worker_death"  # sitecustomize.py: the worker given KEY kills itself
BOUND_S = 120  # a hang would hit this; a run takes a few seconds


def _env(key: str, sig: str) -> dict[str, str]:
    env = packer_env(PACKER_TEST_WORKER_DEATH=f"{key}:{sig}")
    env["PYTHONPATH"] = f"{HOOK}:{env['PYTHONPATH']}"
    return env


def _conv(cid: str):
    if cid == "to-records-sharded":  # without --samples-per-shard: the workers write the shards
        return dataclasses.replace(_conv("to-records"), id=cid, options=("--shard-size", "20KB"))
    return next(c for c in CONVERSIONS if c.id == cid)


# (executor id, conversion, extra argv, the input whose worker dies)
EXECUTORS = [
    # --workers 2 picks a plan (docs/writing.md): to-hdf5 with a resize the plain local pool,
    # with a full check the staged pool (verdicts in workers); to-lmdb the shared-memory workers
    ("local-pool", "to-hdf5", ("--workers", 2, "--short-side", 32), "class_1/img_0007.jpg"),
    ("staged", "to-hdf5", ("--workers", 2), "class_1/img_0007.jpg"),
    ("shm", "to-lmdb", ("--workers", 2), "class_1/img_0007.jpg"),
    # to-records --workers 2: each worker writes its own shard files (docs/writing.md); the
    # dead worker's half-written file is never adopted, its range is rerun input by input
    ("sharded", "to-records-sharded", ("--workers", 2), "class_1/img_0007.jpg"),
    ("isolated", "decode-frames-frames", ("--workers", 2), "class_0/clip_0_1.avi"),
    pytest.param("ray", "to-lmdb", ("--workers", 2, "--executor", "ray"), "class_1/img_0007.jpg",
                 marks=pytest.mark.slow, id="ray"),
]


@pytest.mark.parametrize("sig", ["SIGKILL", "SIGSEGV"])
@pytest.mark.parametrize("name,cid,argv,key", EXECUTORS)
def test_a_dead_worker_costs_its_item_only(name, cid, argv, key, sig, sources, tmp_path):
    conv = _conv(cid)
    src, out = sources[conv.source], conv.out(tmp_path)
    t = time.monotonic()
    r = run_packer(*conv.argv(src, out, *argv), env=_env(key, sig), timeout=BOUND_S)
    assert time.monotonic() - t < BOUND_S
    assert r.returncode == 0, r.stderr
    failures = [json.loads(line) for line in conv.writer.failures_path(out).read_text().splitlines()]
    crashed = [f for f in failures if f["stage"] == "crash"]
    # the kill landed: exactly the chosen item died, by the chosen signal, in a worker
    assert [f["key"] for f in crashed] == [key], failures
    assert sig in crashed[0]["reason"] or (name == "ray" and "died" in crashed[0]["reason"]), crashed
    reader = open_reader(out)
    keys = set(reader.keys) if conv.source == "images" else {v["key"] for v in reader.manifest.videos}
    assert key not in keys
    bad = {f["key"] for f in failures}
    src_keys = {p.relative_to(src).as_posix() for p in src.rglob("*") if p.is_file()}
    assert keys | bad == src_keys  # every other input became a sample (or its own failure)
    assert list(reader.verify()) == []  # every checksum (per-sample CRC32C, per-shard sha256) holds
    if not out.is_file():  # nothing a worker left half-written stays in the output
        assert [p.name for p in out.iterdir() if p.name.startswith(".")] == []


def test_max_failures_counts_a_crash(sources, tmp_path):
    conv = _conv("to-lmdb")
    out = conv.out(tmp_path)
    r = run_packer(*conv.command, sources["images"], out, "--workers", 2, "--short-side", 32, "--max-failures", 1,
                   env=_env("class_1/img_0007.jpg", "SIGKILL"), timeout=BOUND_S)
    assert r.returncode == 1 and "2 inputs failed" in r.stderr, r.stderr  # the crash + the broken file
    assert out.exists()  # every good sample is packed either way

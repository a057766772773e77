"""Worker death: a worker process that dies for real (SIGKILL like the OOM killer, SIGSEGV like
a decoder crash) in the middle of a run never hangs the conversion. For every executor (the
local pool, the isolated pool of ``decode-frames``, Ray) the run completes within a bounded
time, with exactly that item recorded in ``failures.jsonl`` (stage ``crash``, the signal) and
every other input packed; ``--max-failures`` applies to it like to any failure. A worker that
dies before the pool has read which task it took (pebble's race, lost on a busy machine) still
costs that one item: never a hang, never the whole pool."""
from __future__ import annotations

import dataclasses
import functools
import json
import threading

import pytest

from packer.conversion.executors import IsolatedExecutor, LocalExecutor
from packer.formats import open_reader
from packer.conversion.options import RunOptions
from tests.support import SUPPORT
from tests.support.acks import die_on, late_acknowledgements
from tests.support.faults import CONVERSIONS
from tests.support.killing import packer_env, run_packer
from scripts.timing import scaled

HOOK = SUPPORT / "worker_death"  # sitecustomize.py: the worker given KEY kills itself
BOUND_S = 120  # on an idle machine (scaled with its load): a hang would hit this; a run takes a few seconds


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
    # --workers 2 picks a plan (docs/writing.md): to-records --samples-per-shard (one writer keeps
    # the layout) with a resize the plain local pool, without the staged pool (verdicts in
    # workers); to-lmdb the shared-memory workers
    ("local-pool", "to-records", ("--workers", 2, "--short-side", 32), "class_1/img_0007.jpg"),
    ("staged", "to-records", ("--workers", 2), "class_1/img_0007.jpg"),
    ("shm", "to-lmdb", ("--workers", 2), "class_1/img_0007.jpg"),
    # to-records / to-hdf5 --workers 2: each worker stores its samples in part files of its own
    # (docs/writing.md); the dead worker's half-written file is never taken over, its range is
    # rerun input by input
    ("sharded", "to-records-sharded", ("--workers", 2), "class_1/img_0007.jpg"),
    ("sharded-hdf5", "to-hdf5", ("--workers", 2), "class_1/img_0007.jpg"),
    ("sharded-hdf5-resize", "to-hdf5", ("--workers", 2, "--short-side", 32), "class_1/img_0007.jpg"),
    ("isolated", "decode-frames-frames", ("--workers", 2), "class_0/clip_0_1.avi"),
    pytest.param("ray", "to-lmdb", ("--workers", 2, "--executor", "ray"), "class_1/img_0007.jpg",
                 marks=pytest.mark.slow, id="ray"),
]


@pytest.mark.parametrize("sig", ["SIGKILL", "SIGSEGV"])
@pytest.mark.parametrize("name,cid,argv,key", EXECUTORS)
def test_a_dead_worker_costs_its_item_only(name, cid, argv, key, sig, sources, tmp_path):
    conv = _conv(cid)
    src, out = sources[conv.source], conv.out(tmp_path)
    r = run_packer(*conv.argv(src, out, *argv), env=_env(key, sig), timeout=scaled(BOUND_S))  # raises if it hangs
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
                   env=_env("class_1/img_0007.jpg", "SIGKILL"), timeout=scaled(BOUND_S))
    assert r.returncode == 1 and "2 inputs failed" in r.stderr, r.stderr  # the crash + the broken file
    assert out.exists()  # every good sample is packed either way


@pytest.mark.parametrize("executor,workers,how", [("local", 1, "SIGKILL"), ("local", 2, "SIGKILL"),
                                                 ("isolated", 1, "SIGKILL"), ("isolated", 2, "SIGKILL"),
                                                 ("local", 2, "exit")])
def test_a_worker_dead_before_its_task_is_known_costs_its_item_only(executor, workers, how, tmp_path):
    """The worker takes an item and dies before the pool has read its acknowledgement (held back
    until the pool has seen the death: tests/support/acks.py). pebble alone never completed that
    item (the run hung; with 2 workers) or declared the pool broken and failed every item in
    flight (with 1). Here exactly that item fails, stage ``crash``, and the others are done."""
    pidfile = tmp_path / "dying.pid"
    ex = LocalExecutor(workers=workers, chunk_size=1, window=2) if executor == "local" else \
        IsolatedExecutor(workers=workers, timeout=scaled(120))
    late_acknowledgements(ex._pool, pidfile)
    items = ["a", "b", "die", "c"]
    got: list = []
    with ex:
        work = functools.partial(die_on, pidfile, "die", how)
        consumer = threading.Thread(target=lambda: got.extend(ex.map(work, items)), daemon=True)
        consumer.start()
        consumer.join(scaled(120))
        assert not consumer.is_alive(), "the run hung on the dead worker's item"
    assert [(o.ok, o.stage) for o in got] == [(True, ""), (True, ""), (False, "crash"), (True, "")], got
    assert ("SIGKILL" if how == "SIGKILL" else "status 3") in got[2].reason, got[2]
    assert [o.value for o in got if o.ok] == ["a", "b", "c"]


def test_a_part_file_damaged_before_the_writer_copies_it_stops_the_run(sources, tmp_path):
    """to-hdf5 with workers: a byte of a worker's part file flipped on disk after the worker wrote
    it (a bad disk, another process) is caught by the writer's CRC32C check as it copies the part
    in: the run stops with an error naming the part file and the sample, nothing of the damaged
    commit is stored, and a resume ends identical to a run in this process."""
    from tests.support.outputs import packed_snapshot
    from packer.commands.pack_images import ImageJob
    from packer.conversion.inputs import image_items
    from packer.conversion.runner import run
    from packer.conversion.plans.sharded import ShardedExecutor
    from packer.errors import CorruptData
    from packer.formats.hdf5 import HDF5Writer
    from packer.formats.segments import StoredSamples

    items, classes = image_items(sources["images"])
    damaged: list = []

    class Damaging(ShardedExecutor):
        def map_runs(self, fn, items):  # what the runner takes: runs of stored samples, other outcomes
            k = 0
            for run in super().map_runs(fn, items):
                samples = list(run.samples()) if isinstance(run, StoredSamples) else [run.value] if run.ok else []
                for sample in samples:
                    if k >= 6 and not damaged:  # past the first commits (of 4 samples)
                        stored = sample.prepared
                        with open(stored.part.path, "r+b") as f:
                            f.seek(stored.offset + stored.size // 2)
                            byte = f.read(1)[0]
                            f.seek(stored.offset + stored.size // 2)
                            f.write(bytes([byte ^ 0x01]))
                        damaged.append((sample.key, stored.part.path))
                    k += 1
                yield run

    out = tmp_path / "o.h5"
    writer = HDF5Writer(out, classes=classes, commit_every=4)
    with Damaging(workers=2, writer=writer) as ex:
        with pytest.raises(CorruptData) as e:
            run(items, ImageJob(check="header"), writer, executor=ex, options=RunOptions(max_failures=9))
    key, part = damaged[0]
    assert e.value.path == part and e.value.key == key and "changed after it was written" in str(e.value)
    assert not out.exists()
    done = json.loads(writer.resume_state_path().read_text())["items_done"]
    # the commits before it stand; the one holding the damaged sample is not among them
    assert 0 < done <= [i.key for i in items].index(key)
    resumed = HDF5Writer(out, classes=classes, commit_every=4)
    run(items, ImageJob(check="header"), resumed, options=RunOptions(max_failures=9, resume=True))
    ref = tmp_path / "ref.h5"
    run(items, ImageJob(check="header"), HDF5Writer(ref, classes=classes, commit_every=4),
        options=RunOptions(max_failures=9))
    assert packed_snapshot(out) == packed_snapshot(ref)
    assert list(open_reader(out).verify()) == []

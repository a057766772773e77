"""The write path on every core: the plan each command gets, and that every plan writes the
same dataset (byte for byte for LMDB/HDF5; the same samples, keys, order and failures for
records written by the workers themselves), verifies, merges and resumes exactly."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from packer.cli import main
from packer.commands.merge import merge_parts
from packer.commands.pack_images import ImageJob, pack_images
from packer.conversion.inputs import image_items
from packer.conversion.plans import Plan, choose_plan
from packer.conversion.plans.staged import StagedExecutor, VerdictJob
from packer.errors import CorruptSample
from packer.formats import open_reader, writer_class
from packer.commands.decode_frames import FrameOptions
from packer.conversion.options import InputOptions, RunOptions
from tests.support import REPO
from tests.support.inputs import write_image_folder
from tests.support.killing import checkpoint_at_least, packer_cmd, run_and_kill, run_packer
from tests.support.outputs import packed_snapshot
from scripts.timing import scaled


# -- the choice --------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["lmdb", "hdf5"])
@pytest.mark.parametrize("check", ["header", "none"])
def test_a_cheap_check_runs_in_process_by_default(fmt, check):
    """The default never hands cheap work to other processes: it could only be slower."""
    plan = choose_plan(writer=writer_class(fmt), check=check, workers=None, resizing=False, cores=16)
    assert plan.mode == "inline"


@pytest.mark.parametrize("fmt", ["lmdb", "hdf5", "records"])
@pytest.mark.parametrize("check", ["full", "header", "none"])
def test_workers_0_or_1_or_one_core_is_always_this_process(fmt, check):
    for workers, cores in ((0, 8), (1, 8), (None, 1)):
        plan = choose_plan(writer=writer_class(fmt), check=check, workers=workers, resizing=False, cores=cores)
        assert plan.mode == "inline" and plan.workers == 0


def test_the_other_plans():
    def mode(**kw):
        options = {"format": "lmdb", "check": "full", "workers": None, "resizing": False, "cores": 4, **kw}
        return choose_plan(writer=writer_class(options.pop("format")), **options)

    # LMDB copies each value during add: workers encode into shared memory, the writer puts
    assert mode().mode == "shm" and mode().workers == 4
    assert mode(check="header", workers=3).mode == "shm"  # asked for
    assert mode(resizing=True).mode == "shm"
    # HDF5: the workers store the samples in part files, the writer copies them in at each commit
    assert mode(format="hdf5").mode == "sharded" and mode(format="hdf5").workers == 4
    assert mode(format="hdf5", check="header", workers=3).mode == "sharded"
    assert mode(format="hdf5", resizing=True).mode == "sharded"
    assert mode(format="records", check="header").mode == "sharded"  # workers write the shards
    assert mode(format="records", fixed_layout=True).mode == "staged"  # --samples-per-shard: one writer
    assert mode(format="records", resizing=True).mode == "sharded"
    assert mode(executor="ray").mode == "pool"


@pytest.mark.parametrize("check", ["full", "header", "none"])
def test_a_field_pack_runs_on_the_image_packs_plans_never_a_verdict(check):
    """A field pack's work builds each sample's bytes (masks drawn, fields encoded): like a
    resize, never verdicts (the writer cannot re-read the blob) nor in-process by default."""
    def mode(fmt, **kw):
        return choose_plan(writer=writer_class(fmt), check=check, workers=None, resizing=False, cores=4,
                           fields=True, **kw).mode

    assert mode("lmdb") == "shm"
    assert mode("hdf5") == "pool" and mode("records") == "sharded"  # HDF5: its writer splits each blob
    assert mode("records", fixed_layout=True) == "pool"  # --samples-per-shard: one writer, blobs back
    assert choose_plan(writer=writer_class("lmdb"), check=check, workers=0, resizing=False, fields=True).mode \
        == "inline"


# -- same output whatever the plan ---------------------------------------------------------------
@pytest.fixture(scope="module")
def src(tmp_path_factory):
    root = write_image_folder(tmp_path_factory.mktemp("pw") / "src", count=90, classes=3, size=(40, 48))
    (root / "class_1" / "img_0040.jpg").write_bytes(b"broken")  # one bad input mid-way
    good = (root / "class_2" / "img_0041.jpg").read_bytes()
    (root / "class_2" / "img_0041.jpg").write_bytes(good[:len(good) * 2 // 3])  # header fine, pixels cut
    return root


def _files(out: Path) -> dict[str, bytes]:
    if out.is_file():
        return {out.name: out.read_bytes()}
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.name not in ("packer.json", "lock.mdb")}


@pytest.mark.parametrize("fmt,name", [("lmdb", "o.lmdb"), ("hdf5", "o.h5")])
@pytest.mark.parametrize("check", ["header", "full"])
def test_byte_identical_whatever_the_workers(src, tmp_path, fmt, name, check):
    """In-process (the default for a cheap check), verdict workers: the same bytes."""
    outs = {}
    for workers in (0, None, 2):
        out = tmp_path / str(workers) / name
        pack_images(src, out, format=fmt, check=check, writer_options={"commit_every": 16},
                    run_options=RunOptions(workers=workers, max_failures=2))
        outs[workers] = out
    assert _files(outs[0]) == _files(outs[None]) == _files(outs[2])
    failures = [writer_class(fmt).failures_path(out).read_text() for out in outs.values()]
    assert failures[0] == failures[1] == failures[2] and failures[0].count("\n") == (1 if check == "header" else 2)


@pytest.mark.parametrize("raw", [False, True], ids=["resized", "raw-pixels"])
def test_hdf5_parts_with_new_bytes_equal_a_single_writers_file(src, tmp_path, monkeypatch, raw):
    """to-hdf5 with a resize (and ``--raw``): the workers store the new bytes in part files, the
    writer copies them in at each commit (several commits, several pieces each): byte for byte
    the file one process writes, no part file left."""
    from packer.codecs.resize import ResizeSpec
    from packer.formats.hdf5 import writer as h5writer

    spec = ResizeSpec(size=(24, 20)) if raw else ResizeSpec(short_side=20, format="png")
    monkeypatch.setattr(h5writer, "_PIECE_BYTES", 5000)  # several pieces per commit, split mid-part
    outs = {}
    for workers in (0, 2):
        outs[workers] = tmp_path / f"w{workers}" / "o.h5"
        report = pack_images(src, outs[workers], format="hdf5", check="full", resize=spec, raw=raw,
                             writer_options={"commit_every": 16},
                             run_options=RunOptions(workers=workers, max_failures=2))
        assert report.count == 88
    assert outs[0].read_bytes() == outs[2].read_bytes()
    assert sorted(p.name for p in (tmp_path / "w2").iterdir()) == ["o.h5", "o.h5.failures.jsonl"]
    assert list(open_reader(outs[2]).verify()) == []


def test_records_written_by_the_workers_hold_the_same_dataset(src, tmp_path):
    one = pack_images(src, tmp_path / "one", format="records", check="full",
                      run_options=RunOptions(workers=0, max_failures=2))
    two = pack_images(src, tmp_path / "two", format="records", check="full", writer_options={"shard_size": "30KB"},
                      run_options=RunOptions(workers=2, max_failures=2))
    assert one.count == two.count == 88 and one.failed == two.failed == 2
    assert packed_snapshot(tmp_path / "one") == packed_snapshot(tmp_path / "two")
    manifest = open_reader(tmp_path / "two").manifest
    assert len(manifest.shards) > 2 and all(s["sha256"] and s["bytes"] <= 30_000 for s in manifest.shards)
    assert not [p.name for p in (tmp_path / "two").iterdir() if p.name.startswith(".")]  # no worker files left
    assert CliRunner().invoke(main, ["verify", str(tmp_path / "two")]).exit_code == 0


def test_parallel_written_parts_merge_like_single_writer_ones(src, tmp_path):
    merged = {}
    for workers in (0, 2):
        parts = []
        for i in range(2):
            part = tmp_path / f"w{workers}" / f"part{i}"
            pack_images(src, part, format="records", check="full",
                        input_options=InputOptions(num_shards=2, shard_index=i),
                        run_options=RunOptions(workers=workers, max_failures=2))
            parts.append(part)
        merged[workers] = tmp_path / f"merged{workers}"
        merge_parts(parts, merged[workers])
        assert CliRunner().invoke(main, ["verify", str(merged[workers])]).exit_code == 0
    assert packed_snapshot(merged[0]) == packed_snapshot(merged[2])


def test_shards_written_by_several_workers_verify_and_merge_like_single_writer_ones(src, tmp_path):
    """Small segments, so that both workers write shard files at once (pack_images' own segments
    hold >= 256 inputs: one worker would write all 45 of a part): every part verifies (CRC32C,
    sha256), and the parts merge into the same dataset as single-writer parts do."""
    from packer.conversion.inputs import partition
    from packer.conversion.runner import run
    from packer.conversion.plans.sharded import ShardedExecutor
    from packer.formats.records import RecordsWriter

    items, classes = image_items(src)
    merged = {}
    for workers in (0, 2):
        parts = []
        for i in range(2):
            part = tmp_path / f"w{workers}" / f"part{i}"
            writer = RecordsWriter(part, classes=classes, shard_size="60KB")
            if workers:
                with ShardedExecutor(workers=2, writer=writer, segment=6) as ex:  # 8 segments a part
                    run(partition(items, 2, i), ImageJob(check="full"), writer, executor=ex,
                        options=RunOptions(max_failures=2))
                assert len(open_reader(part).manifest.shards) >= 8  # a segment's end ends a shard
            else:
                run(partition(items, 2, i), ImageJob(check="full"), writer, options=RunOptions(max_failures=2))
            assert CliRunner().invoke(main, ["verify", str(part)]).exit_code == 0
            parts.append(part)
        merged[workers] = tmp_path / f"merged{workers}"
        merge_parts(parts, merged[workers], any_parts=True)
        assert CliRunner().invoke(main, ["verify", str(merged[workers])]).exit_code == 0
    assert packed_snapshot(merged[0]) == packed_snapshot(merged[2])
    assert packed_snapshot(tmp_path / "w0" / "part1") == packed_snapshot(tmp_path / "w2" / "part1")


def test_a_shard_changed_after_it_was_written_fails_verify(src, tmp_path):
    out = tmp_path / "r"
    pack_images(src, out, format="records", check="full", run_options=RunOptions(workers=2, max_failures=2))
    shard = out / open_reader(out).manifest.shards[0]["file"]
    data = bytearray(shard.read_bytes())
    data[-20] ^= 0xFF  # inside the last record's payload: CRC and sha256 both catch it
    shard.write_bytes(bytes(data))
    result = CliRunner().invoke(main, ["verify", str(out)])
    assert result.exit_code != 0 and "sha256" in result.output


@pytest.mark.slow
@pytest.mark.parametrize("fmt,name,points", [
    ("records", "k.records", ["add:5", "add:70", "journal:2"]),  # mid-shard, shard adopted but not journaled
    ("lmdb", "k.lmdb", ["add:30", "journal:3"]),
    ("hdf5", "k.h5", ["add:30", "journal:3"]),  # parts copied in, killed before / after a commit's journal
])
def test_kill_then_resume_with_parallel_writers_is_exact(src, tmp_path, fmt, name, points):
    ref = tmp_path / f"ref-{name}"
    pack_images(src, ref, format=fmt, check="full", run_options=RunOptions(workers=0, max_failures=2))
    extra = ("--shard-size", "30KB") if fmt == "records" else ("--commit-every", "8")
    for point in points:
        out = tmp_path / point.replace(":", "") / name
        base = (f"to-{fmt}", src, out, "--workers", 2, "--max-failures", 2, *extra)
        killed = run_packer(*base, kill_at=point)
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        assert not out.exists()
        writer = writer_class(fmt)(out, classes=[])
        run_and_kill(packer_cmd(*base, "--resume"), checkpoint_at_least(writer.resume_state_path(), 60))  # again
        done = run_packer(*base, "--resume")
        assert done.returncode == 0, done.stderr
        assert packed_snapshot(out) == packed_snapshot(ref)
        left = out.iterdir() if out.is_dir() else out.parent.iterdir()  # no worker files, no journals
        assert sorted(p.name for p in left if p.name.startswith(".") or "partial" in p.name) == []
        assert CliRunner().invoke(main, ["verify", str(out)]).exit_code == 0


# -- workers that die, files that change ----------------------------------------------------------
class _DiesOn:
    """Work that kills its worker process on one input (a decoder segfault)."""

    def __init__(self, key: str):
        self.key, self.job = key, ImageJob(check="header")

    def __call__(self, item):
        if item.key == self.key:
            os._exit(3)
        return self.job(item)


@pytest.mark.parametrize("fmt,mode", [("records", "sharded"), ("hdf5", "sharded"), ("lmdb", "staged"),
                                      ("lmdb", "shm")])
def test_a_worker_that_dies_costs_its_input_only(src, tmp_path, fmt, mode):
    from packer.conversion.runner import run

    items, classes = image_items(src)
    items = [i for i in items if i.key not in ("class_1/img_0040.jpg", "class_2/img_0041.jpg")]
    writer = writer_class(fmt)(tmp_path / "o", classes=classes)
    victim = items[30].key
    with Plan(mode, 2, "a test").executor(writer) as ex:
        report = run(items, _DiesOn(victim), writer, executor=ex, options=RunOptions(max_failures=1))
    assert report.count == len(items) - 1
    assert [(f["key"], f["stage"]) for f in report.failures] == [(victim, "crash")]
    r = open_reader(tmp_path / "o")
    assert list(r.keys) == [i.key for i in items if i.key != victim]
    assert CliRunner().invoke(main, ["verify", str(tmp_path / "o")]).exit_code == 0


def test_a_file_changed_between_check_and_write_is_a_failure(src, tmp_path):
    items, _ = image_items(shutil.copytree(src, tmp_path / "copy"))
    job = VerdictJob(ImageJob(check="header"))
    item = items[0]
    verdict = job.verdict(item)
    assert job.complete(item, verdict).data == Path(item.path).read_bytes()
    Path(item.path).write_bytes(Path(items[1].path).read_bytes())
    with pytest.raises(CorruptSample) as e:
        job.complete(item, verdict)
    assert e.value.stage == "read" and "changed" in e.value.reason


def test_a_segments_results_come_back_as_runs_and_outcomes_in_input_order():
    """What a records segment hands the runner: each stretch of one-sample inputs as one
    ``StoredSamples`` (its part files' ends among them), every other input (a failure, several
    samples) as its Outcome; expanded, the same stored samples one per input, each part file
    completed by its last sample."""
    from packer.conversion.executors.base import WorkResult
    from packer.conversion.plans.sharded import _join, _one_by_one, _Result
    from packer.formats.segments import SegmentShard, StoredSamples

    def row(key, part, at):
        return (key, "jpeg", 1, 4, 5, 3, None, 7, 10, part, (10, 99), at)

    parts = [SegmentShard(f"p{k}", f"i{k}", n, 100, "") for k, n in enumerate((3, 3))]
    # inputs: a, b, (fails), c+d (one input, two samples), e, f
    rows = [row("a", 0, 0), row("b", 0, 10), row("c", 0, 20), row("d", 1, 0), row("e", 1, 10), row("f", 1, 20)]
    result = _Result(6, rows, {2: (False, "decode", "bad"), 3: (True, 2, None, None)}, parts)
    runs = list(result.runs())
    assert [type(r).__name__ for r in runs] == ["StoredSamples", "Outcome", "Outcome", "StoredSamples"]
    assert runs[0].keys() == ["a", "b"] and runs[0].ends == [] and runs[1].stage == "decode"
    assert runs[3].keys() == ["e", "f"] and runs[3].ends == [(2, 1)] and runs[3].stats() == [(10, 99)] * 2
    assert isinstance(runs[2].value, WorkResult) and [s.key for s in runs[2].value.samples] == ["c", "d"]
    assert runs[2].value.samples[0].prepared.shard is parts[0]  # c ends part 0
    one = list(_one_by_one(result.runs()))
    assert len(one) == 6 and [o.ok for o in one] == [True, True, False, True, True, True]
    last = [o.value.prepared.shard for o in one if o.ok and not isinstance(o.value, WorkResult)]
    assert last == [None, None, None, parts[1]]  # a, b, e, f: f ends part 1
    assert one[0].value.extra == {} and one[0].value.data == b"" and one[0].value.source_stat == (10, 99)
    assert runs[3].head(1).ends == [] and runs[3].head(2).ends == [(2, 1)]
    assert isinstance(runs[3].head(1), StoredSamples) and runs[3].size() == 20
    # a crashed segment rerun input by input: the parts' rows and files renumbered into one
    joined = _join([_Result(1, [row("a", 0, 0)], {}, parts[:1]), _Result(1, [], {0: (False, "crash", "x")}, []),
                    _Result(1, [row("b", 0, 0)], {}, parts[1:])])
    runs = list(joined.runs())
    assert [r.keys() if isinstance(r, StoredSamples) else r.stage for r in runs] == [["a"], "crash", ["b"]]
    assert runs[2].rows[0][9] == 1


def test_staged_outcomes_come_in_input_order(src):
    items, _ = image_items(src)
    job = VerdictJob(ImageJob(check="full"))
    with StagedExecutor(workers=2, threads=2, chunk_size=4) as ex:
        outcomes = list(ex.map(job, items))
    assert [o.value.key for o in outcomes if o.ok] == [i.key for i in items if i.key not in (
        "class_1/img_0040.jpg", "class_2/img_0041.jpg")]


# -- frame folders written by the workers ---------------------------------------------------------
def test_frame_folders_written_by_the_workers_equal_in_process_ones(video_folder, tmp_path):
    from packer.commands.decode_frames import decode_frames

    outs = {}
    for workers in (0, 2):
        outs[workers] = tmp_path / f"f{workers}"
        decode_frames(video_folder, outs[workers], frame_options=FrameOptions(short_side=32),
                      run_options=RunOptions(workers=workers, timeout=600.0))
    assert packed_snapshot(outs[0]) == packed_snapshot(outs[2])
    files = {w: sorted(p.relative_to(o).as_posix() for p in o.rglob("*") if p.name != "packer.json")
             for w, o in outs.items()}
    assert files[0] == files[2] and not [f for f in files[2] if "/." in f or f.startswith(".")]
    assert CliRunner().invoke(main, ["verify", str(outs[2])]).exit_code == 0


@pytest.mark.slow
def test_workers_of_a_killed_run_stop_instead_of_writing_beside_the_resume(src, tmp_path):
    """Only the writer is killed (an OOM kill): its workers must exit, not write on."""
    import time

    out = tmp_path / "o.records"
    proc = subprocess.Popen(packer_cmd("to-records", src, out, "--workers", 2, "--max-failures", 2,
                                       "--shard-size", "20KB"), start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    deadline = time.monotonic() + scaled(60)
    kids: list[int] = []
    while time.monotonic() < deadline and len(kids) < 2 and proc.poll() is None:
        kids = [int(p) for p in subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True,
                                               text=True).stdout.split()]
        time.sleep(0.01)
    proc.kill()
    proc.wait()

    def running() -> list[int]:
        return [k for k in kids if Path(f"/proc/{k}").exists() and "Z" not in
                Path(f"/proc/{k}/stat").read_text().split()[2]]

    deadline = time.monotonic() + scaled(30)  # they notice the writer's end at their next task
    while running() and time.monotonic() < deadline:
        time.sleep(0.05)
    alive = running()
    for k in alive:
        os.kill(k, signal.SIGKILL)
    assert alive == []
    done = subprocess.run(packer_cmd("to-records", src, out, "--workers", 2, "--max-failures", 2,
                                     "--shard-size", "20KB", "--resume"), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == []

"""Concurrent runs on one output (issue 19), with real ``packer`` processes for every command
that writes: exactly one run writes an output, the other fails at once (exit 2) with one line
naming the output and the holder; a SIGKILLed holder's claim is taken over by ``--resume``; a
partial whose run token changed is never published; ``merge`` refuses a part in flight.

The first run is held at an exact point of its work (``concurrency.start_paused``), so "the
second run fails while the first is still in flight" is proven, not timed.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import time

import pytest

from packer.claim import TOKEN_NAME, lock_path
from packer.formats.sidecars import partial_path
from tests.support.concurrency import error_lines, release, start_paused, stop
from tests.support.faults import CONVERSIONS, leftovers, one_fast, snapshot
from tests.support.killing import run_packer
from scripts.timing import scaled


def assert_refused(r, out, holder_pid: int | None = None) -> str:
    """Exit 2, exactly one ``Error:`` line naming the output and the holder, no traceback."""
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    lines = error_lines(r.stderr)
    assert len(lines) == 1, r.stderr
    line = lines[0]
    assert out.name in line, line
    if holder_pid is not None:
        for part in (f"pid {holder_pid}", f"host {socket.gethostname()}", "started", "command"):
            assert part in line, line
    return line


def verifies(out) -> bool:
    return run_packer("verify", out).returncode == 0


@pytest.mark.parametrize("conv", one_fast(CONVERSIONS))
def test_second_run_refused_while_first_writes(conv, sources, references, tmp_path):
    """Run A paused with OUT.partial half written; run B on the same OUT (plain, --resume,
    --overwrite) fails at once, naming A; A then publishes an output identical to a lone run."""
    reference, _ = references(conv)
    src, out = sources[conv.source], conv.out(tmp_path)
    a = start_paused(conv.argv(src, out, "--workers", 0), "add", tmp_path / "flags")
    try:
        for extra in ((), ("--resume",), ("--overwrite",)):
            b = run_packer(*conv.argv(src, out, "--workers", 0, *extra))
            assert_refused(b, out, holder_pid=a.pid)
            assert a.poll() is None  # B failed while A was in flight
        assert partial_path(out).exists() and not out.exists()
    finally:
        ra = release(a, tmp_path / "flags")
    assert ra.returncode == 0, ra.stderr
    assert snapshot(conv, out) == reference
    assert verifies(out)
    assert leftovers(conv, out) == []


@pytest.mark.parametrize("fmt", ["lmdb", "records"])
def test_two_runs_started_together(fmt, tmp_path):
    """The issue's report: two plain runs started 0.3 s apart. Exactly one writes the output,
    it verifies clean; the other fails with exit 2 (claimed) or 1 (the output already exists)."""
    from tests.support.inputs import write_image_folder

    src = write_image_folder(tmp_path / "src", count=300, classes=3, size=(64, 80))
    out = tmp_path / f"out.{fmt}"
    argv = [f"to-{fmt}", src, out, "--workers", 0]
    if fmt == "records":
        argv += ["--samples-per-shard", 50]
    from tests.support import zygote
    from tests.support.killing import BASE_ENV, KILL_PROGRAM, packer_env

    procs = []
    for _ in range(2):
        procs.append(zygote.start(KILL_PROGRAM, argv, packer_env(), BASE_ENV, capture=True))
        time.sleep(0.3)
    results = [(p.wait(timeout=scaled(300)), p.communicate()[1]) for p in procs]
    codes = sorted(code for code, _ in results)
    assert codes[0] == 0 and codes[1] in (1, 2), results
    assert verifies(out)
    assert not lock_path(out).exists() and not partial_path(out).exists()


@pytest.mark.parametrize("conv", one_fast(CONVERSIONS))
def test_killed_holder_is_taken_over_by_resume(conv, sources, references, tmp_path):
    """SIGKILL leaves OUT.lock behind: a plain rerun refuses it (pid gone: says --resume),
    ``--resume`` takes it over, says so, and ends identical to an uninterrupted run."""
    reference, _ = references(conv)
    src, out = sources[conv.source], conv.out(tmp_path)
    killed = run_packer(*conv.argv(src, out, "--workers", 0), kill_at="add:5")
    assert killed.returncode == -signal.SIGKILL
    assert lock_path(out).exists()
    plain = run_packer(*conv.argv(src, out, "--workers", 0))
    line = assert_refused(plain, out)
    assert "is gone" in line and "--resume" in line, line
    resumed = run_packer(*conv.argv(src, out, "--workers", 0, "--resume"))
    assert resumed.returncode == 0, resumed.stderr
    assert "took over the claim of a run that is gone" in resumed.stderr
    assert snapshot(conv, out) == reference
    assert leftovers(conv, out) == []


@pytest.mark.parametrize("conv", one_fast(CONVERSIONS))
def test_changed_token_is_never_published(conv, sources, tmp_path):
    """Run A paused right before its publish; the partial's run token is changed underneath
    (as another run writing into it would): A refuses to publish (exit 2), OUT never appears."""
    src, out = sources[conv.source], conv.out(tmp_path)
    a = start_paused(conv.argv(src, out, "--workers", 0), "close", tmp_path / "flags")
    try:
        token_file = conv.writer(out, classes=[]).journal_dir / TOKEN_NAME
        stamp = json.loads(token_file.read_text())
        token_file.write_text(json.dumps({**stamp, "token": "someone-else"}))
    finally:
        ra = release(a, tmp_path / "flags")
    line = assert_refused(ra, out)
    assert "not published" in line and "someone-else" in line, line
    assert not out.exists()
    assert not lock_path(out).exists()  # released on the way out


@pytest.mark.parametrize("conv", one_fast(CONVERSIONS))
def test_broken_claim_loser_does_not_publish(conv, sources, references, tmp_path):
    """The issue's corruption, forced: A is mid-write, B breaks A's claim (--break-lock --overwrite)
    and rewrites the partial to the end. A, released, must not publish (exit 2); B's output stands
    and verifies clean."""
    reference, _ = references(conv)
    src, out = sources[conv.source], conv.out(tmp_path)
    a = start_paused(conv.argv(src, out, "--workers", 0), "add", tmp_path / "flags")
    try:
        b = run_packer(*conv.argv(src, out, "--workers", 0, "--overwrite", "--break-lock"))
        assert b.returncode == 0, b.stderr
        assert "--break-lock" in b.stderr  # it says what it did
    finally:
        ra = release(a, tmp_path / "flags")
    assert ra.returncode == 2, ra.stderr
    assert "not published" in error_lines(ra.stderr)[0]
    assert snapshot(conv, out) == reference
    assert verifies(out)


def _pack(src, out, *more):
    r = run_packer("to-lmdb", src, out, "--workers", 0, "--max-failures", 9, *more)
    assert r.returncode == 0, r.stderr


def test_merge_refuses_parts_in_flight(sources, tmp_path):
    """``merge`` refuses a part being written (naming it and its holder), a part whose writer
    died before finishing it, and a finished part whose rewrite was killed (its claim left)."""
    src = sources["images"]
    parts = [tmp_path / f"p{i}.lmdb" for i in range(2)]
    _pack(src, parts[0], "--num-shards", 2, "--shard-index", 0)
    flags = tmp_path / "flags"
    argv1 = ["to-lmdb", src, parts[1], "--workers", 0, "--max-failures", 9, "--num-shards", 2,
             "--shard-index", 1, "--commit-every", 2]
    a = start_paused(argv1, "add", flags)
    try:
        r = run_packer("merge", *parts, tmp_path / "m.lmdb")
        line = assert_refused(r, parts[1], holder_pid=a.pid)
        assert "being written" in line
    finally:
        stop(a)  # a SIGKILLed writer: its claim stays behind, stale
    r = run_packer("merge", *parts, tmp_path / "m.lmdb")
    assert r.returncode == 1 and "did not finish" in error_lines(r.stderr)[0]  # never published
    assert run_packer(*argv1, "--resume").returncode == 0
    assert run_packer("merge", *parts, tmp_path / "m.lmdb").returncode == 0
    # an unfinished --overwrite of a finished part (killed): the part is refused, named
    r = run_packer(*argv1, "--overwrite", kill_at="add:3")
    assert r.returncode == -signal.SIGKILL
    r = run_packer("merge", *parts, tmp_path / "m2.lmdb")
    assert "claimed by a run that is gone" in assert_refused(r, parts[1])


def test_merge_output_claimed(sources, tmp_path):
    """A second merge into the same OUT while the first writes it fails at once."""
    src = sources["images"]
    parts = [tmp_path / f"p{i}.lmdb" for i in range(2)]
    for i, part in enumerate(parts):
        _pack(src, part, "--num-shards", 2, "--shard-index", i)
    out = tmp_path / "m.lmdb"
    a = start_paused(["merge", *parts, out], "add", tmp_path / "flags")
    try:
        assert_refused(run_packer("merge", *parts, out), out, holder_pid=a.pid)
    finally:
        ra = release(a, tmp_path / "flags")
    assert ra.returncode == 0, ra.stderr
    assert verifies(out)


def test_resize_claimed(tmp_path):
    """Two ``packer resize`` into one OUT: the second fails at once naming the first."""
    from tests.support.inputs import write_image_folder

    src = write_image_folder(tmp_path / "src", count=8)
    out = tmp_path / "small"
    argv = ["resize", src, out, "--short-side", 24, "--workers", 0]
    a = start_paused(argv, "call:packer.commands.resize_tree:_tasks", tmp_path / "flags")
    try:
        assert_refused(run_packer(*argv), out, holder_pid=a.pid)
    finally:
        ra = release(a, tmp_path / "flags")
    assert ra.returncode == 0, ra.stderr
    assert len(list(out.rglob("*.jpg"))) == 8 and not lock_path(out).exists()


def test_index_claimed(tmp_path):
    """``packer index`` on a folder another run claims fails at once; later it succeeds."""
    from tests.support.inputs import write_image_folder

    src = write_image_folder(tmp_path / "src", count=8)
    rec = tmp_path / "out.records"
    assert run_packer("to-records", src, rec, "--workers", 0).returncode == 0
    a = start_paused(["index", rec], "call:packer.commands.index:index_tfrecords", tmp_path / "flags")
    try:
        assert_refused(run_packer("index", rec), rec, holder_pid=a.pid)
        assert_refused(run_packer("to-records", src, rec, "--workers", 0, "--overwrite"), rec,
                       holder_pid=a.pid)
    finally:
        ra = release(a, tmp_path / "flags")
    assert ra.returncode == 0, ra.stderr
    assert verifies(rec)


def test_sigterm_releases_the_claim(sources, references, tmp_path):
    """SIGTERM (a scheduler's cancel) unwinds: the claim is released, ``--resume`` needs no takeover."""
    conv = CONVERSIONS[0]
    reference, _ = references(conv)
    src, out = sources[conv.source], conv.out(tmp_path)
    a = start_paused(conv.argv(src, out, "--workers", 0), "add", tmp_path / "flags")
    try:
        a.send_signal(signal.SIGTERM)
        a.wait(timeout=scaled(60))
    finally:
        stop(a)
    assert a.returncode == 128 + signal.SIGTERM
    assert not lock_path(out).exists()
    r = run_packer(*conv.argv(src, out, "--workers", 0, "--resume"))
    assert r.returncode == 0 and "took over" not in r.stderr, r.stderr
    assert snapshot(conv, out) == reference


def test_lease_expired_on_another_host(sources, references, tmp_path):
    """A claim from another host is judged by its heartbeat: fresh -> refused even with
    --resume; not renewed past the lease -> --resume takes it over."""
    conv = CONVERSIONS[0]
    reference, _ = references(conv)
    src, out = sources[conv.source], conv.out(tmp_path)
    stamp = {"token": "t-elsewhere", "host": "node-17.cluster", "boot": "x", "pid": 4242, "start": 1,
             "started": time.time() - 500, "command": "packer to-lmdb ..."}
    lock_path(out).write_text(json.dumps(stamp))
    line = assert_refused(run_packer(*conv.argv(src, out, "--workers", 0, "--resume")), out)
    assert "node-17.cluster" in line and "pid 4242" in line
    old = time.time() - 600
    os.utime(lock_path(out), (old, old))
    r = run_packer(*conv.argv(src, out, "--workers", 0, "--resume"))
    assert r.returncode == 0, r.stderr
    assert "no heartbeat" in r.stderr
    assert snapshot(conv, out) == reference
    assert not lock_path(out).exists()


@pytest.mark.slow
def test_requeued_job_resumes_after_a_kill_of_the_whole_group(sources, references, tmp_path):
    """A Slurm-style requeue: the first attempt is killed with its workers, the requeued one
    (same command, with --resume) takes the claim over and completes identically."""
    from tests.support.killing import checkpoint_at_least, packer_cmd, run_and_kill

    conv = CONVERSIONS[0]
    reference, _ = references(conv)
    src, out = sources[conv.source], conv.out(tmp_path)
    assert run_and_kill(packer_cmd(*conv.argv(src, out, "--workers", 2)),
                        checkpoint_at_least(conv.state(out), 4))
    r = run_packer(*conv.argv(src, out, "--workers", 2, "--resume"))
    assert r.returncode == 0, r.stderr
    assert snapshot(conv, out) == reference
    shutil.rmtree(tmp_path, ignore_errors=True)

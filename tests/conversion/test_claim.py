"""``packer.claim``: the claim file, who holds it, stale detection, takeover,
``--break-lock``, and the run token at publish. Holders in other processes are real processes."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from packer.cli import main
from packer import claim as claims
from packer.claim import Holder, claim_output, holder_of, lock_path
from packer.claim import TOKEN_NAME
from packer.errors import OutputClaimed, WriteError
from packer.formats.lmdb import LmdbWriter
from packer.formats.sample import Sample
from tests.support.killing import REPO
from scripts.timing import scaled

HOLD = """
import os, sys, time
from packer.claim import claim_output
with claim_output(sys.argv[1]) as c:
    print(c.token, flush=True)
    if sys.argv[2] == "die":
        os._exit(0)  # gone without releasing, like a SIGKILL
    time.sleep(float(sys.argv[2]))
"""


def hold(out: Path, how: str = "60", **env: str) -> tuple[subprocess.Popen, str]:
    """A real process holding the claim on ``out`` (``how``: seconds, or ``die``)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(out), how], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO), **env})
    token = proc.stdout.readline().strip()
    assert token, "holder did not start"
    return proc, token


def test_claim_file_beside_the_output_and_released(tmp_path):
    for out in (tmp_path / "a.lmdb", tmp_path / "b.h5"):
        with claim_output(out) as c:
            lp = lock_path(out)
            assert lp == out.with_name(out.name + ".lock") and lp.exists()
            d = json.loads(lp.read_text())
            assert {"token", "host", "boot", "pid", "start", "started", "command"} <= set(d)
            assert d["pid"] == os.getpid() and d["token"] == c.token
            assert claims.held(out) is c
        assert not lp.exists() and claims.held(out) is None


def test_released_on_exception_and_not_reentrant(tmp_path):
    out = tmp_path / "o"
    with pytest.raises(RuntimeError):
        with claim_output(out):
            with pytest.raises(OutputClaimed, match="already claimed by this process"):
                with claim_output(out):
                    pass
            raise RuntimeError("boom")
    assert not lock_path(out).exists()


def test_live_holder_refused_even_with_takeover(tmp_path):
    out = tmp_path / "o"
    proc, token = hold(out)
    try:
        for takeover in (False, True):
            with pytest.raises(OutputClaimed) as e:
                with claim_output(out, takeover=takeover):
                    pass
            assert f"pid {proc.pid}" in str(e.value) and "--break-lock" in str(e.value)
        assert holder_of(lock_path(out))[0].token == token
    finally:
        proc.kill()
        proc.wait()


def test_break_lock_takes_a_live_claim_and_the_loser_knows(tmp_path):
    out = tmp_path / "o"
    with claim_output(out) as mine:
        proc = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
            from packer.claim import claim_output
            with claim_output({str(out)!r}, break_lock=True) as c:
                print(c.holder.took_over)
            """)], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == mine.token
        assert "may be alive" in proc.stderr
        with pytest.raises(OutputClaimed, match="lost its claim"):
            mine.check()


def test_dead_holder_needs_takeover(tmp_path):
    out = tmp_path / "o"
    proc, token = hold(out, "die")
    proc.wait()
    holder, why, exists = holder_of(lock_path(out))
    assert exists and holder.token == token and why == f"pid {proc.pid} is gone"
    with pytest.raises(OutputClaimed, match="--resume"):
        with claim_output(out):
            pass
    with claim_output(out, takeover=True) as c:
        assert c.holder.took_over == token


def _fake(out: Path, **fields) -> None:
    me = Holder.me("packer to-lmdb x y")
    d = {**json.loads(me.to_bytes()), **fields}
    lock_path(out).write_text(json.dumps(d))


def test_pid_reuse_and_reboot_are_stale(tmp_path):
    """Our own (live) pid with another start time is a reused pid: the holder is gone. The
    same host with another boot id rebooted since."""
    out = tmp_path / "o"
    me = Holder.me()
    _fake(out, start=me.start + 1)
    assert holder_of(lock_path(out))[1] == f"pid {os.getpid()} is gone"
    _fake(out, boot="another-boot")
    assert holder_of(lock_path(out))[1] == "its host rebooted since"
    _fake(out)
    assert holder_of(lock_path(out))[1] is None  # this very process: alive


def test_other_host_lease(tmp_path):
    out = tmp_path / "o"
    _fake(out, host="elsewhere", pid=1)
    assert holder_of(lock_path(out))[1] is None
    old = time.time() - claims.LEASE_S - 5
    os.utime(lock_path(out), (old, old))
    assert "no heartbeat" in holder_of(lock_path(out))[1]


def test_unreadable_claim(tmp_path):
    out = tmp_path / "o"
    lock_path(out).write_bytes(b"\x00garbage")
    with pytest.raises(OutputClaimed, match="unreadable claim file"):
        with claim_output(out, takeover=True):
            pass
    old = time.time() - claims.LEASE_S - 5
    os.utime(lock_path(out), (old, old))
    with claim_output(out, takeover=True):
        pass


def test_os_lock_keeps_a_live_holder_whose_pid_looks_gone(tmp_path):
    """A holder in another pid namespace (a container) may name a pid that looks gone here:
    its POSIX lock on the claim file still says it is alive."""
    out = tmp_path / "o"
    proc, token = hold(out)
    try:
        d = json.loads(lock_path(out).read_text())
        with open(lock_path(out), "r+") as f:  # same inode: the holder's lock stays
            f.write(json.dumps({**d, "pid": 2 ** 22 + 17}).ljust(len(json.dumps(d)) + 40))
        holder, why, _ = holder_of(lock_path(out))
        assert holder.pid == 2 ** 22 + 17 and why is None
    finally:
        proc.kill()
        proc.wait()


def test_heartbeat_renews_the_lease(tmp_path):
    out = tmp_path / "o"
    proc, _ = hold(out, "60", PACKER_CLAIM_HEARTBEAT="0.05")
    try:
        old = time.time() - 1000
        os.utime(lock_path(out), (old, old))
        deadline = time.monotonic() + scaled(30)
        while lock_path(out).stat().st_mtime < time.time() - 100 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert lock_path(out).stat().st_mtime > time.time() - 100
    finally:
        proc.kill()
        proc.wait()


def test_cannot_create_claim_is_a_write_error(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root ignores directory permissions")
    parent = tmp_path / "ro"
    parent.mkdir()
    parent.chmod(0o555)
    try:
        with pytest.raises(WriteError, match="o.lock: cannot claim"):
            with claim_output(parent / "o"):
                pass
    finally:
        parent.chmod(0o755)


def _sample(i: int) -> Sample:
    return Sample(f"k{i}", bytes([i]) * 10, "jpeg", 0, 1, 1, 3)


def _writer(out: Path, claim) -> LmdbWriter:
    """An open writer of ``out`` guarded by ``claim``, as ``runner.run`` hands it over."""
    w = LmdbWriter(out, classes=["a"])
    w.guard = claim.partial(w.workdir, w.journal_dir)
    w.open()
    for i in range(3):
        w.add(_sample(i))
    return w


def test_publish_checks_the_token(tmp_path):
    out = tmp_path / "o.lmdb"
    with claim_output(out) as c:
        w = _writer(out, c)
        stamp = json.loads((w.workdir / TOKEN_NAME).read_text())
        assert stamp["token"] == c.token
        (w.workdir / TOKEN_NAME).write_text(json.dumps({**stamp, "token": "other"}))
        with pytest.raises(OutputClaimed, match="carries run token other"):
            w.close()
    assert not out.exists()
    with claim_output(out, takeover=True) as c:
        w = _writer(out, c)
        w.close()
    assert out.exists() and not (out / TOKEN_NAME).exists()


def test_publish_refuses_a_replaced_partial(tmp_path):
    out = tmp_path / "o.lmdb"
    with claim_output(out) as c:
        w = _writer(out, c)
        stamp = (w.workdir / TOKEN_NAME).read_bytes()
        moved = tmp_path / "elsewhere"
        w.workdir.rename(moved)
        w.workdir.mkdir()
        (w.workdir / TOKEN_NAME).write_bytes(stamp)  # even with our token copied in
        with pytest.raises(OutputClaimed, match="replaced since this run created it"):
            w.close()
    assert not out.exists()


def test_adopt_refuses_a_partial_a_live_run_writes(tmp_path):
    """A partial stamped by a live process that holds no claim (its lock failed or was broken)
    is never touched without --break-lock."""
    out = tmp_path / "o.lmdb"
    proc, token = hold(tmp_path / "unrelated")
    try:
        w = LmdbWriter(out, classes=["a"])
        w.workdir.mkdir()
        other = json.loads(lock_path(tmp_path / "unrelated").read_text())
        (w.workdir / TOKEN_NAME).write_text(json.dumps(other))
        with claim_output(out, takeover=True) as c:
            with pytest.raises(OutputClaimed, match="being written by another run"):
                c.partial(w.workdir, w.journal_dir).adopt()
        with claim_output(out, break_lock=True) as c:
            c.partial(w.workdir, w.journal_dir).adopt()  # taken over, said so
    finally:
        proc.kill()
        proc.wait()
    assert w.guard is None  # a writer used directly, outside a claimed run: nothing to check


def test_cli_exit_2_and_help(tmp_path, image_folder):
    out = tmp_path / "o.lmdb"
    proc, _ = hold(out)
    try:
        r = CliRunner().invoke(main, ["to-lmdb", str(image_folder), str(out), "--workers", "0"])
        assert r.exit_code == 2
        assert f"pid {proc.pid}" in r.output and "claimed by another run" in r.output
    finally:
        proc.kill()
        proc.wait()
    for cmd in ("to-lmdb", "to-hdf5", "to-records", "decode-frames", "resize", "merge", "index"):
        text = CliRunner().invoke(main, [cmd, "--help"]).output
        assert "--break-lock" in text and "RISK" in text, cmd

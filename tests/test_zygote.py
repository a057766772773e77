"""The suite's own zygote (tests/support/zygote.py): a forked packer run behaves as a fresh one,
and a zygote that dies is an error, never a wait without end."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.support import REPO, zygote
from tests.support.killing import BASE_ENV, KILL_PROGRAM, packer_env, run_packer
from scripts.timing import scaled


def test_a_forked_run_says_what_a_fresh_one_says(tmp_path):
    args = ("to-lmdb", tmp_path / "missing", tmp_path / "out.lmdb")
    forked = run_packer(*args)
    fresh = run_packer(*args, env={**packer_env(), "PACKER_TEST_ZYGOTE_OFF": "1"})  # another env: a fresh interpreter
    assert forked.returncode == fresh.returncode == 1
    assert forked.stderr == fresh.stderr and "does not exist" in forked.stderr
    proc = zygote.start(KILL_PROGRAM, ["--version"], packer_env(), BASE_ENV, capture=True)
    assert isinstance(proc, zygote.ForkedRun)  # the run above really was forked
    out, _ = proc.communicate(timeout=scaled(60))
    assert proc.returncode == 0 and "packer" in out


def test_a_dead_zygote_is_an_error(tmp_path):
    z = zygote._Zygote(KILL_PROGRAM, BASE_ENV)
    try:
        run = zygote.ForkedRun(z, ["to-lmdb", str(tmp_path / "src"), str(tmp_path / "o")],
                               {**BASE_ENV, "PACKER_TEST_KILL": ""}, None, capture=False)
        os.kill(run.pid, signal.SIGSTOP)  # the run cannot end before its zygote does
        z.proc.kill()
        with pytest.raises(RuntimeError, match="zygote died"):
            run.wait(timeout=scaled(30))
    finally:
        try:
            os.killpg(run.pid, signal.SIGKILL)
        except (ProcessLookupError, NameError):
            pass
        z.close()
    # the stopped run died with its zygote (it is not our child: its zygote's, now init's)
    assert not _alive(run.pid), f"the stopped run {run.pid} outlived its zygote"


def _alive(pid: int) -> bool:
    """``pid`` exists and is not a zombie, within a scaled bound for its death to land."""
    deadline = time.monotonic() + scaled(10)
    while True:
        try:
            state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
        except OSError:
            return False
        if state in ("Z", "X"):
            return False
        if time.monotonic() > deadline:
            return True
        time.sleep(0.02)


SLEEPER = "import time; time.sleep(600)"  # a run that is still there when the test acts on it


def test_a_run_has_its_own_session_when_its_pid_is_known(tmp_path):
    """killpg(pid) reaches a run from the moment start() returns: a SIGSTOP sent at once used to
    land before the run's setsid(), leaving it stopped in its zygote's group, out of killpg's reach."""
    z = zygote._Zygote(SLEEPER, BASE_ENV)
    try:
        run = zygote.ForkedRun(z, [], BASE_ENV, None, capture=False)
        assert os.getpgid(run.pid) == os.getsid(run.pid) == run.pid
        os.kill(run.pid, signal.SIGSTOP)
        os.killpg(run.pid, signal.SIGKILL)
        assert run.wait(timeout=scaled(30)) == -signal.SIGKILL
    finally:
        z.close()


def test_closing_a_zygote_ends_its_runs(tmp_path):
    """A run still there when its zygote closes (the session ends), stopped or not, is SIGKILLed."""
    z = zygote._Zygote(SLEEPER, BASE_ENV)
    run = zygote.ForkedRun(z, [], BASE_ENV, None, capture=False)
    os.kill(run.pid, signal.SIGSTOP)
    z.close()
    assert not _alive(run.pid)


def test_a_zygote_whose_test_process_is_gone_ends_with_its_runs(tmp_path):
    """The test process SIGKILLed (no atexit, and its forks may keep the zygote's stdin open):
    the zygote notices within a second and takes its runs with it."""
    pids = tmp_path / "pids"
    code = (f"import os, signal, sys; sys.path.insert(0, {str(REPO)!r})\n"
            "from tests.support import zygote\n"
            "from tests.support.killing import BASE_ENV\n"
            f"z = zygote._Zygote({SLEEPER!r}, BASE_ENV)\n"
            "run = zygote.ForkedRun(z, [], BASE_ENV, None, capture=False)\n"
            "os.kill(run.pid, signal.SIGSTOP)\n"
            "if os.fork() == 0:\n"  # a fork holding the zygote's stdin open, as a pool worker would
            "    signal.pause()\n"
            f"open({str(pids)!r}, 'w').write(f'{{z.proc.pid}} {{run.pid}}')\n"
            "os.kill(os.getpid(), signal.SIGKILL)\n")
    test_process = subprocess.Popen([sys.executable, "-c", code], env=BASE_ENV, start_new_session=True)
    try:
        test_process.wait(timeout=scaled(120))
        zpid, rpid = map(int, pids.read_text().split())
        assert not _alive(zpid) and not _alive(rpid)
    finally:
        try:
            os.killpg(test_process.pid, signal.SIGKILL)  # the fork that held the pipe
        except ProcessLookupError:
            pass

"""The suite's own zygote (tests/support/zygote.py): a forked packer run behaves as a fresh one,
and a zygote that dies is an error, never a wait without end."""
from __future__ import annotations

import os
import signal

import pytest

from tests.support import zygote
from tests.support.killing import BASE_ENV, KILL_PROGRAM, packer_env, run_packer


def test_a_forked_run_says_what_a_fresh_one_says(tmp_path):
    args = ("to-lmdb", tmp_path / "missing", tmp_path / "out.lmdb")
    forked = run_packer(*args)
    fresh = run_packer(*args, env={**packer_env(), "PACKER_TEST_ZYGOTE_OFF": "1"})  # another env: a fresh interpreter
    assert forked.returncode == fresh.returncode == 1
    assert forked.stderr == fresh.stderr and "does not exist" in forked.stderr
    proc = zygote.start(KILL_PROGRAM, ["--version"], packer_env(), BASE_ENV, capture=True)
    assert isinstance(proc, zygote.ForkedRun)  # the run above really was forked
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "packer" in out


def test_a_dead_zygote_is_an_error(tmp_path):
    z = zygote._Zygote(KILL_PROGRAM, BASE_ENV)
    try:
        run = zygote.ForkedRun(z, ["to-lmdb", str(tmp_path / "src"), str(tmp_path / "o")],
                               {**BASE_ENV, "PACKER_TEST_KILL": ""}, None, capture=False)
        os.kill(run.pid, signal.SIGSTOP)  # the run cannot end before its zygote does
        z.proc.kill()
        with pytest.raises(RuntimeError, match="zygote died"):
            run.wait(timeout=30)
    finally:
        try:
            os.killpg(run.pid, signal.SIGKILL)
        except (ProcessLookupError, NameError):
            pass
        z.close()

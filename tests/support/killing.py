"""The one SIGKILL helper of the test suite: run a real ``packer`` process and kill it.

Two ways to choose the moment:

* from outside, like a user's ``kill -9`` (:func:`run_and_kill`): poll a condition (the resume
  checkpoint reaching N samples, a file appearing) and SIGKILL the whole process group;
* from inside, at an exact point of the writer (:func:`packer_cmd` with ``kill_at``): the
  process SIGKILLs itself on the Nth sample added (mid-batch), just before the Nth journal
  append (data committed, journal not: a kill during a commit), just before / after the
  final atomic rename, or just before the Nth rename or link of an append's publish. A real
  SIGKILL either way: no ``finally``, no ``atexit``, no flush.
"""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from tests.support import REPO, zygote
from scripts.timing import scaled


# Kill points: "add:N" (after N samples handed to the writer, one by one or at once), "journal:N" (before the Nth
# journal append; an export's: before its Nth shard is journaled), "close:0" (every input done,
# before the writer starts publishing), "rename:0" (before the final rename), "renamed:0" (right after it), "publish:N" (before the Nth os.replace or os.link of an
# --append's publish, which renames and links files one by one: Writer._close_appended).
KILL_PROGRAM = r"""
import os, signal, sys
hold = os.environ.get("PACKER_TEST_HOLD", "")
if hold:  # past N samples the writer waits for the kill: the run cannot end before it lands
    import time
    import packer.formats.writer as held
    held_add, held_at = held.Writer.add, int(hold)
    def wait_for_the_kill(self, sample):
        held_add(self, sample)
        while self.count >= held_at:
            time.sleep(3600)
    held.Writer.add = wait_for_the_kill
    held_stored = held.Writer.add_stored
    def wait_for_the_kill_stored(self, samples):  # samples handed over at once: up to the Nth
        if self.count + len(samples) >= held_at:
            held_stored(self, samples.head(max(held_at - self.count, 0)))
            while True:
                time.sleep(3600)
        held_stored(self, samples)
    held.Writer.add_stored = wait_for_the_kill_stored
spec = os.environ.get("PACKER_TEST_KILL", "")
if spec:
    where, n = spec.split(":"); n = int(n)
    import packer.formats.writer as base
    import packer.formats.sidecars as sidecars
    def die():
        os.kill(os.getpid(), signal.SIGKILL)
    if where == "add":
        add = base.Writer.add
        def hooked_add(self, sample):
            add(self, sample)
            if self.count >= n:
                die()
        base.Writer.add = hooked_add
        add_stored = base.Writer.add_stored
        def hooked_add_stored(self, samples):  # samples handed over at once: up to the Nth, then die
            if self.count + len(samples) >= n:
                add_stored(self, samples.head(max(n - self.count, 0)))
                die()
            add_stored(self, samples)
        base.Writer.add_stored = hooked_add_stored
    elif where == "journal":
        import importlib
        calls = [0]
        real = sidecars.fsync_append
        def hooked_append(path, data):
            calls[0] += 1
            if calls[0] >= n:
                die()
            real(path, data)
        for mod in ("packer.formats.sidecars", "packer.formats.writer", "packer.formats.frames.writer",
                    "packer.commands.export"):
            m = importlib.import_module(mod)
            if getattr(m, "fsync_append", None) is real:
                m.fsync_append = hooked_append
    elif where == "publish":
        publishing, calls = [False], [0]
        def counted(real):
            def call(*a, **k):
                if publishing[0]:
                    calls[0] += 1
                    if calls[0] >= n:
                        die()
                return real(*a, **k)
            return call
        os.replace, os.link = counted(os.replace), counted(os.link)
        close_appended = base.Writer._close_appended
        def hooked_close(self, *a, **k):
            publishing[0] = True
            return close_appended(self, *a, **k)
        base.Writer._close_appended = hooked_close
    elif where == "close":  # the run is done and the writer about to publish (its journals still there)
        def hooked_close_start(self, *a, **k):
            die()
        base.Writer.close = hooked_close_start
    elif where in ("rename", "renamed"):
        real_replace = os.replace
        def hooked_replace(src, dst, *a, **k):
            final = str(src).endswith(".partial")
            if final and where == "rename":
                die()
            real_replace(src, dst, *a, **k)
            if final:
                die()
        os.replace = hooked_replace
from packer.cli import main
main()
"""


def packer_cmd(*args) -> list[str]:
    """argv running ``packer ARGS`` in a fresh interpreter (set ``PACKER_TEST_KILL`` to arm a kill)."""
    return [sys.executable, "-c", KILL_PROGRAM, *map(str, args)]


def packer_env(kill_at: str | None = None, *, hold_at: int | None = None, **extra: str) -> dict[str, str]:
    """The environment of a packer subprocess, running this checkout, optionally armed to die
    (``kill_at``) or to wait for a kill from outside once ``hold_at`` samples are added."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1", **extra}
    env.pop("PACKER_TEST_KILL", None)
    env.pop("PACKER_TEST_HOLD", None)
    if kill_at:
        env["PACKER_TEST_KILL"] = kill_at
    if hold_at is not None:
        env["PACKER_TEST_HOLD"] = str(hold_at)
    return env


#: the environment of a packer run as the suite starts: runs in it fork from the zygote
BASE_ENV = packer_env()


def run_packer(*args, kill_at: str | None = None, timeout: float | None = None,
               **popen) -> subprocess.CompletedProcess:
    """Run ``packer ARGS`` to the end (or to its armed SIGKILL); reaps any orphaned workers.
    ``timeout`` (default: 120 s scaled to the machine's load) ends a run that hangs.
    A real process of its own, forked from the test zygote where that is the same run
    (tests/support/zygote.py), else a fresh interpreter."""
    env = popen.pop("env", None) or packer_env(kill_at)
    proc = zygote.start(KILL_PROGRAM, list(args), env, BASE_ENV, capture=True, **popen)
    try:
        out, err = proc.communicate(timeout=scaled(120) if timeout is None else timeout)
    finally:
        _kill_group(proc)
    return subprocess.CompletedProcess(packer_cmd(*args), proc.returncode, out, err)


def checkpoint_at_least(state: Path, samples: int, field: str = "samples") -> Callable[[], bool]:
    """A condition: the resume checkpoint ``state`` records at least ``samples``."""

    def reached() -> bool:
        try:
            return json.loads(state.read_text())[field] >= samples
        except (OSError, ValueError, KeyError):
            return False

    return reached


def after(seconds: float) -> Callable[[], bool]:
    """A condition: ``seconds`` have passed since it was made (a kill at a chosen moment of a run)."""
    deadline = time.monotonic() + seconds
    return lambda: time.monotonic() > deadline


def kill_at_random_moments(run: Callable[[int, Callable[[], bool]], bool], took: float, seed: int, *,
                           kills: int = 4, tries: int = 6) -> None:
    """``kills`` seeded random moments of a run that took ``took`` seconds uninterrupted, each
    ending in a kill. ``run(n, until)`` is the ``n``-th try: a fresh output, a run killed once
    ``until()`` holds, its output checked; True when the run was killed. A run that ends before
    its moment (the machine sped up since ``took`` was timed: two busy workers' suite) is
    checked all the same and tried again at half the moment, so the moments never all pass
    after the runs they were meant for."""
    rng, n = random.Random(seed), 0
    for _ in range(kills):
        moment = rng.uniform(0.0, took)
        for _ in range(tries):
            n += 1
            if run(n, after(moment)):
                break
            moment /= 2
        else:
            raise AssertionError(f"{tries} runs all ended before their moment (the last {moment * 2:.4f} s; "
                                 f"the uninterrupted run took {took:.3f} s)")


def run_and_kill(cmd: list[str], until: Callable[[], bool], timeout: float | None = None,
                 env: dict[str, str] | None = None, hold_at: int | None = None) -> bool:
    """Start ``cmd``; SIGKILL its process group once ``until()`` holds (or after ``timeout``,
    default 60 s scaled to the machine's load). True if it was killed. ``hold_at`` (packer
    itself): past that many samples the run waits for the kill, so that on a busy machine it
    cannot finish between two looks at ``until`` (pick it past the point ``until`` waits for)."""
    if hold_at is not None:
        env = {**(env or packer_env()), "PACKER_TEST_HOLD": str(hold_at)}
    if cmd[:3] == packer_cmd():  # packer itself: from the zygote where it can
        proc = zygote.start(KILL_PROGRAM, cmd[3:], env or packer_env(), BASE_ENV, capture=False)
    else:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env=env or packer_env(), start_new_session=True)
    deadline = time.monotonic() + (scaled(60) if timeout is None else timeout)
    while proc.poll() is None and time.monotonic() < deadline:
        if until():
            break
        time.sleep(0.002)
    killed = proc.poll() is None
    _kill_group(proc)
    return killed


def _kill_group(proc: subprocess.Popen | zygote.ForkedRun) -> None:
    """SIGKILL the run's process group (its workers) and the run itself, then reap it."""
    for kill in (os.killpg, os.kill):
        try:
            kill(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    proc.wait()

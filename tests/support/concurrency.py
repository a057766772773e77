"""Real ``packer`` processes held at an exact point, so a second one can run against the same
output while the first is provably still in flight (no timing guesses).

``start_paused(argv, at, flags)`` starts ``packer ARGV`` in a fresh interpreter armed to stop
the first time it reaches ``at``: ``"add"`` (the writer got its first sample: OUT.partial
exists and holds data), ``"close"`` (every sample is written, the publish step is next), or
``"call:MODULE:ATTR"`` (the first call of that function). There it creates ``flags/ready``
and waits until ``flags/go`` exists; :func:`release` creates it.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from tests.support import zygote
from tests.support.killing import BASE_ENV, packer_env
from scripts.timing import scaled


PAUSE_PROGRAM = r"""
import importlib, os, sys, time
at, flags = os.environ["PACKER_TEST_PAUSE"].split(";", 1)
def pause():
    if getattr(pause, "done", False):
        return
    pause.done = True
    open(os.path.join(flags, "ready"), "w").close()
    while not os.path.exists(os.path.join(flags, "go")):
        time.sleep(0.01)
def wrap(owner, name):
    real = getattr(owner, name)
    def hooked(*a, **k):
        if name not in ("add", "add_stored"):
            pause()
        result = real(*a, **k)
        if name in ("add", "add_stored"):
            pause()
        return result
    setattr(owner, name, hooked)
if at in ("add", "close"):
    import packer.formats.writer as w
    wrap(w.Writer, at)
    if at == "add":  # samples workers stored, handed over at once
        wrap(w.Writer, "add_stored")
elif at.startswith("call:"):
    _, mod, attr = at.split(":")
    wrap(importlib.import_module(mod), attr)
from packer.cli import main
main()
"""


def start_paused(argv, at: str, flags: Path) -> subprocess.Popen | zygote.ForkedRun:
    """Start ``packer ARGV`` armed to pause at ``at``; returns once it is paused there."""
    flags.mkdir(parents=True, exist_ok=True)
    env = {**packer_env(), "PACKER_TEST_PAUSE": f"{at};{flags}"}
    proc = zygote.start(PAUSE_PROGRAM, list(argv), env, BASE_ENV, capture=True)
    deadline = time.monotonic() + scaled(120)
    while not (flags / "ready").exists():
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"exited {proc.returncode} before pausing: {err}")
        if time.monotonic() > deadline:
            stop(proc)
            raise AssertionError("never reached its pause point")
        time.sleep(0.01)
    return proc


def release(proc: subprocess.Popen, flags: Path, timeout: float | None = None) -> subprocess.CompletedProcess:
    """Let a paused process go on; wait for it (``timeout``: 120 s scaled) and return its outcome."""
    (flags / "go").touch()
    try:
        out, err = proc.communicate(timeout=scaled(120) if timeout is None else timeout)
    finally:
        stop(proc)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def stop(proc: subprocess.Popen) -> None:
    """SIGKILL a process group started here (if still there) and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def error_lines(stderr: str) -> list[str]:
    """The ``Error:`` lines of a packer run's stderr."""
    return [line for line in stderr.splitlines() if line.startswith("Error:")]

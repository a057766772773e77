"""The suite leaves no process behind: find what a test run left running, and end it.

Every process the suite starts inherits ``MARK`` (the pid of the pytest process that began the
session, set by tests/conftest.py before any is started), in its environment as the kernel shows
it (``/proc/PID/environ``: a fork without exec keeps its parent's), so a process that lost its
parent (reparented to init) is still found. Linux only (``/proc``); elsewhere nothing is found.
"""
from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from scripts.timing import scaled

__all__ = ["MARK", "Proc", "mark_session", "descendants", "marked", "end"]

MARK = "TESTSUITE_ROOT_PID"
PROC = Path("/proc")
#: helpers of a Python process that live exactly as long as it does (they exit on its end):
#: not left behind by a test
SERVICES = ("from multiprocessing.resource_tracker import main", "from multiprocessing.forkserver import main")


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    state: str  # R, S, T (stopped), Z (zombie), ...
    command: str

    def __str__(self) -> str:
        return f"pid {self.pid} (parent {self.ppid}, state {self.state}): {self.command[:160]}"


def mark_session() -> None:
    """Mark this process's environment: an xdist worker keeps its controller's mark; any other
    pytest process (a serial run, a controller, a pytest that a test starts) begins its own."""
    inherited = os.environ.get(MARK)
    if not ("PYTEST_XDIST_WORKER" in os.environ and inherited == str(os.getppid())):
        os.environ[MARK] = str(os.getpid())


def _read(pid: int) -> Proc | None:
    try:
        stat = (PROC / str(pid) / "stat").read_text()
        command = (PROC / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return Proc(pid, int(fields[1]), fields[0], command.strip() or stat.split("(", 1)[1].rsplit(")", 1)[0])


def _all() -> list[Proc]:
    if not PROC.is_dir():
        return []
    procs = (_read(int(p.name)) for p in PROC.iterdir() if p.name.isdigit())
    return [p for p in procs if p is not None and p.state not in ("Z", "X")
            and not any(service in p.command for service in SERVICES)]


def descendants(root: int) -> list[Proc]:
    """The live processes below ``root`` (children, their children, ...)."""
    procs = _all()
    kids: dict[int, list[Proc]] = {}
    for p in procs:
        kids.setdefault(p.ppid, []).append(p)
    out, todo = [], [root]
    while todo:
        for p in kids.get(todo.pop(), []):
            out.append(p)
            todo.append(p.pid)
    return out


def marked(session: str) -> list[Proc]:
    """The live processes carrying ``MARK=session``, but this one."""
    needle = f"{MARK}={session}".encode()
    out = []
    for p in _all():
        if p.pid == os.getpid():
            continue
        try:
            env = (PROC / str(p.pid) / "environ").read_bytes()
        except OSError:  # another user's, or gone
            continue
        if needle in env.split(b"\0"):
            out.append(p)
    return out


def end(find, grace: float = 2.0) -> list[Proc]:
    """What ``find()`` still lists after ``grace`` seconds (scaled; what is exiting gets that
    long), SIGKILLed (stopped ones too) and returned as found."""
    deadline = time.monotonic() + scaled(grace)
    left = find()
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = find()
    for p in left:
        try:
            os.kill(p.pid, signal.SIGKILL)
        except OSError:
            pass
    return left

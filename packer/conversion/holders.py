"""Who holds a claim, and whether that process is still there.

A ``Holder`` is what ``OUT.lock`` and a partial's run token name: the run token, host, kernel
boot id, pid, process start time (clock ticks since boot, from /proc: a reused pid is a later
process), start time and command. ``gone(age)`` says why a holder is certainly gone, or None.
"""
from __future__ import annotations

import json
import os
import socket
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = ["LEASE_S", "Holder"]

LEASE_S = float(os.environ.get("PACKER_CLAIM_LEASE", "90"))


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _proc_start(pid: int) -> tuple[int, str] | None:
    """(start time in clock ticks since boot, state letter) of ``pid`` from /proc, or None."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rfind(")") + 2:].split()
    try:
        return int(fields[19]), fields[0]
    except (IndexError, ValueError):
        return None


def _pid_alive(pid: int, start: int) -> bool:
    """Is ``pid`` the same live process that started at ``start`` (ticks since boot)?"""
    info = _proc_start(pid)
    if info is not None:
        ticks, state = info
        return state not in ("Z", "X") and (not start or ticks == start)
    if Path("/proc/self/stat").exists():
        return False  # /proc works and has no such pid
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _command_line() -> str:
    prog = Path(sys.argv[0]).name
    if prog in ("__main__.py", "-c", ""):  # python -m packer, or a test's python -c
        prog = "packer"
    return " ".join([prog] + sys.argv[1:])


@dataclass(frozen=True)
class Holder:
    """Who holds (or held) a claim: what ``OUT.lock`` and a partial's run token say."""

    token: str
    host: str
    boot: str
    pid: int
    start: int
    started: float
    command: str
    took_over: str | None = None

    @classmethod
    def me(cls, command: str | None = None) -> "Holder":
        """This process, with a fresh run token."""
        info = _proc_start(os.getpid())
        return cls(token=uuid.uuid4().hex, host=socket.gethostname(), boot=_boot_id(), pid=os.getpid(),
                   start=info[0] if info else 0, started=time.time(),
                   command=command or _command_line())

    def to_bytes(self, **extra: Any) -> bytes:
        return (json.dumps({**asdict(self), **extra}, sort_keys=True) + "\n").encode()

    @classmethod
    def parse(cls, data: bytes) -> "Holder | None":
        """The holder a claim or token file names; None when unreadable (torn, foreign)."""
        try:
            d = json.loads(data)
            return cls(token=str(d["token"]), host=str(d["host"]), boot=str(d.get("boot", "")),
                       pid=int(d["pid"]), start=int(d.get("start", 0)), started=float(d.get("started", 0)),
                       command=str(d.get("command", "?")), took_over=d.get("took_over"))
        except (ValueError, KeyError, TypeError):
            return None

    def describe(self) -> str:
        """``host H, pid P, started T, command '...'`` for one-line messages."""
        when = time.strftime("%Y-%m-%d %H:%M:%S %z", time.localtime(self.started))
        return f"host {self.host}, pid {self.pid}, started {when}, command {self.command!r}"

    def is_me(self) -> bool:
        """This very process (a claim this process held before, now released)."""
        me = Holder.me("")
        return (self.host, self.boot, self.pid, self.start) == (me.host, me.boot, me.pid, me.start)

    def gone(self, age: float) -> str | None:
        """Why this holder is certainly gone, or None if it may be alive. ``age``: seconds since
        its file was last touched (the lease, judged only for holders on other hosts)."""
        if self.host == socket.gethostname() and (not self.boot or self.boot == _boot_id()):
            return None if _pid_alive(self.pid, self.start) else f"pid {self.pid} is gone"
        if self.host == socket.gethostname():
            return "its host rebooted since"
        if age > LEASE_S:
            return f"no heartbeat for {age:.0f}s (lease {LEASE_S:.0f}s)"
        return None

"""One writer per output: an exclusive claim on OUT, who holds it, and a run token checked at publish.

**The claim.** ``OUT.lock`` beside the output (``out.lmdb.lock``, ``out.h5.lock``: never inside
what gets renamed) holds one JSON object naming the holder: ``token`` (this run's random run
token), ``host``, ``boot`` (the kernel's boot id), ``pid``, ``start`` (the process start time in
clock ticks since boot, so a reused pid is not mistaken for the holder), ``started`` (epoch
seconds) and ``command``. It is created exclusively and atomically: written and fsynced under a
temporary name, then ``link(2)``ed to ``OUT.lock`` (fails if it exists; works on NFS), falling
back to ``O_CREAT|O_EXCL`` where hard links are not supported. The holder also takes a POSIX
lock (``fcntl``) on it where the file system has one, and a daemon thread touches its mtime
every ``HEARTBEAT_S`` seconds (the lease seen from other hosts).

**Stale claims.** A claim whose holder is gone is detected: the OS lock is free and either the
holder ran on this host (same boot) and its pid is gone or belongs to a later process, or it ran
elsewhere and its heartbeat is older than ``LEASE_S``. ``--resume`` and ``--overwrite`` take a
stale claim over (and say so); a plain run refuses it with that hint; commands that rebuild
from scratch (merge, resize, index) take it over. A live holder is never overridden except by
``--break-lock``.

**The run token**. The partial output carries the token of
the run that wrote it. A run takes its claim once, where it starts (``packer.api``), and hands
the writer a ``PartialGuard`` (``Claim.partial``): before the writer touches an existing partial
it must be its own, the taken-over holder's, or one whose writer is gone (``adopt``); the base
Writer's publish step (``before_publish``) renames the partial to OUT only while this run still
holds the claim and the partial still carries this run's token and inode. A new writer that
publishes by any other path must call ``before_publish`` first.
"""
from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
import uuid
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterator

try:
    import fcntl
except ImportError:  # pragma: no cover - no POSIX locks here: the lock file alone guards outputs
    fcntl = None  # type: ignore[assignment]

from packer.errors import OutputClaimed, WriteError
from packer.manifest import atomic_write_bytes

__all__ = ['LEASE_S', 'Holder', 'HEARTBEAT_S', 'Claim', 'PartialGuard', 'lock_path', 'claim_output', 'held', 'holder_of',
           'check_part', 'TOKEN_NAME']

log = logging.getLogger(__name__)

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


HEARTBEAT_S = float(os.environ.get("PACKER_CLAIM_HEARTBEAT", "10"))
_TAKEOVER_STALE_S = 60.0
_NO_LINKS = {errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS, errno.EXDEV, errno.EMLINK}

_HELD: dict[str, "Claim"] = {}  # this process's claims, by absolute output path


def lock_path(out: str | os.PathLike) -> Path:
    """The claim file of ``out``: ``OUT.lock`` beside it (for files and directories alike)."""
    out = Path(out)
    return out.with_name(out.name + ".lock")


def _os_lock_free(path: Path) -> bool | None:
    """Probe the holder's POSIX lock: False if held, True if free, None where unsupported."""
    if fcntl is None:
        return None
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except (BlockingIOError, PermissionError):
        return False
    except OSError:
        return None
    finally:
        os.close(fd)  # this process held no lock on this file: closing releases only the probe
    return True


def holder_of(path: Path) -> tuple[Holder | None, str | None, bool]:
    """``(holder, why it is gone or None, exists)`` of the claim file ``path``."""
    try:
        data, st = path.read_bytes(), path.stat()
    except FileNotFoundError:
        return None, None, False
    except OSError as e:
        raise WriteError(f"{path}: cannot read the claim ({e.strerror or e})") from e
    holder = Holder.parse(data)
    if _os_lock_free(path) is False:
        return holder, None, True
    age = time.time() - st.st_mtime
    if holder is None:
        return None, (f"unreadable claim untouched for {age:.0f}s" if age > LEASE_S else None), True
    return holder, holder.gone(age), True


# Shaped like manifest.atomic_write_bytes, but it must fail when ``path`` exists (link, not
# replace), which is the whole point of a claim: the two cannot share one function.
def _create_exclusive(path: Path, data: bytes) -> None:
    """Create ``path`` holding ``data``, atomically and only if it does not exist (FileExistsError)."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            if os.stat(tmp).st_nlink != 2:  # an NFS retransmit of a link that did succeed says EEXIST
                raise
        except OSError as e:
            if e.errno not in _NO_LINKS:
                raise
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            try:
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
    finally:
        tmp.unlink(missing_ok=True)


class Claim:
    """An exclusive claim held by this process on one output (see the module docstring)."""

    def __init__(self, out: Path, holder: Holder, *, break_lock: bool):
        self.out = out
        self.path = lock_path(out)
        self.holder = holder
        self.break_lock = break_lock
        self.lost: str | None = None
        self._fd = os.open(self.path, os.O_RDWR)
        st = os.fstat(self._fd)
        self._ident = (st.st_dev, st.st_ino)
        self.os_lock = self._lock_os()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"claim {out.name}", daemon=True)
        self._thread.start()

    @property
    def token(self) -> str:
        return self.holder.token

    def _lock_os(self) -> bool:
        if fcntl is None:
            return False
        for _ in range(200):  # a contender's probe holds a shared lock for microseconds
            try:
                fcntl.lockf(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except (BlockingIOError, PermissionError):
                time.sleep(0.005)
            except OSError as e:  # no lock manager (NFS without lockd, Lustre without -o flock)
                log.debug("%s: no OS lock (%s); the lock file alone guards it", self.path, e)
                return False
        return False

    def still_mine(self) -> bool:
        """Is ``OUT.lock`` still the file this claim created (not broken, not replaced)?"""
        try:
            st = os.stat(self.path)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == self._ident

    def partial(self, workdir: Path, journal: Path) -> "PartialGuard":
        """The guard of the partial output the writer of ``out`` builds in ``workdir`` (its run
        token goes in ``journal``): what the writer calls to adopt, stamp and publish it."""
        return PartialGuard(self, workdir, journal)

    def check(self) -> None:
        """Raise OutputClaimed when this run no longer holds its claim (``--break-lock`` by another)."""
        if self.lost is None and not self.still_mine():
            holder, _, _ = holder_of(self.path)
            self.lost = (f"its claim {self.path} was broken"
                         + (f" by {holder.describe()}" if holder else ""))
        if self.lost:
            raise OutputClaimed(f"{self.out}: this run lost its claim, not published: {self.lost}")

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            if not self.still_mine():
                self.lost = self.lost or f"its claim {self.path} was broken or removed"
                continue
            with contextlib.suppress(OSError):
                os.utime(self._fd)

    def release(self) -> None:
        """Stop the heartbeat, remove ``OUT.lock`` if it is still ours, drop the OS lock."""
        self._stop.set()
        if self.still_mine():
            with contextlib.suppress(OSError):
                os.unlink(self.path)
        with contextlib.suppress(OSError):
            os.close(self._fd)
        if _HELD.get(os.path.abspath(self.out)) is self:
            del _HELD[os.path.abspath(self.out)]


def held(out: str | os.PathLike) -> Claim | None:
    """This process's claim on ``out``, if it holds one."""
    return _HELD.get(os.path.abspath(out))


def _refusal(out: Path, holder: Holder | None, why: str | None, takeover: bool) -> OutputClaimed:
    who = holder.describe() if holder is not None else "an unreadable claim file"
    if why is None:
        return OutputClaimed(f"{out}: claimed by another run ({who}); wait for it to finish, or "
                             f"--break-lock if it is certainly gone")
    hint = ("rerun with --resume (continue its work) or --overwrite (start again) to take it over"
            if not takeover else "--break-lock to take it over")
    return OutputClaimed(f"{out}: claimed by a run that is gone ({who}; {why}); {hint}")


def _take_over(path: Path, token: str | None, me: Holder) -> bool:
    """Replace the claim file ``path`` (still naming ``token``) by ours; False if another run got
    there first. Takeovers are serialized by an exclusive ``OUT.lock.takeover`` file."""
    mutex = path.with_name(path.name + ".takeover")
    try:
        _create_exclusive(mutex, me.to_bytes())
    except FileExistsError:
        with contextlib.suppress(OSError):
            if time.time() - mutex.stat().st_mtime > _TAKEOVER_STALE_S:
                mutex.unlink()
        return False
    try:
        current = Holder.parse(path.read_bytes()) if path.exists() else None
        if path.exists() and (current.token if current else None) != token:
            return False  # changed under us: judge again
        path.unlink(missing_ok=True)
        try:
            _create_exclusive(path, me.to_bytes())
        except FileExistsError:
            return False
        return True
    finally:
        mutex.unlink(missing_ok=True)


def _acquire(out: Path, me: Holder, *, takeover: bool, break_lock: bool) -> Holder:
    lp = lock_path(out)
    for _ in range(20):
        try:
            _create_exclusive(lp, me.to_bytes())
            return me
        except FileExistsError:
            pass
        holder, why, exists = holder_of(lp)
        if not exists:
            continue
        if (why is None or not takeover) and not break_lock:
            raise _refusal(out, holder, why, takeover)
        mine = replace(me, took_over=holder.token if holder else None)
        if _take_over(lp, holder.token if holder else None, mine):
            who = holder.describe() if holder else "an unreadable claim"
            if why is None:
                log.warning("%s: --break-lock: took the claim of a run that may be alive (%s)", out, who)
            else:
                log.warning("%s: took over the claim of a run that is gone (%s; %s)", out, who, why)
            return mine
        time.sleep(0.05)
    raise OutputClaimed(f"{out}: claimed by another run (the claim kept changing hands); try again")


def _sigterm_handler(owner: int, previous: Any) -> Callable[[int, Any], None]:
    def handler(signum: int, frame: Any) -> None:
        if os.getpid() != owner:  # a forked worker: die as it would have
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        raise SystemExit(128 + signum)  # unwinds: every claim is released on the way out

    handler.packer_claim = True  # type: ignore[attr-defined]
    return handler


def _default_sigterm_in_child() -> None:
    """Forked workers get SIGTERM's default back: a pool's terminate() must kill them at once,
    even blocked in C, where a Python-level handler would wait for the next bytecode."""
    with contextlib.suppress(ValueError, OSError):
        if getattr(signal.getsignal(signal.SIGTERM), "packer_claim", False):
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_default_sigterm_in_child)


@contextlib.contextmanager
def claim_output(out: str | os.PathLike, *, takeover: bool = False, break_lock: bool = False,
                 command: str | None = None) -> Iterator[Claim]:
    """Hold an exclusive claim on ``out`` for the ``with`` block (released on every exit path,
    SIGTERM included).

    Args:
        out: the output path (file or directory).
        takeover: take over a claim whose holder is gone (``--resume``/``--overwrite``, and
            commands that rebuild from scratch); otherwise refuse it with that hint.
        break_lock: take the claim even from a holder that may be alive (``--break-lock``).
        command: recorded in the claim (default: this process's command line).
    Raises:
        OutputClaimed: another run holds it; WriteError: the claim file cannot be created.
    """
    out = Path(out)
    key = os.path.abspath(out)
    if key in _HELD:
        raise OutputClaimed(f"{out}: already claimed by this process ({_HELD[key].holder.describe()})")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        holder = _acquire(out, Holder.me(command), takeover=takeover, break_lock=break_lock)
        claim = Claim(out, holder, break_lock=break_lock)
    except OSError as e:
        raise WriteError(f"{lock_path(out)}: cannot claim the output ({e.strerror or e})") from e
    _HELD[key] = claim
    restore = None
    if threading.current_thread() is threading.main_thread() and len(_HELD) == 1:
        with contextlib.suppress(ValueError, OSError):
            previous = signal.getsignal(signal.SIGTERM)
            if previous in (signal.SIG_DFL, None):
                signal.signal(signal.SIGTERM, _sigterm_handler(os.getpid(), previous))
                restore = previous
    try:
        yield claim
    finally:
        claim.release()
        if restore is not None:
            with contextlib.suppress(ValueError, OSError):
                signal.signal(signal.SIGTERM, restore)


def check_part(part: Path) -> None:
    """``packer merge``: refuse a part that is claimed (being written, or its writer died
    holding it) or unfinished (a partial beside it), naming it."""
    holder, why, exists = holder_of(lock_path(part))
    if exists:
        who = holder.describe() if holder else "an unreadable claim"
        if why is None:
            raise OutputClaimed(f"{part}: part is being written ({who}); merge it when that run is done")
        if not part.exists():
            return  # a part that never finished: the caller says "did not finish, --resume"
        raise OutputClaimed(f"{part}: part is claimed by a run that is gone ({who}; {why}); rerun its "
                            "command with --resume, then merge")
    partial = part.with_name(part.name + ".partial")
    if partial.exists() and part.exists():
        raise OutputClaimed(f"{part}: part has an unfinished rewrite beside it ({partial.name}); finish "
                            "it with --resume (or remove it), then merge")


TOKEN_NAME = ".run-token"


def _ident(path: Path) -> list[int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_dev, st.st_ino]


class PartialGuard:
    """The guard a claim hands the writer of its output (``Claim.partial``): the writer calls
    ``adopt`` before it touches an existing partial output, ``stamp`` once it opened it, and
    ``before_publish`` at its publish (whose result it calls right before the rename), so that
    only this run's own partial is published, and only while this run holds the claim. The
    writer knows it only by these three methods (``packer.formats.writer.Writer.guard``)."""

    def __init__(self, claim: "Claim", workdir: Path, journal: Path):
        self.claim = claim
        self.workdir = Path(workdir)
        self.token_file = Path(journal) / TOKEN_NAME

    def adopt(self) -> None:
        """Before the run touches an existing partial output: it must be this run's, the
        taken-over holder's, or one whose writer is gone; else OutputClaimed names who writes it."""
        tf = self.token_file
        if not (self.workdir.exists() or tf.exists()):
            return
        try:
            data, age = tf.read_bytes(), time.time() - tf.stat().st_mtime
        except OSError:
            return  # a partial without a token: written before claims existed
        owner = Holder.parse(data)
        claim = self.claim
        if owner is None or owner.token in (claim.token, claim.holder.took_over) or owner.is_me():
            return
        why = owner.gone(age)
        if why is None and not claim.break_lock:
            raise OutputClaimed(f"{self.workdir}: being written by another run ({owner.describe()}) "
                                f"that does not hold the claim on {claim.out}; --break-lock if it is "
                                "certainly gone")
        log.info("%s: partial output of %s (%s); this run takes it over", self.workdir, owner.describe(),
                 why or "--break-lock")

    def stamp(self) -> None:
        """After the writer opened its partial output: record this run's token in it."""
        data = self.claim.holder.to_bytes(partial=_ident(self.workdir))
        try:
            atomic_write_bytes(self.token_file, data)
        except OSError as e:
            raise WriteError(f"{self.token_file}: cannot write the run token ({e.strerror or e})") from e

    def before_publish(self) -> Callable[[], None]:
        """The publish step's check: this run still holds the claim and the partial carries its
        token (and is the same file or folder it stamped). Removes the token file and returns
        a re-check to call right before the rename."""
        claim = self.claim
        claim.check()
        try:
            stamp = json.loads(self.token_file.read_bytes())
        except (OSError, ValueError):
            stamp = {}
        if stamp.get("token") != claim.token:
            found = f"run token {stamp['token']}" if stamp.get("token") else "no run token"
            raise OutputClaimed(f"{self.workdir}: not published: it carries {found}, not this run's "
                                f"{claim.token} (another run wrote into it)")
        ident = _ident(self.workdir)
        if stamp.get("partial") != ident:
            raise OutputClaimed(f"{self.workdir}: not published: it was replaced since this run "
                                "created it (another run wrote into it)")
        self.token_file.unlink(missing_ok=True)

        def recheck() -> None:
            claim.check()
            if _ident(self.workdir) != ident:
                raise OutputClaimed(f"{self.workdir}: not published: it was replaced since this run "
                                    "checked it (another run wrote into it)")

        return recheck

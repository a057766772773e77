"""Real ``packer`` processes without paying the interpreter's start-up for each.

The fault suites run the CLI in a subprocess two or three times a test (a run to kill, a refused
resume, the resume that finishes), and each fresh interpreter spends ~0.35 CPU-s importing numpy,
OpenCV, h5py, LMDB and packer's commands before its few milliseconds of work. A *zygote* imports
them once (one per test process, started on first use) and forks a child per run. Each child is
still a process of its own, as ``python -c KILL_PROGRAM ARGS`` would be: its own session and
process group (``killpg`` and SIGKILL work as on a fresh one), stdin ``/dev/null``, stdout and
stderr in files, the run's environment and working directory, ``sys.argv`` as ``-c`` gives it,
the kill point armed after the fork, ``atexit`` handlers run and the streams flushed at a normal
exit, the exit status (or the killing signal) reported back.

What a fork cannot give, a fresh interpreter still does: a run whose environment differs from
the zygote's in a variable read at start-up (``_AT_START``: packer reads some at import time,
``PACKER_CLAIM_LEASE``, ``PACKER_DECODER``, ``PACKER_TURBOJPEG``), or that asks for Popen
options beyond ``cwd``, starts a real ``subprocess.Popen``. ``PACKER_TEST_ZYGOTE=0`` turns the
zygote off.

Nothing it starts outlives the test process. A run is in its own session before its pid is
reported (``killpg(pid)`` reaches it from the first instant, as after ``Popen``), and is
SIGKILLed when its zygote ends (``PR_SET_PDEATHSIG``). The zygote ends when its stdin closes
(``close``, ``close_all`` at the session's end: tests/conftest.py) or, checked every second,
when its test process is gone (its stdin may stay open in that process's own forks); either
way it SIGKILLs and reaps the runs still there, stopped ones included. (A run SIGSTOPped
before it had its own session was out of ``killpg``'s reach and outlived everything, stopped:
the "zygote" in state T of issue 40.)
"""
from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from scripts.timing import scaled

PRELOAD = ("numpy", "cv2", "PIL.Image", "h5py", "lmdb", "pebble", "click", "packer.cli", "packer.formats",
           "packer.formats.writer", "packer.formats.sidecars", "packer.commands.pack_images",
           "packer.commands.decode_frames", "packer.commands.merge", "packer.commands.inspection",
           "packer.commands.resize_tree", "packer.conversion.runner", "packer.conversion.executors")

SERVER = r"""
import atexit, ctypes, importlib, json, os, select, signal, sys, traceback
parent = int(sys.argv[3])
libc = ctypes.CDLL(None, use_errno=True)
PR_SET_PDEATHSIG = 1

def die_with(pid):
    # SIGKILL this process when its parent (single-threaded: the zygote) ends, or has already
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != pid:
        os._exit(1)

# The zygote itself watches its test process (below) rather than take PDEATHSIG from it: that
# fires when the *thread* that started it ends, and a test may start the first run on a thread.
if os.getppid() != parent:
    sys.exit(1)
reply = os.dup(1)
os.dup2(2, 1)
for name in json.loads(sys.argv[1]):
    importlib.import_module(name)
program = sys.argv[2]
r, w = os.pipe()
os.set_blocking(w, False)
signal.set_wakeup_fd(w)
signal.signal(signal.SIGCHLD, lambda *a: None)
me = os.getpid()
kids = set()

def say(msg):
    os.write(reply, (json.dumps(msg) + "\n").encode())

def end_kids():
    # a run of a test process that is gone (or of a zygote being closed) has no one to report to:
    # SIGKILL it, whatever its state (stopped ones too), with its process group, and reap it
    for pid in kids:
        for kill in (os.killpg, os.kill):
            try:
                kill(pid, signal.SIGKILL)
            except OSError:
                pass
    for pid in kids:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass

def child(req, started):
    os.setsid()
    die_with(me)  # a run never outlives its zygote
    os.write(started, b"s")  # its own session now: the zygote reports its pid only after this
    os.close(started)
    signal.set_wakeup_fd(-1)
    for s in (signal.SIGCHLD, signal.SIGINT, signal.SIGTERM, signal.SIGPIPE):
        signal.signal(s, signal.SIG_DFL if s != signal.SIGINT else signal.default_int_handler)
    os.close(r); os.close(w); os.close(reply)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    for fd, path in ((1, req["stdout"]), (2, req["stderr"])):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(f, fd)
        os.close(f)
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    sys.argv = ["-c", *req["args"]]
    code = 0
    try:
        exec(compile(program, "<string>", "exec"), {"__name__": "__main__"})
    except SystemExit as e:
        if e.code is None:
            code = 0
        elif isinstance(e.code, int):
            code = e.code
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    try:
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)

say({"ready": os.getpid()})
buf = b""
while os.getppid() == parent:  # the test process still runs (its pipe may stay open in its own forks)
    try:
        ready, _, _ = select.select([0, r], [], [], 1.0)
    except InterruptedError:
        continue
    if r in ready:
        try:
            os.read(r, 4096)
        except BlockingIOError:
            pass
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
        kids.discard(pid)
        say({"exit": pid, "code": os.waitstatus_to_exitcode(status)})
    if 0 in ready:
        data = os.read(0, 65536)
        if not data:
            break
        buf += data
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            req = json.loads(line)
            started_r, started_w = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(started_r)
                child(req, started_w)
            os.close(started_w)
            os.read(started_r, 1)  # b"" if it died first: its exit is reported as usual
            os.close(started_r)
            kids.add(pid)
            say({"pid": pid})
end_kids()
"""


class _Zygote:
    """The forking server of one test process, and the exit codes it reports."""

    def __init__(self, program: str, env: dict[str, str]) -> None:
        self.env = env
        self.proc = subprocess.Popen([sys.executable, "-c", SERVER, json.dumps(PRELOAD), program, str(os.getpid())],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        self.cond = threading.Condition()
        self.codes: dict[int, int] = {}
        self.pids: list[int] = []
        self.alive = True
        self.runs = tempfile.mkdtemp(prefix="packer-runs-")  # runs' captured output, removed at close
        first = json.loads(self.proc.stdout.readline() or b"{}")
        if "ready" not in first:
            raise RuntimeError("the test zygote did not start")
        threading.Thread(target=self._read, name="packer-test-zygote", daemon=True).start()
        atexit.register(self.close)

    def close(self) -> None:
        """End the server (its stdin closes; it SIGKILLs the runs it still has) and reap it, so its
        CPU time counts as this process's; remove the output files of runs nobody read. Again: nothing."""
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=scaled(10))
        except (OSError, ValueError, subprocess.TimeoutExpired):
            self.proc.kill()  # its runs die with it (PR_SET_PDEATHSIG)
            self.proc.wait()
        shutil.rmtree(self.runs, ignore_errors=True)

    def _read(self) -> None:
        for line in self.proc.stdout:
            msg = json.loads(line)
            with self.cond:
                if "pid" in msg:
                    self.pids.append(msg["pid"])
                else:
                    self.codes[msg["exit"]] = msg["code"]
                self.cond.notify_all()
        with self.cond:
            self.alive = False
            self.cond.notify_all()

    def start(self, args: list[str], env: dict[str, str], cwd: str, stdout: str, stderr: str) -> int:
        req = {"args": args, "env": env, "cwd": cwd, "stdout": stdout, "stderr": stderr}
        with self.cond:
            self.proc.stdin.write((json.dumps(req) + "\n").encode())
            self.proc.stdin.flush()
            if not self.cond.wait_for(lambda: self.pids or not self.alive, timeout=scaled(60)) or not self.pids:
                raise RuntimeError("the test zygote did not fork")
            return self.pids.pop(0)

    def wait(self, pid: int, timeout: float | None) -> int | None:
        """``pid``'s exit code, or None while it runs; RuntimeError if the zygote died first
        (its child's outcome is lost: a failure, never a wait without end)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.cond:
            while pid not in self.codes:
                # a child forked just before the zygote died may still hold its reply pipe (no
                # EOF yet): look at the zygote itself too
                if not self.alive or self.proc.poll() is not None:
                    raise RuntimeError(f"the test zygote died before reporting process {pid}")
                left = 0.5 if deadline is None else min(0.5, deadline - time.monotonic())
                if left <= 0:
                    return None
                self.cond.wait(left)
            return self.codes[pid]


class ForkedRun:
    """A ``subprocess.Popen`` look-alike (``pid``, ``poll``, ``wait``, ``communicate``,
    ``send_signal``/``terminate``/``kill``, ``returncode``) for a packer run forked by the zygote."""

    def __init__(self, zygote: _Zygote, args: list[str], env: dict[str, str], cwd: str | None,
                 capture: bool) -> None:
        self._z = zygote
        self._dir = tempfile.mkdtemp(prefix="run-", dir=zygote.runs) if capture else None
        out = os.path.join(self._dir, "out") if self._dir else os.devnull
        err = os.path.join(self._dir, "err") if self._dir else os.devnull
        self.args = args
        self.pid = zygote.start([str(a) for a in args], env, os.path.abspath(cwd or os.getcwd()), out, err)
        self.returncode: int | None = None

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._z.wait(self.pid, 0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self._z.wait(self.pid, timeout)
            if self.returncode is None:
                raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        self.wait(timeout)
        if self._dir is None:
            return "", ""
        folder, self._dir = Path(self._dir), None
        out, err = ((folder / name).read_text(errors="replace") for name in ("out", "err"))
        shutil.rmtree(folder)
        return out, err


#: what a forked child cannot take from its own environment, as it is read when an interpreter
#: or a library starts (the child gets the run's whole environment after the fork): packer's
#: import-time settings (``PACKER_CLAIM_LEASE``, ``PACKER_DECODER``, ...), Python's and the
#: loader's, glibc's heap and the thread pools'. Other variables drift in a test process without
#: changing a run (``import decord`` appends to PATH, Ray sets RAY_*, an AV1 encode SVT_LOG).
_AT_START = ("PACKER_", "PYTHON", "LD_", "MALLOC_", "GLIBC_", "OMP_", "MKL_", "OPENBLAS_", "OPENCV_", "HDF5_",
             "CUDA_")
#: read later, from the child's environment: the kill, hold or pause point (armed after the fork) and
#: the breakpoint hook (read by breakpoint(); Ray sets it)
_PER_RUN = ("PACKER_TEST_KILL", "PACKER_TEST_HOLD", "PACKER_TEST_PAUSE", "PYTHONBREAKPOINT")


def _comparable(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(_AT_START) and k not in _PER_RUN}


_ZYGOTE: dict[str, _Zygote] = {}
_LOCK = threading.Lock()


def close_all() -> None:
    """End every zygote of this process and the runs they still have (the session's end)."""
    with _LOCK:
        zygotes = list(_ZYGOTE.values())
        _ZYGOTE.clear()
    for z in zygotes:
        z.close()


def start(program: str, args: list[Any], env: dict[str, str], base_env: dict[str, str], *, capture: bool,
          cwd: str | None = None, **popen: Any) -> subprocess.Popen | ForkedRun:
    """``python -c program ARGS`` as a new session: forked from the zygote where that is the same
    run (``env`` equal to ``base_env`` but for the kill point, no Popen options but ``cwd``),
    else a real ``subprocess.Popen``."""
    same = _comparable(env) == _comparable(base_env)
    if popen or not same or os.environ.get("PACKER_TEST_ZYGOTE") == "0":
        pipe = subprocess.PIPE if capture else subprocess.DEVNULL
        return subprocess.Popen([sys.executable, "-c", program, *map(str, args)], env=env, cwd=cwd, stdout=pipe,
                                stderr=pipe, text=True, start_new_session=True, **popen)
    with _LOCK:
        z = _ZYGOTE.get(program)
        if z is None or not z.alive or z.proc.poll() is not None:
            z = _ZYGOTE[program] = _Zygote(program, base_env)
    return ForkedRun(z, [str(a) for a in args], env, cwd, capture)

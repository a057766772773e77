"""``packer bench``'s fresh processes: each loader configuration runs as a new training script would.

A configuration timed inside the long-lived ``packer bench`` process inherits its warm heap (pages
the earlier settings already faulted in, glibc thresholds raised by earlier frees), so it reported
what no training run sees: ``packer.Loader`` 1,358 samples/s with 2 threads where a fresh script
got ~650 (issue 35). Here every configuration (one ``num_workers`` setting of the DataLoader, the
same over ``--against``'s files, ``packer.Loader`` with 1 and with N threads) runs in its own
process with packer's default settings, which builds the dataset and the loader as a user's
script does.

``FreshProcesses`` starts one new interpreter per ``packer bench`` run
(``python -m packer.benchmark.fresh``) that imports torch and packer's loading modules and
nothing else, then forks one child per configuration: each child starts from the state a training
script has after its imports (no dataset, no loader, no heap the bench process warmed), and
imports are paid once, not per configuration (the first version started an interpreter per
configuration: tests/benchmark/test_run.py went from 14 s to 243 s). The server reaps each child with
``os.wait4``, so ``process`` is the child's whole life (its DataLoader workers included, the
interpreter's start-up and imports not); the child records the epoch it timed (``window``: from
building the loader to the end of the timed batches, reaped workers included).
"""
from __future__ import annotations

import importlib
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from typing import Any, Optional

from packer.errors import PackerError

__all__ = ["FreshProcesses", "child", "serve", "USAGE_FIELDS"]

MODULE = "packer.benchmark.fresh"
PRELOAD = ("torch", "packer.benchmark.measure", "packer.benchmark.threads", "packer.data.datasets",
           "packer.data.device", "packer.data.loader")
USAGE_FIELDS = ("wall_s", "user_s", "sys_s", "minflt", "majflt", "maxrss_mb")


class FreshProcesses:
    """A context manager: ``run(spec)`` runs one configuration in a fresh forked process of a new
    interpreter and returns ``child(spec)``'s result with ``process`` (``USAGE_FIELDS``).
    ``start()`` early lets the server import while the caller works; ``ready()`` waits for it.

    ``timeout`` (seconds) bounds each configuration; a failure or a timeout raises PackerError
    with the end of the processes' stderr.
    """

    def __init__(self, *, timeout: float = 1800.0):
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0, not {timeout!r}")
        self.timeout = timeout
        self._proc: Optional[subprocess.Popen] = None
        self._err = None
        self._ready = False

    def start(self) -> "FreshProcesses":
        """Start the server's interpreter (it imports while the caller goes on); returns self."""
        if self._proc is None:
            self._err = tempfile.TemporaryFile("w+")
            self._proc = subprocess.Popen([sys.executable, "-m", MODULE], stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, stderr=self._err, text=True,
                                          start_new_session=True)
            self._ready = False
        return self

    def ready(self) -> None:
        """Wait until the server has imported everything (call before timing anything else)."""
        if self._proc is None:
            raise PackerError("FreshProcesses: not started")
        if not self._ready:
            self._reply("start-up")
            self._ready = True

    def __enter__(self) -> "FreshProcesses":
        return self.start()

    def _stderr_tail(self) -> str:
        self._err.seek(0)
        return self._err.read()[-2000:].strip()

    def _reply(self, what: str) -> dict[str, Any]:
        timer = threading.Timer(self.timeout, self._kill)
        timer.start()
        try:
            line = self._proc.stdout.readline()
        finally:
            timer.cancel()
        if not line:
            self._kill()
            raise PackerError(f"bench: the process running {what} died or timed out: {self._stderr_tail()}")
        return json.loads(line)

    def _kill(self) -> None:
        try:  # the server and every child it forked (one session)
            os.killpg(self._proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def run(self, spec: dict[str, Any]) -> dict[str, Any]:
        """Run ``spec`` (see ``child``) in a fresh process; its result plus ``process``."""
        self.ready()
        self._proc.stdin.write(json.dumps(spec) + "\n")
        self._proc.stdin.flush()
        out = self._reply(f"configuration {spec.get('kind')}")
        if "error" in out:
            raise PackerError(f"bench configuration {spec.get('kind')} failed in its process: {out['error']}")
        return {**out["result"], "process": out["process"]}

    def close(self) -> None:
        """Stop the server (it exits when its input ends) and every child it left."""
        if self._proc is None:
            return
        try:
            self._proc.stdin.close()
            self._proc.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            self._kill()
            self._proc.wait()
        finally:
            self._err.close()
            self._proc = None

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _usage() -> dict[str, float]:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"user_s": me.ru_utime + kids.ru_utime, "sys_s": me.ru_stime + kids.ru_stime,
            "minflt": me.ru_minflt + kids.ru_minflt}


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """Build what ``spec`` names as a training script would and time it (this process's side).

    ``kind``: ``loader`` (the packed dataset through the DataLoader with ``num_workers``),
    ``folder`` (the same over the image folder ``path``) or ``threads`` (``packer.Loader`` with
    ``threads`` threads) or ``clips`` (clips of a video or frame pack, ``measure.clip_rate``).
    Returns the measured figures and ``window``.
    """
    if spec["kind"] == "clips":
        from packer.benchmark.measure import clip_rate

        before = _usage()
        out = clip_rate(spec)
        after = _usage()
        return {**out, "window": {k: after[k] - before[k] for k in before}}
    from packer.benchmark.measure import FolderDataset, make_decode, measure, timed_loader
    from packer.benchmark.threads import load_transform, loader_rate
    from packer.data.datasets import PackedDataset
    from packer.data.device import resolve_device

    pipeline = make_decode(spec["decode"], spec["resize"], spec["crop"])
    before = _usage()
    if spec["kind"] == "folder":
        dataset = FolderDataset(spec["path"], pipeline)
    else:
        dataset = PackedDataset(spec["path"], decode=pipeline, transform=load_transform(spec.get("transform")))
    if spec["kind"] == "threads":
        out: dict[str, Any] = {"samples_per_s": loader_rate(dataset, threads=spec["threads"],
                                                            batch_size=spec["batch_size"], batches=spec["batches"])}
    else:
        dev = resolve_device(spec.get("device"))
        loader = timed_loader(dataset, num_workers=spec["num_workers"], batch_size=spec["batch_size"],
                              batches=spec["steps"] + 1, seed=spec["seed"], pin=dev.type == "cuda")
        # On a GPU the batches go through DevicePrefetcher as in the README's loop (normalized on
        # the GPU). On the CPU they are taken as a script iterating the loader takes them: the
        # normalization there ran in this process beside the decode, and torch's intra-op threads
        # it woke competed with it for the CPUs (num_workers=0: 93 samples/s at 6.7 CPU ms each
        # where the plain loop read 203 at 4.1, issue 43); what the step costs is the ceiling's row.
        out = measure(loader, device=dev, steps=spec["steps"], batch_size=spec["batch_size"],
                      model_ms=spec["model_ms"], tick=lambda: None, normalize=dev.type == "cuda")
    after = _usage()
    out["window"] = {k: after[k] - before[k] for k in before}
    return out


def _fork_one(spec: dict[str, Any]) -> dict[str, Any]:
    """Fork, run ``child(spec)`` in the child, reap it with ``os.wait4``: result or error, and usage."""
    read_fd, write_fd = os.pipe()
    start = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # the configuration's process
        os.close(read_fd)
        code = 0
        try:
            out: dict[str, Any] = {"result": child(spec)}
        except BaseException as e:  # reported to the parent, which raises PackerError
            out, code = {"error": f"{type(e).__name__}: {e}\n{traceback.format_exc()[-1500:]}"}, 1
        try:
            with os.fdopen(write_fd, "w") as f:
                f.write(json.dumps(out))
        finally:
            os._exit(code)
    os.close(write_fd)
    with os.fdopen(read_fd) as f:
        data = f.read()
    _, status, ru = os.wait4(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    out = json.loads(data) if data else {"error": f"the process exited with status {code}"}
    out["process"] = {"wall_s": time.perf_counter() - start, "user_s": ru.ru_utime, "sys_s": ru.ru_stime,
                      "minflt": ru.ru_minflt, "majflt": ru.ru_majflt, "maxrss_mb": ru.ru_maxrss / 1024}
    return out


def serve() -> None:
    """The server: import what a training script imports, then one forked child per spec line."""
    reply = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # anything a configuration prints goes to stderr, not into the replies
    for name in PRELOAD:  # what every configuration imports, paid once
        importlib.import_module(name)

    reply.write(json.dumps({"ready": True}) + "\n")
    reply.flush()
    for line in sys.stdin:
        spec = json.loads(line)
        # the parent's import path after this one's (a --transform module beside the user's script)
        sys.path += [p for p in spec.get("sys_path", []) if p not in sys.path]
        reply.write(json.dumps(_fork_one(spec)) + "\n")
        reply.flush()


if __name__ == "__main__":
    serve()

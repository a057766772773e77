"""What every benchmark shares: generated images, a fresh process per configuration, machine
information and the JSON each benchmark writes (``render.py`` turns the latest of each into
``docs/benchmarks.md``).

A ``--quick`` run (tiny sizes: it proves a benchmark works, its figures mean nothing) calls
``fork_rows()``: its rows then run in children forked from one row server per benchmark module, a
fresh interpreter that imported the module and torch and computed nothing, instead of a new
interpreter per row. A full run starts every row in a new interpreter.

Run the benchmarks from the repository root as modules (``python -m scripts.bench.read``), with
the package importable (installed, or ``PYTHONPATH=$PWD``); nothing here edits ``sys.path``.
"""
from __future__ import annotations

import argparse
import atexit
import datetime as _dt
import hashlib
import importlib
import io
import json
import math
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, Callable

from packer.synth import write_video, write_video_folder  # noqa: F401 (the benchmarks' videos)

__all__ = ["REPO", "RESULTS", "machine_info", "write_result", "target", "md_table", "image_folder", "run_fresh", "proc_usage",
           "descendants", "usage_delta", "command_line", "run_sections", "write_video", "write_video_folder",
           "fork_rows", "run_call", "serve_rows"]

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench-out" / "results"  # --results; the committed copies live in docs/bench-results


# -- machine and results -----------------------------------------------------------------------------
def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(REPO), "describe", "--always", "--dirty", "--abbrev=12"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def machine_info() -> dict[str, Any]:
    """Cores, CPU model, memory, load average, date (UTC), Python / torch / numpy versions, the
    accelerator if any, and the checkout's commit: what a reader needs to place the figures."""
    import numpy

    info: dict[str, Any] = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "cores": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "load_avg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "platform": platform.platform(),
        "commit": _git_commit(),
    }
    try:
        info["mem_gib"] = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        pass
    try:
        import torch

        info["torch"] = torch.__version__
        info["gpu"] = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    except ImportError:
        info["torch"] = None
    return info


def command_line() -> str:
    """The command that is running, as a user would type it (``python -m scripts.bench.x ...``)."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    head = ["python", "-m", spec.name] if spec is not None and spec.name else ["python", sys.argv[0]]
    return shlex.join(head + sys.argv[1:])


def write_result(bench: str, figures: dict[str, Any], *, results: Path | str | None = None,
                 machine: dict[str, Any] | None = None, command: str | None = None,
                 notes: list[str] | None = None) -> Path:
    """Write one run's JSON (``bench``, machine, command, figures) under ``results`` and return
    its path; the file name carries the benchmark and the UTC time, so the latest sorts last."""
    folder = Path(results) if results is not None else RESULTS
    folder.mkdir(parents=True, exist_ok=True)
    machine = machine or machine_info()
    machine.setdefault("load_avg_end", list(os.getloadavg()) if hasattr(os, "getloadavg") else None)
    doc = {"bench": bench, "machine": machine, "command": command or command_line(),
           "notes": notes or [], "figures": figures}
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    path = folder / f"{bench}-{stamp}.json"
    n = 1
    while path.exists():  # two runs within a second
        n += 1
        path = folder / f"{bench}-{stamp}-{n}.json"
    path.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    print(f"results: {path}", file=sys.stderr)
    return path


def md_table(columns: list[str], rows: list[list[Any]]) -> str:
    """A markdown table (numbers formatted by the caller)."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def target(name: str, value: float | None, goal: float | None = None, who: str = "",
           at_most: bool = False) -> dict[str, Any]:
    """One figure of a section's JSON ``targets`` list (what render.py and the README table read):
    ``value`` against ``goal`` (``>=``, or ``<=`` when ``at_most``; ``met`` is None without a goal
    or a value)."""
    if value is not None and math.isnan(value):  # e.g. no CPU time in a window too short to tick
        value = None
    met = None if value is None or goal is None else (value <= goal if at_most else value >= goal)
    return {"name": name, "value": value, "target": goal, "at_most": at_most, "met": met, "who": who}


# -- images ------------------------------------------------------------------------------------------
def _make_part(args: tuple[str, int, int, tuple[int, int], int, int]) -> str:
    from packer.synth import make_image_folder

    root, count, classes, size, seed, quality = args
    make_image_folder(root, count=count, classes=classes, size=size, seed=seed, quality=quality)
    return root


def image_folder(root: Path | str, *, count: int, classes: int = 10, size: tuple[int, int] = (432, 576),
                 quality: int = 90, jobs: int | None = None) -> Path:
    """An ImageFolder of ``count`` photo-like JPEGs from ``packer.synth`` (``size`` jittered by
    +-1/8), made once in ``jobs`` parallel parts and reused while the spec and packer.synth are
    unchanged."""
    import packer.synth

    root = Path(root)
    jobs = max(1, min(jobs or os.cpu_count() or 1, count))
    synth = hashlib.sha256(Path(packer.synth.__file__).read_bytes()).hexdigest()[:16]
    spec = {"count": count, "classes": classes, "size": list(size), "quality": quality, "parts": jobs,
            "synth": synth}
    marker = root.parent / f"{root.name}.json"
    if root.is_dir() and marker.is_file() and json.loads(marker.read_text()) == spec:
        return root
    shutil.rmtree(root, ignore_errors=True)
    parts = root.parent / f"{root.name}.parts"
    shutil.rmtree(parts, ignore_errors=True)
    per = [count // jobs + (1 if k < count % jobs else 0) for k in range(jobs)]
    t = time.perf_counter()
    with ProcessPoolExecutor(jobs) as ex:
        made = list(ex.map(_make_part, [(str(parts / str(k)), n, classes, tuple(size), 1000 + k, quality)
                                        for k, n in enumerate(per)]))
    for k, part in enumerate(made):  # merge the parts into one ImageFolder
        for f in sorted(Path(part).rglob("*.jpg")):
            dest = root / f.parent.name / f"p{k}_{f.name}"
            dest.parent.mkdir(parents=True, exist_ok=True)
            f.rename(dest)
    shutil.rmtree(parts)
    marker.write_text(json.dumps(spec))
    print(f"generated {count} JPEGs in {time.perf_counter() - t:.0f} s -> {root}", file=sys.stderr)
    return root


# -- fresh processes ---------------------------------------------------------------------------------
def _clock_ticks() -> int:
    return os.sysconf("SC_CLK_TCK")


def proc_usage(pids: list[int]) -> dict[str, float]:
    """Summed user and system CPU seconds and minor faults of live processes, from /proc (Linux):
    the window figures of a process and its DataLoader workers while they run."""
    user = system = minflt = 0.0
    tck = _clock_ticks()
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        minflt += int(fields[7])
        user += int(fields[11]) / tck
        system += int(fields[12]) / tck
    return {"user_s": user, "sys_s": system, "minflt": minflt}


def descendants(pid: int) -> list[int]:
    """The live processes below ``pid`` (children, grandchildren, ...), from /proc (Linux): a
    loader's workers however it keeps them (a DataLoader iterator's ``_workers``, LitData's
    generator, a peer's own pool)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def usage_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """``after - before`` of two ``proc_usage`` readings."""
    return {k: after[k] - before[k] for k in before}


_FORK = False  # set by fork_rows(): a --quick run
_SERVERS: dict[str, "_RowServer"] = {}
# variables packer reads when a module is imported: a row that sets one needs its own interpreter
_IMPORT_TIME_ENV = ("PACKER_DECODER", "PACKER_TURBOJPEG")


def fork_rows(enabled: bool = True) -> None:
    """Run this process's later ``run_fresh`` and ``run_call`` rows as children forked from a row
    server (``serve_rows``): what ``--quick`` does, where the figures mean nothing and a new
    interpreter per row (~2 CPU-s of start-up and imports each) only costs the tests time. A full
    run never calls it: every row a fresh interpreter is the benchmarks' contract."""
    global _FORK
    _FORK = enabled


def _usage_of(ru: Any, wall: float) -> dict[str, float]:
    return {"wall_s": wall, "user_s": ru.ru_utime, "sys_s": ru.ru_stime, "minflt": ru.ru_minflt,
            "majflt": ru.ru_majflt, "maxrss_mb": ru.ru_maxrss / 1024}


def _fork_one(module: Any, request: dict[str, Any]) -> dict[str, Any]:
    """Fork; the child sets the row's environment, runs ``module.main(argv)`` (or ``module.func(**kwargs)``,
    printing its JSON) with its stdout on a pipe and exits as an interpreter does (atexit: its DataLoader
    workers stopped and joined); the server reads the pipe and reaps the child with ``os.wait4``, killing
    it after ``timeout`` seconds."""
    read_fd, write_fd = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    start = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # the row's process
        code = 1
        try:
            os.close(read_fd)
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)  # the server's request pipe is not the row's
            os.dup2(write_fd, 1)
            os.close(write_fd)
            signal.signal(signal.SIGALRM, signal.SIG_DFL)
            os.environ.update(request.get("env") or {})
            if "func" in request:
                print(json.dumps(getattr(module, request["func"])(**request["kwargs"])))
                code = 0
            else:
                code = module.main(request["argv"]) or 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        except BaseException:  # noqa: BLE001 - the row failed: its traceback on stderr, its status 1
            traceback.print_exc()
        finally:
            try:
                sys.stdout.flush()
                atexit._run_exitfuncs()  # what the interpreter does at exit (joins DataLoader workers)
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)
    os.close(write_fd)

    def kill(*_: Any) -> None:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    signal.signal(signal.SIGALRM, kill)
    signal.setitimer(signal.ITIMER_REAL, request["timeout"])
    try:
        with os.fdopen(read_fd, errors="replace") as f:
            out = f.read()
        _, status, ru = os.wait4(pid, 0)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    return {"out": out, "code": os.waitstatus_to_exitcode(status),
            "process": _usage_of(ru, time.perf_counter() - start)}


def serve_rows(module: str) -> None:
    """The row server of a --quick run (``fork_rows``): import ``module``, torch and the module's
    ``FORK_PRELOAD`` once, compute nothing (torch's thread pools do not survive a fork once used),
    then fork one child per request line on stdin and answer each with a line on stdout."""
    reply = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # what the server itself prints goes to stderr, not into the replies
    mod = importlib.import_module(module)
    for name in ("torch", *getattr(mod, "FORK_PRELOAD", ())):
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    reply.write('{"ready": true}\n')
    reply.flush()
    os.set_inheritable(reply.fileno(), False)
    for line in sys.stdin:
        reply.write(json.dumps(_fork_one(mod, json.loads(line))) + "\n")
        reply.flush()


class _RowServer:
    """The parent's end of ``serve_rows``: a fresh interpreter started once per module and run."""

    def __init__(self, module: str):
        code = f"from scripts.bench.common import serve_rows; serve_rows({module!r})"
        self.proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        if not self.proc.stdout or not self.proc.stdout.readline():
            raise RuntimeError(f"the row server of {module} did not start (exit {self.proc.wait()})")

    def run(self, request: dict[str, Any]) -> dict[str, Any]:
        if self.proc.stdin is None or self.proc.stdout is None:  # pragma: no cover - Popen made both pipes
            raise RuntimeError("the row server has no pipes")
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the row server died (exit {self.proc.wait()})")
        return json.loads(line)

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@atexit.register
def _close_servers() -> None:
    while _SERVERS:
        _SERVERS.popitem()[1].close()


def _forked(module: str, request: dict[str, Any]) -> dict[str, Any]:
    if module not in _SERVERS:
        _SERVERS[module] = _RowServer(module)
    return _SERVERS[module].run(request)


def run_fresh(module: str, spec: dict[str, Any], *, timeout: float = 600.0,
              cwd: str | Path | None = None, python: str | None = None) -> dict[str, Any]:
    """Run ``python -m module --child SPEC.json`` in a fresh interpreter (default settings, as a user's
    training script starts) and return the JSON it prints last, with the child's whole-life
    wall time, user and system CPU, minor and major faults and peak RSS (``os.wait4``: the child
    and every worker process it reaped) under ``process``. A child that fails or times out
    gives ``{"error": ...}``. ``cwd``: another checkout to run in (default this one); ``-m``
    puts it first on ``sys.path``, so the child imports that checkout's packer and module.
    ``python``: the interpreter (default this one; another virtual environment's, for peers whose
    dependencies clash with packer's). After ``fork_rows()`` (``--quick``) a row of this
    interpreter and checkout runs ``module.main(["--child", SPEC.json])`` in a child forked from
    the module's row server instead (its ``process`` then leaves out the interpreter's start-up)."""
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="bench-spec-", delete=False) as f:
        json.dump(spec, f)  # a file, not argv: a spec may list thousands of paths
    row_env = spec.get("env") or {}
    try:
        if _FORK and cwd is None and python is None and not set(row_env) & set(_IMPORT_TIME_ENV):
            r = _forked(module, {"argv": ["--child", f.name], "env": row_env, "timeout": timeout})
            out, code, usage = r["out"], r["code"], r["process"]
        else:
            out, code, usage = _run_interpreter([python or sys.executable, "-m", module, "--child", f.name],
                                                cwd=cwd, env=row_env, timeout=timeout)
    finally:
        os.unlink(f.name)
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if code != 0 or not lines:
        return {"error": f"exit {code}" + (" (timed out)" if usage["wall_s"] >= timeout else ""), "process": usage}
    result = json.loads(lines[-1])
    result["process"] = usage
    return result


def _run_interpreter(cmd: list[str], *, cwd: str | Path | None, env: dict[str, str],
                     timeout: float) -> tuple[str, int, dict[str, float]]:
    """Run ``cmd`` (a new interpreter), killed after ``timeout`` s: its stdout, exit status and ``os.wait4`` usage."""
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd or REPO, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, **env} if env else None)  # a row's own settings (PACKER_*)
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    try:
        out = proc.stdout.read() if proc.stdout else ""
        _, status, ru = os.wait4(proc.pid, 0)
    finally:
        timer.cancel()
    proc.returncode = os.waitstatus_to_exitcode(status)
    return out, proc.returncode, _usage_of(ru, time.perf_counter() - t)


def child_row(argv: list[str], child: Callable[[dict[str, Any]], dict[str, Any]]) -> bool:
    """The child side of ``run_fresh``: with ``argv`` ``--child SPEC.json``, run ``child(spec)``
    and print its JSON (what ``run_fresh`` reads back); False for any other ``argv``."""
    if argv[:1] != ["--child"]:
        return False
    with open(argv[1]) as f:
        print(json.dumps(child(json.load(f))))
    return True


def run_call(module: str, func: str, kwargs: dict[str, Any], *, timeout: float | None = None) -> dict[str, Any]:
    """``module.func(**kwargs)`` in a fresh interpreter (``python -c``; a row that patches packer, so
    no row inherits another's patches, heap or imports), returning the JSON-able dict it returns;
    raises RuntimeError with the row's stderr when it fails. After ``fork_rows()`` (``--quick``) the
    row is a child forked from the module's row server instead."""
    if _FORK:
        r = _forked(module, {"func": func, "kwargs": kwargs, "timeout": timeout or 0})
        lines = [line for line in r["out"].splitlines() if line.startswith("{")]
        if r["code"] != 0 or not lines:
            raise RuntimeError(f"{module}.{func} failed in its forked child: exit {r['code']} (its stderr is above)")
        return json.loads(lines[-1])
    code = f"import json; from {module} import {func}; print(json.dumps({func}(**{kwargs!r})))"
    run = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=timeout,
                         env=dict(os.environ, PYTHONPATH=str(REPO)))
    if run.returncode:
        raise RuntimeError(run.stderr[-2000:])
    return json.loads(run.stdout.strip().splitlines()[-1])


# -- benchmarks made of sections that print markdown ----------------------------------------------------
class _Tee(io.TextIOBase):
    """Write to the terminal and keep a copy (a section's printed markdown goes in the JSON)."""

    def __init__(self, stream: Any):
        self.stream, self.copy = stream, io.StringIO()

    def write(self, text: str) -> int:
        self.stream.write(text)
        return self.copy.write(text)

    def flush(self) -> None:
        self.stream.flush()


def run_sections(bench: str, doc: str, sections: dict[str, Callable[[list[str]], Any]], *,
                 all_sections: tuple[str, ...], quick: dict[str, list[str]], notes: list[str],
                 argv: list[str] | None = None) -> int:
    """``python -m scripts.bench.<bench> SECTION [--quick] [--results DIR] [section options]``:
    run the section(s), print their markdown and write it, with the machine and the command, as
    the benchmark's JSON. A section is ``fn(argv)`` that prints markdown and may return a dict of
    figures (kept under ``figures``)."""
    def parser(add_help: bool) -> argparse.ArgumentParser:
        ap = argparse.ArgumentParser(prog=f"python -m scripts.bench.{bench}", description=doc.split("\n\n")[0],
                                     add_help=add_help,
                                     epilog=f"Section options: python -m scripts.bench.{bench} SECTION --help")
        ap.add_argument("section", choices=[*sections, "all"],
                        help="what to measure (all: " + ", ".join(all_sections) + ")")
        ap.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run that proves the section works")
        ap.add_argument("--results", type=Path, default=None, help="folder for the JSON (default bench-out/results)")
        return ap

    argv = sys.argv[1:] if argv is None else argv
    if not any(a in sections or a == "all" for a in argv):
        parser(True).parse_args(argv)  # --help, or the error that names the sections
    args, rest = parser(False).parse_known_args(argv)  # -h/--help after a section is the section's
    if "-h" in rest or "--help" in rest:
        sections[args.section if args.section != "all" else all_sections[0]](["--help"])
        return 0
    machine = machine_info()
    if args.quick:
        fork_rows()
    figures: dict[str, Any] = {"quick": args.quick, "sections": {}}
    for name in all_sections if args.section == "all" else (args.section,):
        section_argv = (quick.get(name, []) if args.quick else []) + rest
        tee = _Tee(sys.stdout)
        saved, sys.stdout = sys.stdout, tee
        t = time.perf_counter()
        try:
            extra = sections[name](section_argv)
        finally:
            sys.stdout = saved
        figures["sections"][name] = {"argv": section_argv, "seconds": time.perf_counter() - t,
                                     "markdown": tee.copy.getvalue().strip(),
                                     **({"figures": extra} if isinstance(extra, dict) else {})}
    write_result(bench, figures, results=args.results, machine=machine, notes=notes)
    return 0

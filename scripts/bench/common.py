"""What every benchmark shares: generated images, a fresh process per configuration, machine
information and the JSON each benchmark writes (``render.py`` turns the latest of each into
``docs/benchmarks.md``).

Run the benchmarks from the repository root as modules (``python -m scripts.bench.read``), with
the package importable (installed, or ``PYTHONPATH=$PWD``); nothing here edits ``sys.path``.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import io
import json
import math
import os
import platform
import shlex
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, Callable

from packer.synth import write_video, write_video_folder  # noqa: F401 (the benchmarks' videos)

__all__ = ["REPO", "RESULTS", "machine_info", "write_result", "target", "image_folder", "run_fresh", "proc_usage",
           "descendants", "usage_delta", "command_line", "run_sections", "write_video", "write_video_folder"]

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


def run_fresh(module: str, spec: dict[str, Any], *, timeout: float = 600.0,
              cwd: str | Path | None = None, python: str | None = None) -> dict[str, Any]:
    """Run ``python -m module --child SPEC.json`` in a fresh interpreter (default settings, as a user's
    training script starts) and return the JSON it prints last, with the child's whole-life
    wall time, user and system CPU, minor and major faults and peak RSS (``os.wait4``: the child
    and every worker process it reaped) under ``process``. A child that fails or times out
    gives ``{"error": ...}``. ``cwd``: another checkout to run in (default this one); ``-m``
    puts it first on ``sys.path``, so the child imports that checkout's packer and module.
    ``python``: the interpreter (default this one; another virtual environment's, for peers whose
    dependencies clash with packer's)."""
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="bench-spec-", delete=False) as f:
        json.dump(spec, f)  # a file, not argv: a spec may list thousands of paths
    cmd = [python or sys.executable, "-m", module, "--child", f.name]
    t = time.perf_counter()
    env = {**os.environ, **spec["env"]} if spec.get("env") else None  # a row's own settings (PACKER_*)
    proc = subprocess.Popen(cmd, cwd=cwd or REPO, stdout=subprocess.PIPE, text=True, env=env)
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    try:
        out = proc.stdout.read() if proc.stdout else ""
        _, status, ru = os.wait4(proc.pid, 0)
    finally:
        timer.cancel()
        os.unlink(f.name)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t
    usage = {"wall_s": wall, "user_s": ru.ru_utime, "sys_s": ru.ru_stime, "minflt": ru.ru_minflt,
             "majflt": ru.ru_majflt, "maxrss_mb": ru.ru_maxrss / 1024}
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"error": f"exit {proc.returncode}" + (" (timed out)" if wall >= timeout else ""), "process": usage}
    result = json.loads(lines[-1])
    result["process"] = usage
    return result


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

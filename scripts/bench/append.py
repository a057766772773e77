"""Benchmark ``--append`` (issue 46): appending 1% to a pack against packing it, fresh processes.

For each format: an ImageFolder of ``--n`` small JPEGs is packed (``packer to-<fmt>``); then
``--n / 100`` more images (spread over the classes, as a week of new data is) are added to the
tree and appended (``--append``); the tree with them is also packed from scratch. Every run is
a fresh interpreter (``packer`` as a user starts it); each row gives the wall and CPU seconds of
the pack call and of the whole process (imports included). The ratio is the append's against
the pack of the ``--n`` images (target: about 0.01, i.e. the 1% it adds). Rounds alternate the
rows so that load from other processes hits them alike; the table shows the median and range.

Usage: python -m scripts.bench.append append [--n 100000] [--formats lmdb,records,hdf5] [--rounds 2]
                                             [--workers N]
       python -m scripts.bench.append --quick append
"""
from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from scripts.bench.common import REPO, image_folder, md_table, run_sections, target

WORK = REPO / "bench-out" / "append"


def timed_pack(src: str, out: str, fmt: str, append: bool, workers: int | None) -> dict[str, Any]:
    """One ``packer.pack`` in this (fresh) process: wall and CPU seconds of the call (the process
    and its workers), and what the report says."""
    import packer

    def cpu() -> float:
        me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime

    phases = _time_phases() if append else {}
    c, t = cpu(), time.perf_counter()
    report = packer.pack(src, out, format=fmt, workers=workers, append=append)
    row = {"wall_s": time.perf_counter() - t, "cpu_s": cpu() - c, "count": report.count,
           "added": report.added if append else report.count, "status": report.status}
    if append:
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        row["phases_cpu"] = {**phases, "workers": kids.ru_utime + kids.ru_stime}
        row["phases_cpu"]["pack"] = phases.get("run", 0.0) - phases.get("publish", 0.0)
    if append:  # the floor of any append: list the tree, stat every input (what --resume does too)
        from packer.conversion.fingerprint import file_stat
        from packer.conversion.inputs import image_items

        t = time.perf_counter()
        items, _ = image_items(src)
        row["listing_s"] = time.perf_counter() - t
        t = time.perf_counter()
        for it in items:
            file_stat(it.path)
        row["stat_s"] = time.perf_counter() - t
    return row


def _time_phases() -> dict[str, float]:
    """CPU seconds of this process in each phase of the append about to run, filled in as it
    runs: ``listing`` (walking the tree), ``plan`` (reading the output's keys and input table,
    one stat per input, the comparison), ``run`` (packing the new inputs and publishing) and
    ``publish`` (``Writer.close``: the sidecars and the manifest). The functions the command
    calls are wrapped in place (this process runs nothing else)."""
    import functools

    import packer.commands.pack_images as command
    from packer.formats.writer import Writer

    spent: dict[str, float] = {}

    def timed(owner: Any, name: str, phase: str) -> None:
        real = getattr(owner, name)

        @functools.wraps(real)
        def call(*args: Any, **kwargs: Any) -> Any:
            c = time.process_time()
            try:
                return real(*args, **kwargs)
            finally:
                spent[phase] = spent.get(phase, 0.0) + time.process_time() - c
        setattr(owner, name, call)

    for name, phase in (("image_items", "listing"), ("plan_append", "plan"), ("run", "run")):
        timed(command, name, phase)
    timed(Writer, "close", "publish")
    return spent


def _row(src: Path, out: Path, fmt: str, append: bool, workers: int | None) -> dict[str, Any]:
    """``timed_pack`` in a new interpreter, with that process's whole wall and CPU time."""
    code = ("import json; from scripts.bench.append import timed_pack; "
            f"print(json.dumps(timed_pack({str(src)!r}, {str(out)!r}, {fmt!r}, {append!r}, {workers!r})))")
    t = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=str(REPO)))
    out_text = proc.stdout.read() if proc.stdout else ""
    _, status, ru = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status):
        raise RuntimeError(f"to-{fmt} {'--append ' if append else ''}failed (exit {status})")
    import json

    row = json.loads(out_text.strip().splitlines()[-1])
    row["process_wall_s"] = time.perf_counter() - t
    row["process_cpu_s"] = ru.ru_utime + ru.ru_stime
    return row


def _trees(n: int, work: Path, size: tuple[int, int] = (72, 96)) -> tuple[Path, Path, list[Path]]:
    """(the whole generated tree, the tree to pack: linked files, the 1% held back for the append)."""
    h, w = size
    every = image_folder(work / f"images-{n}-{h}x{w}", count=n + n // 100, classes=10, size=size)
    files = sorted(every.rglob("*.jpg"))
    late = set(files[::101][: n // 100])  # spread over the classes and the sorted order
    src = work / f"src-{n}"
    shutil.rmtree(src, ignore_errors=True)
    for f in files:
        if f not in late:
            dest = src / f.relative_to(every)
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.link(f, dest)
    return every, src, sorted(late)


def _add(every: Path, src: Path, late: list[Path]) -> None:
    for f in late:
        os.link(f, src / f.relative_to(every))


def _remove(every: Path, src: Path, late: list[Path]) -> None:
    for f in late:
        (src / f.relative_to(every)).unlink()


def _out(work: Path, fmt: str, name: str) -> Path:
    out = work / (f"{name}.h5" if fmt == "hdf5" else f"{name}.{fmt}")
    for p in (out, out.with_name(out.name + ".parts"), out.with_name(out.name + ".failures.jsonl")):
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
    return out


def section_append(argv: list[str]) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog="python -m scripts.bench.append append")
    ap.add_argument("--n", type=int, default=100_000, help="images in the pack (the append adds n/100)")
    ap.add_argument("--formats", default="lmdb,records,hdf5")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--workers", type=int, default=None, help="worker processes (default: packer's choice)")
    ap.add_argument("--size", default="72x96", help="HxW of the generated images (photo-like: 375x500)")
    args = ap.parse_args(argv)
    size = tuple(int(v) for v in args.size.lower().split("x"))
    WORK.mkdir(parents=True, exist_ok=True)
    every, src, late = _trees(args.n, WORK, size)
    figures: dict[str, Any] = {"n": args.n, "size": list(size), "added": len(late), "targets": [], "rows": {}}
    rows, phase_rows = [], []
    print(f"\n== append {len(late)} images to a pack of {args.n} {size[0]}x{size[1]} JPEGs ({args.rounds} rounds, fresh processes, "
          f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}) ==\n")
    for fmt in args.formats.split(","):
        runs: dict[str, list[dict[str, Any]]] = {"pack": [], "append": [], "pack all": []}
        for _ in range(args.rounds):
            out = _out(WORK, fmt, "grown")
            runs["pack"].append(_row(src, out, fmt, False, args.workers))
            _add(every, src, late)
            try:
                runs["append"].append(_row(src, out, fmt, True, args.workers))
                runs["pack all"].append(_row(src, _out(WORK, fmt, "all"), fmt, False, args.workers))
            finally:
                _remove(every, src, late)
        assert all(r["added"] == len(late) for r in runs["append"]), runs["append"]
        med = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0] if k.endswith("_s")}
               for name, rs in runs.items()}
        ratio = [a["wall_s"] / p["wall_s"] for a, p in zip(runs["append"], runs["pack"])]
        ratio_cpu = [a["cpu_s"] / p["cpu_s"] for a, p in zip(runs["append"], runs["pack"])]
        ratio_proc = [a["process_wall_s"] / p["process_wall_s"] for a, p in zip(runs["append"], runs["pack"])]
        phases = {k: statistics.median(r["phases_cpu"].get(k, 0.0) for r in runs["append"])
                  for k in ("listing", "plan", "pack", "publish", "workers")}
        n_in = args.n + len(late)
        phase_rows.append([fmt, *(f"{phases[k]:.3f}" for k in phases),
                           f"{statistics.median(r['cpu_s'] for r in runs['append']):.3f}",
                           f"{(phases['listing'] + phases['plan']) / n_in * 1e6:.2f}"])
        for name in runs:
            m = med[name]
            floor = (f"{m['listing_s']:.2f} + {m['stat_s']:.2f}" if "listing_s" in m else "")
            rows.append([fmt, name, f"{m['wall_s']:.2f}", f"{m['cpu_s']:.2f}", f"{m['process_wall_s']:.2f}",
                         f"{m['process_cpu_s']:.2f}", floor])
        rows.append([fmt, "**append / pack**", f"{statistics.median(ratio):.4f} ({min(ratio):.4f}-{max(ratio):.4f})",
                     f"{statistics.median(ratio_cpu):.4f} ({min(ratio_cpu):.4f}-{max(ratio_cpu):.4f})",
                     f"{statistics.median(ratio_proc):.4f} ({min(ratio_proc):.4f}-{max(ratio_proc):.4f})", "", ""])
        figures["rows"][fmt] = {"runs": runs, "ratio_wall": ratio, "ratio_cpu": ratio_cpu, "ratio_process": ratio_proc}
        figures["targets"].append(target(f"{fmt}: append 1% / pack, wall of the call", statistics.median(ratio),
                                         0.02, who="packer", at_most=True))
    print(md_table(["format", "row", "call wall s", "call CPU s", "process wall s", "process CPU s",
                    "listing + stat s"], rows))
    print(f"\nrows: pack = `to-FMT` of the {args.n} images; append = `--append` of {len(late)} more to it; "
          f"pack all = the {args.n + len(late)} packed from scratch. Ratios: median (range) over rounds; "
          "process figures include the interpreter's start and imports. listing + stat: in the append's "
          "process, after it, listing the tree and one stat per input alone (the floor of any append "
          "that compares the inputs, as --resume does). Target: the append's wall <= 0.02 of the pack's "
          "(it adds 1%).")
    print(f"\nThe append's CPU seconds by phase (median over rounds): listing = walking the tree; plan = "
          "reading the output's keys and input table, one stat per input and the comparison; pack = "
          f"packing the {len(late)} new inputs in this process; publish = the sidecars and the manifest "
          "of the new version; workers = the worker processes' CPU. Per input: listing + plan over the "
          f"{args.n + len(late)} inputs.\n")
    print(md_table(["format", "listing s", "plan s", "pack s", "publish s", "workers s", "the call s",
                    "listing + plan µs/input"], phase_rows))
    figures["phases"] = phase_rows
    return figures


SECTIONS = {"append": section_append}


def main(argv: list[str] | None = None) -> int:
    return run_sections("append", __doc__, SECTIONS, all_sections=("append",),
                        quick={"append": ["--n", "2000", "--rounds", "1"]},
                        notes=["each row a fresh interpreter; wall and CPU of the pack call and of the whole process"],
                        argv=argv)


if __name__ == "__main__":
    sys.exit(main())

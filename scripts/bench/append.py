"""Benchmark ``--append`` (issue 46): appending 1% to a pack against packing it, fresh processes.

For each format: an ImageFolder of ``--n`` small JPEGs is packed (``packer to-<fmt>``); then
``--n / 100`` more images (spread over the classes, as a week of new data is) are added to the
tree and appended (``--append``); the tree with them is also packed from scratch. Every run is
a fresh interpreter (``packer`` as a user starts it); each row gives the wall and CPU seconds of
the pack call and of the whole process (imports included). The ratio is the append's against
the pack of the ``--n`` images (target: about 0.01, i.e. the 1% it adds). Rounds alternate the
rows so that load from other processes hits them alike; the table shows the median and range.

The *floor* row is what any append that compares every input's identity (path, size, mtime, as
``--resume`` does) cannot do without, in a fresh interpreter of its own: importing packer,
listing the grown tree (``image_items``) and one ``stat`` per input (``file_stats``), nothing
else. ``--base-tree PATH`` (a checkout of the code before, ``git worktree add ../base <commit>``)
also appends with that checkout, in the same rounds, to a copy of the same pack: the rows side
by side.

Usage: python -m scripts.bench.append append [--n 100000] [--formats lmdb,records,hdf5] [--rounds 2]
                                             [--workers N] [--base-tree PATH]
       python -m scripts.bench.append --quick append
"""
from __future__ import annotations

import argparse
import inspect
import json
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
DRIVER_HEAD = "from __future__ import annotations\nimport json, resource, time\nfrom typing import Any\n\n"


def timed_pack(src: str, out: str, fmt: str, append: bool, workers: int | None) -> dict[str, Any]:
    """One ``packer.pack`` in this (fresh) process: wall and CPU seconds of the call (the process
    and its workers), and what the report says. (Also run from ``--base-tree``'s checkout, as
    ``DRIVER``: it uses only what packer had before.)"""
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
    return row


def timed_floor(src: str) -> dict[str, Any]:
    """The floor of any append that compares every input (what ``--resume`` compares too), in
    this (fresh) process: list the tree and stat every input, nothing else; wall and CPU
    seconds of each step."""
    from packer.conversion.fingerprint import file_stats
    from packer.conversion.inputs import image_items

    c, t = time.process_time(), time.perf_counter()
    items, _ = image_items(src)
    c1, t1 = time.process_time(), time.perf_counter()
    file_stats([it.path for it in items])
    c2, t2 = time.process_time(), time.perf_counter()
    return {"wall_s": t2 - t, "cpu_s": c2 - c, "listing_s": t1 - t, "stat_s": t2 - t1,
            "listing_cpu_s": c1 - c, "stat_cpu_s": c2 - c1, "inputs": len(items)}


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


def _row(src: Path, out: Path | None, fmt: str, append: bool, workers: int | None,
         tree: Path = REPO) -> dict[str, Any]:
    """``timed_pack`` (``out`` None: ``timed_floor``) in a new interpreter running the packer of
    checkout ``tree``, with that process's whole wall and CPU time."""
    if out is None:
        call = f"timed_floor({str(src)!r})"
    else:
        call = f"timed_pack({str(src)!r}, {str(out)!r}, {fmt!r}, {append!r}, {workers!r})"
    # (this file's timing functions alone, run by the packer of ``tree``: its scripts may differ)
    code = (DRIVER_HEAD + "".join(inspect.getsource(f) + "\n\n" for f in (timed_pack, _time_phases, timed_floor))
            + f"print(json.dumps({call}))\n")
    t = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=tree, stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=str(tree)))
    out_text = proc.stdout.read() if proc.stdout else ""
    _, status, ru = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status):
        raise RuntimeError(f"to-{fmt} {'--append ' if append else ''}failed in {tree} (exit {status})")
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
    for p in _companions(out):
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
    return out


def _companions(out: Path) -> tuple[Path, ...]:
    return out, out.with_name(out.name + ".parts"), out.with_name(out.name + ".failures.jsonl")


def _copy(out: Path, dest: Path) -> None:
    """A copy of the output at ``out`` (and its files beside it) at ``dest`` (removed first)."""
    for a, b in zip(_companions(out), _companions(dest)):
        shutil.rmtree(b, ignore_errors=True) if b.is_dir() else b.unlink(missing_ok=True)
        if a.is_dir():
            shutil.copytree(a, b)
        elif a.exists():
            shutil.copy2(a, b)


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.4f} ({min(values):.4f}-{max(values):.4f})"


def section_append(argv: list[str]) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog="python -m scripts.bench.append append")
    ap.add_argument("--n", type=int, default=100_000, help="images in the pack (the append adds n/100)")
    ap.add_argument("--formats", default="lmdb,records,hdf5")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--workers", type=int, default=None, help="worker processes (default: packer's choice)")
    ap.add_argument("--size", default="72x96", help="HxW of the generated images (photo-like: 375x500)")
    ap.add_argument("--base-tree", type=Path, default=None,
                    help="a checkout of the code before: its append runs beside this one's, on a copy of the same pack")
    args = ap.parse_args(argv)
    size = tuple(int(v) for v in args.size.lower().split("x"))
    base_tree = args.base_tree.resolve() if args.base_tree is not None else None
    WORK.mkdir(parents=True, exist_ok=True)
    every, src, late = _trees(args.n, WORK, size)
    figures: dict[str, Any] = {"n": args.n, "size": list(size), "added": len(late), "targets": [], "rows": {},
                               "base_tree": str(base_tree) if base_tree else None}
    rows, phase_rows = [], []
    print(f"\n== append {len(late)} images to a pack of {args.n} {size[0]}x{size[1]} JPEGs ({args.rounds} rounds, fresh processes, "
          f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}) ==\n")
    appends = ["append"] + (["append (base)"] if base_tree else [])
    for fmt in args.formats.split(","):
        runs: dict[str, list[dict[str, Any]]] = {"pack": [], **{a: [] for a in appends}, "floor": [], "pack all": []}
        for r in range(args.rounds):
            out = _out(WORK, fmt, "grown")
            runs["pack"].append(_row(src, out, fmt, False, args.workers))
            base_out = _out(WORK, fmt, "grown-base")
            if base_tree:
                _copy(out, base_out)
            _add(every, src, late)
            try:  # (the order alternates: load from other processes hits the rows alike)
                for name in (appends if r % 2 == 0 else appends[::-1]):
                    if name == "append":
                        runs[name].append(_row(src, out, fmt, True, args.workers))
                    else:
                        runs[name].append(_row(src, base_out, fmt, True, args.workers, tree=base_tree))
                runs["floor"].append(_row(src, None, fmt, False, None))
                runs["pack all"].append(_row(src, _out(WORK, fmt, "all"), fmt, False, args.workers))
            finally:
                _remove(every, src, late)
        for name in appends:
            assert all(r["added"] == len(late) for r in runs[name]), runs[name]
        med = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0] if k.endswith("_s")}
               for name, rs in runs.items()}
        ratios: dict[str, dict[str, list[float]]] = {}
        for name in appends + ["floor"]:
            ratios[name] = {k: [a[k] / p[k] for a, p in zip(runs[name], runs["pack"])]
                            for k in ("wall_s", "cpu_s", "process_wall_s", "process_cpu_s")}
        n_in = args.n + len(late)
        for name in appends:
            phases = {k: statistics.median(r["phases_cpu"].get(k, 0.0) for r in runs[name])
                      for k in ("listing", "plan", "pack", "publish", "workers")}
            phase_rows.append([fmt + (" (base)" if name != "append" else ""), *(f"{phases[k]:.3f}" for k in phases),
                               f"{statistics.median(r['cpu_s'] for r in runs[name]):.3f}",
                               f"{(phases['listing'] + phases['plan']) / n_in * 1e6:.2f}"])
        fl = med["floor"]
        phase_rows.append([f"{fmt}: floor", f"{fl['listing_cpu_s']:.3f}", f"{fl['stat_cpu_s']:.3f} (stat)", "", "", "",
                           f"{fl['cpu_s']:.3f}", f"{fl['cpu_s'] / n_in * 1e6:.2f}"])
        for name in runs:
            m = med[name]
            rows.append([fmt, name, f"{m['wall_s']:.2f}", f"{m['cpu_s']:.2f}", f"{m['process_wall_s']:.2f}",
                         f"{m['process_cpu_s']:.2f}"])
        for name in appends + ["floor"]:
            rt = ratios[name]
            rows.append([fmt, f"**{name} / pack**", _spread(rt["wall_s"]), _spread(rt["cpu_s"]),
                         _spread(rt["process_wall_s"]), _spread(rt["process_cpu_s"])])
        figures["rows"][fmt] = {"runs": runs, "ratio_wall": ratios["append"]["wall_s"],
                                "ratio_cpu": ratios["append"]["cpu_s"],
                                "ratio_process": ratios["append"]["process_wall_s"],
                                "ratio_process_cpu": ratios["append"]["process_cpu_s"],
                                "ratios": ratios}
        figures["targets"].append(target(f"{fmt}: append 1% / pack, wall of the call",
                                         statistics.median(ratios["append"]["wall_s"]), 0.02, who="packer", at_most=True))
        figures["targets"].append(target(f"{fmt}: append 1% / pack, CPU of the call",
                                         statistics.median(ratios["append"]["cpu_s"]), 0.02, who="packer", at_most=True))
        figures["targets"].append(target(f"{fmt}: append 1% / pack, CPU of the process",
                                         statistics.median(ratios["append"]["process_cpu_s"]), 0.02, who="packer",
                                         at_most=True))
        figures["targets"].append(target(f"{fmt}: floor (listing + one stat per input) / pack, CPU of the process",
                                         statistics.median(ratios["floor"]["process_cpu_s"]), 0.02, who="packer",
                                         at_most=True))
    print(md_table(["format", "row", "call wall s", "call CPU s", "process wall s", "process CPU s"], rows))
    base_note = (f"; append (base) = the same append by the checkout at {base_tree} (the code before), to a copy "
                 "of the same pack, in the same rounds" if base_tree else "")
    print(f"\nrows: pack = `to-FMT` of the {args.n} images; append = `--append` of {len(late)} more to it{base_note}; "
          f"floor = a fresh interpreter that imports packer, lists the grown tree and stats every input, nothing "
          f"else (what any append that compares every input by path, size and mtime, as --resume does, cannot do "
          f"without); pack all = the {args.n + len(late)} packed from scratch. Ratios against the pack: median "
          "(range) over rounds; process figures include the interpreter's start and imports. Target: the "
          "append's <= 0.02 of the pack's (it adds 1%).")
    print(f"\nThe append's CPU seconds by phase (median over rounds): listing = walking the tree; plan = "
          "reading the output's keys and input table, one stat per input and the comparison; pack = "
          f"packing the {len(late)} new inputs in this process; publish = the sidecars and the manifest "
          "of the new version; workers = the worker processes' CPU. Per input: listing + plan over the "
          f"{args.n + len(late)} inputs. The floor's row: its listing and its stats (CPU of the steps, no "
          "imports).\n")
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

"""``packer bench SRC --write``: how fast packing SRC can go here, and what bounds it.

Packs the image folder ``SRC`` into a scratch output once per ``--workers`` value (best of
``reps`` runs each, interleaved), measuring wall time and CPU time apart: the CPU this
process spends per sample is the single writer's cost, so ``1e6 / writer_us`` is the
*writer ceiling* (samples/s it can absorb however many workers feed it); the CPU the worker
processes spend per sample is the work that spreads over cores. The model for N cores:

    rate(N) ~= min(writer ceiling, N * 1e6 / worker_us)     (records: no writer ceiling to
                                                             speak of: the workers write)

and the measured 1 -> 2 worker scaling says how far this machine follows it.
"""
from __future__ import annotations

import os
import resource
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

from packer.commands.pack_images import pack_images
from packer.conversion.plans import choose_plan
from packer.formats import writer_class
from packer.conversion.options import RunOptions

__all__ = ["run_write_bench", "format_write_report"]


def _cpu() -> tuple[float, float]:
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime, c.ru_utime + c.ru_stime


def run_write_bench(src: str | os.PathLike, *, to: str = "records", check: str = "header",
                    workers: Sequence[int] = (0, 1, 2), reps: int = 2,
                    scratch: str | os.PathLike | None = None) -> dict[str, Any]:
    """Pack ``src`` with each ``workers`` value; figures per setting and the model's inputs."""
    if reps < 1:
        raise ValueError("reps must be >= 1")
    root = Path(tempfile.mkdtemp(prefix="packer-bench-write-", dir=scratch))
    rows: dict[int, dict[str, float]] = {}
    try:
        for r in range(reps):
            for w in list(workers)[r % len(workers):] + list(workers)[:r % len(workers)]:
                out = root / f"out-{w}"
                own0, kids0 = _cpu()
                t = time.perf_counter()
                report = pack_images(src, out, format=to, check=check,
                                     run_options=RunOptions(workers=w, overwrite=True, max_failures=10**9))
                wall = time.perf_counter() - t
                own1, kids1 = _cpu()
                n = max(1, report.count)
                row = {"samples": report.count, "wall_s": wall, "samples_per_s": n / wall,
                       "writer_us": (own1 - own0) / n * 1e6, "worker_us": (kids1 - kids0) / n * 1e6}
                if w not in rows or wall < rows[w]["wall_s"]:
                    rows[w] = row
                shutil.rmtree(out, ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    plans = {w: choose_plan(writer=writer_class(to), check=check, workers=w, resizing=False).mode for w in rows}
    result: dict[str, Any] = {"src": str(src), "to": to, "check": check, "cores": os.cpu_count(),
                              "load_average": list(os.getloadavg()), "settings": {}, "plans": plans}
    for w, row in rows.items():
        result["settings"][w] = row
    parallel = [w for w in rows if w >= 1 and plans[w] != "inline"]
    if parallel:
        w = max(parallel)
        row = rows[w]
        result["writer_ceiling"] = 1e6 / row["writer_us"] if row["writer_us"] > 0 else float("inf")
        result["worker_us"] = row["worker_us"]
    if 1 in rows and 2 in rows:
        result["scaling_1_to_2"] = rows[2]["samples_per_s"] / rows[1]["samples_per_s"]
    return result


def predicted(result: dict[str, Any], cores: int) -> float | None:
    """The model's samples/s on ``cores`` cores: min(writer ceiling, cores x one worker's rate)."""
    if "worker_us" not in result or result["worker_us"] <= 0:
        return None
    return min(result["writer_ceiling"], cores * 1e6 / result["worker_us"])


def format_write_report(result: dict[str, Any]) -> str:
    """The table, the writer's ceiling, the 1 -> 2 scaling and the model for N cores."""
    lines = [f"packing {result['src']} -> {result['to']} (--check {result['check']}), "
             f"{result['cores']} cores, load average {result['load_average'][0]:.2f}", "",
             "| --workers | plan | samples/s | writer CPU us/sample | workers' CPU us/sample |",
             "|---:|---|---:|---:|---:|"]
    for w, row in sorted(result["settings"].items()):
        lines.append(f"| {w} | {result['plans'][w]} | {row['samples_per_s']:,.0f} | {row['writer_us']:,.0f} "
                     f"| {row['worker_us']:,.0f} |")
    lines.append("")
    if "writer_ceiling" in result:
        lines.append(f"writer ceiling: {result['writer_ceiling']:,.0f} samples/s (what one writer "
                     "process absorbs, however many workers feed it)")
        model = ", ".join(f"{n} cores ~{predicted(result, n):,.0f}/s" for n in (2, 8, 32))
        lines.append(f"model rate(N) = min(ceiling, N x {1e6 / result['worker_us']:,.0f}/s): {model}")
    if "scaling_1_to_2" in result:
        lines.append(f"1 -> 2 workers: {result['scaling_1_to_2']:.2f}x")
    return "\n".join(lines)

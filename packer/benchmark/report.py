"""``packer bench``'s conclusions from the measurements: the verdict per setting, the recommended
DataLoader settings, the text report and the plot.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from packer.errors import UsageError

__all__ = ["DATA_BOUND_BELOW", "recommend", "verdict", "decoders_line", "format_report", "plot_bench"]

DATA_BOUND_BELOW = 0.95


def recommend(result: dict[str, Any]) -> dict[str, Any]:
    """``result["recommended"]``: the fewest workers within 5% of the best, persistent_workers,
    prefetch_factor, and the reasons for each."""
    settings = result["settings"]
    best = max(s["samples_per_s"] for s in settings)
    pick = min((s for s in settings if s["samples_per_s"] >= 0.95 * best), key=lambda s: s["num_workers"])
    w = pick["num_workers"]
    reasons = [f"num_workers={w}: {pick['samples_per_s']:.0f} samples/s, within 5% of the best measured "
               f"({best:.0f})"]
    if pick["data_bound"]:
        more = " (the largest tested; try more if CPUs are free)" if w == max(s["num_workers"] for s in settings) else ""
        cheaper = "pre-resizing (packer resize)" if result["decode"] == "fast" else "--decode fast"
        reasons.append(f"still data-bound: the loop could take {pick['slowdown']:.2f}x more{more}; "
                       f"{cheaper} or the device cache would help")
    persistent = False
    if w > 0:
        epoch_s = result["count"] / max(pick["samples_per_s"], 1e-9)
        frac = pick["worker_startup_s"] / max(epoch_s, 1e-9)
        persistent = frac > 0.01
        reasons.append(f"worker start-up costs {pick['worker_startup_s']:.2f} s per epoch "
                       f"({100 * frac:.1f}% of a {epoch_s:.1f} s epoch): persistent_workers="
                       f"{'True' if persistent else 'False (not worth it)'}")
    prefetch = None
    if w > 0:
        step_ms = 1000 * result["batch_size"] / max(result["ceiling"]["samples_per_s"], 1e-9)
        if pick["data_bound"]:
            prefetch = 2
            reasons.append("prefetch_factor=2 (default): prefetching cannot add throughput when data-bound")
        elif pick["wait_ms_p95"] > 0.1 * step_ms:
            prefetch = 4
            reasons.append(f"prefetch_factor=4: waits spike to {pick['wait_ms_p95']:.1f} ms (p95) against a "
                           f"{step_ms:.1f} ms step; a deeper queue absorbs the jitter")
        else:
            prefetch = 2
            reasons.append("prefetch_factor=2 (default) keeps up: waits stay short")
    cache = result.get("cache")
    if cache and cache["fits"]:
        reasons.append(f"the decoded dataset ({cache['bytes'] / 2**30:.2f} GiB) fits on {cache['device']}: "
                       f"DevicePrefetcher.cache(dataset) serves it with no per-epoch CPU work")
    return {"num_workers": w, "persistent_workers": persistent, "prefetch_factor": prefetch, "reasons": reasons}


def verdict(s: dict[str, Any], ceiling: float) -> str:
    """One line for a setting: data-bound (and by how much) or not."""
    if s["data_bound"]:
        return (f"data-bound: loader {s['samples_per_s']:.0f} samples/s, the loop takes {ceiling:.0f} "
                f"({s['slowdown']:.2f}x)")
    return f"not data-bound: loader keeps up ({100 * s['ratio_to_ceiling']:.0f}% of the ceiling)"


def decoders_line(d: dict[str, Any] | None) -> str:
    """Which JPEG decoder runs and whether region decoding is active (``result["decoders"]``)."""
    if not d:
        return "JPEG decoders: not recorded"
    region = f"on ({d['backend']}: {d['library']})" if d["region"] else \
        "off: the crops decode whole images (docs/loading.md, region decoding)"
    return f"JPEG decoder: {d['full']}; region decoding: {region}"


def format_report(result: dict[str, Any]) -> str:
    """The human-readable table of a ``run_bench`` result."""
    r = result
    lines = [f"{r['path']}: {r['format']}, {r['count']} samples, {r['sample_bytes'] / 1e3:.1f} KB/sample stored; "
             f"batch {r['batch_size']}, decode {r['decode']} ({r['resize']} -> {r['crop']}), "
             f"device {r['device']}, {r['cpu_count']} CPUs, model step {r['model_ms']:g} ms",
             decoders_line(r.get("decoders")),
             f"ceiling (same batches from memory, same consumer): {r['ceiling']['samples_per_s']:.0f} samples/s"]
    against = any(s["against"] for s in r["settings"])
    lines.append("each setting in a fresh process with default settings; CPU and page faults per sample "
                 "of its epoch, its workers included")
    head = f"{'workers':>7} {'samples/s':>10} {'MB/s':>7} {'vs ceiling':>10} {'first batch':>11}"
    head += f" {'CPU ms':>6} {'sys':>4} {'faults':>6}"
    head += f" {'vs files':>8}" if against else ""
    lines += [head + "  verdict"]
    per = (r["steps"] + 1) * r["batch_size"]
    for s in r["settings"]:
        win = s["window"]
        cpu = win["user_s"] + win["sys_s"]
        row = (f"{s['num_workers']:>7} {s['samples_per_s']:>10.0f} {s['mb_per_s']:>7.1f} "
               f"{s['ratio_to_ceiling']:>9.2f}x {s['first_batch_s']:>9.2f} s"
               f" {1000 * cpu / per:>6.1f} {100 * win['sys_s'] / max(cpu, 1e-9):>3.0f}% {win['minflt'] / per:>6.0f}")
        if against:
            row += f" {s['against']['ratio']:>7.2f}x"
        lines.append(row + "  " + s["verdict"])
    rec = r["recommended"]
    lines.append(f"recommended: num_workers={rec['num_workers']}, persistent_workers={rec['persistent_workers']}"
                 + (f", prefetch_factor={rec['prefetch_factor']}" if rec["prefetch_factor"] else ""))
    lines += [f"  - {reason}" for reason in rec["reasons"]]
    from packer.benchmark.threads import format_extras

    lines += format_extras(r)
    c = r["cache"]
    if c:
        free = "unknown" if c["free_bytes"] is None else f"{c['free_bytes'] / 2**30:.2f} GiB free"
        lines.append(f"device cache: {r['count']} x {'x'.join(map(str, c['sample_shape']))} uint8 = "
                     f"{c['bytes'] / 2**30:.2f} GiB; {c['device']} has {free}: "
                     f"{'fits' if c['fits'] else 'does not fit (needs <= half the free memory)'}")
    if r.get("fidelity"):
        from packer.benchmark.fidelity import format_fidelity

        lines += [f"fidelity on {r['fidelity'][0]['images']} samples (reference: full decode + Lanczos "
                  "from the exact box; shift in output pixels):", format_fidelity(r["fidelity"])]
    return "\n".join(lines)


def plot_bench(result: dict[str, Any], out: str | os.PathLike) -> None:
    """Draw samples/s against num_workers with the ceiling as a line (needs ``packer[plot]``)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UsageError("--plot needs matplotlib: pip install 'packer[plot]'") from None
    ws = [s["num_workers"] for s in result["settings"]]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(ws, [s["samples_per_s"] for s in result["settings"]], "o-", label=f"{result['format']} loader")
    if any(s["against"] for s in result["settings"]):
        ax.plot(ws, [s["against"]["samples_per_s"] for s in result["settings"]], "s--", label="original files")
    ax.axhline(result["ceiling"]["samples_per_s"], color="k", linestyle=":", label="ceiling (from memory)")
    ax.set_xlabel("num_workers")
    ax.set_ylabel("samples/s")
    ax.set_xticks(ws)
    ax.set_ylim(bottom=0)
    ax.set_title(f"packer bench: {Path(result['path']).name}, batch {result['batch_size']}, {result['decode']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)

"""Soak test: stream a packed dataset for many epochs through a multi-process DataLoader whose
workers restart every epoch (or, with ``--persistent``, live through every epoch), and check that nothing grows: the RSS of each worker and of the
main process, and the open file descriptors of the main process.

    python -m scripts.check.soak --epochs 30 --workers 2 --images 400 --format lmdb

Builds a small dataset under ``bench-out/soak`` (or reads ``--path``), prints one line per
epoch and a JSON summary, and exits 1 when a worker's RSS grows by more than ``--max-growth-mb``
between the first measured epoch and the last, or the main process holds more descriptors at
the end than after the first epoch. Linux only (reads /proc). Not part of the test run.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from packer import PackedDataset
from packer.commands.pack_images import pack_images
from packer.conversion.options import RunOptions

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_mb(pid: int) -> float:
    """Resident set size of ``pid`` in MiB (from /proc/PID/statm)."""
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * PAGE / 2**20


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def make_images(root: Path, count: int) -> Path:
    import numpy as np

    from packer.synth import jpeg_bytes, natural_image

    rng = np.random.default_rng(0)
    for i in range(count):
        d = root / f"class_{i % 4}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"img_{i:05d}.jpg").write_bytes(jpeg_bytes(natural_image(rng, 96, 128)))
    return root


class Sampler(threading.Thread):
    """Samples the workers' RSS and descriptors every ``period`` seconds while an epoch runs."""

    def __init__(self, period: float = 0.05):
        super().__init__(daemon=True)
        self.period, self.stop, self.peak = period, threading.Event(), {}

    def run(self) -> None:
        me = os.getpid()
        while not self.stop.is_set():
            for pid in children(me):
                try:
                    rss, fds = rss_mb(pid), fd_count(pid)
                except OSError:
                    continue
                old = self.peak.get(pid, (0.0, 0))
                self.peak[pid] = (max(old[0], rss), max(old[1], fds))
            time.sleep(self.period)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--path", help="an existing packed dataset (default: build one)")
    ap.add_argument("--format", default="lmdb")
    ap.add_argument("--images", type=int, default=400)
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--warmup", type=int, default=3, help="epochs before the baseline is taken")
    ap.add_argument("--max-growth-mb", type=float, default=8.0)
    ap.add_argument("--persistent", action="store_true",
                    help="keep the same workers across epochs (default: fresh workers every epoch)")
    args = ap.parse_args()

    if args.path:
        path = Path(args.path)
    else:
        root = Path("bench-out/soak")
        src = root / "src"
        if not src.exists():
            make_images(src, args.images)
        path = root / ("data.h5" if args.format == "hdf5" else f"data.{args.format}")
        if not path.exists():
            pack_images(src, path, format=args.format, run_options=RunOptions(workers=0))
    ds = PackedDataset(path, decode="tensor")
    loader = DataLoader(ds, batch_size=args.batch_size, shuffle=True, num_workers=args.workers,
                        persistent_workers=args.persistent)  # default: fresh workers every epoch
    me = os.getpid()
    rows, pids = [], set()
    for epoch in range(args.epochs):
        sampler = Sampler()
        sampler.start()
        t0, seen = time.perf_counter(), 0
        for images, labels in loader:
            seen += int(labels.shape[0])
            assert images.dtype == torch.uint8
        sampler.stop.set()
        sampler.join()
        pids |= set(sampler.peak)
        worker_rss = [v[0] for v in sampler.peak.values()]
        worker_fds = [v[1] for v in sampler.peak.values()]
        row = {"epoch": epoch, "samples": seen, "s": round(time.perf_counter() - t0, 2),
               "workers_seen": len(worker_rss),
               "worker_rss_mb_max": round(max(worker_rss, default=0.0), 1),
               "worker_fds_max": max(worker_fds, default=0),
               "main_rss_mb": round(rss_mb(me), 1), "main_fds": fd_count(me)}
        rows.append(row)
        print(json.dumps(row), flush=True)
        if seen != len(ds):
            print(f"epoch {epoch}: {seen} samples, expected {len(ds)}", file=sys.stderr)
            return 1
    base, last = rows[min(args.warmup, len(rows) - 1)], rows[-1]
    summary = {
        "path": str(path), "format": ds.reader.format_name if hasattr(ds, "reader") else args.format,
        "epochs": args.epochs, "workers": args.workers, "persistent_workers": args.persistent, "samples_per_epoch": len(ds),
        "worker_processes": len(pids),
        "worker_rss_mb": [base["worker_rss_mb_max"], last["worker_rss_mb_max"]],
        "worker_rss_growth_mb": round(last["worker_rss_mb_max"] - base["worker_rss_mb_max"], 1),
        "main_rss_mb": [base["main_rss_mb"], last["main_rss_mb"]],
        "main_rss_growth_mb": round(last["main_rss_mb"] - base["main_rss_mb"], 1),
        "main_fds": [rows[0]["main_fds"], last["main_fds"]],
        "worker_fds": [base["worker_fds_max"], last["worker_fds_max"]],
    }
    ok = (summary["worker_rss_growth_mb"] <= args.max_growth_mb
          and summary["main_rss_growth_mb"] <= args.max_growth_mb
          and last["main_fds"] <= rows[0]["main_fds"]
          and last["worker_fds_max"] <= base["worker_fds_max"] + 2)  # +2: a sample may catch a pipe mid-setup
    summary["ok"] = ok
    print(json.dumps(summary, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
"""What writing a file costs in system time right after another file was deleted, and later.

On a virtual machine whose host takes freed guest memory back (free page reporting), the
first write into such a page costs the host's fault on top of the copy; a page freed a moment
before has not been taken back yet. A benchmark row that deletes its last output just before
writing (a bare loop) then writes into warm pages, and one that keeps the old output until the
new one is complete (packer's ``--overwrite``) into cold ones. ``scripts/bench_write.py``
removes every row's output before timing it for that reason; this script shows the effect on
the machine it runs on:

    python scripts/page_warmth.py --dir /tmp --mb 640 --reps 3

Each round writes ``--mb`` MB (in 50 MB writes, then fsync) into a new file after deleting
the previous one, with a pause of 0, 0.5, 2 and 8 s between the delete and the write, and
prints the write's system CPU time. On bare metal the pause changes nothing.
"""
from __future__ import annotations

import argparse
import os
import resource
import time
from pathlib import Path

PAUSES = (0.0, 0.5, 2.0, 8.0)


def write_file(path: Path, block: bytes, blocks: int) -> float:
    """System CPU seconds to write ``blocks`` x ``block`` into a new ``path`` and fsync it."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_stime
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for _ in range(blocks):
            os.write(fd, block)
        os.fsync(fd)
    finally:
        os.close(fd)
    return resource.getrusage(resource.RUSAGE_SELF).ru_stime - before


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default="/tmp", help="a folder on the disk to measure")
    ap.add_argument("--mb", type=int, default=640, help="MB per file (in 50 MB writes)")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    block = os.urandom(50 << 20)
    blocks = max(1, args.mb // 50)
    path = Path(args.dir) / f".page-warmth-{os.getpid()}.bin"
    least = {p: float("inf") for p in PAUSES}
    try:
        write_file(path, block, blocks)
        for _ in range(args.reps):
            for pause in PAUSES:
                path.unlink()
                time.sleep(pause)
                least[pause] = min(least[pause], write_file(path, block, blocks))
    finally:
        path.unlink(missing_ok=True)
    mb = blocks * 50
    print(f"{mb} MB written into a new file after deleting a {mb} MB one (least of {args.reps}):\n")
    print("| pause between the delete and the write | system CPU s | µs per 4 KiB page |\n|---:|---:|---:|")
    for pause, s in least.items():
        print(f"| {pause:g} s | {s:.2f} | {s / (mb * 256) * 1e6:.1f} |")


if __name__ == "__main__":
    main()

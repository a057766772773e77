"""Packing the same images from a folder, from Parquet files and from WebDataset tar shards.

Does a dataset source cost memory or speed? N small JPEGs (default 100,000 of about 64x64, made
once by ``packer.synth``) are written three ways: an ImageFolder tree (``class_k/name.jpg``),
Parquet files as ``datasets`` writes them (an ``Image`` struct column and a ``ClassLabel``
label in the ``huggingface`` schema metadata; 10,000 rows a file, ``--row-group`` rows a row
group, 100 by default as the Hub's Parquet of image datasets) and WebDataset shards
(``webdataset.TarWriter``, 10,000 samples a shard, a ``.jpg`` and a ``.cls`` each). Each row
packs one of them with ``python -m packer to-lmdb SRC OUT`` (plus ``--check``'s setting) in a
fresh interpreter; ``os.wait4`` gives its CPU time (user + system, the process and every
worker) and its peak RSS (the largest process of the run). Rounds interleave the rows in a new
order each time, so load from other users of a shared machine hits them alike; the table gives
the medians and the range over the rounds.

    python -m scripts.bench.sources                    # 100,000 images, 3 rounds
    python -m scripts.bench.sources --n 20000          # a shorter run
    python -m scripts.bench.sources --quick            # 300 images, one round: proves it runs

Targets (issue 42): peak RSS under 400 MB from Parquet and from shards; images per CPU-second at
least 0.8x the folder's.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from scripts.bench.common import REPO, descendants, image_folder, machine_info, md_table, target, write_result

SOURCES = ("folder", "parquet", "wds")
PER_FILE = 10_000


def _files(tree: Path) -> list[tuple[str, str, bytes]]:
    """(class, stem, bytes) of every JPEG of the tree, in packer's folder order."""
    out = []
    for cls in sorted(p.name for p in tree.iterdir() if p.is_dir()):
        for f in sorted((tree / cls).iterdir()):
            out.append((cls, f.stem, f.read_bytes()))
    return out


def _made_once(tree: Path, dest: Path) -> tuple[list, list[str]] | None:
    """None when ``dest`` was made before (its ``.done`` marker is there); else an empty ``dest``
    and the tree's files and sorted classes to make it from."""
    if (dest.parent / f"{dest.name}.done").exists():
        return None
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    files = _files(tree)
    return files, sorted({c for c, _, _ in files})


def make_parquet(tree: Path, dest: Path, row_group: int) -> Path:
    """The tree as Parquet files with Hugging Face features (made once)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    made = _made_once(tree, dest)
    if made is None:
        return dest
    files, classes = made
    meta = {"info": {"features": {"image": {"_type": "Image"},
                                  "label": {"_type": "ClassLabel", "names": classes}}}}
    image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    schema = pa.schema([("image", image_type), ("label", pa.int64())],
                       metadata={"huggingface": json.dumps(meta)})
    for k in range(0, len(files), PER_FILE):
        part = files[k:k + PER_FILE]
        table = pa.table({"image": pa.array([{"bytes": d, "path": f"{s}.jpg"} for _, s, d in part], image_type),
                          "label": pa.array([classes.index(c) for c, _, _ in part], pa.int64())}, schema=schema)
        pq.write_table(table, dest / f"train-{k // PER_FILE:05d}.parquet", row_group_size=row_group)
    (dest.parent / f"{dest.name}.done").write_text("done")
    return dest


def make_shards(tree: Path, dest: Path) -> Path:
    """The tree as WebDataset shards with ``.cls`` labels (made once, by ``webdataset.TarWriter``)."""
    import webdataset as wds

    made = _made_once(tree, dest)
    if made is None:
        return dest
    files, classes = made
    for k in range(0, len(files), PER_FILE):
        with wds.TarWriter(str(dest / f"shard-{k // PER_FILE:06d}.tar")) as w:
            for c, s, d in files[k:k + PER_FILE]:
                w.write({"__key__": f"{c}/{s}", "jpg": d, "cls": classes.index(c)})
    (dest.parent / f"{dest.name}.done").write_text("done")
    return dest


def _hwm_mb(pid: int) -> float:
    """``VmHWM`` of a live process in MB (0 when it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _row(src: Path, out: Path, check: str) -> dict[str, float]:
    """One fresh ``packer to-lmdb`` run: its CPU seconds (``os.wait4``: the process and its
    workers), wall seconds and peak RSS in MB: the largest ``VmHWM`` of the process and its
    workers, polled every 50 ms from here. (Not ``wait4``'s ``ru_maxrss``: an exec keeps the
    high-water mark of the process image it replaces, this benchmark's own, torch and all.)"""
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "packer", "to-lmdb", str(src), str(out), "--check", check]
    start = time.perf_counter()
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        peak = 0.0
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            peak = max([peak, _hwm_mb(proc.pid), *(_hwm_mb(p) for p in descendants(proc.pid))])
            time.sleep(0.05)
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            log.seek(0)
            raise RuntimeError(f"{' '.join(cmd)}: exit {proc.returncode}\n{log.read()[-2000:].decode(errors='replace')}")
    return {"cpu_s": usage.ru_utime + usage.ru_stime, "wall_s": time.perf_counter() - start, "maxrss_mb": peak}


def listing_costs(shards: Path) -> dict[str, float]:
    """CPU microseconds per tar member of listing the shards: ``tarfile`` (each member's header,
    as its iteration reads them) against packer's header scan (``scan_shard``) and the whole
    listing (``shard_items``: samples grouped, checked and made items), in this process."""
    import tarfile

    from packer.conversion.inputs import parse_exts
    from packer.conversion.shards import scan_shard, shard_items

    files = sorted(shards.glob("*.tar"))
    t = time.process_time()
    members = 0
    for f in files:
        with tarfile.open(f) as tar:
            for _ in tar:
                members += 1
                tar.members.clear()  # (as a stream: no list of every member kept)
    spent = {"tarfile": time.process_time() - t}
    t = time.process_time()
    for f in files:
        with open(f, "rb") as fh:
            for _ in scan_shard(fh, f.stat().st_size):
                pass
    spent["scan_shard"] = time.process_time() - t
    t = time.process_time()
    shard_items(shards, exts=parse_exts(None), failures=[])
    spent["shard_items"] = time.process_time() - t
    return {k: 1e6 * v / members for k, v in spent.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=100_000, help="images")
    ap.add_argument("--size", type=int, default=64, help="image side (jittered by +-1/8)")
    ap.add_argument("--row-group", type=int, default=100, help="Parquet rows per row group")
    ap.add_argument("--checks", default="full,header", help="--check settings to run (comma-separated)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="300 images, one round: proves it runs")
    ap.add_argument("--workdir", type=Path, default=Path("bench-out/sources"))
    ap.add_argument("--results", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.quick:
        args.n, args.rounds = 300, 1
    checks = [c for c in args.checks.split(",") if c]
    work = args.workdir.resolve()
    machine = machine_info()
    tree = image_folder(work / f"tree-{args.n}-{args.size}", count=args.n, classes=10, size=(args.size, args.size))
    srcs = {"folder": tree, "parquet": make_parquet(tree, work / f"parquet-{args.n}-{args.size}-{args.row_group}",
                                                    args.row_group),
            "wds": make_shards(tree, work / f"wds-{args.n}-{args.size}")}
    costs = listing_costs(srcs["wds"])  # before the rows: the shards' pages are as warm as after their making
    rows = [(s, c) for c in checks for s in SOURCES]
    runs: dict[str, list[dict[str, float]]] = {f"{s} --check {c}": [] for s, c in rows}
    rng = random.Random(0)
    for rnd in range(args.rounds):
        order = list(rows)
        rng.shuffle(order)
        for s, c in order:
            runs[f"{s} --check {c}"].append(_row(srcs[s], work / "out" / f"{s}.lmdb", c))
        print(f"round {rnd + 1}/{args.rounds} done (load {os.getloadavg()[0]:.1f})", file=sys.stderr, flush=True)
    shutil.rmtree(work / "out", ignore_errors=True)
    table, targets = [], []
    for s, c in rows:
        got = runs[f"{s} --check {c}"]
        rate = [args.n / r["cpu_s"] for r in got]
        rss = [r["maxrss_mb"] for r in got]
        folder = [args.n / r["cpu_s"] for r in runs[f"folder --check {c}"]]
        paired = [a / b for a, b in zip(rate, folder)]  # each round's ratio (the rows ran minutes apart)
        table.append([f"`to-lmdb --check {c}` from {s}", f"{statistics.median(rate):.0f} ({min(rate):.0f}-{max(rate):.0f})",
                      f"{statistics.median(paired):.2f} ({min(paired):.2f}-{max(paired):.2f})",
                      f"{statistics.median(rss):.0f} ({min(rss):.0f}-{max(rss):.0f})",
                      f"{statistics.median(r['wall_s'] for r in got):.1f}"])
        if s != "folder":
            targets.append(target(f"{s}, --check {c}: images per CPU-second / the folder's",
                                  statistics.median(paired), 0.8))
            targets.append(target(f"{s}, --check {c}: peak RSS (MB)", max(rss), 400, at_most=True))
    md = "\n\n".join([
        f"`packer to-lmdb` of {args.n} JPEGs of about {args.size}x{args.size} from each source, a fresh interpreter "
        f"per run (CPU: the process and its workers, start-up included); median (range) of {args.rounds} "
        f"interleaved rounds; Parquet row groups of {args.row_group} rows, {PER_FILE} rows a file and samples a shard.",
        md_table(["row", "images per CPU-second", "/ folder (per round)", "peak RSS MB", "wall s"], table),
        f"Listing the shards, CPU us per tar member (a `.jpg` or a `.cls`, each behind a pax header as "
        f"`webdataset.TarWriter` writes them), in the benchmark's process: `tarfile` {costs['tarfile']:.1f}, "
        f"packer's header scan {costs['scan_shard']:.1f}, the whole listing (samples grouped, checked, made "
        f"items) {costs['shard_items']:.1f}.",
        md_table(["target", "measured", "goal", ""],
                 [[t["name"], f"{t['value']:.2f}" if t["value"] is not None else "-",
                   f"{'<=' if t['at_most'] else '>='} {t['target']}",
                   "met" if t["met"] else "missed" if t["met"] is False else ""] for t in targets])])
    print(md)
    write_result("sources", {"quick": args.quick, "sections": {"sources": {
        "params": {"n": args.n, "size": args.size, "row_group": args.row_group, "rounds": args.rounds,
                   "checks": checks}, "results": runs, "listing_us_per_member": costs, "targets": targets,
        "markdown": md}}},
        results=args.results, machine=machine)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
"""Packed formats side by side against the in-memory decode ceiling, in one run.

One generated set of natural-looking JPEGs (~0.25 MP, cached under --workdir), packed once
per format; then, for each ``num_workers``, a real DataLoader epoch over each of:

* ``ceiling``        the encoded bytes already in memory (a list), decoded the same way
* ``lmdb``           PackedDataset over LMDB, shuffled random access
* ``records``        PackedDataset over the TFRecord shards, shuffled random access via .idx
* ``records-nocrc``  the same with CRC checking off
* ``stream``         StreamingDataset over the same shards (shard shuffle + buffer)
* ``hdf5``           PackedDataset over HDF5 (only when the hdf5 format is registered)

Every row decodes with ``packer.codecs.image.decode`` to a uint8 CHW tensor (``decode="tensor"``),
takes the same fixed-size centre crop so batches stack, and uses the default collate.
Rows are interleaved, in an order rotating by round, over ``--reps`` rounds and the best
round is kept, so a burst of load on the shared machine hits every row alike; the table gives
samples per wall second and per CPU second (the process and its DataLoader workers), the
second being what a shared machine measures faithfully. Also measured in one process,
interleaved: each reader's CPU cost per sample next to the decode it feeds (the format
overhead with the noise of a shared machine taken out), and the CRC check's share of
read + decode.

    python scripts/bench_formats.py --workdir bench-out/formats
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset

from packer import PackedDataset, StreamingDataset
from packer.data.datasets import decode_record
from packer.formats import FORMATS, open_reader
from packer.codecs.image import DECODER
from packer.integrity import masked_crc32c
from packer.commands.pack_images import pack_images
from packer.synth import make_image_folder


def _make_part(args: tuple[str, int, int, tuple[int, int], int]) -> str:
    root, count, classes, size, seed = args
    make_image_folder(root, count=count, classes=classes, size=size, seed=seed)
    return root


def image_set(workdir: Path, count: int, classes: int, size: tuple[int, int], jobs: int) -> Path:
    """The ImageFolder of generated JPEGs, made once (in ``jobs`` parts) and reused."""
    src = workdir / "images"
    import packer.synth

    synth = hashlib.sha256(Path(packer.synth.__file__).read_bytes()).hexdigest()[:16]
    spec = {"count": count, "classes": classes, "size": list(size), "parts": jobs, "synth": synth}
    marker = workdir / "images.json"
    if src.is_dir() and marker.is_file() and json.loads(marker.read_text()) == spec:
        return src
    shutil.rmtree(src, ignore_errors=True)
    parts = workdir / "images.parts"
    shutil.rmtree(parts, ignore_errors=True)
    per = [count // jobs + (1 if k < count % jobs else 0) for k in range(jobs)]
    t = time.perf_counter()
    with ProcessPoolExecutor(jobs) as ex:
        roots = list(ex.map(_make_part, [(str(parts / str(k)), n, classes, size, 1000 + k)
                                         for k, n in enumerate(per)]))
    for k, root in enumerate(roots):  # merge the parts into one ImageFolder
        for f in Path(root).rglob("*.jpg"):
            dest = src / f.parent.name / f"p{k}_{f.name}"
            dest.parent.mkdir(parents=True, exist_ok=True)
            f.rename(dest)
    shutil.rmtree(parts)
    marker.write_text(json.dumps(spec))
    print(f"generated {count} images in {time.perf_counter() - t:.0f}s", file=sys.stderr)
    return src


def packed(src: Path, out: Path, fmt: str, count: int, **writer_options) -> Path:
    """Pack ``src`` as ``fmt`` unless an output packed from this very image set is there."""
    try:
        if len(open_reader(out)) == count and out.stat().st_mtime > (src.parent / "images.json").stat().st_mtime:
            return out
    except Exception:
        pass
    t = time.perf_counter()
    report = pack_images(src, out, format=fmt, workers=2, overwrite=True, writer_options=writer_options or None)
    print(f"packed {fmt}: {report.summary()} ({time.perf_counter() - t:.0f}s)", file=sys.stderr)
    return out


def warm(path: Path) -> None:
    """Read every file once so each row starts from the page cache."""
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    for f in files:
        with open(f, "rb") as fh:
            while fh.read(1 << 24):
                pass


CROP = (368, 496)  # every generated image is at least 378x504 (432x576 minus 1/8 jitter)


def center_crop(image: torch.Tensor) -> torch.Tensor:
    """A fixed-size centre crop of a CHW tensor, so that batches stack into one tensor (one
    shared-memory segment per batch from a worker, as in training). Made contiguous here:
    torch stacks strided uint8 views several times slower than a copy plus a plain stack."""
    h, w = image.shape[1:]
    top, left = (h - CROP[0]) // 2, (w - CROP[1]) // 2
    return image[:, top:top + CROP[0], left:left + CROP[1]].contiguous()


class InMemory(Dataset):
    """The ceiling: encoded bytes in a list, decoded exactly as the packed rows decode."""

    def __init__(self, reader):
        self.items = [(reader.read(i).data, reader.read(i).label) for i in range(len(reader))]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i):
        data, label = self.items[i]
        return center_crop(decode_record(data, "tensor")), label


def epoch_rate(dataset, workers: int, batch: int, map_style: bool) -> tuple[float, float]:
    """(samples per wall second, samples per CPU second) of one full DataLoader epoch.

    CPU time is this process's plus its exited DataLoader workers' (``RUSAGE_CHILDREN``): on a
    machine shared with other jobs it measures the work a row does, where wall time also
    measures how much of the machine the row happened to get.
    """
    gen = torch.Generator().manual_seed(0)
    loader = DataLoader(dataset, batch_size=batch, num_workers=workers, shuffle=map_style,
                        generator=gen if map_style else None)
    cpu0 = time.process_time() + _children_cpu()
    t = time.perf_counter()
    n = sum(len(labels) for _, labels in loader)  # exhausting the loader joins its workers
    wall = time.perf_counter() - t
    cpu = time.process_time() + _children_cpu() - cpu0
    return n / wall, n / cpu


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def read_costs(paths: dict[str, Path], limit: int, rounds: int = 9) -> dict[str, float]:
    """CPU µs per sample, in this process, of each reader's ``read`` (random order, CRC on
    unless the row says nocrc), of the two CRC32Cs a checked read computes (timed on their
    own: the difference of two read timings is within their noise), and of decoding the same
    samples. Rows run interleaved; the best round of each is kept."""
    readers = {name: open_reader(path) for name, path in paths.items()}
    readers["records-nocrc"] = open_reader(paths["records"], check_crc=False)
    records = readers["records"]
    memory = [records.read(i).data for i in range(min(limit, len(records)))]
    order = torch.randperm(len(memory), generator=torch.Generator().manual_seed(0)).tolist()
    framed = [bytes(records.read_payload(i)) for i in order]
    lengths = [len(p).to_bytes(8, "little") for p in framed]
    best = {name: float("inf") for name in ["memory", *readers, "crc"]}
    for _ in range(rounds):
        for name in best:
            t = time.process_time()
            if name == "memory":
                for i in order:
                    _ = memory[i]
            elif name == "crc":
                for length, payload in zip(lengths, framed):
                    masked_crc32c(length), masked_crc32c(payload)
            else:
                reader = readers[name]
                for i in order:
                    reader.read(i)
            best[name] = min(best[name], (time.process_time() - t) / len(order))
    dec = float("inf")
    for _ in range(3):
        t = time.process_time()
        for i in order[:500]:
            decode_record(memory[i], "tensor")
        dec = min(dec, (time.process_time() - t) / len(order[:500]))
    out = {f"{name}_read_us": v * 1e6 for name, v in best.items() if name != "crc"}
    out["decode_us"] = dec * 1e6
    out["crc_us"] = best["crc"] * 1e6
    out["crc_share"] = out["crc_us"] / (out["records_read_us"] + out["decode_us"])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", type=Path, default=Path("bench-out/formats"))
    ap.add_argument("--count", type=int, default=5000)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--size", default="432x576", help="HxW of the generated images (~0.25 MP)")
    ap.add_argument("--workers", default="0,2", help="num_workers settings, comma-separated")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--reps", type=int, default=2, help="interleaved rounds; the best is kept")
    ap.add_argument("--shard-size", default="32MB", help="records shard size (several shards to shuffle)")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)  # as in DataLoader workers; idle OpenMP threads spin on a loaded machine
    h, w = (int(x) for x in args.size.lower().split("x"))
    args.workdir.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()

    src = image_set(args.workdir, args.count, args.classes, (h, w), jobs=os.cpu_count() or 1)
    paths = {"lmdb": packed(src, args.workdir / "images.lmdb", "lmdb", args.count),
             "records": packed(src, args.workdir / "images.records", "records", args.count,
                               shard_size=args.shard_size)}
    if "hdf5" in FORMATS:
        paths["hdf5"] = packed(src, args.workdir / "images.h5", "hdf5", args.count)
    for p in paths.values():
        warm(p)

    tensor = {"decode": "tensor", "transform": center_crop}
    rows = {
        "ceiling": (lambda: InMemory(open_reader(paths["records"])), True),
        "lmdb": (lambda: PackedDataset(paths["lmdb"], **tensor), True),
        "records": (lambda: PackedDataset(paths["records"], **tensor), True),
        "records-nocrc": (lambda: PackedDataset(paths["records"], check_crc=False, **tensor), True),
        "stream": (lambda: StreamingDataset(paths["records"], batch_size=args.batch_size, **tensor), False),
    }
    if "hdf5" in paths:
        rows["hdf5"] = (lambda: PackedDataset(paths["hdf5"], **tensor), True)
    datasets = {name: make() for name, (make, _) in rows.items()}
    workers = [int(x) for x in args.workers.split(",")]
    rates: dict[tuple[str, int], list[tuple[float, float]]] = {}
    names = list(rows)
    for rep in range(args.reps):
        order = names[rep % len(names):] + names[:rep % len(names)]  # rotate: no row always runs first
        for nw in workers:
            for name in order:
                map_style = rows[name][1]
                ds = datasets[name]
                if isinstance(ds, StreamingDataset):
                    ds.set_epoch(rep)
                wall, cpu = epoch_rate(ds, nw, args.batch_size, map_style)
                rates.setdefault((name, nw), []).append((wall, cpu))
                print(f"  round {rep + 1}: {name:14s} workers={nw}: {wall:7.0f} samples/s, "
                      f"{cpu:7.0f} samples/CPU-s", file=sys.stderr)
    crc = read_costs(paths, limit=2000)
    load_after = os.getloadavg()

    print(f"\n{args.count} JPEGs ~{h}x{w} (jitter ±1/8), batch {args.batch_size}, decoder {DECODER}, "
          f"best of {args.reps} interleaved rounds; load average {load_before[0]:.1f} before, "
          f"{load_after[0]:.1f} after, {os.cpu_count()} cores")
    print(f"{'row':14s} {'workers':>7s} {'samples/s':>10s} {'x ceiling':>10s} {'samples/CPU-s':>14s} "
          f"{'x ceiling':>10s}")
    result = {"count": args.count, "size": [h, w], "batch_size": args.batch_size, "decoder": DECODER,
              "load": [load_before[0], load_after[0]], "rows": [], "crc": crc}
    for nw in workers:
        wall0 = max(r[0] for r in rates[("ceiling", nw)])
        cpu0 = max(r[1] for r in rates[("ceiling", nw)])
        for name in rows:
            wall = max(r[0] for r in rates[(name, nw)])
            cpu = max(r[1] for r in rates[(name, nw)])
            print(f"{name:14s} {nw:7d} {wall:10.0f} {wall / wall0:10.3f} {cpu:14.0f} {cpu / cpu0:10.3f}")
            result["rows"].append({"row": name, "workers": nw, "samples_per_s": wall,
                                   "ratio_to_ceiling": wall / wall0, "samples_per_cpu_s": cpu,
                                   "cpu_ratio_to_ceiling": cpu / cpu0, "rounds": rates[(name, nw)]})
    print(f"\nin one process, CPU µs per sample (random order): decode to a CHW tensor "
          f"{crc['decode_us']:.0f}; read:", end="")
    for name in ["memory", *paths, "records-nocrc"]:
        r = crc[f"{name}_read_us"]
        ratio = (crc["decode_us"] + crc["memory_read_us"]) / (crc["decode_us"] + r)
        print(f"  {name} {r:.1f} (x ceiling {ratio:.3f})", end="")
    print(f"\nCRC32C checking (the two masked CRCs of a record, timed alone) costs {crc['crc_us']:.1f} µs "
          f"per record = {100 * crc['crc_share']:.2f}% of read+decode")
    for nw in workers:
        on = max(r[1] for r in rates[("records", nw)])
        off = max(r[1] for r in rates[("records-nocrc", nw)])
        print(f"records with CRC / without, samples per CPU-s at workers={nw}: {on / off:.3f}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
"""packer.Loader (threads) against torch's DataLoader (worker processes), and shuffle quality.

Part 1, loaders, one run, rows interleaved over ``--repeats`` rounds (best kept): the same
dataset, transform, batch (64) and order, ``packer.Loader(num_threads=2)`` against
``DataLoader(num_workers=2, collate_fn=uint8_collate, persistent_workers=True)``:

* ``lmdb-jpeg``: pre-resized JPEGs (256 x 320, quality 90) in LMDB, RandomResizedCrop(224) +
  flip in the decode (``packer.data.DecodeRandomResizedCrop`` where this checkout has it,
  else the stand-in below: full OpenCV decode, torchvision's box rule, resize of the box);
* ``hdf5-raw``: the same images as raw 256x320x3 pixels in HDF5, the same crop on the array.

Part 2, shuffle: a class-sorted records pack of ``--classes`` x ``--per-class`` small JPEGs in
shards of ``--shard`` samples; ``StreamingDataset`` with default settings (block shuffle)
against the previous order (shard order + 4096-sample buffer, ``block_size=None``): median
distinct classes per 256-batch against the exact iid expectation, and read throughput
(``decode="bytes"``: storage and order only, the harshest case for locality).

    python scripts/bench_loader.py                      # ~3 min on 2 cores (first run builds data)
    python scripts/bench_loader.py --images 300 --batches 3 --classes 20 --per-class 30 --shard 100
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

import cv2
import numpy as np
import torch
from torch.utils.data import DataLoader

from packer import Loader, PackedDataset, StreamingDataset
from packer.codecs.image import decode as decode_image
from packer.codecs.image import to_chw
from packer.codecs.resize import ResizeSpec
from packer.commands.pack_images import pack_images
from packer.data.video import random_resized_crop_box
from packer.data.mixing import mixing_report
from packer.data.device import uint8_collate
from packer.synth import jpeg_bytes, natural_image

HEIGHT, WIDTH = 256, 320


# -- the training transform ----------------------------------------------------------------------
class RandomResizedCropStandIn:
    """Stand-in for ``DecodeRandomResizedCrop`` where this checkout lacks it: full decode
    (OpenCV/libjpeg-turbo), torchvision's box rule, bilinear resize of the box, flip 0.5."""

    def __init__(self, size: int = 224):
        self.size = size
        self.rng = np.random.RandomState(0)

    def __call__(self, data: Any) -> torch.Tensor:
        arr = decode_image(data) if isinstance(data, (bytes, bytearray, memoryview)) else data
        top, left, h, w = random_resized_crop_box(arr.shape[0], arr.shape[1], self.rng)
        out = cv2.resize(arr[top:top + h, left:left + w], (self.size, self.size), interpolation=cv2.INTER_LINEAR)
        if self.rng.rand() < 0.5:
            out = cv2.flip(out, 1)
        return torch.from_numpy(to_chw(out))


def training_transform(size: int = 224) -> tuple[Callable[[Any], Any], str]:
    try:
        from packer.data import DecodeRandomResizedCrop  # type: ignore[attr-defined]
    except ImportError:
        return RandomResizedCropStandIn(size), "stand-in (full decode + torchvision box + resize)"
    return DecodeRandomResizedCrop(size), "packer.data.DecodeRandomResizedCrop"


# -- data ------------------------------------------------------------------------------------------
def make_jpegs(root: Path, count: int, classes: int, size: tuple[int, int], seed: int = 0) -> Path:
    done = root / ".complete"
    tag = f"{count} {classes} {size}"
    if done.exists() and done.read_text() == tag:
        return root
    for i in range(count):
        d = root / f"class_{i * classes // count:04d}"  # class-sorted: class = i's block
        d.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng([seed, i])
        (d / f"img_{i:06d}.jpg").write_bytes(jpeg_bytes(natural_image(rng, *size), 90))
    done.write_text(tag)
    return root


def build(work: Path, images: int) -> dict[str, Path]:
    src = make_jpegs(work / "images", images, 10, (HEIGHT, WIDTH))
    out = {"lmdb-jpeg": work / "train.lmdb", "hdf5-raw": work / "train-raw.h5"}
    if not (out["lmdb-jpeg"] / "manifest.json").exists():
        pack_images(src, out["lmdb-jpeg"], format="lmdb", workers=2, overwrite=True)
    if not out["hdf5-raw"].exists():
        pack_images(src, out["hdf5-raw"], format="hdf5", workers=2, overwrite=True, raw=True,
                    resize=ResizeSpec(size=(WIDTH, HEIGHT)))
    return out


# -- timing ----------------------------------------------------------------------------------------
def proc_cpu_s(pid: int) -> float:
    """CPU seconds (user + system, all threads) a live process has used, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def time_batches(loader: Any, batches: int) -> tuple[float, float]:
    """(samples/s, samples per CPU-second) over ``batches`` batches after the first (start-up
    and warm-up excluded). CPU time counts this process (every thread) and the DataLoader's
    worker processes: the load-robust figure on a shared machine."""
    it = iter(loader)
    next(it)
    pids = [os.getpid()] + [w.pid for w in getattr(it, "_workers", [])]
    cpu0 = sum(proc_cpu_s(p) for p in pids)
    start, n = time.perf_counter(), 0
    for _ in range(batches):
        images, _labels = next(it)
        n += len(images)
    wall = time.perf_counter() - start
    cpu = sum(proc_cpu_s(p) for p in pids) - cpu0
    del it
    return n / wall, n / max(cpu, 1e-9)


def loaders(path: Path, transform: Callable[[Any], Any], order: list[int], batch: int, parallel: int):
    ds = PackedDataset(path, decode=transform)
    return {
        "Loader": lambda: Loader(ds, batch_size=batch, sampler=order, num_threads=parallel, pin_memory=False),
        "DataLoader": lambda: DataLoader(ds, batch_size=batch, sampler=order, num_workers=parallel,
                                         collate_fn=uint8_collate, persistent_workers=True, prefetch_factor=2,
                                         timeout=120),
    }


def part_loaders(args: argparse.Namespace, work: Path) -> list[str]:
    transform, name = training_transform()
    paths = build(work, args.images)
    order = np.random.default_rng(0).permutation(args.images).tolist()
    need = (args.batches + 1) * args.batch_size
    order = (order * math.ceil(need / len(order)))[:need]
    best: dict[tuple[str, str], float] = {}
    eff: dict[tuple[str, str], float] = {}
    for _ in range(args.repeats):
        for data, path in paths.items():
            for kind, make in loaders(path, transform, order, args.batch_size, args.parallel).items():
                rate, per_cpu = time_batches(make(), args.batches)
                best[data, kind] = max(rate, best.get((data, kind), 0.0))
                eff[data, kind] = max(per_cpu, eff.get((data, kind), 0.0))
    lines = [f"transform: {name}, RandomResizedCrop(224) + flip; batch {args.batch_size}, "
             f"{args.parallel} threads / workers, {args.batches} batches timed, best of {args.repeats}",
             "", "| data | Loader img/s | DataLoader img/s | wall ratio | Loader img/CPU-s | DataLoader img/CPU-s "
             "| CPU ratio |", "|---|---|---|---|---|---|---|"]
    for data in paths:
        a, b = best[data, "Loader"], best[data, "DataLoader"]
        c, d = eff[data, "Loader"], eff[data, "DataLoader"]
        lines.append(f"| {data} | {a:.0f} | {b:.0f} | {a / b:.2f}x | {c:.0f} | {d:.0f} | {c / d:.2f}x |")

    def verdict(table: dict, num: tuple[str, str], den: tuple[str, str], target: float) -> str:
        r = table[num] / table[den]
        return f"{r:.2f}x (>= {target:g}x) {'met' if r >= target else 'MISSED'}"

    lines += ["", "targets (wall-clock; in brackets the same ratio in samples per CPU-second):"]
    for label, num, den, target in (
            ("Loader vs DataLoader, pre-resized JPEG LMDB + RandomResizedCrop",
             ("lmdb-jpeg", "Loader"), ("lmdb-jpeg", "DataLoader"), 1.3),
            ("Loader vs DataLoader, raw HDF5 pixels", ("hdf5-raw", "Loader"), ("hdf5-raw", "DataLoader"), 2.5),
            ("raw HDF5 vs LMDB-JPEG end to end, Loader", ("hdf5-raw", "Loader"), ("lmdb-jpeg", "Loader"), 4.0),
            ("raw HDF5 vs LMDB-JPEG end to end, DataLoader", ("hdf5-raw", "DataLoader"),
             ("lmdb-jpeg", "DataLoader"), 4.0)):
        lines.append(f"  {label}: {verdict(best, num, den, target)} [{verdict(eff, num, den, target)}]")
    return lines


def part_costs(args: argparse.Namespace, work: Path) -> list[str]:
    """CPU per sample of each part, in this process (least of 3 passes): what bounds the ratios."""
    from packer.data.datasets import raw_record

    transform, _ = training_transform()
    paths = build(work, args.images)
    n = min(400, args.images)
    torch.set_num_threads(1)

    def least(fn: Callable[[int], Any]) -> float:
        fn(0)
        best = math.inf
        for _ in range(3):
            start = time.process_time()
            for i in range(n):
                fn(i)
            best = min(best, (time.process_time() - start) / n)
        return 1e6 * best

    lines = ["| data | read + CRC us | to array us | transform us | dataset[i] us | Loader, 1 thread, us |",
             "|---|---|---|---|---|---|"]
    for data, path in paths.items():
        ds = PackedDataset(path, decode=transform)
        rec = ds.reader.read(0)
        arr = raw_record(rec, "numpy") if rec.fmt == "raw" else rec.data

        read = least(lambda i: ds.reader.read(i))
        to_array = least(lambda i: raw_record(rec, "numpy")) if rec.fmt == "raw" else 0.0
        trans = least(lambda i: ds.decode(arr))
        item = least(lambda i: ds[i])
        best = math.inf
        for _ in range(3):
            start, count = time.process_time(), 0
            for images, _labels in Loader(ds, batch_size=64, sampler=list(range(n)), num_threads=1, pin_memory=False):
                count += len(images)
            best = min(best, (time.process_time() - start) / count)
        lines.append(f"| {data} | {read:.0f} | {to_array:.0f} | {trans:.0f} | {item:.0f} | {1e6 * best:.0f} |")
    return [f"CPU per sample, this process, least of 3 passes over {n} samples (Loader: whole passes, "
            f"thread start and first buffers included)", ""] + lines


# -- shuffle ---------------------------------------------------------------------------------------
def build_sorted_records(work: Path, classes: int, per_class: int, shard: int) -> Path:
    src = make_jpegs(work / f"sorted-{classes}x{per_class}", classes * per_class, classes, (32, 32))
    out = work / f"sorted-{classes}x{per_class}-{shard}.records"
    if not (out / "manifest.json").exists():
        pack_images(src, out, format="records", workers=2, overwrite=True, check="header",
                    writer_options={"samples_per_shard": shard})
    return out


def read_rate(ds: StreamingDataset) -> float:
    start, n = time.perf_counter(), 0
    for _ in ds:
        n += 1
    return n / (time.perf_counter() - start)


def part_shuffle(args: argparse.Namespace, work: Path) -> list[str]:
    path = build_sorted_records(work, args.classes, args.per_class, args.shard)
    default = StreamingDataset(path, decode="bytes")
    previous = StreamingDataset(path, decode="bytes", block_size=None)
    reader = default.dataset.reader
    labels = np.array([reader.read(i).label for i in range(len(reader))])
    assert (np.diff(labels) >= 0).all(), "the pack should be class-sorted"
    rep = {name: mixing_report(labels[np.array(ds.order())], 256)
           for name, ds in (("default", default), ("previous", previous))}
    rates: dict[str, float] = {}
    for _ in range(args.repeats):
        for name, ds in (("previous", previous), ("default", default)):
            rates[name] = max(read_rate(ds), rates.get(name, 0.0))
    mix = rep["default"]["ratio"]
    speed = rates["default"] / rates["previous"]
    lines = [f"class-sorted records: {args.classes} classes x {args.per_class}, {args.shard}-sample shards, "
             f"{len(reader)} samples; 256-batches; read throughput = StreamingDataset(decode='bytes') "
             f"full epoch, best of {args.repeats}", "",
             "| order | median distinct classes | p10 | vs iid | read samples/s |", "|---|---|---|---|---|"]
    for name, label in (("previous", "previous (shard order + 4096 buffer)"), ("default", "default (block shuffle)")):
        r = rep[name]
        lines.append(f"| {label} | {r['median']:.0f} | {r['p10']:.0f} | {r['ratio']:.2f}x | {rates[name]:.0f} |")
    lines += [f"iid expectation (exact): {rep['default']['iid']:.1f}", "", "targets:",
              f"  median distinct classes per 256-batch vs iid: {mix:.2f}x (>= 0.9x) {'met' if mix >= 0.9 else 'MISSED'}",
              f"  read throughput vs the previous order: {speed:.2f}x (>= 0.9x) {'met' if speed >= 0.9 else 'MISSED'}"]
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", default="bench-out/loader")
    ap.add_argument("--images", type=int, default=2000)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--batches", type=int, default=20, help="batches timed per row (after the first)")
    ap.add_argument("--parallel", type=int, default=2, help="Loader threads = DataLoader workers")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--classes", type=int, default=200)
    ap.add_argument("--per-class", type=int, default=300)
    ap.add_argument("--shard", type=int, default=3000)
    ap.add_argument("--parts", default="loaders,costs,shuffle")
    args = ap.parse_args(argv)
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"# bench_loader: {os.cpu_count()} CPUs, load average {load:.1f} at start, torch {torch.__version__}")
    parts = args.parts.split(",")
    if "loaders" in parts:
        print("\n".join(["", "## packer.Loader vs DataLoader", ""] + part_loaders(args, work)))
    if "costs" in parts:
        print("\n".join(["", "## Parts", ""] + part_costs(args, work)))
    if "shuffle" in parts:
        print("\n".join(["", "## StreamingDataset shuffle", ""] + part_shuffle(args, work)))
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"\nload average {load:.1f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())

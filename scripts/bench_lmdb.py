#!/usr/bin/env python3
"""Benchmark for the foundation: packing to LMDB and reading it back, side by side in one run.

Generates (once, cached in --workdir) N natural-looking JPEGs of ~0.25 MP, then measures:

* packing: ``pack_images(format="lmdb")`` against reading + checking the same files with the
  same workers and no writing (target: packing >= 0.8x);
* reading, for each ``num_workers``: the plain folder (files opened one by one), PackedDataset
  on the LMDB, and the in-memory ceiling (the same encoded bytes already in RAM), all with the
  same decode (``packer.codecs.image.decode``, the fastest decoder available); plus the folder read
  with Pillow, as torchvision's ImageFolder does. Targets: LMDB >= 0.95x the ceiling and >= the
  folder. Each figure is the best of --repeats epochs (the machine is shared and noisy).

Usage: python scripts/bench_lmdb.py [--count 5000] [--workers 0,2] [--workdir bench-out]
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from packer import PackedDataset  # noqa: E402
from packer.conversion.executors import make_executor  # noqa: E402
from packer.codecs.image import DECODER, decode  # noqa: E402
from packer.commands.pack_images import ImageJob, pack_images  # noqa: E402
from packer.conversion.inputs import image_folder  # noqa: E402
from packer.synth import jpeg_bytes, natural_image  # noqa: E402


def _make_one(args):
    path, seed = args
    rng = np.random.default_rng(seed)
    h, w = 432 + int(rng.integers(-40, 41)), 576 + int(rng.integers(-50, 51))
    Path(path).write_bytes(jpeg_bytes(natural_image(rng, h, w)))


def make_dataset(root: Path, count: int, classes: int = 10) -> Path:
    """N JPEGs (~0.25 MP) in ``classes`` class folders; reused when already complete."""
    marker = root / f".complete-{count}"
    if marker.exists():
        return root
    shutil.rmtree(root, ignore_errors=True)
    jobs = []
    for i in range(count):
        d = root / f"class_{i % classes:02d}"
        d.mkdir(parents=True, exist_ok=True)
        jobs.append((str(d / f"img_{i:05d}.jpg"), i))
    with mp.Pool(os.cpu_count()) as pool:
        pool.map(_make_one, jobs, chunksize=32)
    marker.touch()
    return root


class FolderDataset(Dataset):
    """The plain folder: open and read each file, then decode (``pil`` = torchvision-style)."""

    def __init__(self, root: Path, pillow: bool = False):
        self.items, _ = image_folder(root)
        self.pillow = pillow

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        it = self.items[i]
        if self.pillow:
            with Image.open(it.path) as im:
                arr = np.asarray(im.convert("RGB"))
        else:
            with open(it.path, "rb") as f:
                arr = decode(f.read())
        return torch.from_numpy(np.ascontiguousarray(arr.transpose(2, 0, 1))), it.label


class MemoryDataset(Dataset):
    """The ceiling: the same encoded bytes already in memory, same decode."""

    def __init__(self, root: Path):
        items, _ = image_folder(root)
        self.blobs = [Path(it.path).read_bytes() for it in items]
        self.labels = [it.label for it in items]

    def __len__(self):
        return len(self.blobs)

    def __getitem__(self, i):
        arr = decode(self.blobs[i])
        return torch.from_numpy(np.ascontiguousarray(arr.transpose(2, 0, 1))), self.labels[i]


def _as_list(batch):
    return batch


def epoch_rate(ds: Dataset, workers: int, batch_size: int) -> float:
    """Samples/s of one shuffled epoch through a real DataLoader."""
    dl = DataLoader(ds, batch_size=batch_size, shuffle=True, num_workers=workers,
                    collate_fn=_as_list, generator=torch.Generator().manual_seed(0))
    t = time.perf_counter()
    n = sum(len(b) for b in dl)
    return n / (time.perf_counter() - t)


def best_rates(sets: dict, workers: int, batch_size: int, repeats: int) -> dict:
    """Best of ``repeats`` epochs per dataset, interleaved so machine drift hits every row alike."""
    best = {name: 0.0 for name in sets}
    for _ in range(repeats):
        for name, ds in sets.items():
            best[name] = max(best[name], epoch_rate(ds, workers, batch_size))
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=5000)
    ap.add_argument("--workers", default="0,2")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workdir", default="bench-out")
    ap.add_argument("--json", dest="json_out", default=None, help="also write the figures here")
    args = ap.parse_args()
    workers = [int(w) for w in args.workers.split(",")]
    work = Path(args.workdir)
    src = make_dataset(work / f"jpegs-{args.count}", args.count)
    out = work / f"lmdb-{args.count}"
    pool_workers = max(workers)
    print(f"dataset: {args.count} JPEGs in {src}; decoder: {DECODER}; cores: {os.cpu_count()}; "
          f"load average: {os.getloadavg()[0]:.1f}")

    # -- packing vs reading+checking the same files -------------------------------------
    items, _ = image_folder(src)
    check_rate = pack_rate = 0.0
    for _ in range(args.repeats):
        with make_executor("local", workers=pool_workers) as ex:
            t = time.perf_counter()
            n = sum(1 for o in ex.map(ImageJob(check="full"), items) if o.ok)
            check_rate = max(check_rate, n / (time.perf_counter() - t))
        t = time.perf_counter()
        report = pack_images(src, out, format="lmdb", workers=pool_workers, overwrite=True)
        pack_rate = max(pack_rate, report.count / (time.perf_counter() - t))
    results = {"count": args.count, "decoder": DECODER, "pack_img_s": pack_rate,
               "read_and_check_img_s": check_rate, "pack_ratio": pack_rate / check_rate, "read": {}}
    print(f"\npacking ({pool_workers} workers, full check): {pack_rate:,.0f} img/s; reading+checking "
          f"the same files: {check_rate:,.0f} img/s; ratio {pack_rate / check_rate:.2f} (target >= 0.80)")

    # -- reading ---------------------------------------------------------------------------
    sets = {"ceiling (in memory)": MemoryDataset(src), "lmdb (PackedDataset)": PackedDataset(out, decode="tensor"),
            "folder (same decode)": FolderDataset(src), "folder (Pillow)": FolderDataset(src, pillow=True)}
    print(f"\n{'reader':24s}" + "".join(f"{f'workers={w}':>26s}" for w in workers))
    for w in workers:
        results["read"][w] = best_rates(sets, w, args.batch_size, args.repeats)
    for name in sets:
        row = f"{name:24s}"
        for w in workers:
            r = results["read"][w]
            row += f"{r[name]:>12,.0f} img/s ({r[name] / r['ceiling (in memory)']:.2f}x)"
        print(row)
    for w in workers:
        r = results["read"][w]
        print(f"workers={w}: lmdb/ceiling {r['lmdb (PackedDataset)'] / r['ceiling (in memory)']:.3f} "
              f"(target >= 0.95), lmdb/folder {r['lmdb (PackedDataset)'] / r['folder (same decode)']:.2f} "
              f"(target >= 1.0), lmdb/folder-Pillow {r['lmdb (PackedDataset)'] / r['folder (Pillow)']:.2f}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

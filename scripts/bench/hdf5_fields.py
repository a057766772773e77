"""How an HDF5 field pack stores a variable-length field: flat values + offsets (packer's layout,
``packer.formats.hdf5.columns``) against h5py's variable-length types (one vlen element per
sample), side by side in one run.

Detection-shaped samples (an image's bytes, ``boxes`` float32 (n, 4), ``labels`` int64 (n,),
``image_id``) are written once each way; then every row below runs in a fresh interpreter and
reads every sample in a seeded random order, all four fields, CPU seconds per sample:

* ``packer HDF5Reader`` - packer's reader on its layout (rebuilds the blob, checks its CRC32C);
* ``h5py flat + offsets`` - plain h5py on packer's layout (``f["fields/boxes"][a:b]``);
* ``h5py vlen`` - plain h5py on one vlen dataset per field (``f["boxes"][i]``).

Write rows give the CPU seconds per sample of each writer (each in its own fresh interpreter)
and the file size: packer's writer given the encoded blobs (it splits each blob into its fields,
takes its CRC32C, stores keys and labels, fsyncs each commit and journals keys and CRCs for
resume; heap tuned as every command does), plain h5py writing the
same layout, and plain h5py writing vlen datasets. Rounds repeat every row; the table gives the median and the range.

Usage: python -m scripts.bench.hdf5_fields layout [--count 4000] [--rounds 3]
       python -m scripts.bench.hdf5_fields --quick layout
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from scripts.bench.common import md_table, run_call, run_sections, target

MODULE = "scripts.bench.hdf5_fields"
SCHEMA = {"image": "image", "image_id": "int", "boxes": "ndarray:float32:*,4", "labels": "ndarray:int64:*"}


def _samples(count: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(0)
    out = []
    for i in range(count):
        n = int(rng.integers(0, 16))
        out.append({"image": rng.integers(0, 256, int(rng.integers(20_000, 60_000)), dtype=np.uint8).tobytes(),
                    "image_id": i, "boxes": rng.random((n, 4), dtype=np.float32) * 500,
                    "labels": rng.integers(0, 80, n).astype(np.int64)})
    return out


def write_packer(path: str, count: int) -> dict[str, float]:
    """Write ``count`` samples with packer's HDF5Writer; CPU seconds and the file's size."""
    from packer.codecs.fields import BLOB_FMT, Schema
    from packer.formats.hdf5 import HDF5Writer
    from packer.formats.sample import Sample
    from packer.heap import tune_heap

    tune_heap()  # as every packer command does
    schema = Schema(SCHEMA)
    blobs = [schema.encode(s) for s in _samples(count)]  # what FieldJob hands the writer (in workers)
    Path(path).unlink(missing_ok=True)
    t = time.process_time()
    w = HDF5Writer(path, classes=[], commit_every=1000)
    w.schema = schema
    with w:
        for i, blob in enumerate(blobs):
            w.add(Sample(f"k{i}", blob, BLOB_FMT, -1, 1, 1, 3))
        w.close(overwrite=True)
    return {"cpu_s": time.process_time() - t, "bytes": os.path.getsize(path)}


def write_flat(path: str, count: int) -> dict[str, float]:
    """Write the same samples in packer's layout with plain h5py (no CRC, journal or keys), in
    batches of 1,000: each variable-length field's values joined, its offsets appended."""
    import h5py

    samples = _samples(count)
    t = time.process_time()
    with h5py.File(path, "w") as f:
        specs = {"image": (np.uint8, (), 1 << 20), "boxes": (np.float32, (4,), 4096), "labels": (np.int64, (), 8192)}
        data = {n: f.create_dataset(f"fields/{n}", (0,) + tail, maxshape=(None,) + tail, chunks=(rows,) + tail,
                                    dtype=dt) for n, (dt, tail, rows) in specs.items()}
        offsets = {n: f.create_dataset(f"field_offsets/{n}", data=np.zeros(1, np.int64), maxshape=(None,),
                                       chunks=(8192,)) for n in specs}
        ids = f.create_dataset("fields/image_id", (0,), maxshape=(None,), chunks=(8192,), dtype=np.int64)
        for start in range(0, count, 1000):
            batch = samples[start:start + 1000]
            for n, (dt, tail, _) in specs.items():
                values = [np.frombuffer(s[n], np.uint8) if n == "image" else s[n] for s in batch]
                flat = np.concatenate(values).reshape((-1,) + tail)
                d, o = data[n], offsets[n]
                d.resize(d.shape[0] + len(flat), axis=0)
                d[d.shape[0] - len(flat):] = flat
                ends = int(o[o.shape[0] - 1]) + np.cumsum([len(v) for v in values])
                o.resize(o.shape[0] + len(ends), axis=0)
                o[o.shape[0] - len(ends):] = ends
            ids.resize(start + len(batch), axis=0)
            ids[start:] = [s["image_id"] for s in batch]
            f.flush()
    return {"cpu_s": time.process_time() - t, "bytes": os.path.getsize(path)}


def write_vlen(path: str, count: int) -> dict[str, float]:
    """Write the same samples as one h5py vlen dataset per variable-length field, in batches of 1,000."""
    import h5py

    samples = _samples(count)
    t = time.process_time()
    with h5py.File(path, "w") as f:
        image = f.create_dataset("image", (0,), maxshape=(None,), chunks=(1024,), dtype=h5py.vlen_dtype(np.uint8))
        boxes = f.create_dataset("boxes", (0,), maxshape=(None,), chunks=(1024,), dtype=h5py.vlen_dtype(np.float32))
        labels = f.create_dataset("labels", (0,), maxshape=(None,), chunks=(1024,), dtype=h5py.vlen_dtype(np.int64))
        ids = f.create_dataset("image_id", (0,), maxshape=(None,), chunks=(8192,), dtype=np.int64)
        for start in range(0, count, 1000):
            batch = samples[start:start + 1000]
            for d in (image, boxes, labels, ids):
                d.resize(start + len(batch), axis=0)
            image[start:] = np.array([np.frombuffer(s["image"], np.uint8) for s in batch] + [None], object)[:-1]
            boxes[start:] = np.array([s["boxes"].reshape(-1) for s in batch] + [None], object)[:-1]
            labels[start:] = np.array([s["labels"] for s in batch] + [None], object)[:-1]
            ids[start:] = [s["image_id"] for s in batch]
            f.flush()
    return {"cpu_s": time.process_time() - t, "bytes": os.path.getsize(path)}


def read_row(kind: str, path: str, count: int) -> dict[str, float]:
    """Read every sample (all fields) in a seeded random order; CPU seconds per sample."""
    import h5py

    from packer.formats import open_reader

    order = np.random.default_rng(1).permutation(count).tolist()
    t = time.process_time()  # opening the file is timed too, in every row
    if kind == "packer":
        r = open_reader(path)
        schema = r.schema
        for i in order:
            s = schema.decode(r.read(i).data)
    elif kind == "flat":
        with h5py.File(path, "r") as f:
            ob, ol, oi = (f[f"field_offsets/{n}"][:] for n in ("boxes", "labels", "image"))
            image, boxes, labels, ids = (f[f"fields/{n}"] for n in ("image", "boxes", "labels", "image_id"))
            for i in order:
                s = (image[oi[i]:oi[i + 1]].tobytes(), boxes[ob[i]:ob[i + 1]], labels[ol[i]:ol[i + 1]], ids[i])
    else:
        with h5py.File(path, "r") as f:
            image, boxes, labels, ids = (f[n] for n in ("image", "boxes", "labels", "image_id"))
            for i in order:
                s = (image[i].tobytes(), boxes[i].reshape(-1, 4), labels[i], ids[i])
    del s
    return {"us_per_sample": (time.process_time() - t) / count * 1e6}


def layout_main(argv: list[str]) -> dict[str, Any]:
    """Flat values + offsets against h5py vlen: write and random-read CPU per sample, file size."""
    ap = argparse.ArgumentParser(prog="hdf5_fields.py layout")
    ap.add_argument("--count", type=int, default=4000, help="samples (20-60 kB of image bytes each)")
    ap.add_argument("--rounds", type=int, default=3, help="times every row runs, each in a fresh interpreter")
    ap.add_argument("--workdir", type=Path, default=Path("bench-out/hdf5-fields"))
    args = ap.parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    flat, vlen = str(args.workdir / "flat.h5"), str(args.workdir / "vlen.h5")
    print(f"{args.count} detection samples, {args.rounds} rounds, each row a fresh interpreter; "
          f"load average at start {os.getloadavg()[0]:.2f}")
    plain = str(args.workdir / "plain.h5")
    writes: dict[str, list[dict[str, float]]] = {"packer": [], "flat": [], "vlen": []}
    reads: dict[str, list[float]] = {"packer": [], "flat": [], "vlen": []}
    for _ in range(args.rounds):
        writes["packer"].append(run_call(MODULE, "write_packer", {"path": flat, "count": args.count}))
        writes["flat"].append(run_call(MODULE, "write_flat", {"path": plain, "count": args.count}))
        writes["vlen"].append(run_call(MODULE, "write_vlen", {"path": vlen, "count": args.count}))
        for kind in reads:
            path = vlen if kind == "vlen" else flat
            reads[kind].append(run_call(MODULE, "read_row", {"kind": kind, "path": path, "count": args.count})
                               ["us_per_sample"])

    def cell(values: list[float]) -> str:
        return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"

    def write_row(name: str, kind: str) -> list[str]:
        return [name, cell([w["cpu_s"] / args.count * 1e6 for w in writes[kind]]),
                f"{writes[kind][0]['bytes'] / 1e6:.1f}"]

    rows = [write_row("write: packer HDF5Writer (flat + offsets; CRC32C, fsync'd commits, journals)", "packer"),
            write_row("write: h5py flat + offsets", "flat"), write_row("write: h5py vlen", "vlen"),
            ["read: packer HDF5Reader (CRC32C checked)", cell(reads["packer"]), ""],
            ["read: h5py flat + offsets", cell(reads["flat"]), ""],
            ["read: h5py vlen", cell(reads["vlen"]), ""]]
    print(md_table(["row", "CPU us/sample, median (range)", "file MB"], rows))
    vlen_vs_flat = statistics.median(reads["vlen"]) / statistics.median(reads["flat"])
    vlen_vs_packer = statistics.median(reads["vlen"]) / statistics.median(reads["packer"])
    write_ratio = (statistics.median(w["cpu_s"] for w in writes["vlen"])
                   / statistics.median(w["cpu_s"] for w in writes["flat"]))
    print(f"\nh5py vlen read CPU / h5py flat + offsets: {vlen_vs_flat:.2f}x; / packer's reader: {vlen_vs_packer:.2f}x; "
          f"h5py vlen write CPU / h5py flat + offsets: {write_ratio:.2f}x")
    return {"targets": [target("read CPU per sample: h5py vlen / h5py flat + offsets", vlen_vs_flat),
                        target("read CPU per sample: h5py vlen / packer HDF5Reader", vlen_vs_packer),
                        target("write CPU per sample: h5py vlen / h5py flat + offsets", write_ratio)],
            "reads_us": reads, "writes": writes}


def main(argv: list[str] | None = None) -> int:
    """Run the section named on the command line and write the JSON."""
    return run_sections("hdf5_fields", __doc__, {"layout": layout_main}, all_sections=("layout",), argv=argv,
                        quick={"layout": ["--count", "200", "--rounds", "1", "--workdir", "bench-out/hdf5-fields-quick"]},
                        notes=["Every row a fresh interpreter; CPU seconds (process_time) per sample."])


if __name__ == "__main__":
    sys.exit(main())

"""``packer export`` against bare loops: what the export's checks and bookkeeping cost.

One LMDB of photo-like JPEGs (``packer.synth``, packed once and reused) is exported, each row in a
FRESH process, every row's old output removed first, rows interleaved over ``--rounds``:

* ``packer export --to wds``: ``packer.export`` (the checked reader: every value's CRC32C, the
  keys; tar members by ``tarfile``; each shard fsynced, renamed, hashed (sha256) and journaled;
  ``export.json``), against
* ``bare tar``: an LMDB cursor over the values, the image bytes out of each Caffe ``Datum``, two
  ``tarfile`` members per sample (``{key}.jpg``, ``{key}.cls``) into shards of the same size,
  each fsynced: the least a hand-written script does; and
* ``bare tar + checks``: the same plus what the export guarantees beyond it: the CRC32C of every
  value against ``checksums.bin`` and each shard's sha256;
* ``packer export --to parquet`` against ``bare parquet``: the cursor, the ``Datum`` bytes, a
  pyarrow table per 1,000 rows (``__key__``, the image struct, the label) into files of the same
  size (needs pyarrow).

Each row records samples/s (wall) and samples per CPU-second of its timed window (user + system
of the process; the imports a row needs come before it); the ratios packer / bare are per round,
reported as the median and the range.

    python -m scripts.bench.export export                # ~3 min on 2 cores (2,000 images)
    python -m scripts.bench.export --quick export        # smoke run, seconds
"""
from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import resource
import shutil
import statistics
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

from scripts.bench.common import child_row, image_folder, md_table, run_fresh, run_sections, target

MODULE = "scripts.bench.export"
ROWS = ("packer export --to wds", "bare tar", "bare tar + checks", "packer export --to parquet", "bare parquet")


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _values(pack: Path):
    """(key, image bytes, label, stored value) of every sample, by an LMDB cursor."""
    import lmdb

    from packer.codecs.protowire import decode_datum

    keys = json.loads((pack / "keys.json").read_text())
    env = lmdb.open(str(pack), readonly=True, lock=False, readahead=False, subdir=True)
    try:
        with env.begin(buffers=False) as txn:
            for i, (_, value) in enumerate(txn.cursor()):
                d = decode_datum(value)
                yield keys[i], d.data, d.label, value
    finally:
        env.close()


def bare_tar(pack: Path, out: Path, shard_bytes: int, checks: bool) -> int:
    """The bare loop: LMDB values -> tar members, shards of ``shard_bytes``; ``checks``: the CRC32C
    of each value against checksums.bin, the sha256 of each shard."""
    import numpy as np

    from packer.integrity import crc32c

    crcs = np.fromfile(pack / "checksums.bin", dtype="<u4") if checks else None
    out.mkdir(parents=True)
    n, shard, tar, f = 0, 0, None, None

    def close() -> None:
        tar.close()
        f.flush()
        os.fsync(f.fileno())
        f.close()
        if checks:
            h = hashlib.sha256()
            with open(f.name, "rb") as g:
                for block in iter(lambda: g.read(1 << 20), b""):
                    h.update(block)

    for key, data, label, value in _values(pack):
        if crcs is not None and crc32c(value) != int(crcs[n]):
            raise ValueError(f"sample {n}: CRC32C mismatch")
        if tar is not None and tar.offset + len(data) + 2048 > shard_bytes:
            close()
            shard, tar = shard + 1, None
        if tar is None:
            f = open(out / f"shard-{shard:06d}.tar", "wb")
            tar = tarfile.open(fileobj=f, mode="w", format=tarfile.PAX_FORMAT)
        name = key.replace(".", "%2E")
        for ext, payload in (("jpg", data), ("cls", str(label).encode())):
            info = tarfile.TarInfo(f"{name}.{ext}")
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
        n += 1
    if tar is not None:
        close()
    return n


def bare_parquet(pack: Path, out: Path, shard_bytes: int) -> int:
    """The bare loop: LMDB values -> pyarrow tables of 1,000 rows -> Parquet files of ``shard_bytes``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from packer.fileio import fsync_path

    image = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    schema = pa.schema([("__key__", pa.string()), ("image", image), ("label", pa.int64())])
    out.mkdir(parents=True)
    n, shard, size, writer, rows = 0, 0, 0, None, []

    def flush() -> None:
        keys, datas, labels = zip(*rows)
        images = pa.StructArray.from_arrays([pa.array(datas, pa.binary()), pa.array(keys, pa.string())],
                                            names=["bytes", "path"])
        writer.write_table(pa.Table.from_arrays([pa.array(keys, pa.string()), images, pa.array(labels, pa.int64())],
                                                schema=schema))
        rows.clear()

    for key, data, label, _ in _values(pack):
        if writer is not None and size + len(data) > shard_bytes:
            flush()
            writer.close()
            fsync_path(out / f"shard-{shard:06d}.parquet")
            shard, size, writer = shard + 1, 0, None
        if writer is None:
            writer = pq.ParquetWriter(str(out / f"shard-{shard:06d}.parquet"), schema, compression="NONE")
        rows.append((key, data, label))
        size += len(data) + 8
        n += 1
        if len(rows) >= 1000:
            flush()
    if writer is not None:
        if rows:
            flush()
        writer.close()
        fsync_path(out / f"shard-{shard:06d}.parquet")
    return n


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """One row, timed in this (fresh) process."""
    pack, out, row, shard_bytes = Path(spec["pack"]), Path(spec["out"]), spec["row"], spec["shard_bytes"]
    if row.startswith("packer"):
        # imported before the window: packer, the command, and what a library call's argument
        # check imports once per process (packer.arguments: ResizeSpec, with OpenCV)
        import packer
        import packer.codecs.resize  # noqa: F401
        from packer.commands import export as _  # noqa: F401
        if "parquet" in row:
            import pyarrow.parquet  # noqa: F401
    elif row == "bare parquet":
        import pyarrow.parquet  # noqa: F401
    import lmdb  # noqa: F401
    import numpy  # noqa: F401

    cpu, t = _cpu(), time.perf_counter()
    if row.startswith("packer"):
        n = packer.export(pack, out, to="parquet" if "parquet" in row else "wds", shard_size=shard_bytes).count
    elif row == "bare parquet":
        n = bare_parquet(pack, out, shard_bytes)
    else:
        n = bare_tar(pack, out, shard_bytes, checks=row.endswith("checks"))
    wall, cpu = time.perf_counter() - t, _cpu() - cpu
    return {"row": row, "samples": n, "wall_s": wall, "cpu_s": cpu,
            "bytes": sum(p.stat().st_size for p in out.iterdir())}


def export_main(argv: list[str]) -> dict[str, Any]:
    """The export rows against the bare loops, fresh processes, interleaved rounds."""
    ap = argparse.ArgumentParser(prog="python -m scripts.bench.export export")
    ap.add_argument("--count", type=int, default=2000, help="images in the LMDB")
    ap.add_argument("--size", default="432x576", help="their size, HxW (jittered by +-1/8)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds of every row")
    ap.add_argument("--shard-size", type=int, default=32_000_000, help="bytes per shard")
    ap.add_argument("--workdir", type=Path, default=Path("bench-out/export"))
    args = ap.parse_args(argv)
    try:
        import pyarrow  # noqa: F401
        rows = ROWS
    except ImportError:
        print("pyarrow is not installed: the Parquet rows are skipped")
        rows = ROWS[:3]
    h, w = (int(v) for v in args.size.split("x"))
    src = image_folder(args.workdir / f"src-{args.count}-{args.size}", count=args.count, size=(h, w))
    pack = args.workdir / f"pack-{args.count}-{args.size}.lmdb"
    if not (pack / "packer.json").exists():
        import packer

        packer.pack(src, pack, workers=0, check="header", overwrite=pack.exists())
    mb = sum(p.stat().st_size for p in pack.iterdir()) / 1e6
    print(f"machine: {os.cpu_count()} cores, load average at start {os.getloadavg()[0]:.2f}; "
          f"{args.count} JPEGs of ~{args.size}, LMDB {mb:.0f} MB, shards of {args.shard_size / 1e6:.0f} MB, "
          f"{args.rounds} rounds, each row a fresh process")
    results: dict[str, list[dict[str, Any]]] = {row: [] for row in rows}
    for _ in range(args.rounds):
        for row in rows:
            out = args.workdir / "out"
            shutil.rmtree(out, ignore_errors=True)
            r = run_fresh(MODULE, {"pack": str(pack), "out": str(out), "row": row, "shard_bytes": args.shard_size})
            if "error" in r:
                raise RuntimeError(f"{row}: {r['error']}")
            results[row].append(r)
    shutil.rmtree(args.workdir / "out", ignore_errors=True)

    def med(row: str, what: str) -> float:
        return statistics.median(r["samples"] / r[what] for r in results[row])

    table = [[row, f"{med(row, 'wall_s'):.0f}", f"{med(row, 'cpu_s'):.0f}",
              f"{statistics.median(r['bytes'] / r['wall_s'] for r in results[row]) / 1e6:.0f}"] for row in rows]
    print()
    print(md_table(["row", "samples/s (wall)", "samples per CPU-s", "MB/s written (wall)"], table))

    def ratio(a: str, b: str, what: str) -> tuple[float, float, float]:
        per = [(ra["samples"] / ra[what]) / (rb["samples"] / rb[what]) for ra, rb in zip(results[a], results[b])]
        return statistics.median(per), min(per), max(per)

    pairs = [("packer export --to wds", "bare tar"), ("packer export --to wds", "bare tar + checks")]
    if "bare parquet" in rows:
        pairs.append(("packer export --to parquet", "bare parquet"))
    lines, figures = [], {"targets": []}
    for a, b in pairs:
        cpu, wall = ratio(a, b, "cpu_s"), ratio(a, b, "wall_s")
        lines.append([f"{a} / {b}", f"{cpu[0]:.2f}x ({cpu[1]:.2f}-{cpu[2]:.2f})",
                      f"{wall[0]:.2f}x ({wall[1]:.2f}-{wall[2]:.2f})"])
        figures["targets"].append(target(f"{a} vs {b}, per CPU-second", cpu[0]))
        figures["targets"].append(target(f"{a} vs {b}, wall", wall[0]))
    print()
    print(md_table(["ratio", "per CPU-second: median (range)", "wall: median (range)"], lines))
    print(f"\nload average at end {os.getloadavg()[0]:.2f}")
    figures["rows"] = results
    return figures


def main(argv: list[str] | None = None) -> int:
    """``export`` (the section) or ``--child SPEC`` (one row, in its fresh process)."""
    argv = sys.argv[1:] if argv is None else argv
    if child_row(argv, child):
        return 0
    return run_sections("export", __doc__, {"export": export_main}, all_sections=("export",), argv=argv,
                        quick={"export": ["--count", "60", "--rounds", "1", "--size", "120x160",
                                          "--shard-size", "200000", "--workdir", "bench-out/export-quick"]},
                        notes=["Each row a fresh process, its old output removed first; compare the per "
                               "CPU-second ratios on a shared machine."])


if __name__ == "__main__":
    sys.exit(main())

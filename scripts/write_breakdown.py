#!/usr/bin/env python
"""Where ``to-lmdb --check header`` spends its CPU beside the bare read + CRC32C + put loop.

Three comparisons in one process (``packer.heap.tune_heap`` first, as every command does), each
the least CPU time per sample over ``--reps`` interleaved rounds:

* **the whole run**, default options, beside ``bench_write.bare_lmdb``, and the same run with one
  piece of the framework switched off at a time (the listing answered from a cache, the journals'
  ``fsync_append``, the resume checkpoint, the fingerprint): what each piece costs; and the run's
  per-sample work alone in one flat loop (framed read, header check, Datum, CRC32C, appending
  put): the difference is what the framework costs;
* **the per-sample work** (``ImageJob`` in process: read into the Datum's frame, header check,
  Datum, CRC32C) beside the bare loop's ``open().read()`` + CRC32C;
* **the writer** (``LmdbWriter``: puts, commits, journals, sidecars, manifest) fed prepared
  samples, beside bare puts of the same values in transactions of 1,000.

The generated JPEGs of ``bench_write.py`` (made once in ``--workdir``):

    python scripts/write_breakdown.py --workdir bench-out/write
"""
from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from packer.heap import tune_heap  # noqa: E402

tune_heap()

import lmdb  # noqa: E402

from bench_write import bare_lmdb, files_of, image_set, warm  # noqa: E402
from packer.commands import pack_images as pim  # noqa: E402
from packer.conversion import runner  # noqa: E402
from packer.codecs.jpeg_header import jpeg_header  # noqa: E402
from packer.codecs.protowire import frame_datum  # noqa: E402
from packer.fileio import read_framed, remove_path  # noqa: E402
from packer.formats import writer as base_writer  # noqa: E402
from packer.formats.lmdb.writer import LmdbWriter  # noqa: E402
from packer.integrity import crc32c  # noqa: E402


def cpu(fn: Callable[[], object]) -> float:
    a = resource.getrusage(resource.RUSAGE_SELF)
    fn()
    b = resource.getrusage(resource.RUSAGE_SELF)
    return b.ru_utime + b.ru_stime - a.ru_utime - a.ru_stime


def least(rows: dict[str, Callable[[], object]], reps: int, n: int,
          outputs: tuple[Path, ...] = ()) -> dict[str, float]:
    """µs of CPU per sample, the least over ``reps`` rounds (order rotating by round).
    ``outputs`` are removed before each row, outside its timing (``bench_write.run_rows``
    says why: no row may write into colder pages than another)."""
    best = {k: float("inf") for k in rows}
    names = list(rows)
    for r in range(reps):
        for name in names[r % len(names):] + names[:r % len(names)]:
            for path in outputs:
                remove_path(path)
            best[name] = min(best[name], cpu(rows[name]) / n * 1e6)
    return best


class _Off:
    """Switch one piece of the run off (restored on exit)."""

    def __init__(self, piece: str, cached: tuple):
        self.piece, self.cached = piece, cached

    def __enter__(self) -> None:
        self.saved = (pim.image_items, base_writer.fsync_append, runner._Checkpointer.save, runner.Fingerprint)
        if self.piece == "listing":
            pim.image_items = lambda *a, **k: (list(self.cached[0]), list(self.cached[1]))
        elif self.piece == "journals":
            base_writer.fsync_append = lambda path, data: None
        elif self.piece == "checkpoint":
            runner._Checkpointer.save = lambda self: None
        elif self.piece == "fingerprint":
            runner.Fingerprint = _NoFingerprint

    def __exit__(self, *exc: object) -> None:
        pim.image_items, base_writer.fsync_append, runner._Checkpointer.save, runner.Fingerprint = self.saved


class _NoFingerprint:
    def __init__(self, **fields):
        self.inputs, self.stats = {"count": 0}, fields["stats"]

    def to_dict(self) -> dict:
        return {}

    def with_files(self, stats) -> "_NoFingerprint":
        return self


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", default="bench-out/write")
    ap.add_argument("--images", type=int, default=3000)
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    work = Path(args.workdir)
    src = image_set(work, args.images)
    files = files_of(src)
    warm(files)
    n = len(files)
    out = work / "breakdown"
    out.mkdir(parents=True, exist_ok=True)
    print(f"{n} JPEGs; load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")

    def pack() -> None:
        pim.pack_images(str(src), str(out / "p.lmdb"), format="lmdb", check="header", overwrite=True)

    cached = pim.image_items(str(src))

    def without(piece: str) -> Callable[[], None]:
        def go() -> None:
            with _Off(piece, cached):
                pack()
        return go

    framing = LmdbWriter.framing

    def flat() -> None:
        """The run's per-sample work (read into the Datum's frame, header check, Datum, CRC32C,
        appending put) in one loop over the listed items, with none of the framework: no
        runner, executor, Sample or Writer, no journals, checkpoint, fingerprint or manifest."""
        env = lmdb.open(str(out / "flat.lmdb"), map_size=1 << 34, subdir=True, meminit=True, readahead=False)
        crcs = []
        for start in range(0, n, 1000):
            with env.begin(write=True) as txn:
                for i in range(start, min(start + 1000, n)):
                    it = cached[0][i]
                    buf, size, _ = read_framed(it.path, framing.head, framing.tail)
                    h, w, c = jpeg_header(buf[framing.head:framing.head + size])
                    value = frame_datum(buf, framing.head, size, it.label, h, w, c)
                    crcs.append(crc32c(value))
                    txn.put(b"%08d" % i, value, append=True)
        env.close()

    rows = {"bare read + CRC32C + put loop": lambda: bare_lmdb(files, out / "bare.lmdb"),
            "to-lmdb --check header (default)": pack}
    rows.update({f"  without the {p}": without(p) for p in ("listing", "journals", "checkpoint", "fingerprint")})
    rows["its per-sample work in one flat loop"] = flat
    whole = least(rows, args.reps, n, outputs=(out / "p.lmdb", out / "bare.lmdb", out / "flat.lmdb"))

    # the per-run cost: a run on 10 of the images (claim, input table, journals, checkpoints,
    # manifest and sidecars, each fsynced), spread over a run's samples
    tiny = work / "breakdown-tiny"
    shutil.rmtree(tiny, ignore_errors=True)
    for f in files[:10]:
        dest = tiny / Path(f).parent.name / Path(f).name
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(f, dest)

    def tiny_pack() -> None:
        pim.pack_images(str(tiny), str(out / "tiny.lmdb"), format="lmdb", check="header")

    per_run_ms = least({"tiny": tiny_pack}, args.reps * 3, 1, outputs=(out / "tiny.lmdb",))["tiny"] / 1e3

    items, _ = cached
    job = pim.ImageJob(check="header", framing=LmdbWriter.framing)

    def bare_reads() -> None:
        for f in files:
            with open(f, "rb") as fh:
                crc32c(fh.read())

    def jobs() -> None:
        for it in items:
            job(it)

    work_rows = least({"bare open().read() + CRC32C": bare_reads,
                       "ImageJob in process (framed read, header, Datum, CRC32C)": jobs}, args.reps, n)

    samples = [job(it) for it in items]

    def bare_puts() -> None:
        shutil.rmtree(out / "puts.lmdb", ignore_errors=True)
        env = lmdb.open(str(out / "puts.lmdb"), map_size=1 << 34, subdir=True)
        for start in range(0, n, 1000):
            with env.begin(write=True) as txn:
                for i in range(start, min(start + 1000, n)):
                    txn.put(b"%08d" % i, samples[i].prepared[0])
        env.close()

    def writer() -> None:
        w = LmdbWriter(out / "w.lmdb", classes=cached[1])
        w.open()
        for s in samples:
            w.add(s)
        w.close(overwrite=True)

    writer_rows = least({"bare puts of the prepared values": bare_puts,
                         "LmdbWriter (puts, commits, journals, sidecars, manifest)": writer}, args.reps, n,
                        outputs=(out / "puts.lmdb", out / "w.lmdb"))

    print("\n| the whole run | CPU µs/sample |\n|---|---:|")
    for name, v in whole.items():
        print(f"| {name} | {v:.1f} |")
    full = whole["to-lmdb --check header (default)"]
    print(f"\nbeside the bare loop: {full - whole['bare read + CRC32C + put loop']:+.1f} µs; each piece "
          "(the run minus the run without it): "
          + ", ".join(f"{p} {full - whole[f'  without the {p}']:+.1f}"
                      for p in ("listing", "journals", "checkpoint", "fingerprint")))
    print(f"beside its per-sample work in one flat loop (the framework: runner, executor, Sample, Writer, "
          f"listing, journals, checkpoint, fingerprint, manifest): "
          f"{full - whole['its per-sample work in one flat loop']:+.1f} µs")
    print(f"a run on 10 images: {per_run_ms:.1f} ms of CPU, {per_run_ms * 1e3 / n:.1f} µs per sample on {n} images")
    print("\n| the per-sample work | CPU µs/sample |\n|---|---:|")
    for name, v in work_rows.items():
        print(f"| {name} | {v:.1f} |")
    print("\n| the writer | CPU µs/sample |\n|---|---:|")
    for name, v in writer_rows.items():
        print(f"| {name} | {v:.1f} |")
    print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(tiny, ignore_errors=True)


if __name__ == "__main__":
    main()

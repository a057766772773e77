"""Writing: packer's conversions side by side with the bare loops they must keep up with.

Sections (the first argument; ``all`` runs write, full, frames, breakdown and frame-crc):

* ``write``, ``full``, ``frames``: below.
* ``breakdown``: where ``to-lmdb --check header`` spends its CPU beside the bare loop (the whole
  run with one piece of the framework off at a time, the per-sample work, the writer).
* ``timeline``: where ``decode-frames``' wall time goes beside the bare loop (per video, the
  pool's start, gaps between videos, the tail; whether the frames are byte-identical).
* ``frame-crc``: what ``FrameDataset``'s frame CRC check costs per TSN clip.
* ``scale``: per-item cost of a conversion with 1 and 2 workers, a 2-part sharded run + merge and
  Ray, and the projection for Kinetics-400 on N machines.
* ``hooks``: each ``Writer`` speed hook a plan uses (``keeps_samples``, ``prepare``, ``segments``)
  on and off, every row in a fresh process: what each saves the writer's process and in all.
* ``warmth``: what writing a file costs in system time right after another was deleted (why every
  row's old output is removed before it is timed).
* ``startup``: ``packer --help`` against ``python -c "import click"`` and a 1-image and a small
  ``to-lmdb``, each a fresh process: what starting packer costs.
* ``margin``: the per-sample CPU at the margin, each row a fresh process as a user runs it:
  ``to-lmdb`` and ``to-records --check header`` (defaults) on 20,000 images and on the first
  1,000 of them (all in the page cache), against the bare loops (records: also one that keeps each shard's sha256, as
  ``to-records`` does for its manifest), and ``decode-frames --short-side 256`` on 24 and 2
  copies of the 340x256 clip against the bare OpenCV loop; the two runs' difference over the
  difference in samples, so start-up and imports cancel.

Each section prints markdown and writes JSON (``--results``); ``--quick`` runs it at tiny sizes.

Generated photo-like JPEGs (``packer.synth``, ~500x475, 10 classes; made once and cached in
``--workdir``, read once so every row starts from the page cache) and two clips:

* ``--section write``  to-lmdb / to-records / to-hdf5 ``--check header`` with the default
  ``--workers`` and with ``--workers 0`` (and to-lmdb's shared-memory workers and to-hdf5's
  part files at ``--workers 2``), beside a bare single-process loop: read + CRC32C + put into a
  raw LMDB (default ``sync``: fsync on every commit of 1,000), and read + CRC32C + TFRecord
  framing + append + one fsync at the end.
* ``--section full``   ``--check full`` with 1 and 2 workers (to-records, to-hdf5; to-lmdb with
  2; to-hdf5 also on the verdict workers it used before its part files), beside a bare read +
  Pillow full decode loop on 1 and 2 processes (the target's), and on 2 processes a bare loop
  that decodes to luma only, as ``--check full`` does a colour JPEG: the share of the ratio
  that comes from decoding less, and what is left against the same decode.
* ``--section frames`` ``decode-frames --short-side 256`` with default options (all cores) on
  copies of a 340x256 H.264 clip (the mmaction2 fixture) and a 1280x720 clip (the fixture
  upscaled, written as mp4v: this OpenCV has no H.264 encoder), beside the best bare
  decode -> resize -> ``cv2.imencode`` q95 -> write loop on all cores (decord and OpenCV, 1 and
  2 processes, and OpenCV on one decoder thread a process as decode-frames runs it; the best
  one on all cores counts). Every row writes into a fresh folder after an ``os.sync()``, so no
  row pays for deleting or flushing another row's files.

The write, full and frames rows run in this one process with ``packer.heap.tune_heap`` applied first (as every packer
command applies it): a row run after others otherwise inherits whatever malloc thresholds
they left, which spares it page faults a process of its own pays (the bare LMDB loop ran faster
after the packer rows than before them). Rows are interleaved over ``--reps`` rounds, in a new
(seeded) order each round, and the best round of each is kept, so a burst of load from the other users of a shared machine hits
every row alike; each ratio is also given as the median over the rounds of the two rows'
ratio within a round (rows that ran minutes apart can see the machine at different speeds).
Each row's output of the round before is removed just before the row is timed (``run_rows``
says why). The load average is printed with the tables. Each section takes < 3 min on 2 cores.

    python -m scripts.bench.write write --reps 3      # < 3 min on 2 cores
    python -m scripts.bench.write breakdown --reps 7
    python -m scripts.bench.write --quick all          # smoke run
"""
from __future__ import annotations

import argparse
import hashlib
import io
import itertools
import json
import multiprocessing as mp
import os
import random
import resource
import shutil
import statistics
import struct
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, Callable

import cv2
import lmdb
import numpy as np
from PIL import Image

from packer.fileio import remove_path
from packer.integrity import crc32c, masked_crc32c
from packer.synth import jpeg_bytes, natural_image
from packer.conversion.options import RunOptions
from scripts.bench.common import REPO, image_folder, run_call, run_sections
from scripts.bench.common import target as bench_target

FIXTURE = Path(os.environ.get("PACKER_FIXTURES", REPO / "tests" / "fixtures")) / "videos" / "mmaction2_test.mp4"


# -- inputs ------------------------------------------------------------------------------------
def image_set(workdir: Path, count: int, classes: int = 10) -> Path:
    """``workdir/images``: ``count`` photo-like JPEGs (~475x500 +-1/8) in ``classes`` folders, made once."""
    return image_folder(workdir / "images", count=count, classes=classes, size=(475, 500))


def files_of(src: Path) -> list[str]:
    return sorted(str(p) for p in src.rglob("*.jpg"))


def warm(files: list[str]) -> int:
    total = 0
    for f in files:
        with open(f, "rb") as fh:
            total += len(fh.read())
    return total


# -- bare loops ----------------------------------------------------------------------------------
def bare_lmdb(files: list[str], out: Path) -> None:
    """Read + CRC32C + put into a raw LMDB, a commit (fsync) every 1,000 samples."""
    shutil.rmtree(out, ignore_errors=True)
    env = lmdb.open(str(out), map_size=1 << 34, subdir=True)
    crcs = []
    for start in range(0, len(files), 1000):
        with env.begin(write=True) as txn:
            for i in range(start, min(start + 1000, len(files))):
                with open(files[i], "rb") as f:
                    data = f.read()
                crcs.append(crc32c(data))
                txn.put(b"%08d" % i, data)
    env.close()


def bare_records(files: list[str], out: Path, digest: bool = False) -> None:
    """Read + CRC32C + TFRecord framing + append; one fsync at the end. ``digest``: the file's
    sha256 too, as it is written (what a records shard's manifest entry carries)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    sha = hashlib.sha256() if digest else None
    with open(out, "wb") as fh:
        for path in files:
            with open(path, "rb") as f:
                data = f.read()
            length = struct.pack("<Q", len(data))
            record = length + struct.pack("<I", masked_crc32c(length)) + data + struct.pack("<I", masked_crc32c(data))
            fh.write(record)
            if sha is not None:
                sha.update(record)
        fh.flush()
        os.fsync(fh.fileno())


def _decode_files(files: list[str], luma: bool = False) -> int:
    for path in files:
        with open(path, "rb") as f:
            im = Image.open(io.BytesIO(f.read()))
            if luma:  # what --check full decodes of a colour JPEG (packer.codecs.image.decode_all)
                im.draft("L", im.size)
            im.load()
    return len(files)


def bare_decode(files: list[str], procs: int, luma: bool = False) -> None:
    """Read + full Pillow decode (``luma``: to luma only), the files split over ``procs``
    processes."""
    if procs == 1:
        _decode_files(files, luma)
        return
    with ProcessPoolExecutor(procs, mp_context=mp.get_context("fork")) as ex:
        list(ex.map(_decode_files, [files[k::procs] for k in range(procs)], [luma] * procs))


# -- packer rows ---------------------------------------------------------------------------------
def pack(src: Path, out: Path, fmt: str, **options) -> None:
    import packer

    report = packer.pack(str(src), str(out), format=fmt, overwrite=True, **options)
    assert report.count > 0 and report.failed == 0, report.summary()


def pack_with_plan(src: Path, out: Path, fmt: str, mode: str, workers: int, **options) -> None:
    """``pack`` on a plan ``choose_plan`` no longer picks for it (a previous round's, to compare
    with): the command's plan choice replaced for this one call."""
    import packer.commands.pack_images as command
    from packer.conversion.plans import Plan

    chosen = command.choose_plan
    command.choose_plan = lambda **_: Plan(mode, workers, f"write.py: {mode}, as before")
    try:
        pack(src, out, fmt, **options)
    finally:
        command.choose_plan = chosen


# row -> (this process's CPU s, workers' CPU s), each the least over the rounds: contention from
# other users only ever adds CPU time (cache and core sharing), so the least is the row's own cost
CPU: dict[str, tuple[float, float]] = {}
# row -> its (CPU s, workers' CPU s) in each round, for the per-round ratios
ROUNDS: dict[str, list[tuple[float, float]]] = {}


# row -> the least minor page faults of this process over the rounds (a fault costs a few µs of
# kernel time: a page zeroed or copied on write after a fork)
FAULTS: dict[str, int] = {}
TARGETS: list[dict[str, Any]] = []  # every ratio table() printed, for the section's JSON


def timed(fn: Callable[[], object]) -> tuple[float, float, float, int]:
    """(wall s, CPU s of this process and its threads, CPU s of the worker processes, minor page
    faults of this process)."""
    s0, c0 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    fn()
    wall = time.perf_counter() - t
    s1, c1 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return (wall, s1.ru_utime + s1.ru_stime - s0.ru_utime - s0.ru_stime,
            c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime, s1.ru_minflt - s0.ru_minflt)


def run_rows(rows: dict[str, Callable[[], object]], reps: int,
             outputs: dict[str, Path] | None = None) -> dict[str, float]:
    """Best wall time of each row over ``reps`` interleaved rounds (a seeded new order each round).

    ``outputs``: each row's output, removed just before the row is timed. On this VM the first
    write into a page the host took back is several times dearer than into one freed a moment
    before (``scripts/page_warmth.py``: 600 MB written 8 s after a delete took 1.39 s of system
    time, right after it 0.17 s), so a row that deleted its last output at its start (the bare
    loops) wrote into warm pages while a packer row, which keeps the old output until the new
    one is complete (``--overwrite``), wrote into cold ones. Removed outside the timing, every
    row starts the same way."""
    best = {name: float("inf") for name in rows}
    names = list(rows)
    order = random.Random(0)
    for r in range(reps):
        # a new order each round: a rotation would give every row the same predecessor in every
        # round (rows that run the very same code came out ~0.87x apart that way)
        order.shuffle(names)
        for name in list(names):
            if outputs and name in outputs:
                remove_path(outputs[name])
            os.sync()  # a row's fsync/syncfs flushes its own writes, not the dirty pages of the rows before
            wall, own, children, faults = timed(rows[name])
            FAULTS[name] = min(FAULTS.get(name, faults), faults)
            best[name] = min(best[name], wall)
            was = CPU.get(name, (float("inf"), float("inf")))
            CPU[name] = (min(was[0], own), min(was[1], max(children, 0.0)))
            ROUNDS.setdefault(name, []).append((own, max(children, 0.0)))
    return best


def cpu_model(name: str, n: int, cores: int, cpu: tuple[float, float] | None = None) -> float:
    """Samples/s the row would reach on ``cores`` idle cores from its CPU time alone: the
    writer process caps it at 1/own, all the work spread over the cores at cores/(own+workers).
    I/O waits (fsync) are not in it; on a shared machine it is the load-robust figure.
    ``cpu``: one round's (own, workers) CPU s instead of the least over the rounds."""
    own, kids = (cpu or CPU[name])[0] / n, (cpu or CPU[name])[1] / n
    return min(1 / max(own, 1e-9), cores / max(own + kids, 1e-9))


def paired_model(a: str, b: str, n: int, cores: int) -> float:
    """The median over rounds of the CPU-model ratio of rows ``a`` and ``b`` measured in the same
    round (close in time: a drift of the machine's speed hits both)."""
    return statistics.median(cpu_model(a, n, cores, x) / cpu_model(b, n, cores, y)
                             for x, y in zip(ROUNDS[a], ROUNDS[b]))


def table(title: str, n: int, best: dict[str, float], ratios: list[tuple[str, str, str, float | None]],
          unit: str = "samples/s", keys: list[str] | None = None) -> str:
    """The rows' markdown, then each ratio (wall, CPU model); each ratio also goes into ``TARGETS``
    (the section's JSON) twice, as ``KEY, wall`` and ``KEY, CPU model``, ``KEY`` being the label
    or its entry in ``keys``."""
    cores = os.cpu_count() or 1
    lines = [f"### {title}", "", f"| row | {unit} (wall) | main process CPU µs/sample | workers' CPU µs/sample "
             f"| CPU model, {cores} idle cores | main process page faults/sample |", "|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {name} | {n / t:,.0f} | {CPU[name][0] / n * 1e6:,.0f} | {CPU[name][1] / n * 1e6:,.0f} "
              f"| {cpu_model(name, n, cores):,.0f} | {FAULTS[name] / n:.2f} |" for name, t in best.items()]
    lines += ["", "| ratio | wall | CPU model | CPU model, median of the rounds' ratios | target |",
              "|---|---:|---:|---:|---:|"]
    for k, (label, a, b, target) in enumerate(ratios):
        value = best[b] / best[a]
        model = cpu_model(a, n, cores) / cpu_model(b, n, cores)
        key = keys[k] if keys else label
        TARGETS.extend([bench_target(f"{key}, wall", value, target),
                        bench_target(f"{key}, CPU model", model, target)])
        lines.append(f"| {label} | {value:.2f}x | {model:.2f}x | {paired_model(a, b, n, cores):.2f}x "
                     f"| {'' if target is None else f'>= {target}x'} |")
    return "\n".join(lines)


def split_rows(spec: dict[str, tuple[Path, Callable[[Path], object]]]
               ) -> tuple[dict[str, Callable[[], object]], dict[str, Path]]:
    """``{name: (output, run(output))}`` as ``run_rows``' rows and outputs."""
    return ({name: (lambda o=o, fn=fn: fn(o)) for name, (o, fn) in spec.items()},
            {name: o for name, (o, _) in spec.items()})


def section_write(src: Path, work: Path, files: list[str], reps: int) -> str:
    out = work / "out"
    rows, outputs = split_rows({
        "to-lmdb --check header (default workers)": (out / "a.lmdb", lambda o: pack(src, o, "lmdb", check="header")),
        "to-lmdb --check header --workers 0": (out / "b.lmdb", lambda o: pack(src, o, "lmdb", check="header",
                                                                                 workers=0)),
        "bare read + CRC32C + put (LMDB, sync)": (out / "bare.lmdb", lambda o: bare_lmdb(files, o)),
        "to-lmdb --check header --workers 2 (shared-memory workers)": (
            out / "c.lmdb", lambda o: pack(src, o, "lmdb", check="header", workers=2)),
        "to-records --check header (default workers)": (out / "a.rec", lambda o: pack(src, o, "records",
                                                                                         check="header")),
        "to-records --check header --workers 0": (out / "b.rec", lambda o: pack(src, o, "records", check="header",
                                                                                   workers=0)),
        "bare read + CRC32C + append + fsync": (out / "bare.tfrecord", lambda o: bare_records(files, o)),
        "to-hdf5 --check header (default workers)": (out / "a.h5", lambda o: pack(src, o, "hdf5", check="header")),
        "to-hdf5 --check header --workers 0": (out / "b.h5", lambda o: pack(src, o, "hdf5", check="header",
                                                                              workers=0)),
        "to-hdf5 --check header --workers 2 (part files)": (out / "c.h5", lambda o: pack(src, o, "hdf5",
                                                                                           check="header", workers=2)),
        # the two pool engines on the same cheap work: RangePool (ranges out, verdicts back) against
        # pebble (every item out, every sample back): executors/__init__.py quotes this ratio
        "to-lmdb --check header --workers 2 (verdicts, RangePool)": (
            out / "d.lmdb", lambda o: pack_with_plan(src, o, "lmdb", "staged", 2, check="header")),
        "to-lmdb --check header --workers 2 (samples, pebble pool)": (
            out / "e.lmdb", lambda o: pack_with_plan(src, o, "lmdb", "pool", 2, check="header")),
    })
    best = run_rows(rows, reps, outputs)
    names = list(rows)
    return table(f"Cheap check, {len(files)} JPEGs", len(files), best, [
        ("to-lmdb default / bare LMDB loop", names[0], names[2], 0.8),
        ("to-lmdb default / --workers 0", names[0], names[1], 1.0),
        ("to-records default / bare append loop", names[4], names[6], 0.8),
        ("to-records default / --workers 0", names[4], names[5], 1.0),
        ("to-hdf5 default / --workers 0", names[7], names[8], 1.0),
        ("to-hdf5 --workers 2 (part files) / --workers 0", names[9], names[8], None),
        ("2 workers: RangePool verdicts / pebble pool samples", names[10], names[11], None),
    ])


def section_full(src: Path, work: Path, files: list[str], reps: int) -> str:
    out = work / "out"
    rows, outputs = split_rows({
        "to-records --check full --workers 1": (out / "f1.rec", lambda o: pack(src, o, "records", check="full",
                                                                                 workers=1)),
        "to-records --check full --workers 2": (out / "f2.rec", lambda o: pack(src, o, "records", check="full",
                                                                                 workers=2)),
        "to-lmdb --check full --workers 2 (shared-memory workers)": (
            out / "f2.lmdb", lambda o: pack(src, o, "lmdb", check="full", workers=2)),
        "to-hdf5 --check full --workers 1": (out / "f1.h5", lambda o: pack(src, o, "hdf5", check="full", workers=1)),
        "to-hdf5 --check full --workers 2 (part files)": (out / "f2.h5", lambda o: pack(src, o, "hdf5", check="full",
                                                                                          workers=2)),
        "to-hdf5 --check full, 2 verdict workers (the previous plan)": (
            out / "f2v.h5", lambda o: pack_with_plan(src, o, "hdf5", "staged", 2, check="full")),
    })
    rows.update({"bare read + decode, 1 process": lambda: bare_decode(files, 1),
                 "bare read + decode, 2 processes": lambda: bare_decode(files, 2),
                 "bare read + luma-only decode, 2 processes": lambda: bare_decode(files, 2, luma=True)})
    best = run_rows(rows, reps, outputs)
    names = list(rows)
    return table(f"Full check, {len(files)} JPEGs", len(files), best, [
        ("to-records full 2 / 1 workers", names[1], names[0], 1.6),
        ("to-records full 2 workers / bare 2-process decode", names[1], names[7], 0.85),
        ("to-lmdb full 2 workers / bare 2-process decode", names[2], names[7], 0.85),
        ("to-hdf5 full 2 / 1 workers", names[4], names[3], 1.6),
        ("to-hdf5 full 2 workers / bare 2-process decode", names[4], names[7], 0.85),
        ("to-hdf5 full, part files / verdict workers", names[4], names[5], None),
        ("bare decode 2 / 1 processes", names[7], names[6], None),
        ("to-records full 2 workers / bare 2-process luma-only decode", names[1], names[8], None),
        ("to-hdf5 full 2 workers / bare 2-process luma-only decode", names[4], names[8], None),
        ("bare luma-only / full decode, 2 processes", names[8], names[7], None),
    ])


# -- frames ----------------------------------------------------------------------------------------
def _write_copies(root: Path, size: tuple[int, int], copies: int) -> None:
    src = root.parent / f"{root.name}.clip.mp4"
    if not src.exists():
        if size == (340, 256):
            shutil.copy(FIXTURE, src)
        else:
            cap = cv2.VideoCapture(str(FIXTURE))
            vw = cv2.VideoWriter(str(src), cv2.VideoWriter_fourcc(*"mp4v"), 30, size)
            while True:
                ok, frame = cap.read()
                if not ok:
                    break
                vw.write(cv2.resize(frame, size, interpolation=cv2.INTER_CUBIC))
            vw.release()
    for i in range(copies):
        d = root / f"class_{i % 2}"
        d.mkdir(parents=True, exist_ok=True)
        shutil.copy(src, d / f"v_{i:03d}.mp4")


def _bare_frames(args: tuple[list[str], str, str]) -> int:
    """Decode -> resize (short side 256, INTER_AREA) -> imencode q95 -> write, for each video."""
    videos, out, backend = args
    cv2.setNumThreads(1)
    n = 0
    for v in videos:
        d = Path(out) / Path(v).stem
        d.mkdir(parents=True, exist_ok=True)
        if backend == "decord":
            import decord

            vr = decord.VideoReader(v, num_threads=1)
            frames = (cv2.cvtColor(vr.next().asnumpy(), cv2.COLOR_RGB2BGR) for _ in range(len(vr)))
        else:  # "opencv": FFmpeg's default decoder threads; "opencv-1t": one, as decode-frames uses
            frames = _cv2_frames(v, 1 if backend == "opencv-1t" else None)
        for k, frame in enumerate(frames, 1):
            h, w = frame.shape[:2]
            s = 256 / min(h, w)
            if s != 1:
                frame = cv2.resize(frame, (round(w * s), round(h * s)), interpolation=cv2.INTER_AREA)
            ok, buf = cv2.imencode(".jpg", frame, [cv2.IMWRITE_JPEG_QUALITY, 95])
            with open(d / f"img_{k:05d}.jpg", "wb") as f:
                f.write(buf.tobytes())
            n += 1
    return n


def _cv2_frames(video: str, threads: int | None = None):
    cap = (cv2.VideoCapture(video) if threads is None
           else cv2.VideoCapture(video, cv2.CAP_FFMPEG, [cv2.CAP_PROP_N_THREADS, threads]))
    while True:
        ok, frame = cap.read()
        if not ok:
            return
        yield frame


def bare_frames(videos: list[str], out: Path, backend: str, procs: int) -> int:
    shutil.rmtree(out, ignore_errors=True)
    parts = [(videos[k::procs], str(out), backend) for k in range(procs)]
    if procs == 1:
        return _bare_frames(parts[0])
    with ProcessPoolExecutor(procs, mp_context=mp.get_context("fork")) as ex:
        return sum(ex.map(_bare_frames, parts))


def packer_frames(src: Path, out: Path, **options) -> None:
    import packer

    report = packer.decode_frames(str(src), str(out), short_side=256, overwrite=True, **options)
    assert report.failed == 0, report.summary()


def section_frames(work: Path, reps: int, out_root: Path,
                   clips: tuple[tuple[str, tuple[int, int], int], ...] = (("clips_340x256", (340, 256), 12),
                                                                         ("clips_1280x720", (1280, 720), 2))) -> str:
    parts = []
    cores = os.cpu_count() or 1
    for name, size, copies in clips:
        root = work / name
        if not (root / ".done").exists():
            shutil.rmtree(root, ignore_errors=True)
            _write_copies(root, size, copies)
            (root / ".done").touch()
        videos = sorted(str(p) for p in root.rglob("*.mp4"))
        warm(videos)
        frames = _count_frames(videos[0]) * len(videos)
        out = out_root / name
        # every row writes into a fresh folder: deleting the last round's (synced) frame files
        # waits on the disk's journal, which is no part of any row's work
        fresh = itertools.count()
        rows = {"decode-frames --short-side 256 (defaults)":
                lambda: packer_frames(root, out / f"packer-{next(fresh)}")}
        for backend in ("decord", "opencv"):
            for procs in sorted({1, cores}):
                rows[f"bare {backend} loop, {procs} process{'es' if procs > 1 else ''}"] = (
                    lambda b=backend, p=procs: bare_frames(videos, out / f"bare-{b}-{p}-{next(fresh)}", b, p))
        rows[f"bare opencv loop, one decoder thread, {cores} process{'es' if cores > 1 else ''}"] = (
            lambda: bare_frames(videos, out / f"bare-opencv-1t-{next(fresh)}", "opencv-1t", cores))
        best = run_rows(rows, reps)
        shutil.rmtree(out, ignore_errors=True)
        bare = min((t for k, t in best.items() if k.startswith("bare") and f", {cores} process" in k))
        best_name = next(k for k, t in best.items() if t == bare)
        parts.append(table(f"decode-frames, {len(videos)} x {size[0]}x{size[1]} clips ({frames} frames)",
                           frames, best, [(f"default / best bare loop on all cores ({best_name})",
                                           "decode-frames --short-side 256 (defaults)", best_name, 0.9)],
                           unit="frames/s", keys=[f"decode-frames default / best bare loop on all cores, "
                                                  f"{size[0]}x{size[1]}"]))
    return "\n\n".join(parts)


def _count_frames(video: str) -> int:
    cap = cv2.VideoCapture(video)
    n = 0
    while cap.grab():
        n += 1
    return n


# == breakdown ======================================================================================
def _breakdown_imports() -> None:
    """The package pieces the breakdown switches off, imported once (module globals)."""
    global pim, runner, jpeg_header, encode_datum, datum_pieces, encode_varint, read_file, base_writer, LmdbWriter
    from packer.codecs.jpeg_header import jpeg_header
    from packer.codecs.protowire import datum_pieces, encode_datum, encode_varint
    from packer.commands import pack_images as pim
    from packer.conversion import runner
    from packer.fileio import read_file
    from packer.formats import writer as base_writer
    from packer.formats.lmdb.writer import LmdbWriter


def cpu(fn: Callable[[], object]) -> float:
    a = resource.getrusage(resource.RUSAGE_SELF)
    fn()
    b = resource.getrusage(resource.RUSAGE_SELF)
    return b.ru_utime + b.ru_stime - a.ru_utime - a.ru_stime


def least(rows: dict[str, Callable[[], object]], reps: int, n: int,
          outputs: tuple[Path, ...] = ()) -> dict[str, float]:
    """µs of CPU per sample, the least over ``reps`` rounds (order rotating by round).
    ``outputs`` are removed before each row, outside its timing (``run_rows``
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


def _image_section(section: str, argv: list[str], *, images: int, reps: int
                   ) -> tuple[argparse.Namespace, Path, Path]:
    """A section's ``--workdir``/``--images``/``--reps`` arguments, its work folder and image set."""
    ap = argparse.ArgumentParser(prog=f"write.py {section}")
    ap.add_argument("--workdir", default="bench-out/write")
    ap.add_argument("--images", type=int, default=images)
    ap.add_argument("--reps", type=int, default=reps)
    args = ap.parse_args(argv)
    work = Path(args.workdir)
    return args, work, image_set(work, args.images)


def breakdown_main(argv: list[str]) -> None:
    """Where ``to-lmdb --check header`` spends its CPU beside the bare read + CRC32C + put loop:
    the whole run (with one piece of the framework off at a time), the per-sample work, the writer;
    each the least CPU per sample over ``--reps`` interleaved rounds, in this process."""
    _breakdown_imports()
    args, work, src = _image_section("breakdown", argv, images=3000, reps=7)
    files = files_of(src)
    warm(files)
    n = len(files)
    out = work / "breakdown"
    out.mkdir(parents=True, exist_ok=True)
    print(f"{n} JPEGs; load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")

    def pack() -> None:
        pim.pack_images(str(src), str(out / "p.lmdb"), format="lmdb", check="header",
                        run_options=RunOptions(overwrite=True))

    cached = pim.image_items(str(src))

    def without(piece: str) -> Callable[[], None]:
        def go() -> None:
            with _Off(piece, cached):
                pack()
        return go

    def flat() -> None:
        """The run's per-sample work (read, header check, Datum, CRC32C,
        appending put) in one loop over the listed items, with none of the framework: no
        runner, executor, Sample or Writer, no journals, checkpoint, fingerprint or manifest."""
        env = lmdb.open(str(out / "flat.lmdb"), map_size=1 << 34, subdir=True, meminit=True, readahead=False)
        crcs = []
        for start in range(0, n, 1000):
            with env.begin(write=True) as txn:
                for i in range(start, min(start + 1000, n)):
                    it = cached[0][i]
                    data = read_file(it.path)
                    h, w, c = jpeg_header(data)
                    value = encode_datum(data, it.label, h, w, c)
                    crcs.append(crc32c(value))
                    txn.put(b"%08d" % i, value, append=True)
        env.close()

    def flat_in_place() -> None:
        """``flat``, each file read into one reused buffer 64 bytes in and the Datum's other pieces
        written around it: the Datum's copy of the image (and each read's new bytes) gone."""
        env = lmdb.open(str(out / "flat.lmdb"), map_size=1 << 34, subdir=True, meminit=True, readahead=False)
        room, buf = 64, bytearray(1 << 24)
        view = memoryview(buf)
        crcs = []
        for start in range(0, n, 1000):
            with env.begin(write=True) as txn:
                for i in range(start, min(start + 1000, n)):
                    it = cached[0][i]
                    fd = os.open(it.path, os.O_RDONLY)
                    try:
                        size = os.fstat(fd).st_size
                        k = os.readv(fd, [view[room:room + size + 1]])
                    finally:
                        os.close(fd)
                    h, w, c = jpeg_header(view[room:room + k])
                    head, _, tail = datum_pieces(b"", it.label, h, w, c)
                    head = head[:-1] + encode_varint(k)  # (the empty data's length replaced by the image's)
                    a, b = room - len(head), room + k + len(tail)
                    buf[a:room], buf[room + k:b] = head, tail
                    crcs.append(crc32c(view[a:b]))
                    txn.put(b"%08d" % i, view[a:b], append=True)
        env.close()

    rows = {"bare read + CRC32C + put loop": lambda: bare_lmdb(files, out / "bare.lmdb"),
            "to-lmdb --check header (default)": pack}
    rows.update({f"  without the {p}": without(p) for p in ("listing", "journals", "checkpoint", "fingerprint")})
    rows["its per-sample work in one flat loop"] = flat
    rows["  the same, each file read into one reused buffer with the Datum around it"] = flat_in_place
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
    job = pim.ImageJob(check="header")

    def bare_reads() -> None:
        for f in files:
            with open(f, "rb") as fh:
                crc32c(fh.read())

    def jobs() -> None:
        for it in items:
            LmdbWriter.prepare(job(it))

    work_rows = least({"bare open().read() + CRC32C": bare_reads,
                       "ImageJob in process + LmdbWriter.prepare (read, header, Datum, CRC32C)": jobs}, args.reps, n)

    samples = [job(it) for it in items]
    for s in samples:
        s.prepared = LmdbWriter.prepare(s)

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


# == timeline =======================================================================================
LOG = Path(os.environ.get("TMPDIR", "/tmp")) / f"frames-timeline-{os.getpid()}.jsonl"
PHASES: dict[str, list[float]] = {}


def _log(kind: str, start: float) -> None:
    with open(LOG, "a") as f:
        f.write(json.dumps([kind, os.getpid(), start, time.perf_counter()]) + "\n")


def _timed_phase(name: str, fn):
    def wrapped(*args, **kwargs):
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            PHASES.setdefault(name, []).append(time.perf_counter() - t)
    return wrapped


_job_call = None  # decode-frames' own FrameJob.__call__, set by timeline_main


def _packer_video(self, item):  # runs in the workers (forked: the patch goes with them)
    t = time.perf_counter()
    try:
        return _job_call(self, item)
    finally:
        _log("packer", t)


_bare = None  # the bare loop's own _bare_frames, set by timeline_main


def _bare_videos(args):
    videos, out, backend = args
    n = 0
    for v in videos:
        t = time.perf_counter()
        n += _bare(([v], out, backend))
        _log("bare", t)
    return n


def _compare(packer_out: Path, bare_out: Path, videos: list[str]) -> str:
    """``same of total`` frame files equal byte for byte (decode-frames: OUT/class/video/,
    the bare loop: OUT/video/, both img_00001.jpg on)."""
    same = total = 0
    for v in videos:
        ours = sorted((packer_out / Path(v).parent.name / Path(v).stem).iterdir())
        theirs = sorted((bare_out / Path(v).stem).iterdir())
        total += max(len(ours), len(theirs))
        same += sum(a.name == b.name and a.read_bytes() == b.read_bytes() for a, b in zip(ours, theirs))
    return f"{same} of {total}"


def timeline_main(argv: list[str]) -> None:
    """A timeline of decode-frames and the bare loop over the clips ``frames`` made (``--workdir``)."""
    ap = argparse.ArgumentParser(prog="write.py timeline")
    ap.add_argument("--workdir", default="/tmp/frames-bench")
    ap.add_argument("--clips", default="clips_340x256", help="clips_340x256 or clips_1280x720")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    root = Path(args.workdir) / args.clips
    videos = sorted(str(p) for p in root.rglob("*.mp4"))
    if not videos:
        raise SystemExit(f"{root}: no clips (run python -m scripts.bench.write frames first)")
    global _job_call, _bare
    import packer.commands.decode_frames as df
    import packer.formats.frames.writer as frames_writer

    saved = (df.FrameJob.__call__, _bare_frames, df._estimate, frames_writer._syncfs)
    _job_call, _bare = df.FrameJob.__call__, _bare_frames
    df.FrameJob.__call__ = _packer_video  # the workers are forked: the patches go with them
    globals()["_bare_frames"] = _bare_videos
    df._estimate = _timed_phase("space check", df._estimate)
    frames_writer._syncfs = _timed_phase("syncfs", frames_writer._syncfs)
    try:
        _timeline(args, root, videos)
    finally:
        df.FrameJob.__call__, _, df._estimate, frames_writer._syncfs = saved
        globals()["_bare_frames"] = saved[1]


def _timeline(args: argparse.Namespace, root: Path, videos: list[str]) -> None:
    warm(videos)
    out = Path(args.workdir) / "timeline-out"
    print(f"{len(videos)} x {args.clips}; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for r in range(args.rounds):
        for kind in ("packer", "bare") if r % 2 == 0 else ("bare", "packer"):
            LOG.unlink(missing_ok=True)
            PHASES.clear()
            target = out / f"{kind}-{r}"
            os.sync()
            t0 = time.perf_counter()
            if kind == "packer":
                packer_frames(root, target)
            else:
                bare_frames(videos, target, "opencv-1t", os.cpu_count() or 1)
            wall = time.perf_counter() - t0
            rows = [json.loads(line) for line in LOG.read_text().splitlines()]
            per_worker: dict[int, list[tuple[float, float]]] = {}
            for _, pid, a, b in rows:
                per_worker.setdefault(pid, []).append((a - t0, b - t0))
            spans = [sorted(v) for v in per_worker.values()]
            gaps = [sum(b[0] - a[1] for a, b in zip(s, s[1:])) for s in spans]
            first = min(s[0][0] for s in spans)
            last = max(s[-1][1] for s in spans)
            per_video = sum(b - a for s in spans for a, b in s) / len(rows)
            extra = "".join(f"  {k} {sum(v):.3f}s ({len(v)}x)" for k, v in PHASES.items())
            print(f"{kind:6s} wall {wall:.3f}s  per video {per_video:.3f}s  first {first:.3f}s  "
                  f"gaps {' '.join(f'{g:.3f}' for g in gaps)}s  tail {wall - last:.3f}s{extra}")
            if r > 0:
                shutil.rmtree(target, ignore_errors=True)
        if r == 0:
            print("frames identical to the bare loop's:", _compare(out / "packer-0", out / "bare-0", videos))
            shutil.rmtree(out / "packer-0"), shutil.rmtree(out / "bare-0")
    LOG.unlink(missing_ok=True)
    shutil.rmtree(out, ignore_errors=True)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


# == frame-crc ======================================================================================
def per_clip_ms(ds: Any, clips: int) -> float:
    """CPU milliseconds per clip over ``clips`` clips."""
    t = time.process_time()
    for k in range(clips):
        ds[k % len(ds)]
    return 1000 * (time.process_time() - t) / clips


def frame_crc_main(argv: list[str]) -> None:
    """CPU per TSN clip (8 frames) of FrameDataset with check_crc on and off, alternating rounds."""
    import tempfile

    import torch

    from packer.commands.decode_frames import decode_frames
    from packer.data.video import FrameDataset

    ap = argparse.ArgumentParser(prog="write.py frame-crc")
    ap.add_argument("--videos", type=int, default=4)
    ap.add_argument("--clips", type=int, default=100, help="clips per setting per round")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src"
        for i in range(args.videos):
            (src / f"class_{i % 2}").mkdir(parents=True, exist_ok=True)
            shutil.copy(FIXTURE, src / f"class_{i % 2}" / f"v{i}.mp4")
        out = Path(tmp) / "frames"
        decode_frames(src, out, run_options=RunOptions(workers=0, timeout=600.0))
        sets = {True: FrameDataset(out, clip_len=1, num_clips=8, test_mode=True, check_crc=True),
                False: FrameDataset(out, clip_len=1, num_clips=8, test_mode=True, check_crc=False)}
        for ds in sets.values():
            per_clip_ms(ds, 10)  # warm the page cache and the lazy state
        times = {True: [], False: []}
        for _ in range(args.rounds):
            for check in (False, True):
                times[check].append(per_clip_ms(sets[check], args.clips))
    on, off = sorted(times[True])[args.rounds // 2], sorted(times[False])[args.rounds // 2]
    print(f"{args.videos} x {FIXTURE.name} decoded to frame folders; TSN clips of 8 frames; "
          f"median of {args.rounds} rounds x {args.clips} clips, CPU time")
    print()
    print("| FrameDataset | CPU ms per clip | ratio |")
    print("|---|---|---|")
    print(f"| check_crc=False | {off:.2f} | 1.00x |")
    print(f"| check_crc=True (default) | {on:.2f} | {on / off:.3f}x |")


# == scale ==========================================================================================
# Kinetics-400 as released (Kay et al. 2017: 306,245 clips over train/val/test; fewer are still
# downloadable), ~10 s clips at ~30 fps.
K400_VIDEOS = 306_245
K400_FRAMES = 300


def have_decode_frames() -> bool:
    try:
        import packer.commands.decode_frames  # noqa: F401
    except ImportError:
        return False
    return True


def make_videos(root: Path, count: int, frames: int, size: tuple[int, int], classes: int = 10) -> Path:
    """``count`` synthetic videos (a moving natural-looking image) in class folders (cached)."""
    import cv2

    done = root / ".done"
    if done.exists() and done.read_text() == f"{count} {frames} {size}":
        return root
    shutil.rmtree(root, ignore_errors=True)
    rng = np.random.default_rng(0)
    h, w = size
    base = natural_image(rng, h + frames * 2, w + frames * 2)
    for i in range(count):
        d = root / f"class_{i % classes:02d}"
        d.mkdir(parents=True, exist_ok=True)
        vw = cv2.VideoWriter(str(d / f"video_{i:05d}.mp4"), cv2.VideoWriter_fourcc(*"mp4v"), 25.0, (w, h))
        if not vw.isOpened():
            sys.exit(f"cv2.VideoWriter cannot write {d}/video_{i:05d}.mp4 (no mp4v encoder?)")
        dy, dx = int(rng.integers(0, frames)), int(rng.integers(0, frames))
        for t in range(frames):  # pan across the image: real motion for the codec
            vw.write(np.ascontiguousarray(base[dy + t // 2:dy + t // 2 + h, dx + t:dx + t + w, ::-1]))
        vw.release()
    done.write_text(f"{count} {frames} {size}")
    return root


def make_fixture_copies(root: Path, count: int) -> Path | None:
    """``count`` links to the real Kinetics-like fixture (340x256, 300 frames)."""
    if not FIXTURE.exists():
        return None
    shutil.rmtree(root, ignore_errors=True)
    d = root / "class_0"
    d.mkdir(parents=True)
    for i in range(count):
        os.symlink(FIXTURE, d / f"clip_{i:03d}.mp4")
    return root


def make_images(root: Path, count: int, classes: int = 10) -> Path:
    done = root / ".done"
    if done.exists() and done.read_text() == str(count):
        return root
    shutil.rmtree(root, ignore_errors=True)
    rng = np.random.default_rng(0)
    for i in range(count):
        d = root / f"class_{i % classes:02d}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"img_{i:05d}.jpg").write_bytes(jpeg_bytes(natural_image(rng, 256, 320)))
    done.write_text(str(count))
    return root


def cpu_seconds() -> float:
    """CPU time of this process and its reaped children (local pool workers are reaped when the
    executor closes; Ray's workers are not our children, so Ray runs report wall time only)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


CPU: dict[str, float] = {}  # output name -> CPU seconds of its conversion


def convert(mode: str, src: Path, out: Path, **kw) -> tuple[float, object]:
    shutil.rmtree(out, ignore_errors=True)
    c, t = cpu_seconds(), time.perf_counter()
    if mode == "videos":
        import packer

        report = packer.decode_frames(src, out, to="lmdb", **kw)
    else:
        import packer

        report = packer.pack(src, out, format="lmdb", **kw)
    wall = time.perf_counter() - t
    CPU[out.name] = cpu_seconds() - c
    return wall, report


def scale_main(argv: list[str]) -> dict[str, object]:
    """A conversion with 1 and 2 workers, a 2-part sharded run + merge, Ray; the Kinetics-400 projection."""
    from packer.commands.merge import merge_parts

    ap = argparse.ArgumentParser(prog="write.py scale")
    ap.add_argument("--mode", choices=["auto", "videos", "images"], default="auto")
    ap.add_argument("--videos", type=int, default=1000)
    ap.add_argument("--frames", type=int, default=25, help="frames per synthetic video")
    ap.add_argument("--size", default="240x320", help="synthetic video HxW")
    ap.add_argument("--fixture-copies", type=int, default=8, help="copies of the real 300-frame clip")
    ap.add_argument("--images", type=int, default=2000)
    ap.add_argument("--ray", action="store_true", help="also run on a local Ray instance (2 CPUs)")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/packer-bench-scale"))
    ap.add_argument("--cores-per-machine", type=int, default=32)
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = ap.parse_args(argv)
    mode = args.mode if args.mode != "auto" else ("videos" if have_decode_frames() else "images")
    if mode == "videos" and not have_decode_frames():
        sys.exit("--mode videos needs packer decode-frames (not in this checkout)")
    work = args.workdir
    work.mkdir(parents=True, exist_ok=True)
    print(f"mode: {mode}; load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    if mode == "videos":
        h, w = map(int, args.size.split("x"))
        src = make_videos(work / "videos", args.videos, args.frames, (h, w))
        n, unit = args.videos, "video"
    else:
        src = make_images(work / "images", args.images)
        n, unit = args.images, "image"

    fig: dict[str, object] = {"mode": mode, "items": n}
    t1, r1 = convert(mode, src, work / "out-w1", workers=1)
    t2, r2 = convert(mode, src, work / "out-w2", workers=2)
    fig.update(w1_s=t1, w2_s=t2, per_item_ms_w1=1e3 * t1 / n, per_item_ms_w2=1e3 * t2 / n,
               speedup_2_workers=t1 / t2, samples=r1.count, cpu_ms_per_item_w1=1e3 * CPU["out-w1"] / n,
               cpu_ms_per_item_w2=1e3 * CPU["out-w2"] / n)
    # The cluster recipe on one machine: two parts (as two jobs would), then the merge.
    parts, part_s = [], []
    for i in range(2):
        t, _ = convert(mode, src, work / f"part-{i}", workers=1, num_shards=2, shard_index=i)
        parts.append(work / f"part-{i}")
        part_s.append(t)
    shutil.rmtree(work / "merged", ignore_errors=True)
    c, t = cpu_seconds(), time.perf_counter()
    merge_parts(parts, work / "merged")
    merge_s, merge_cpu = time.perf_counter() - t, cpu_seconds() - c
    fig.update(part_s=part_s, merge_s=merge_s, merge_vs_single_w1=merge_s / t1,
               merge_cpu_ms_per_sample=1e3 * merge_cpu / r1.count)
    if args.ray:
        import ray

        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
                 logging_level="WARNING")
        convert(mode, src, work / "out-ray-warm", workers=2, executor="ray", num_shards=50,
                shard_index=0)  # Ray worker start-up, on 2% of the input
        tr, _ = convert(mode, src, work / "out-ray", workers=2, executor="ray")
        ray.shutdown()
        fig.update(ray_w2_s=tr, per_item_ms_ray_w2=1e3 * tr / n, ray_vs_local_w2=tr / t2)
    if mode == "videos":
        fixture = make_fixture_copies(work / "fixture", args.fixture_copies)
        if fixture is not None:
            tf, rf = convert(mode, fixture, work / "out-fixture", workers=1)
            fig.update(fixture_videos=args.fixture_copies, fixture_frames=rf.count,
                       wall_ms_per_frame_fixture=1e3 * tf / rf.count,
                       cpu_ms_per_frame_fixture=1e3 * CPU["out-fixture"] / rf.count)
        per_frame_ms = fig.get("cpu_ms_per_frame_fixture", 1e3 * CPU["out-w1"] / r1.count)
        per_video_s = per_frame_ms * K400_FRAMES / 1e3
        basis = (f"{per_frame_ms:.2f} CPU-ms/frame x {K400_FRAMES} frames "
                 f"({'real 340x256 clip' if 'cpu_ms_per_frame_fixture' in fig else 'synthetic videos'})")
    else:
        per_video_s, basis = None, "images: no video cost measured"
    fig["load_after"] = os.getloadavg()[0]

    print(f"\n{n} {unit}s -> {fig['samples']} samples")
    print(f"1 worker : {t1:7.1f}s wall  {fig['per_item_ms_w1']:7.2f} ms/{unit}  "
          f"{fig['cpu_ms_per_item_w1']:7.2f} CPU-ms/{unit}")
    print(f"2 workers: {t2:7.1f}s wall  {fig['per_item_ms_w2']:7.2f} ms/{unit}  "
          f"{fig['cpu_ms_per_item_w2']:7.2f} CPU-ms/{unit}   wall speedup x{fig['speedup_2_workers']:.2f}")
    print(f"2 parts (--num-shards 2, 1 worker each): {part_s[0]:.1f}s + {part_s[1]:.1f}s; "
          f"merge {merge_s:.1f}s = {100 * merge_s / t1:.0f}% of the 1-worker conversion, "
          f"{fig['merge_cpu_ms_per_sample']:.3f} CPU-ms per sample")
    if args.ray:
        print(f"Ray (local, 2 CPUs): {fig['ray_w2_s']:.1f}s  {fig['per_item_ms_ray_w2']:.2f} ms/{unit}"
              f"  = x{fig['ray_vs_local_w2']:.2f} the local pool's time")
    if per_video_s is not None:
        # The wall-clock speedup on a shared 2-core box says little; the CPU time the pool adds
        # per item (IPC, pickling, process start) is what a bigger machine pays too.
        eff = min(1.0, fig["cpu_ms_per_item_w1"] / fig["cpu_ms_per_item_w2"])
        fig.update(k400_videos=K400_VIDEOS, per_video_s_projection=per_video_s, parallel_efficiency=eff)
        print(f"\nprojection for Kinetics-400 ({K400_VIDEOS:,} videos, {basis} = {per_video_s:.1f} "
              f"core-s/video, {eff:.0%} efficiency = 1-worker / 2-worker CPU time per video, every core busy):")
        total = K400_VIDEOS * per_video_s / eff
        fig["k400_core_hours"] = total / 3600
        print(f"  {total / 3600:,.0f} core-hours")
        merge_h = K400_VIDEOS * K400_FRAMES * fig["merge_cpu_ms_per_sample"] / 1e3 / 3600
        fig["k400_merge_hours"] = merge_h
        print(f"  merging the parts into one LMDB (a re-pack at {fig['merge_cpu_ms_per_sample']:.3f} CPU-ms "
              f"per frame as measured, one process; more if the disk is slower): {merge_h:.1f} h")
        for machines in (1, 4, 16, 64):
            minutes = total / (machines * args.cores_per_machine) / 60
            print(f"  {machines:3d} machines x {args.cores_per_machine} cores: {minutes:8.0f} min "
                  f"(+ the merge)")
    if args.json:
        args.json.write_text(json.dumps(fig, indent=1))
    return fig


# == warmth =========================================================================================
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


def warmth_main(argv: list[str]) -> None:
    """System time of writing a new file 0, 0.5, 2 and 8 s (``--pauses``) after deleting the previous one."""
    ap = argparse.ArgumentParser(prog="write.py warmth")
    ap.add_argument("--dir", default="/tmp", help="a folder on the disk to measure")
    ap.add_argument("--mb", type=int, default=640, help="MB per file (in 50 MB writes)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--pauses", type=lambda v: tuple(float(x) for x in v.split(",")), default=PAUSES,
                    help="seconds between the delete and the write, comma-separated (default 0,0.5,2,8)")
    args = ap.parse_args(argv)
    block = os.urandom(50 << 20)
    blocks = max(1, args.mb // 50)
    path = Path(args.dir) / f".page-warmth-{os.getpid()}.bin"
    least = {p: float("inf") for p in args.pauses}
    try:
        write_file(path, block, blocks)
        for _ in range(args.reps):
            for pause in args.pauses:
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


# == main ========================================================================================
def throughput_main(argv: list[str], section: str) -> dict[str, Any]:
    """The write, full and frames sections (one process, heap tuned as every command tunes it);
    returns the section's ratios as ``targets``."""
    ap = argparse.ArgumentParser(prog=f"write.py {section}")
    ap.add_argument("--workdir", default="bench-out/write")
    ap.add_argument("--images", type=int, default=3000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--frames-out", default=None, help="where frame rows write (default: under --workdir)")
    ap.add_argument("--small-clips", type=int, default=12, help="frames: copies of the 340x256 clip")
    ap.add_argument("--large-clips", type=int, default=2, help="frames: copies of the 1280x720 clip (0: none)")
    args = ap.parse_args(argv)
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    from packer.heap import tune_heap

    tune_heap()  # the same heap for every row, bare loops included (see the module docstring)
    start = len(TARGETS)
    print(f"cores: {os.cpu_count()}, load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if section in ("write", "full"):
        src = image_set(work, args.images)
        files = files_of(src)
        mb = warm(files) / 1e6
        print(f"{len(files)} JPEGs, {mb:.0f} MB ({mb * 1e3 / len(files):.0f} kB mean)")
        print(section_write(src, work, files, args.reps) if section == "write"
              else section_full(src, work, files, args.reps))
    else:
        clips = (("clips_340x256", (340, 256), args.small_clips),) + (
            (("clips_1280x720", (1280, 720), args.large_clips),) if args.large_clips else ())
        print(section_frames(work, args.reps, Path(args.frames_out) if args.frames_out else work / "out", clips))
    print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    shutil.rmtree(work / "out", ignore_errors=True)
    return {"targets": TARGETS[start:]}


# == hooks ==========================================================================================
# Each Writer speed hook that a plan uses, on and off: (hook, format, pack options). "Off" is a patch
# made in the row's own fresh process (``_hook_off``), never in the package.
# what the --quick row server imports once before it forks the hooks' rows (common.fork_rows)
FORK_PRELOAD = ("packer.heap", "packer.commands.pack_images")
HOOKS = [
    ("keeps_samples", "lmdb", {"check": "header", "workers": 2}),
    ("prepare", "lmdb", {"check": "header", "workers": 2}),
    ("segments", "records", {"check": "header"}),
    ("segments", "hdf5", {"check": "full", "workers": 2}),
]


def _hook_off(hook: str) -> None:
    """Switch ``hook`` off in this process: LMDB without ``keeps_samples`` gets verdict workers;
    shared-memory workers without the writer's ``prepare`` hand back the bytes and the writer
    encodes; a writer without ``segments`` gets verdict workers or runs in process."""
    from packer.formats import writer_class

    if hook == "keeps_samples":
        writer_class("lmdb").keeps_samples = True
    elif hook == "prepare":
        from packer.conversion.plans.shm import SharedMemoryExecutor

        init = SharedMemoryExecutor.__init__
        SharedMemoryExecutor.__init__ = lambda self, *, prepare=None, **kw: init(self, prepare=None, **kw)
    elif hook == "segments":
        for fmt in ("records", "hdf5"):
            writer_class(fmt).segments = None
    else:
        raise ValueError(f"unknown hook {hook!r}")


def _hook_row(src: str, out: str, fmt: str, options: dict, off: str) -> dict:
    """One pack in this (fresh) process, ``off`` switched off first: its CPU and plan."""
    from packer.heap import tune_heap
    import packer.commands.pack_images as command

    tune_heap()
    if off:
        _hook_off(off)
    modes, choose = [], command.choose_plan
    command.choose_plan = lambda **kw: modes.append(choose(**kw)) or modes[-1]
    warm(files_of(Path(src)))
    remove_path(out)
    os.sync()
    wall, own, kids, _ = timed(lambda: pack(Path(src), Path(out), fmt, **options))
    return {"wall": wall, "own": own, "kids": kids, "plan": modes[0].mode if modes else ""}


def hooks_main(argv: list[str]) -> None:
    """Each Writer speed hook on and off, every row in a fresh process (no row inherits another's
    heap, patches or imports; --quick forks them from one process: ``common.fork_rows``), rows
    interleaved over ``--reps`` rounds in a new seeded order each round: the writer process's CPU per
    sample (the single writer's ceiling), all processes' CPU, and
    the median over rounds of each round's off/on ratio (a shared machine's drift hits both)."""
    args, work, src = _image_section("hooks", argv, images=2000, reps=8)
    n = len(files_of(src))
    print(f"{n} JPEGs; cores: {os.cpu_count()}, load average before: "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    rows = [(h, fmt, opts, off) for h, fmt, opts in HOOKS for off in ("", h)]
    got: dict[tuple, list[dict]] = {}
    order = random.Random(0)
    for _ in range(args.reps):
        order.shuffle(rows)
        for hook, fmt, opts, off in rows:
            out = work / "out" / f"hook.{fmt}"
            row = run_call("scripts.bench.write", "_hook_row",
                           {"src": str(src), "out": str(out), "fmt": fmt, "options": opts, "off": off})
            got.setdefault((hook, fmt, repr(opts), off), []).append(row)
    lines = ["| hook | row | plan on / off | writer CPU µs/sample, on / off (least) | all CPU µs/sample, "
             "on / off (least) | off / on, writer CPU (median of rounds) | off / on, all CPU |",
             "|---|---|---|---:|---:|---:|---:|"]
    for hook, fmt, opts in HOOKS:
        on, off = got[(hook, fmt, repr(opts), "")], got[(hook, fmt, repr(opts), hook)]
        own = [(b["own"] / a["own"]) for a, b in zip(on, off)]
        tot = [((b["own"] + b["kids"]) / (a["own"] + a["kids"])) for a, b in zip(on, off)]
        us = lambda rs, k: min(r["own"] + (r["kids"] if k else 0) for r in rs) / n * 1e6  # noqa: E731
        flags = " ".join(f"--{k} {v}" for k, v in opts.items())
        lines.append(f"| {hook} | to-{fmt} {flags} | {on[0]['plan']} / {off[0]['plan']} | {us(on, 0):.1f} / "
                     f"{us(off, 0):.1f} | {us(on, 1):.1f} / {us(off, 1):.1f} | {statistics.median(own):.2f}x "
                     f"| {statistics.median(tot):.2f}x |")
    print("\n".join(lines))
    print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    shutil.rmtree(work / "out", ignore_errors=True)


def startup_main(argv: list[str]) -> dict[str, Any]:
    """What starting packer costs: ``packer --help`` against ``python -c "import click"`` (target
    <= 2.5x), and ``packer to-lmdb`` of 1 image (all fixed cost) and of ``--images`` images, each
    run a fresh process as a user types it; rows interleaved over ``--reps`` rounds in a new
    seeded order each round, medians of wall and CPU (the process and its children)."""
    from scripts.bench.read import md_table, target, targets_md

    argv = argv if "--workdir" in argv else ["--workdir", "bench-out/write-startup", *argv]
    args, work, src = _image_section("startup", argv, images=20, reps=15)
    one = work / "one-image"
    if not one.exists():
        (one / "a").mkdir(parents=True)
        shutil.copy(files_of(src)[0], one / "a")
    exe = shutil.which("packer")
    packer = [exe] if exe else [sys.executable, "-m", "packer"]
    out = work / "out" / "startup.lmdb"
    rows = {'python -c "import click"': [sys.executable, "-c", "import click"],
            "packer --help": packer + ["--help"],
            "packer to-lmdb, 1 image": packer + ["to-lmdb", str(one), str(out), "--overwrite"],
            f"packer to-lmdb, {len(files_of(src))} images": packer + ["to-lmdb", str(src), str(out), "--overwrite"]}
    # as on a user's machine, modules are compiled once (pip writes .pyc files when it installs):
    # this machine's PYTHONDONTWRITEBYTECODE would make every row compile packer's sources again
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    got: dict[str, list[tuple[float, float]]] = {name: [] for name in rows}
    order, names = random.Random(0), list(rows)
    for name in names:  # the first run of each writes the .pyc files and warms the page cache
        remove_path(out)
        subprocess.run(rows[name], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, check=True)
    for _ in range(args.reps):
        order.shuffle(names)
        for name in names:
            remove_path(out)
            t = time.perf_counter()
            proc = subprocess.Popen(rows[name], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
            _, status, ru = os.wait4(proc.pid, 0)
            if os.waitstatus_to_exitcode(status):
                raise RuntimeError(f"{name} failed: {rows[name]}")
            got[name].append((time.perf_counter() - t, ru.ru_utime + ru.ru_stime))
    shutil.rmtree(work / "out", ignore_errors=True)
    med = {name: (statistics.median(w for w, _ in r), statistics.median(c for _, c in r)) for name, r in got.items()}
    click_wall, click_cpu = med['python -c "import click"']
    table = [[f"`{name}`", f"{1e3 * w:.0f}", f"{1e3 * c:.0f}", f"{w / click_wall:.2f}x", f"{c / click_cpu:.2f}x"]
             for name, (w, c) in med.items()]
    help_wall, help_cpu = med["packer --help"]
    targets = [target('packer --help vs python -c "import click", wall', help_wall / click_wall, 2.5, at_most=True),
               target('packer --help vs python -c "import click", CPU', help_cpu / click_cpu, 2.5, at_most=True)]
    print(f"Each row a fresh process, medians of {args.reps} interleaved rounds; load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} at the end.\n")
    print(md_table(["command", "wall ms", "CPU ms", "wall / click", "CPU / click"], table))
    print("\n" + targets_md(targets))
    return {"medians": {name: {"wall_s": w, "cpu_s": c} for name, (w, c) in med.items()}, "targets": targets}


# == margin =========================================================================================
_BARE = {  # a bare loop as its own fresh process: python -c CODE KIND SRC OUT
    "lmdb": "bare_lmdb(files_of(src), out)",
    "records": "bare_records(files_of(src), out)",
    "records-sha256": "bare_records(files_of(src), out, digest=True)",
    "frames": "bare_frames(sorted(str(p) for p in src.rglob('*.mp4')), out, 'opencv-1t', os.cpu_count() or 1)"}
_BARE_CODE = ("import os, sys; from pathlib import Path; from scripts.bench.write import *; "
              "src, out = Path(sys.argv[2]), Path(sys.argv[3]); exec({}[sys.argv[1]])")


def _subset(src: Path, dest: Path, pattern: str, count: int) -> Path:
    """``dest``: hard links to the first ``count`` files of ``src`` matching ``pattern`` (the same
    files, so a small run reads the bytes a large one does), made once."""
    if not (dest / ".done").exists():
        shutil.rmtree(dest, ignore_errors=True)
        for f in sorted(src.rglob(pattern))[:count]:
            (dest / f.parent.relative_to(src)).mkdir(parents=True, exist_ok=True)
            os.link(f, dest / f.relative_to(src))
        (dest / ".done").touch()
    return dest


def margin_main(argv: list[str]) -> dict[str, Any]:
    """The per-sample cost at the margin (issue 43): each row a fresh process as a user runs it
    (packer's CLI with its defaults; each bare loop as ``python -c``) on ``--images`` images and on
    the first ``--base`` of them (``--clips`` and ``--base-clips`` copies of the 340x256 clip for
    decode-frames); the difference of the two runs' CPU seconds (the process and its children,
    ``os.wait4``) and wall seconds over the difference in samples, so start-up and imports cancel.
    Rows interleaved over ``--reps`` rounds in a new seeded order each round; each ratio (packer's
    samples per CPU-second over the bare loop's) is taken within a round, and the median and range
    over the rounds reported."""
    from scripts.bench.read import md_table, target, targets_md

    ap = argparse.ArgumentParser(prog="write.py margin")
    ap.add_argument("--workdir", default="bench-out/write-margin")
    ap.add_argument("--images", type=int, default=20000)
    ap.add_argument("--base", type=int, default=1000, help="the small run's images (its cost is subtracted)")
    ap.add_argument("--clips", type=int, default=24, help="copies of the 340x256 clip")
    ap.add_argument("--base-clips", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--kinds", default="lmdb,records,frames",
                    help="which rows, by what they write (comma-separated: lmdb, records, frames)")
    args = ap.parse_args(argv)
    kinds = set(args.kinds.split(","))
    if not kinds or kinds - {"lmdb", "records", "frames"}:
        ap.error(f"--kinds {args.kinds!r}: name lmdb, records and/or frames")
    work = Path(args.workdir)
    big = image_set(work, args.images)
    small = _subset(big, work / f"images-first-{args.base}", "*.jpg", args.base)
    clips = work / "clips_340x256"
    if not (clips / ".done").exists():
        shutil.rmtree(clips, ignore_errors=True)
        _write_copies(clips, (340, 256), args.clips)
        (clips / ".done").touch()
    few = _subset(clips, work / f"clips-first-{args.base_clips}", "*.mp4", args.base_clips)
    per_clip = _count_frames(files_of_kind(clips, "*.mp4")[0])
    packer = [sys.executable, "-m", "packer"]  # this checkout's packer (run from its root)
    out = work / "out"
    jobs = {  # name -> (kind, {size: (command, samples)})
        "to-lmdb --check header": ("lmdb", lambda src, o, n: (packer + ["to-lmdb", str(src), str(o), "--check", "header",
                                                                         "--overwrite"], n)),
        "bare read + CRC32C + put (LMDB)": ("lmdb", lambda src, o, n: (
            [sys.executable, "-c", _BARE_CODE.format(_BARE), "lmdb", str(src), str(o)], n)),
        "to-records --check header": ("records", lambda src, o, n: (packer + ["to-records", str(src), str(o), "--check",
                                                                             "header", "--overwrite"], n)),
        "to-records --check header --workers 0": ("records", lambda src, o, n: (
            packer + ["to-records", str(src), str(o), "--check", "header", "--workers", "0", "--overwrite"], n)),
        "bare read + CRC32C + append + fsync": ("records", lambda src, o, n: (
            [sys.executable, "-c", _BARE_CODE.format(_BARE), "records", str(src), str(o)], n)),
        "bare read + CRC32C + append + sha256 + fsync": ("records", lambda src, o, n: (
            [sys.executable, "-c", _BARE_CODE.format(_BARE), "records-sha256", str(src), str(o)], n)),
        "decode-frames --short-side 256": ("frames", lambda src, o, n: (
            packer + ["decode-frames", str(src), str(o), "--short-side", "256", "--overwrite"], n)),
        f"bare opencv loop, one decoder thread, {os.cpu_count()} processes": ("frames", lambda src, o, n: (
            [sys.executable, "-c", _BARE_CODE.format(_BARE), "frames", str(src), str(o)], n)),
    }
    sizes = {"lmdb": ((big, args.images), (small, args.base)), "records": ((big, args.images), (small, args.base)),
             "frames": ((clips, args.clips * per_clip), (few, args.base_clips * per_clip))}
    suffix = {"lmdb": ".lmdb", "records": ".tfrecord", "frames": ""}
    every, jobs = jobs, {name: job for name, job in jobs.items() if job[0] in kinds}
    runs = [(name, which) for name in jobs for which in (0, 1)]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}  # .pyc as pip writes them
    # the same environment on both sides: packer's CLI starts OpenBLAS with one thread (its threads
    # spin ~0.1 CPU-s at import); the bare loops import numpy too, and get the same
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    got: dict[tuple[str, int], list[tuple[float, float, float]]] = {r: [] for r in runs}
    fresh = itertools.count()

    def run(name: str, which: int) -> tuple[float, float, float]:
        kind, make = jobs[name]
        src, n = sizes[kind][which]
        o = out / f"{next(fresh)}{suffix[kind]}"
        cmd, _ = make(src, o, n)
        os.sync()
        t = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=REPO)
        _, status, ru = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t
        if os.waitstatus_to_exitcode(status):
            raise RuntimeError(f"{name} failed: {' '.join(cmd)}")
        remove_path(o)
        return wall, ru.ru_utime + ru.ru_stime, ru.ru_stime

    for r in runs:  # the first run of each writes the .pyc files and warms the page cache
        run(*r)
    order = random.Random(0)
    for _ in range(args.reps):
        order.shuffle(runs)
        for r in runs:
            got[r].append(run(*r))
    shutil.rmtree(out, ignore_errors=True)

    def margin(name: str, k: int) -> tuple[float, float, float]:
        """(CPU s, wall s, of the CPU the system's s) per sample at the margin in round ``k``."""
        kind = jobs[name][0]
        dn = sizes[kind][0][1] - sizes[kind][1][1]
        (w1, c1, s1), (w0, c0, s0) = got[(name, 0)][k], got[(name, 1)][k]
        return (c1 - c0) / dn, (w1 - w0) / dn, (s1 - s0) / dn

    table, figures, targets = [], {}, []
    for name in jobs:
        cpu = [margin(name, k)[0] for k in range(args.reps)]
        wall = [margin(name, k)[1] for k in range(args.reps)]
        sys_s = [margin(name, k)[2] for k in range(args.reps)]
        figures[name] = {"cpu_us": [1e6 * c for c in cpu], "wall_us": [1e6 * w for w in wall],
                         "system_us": [1e6 * c for c in sys_s]}
        table.append([name, f"{1e6 * statistics.median(cpu):,.0f} ({1e6 * min(cpu):,.0f}-{1e6 * max(cpu):,.0f})",
                      f"{1e6 * statistics.median(c - y for c, y in zip(cpu, sys_s)):,.0f}",
                      f"{1e6 * statistics.median(sys_s):,.0f}",
                      f"{statistics.median(1 / c for c in cpu):,.0f}",
                      f"{1e6 * statistics.median(wall):,.0f}"])
    ratios = []
    # (packer row, bare row, goal): to-records against the plain loop has no goal, for a loop that
    # writes the same promises (each shard's sha256, which the manifest carries) it has
    names = list(every)
    pairs = [(names[0], names[1], 0.9), (names[2], names[4], None), (names[2], names[5], 0.9),
             (names[3], names[5], None), (names[2], names[3], None), (names[6], names[7], 0.9)]
    for a, b, goal in [(a, b, goal) for a, b, goal in pairs if a in jobs and b in jobs]:
        per = [margin(b, k)[0] / margin(a, k)[0] for k in range(args.reps)]
        walls = [margin(b, k)[1] / margin(a, k)[1] for k in range(args.reps)]
        label = f"{a} / {b}"
        ratios.append([label, f"{statistics.median(per):.2f}x", f"{min(per):.2f}-{max(per):.2f}",
                       f"{statistics.median(walls):.2f}x", f">= {goal}x" if goal else ""])
        targets += [target(f"{label}, per CPU-second at the margin, median of rounds", statistics.median(per), goal),
                    target(f"{label}, per CPU-second at the margin, least of rounds", min(per), None),
                    target(f"{label}, per CPU-second at the margin, most of rounds", max(per), None),
                    target(f"{label}, wall at the margin, median of rounds", statistics.median(walls), None)]
    print(f"Each row a fresh process (packer's CLI with its defaults, the bare loops as `python -c`), on "
          f"{args.images} and the first {args.base} images (~475x500 photo-like JPEGs) and {args.clips} and "
          f"{args.base_clips} copies of a 340x256 clip ({per_clip} frames each); per sample: the difference of "
          f"the two runs over the difference in samples (start-up cancels). {args.reps} interleaved rounds; "
          f"CPU: the process and its children. {os.cpu_count()} cores; load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} at the end.\n")
    print(md_table(["row", "CPU µs per sample at the margin, median (range)", "of it user, median",
                    "of it system, median", "samples per CPU-second", "wall µs per sample at the margin"], table))
    print()
    print(md_table(["ratio (samples per CPU-second)", "median of rounds", "range", "wall, median", "target"], ratios))
    print("\n" + targets_md(targets))
    if "records" not in kinds:
        return {"rows": figures, "targets": targets}
    parts = records_parts(files_of(big)[:1000], work / "parts.tfrecord")
    print(f"\nWhere to-records' per-sample CPU goes beside the bare loop's: each part alone in this process, "
          f"least of 3 passes over {parts.pop('samples')} of the same JPEGs, µs per sample\n")
    print(md_table(["part", "µs per sample"], [[k, f"{v:.1f}"] for k, v in parts.items()]))
    return {"rows": figures, "targets": targets, "records_parts_us": parts}


def records_parts(files: list[str], scratch: Path) -> dict[str, Any]:
    """CPU µs per sample of each part of ``to-records``' per-sample work and of the bare loop's,
    in this process (least of 3 passes): the file read, the header check, the Example's framing
    against the bare framing, each shard's sha256 and the buffered write into ``scratch`` (a file,
    removed after)."""
    from packer.codecs.jpeg_header import jpeg_header
    from packer.fileio import read_file_stat
    from packer.formats.records.example import sample_pieces
    from packer.formats.records.writer import frame_pieces
    from packer.formats.sample import Sample

    def least(fn: Callable[[int], object]) -> float:
        best = float("inf")
        for _ in range(3):
            t = time.process_time()
            for i in range(len(files)):
                fn(i)
            best = min(best, (time.process_time() - t) / len(files))
        return 1e6 * best

    data = [read_file_stat(f)[0] for f in files]
    samples = [Sample(key=Path(f).name, data=d, fmt="jpeg", label=1, height=475, width=500, channels=3)
                for f, d in zip(files, data)]
    records = [frame_pieces(*sample_pieces(x))[0] for x in samples]

    def bare_frame(i: int) -> bytes:
        length = struct.pack("<Q", len(data[i]))
        return length + struct.pack("<I", masked_crc32c(length)) + data[i] + struct.pack("<I", masked_crc32c(data[i]))

    digest = hashlib.sha256()
    scratch.parent.mkdir(parents=True, exist_ok=True)
    with open(scratch, "wb") as sink:
        parts = {"file read (packer.fileio.read_file_stat)": least(lambda i: read_file_stat(files[i])),
                 "header check (jpeg_header)": least(lambda i: jpeg_header(data[i])),
                 "Example + TFRecord framing, CRC32C (to-records)": least(lambda i: frame_pieces(*sample_pieces(samples[i]))),
                 "TFRecord framing, CRC32C (bare loop)": least(bare_frame),
                 "sha256 of the record (to-records' shard digest)": least(lambda i: digest.update(records[i])),
                 "write (buffered)": least(lambda i: sink.write(records[i]))}
    scratch.unlink()
    return {"samples": len(files), **parts}


def files_of_kind(root: Path, pattern: str) -> list[str]:
    return sorted(str(p) for p in root.rglob(pattern))


SECTIONS: dict[str, Callable[[list[str]], None]] = {
    "write": lambda argv: throughput_main(argv, "write"),
    "full": lambda argv: throughput_main(argv, "full"),
    "frames": lambda argv: throughput_main(argv, "frames"),
    "breakdown": breakdown_main, "timeline": timeline_main, "frame-crc": frame_crc_main,
    "scale": scale_main, "warmth": warmth_main, "hooks": hooks_main, "startup": startup_main,
    "margin": margin_main}
ALL = ("write", "full", "frames", "breakdown", "frame-crc")
# each section its own workdir: the test suite runs sections at once, and outputs they shared collided
QUICK = {"write": ["--images", "40", "--reps", "1", "--workdir", "bench-out/write-quick/write"],
         "full": ["--images", "40", "--reps", "1", "--workdir", "bench-out/write-quick/full"],
         "frames": ["--reps", "1", "--small-clips", "2", "--large-clips", "0",
                    "--workdir", "bench-out/write-quick/frames"],
         "breakdown": ["--images", "40", "--reps", "1", "--workdir", "bench-out/write-quick/breakdown"],
         "timeline": ["--rounds", "1", "--workdir", "bench-out/write-quick/timeline"],
         "frame-crc": ["--videos", "1", "--clips", "4", "--rounds", "1"],
         "scale": ["--mode", "images", "--images", "40", "--workdir", "bench-out/write-quick/scale"],
         "warmth": ["--mb", "50", "--reps", "1", "--dir", "bench-out", "--pauses", "0,0.5"],
         "hooks": ["--images", "40", "--reps", "1", "--workdir", "bench-out/write-quick/hooks"],
         "startup": ["--images", "4", "--reps", "1", "--workdir", "bench-out/write-quick/startup"],
         "margin": ["--images", "12", "--base", "4", "--clips", "3", "--base-clips", "1", "--reps", "1",
                    "--workdir", "bench-out/write-quick/margin"]}


def main(argv: list[str] | None = None) -> int:
    """Run the section(s) named on the command line and write the JSON."""
    def timeline_quick(argv: list[str]) -> None:
        if "--rounds" in argv and argv[:2] == QUICK["timeline"][:2]:
            throughput_main(QUICK["frames"], "frames")  # the clips it reads
        timeline_main(argv)

    sections = dict(SECTIONS, timeline=timeline_quick)
    return run_sections("write", __doc__, sections, all_sections=ALL, quick=QUICK, argv=argv,
                        notes=["Rows run side by side in one process (or a local pool); ratios within one run stand."])


if __name__ == "__main__":
    sys.exit(main())

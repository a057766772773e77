#!/usr/bin/env python
"""The write path side by side with the bare loops it must keep up with, in one run.

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

All rows run in this one process with ``packer.heap.tune_heap`` applied first (as every packer
command applies it): a row run after others otherwise inherits whatever malloc thresholds
they left, which spares it page faults a process of its own pays (the bare LMDB loop ran faster
after the packer rows than before them). Rows are interleaved over ``--reps`` rounds, in a new
(seeded) order each round, and the best round of each is kept, so a burst of load from the other users of a shared machine hits
every row alike; each ratio is also given as the median over the rounds of the two rows'
ratio within a round (rows that ran minutes apart can see the machine at different speeds).
Each row's output of the round before is removed just before the row is timed (``run_rows``
says why). The load average is printed with the tables. Each section takes < 3 min on 2 cores.

    python scripts/bench_write.py --workdir bench-out/write --section write
"""
from __future__ import annotations

import argparse
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
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import cv2  # noqa: E402
import lmdb  # noqa: E402
import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

from packer.fileio import remove_path  # noqa: E402
from packer.integrity import crc32c, masked_crc32c  # noqa: E402
from packer.synth import jpeg_bytes, natural_image  # noqa: E402

FIXTURE = Path(os.environ.get("PACKER_FIXTURES", REPO / "tests" / "fixtures")) / "videos" / "mmaction2_test.mp4"


# -- inputs ------------------------------------------------------------------------------------
def _make_part(args: tuple[str, int, int, int, int]) -> None:
    root, start, stop, classes, seed = args
    rng = np.random.default_rng(seed)
    for i in range(start, stop):
        h, w = 475 + int(rng.integers(-40, 41)), 500 + int(rng.integers(-40, 41))
        d = Path(root) / f"class_{i % classes}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"img_{i:05d}.jpg").write_bytes(jpeg_bytes(natural_image(rng, h, w), 90))


def image_set(workdir: Path, count: int, classes: int = 10) -> Path:
    """``workdir/images``: ``count`` generated JPEGs in ``classes`` folders (made once)."""
    src = workdir / "images"
    spec = {"count": count, "classes": classes, "v": 1}
    marker = workdir / "images.json"
    if not (marker.is_file() and json.loads(marker.read_text()) == spec):
        shutil.rmtree(src, ignore_errors=True)
        jobs = os.cpu_count() or 1
        bounds = np.linspace(0, count, jobs + 1).astype(int)
        with ProcessPoolExecutor(jobs) as ex:
            list(ex.map(_make_part, [(str(src), int(a), int(b), classes, 7 + k)
                                     for k, (a, b) in enumerate(zip(bounds[:-1], bounds[1:]))]))
        marker.write_text(json.dumps(spec))
    return src


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


def bare_records(files: list[str], out: Path) -> None:
    """Read + CRC32C + TFRecord framing + append; one fsync at the end."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "wb") as fh:
        for path in files:
            with open(path, "rb") as f:
                data = f.read()
            length = struct.pack("<Q", len(data))
            fh.write(length + struct.pack("<I", masked_crc32c(length)) + data
                     + struct.pack("<I", masked_crc32c(data)))
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
    from packer.commands.pack_images import pack_images

    report = pack_images(str(src), str(out), format=fmt, overwrite=True, **options)
    assert report.count > 0 and report.failed == 0, report.summary()


def pack_with_plan(src: Path, out: Path, fmt: str, mode: str, workers: int, **options) -> None:
    """``pack`` on a plan ``choose_plan`` no longer picks for it (a previous round's, to compare
    with): the command's plan choice replaced for this one call."""
    import packer.commands.pack_images as command
    from packer.conversion.parallel_write import Plan

    chosen = command.choose_plan
    command.choose_plan = lambda **_: Plan(mode, workers, f"bench_write: {mode}, as before")
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
          unit: str = "samples/s") -> str:
    cores = os.cpu_count() or 1
    lines = [f"### {title}", "", f"| row | {unit} (wall) | main process CPU µs/sample | workers' CPU µs/sample "
             f"| CPU model, {cores} idle cores | main process page faults/sample |", "|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {name} | {n / t:,.0f} | {CPU[name][0] / n * 1e6:,.0f} | {CPU[name][1] / n * 1e6:,.0f} "
              f"| {cpu_model(name, n, cores):,.0f} | {FAULTS[name] / n:.2f} |" for name, t in best.items()]
    lines += ["", "| ratio | wall | CPU model | CPU model, median of the rounds' ratios | target |",
              "|---|---:|---:|---:|---:|"]
    for label, a, b, target in ratios:
        value = best[b] / best[a]
        model = cpu_model(a, n, cores) / cpu_model(b, n, cores)
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
    from packer.commands.decode_frames import decode_frames

    report = decode_frames(str(src), str(out), short_side=256, overwrite=True, **options)
    assert report.failed == 0, report.summary()


def section_frames(work: Path, reps: int, out_root: Path) -> str:
    parts = []
    cores = os.cpu_count() or 1
    for name, size, copies in (("clips_340x256", (340, 256), 12), ("clips_1280x720", (1280, 720), 2)):
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
                           unit="frames/s"))
    return "\n\n".join(parts)


def _count_frames(video: str) -> int:
    cap = cv2.VideoCapture(video)
    n = 0
    while cap.grab():
        n += 1
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", default="bench-out/write")
    ap.add_argument("--images", type=int, default=3000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--section", choices=["write", "full", "frames", "all"], default="write")
    ap.add_argument("--frames-out", default=None, help="where frame rows write (default: under --workdir)")
    args = ap.parse_args()
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    from packer.heap import tune_heap

    tune_heap()  # the same heap for every row, bare loops included (see the module docstring)
    print(f"cores: {os.cpu_count()}, load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    out = []
    if args.section in ("write", "full", "all"):
        src = image_set(work, args.images)
        files = files_of(src)
        mb = warm(files) / 1e6
        print(f"{len(files)} JPEGs, {mb:.0f} MB ({mb * 1e3 / len(files):.0f} kB mean)")
        if args.section in ("write", "all"):
            out.append(section_write(src, work, files, args.reps))
        if args.section in ("full", "all"):
            out.append(section_full(src, work, files, args.reps))
    if args.section in ("frames", "all"):
        out.append(section_frames(work, args.reps, Path(args.frames_out) if args.frames_out else work / "out"))
    print("\n\n".join(out))
    print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    shutil.rmtree(work / "out", ignore_errors=True)


if __name__ == "__main__":
    main()

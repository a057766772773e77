#!/usr/bin/env python
"""Where decode-frames' wall time goes beside the bare loop: a timeline of each run.

Runs ``decode-frames --short-side 256`` (default options) and the bare OpenCV loop on all cores
(one decoder thread a process, as ``scripts/bench_write.py --section frames`` runs it) over
the same clips, alternating, ``--rounds`` times, each into a fresh folder after an
``os.sync()``. Each worker logs when each video starts and ends, so per run it prints:

* ``per video``: mean wall seconds one video takes inside a worker (the per-frame work);
* ``first``: when the first video starts (pool start, the disk space check);
* ``gaps``: a worker's idle time between its videos (handing results over), per worker;
* ``tail``: from the last video's end to the call's return (final commit, manifest, summary);
* for decode-frames also the disk space check and the ``syncfs`` commits;

and, after the first round, how many of the frames decode-frames wrote are byte for byte the
bare loop's.

    python scripts/frames_timeline.py --workdir /tmp/frames-bench --clips clips_340x256

``--workdir`` is the one ``bench_write.py --section frames`` made its clips in.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

import bench_write as bw  # noqa: E402
import packer.commands.decode_frames as df  # noqa: E402
import packer.formats.frames.writer as frames_writer  # noqa: E402

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


_job_call = df.FrameJob.__call__


def _packer_video(self, item):  # runs in the workers (forked: the patch goes with them)
    t = time.perf_counter()
    try:
        return _job_call(self, item)
    finally:
        _log("packer", t)


_bare = bw._bare_frames


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", default="/tmp/frames-bench")
    ap.add_argument("--clips", default="clips_340x256", help="clips_340x256 or clips_1280x720")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    root = Path(args.workdir) / args.clips
    videos = sorted(str(p) for p in root.rglob("*.mp4"))
    if not videos:
        raise SystemExit(f"{root}: no clips (run scripts/bench_write.py --section frames first)")
    df.FrameJob.__call__ = _packer_video
    bw._bare_frames = _bare_videos
    df._estimate = _timed_phase("space check", df._estimate)
    frames_writer._syncfs = _timed_phase("syncfs", frames_writer._syncfs)
    bw.warm(videos)
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
                bw.packer_frames(root, target)
            else:
                bw.bare_frames(videos, target, "opencv-1t", os.cpu_count() or 1)
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


if __name__ == "__main__":
    main()

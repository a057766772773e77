#!/usr/bin/env python
"""Benchmark ``decode-frames`` and video clip loading, side by side in one run.

1. Conversion: frames/s of ``decode_frames`` with 1 and 2 workers against the bare
   decode -> resize -> encode loop of the same library calls in one process (targets:
   >= 0.85x the loop per worker, >= 1.7x from 1 to 2 workers).
2. Loading: 8-segment TSN clips (``clip_len=1, num_clips=8``, training sampling) per second
   on one core, from frame folders (``FrameDataset``), from each packed format
   (``PackedVideoDataset``), and decoded from the video with decord as mmaction2 does it
   (open, ``get_batch`` of the sampled frames) (target: packed >= 10x decord).

Input: copies of ``tests/fixtures/videos/mmaction2_test.mp4`` (H.264, 340x256, 300
frames) when present, else synthetic mp4v videos of the same size.

    python scripts/bench_video.py --videos 12 --clips 300
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import time
from pathlib import Path

import cv2
import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from packer.data.video import FrameDataset, PackedVideoDataset, sample_frames  # noqa: E402
from packer.commands.decode_frames import FrameJob, decode_frames  # noqa: E402
from packer.formats import FORMATS  # noqa: E402
from packer.conversion.video_inputs import video_items  # noqa: E402
from packer.synth import natural_image  # noqa: E402
from packer.codecs.video import Resize, read_video  # noqa: E402

FIXTURE = REPO / "tests" / "fixtures" / "videos" / "mmaction2_test.mp4"


def make_input(src: Path, videos: int) -> str:
    """``src/class_k/v_i.mp4``: fixture copies, or synthetic 340x256 mp4v videos."""
    if src.exists():
        shutil.rmtree(src)
    for i in range(videos):
        d = src / f"class_{i % 3}"
        d.mkdir(parents=True, exist_ok=True)
        if FIXTURE.exists():
            shutil.copy(FIXTURE, d / f"v_{i:03d}.mp4")
            continue
        out = cv2.VideoWriter(str(d / f"v_{i:03d}.mp4"), cv2.VideoWriter_fourcc(*"mp4v"), 30, (340, 256))
        base = natural_image(np.random.default_rng(i), 256, 340)
        for t in range(300):
            out.write(np.roll(base, 3 * t, axis=1)[:, :, ::-1].copy())
        out.release()
    return "fixture mmaction2_test.mp4 (H.264 340x256, 300 frames)" if FIXTURE.exists() else \
        "synthetic mp4v 340x256, 300 frames"


def cpu_seconds() -> float:
    """CPU time of this process and its waited-for children (the decode workers)."""
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def bench_conversion(src: Path, work: Path, short_side: int) -> dict:
    """Wall-clock frames/s, and frames per CPU-second (all processes): on a shared machine the
    second is what stays put under load."""
    items, _ = video_items(src)
    job = FrameJob(resize=Resize(short_side=short_side))
    t, c = time.perf_counter(), cpu_seconds()
    frames = 0
    for it in items:  # the bare loop: the same decode -> resize -> encode calls, no pool, no writer
        frames += len(read_video(it.path, resize=job.resize, process=job.encode).frames)
    res = {"frames": frames, "bare_loop_fps": frames / (time.perf_counter() - t),
           "bare_loop_fps_cpu": frames / (cpu_seconds() - c)}
    for workers in (1, 2):
        out = work / f"frames_w{workers}"
        shutil.rmtree(out, ignore_errors=True)
        t, c = time.perf_counter(), cpu_seconds()
        r = decode_frames(src, out, workers=workers, short_side=short_side)
        res[f"workers{workers}_fps"] = r.count / (time.perf_counter() - t)
        res[f"workers{workers}_fps_cpu"] = r.count / (cpu_seconds() - c)
    res["per_worker_vs_bare"] = res["workers1_fps"] / res["bare_loop_fps"]
    res["per_worker_vs_bare_cpu"] = res["workers1_fps_cpu"] / res["bare_loop_fps_cpu"]
    res["scaling_1_to_2"] = res["workers2_fps"] / res["workers1_fps"]
    return res


def bench_loading(src: Path, work: Path, clips: int) -> dict:
    import torch

    torch.set_num_threads(1)
    frames = work / "frames_full"
    shutil.rmtree(frames, ignore_errors=True)
    decode_frames(src, frames, workers=2)  # full size (340x256): the same pixels decord returns
    packed = {}
    for fmt in sorted(FORMATS):
        out = work / (f"packed_{fmt}.h5" if FORMATS[fmt][0].single_file else f"packed_{fmt}")
        if out.exists():
            shutil.rmtree(out) if out.is_dir() else out.unlink()
        decode_frames(src, out, to=fmt, workers=2)
        packed[fmt] = out
    kw = dict(clip_len=1, num_clips=8, seed=0)
    sources = {"frame folders": FrameDataset(frames, **kw)}
    sources.update({f"packed {fmt}": PackedVideoDataset(p, **kw) for fmt, p in packed.items()})
    videos = [it.path for it in video_items(src)[0]]
    res, cpu = {}, {}
    for name, ds in sources.items():
        ds[0]  # open lazily, warm the page cache like a second epoch
        t, c = time.perf_counter(), cpu_seconds()
        for k in range(clips):
            ds[k % len(ds)]
        res[name] = clips / (time.perf_counter() - t)
        cpu[name] = clips / (cpu_seconds() - c)
    import decord

    rng = np.random.RandomState(0)
    t, c = time.perf_counter(), cpu_seconds()
    for k in range(clips):  # mmaction2: DecordInit + SampleFrames + DecordDecode per sample
        vr = decord.VideoReader(videos[k % len(videos)], num_threads=1)
        inds = sample_frames(len(vr), clip_len=1, num_clips=8, rng=rng)
        vr.get_batch(inds).asnumpy()
    res["decord from video"] = clips / (time.perf_counter() - t)
    cpu["decord from video"] = clips / (cpu_seconds() - c)
    return {"wall": res, "cpu": cpu}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--videos", type=int, default=12, help="input videos (300 frames each)")
    ap.add_argument("--clips", type=int, default=300, help="TSN clips loaded per source")
    ap.add_argument("--short-side", type=int, default=224, help="decode-frames resize")
    ap.add_argument("--workdir", default=str(REPO / "bench-out" / "video"))
    args = ap.parse_args()
    cv2.setNumThreads(1)
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    what = make_input(work / "src", args.videos)
    load = os.getloadavg()[0]
    conv = bench_conversion(work / "src", work, args.short_side)
    loading = bench_loading(work / "src", work, args.clips)
    print(f"input: {args.videos} x {what}; {os.cpu_count()} cores, load average {load:.2f} at start")
    print(f"\ndecode-frames (--short-side {args.short_side}, JPEG q95), {conv['frames']} frames:"
          f"{'':<8}wall clock   per CPU-second (all processes)")
    print(f"  bare decode->resize->encode loop  {conv['bare_loop_fps']:8.0f} frames/s  "
          f"{conv['bare_loop_fps_cpu']:8.0f} frames/CPU-s")
    print(f"  decode-frames --workers 1         {conv['workers1_fps']:8.0f} frames/s  "
          f"{conv['workers1_fps_cpu']:8.0f} frames/CPU-s")
    print(f"  decode-frames --workers 2         {conv['workers2_fps']:8.0f} frames/s  "
          f"{conv['workers2_fps_cpu']:8.0f} frames/CPU-s")
    print(f"  1 worker vs the loop: {conv['per_worker_vs_bare']:.2f}x wall, "
          f"{conv['per_worker_vs_bare_cpu']:.2f}x per CPU-second (target >= 0.85x)")
    print(f"  2 workers vs 1: {conv['scaling_1_to_2']:.2f}x wall (target >= 1.7x; needs 2 idle cores)")
    wall, cpu = loading["wall"], loading["cpu"]
    print(f"\nTSN 8-segment clip loading (train sampling, 340x256 frames), one process, "
          f"{args.clips} clips each:")
    for name in wall:
        print(f"  {name:<22} {wall[name]:7.1f} clips/s ({wall[name] / wall['decord from video']:5.1f}x decord)"
              f"  {cpu[name]:7.1f} clips/CPU-s ({cpu[name] / cpu['decord from video']:5.1f}x decord)")
    print("  target: packed >= 10x decord")
    (work / "bench_video.json").write_text(json.dumps({"input": what, "load_average": load,
                                                       "conversion": conv, "loading": loading}, indent=1))


if __name__ == "__main__":
    main()

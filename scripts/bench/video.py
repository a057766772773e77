"""Videos: ``decode-frames`` and clip loading side by side in one run, and optical flow per core.

Section ``clips``:

1. Conversion: frames/s of ``decode_frames`` with 1 and 2 workers against the bare
   decode -> resize -> encode loop of the same library calls in one process (targets:
   >= 0.85x the loop per worker, >= 1.7x from 1 to 2 workers).
2. Loading: 8-segment TSN clips (``clip_len=1, num_clips=8``, training sampling) per second
   on one core, from frame folders (``FrameDataset``), from each packed format
   (``PackedVideoDataset``), and decoded from the video with decord as mmaction2 does it
   (open, ``get_batch`` of the sampled frames) (target: packed >= 10x decord).

Input: copies of ``tests/fixtures/videos/mmaction2_test.mp4`` (H.264, 340x256, 300
frames; ``--fixture``) when present, else synthetic mp4v videos of the same size.

Section ``flow``: optical flow per core at 340x256 (``--size``) per method (TV-L1, Farneback, DIS), one
process, OpenCV on one thread: the estimate alone, and what ``decode-frames --task flow`` does
per flow frame (estimate + mmaction2 quantization + two grey JPEG encodes), against DIS.
Target: DIS >= 100 flow frames/s per core. Frames: the fixture, else a generated video.

    python -m scripts.bench.video clips --videos 12 --clips 300    # ~3 min on 2 cores
    python -m scripts.bench.video flow --pairs 40 --tvl1-pairs 4
    python -m scripts.bench.video --quick all

Section ``packs``: ``pack-videos`` against ``decode-frames``' JPEG frame pack per ``--gops``
value; with ``--codecs h264,hevc,av1`` instead each codec at the first ``--gops`` value (bytes,
PSNR, clips and packing per CPU-second side by side).

Section ``colour``: CPU per clip of ``PackedVideoDataset`` (TSN 8x1 and dense 32x2 clips, ``--to
files`` and ``--to lmdb`` packs of the fixture) with the conversion to RGB it makes (FFmpeg's
swscale, ``to_rgb``: decord's pixels) against OpenCV's I420 conversion it replaced, each row a
fresh process, rows interleaved over rounds; each conversion's |difference| from decord's
``get_batch`` of the same frames. Target: swscale <= 1.10x OpenCV's CPU per clip.

    python -m scripts.bench.video colour --reps 5
"""
from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import time
from typing import Optional
from pathlib import Path

import cv2
import numpy as np


from packer.data.video import FrameDataset, PackedVideoDataset, sample_frames
from packer.commands.decode_frames import FrameJob, decode_frames
from packer.formats import FORMATS, open_reader
from packer.conversion.video_inputs import video_items
from packer.synth import natural_image
from packer.codecs.flow import FlowEstimator, encode_grey, quantize, tvl1_available
from packer.codecs.video import Resize, read_video
from packer.commands.decode_frames import FrameOptions
from scripts.bench.common import REPO, run_sections, target
from packer.commands.pack_videos import VideoPackOptions
from packer.conversion.options import RunOptions

FIXTURE = REPO / "tests" / "fixtures" / "videos" / "mmaction2_test.mp4"


def make_input(src: Path, videos: int, fixture: Path = FIXTURE) -> str:
    """``src/class_k/v_i.mp4``: copies of ``fixture``, or synthetic 340x256 mp4v videos without it."""
    if src.exists():
        shutil.rmtree(src)
    for i in range(videos):
        d = src / f"class_{i % 3}"
        d.mkdir(parents=True, exist_ok=True)
        if fixture.exists():
            shutil.copy(fixture, d / f"v_{i:03d}.mp4")
            continue
        out = cv2.VideoWriter(str(d / f"v_{i:03d}.mp4"), cv2.VideoWriter_fourcc(*"mp4v"), 30, (340, 256))
        base = natural_image(np.random.default_rng(i), 256, 340)
        for t in range(300):
            out.write(np.roll(base, 3 * t, axis=1)[:, :, ::-1].copy())
        out.release()
    if not fixture.exists():
        return "synthetic mp4v 340x256, 300 frames"
    cap = cv2.VideoCapture(str(fixture))
    w, h, n = (int(cap.get(k)) for k in (cv2.CAP_PROP_FRAME_WIDTH, cv2.CAP_PROP_FRAME_HEIGHT, cv2.CAP_PROP_FRAME_COUNT))
    cap.release()
    return f"fixture {fixture.name} ({w}x{h}, {n} frames)"


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
        r = decode_frames(src, out, frame_options=FrameOptions(short_side=short_side),
                          run_options=RunOptions(workers=workers, timeout=600.0))
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
    decode_frames(src, frames, run_options=RunOptions(workers=2, timeout=600.0))  # full size (340x256): the same pixels decord returns
    packed = {}
    for fmt in sorted(FORMATS):
        out = work / (f"packed_{fmt}.h5" if FORMATS[fmt][0].single_file else f"packed_{fmt}")
        if out.exists():
            shutil.rmtree(out) if out.is_dir() else out.unlink()
        decode_frames(src, out, to=fmt, run_options=RunOptions(workers=2, timeout=600.0))
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


def clips_main(argv: list[str]) -> dict:
    """decode-frames against the bare loop, and TSN clip loading against decord."""
    ap = argparse.ArgumentParser(prog="video.py clips")
    ap.add_argument("--videos", type=int, default=12, help="input videos (300 frames each)")
    ap.add_argument("--fixture", default=FIXTURE.name,
                    help="the video in tests/fixtures/videos they copy (--quick: mmaction2_part_0.mp4, "
                         "the same H.264 340x256 in 32 frames)")
    ap.add_argument("--clips", type=int, default=300, help="TSN clips loaded per source")
    ap.add_argument("--short-side", type=int, default=224, help="decode-frames resize")
    ap.add_argument("--workdir", default=str(REPO / "bench-out" / "video"))
    args = ap.parse_args(argv)
    cv2.setNumThreads(1)
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    fixture = FIXTURE.parent / args.fixture
    if args.fixture != FIXTURE.name and not fixture.is_file():
        ap.error(f"--fixture: no {fixture}")
    what = make_input(work / "src", args.videos, fixture)
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
    targets = [target(f"TSN clips, {name} vs decord from video{per}", rates[name] / rates["decord from video"], 10.0)
               for per, rates in (("", wall), (", per CPU-second", cpu)) for name in wall if name != "decord from video"]
    targets += [target("decode-frames 1 worker vs the bare loop", conv["per_worker_vs_bare"], 0.85),
                target("decode-frames 1 worker vs the bare loop, per CPU-second", conv["per_worker_vs_bare_cpu"], 0.85),
                target("decode-frames 2 workers vs 1", conv["scaling_1_to_2"], 1.7)]
    return {"input": what, "load_average": load, "conversion": conv, "loading": loading, "targets": targets}


# == packs =========================================================================================
PACK_FIXTURES = ("mmaction2_test.mp4", "decord_flipping_a_pancake.mkv", "mmaction2_test.avi")


def make_pack_input(src: Path, videos: int) -> str:
    """``src/class_k/v_i.EXT``: the real fixtures round-robin (H.264 340x256 300 frames, H.264
    426x240 310 frames in Matroska, XviD 320x240 164 frames)."""
    if src.exists():
        shutil.rmtree(src)
    fixtures = REPO / "tests" / "fixtures" / "videos"
    for i in range(videos):
        name = PACK_FIXTURES[i % len(PACK_FIXTURES)]
        d = src / f"class_{i % 3}"
        d.mkdir(parents=True, exist_ok=True)
        shutil.copy(fixtures / name, d / f"v_{i:03d}{Path(name).suffix}")
    return f"{videos} videos, the fixtures {', '.join(PACK_FIXTURES)} round-robin"


def _bare_encode(args: tuple) -> int:
    """The bare loop for one video: PyAV decode -> resize (short side, even) -> encode (libx264,
    or the encoder named last) into an in-memory MP4 with pack-videos' encoder options; frames encoded."""
    import io

    import av

    from packer.commands.pack_videos import even_size

    path, short_side, opts, *encoder = args
    encoder = encoder[0] if encoder else "libx264"
    n = 0
    buf = io.BytesIO()
    with av.open(path) as inp, av.open(buf, "w", format="mp4") as out:
        vs = inp.streams.video[0]
        vs.thread_count = 1
        stream = None
        for frame in inp.decode(vs):
            if stream is None:
                th, tw = even_size(frame.height, frame.width, Resize(short_side=short_side))
                stream = out.add_stream(encoder, rate=vs.average_rate or 30)
                stream.width, stream.height, stream.pix_fmt = tw, th, "yuv420p"
                stream.codec_context.thread_count = 1
                stream.codec_context.options = opts
            img = cv2.resize(frame.to_ndarray(format="bgr24"), (stream.width, stream.height),
                             interpolation=cv2.INTER_AREA)
            for p in stream.encode(av.VideoFrame.from_ndarray(img, format="bgr24")):
                out.mux(p)
            n += 1
        if stream is not None:
            for p in stream.encode(None):
                out.mux(p)
    return n


def _rate(ds, clips: int) -> tuple[float, float]:
    """(clips/s wall, clips per CPU-second) of ``clips`` loads, after one warm-up load."""
    ds[0]
    t, c = time.perf_counter(), cpu_seconds()
    for k in range(clips):
        ds[k % len(ds)]
    return clips / (time.perf_counter() - t), clips / (cpu_seconds() - c)


def packs_main(argv: list[str]) -> dict:
    """pack-videos against decode-frames' JPEG frame pack: bytes, dense and TSN clips/s, pack throughput."""
    import multiprocessing

    import torch

    from packer.commands.pack_videos import pack_videos
    from packer.conversion.diskspace import disk_used
    from packer.codecs.video_pack import EncodeOptions

    ap = argparse.ArgumentParser(prog="video.py packs")
    ap.add_argument("--videos", type=int, default=12, help="input videos")
    ap.add_argument("--clips", type=int, default=120, help="clips loaded per source and sampler")
    ap.add_argument("--gops", default="4,8,16,32", help="keyframe intervals to pack and compare")
    ap.add_argument("--short-side", type=int, default=256)
    ap.add_argument("--codecs", default=None,
                    help="instead of --gops: codecs to pack at the first --gops value and compare (e.g. "
                         "h264,hevc,av1; CODEC:CRF for another crf), with bytes, clips and PSNR side by side")
    ap.add_argument("--workdir", default=str(REPO / "bench-out" / "video-packs"))
    args = ap.parse_args(argv)
    cv2.setNumThreads(1)
    torch.set_num_threads(1)
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    what = make_pack_input(work / "src", args.videos)
    src = work / "src"
    load = os.getloadavg()[0]
    gops = [int(g) for g in args.gops.split(",")]
    workers = os.cpu_count() or 1
    if args.codecs:
        return codecs_run(args, src, what, load, workers)

    frames_out = work / "frames.rec"
    shutil.rmtree(frames_out, ignore_errors=True)
    t = time.perf_counter()
    fr = decode_frames(src, frames_out, to="records", frame_options=FrameOptions(short_side=args.short_side),
                       run_options=RunOptions(workers=workers, timeout=600.0))
    frames_s = time.perf_counter() - t
    res: dict = {"input": what, "load_average": load, "frames": fr.count,
                 "frame_pack": {"bytes": disk_used(frames_out), "seconds": frames_s}, "video_packs": {}}

    opts = EncodeOptions()
    x264 = {"crf": str(opts.crf), "preset": opts.preset, "bf": str(opts.bframes), "sc_threshold": "0",
            "x264-params": "scenecut=0:open-gop=0:b-adapt=0:b-pyramid=none",
            **({"tune": "fastdecode"} if opts.fastdecode else {})}
    paths = [str(it.path) for it in video_items(src)[0]]
    bare = {}
    for gop in gops:
        o = {**x264, "g": str(gop), "keyint_min": str(gop)}
        t, c = time.perf_counter(), cpu_seconds()
        pool = multiprocessing.get_context("spawn").Pool(workers)
        n = sum(pool.map(_bare_encode, [(p, args.short_side, o) for p in paths], chunksize=1))
        pool.close()
        pool.join()  # reaped: their CPU time counts in RUSAGE_CHILDREN
        bare[gop] = (n / (time.perf_counter() - t), n / (cpu_seconds() - c))

    samplers = {"dense": dict(clip_len=32, frame_interval=2, num_clips=1, test_mode=True),
                "tsn": dict(clip_len=1, num_clips=8)}
    frame_rates = {name: _rate(PackedVideoDataset(frames_out, seed=0, **kw), args.clips)
                   for name, kw in samplers.items()}
    res["frame_pack"]["clips"] = frame_rates
    for gop in gops:
        out = work / f"video_g{gop}.rec"
        shutil.rmtree(out, ignore_errors=True)
        t, c = time.perf_counter(), cpu_seconds()
        r = pack_videos(src, out, to="records", pack_options=VideoPackOptions(gop=gop, short_side=args.short_side),
                        run_options=RunOptions(workers=workers, timeout=600.0))
        sec, cpu = time.perf_counter() - t, cpu_seconds() - c
        frames = sum(v["video_frames"] for v in open_reader(out).manifest.videos)
        entry = {"bytes": disk_used(out), "seconds": sec, "frames": frames, "failures": len(r.failures),
                 "pack_fps": frames / sec, "pack_fps_cpu": frames / cpu, "bare_fps": bare[gop][0],
                 "bare_fps_cpu": bare[gop][1], "clips": {}}
        entry["bytes_vs_frames"] = entry["bytes"] / res["frame_pack"]["bytes"]
        entry["pack_vs_bare"] = entry["pack_fps"] / entry["bare_fps"]
        entry["pack_vs_bare_cpu"] = entry["pack_fps_cpu"] / entry["bare_fps_cpu"]
        for name, kw in samplers.items():
            entry["clips"][name] = _rate(PackedVideoDataset(out, seed=0, **kw), args.clips)
        res["video_packs"][gop] = entry

    import decord

    rng = np.random.RandomState(0)
    t, c = time.perf_counter(), cpu_seconds()
    for k in range(args.clips):  # mmaction2: DecordInit + SampleFrames + DecordDecode per sample
        vr = decord.VideoReader(paths[k % len(paths)], num_threads=1)
        vr.get_batch(sample_frames(len(vr), clip_len=1, num_clips=8, rng=rng)).asnumpy()
    res["decord_tsn"] = (args.clips / (time.perf_counter() - t), args.clips / (cpu_seconds() - c))

    fp = res["frame_pack"]
    print(f"input: {what}; {os.cpu_count()} cores, load average {load:.2f} at start; short side "
          f"{args.short_side}; {fr.count} frames")
    print(f"frame pack (decode-frames --to records, JPEG q95): {fp['bytes'] / 1e6:.1f} MB, "
          f"dense {fp['clips']['dense'][0]:.1f} clips/s, TSN {fp['clips']['tsn'][0]:.1f} clips/s")
    print(f"decord from the source videos (TSN, mmaction2 style): {res['decord_tsn'][0]:.1f} clips/s")
    print("\n| gop | MB | vs frames (<= 0.25) | dense clips/s | vs frames (>= 0.8) | TSN clips/s "
          "| vs frames (>= 0.4) | vs decord (>= 2) | pack frames/s | bare loop | vs bare (>= 0.8) "
          "| vs bare per CPU-s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for gop, e in res["video_packs"].items():
        d, tsn = e["clips"]["dense"][0], e["clips"]["tsn"][0]
        print(f"| {gop} | {e['bytes'] / 1e6:.1f} | {e['bytes_vs_frames']:.3f} | {d:.1f} | "
              f"{d / fp['clips']['dense'][0]:.2f} | {tsn:.1f} | {tsn / fp['clips']['tsn'][0]:.2f} | "
              f"{tsn / res['decord_tsn'][0]:.2f} | {e['pack_fps']:.0f} | {e['bare_fps']:.0f} | "
              f"{e['pack_vs_bare']:.2f} | {e['pack_vs_bare_cpu']:.2f} |")
    print("(clips/s: one process, one thread, CPU-second figures in the JSON; pack and bare loop: all "
          "cores, wall clock, then frames per CPU-second of every process)")
    res["targets"] = []
    for gop, e in res["video_packs"].items():  # per CPU-second, as docs/video.md's table gives them
        res["targets"] += [
            target(f"pack-videos --gop {gop} vs the frame pack, bytes", e["bytes_vs_frames"], 0.25, at_most=True),
            target(f"pack-videos --gop {gop} vs the frame pack, dense clips per CPU-second",
                   e["clips"]["dense"][1] / fp["clips"]["dense"][1], 0.8),
            target(f"pack-videos --gop {gop} vs the frame pack, TSN clips per CPU-second",
                   e["clips"]["tsn"][1] / fp["clips"]["tsn"][1], 0.4),
            target(f"pack-videos --gop {gop} vs decord, TSN clips per CPU-second",
                   e["clips"]["tsn"][1] / res["decord_tsn"][1], 2.0),
            target(f"pack-videos --gop {gop} vs the bare PyAV loop, per CPU-second", e["pack_vs_bare_cpu"], 0.8)]
    return res


def _psnr(out: Path, videos: int = 3) -> float:
    """PSNR (dB, RGB, all frames) of the first ``videos`` of a pack-videos output against the source
    frames as the pack job resizes them (OpenCV decode, INTER_AREA to the stored size)."""
    from packer.codecs.video_pack import decode_all

    reader = open_reader(out)
    se, n = 0.0, 0
    for v in reader.manifest.videos[:videos]:
        ours = decode_all(reader.read(v["start"]).data)
        src = read_video(v["source"], backend="opencv").frames
        for a, b in zip(ours, src):
            b = cv2.resize(b, (a.shape[1], a.shape[0]), interpolation=cv2.INTER_AREA)[:, :, ::-1]
            se += float(np.mean((a.astype(np.float64) - b) ** 2))
            n += 1
    return 10 * np.log10(255.0 ** 2 / (se / n))


def codecs_run(args, src: Path, what: str, load: float, workers: int) -> dict:
    """``packs --codecs``: each codec at one GOP, side by side: bytes, dense/TSN clips per CPU-second,
    pack frames per CPU-second against the same codec's bare loop, PSNR against the source."""
    import multiprocessing

    from packer.commands.pack_videos import pack_videos
    from packer.conversion.diskspace import disk_used
    from packer.codecs.video_pack import CODECS, EncodeOptions, encoder_options

    work = src.parent
    gop = int(args.gops.split(",")[0])
    paths = [str(it.path) for it in video_items(src)[0]]
    samplers = {"dense": dict(clip_len=32, frame_interval=2, num_clips=1, test_mode=True),
                "tsn": dict(clip_len=1, num_clips=8)}
    frames_out = work / "frames.rec"
    shutil.rmtree(frames_out, ignore_errors=True)
    decode_frames(src, frames_out, to="records", frame_options=FrameOptions(short_side=args.short_side),
                  run_options=RunOptions(workers=workers, timeout=600.0))
    res: dict = {"input": what, "load_average_start": load, "gop": gop,
                 "frame_pack": {"bytes": disk_used(frames_out),
                                "clips": {k: _rate(PackedVideoDataset(frames_out, seed=0, **kw), args.clips)
                                          for k, kw in samplers.items()}}, "codecs": {}}
    for spec in args.codecs.split(","):
        codec, _, crf = spec.partition(":")
        opts = EncodeOptions(codec=codec, gop=gop, crf=int(crf) if crf else None)
        t, c = time.perf_counter(), cpu_seconds()
        pool = multiprocessing.get_context("spawn").Pool(workers)
        n = sum(pool.map(_bare_encode, [(p, args.short_side, encoder_options(opts), CODECS[codec][0]) for p in paths],
                         chunksize=1))
        pool.close()
        pool.join()
        bare_cpu = n / (cpu_seconds() - c)
        out = work / f"video_{codec}_{opts.crf}.rec"
        shutil.rmtree(out, ignore_errors=True)
        t, c = time.perf_counter(), cpu_seconds()
        r = pack_videos(src, out, to="records",
                        pack_options=VideoPackOptions(gop=gop, codec=codec, crf=opts.crf, short_side=args.short_side),
                        run_options=RunOptions(workers=workers, timeout=600.0))
        sec, cpu = time.perf_counter() - t, cpu_seconds() - c
        frames = sum(v["video_frames"] for v in open_reader(out).manifest.videos)
        res["codecs"][spec] = {"crf": opts.crf, "preset": opts.preset, "bytes": disk_used(out), "frames": frames,
                               "failures": len(r.failures), "pack_fps": frames / sec, "pack_fps_cpu": frames / cpu,
                               "bare_fps_cpu": bare_cpu, "psnr": _psnr(out),
                               "clips": {k: _rate(PackedVideoDataset(out, seed=0, **kw), args.clips)
                                         for k, kw in samplers.items()}}
    res["load_average_end"] = os.getloadavg()[0]
    fp = res["frame_pack"]
    base = res["codecs"][next(iter(res["codecs"]))]
    print(f"input: {what}; {os.cpu_count()} cores, load average {load:.2f} at start, "
          f"{res['load_average_end']:.2f} at the end; short side {args.short_side}; --gop {gop}")
    print(f"frame pack (decode-frames --to records, JPEG q95): {fp['bytes'] / 1e6:.1f} MB, dense "
          f"{fp['clips']['dense'][1]:.1f}, TSN {fp['clips']['tsn'][1]:.1f} clips per CPU-second")
    print("\n| codec (crf, preset) | MB | bytes vs frames | PSNR dB | dense clips/CPU-s | vs first | "
          "TSN clips/CPU-s | vs first | pack frames/CPU-s | vs first | vs its bare loop |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for spec, e in res["codecs"].items():
        d, tsn = e["clips"]["dense"][1], e["clips"]["tsn"][1]
        print(f"| {spec.split(':')[0]} ({e['crf']}, {e['preset']}) | {e['bytes'] / 1e6:.1f} | "
              f"{e['bytes'] / fp['bytes']:.3f} | {e['psnr']:.2f} | {d:.1f} | {d / base['clips']['dense'][1]:.2f}x | "
              f"{tsn:.1f} | {tsn / base['clips']['tsn'][1]:.2f}x | {e['pack_fps_cpu']:.0f} | "
              f"{e['pack_fps_cpu'] / base['pack_fps_cpu']:.2f}x | {e['pack_fps_cpu'] / e['bare_fps_cpu']:.2f}x |")
    print("(clips: one process, one thread; packing and bare loops on all cores; per CPU-second of every "
          "process involved; PSNR over the first 3 videos against the source resized as the pack job does)")
    return res


# == flow ===========================================================================================
def grey_frames(n: int, size: tuple[int, int] = (340, 256)) -> tuple[list[np.ndarray], str]:
    """``n`` consecutive grey frames of ``size`` (width, height) and where they came from."""
    w, h = size
    if FIXTURE.is_file():
        cap = cv2.VideoCapture(str(FIXTURE))
        frames = []
        while len(frames) < n:
            ok, f = cap.read()
            if not ok:
                break
            if f.shape[:2] != (h, w):
                f = cv2.resize(f, (w, h), interpolation=cv2.INTER_AREA)
            frames.append(cv2.cvtColor(f, cv2.COLOR_BGR2GRAY))
        if len(frames) == n:
            return frames, f"{FIXTURE.name} (first {n} frames{'' if size == (340, 256) else f', resized to {w}x{h}'})"
    rng = np.random.default_rng(0)
    base = cv2.cvtColor(natural_image(rng, h, w + 2 * n), cv2.COLOR_RGB2GRAY)
    return [base[:, 2 * i:2 * i + w].copy() for i in range(n)], f"generated {w}x{h} frames panning 2 px/frame"


def measure(method: str, frames: list[np.ndarray], full: bool) -> tuple[float, float]:
    """(flow frames per CPU-second, per wall-second) over consecutive pairs."""
    est = FlowEstimator(method)
    est(frames[0], frames[1])  # warm up: allocations, first-call setup
    c0, w0 = time.process_time(), time.perf_counter()
    for a, b in zip(frames, frames[1:]):
        flow = est(a, b)
        if full:
            encode_grey(quantize(flow[:, :, 0]))
            encode_grey(quantize(flow[:, :, 1]))
    n = len(frames) - 1
    return n / (time.process_time() - c0), n / (time.perf_counter() - w0)


def flow_main(argv: list[str]) -> None:
    """Optical flow per core at 340x256 (TV-L1, Farneback, DIS): the estimate, and with quantize + 2 JPEGs."""
    ap = argparse.ArgumentParser(prog="video.py flow")
    ap.add_argument("--pairs", type=int, default=40, help="flow frames per method (Farneback, DIS)")
    ap.add_argument("--tvl1-pairs", type=int, default=4, help="flow frames for TV-L1 (about 1 s each)")
    ap.add_argument("--size", default="340x256", help="WxH of the frames (--quick: smaller, TV-L1 costs ~3 CPU-s "
                                                      "a 340x256 pair)")
    args = ap.parse_args(argv)
    cv2.setNumThreads(1)
    frames, where = grey_frames(args.pairs + 1, tuple(int(v) for v in args.size.split("x")))
    methods = [m for m in ("dis", "farneback", "tvl1") if m != "tvl1" or tvl1_available()]
    rows = {}
    for m in methods:
        use = frames[: (args.tvl1_pairs if m == "tvl1" else args.pairs) + 1]
        rows[m] = (measure(m, use, False), measure(m, use, True), len(use) - 1)
    print(f"Input: {where}; OpenCV {cv2.__version__}, 1 thread, one process.\n")
    print("| method | flow frames | flow only (frames/CPU-s) | + quantize + 2 JPEG (frames/CPU-s) "
          "| wall (frames/s) | vs DIS |")
    print("|---|---|---|---|---|---|")
    dis = rows["dis"][1][0]
    for m, ((cpu, _), (full, wall), n) in rows.items():
        fmt = (lambda v: f"{v:.2f}" if v < 10 else f"{v:.1f}")  # noqa: E731
        print(f"| {m} | {n} | {fmt(cpu)} | {fmt(full)} | {fmt(wall)} | {full / dis:.4f}x |")
    print(f"\nDIS >= 100 flow frames/s per core (with quantize + encode): "
          f"{'met' if dis >= 100 else 'NOT met'} ({dis:.0f})")
    if "tvl1" not in rows:
        print("TV-L1 skipped: this OpenCV has no contrib optflow module")


# == colour =========================================================================================
COLOUR_SAMPLERS = {"TSN 8x1 train": dict(clip_len=1, num_clips=8),
                   "dense 32x2 test": dict(clip_len=32, frame_interval=2, num_clips=1, test_mode=True)}


def opencv_i420_rgb(frame, dst=None):
    """The conversion ``to_rgb`` replaced (packer 8071554): a yuv420p frame's planes copied into one
    I420 array, then OpenCV's ``COLOR_YUV2RGB_I420`` (its own BT.601 fixed point: not swscale's pixels)."""
    from packer.codecs import video_pack

    if frame.format.name != "yuv420p":
        return frame.to_ndarray(format="rgb24")
    if dst is None or frame.width % 2 or frame.height % 2:
        return cv2.cvtColor(frame.to_ndarray(), cv2.COLOR_YUV2RGB_I420)
    h, w = frame.height, frame.width
    i420 = getattr(video_pack._SCRATCH, "i420", None)
    if i420 is None or i420.shape != (h * 3 // 2, w):
        i420 = video_pack._SCRATCH.i420 = np.empty((h * 3 // 2, w), dtype=np.uint8)
    flat, at = i420.reshape(-1), 0
    for plane, (ph, pw) in zip(frame.planes, ((h, w), (h // 2, w // 2), (h // 2, w // 2))):
        flat[at:at + ph * pw].reshape(ph, pw)[:] = np.frombuffer(plane, np.uint8).reshape(-1, plane.line_size)[:ph, :pw]
        at += ph * pw
    return cv2.cvtColor(i420, cv2.COLOR_YUV2RGB_I420, dst=dst)


def _colour_row(pack: str, sampler: str, conversion: str, seconds: float, check: int) -> dict:
    """CPU per clip of ``PackedVideoDataset`` over ``pack`` in this (fresh) process with
    ``conversion`` (``swscale``: packer's ``to_rgb``; ``opencv``: the one it replaced, swapped in),
    clips loaded for ``seconds`` of CPU after one pass of warm-up; and the first ``check`` clips'
    |difference| from decord's ``get_batch`` of the same indices."""
    import torch

    from packer.codecs import video_pack

    cv2.setNumThreads(1)
    torch.set_num_threads(1)
    if conversion == "opencv":
        video_pack.to_rgb = opencv_i420_rgb
    ds = PackedVideoDataset(pack, seed=0, **COLOUR_SAMPLERS[sampler])
    for i in range(len(ds)):
        ds[i]
    n, c = 0, time.process_time()
    while time.process_time() - c < seconds:
        ds[n % len(ds)]
        n += 1
    cpu = (time.process_time() - c) / n
    diff = _decord_diff(ds, check) if check else None
    return {"cpu_ms": cpu * 1e3, "clips": n, "diff": diff}


def _decord_diff(ds, clips: int) -> Optional[dict]:
    """Mean and max |difference| of ``clips`` clips from decord's ``get_batch`` (None without decord)."""
    import tempfile

    try:
        import decord
    except ImportError:
        return None
    from packer.codecs.video_pack import unpack_stream

    total = worst = count = 0
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(clips):
            i = k % len(ds)
            data = ds.reader.read(ds._videos[i][0]).data
            mp4 = bytes(data) if ds.plain else bytes(unpack_stream(data)[0])
            path = Path(tmp) / f"{i}.mp4"
            path.write_bytes(mp4)
            inds = ds.clip_indices(i)
            ours = ds[i][0].permute(0, 2, 3, 1).numpy().astype(np.int16)
            d = np.abs(ours - decord.VideoReader(str(path)).get_batch(inds.tolist()).asnumpy())
            total, worst, count = total + int(d.sum()), max(worst, int(d.max())), count + d.size
    return {"mean": total / count, "max": worst}


def colour_main(argv: list[str]) -> dict:
    """CPU per clip with swscale's conversion (decord's pixels) against OpenCV's I420 one it replaced."""
    import random
    import statistics

    from packer.commands.pack_videos import pack_videos
    from scripts.bench.common import run_call

    ap = argparse.ArgumentParser(prog="video.py colour")
    ap.add_argument("--videos", type=int, default=6, help="copies of the fixture (H.264 340x256, 300 frames)")
    ap.add_argument("--seconds", type=float, default=3.0, help="CPU-seconds of clip loading per row")
    ap.add_argument("--reps", type=int, default=5, help="rounds, rows in a new seeded order each round")
    ap.add_argument("--formats", default="files,lmdb", help="pack-videos --to values to measure")
    ap.add_argument("--workdir", default=str(REPO / "bench-out" / "video-colour"))
    args = ap.parse_args(argv)
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    what = make_input(work / "src", args.videos)
    packs = {}
    for fmt in args.formats.split(","):
        out = work / f"pack-{fmt}"
        shutil.rmtree(out, ignore_errors=True)
        pack_videos(work / "src", out, to=fmt, run_options=RunOptions(workers=os.cpu_count() or 1, timeout=600.0))
        packs[fmt] = str(out)
    load = os.getloadavg()
    rows = [(fmt, s, conv) for fmt in packs for s in COLOUR_SAMPLERS for conv in ("opencv", "swscale")]
    got: dict[tuple, list[dict]] = {}
    order = random.Random(0)
    for rep in range(args.reps):
        order.shuffle(rows)
        for fmt, s, conv in rows:
            got.setdefault((fmt, s, conv), []).append(run_call(
                "scripts.bench.video", "_colour_row",
                {"pack": packs[fmt], "sampler": s, "conversion": conv, "seconds": args.seconds,
                 "check": 4 if rep == 0 else 0}))
    print(f"input: {args.videos} x {what}, packed by pack-videos (defaults); {os.cpu_count()} cores, load average "
          f"{' '.join(f'{x:.2f}' for x in load)} at start, {' '.join(f'{x:.2f}' for x in os.getloadavg())} at end")
    print(f"\n{args.reps} rounds, each row a fresh process loading clips for {args.seconds:g} CPU-s (one thread)\n")
    print("| pack | sampler | OpenCV I420 CPU ms/clip (least) | swscale CPU ms/clip (least) | swscale / OpenCV "
          "(median of rounds) | vs decord: OpenCV, swscale (mean, max abs diff) |")
    print("|---|---|---:|---:|---:|---|")
    figures, targets = {}, []
    for fmt in packs:
        for s in COLOUR_SAMPLERS:
            old, new = got[(fmt, s, "opencv")], got[(fmt, s, "swscale")]
            ratio = statistics.median(n["cpu_ms"] / o["cpu_ms"] for o, n in zip(old, new))
            diffs = [("n/a" if r[0]["diff"] is None else f"{r[0]['diff']['mean']:.3f}, {r[0]['diff']['max']}")
                     for r in (old, new)]
            print(f"| {fmt} | {s} | {min(r['cpu_ms'] for r in old):.2f} | {min(r['cpu_ms'] for r in new):.2f} | "
                  f"{ratio:.2f}x | {diffs[0]}; {diffs[1]} |")
            figures[f"{fmt} {s}"] = {"opencv": old, "swscale": new, "ratio": ratio}
            targets.append(target(f"colour: swscale / OpenCV CPU per clip, {fmt} {s}", ratio, 1.10, at_most=True))
    return {"input": what, "load_average": load, "rows": figures, "targets": targets}


SECTIONS = {"clips": clips_main, "flow": flow_main, "packs": packs_main, "colour": colour_main}
QUICK = {"clips": ["--videos", "2", "--clips", "10", "--fixture", "mmaction2_part_0.mp4",
                   "--workdir", str(REPO / "bench-out" / "video-quick")],
         "flow": ["--pairs", "4", "--tvl1-pairs", "1", "--size", "128x96"],
         "packs": ["--videos", "3", "--clips", "10", "--gops", "16",
                   "--workdir", str(REPO / "bench-out" / "video-packs-quick")],
         "colour": ["--videos", "2", "--seconds", "0.3", "--reps", "1",
                    "--workdir", str(REPO / "bench-out" / "video-colour-quick")]}


def main(argv: list[str] | None = None) -> int:
    """Run the section(s) named on the command line and write the JSON."""
    return run_sections("video", __doc__, SECTIONS, all_sections=("clips", "flow", "packs", "colour"), quick=QUICK,
                        argv=argv,
                        notes=["One process (or decode-frames' pool) per section; ratios within one run stand."])


if __name__ == "__main__":
    sys.exit(main())

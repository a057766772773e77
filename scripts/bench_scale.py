"""Per-item cost of a conversion with 1 and 2 workers, a 2-part sharded run + merge, and Ray;
then the projection for Kinetics-400 on N machines from the measured per-item cost.

Videos when ``packer decode-frames`` exists (synthetic short videos written with
``cv2.VideoWriter``, plus copies of the real 300-frame fixture ``mmaction2_test.mp4`` to
calibrate the per-frame cost of a Kinetics-like clip); images (``to-lmdb``) otherwise.
Everything runs side by side in one process, so the figures to quote are the ratios.

    python scripts/bench_scale.py                    # 1,000 videos (or 2,000 images)
    python scripts/bench_scale.py --mode images --images 2000 --ray
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

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from packer.commands.merge import merge_parts  # noqa: E402
from packer.commands.pack_images import pack_images  # noqa: E402
from packer.synth import jpeg_bytes, natural_image  # noqa: E402

FIXTURES = Path(os.environ.get("PACKER_FIXTURES", Path(__file__).resolve().parent.parent.parent / "shared" / "fixtures"))
FIXTURE_VIDEO = FIXTURES / "videos" / "mmaction2_test.mp4"
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
    if not FIXTURE_VIDEO.exists():
        return None
    shutil.rmtree(root, ignore_errors=True)
    d = root / "class_0"
    d.mkdir(parents=True)
    for i in range(count):
        os.symlink(FIXTURE_VIDEO, d / f"clip_{i:03d}.mp4")
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
        from packer.commands.decode_frames import decode_frames

        report = decode_frames(src, out, to="lmdb", **kw)
    else:
        report = pack_images(src, out, format="lmdb", **kw)
    wall = time.perf_counter() - t
    CPU[out.name] = cpu_seconds() - c
    return wall, report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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
    args = ap.parse_args()
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


if __name__ == "__main__":
    main()

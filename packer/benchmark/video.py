"""``packer bench`` on a video pack: for these sampling settings, keep the videos or decode to frames?

A ``pack-videos`` output is small and decodes a few H.264 frames per clip; a ``decode-frames``
frame pack of the same videos is several times larger and decodes one JPEG per frame taken. Which
one a training run should read depends on its sampling: a dense clip takes most frames of its
span (the video pack decodes little it does not use), a TSN clip takes one frame per segment (the
video pack decodes from a keyframe to each). ``run_video_bench`` measures both for the user's
settings, on the user's videos, and says which to use.

The frame pack is the one given (``frames=``: a ``decode-frames --to lmdb|hdf5|records`` output of
the same videos), else one made into a temporary folder from the video pack's own streams: each
stored MP4 written out and run through ``decode_frames(to="records")`` at its own size (no
resize), JPEG q95 as ``decode-frames`` writes frames by default, so both packs hold the same
frames at the same size. Each (pack, sampling) pair is timed in a fresh process
(``packer.benchmark.fresh``, as every ``packer bench`` configuration; the loop is
``measure.clip_rate``): ``clips`` clips of
seeded random videos through ``PackedVideoDataset`` with torch and OpenCV on one thread, as one
DataLoader worker reads them, after one warm-up clip.

JSON fields (``packer bench --json`` on a video pack; also ``VIDEO_JSON_FIELDS`` / ``ROW_FIELDS``):

* ``path``, ``videos``, ``frames`` (total frames), ``frame_pack`` (``{path, made, format, frames}``:
  ``made`` is true when the bench made it into a temporary folder; ``frames``: the frames it holds).
* ``bytes``: ``{video, frames, video_per_video, frames_per_video, ratio}`` on disk (ratio =
  video / frames).
* ``clips``: clips timed per row; ``seed``.
* ``rows``: one per sampling (``ROW_FIELDS``).
* ``use``: ``video``, ``frames`` or ``mixed`` (the rows disagree); ``verdict``: one line.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Optional

from packer.errors import UsageError
from packer.conversion.options import InputOptions, RunOptions

__all__ = ["VIDEO_JSON_FIELDS", "ROW_FIELDS", "DEFAULT_SAMPLINGS", "VIDEO_AS_FAST", "VIDEO_SLOWER_OK",
           "VIDEO_SMALL", "is_video_pack", "samplings", "make_frame_pack", "advise",
           "run_video_bench", "format_video_report"]

VIDEO_JSON_FIELDS = {
    "path": "the video pack", "videos": "videos in it", "frames": "frames in it",
    "frame_pack": "{path, made, format, frames}: the frame pack compared (made: built from the video pack)",
    "bytes": "{video, frames, video_per_video, frames_per_video, ratio} on disk",
    "clips": "clips timed per pack and sampling", "seed": "fixes the videos and the draws",
    "rows": "one object per sampling", "use": "video | frames | mixed",
    "verdict": "one line: which to read and why",
}
ROW_FIELDS = {
    "name": "tsn | dense | custom", "sampling": "{clip_len, frame_interval, num_clips, test_mode}",
    "video": "{clips_per_s, cpu_ms_per_clip, process}: the video pack", "frames": "the same, the frame pack",
    "speed": "video clips/s / frame clips/s (wall clock)",
    "cpu": "video CPU ms per clip / frame CPU ms per clip",
    "speed_cpu": "video clips per CPU-second / frame clips per CPU-second (1 / cpu): what the advice uses",
    "use": "video | frames", "reason": "why",
}
# TSN-like (8 segments, one frame each, training draws) and dense (32 frames 2 apart, test mode):
# the two ends of video sampling, as scripts/bench/video.py measures them
DEFAULT_SAMPLINGS = {"tsn": {"clip_len": 1, "frame_interval": 1, "num_clips": 8, "test_mode": False},
                     "dense": {"clip_len": 32, "frame_interval": 2, "num_clips": 1, "test_mode": True}}
# The advice compares clips per CPU-second (a loader's throughput once its workers fill the cores),
# not wall-clock clips/s, which other work on the machine moves (at load 14 the wall ratio said
# video 1.12x the frames for TSN clips that cost 2.4x the CPU).
VIDEO_AS_FAST = 0.8  # video clips per CPU-second >= this x frames: as good for loading, and smaller
VIDEO_SLOWER_OK = 0.4  # >= this x frames and bytes <= VIDEO_SMALL x: the storage saved outweighs it
VIDEO_SMALL = 0.25


def is_video_pack(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a ``pack-videos`` output (its manifest's videos hold encoded streams)."""
    from packer.formats import open_reader

    try:
        manifest = open_reader(path, check_crc=False).manifest
    except Exception:  # noqa: BLE001 - not a packed output at all: the image bench says why
        return False
    return manifest.holds == "videos"


def samplings(*, clip_len: Optional[int] = None, frame_interval: Optional[int] = None,
              num_clips: Optional[int] = None, test_mode: Optional[bool] = None) -> dict[str, dict[str, Any]]:
    """The samplings to time: ``DEFAULT_SAMPLINGS`` when no field is given, else one ``custom``
    sampling (``ClipSampling``'s defaults for the fields not given)."""
    given = {k: v for k, v in (("clip_len", clip_len), ("frame_interval", frame_interval),
                               ("num_clips", num_clips), ("test_mode", test_mode)) if v is not None}
    if not given:
        return {name: dict(s) for name, s in DEFAULT_SAMPLINGS.items()}
    custom = {"clip_len": 1, "frame_interval": 1, "num_clips": 1, "test_mode": False, **given}
    if min(custom["clip_len"], custom["frame_interval"], custom["num_clips"]) < 1:
        raise UsageError("--clip-len, --frame-interval and --num-clips must be >= 1")
    return {"custom": custom}


def make_frame_pack(video_pack: str | os.PathLike, out: str | os.PathLike, *, workers: Optional[int] = None) -> Path:
    """A ``decode-frames --to records`` frame pack of the video pack's own streams, at their size.

    Each stored MP4 is written to ``out``'s scratch folder with its first label; ``decode_frames``
    turns them into JPEG frames (q95, no resize) as it does any video. Returns the frame pack."""
    from packer.codecs.video_pack import unpack_stream
    from packer.commands.decode_frames import decode_frames
    from packer.formats import open_reader

    out = Path(out)
    src = out / "streams"
    src.mkdir(parents=True, exist_ok=True)
    reader = open_reader(video_pack)
    lines = []
    for k, v in enumerate(reader.manifest.videos):
        mp4, _ = unpack_stream(reader.read(int(v["start"])).data)
        name = f"v{k:06d}.mp4"
        (src / name).write_bytes(mp4)
        labels = v.get("labels") or [v.get("label", 0)]
        lines.append(f"{name} {max(int(labels[0]), 0)}\n")
    (src / "videos.txt").write_text("".join(lines), encoding="utf-8")
    frames = out / "frames.rec"
    run = RunOptions(workers=workers if workers is not None else os.cpu_count() or 1, timeout=600.0)
    report = decode_frames(src, frames, to="records", input_options=InputOptions(list_path=src / "videos.txt"),
                           run_options=run)
    if report.failures:
        raise UsageError(f"{video_pack}: {len(report.failures)} stored streams did not decode to frames "
                         f"(e.g. {report.failures[0].get('reason')})")
    shutil.rmtree(src, ignore_errors=True)
    return frames


def advise(speed: float, bytes_ratio: float) -> tuple[str, str]:
    """(``video`` or ``frames``, why) from video clips per CPU-second over frame clips per
    CPU-second (``speed``) and video bytes over frame bytes (``bytes_ratio``)."""
    smaller = f"{1 / max(bytes_ratio, 1e-9):.1f}x smaller"
    rate = f"clips load at {speed:.2f}x the frame pack's rate per CPU-second"
    if speed >= VIDEO_AS_FAST:
        return "video", f"{rate} (>= {VIDEO_AS_FAST}) and the video pack is {smaller}"
    if speed >= VIDEO_SLOWER_OK and bytes_ratio <= VIDEO_SMALL:
        return "video", (f"{rate}, but the video pack is {smaller}: read frames only if loading is your "
                         "bottleneck and the frames fit")
    if bytes_ratio > VIDEO_SMALL:
        return "frames", f"the video pack is only {smaller} and {rate}"
    return "frames", (f"{rate} (< {VIDEO_SLOWER_OK}): decoding video costs too much for this sampling; keep "
                      f"the video pack ({smaller}) as the archive, or a shorter --gop")


def run_video_bench(path: str | os.PathLike, *, frames: str | os.PathLike | None = None, clips: int = 60,
                    seed: int = 0, clip_len: Optional[int] = None, frame_interval: Optional[int] = None,
                    num_clips: Optional[int] = None, test_mode: Optional[bool] = None,
                    workers: Optional[int] = None) -> dict[str, Any]:
    """Compare clip loading from the video pack ``path`` with a frame pack of the same videos
    (``frames``, or one made from ``path`` in a temporary folder with ``workers`` processes) for
    the sampling given (or TSN and dense): the dict described in this module's docstring."""
    from packer.benchmark.fresh import FreshProcesses
    from packer.conversion.diskspace import disk_used
    from packer.formats import open_reader
    from packer.formats.frames import video_streams

    if clips < 1:
        raise UsageError(f"--clips must be >= 1, not {clips}")
    plan = samplings(clip_len=clip_len, frame_interval=frame_interval, num_clips=num_clips, test_mode=test_mode)
    if not is_video_pack(path):
        raise UsageError(f"{path}: not a pack-videos output")
    videos = open_reader(path).manifest.videos
    total = sum(int(v["video_frames"]) for v in videos)
    fresh = FreshProcesses().start()  # imports while the frame pack is made
    scratch = None
    try:
        if frames is None:
            scratch = tempfile.mkdtemp(prefix="packer-bench-frames-")
            frame_pack = make_frame_pack(path, scratch, workers=workers)
        else:
            frame_pack = Path(frames)
            fm = open_reader(frame_pack).manifest
            if fm.kind != "videos" or any("video_frames" in v for v in fm.videos) or not fm.videos:
                raise UsageError(f"--frames {frames}: not a frame pack (decode-frames --to lmdb|hdf5|records)")
            if len(fm.videos) != len(videos):
                raise UsageError(f"--frames {frames}: {len(fm.videos)} videos, the video pack {len(videos)}: "
                                 "not the same videos")
        vb, fb = disk_used(path), disk_used(frame_pack)
        result: dict[str, Any] = {
            "path": str(path), "videos": len(videos), "frames": total,
            "frame_pack": {"path": None if scratch else str(frame_pack), "made": scratch is not None,
                           "format": open_reader(frame_pack).format_name,
                           "frames": sum(video_streams(v)[0] for v in open_reader(frame_pack).manifest.videos)},
            "bytes": {"video": vb, "frames": fb, "video_per_video": vb / len(videos),
                      "frames_per_video": fb / len(videos), "ratio": vb / max(fb, 1)},
            "clips": clips, "seed": seed, "rows": []}
        with fresh:
            for name, s in plan.items():
                row: dict[str, Any] = {"name": name, "sampling": s}
                for which, p in (("video", path), ("frames", frame_pack)):
                    row[which] = fresh.run({"kind": "clips", "path": os.path.abspath(p), "sampling": s,
                                            "clips": clips, "seed": seed})
                row["speed"] = row["video"]["clips_per_s"] / max(row["frames"]["clips_per_s"], 1e-9)
                row["cpu"] = row["video"]["cpu_ms_per_clip"] / max(row["frames"]["cpu_ms_per_clip"], 1e-9)
                row["speed_cpu"] = 1 / max(row["cpu"], 1e-9)
                row["use"], row["reason"] = advise(row["speed_cpu"], result["bytes"]["ratio"])
                result["rows"].append(row)
    finally:
        fresh.close()
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    uses = {r["use"] for r in result["rows"]}
    result["use"] = uses.pop() if len(uses) == 1 else "mixed"
    if result["use"] == "mixed":
        result["verdict"] = "mixed: " + "; ".join(f"{r['name']}: {r['use']}" for r in result["rows"]) + \
                            " (one pack serves one training run: pick the row of the sampling you train with)"
    else:
        result["verdict"] = f"{result['use']}: " + result["rows"][0]["reason"] if len(result["rows"]) == 1 else \
            f"{result['use']} for every sampling measured (" + "; ".join(
                f"{r['name']}: {r['speed_cpu']:.2f}x the frame pack's clips per CPU-second" for r in result["rows"]) + \
            f"; video bytes {result['bytes']['ratio']:.3f}x)"
    return result


def _describe(s: dict[str, Any]) -> str:
    return (f"clip_len={s['clip_len']} frame_interval={s['frame_interval']} num_clips={s['num_clips']} "
            f"{'test' if s['test_mode'] else 'train'}")


def format_video_report(result: dict[str, Any]) -> str:
    """The human-readable report of a ``run_video_bench`` result."""
    r, b = result, result["bytes"]
    fp = r["frame_pack"]
    lines = [f"{r['path']}: video pack, {r['videos']} videos, {r['frames']} frames",
             f"frame pack: {fp['path'] or 'made from the video pack (decode-frames --to records, JPEG q95, same size)'}",
             f"bytes per video: video {b['video_per_video'] / 1e6:.2f} MB, frames {b['frames_per_video'] / 1e6:.2f} MB "
             f"(video {b['ratio']:.3f}x the frames)",
             f"clips: {r['clips']} per row, each in a fresh process on one thread (one loader worker)",
             f"{'sampling':<8} {'video clips/s':>13} {'frames clips/s':>14} {'wall':>6} "
             f"{'video CPU ms':>12} {'frames CPU ms':>13} {'per CPU-s':>9}  use"]
    for row in r["rows"]:
        v, f = row["video"], row["frames"]
        lines.append(f"{row['name']:<8} {v['clips_per_s']:>13.1f} {f['clips_per_s']:>14.1f} {row['speed']:>5.2f}x "
                     f"{v['cpu_ms_per_clip']:>12.1f} {f['cpu_ms_per_clip']:>13.1f} {row['speed_cpu']:>8.2f}x  "
                     f"{row['use']}")
        lines.append(f"  ({_describe(row['sampling'])}) {row['reason']}")
    lines.append(f"verdict: {r['verdict']}")
    return "\n".join(lines)

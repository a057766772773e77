"""``packer decode-frames``: pre-decode a video dataset into frame folders or packed shards.

``FrameJob`` is the per-video work (picklable; runs in an isolated worker with a timeout):
decode with ``packer.codecs.video``, resize, encode each selected frame, and describe the video
for the manifest. ``decode_frames`` is the library call behind the command: it lists the
inputs, checks the arguments and the disk space, then hands everything to ``convert.run``.
"""
from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import cv2

from packer.conversion.runner import Report, WorkResult, check_output_arg, run
from packer.errors import UsageError
from packer.conversion.executors import make_executor
from packer.formats import FORMATS, VIDEO_FORMATS, open_reader
from packer.formats.base import Sample, partial_path
from packer.formats.frames import DEFAULT_TEMPLATE, check_template, rawframes_lines
from packer.manifest import atomic_write_bytes, created_by
from packer.conversion.diskspace import Estimate, check_space, estimate_output, human_bytes, sample_items
from packer.conversion.inputs import VideoItem, partition, video_items
from packer.codecs.video import BACKENDS, FrameSelection, Resize, parse_size, probe_video, read_video, sample_frame

__all__ = ["FrameJob", "DecodeReport", "decode_frames", "output_formats", "disk_used"]

log = logging.getLogger(__name__)

FRAME_EXTS = {"jpg": "jpeg", "png": "png"}


def output_formats() -> list[str]:
    """What ``--to`` accepts: frame folders, then every packed format in the registry."""
    return [*VIDEO_FORMATS, *sorted(FORMATS)]


@dataclass(frozen=True)
class FrameJob:
    """Decode one video into encoded frame samples plus its manifest entry (a ``WorkResult``)."""

    selection: FrameSelection = FrameSelection()
    resize: Optional[Resize] = None
    fmt: str = "jpeg"
    quality: int = 95
    start_index: int = 1
    backend: str = "auto"

    def encode(self, frame) -> bytes:
        """One BGR frame -> JPEG/PNG bytes."""
        if self.fmt == "jpeg":
            ok, buf = cv2.imencode(".jpg", frame, [cv2.IMWRITE_JPEG_QUALITY, self.quality])
        else:
            ok, buf = cv2.imencode(".png", frame, [cv2.IMWRITE_PNG_COMPRESSION, 3])
        if not ok:
            raise ValueError(f"cannot encode a {frame.shape} frame as {self.fmt}")
        return buf.tobytes()

    def probe(self, item: VideoItem) -> tuple[int, float]:
        """(frames this job would keep, bytes of one encoded frame) from the container's
        count and one sample frame: for the disk space estimate, without decoding it all."""
        info = probe_video(item.path)
        frame = sample_frame(item.path)
        if frame is None or not info.container_frames:
            raise ValueError(f"{item.path}: nothing to probe")
        h, w = frame.shape[:2]
        th, tw = self.resize.target(h, w) if self.resize is not None else (h, w)
        if th * tw > h * w:  # encode at the source size and scale: no giant frames here
            size = len(self.encode(frame)) * th * tw / (h * w)
        else:
            size = len(self.encode(self.resize(frame) if self.resize is not None else frame))
        return self.selection.count(info.container_frames, info.fps), float(size)

    def __call__(self, item: VideoItem) -> WorkResult:
        v = read_video(item.path, backend=self.backend, selection=self.selection, resize=self.resize,
                       process=self.encode, key=item.key)
        n = len(v.frames)
        samples = [Sample(f"{item.key}/{self.start_index + j}", data, self.fmt, item.label,
                          v.height, v.width, 3, {"frame_dir": item.frame_dir, "frame": j, "frames": n})
                   for j, data in enumerate(v.frames)]
        info = v.info
        entry = {"key": item.key, "label": item.label, "frame_dir": item.frame_dir,
                 "fps": round(self.selection.output_fps(info.fps), 6), "height": v.height,
                 "width": v.width, "decoded_frames": v.decoded_frames,
                 "container_frames": info.container_frames, "source_fps": round(info.fps, 6),
                 "source_height": info.height, "source_width": info.width,
                 "rotation": info.rotation, "backend": v.backend}
        note = None
        if v.partial:
            note = {"stage": "partial",
                    "reason": f"decoded {v.decoded_frames} of the {info.container_frames} frames "
                              f"the container claims ({v.backend})",
                    "decoded_frames": v.decoded_frames, "container_frames": info.container_frames}
        if v.tried:
            log.debug("%s: %s", item.path, "; ".join(v.tried))
        return WorkResult(samples, entry, note)


@dataclass
class DecodeReport(Report):
    """A conversion Report with the video figures of the end summary."""

    videos: int = 0  # videos packed (partial decodes included)
    partial: int = 0
    disk_bytes: int = 0
    estimate: str = ""

    def summary(self) -> str:
        if self.status == "complete":
            return super().summary()
        el = max(self.elapsed, 1e-9)
        failed = sum(1 for f in self.failures if f.get("stage") != "partial")
        return (f"{self.out}: {self.videos} of {self.items} videos -> {self.count} frames "
                f"({self.partial} partial decodes, {failed} failed); {human_bytes(self.disk_bytes)} "
                f"on disk; {self.elapsed:.1f}s ({self.videos / el:.2f} videos/s, "
                f"{self.count / el:.0f} frames/s)")


def disk_used(path: str | os.PathLike) -> int:
    """Bytes allocated on disk below ``path`` (st_blocks), walking with ``os.scandir``."""
    path = Path(path)
    if path.is_file():
        return path.stat().st_blocks * 512
    total, stack = 0, [str(path)]
    while stack:
        with os.scandir(stack.pop()) as it:
            for e in it:
                if e.is_dir(follow_symlinks=False):
                    stack.append(e.path)
                    total += e.stat(follow_symlinks=False).st_blocks * 512
                else:
                    total += e.stat(follow_symlinks=False).st_blocks * 512
    return total


def _writer_for(to: str):
    if to in VIDEO_FORMATS:
        return VIDEO_FORMATS[to][0]
    if to in FORMATS:
        return FORMATS[to][0]
    raise UsageError(f"--to must be one of {', '.join(output_formats())}, not {to!r}")


def decode_frames(src: str | os.PathLike, out: str | os.PathLike, *, to: str = "frames",
                  list_path: str | os.PathLike | None = None, csv_path: str | os.PathLike | None = None,
                  class_index: str | os.PathLike | None = None, video_exts: str | None = None,
                  short_side: int | None = None, size: str | tuple[int, int] | None = None,
                  keep_aspect: bool = True, fps: float | None = None, stride: int | None = None,
                  max_frames: int | None = None, ext: str = "jpg", quality: int = 95,
                  tmpl: str | None = None, start_index: int = 1,
                  list_out: str | os.PathLike | None = None, strict: bool = False,
                  workers: int | None = None, timeout: float | None = 600.0, backend: str = "auto",
                  max_failures: int = 0, resume: bool = False, overwrite: bool = False,
                  force: bool = False, num_shards: int = 1, shard_index: int = 0,
                  executor: str = "local", commit_every: int = 1000) -> DecodeReport:
    """Decode every video under ``src`` into ``out``: mmaction2 frame folders plus
    ``rawframes.txt`` (``to="frames"``) or frames packed into any registered format.

    Bad videos are skipped and recorded in ``failures.jsonl`` (hangs and crashes included:
    each video runs in a worker process with ``timeout`` seconds); partial decodes are kept
    and recorded with ``stage: "partial"``. Arguments, inputs and the disk space are checked
    before any work starts. See ``convert.run`` for ``resume``/``overwrite``.
    """
    writer_cls = _writer_for(to)
    if ext not in FRAME_EXTS:
        raise UsageError(f"--ext must be jpg or png, not {ext!r}")
    if not 1 <= quality <= 100:
        raise UsageError(f"--quality must be in 1..100, not {quality}")
    if start_index < 0:
        raise UsageError(f"--start-index must be >= 0, not {start_index}")
    if max_failures < 0:
        raise UsageError("--max-failures must be >= 0")
    if backend not in BACKENDS:
        raise UsageError(f"--backend must be one of {', '.join(BACKENDS)}, not {backend!r}")
    tmpl = tmpl or DEFAULT_TEMPLATE.replace(".jpg", f".{ext}")
    if FRAME_EXTS[ext] != check_template(tmpl):
        raise UsageError(f"--tmpl {tmpl!r} does not end in .{ext} (--ext {ext})")
    if list_out is not None and to not in VIDEO_FORMATS:
        raise UsageError("--list-out applies to frame folders (--to frames) only")
    if timeout is not None and timeout <= 0:
        timeout = None
    selection = FrameSelection(fps=fps, stride=stride, max_frames=max_frames)
    resize = Resize(short_side=short_side, size=parse_size(size) if isinstance(size, str) else size,
                    keep_aspect=keep_aspect)
    check_output_arg(out, resume=resume, overwrite=overwrite)
    items, classes = video_items(src, list_path=list_path, csv_path=csv_path, class_index=class_index,
                                 exts=video_exts)
    items = partition(items, num_shards, shard_index)
    if not items:
        raise UsageError(f"{src}: no input videos found")
    job = FrameJob(selection=selection, resize=resize if resize.active else None, fmt=FRAME_EXTS[ext],
                   quality=quality, start_index=start_index, backend=backend)

    out = Path(out)
    options = {"to": to, "src": str(Path(src).resolve()), "list": str(list_path) if list_path else None,
               "csv": str(csv_path) if csv_path else None, "short_side": short_side,
               "size": list(resize.size) if resize.size else None, "keep_aspect": keep_aspect,
               "fps": fps, "stride": stride, "max_frames": max_frames, "ext": ext, "quality": quality,
               "tmpl": tmpl, "start_index": start_index, "backend": backend, "strict": strict,
               "num_shards": num_shards, "shard_index": shard_index}
    frame_folders = to in VIDEO_FORMATS
    writer_options: dict[str, Any] = {"commit_every": commit_every}
    if frame_folders:
        writer_options.update(filename_tmpl=tmpl, start_index=start_index)
    writer = writer_cls(out, classes=classes, kind="videos", created_by=created_by(options),
                        **writer_options)
    with make_executor(executor, workers=workers, timeout=timeout, isolate=True) as ex:
        estimate = ""
        if not (resume and out.exists() and not partial_path(out).exists()):  # not already complete
            todo = _remaining(items, writer.resume_state_path() if resume else None)
            est = _estimate(todo, job, ex, per_file=frame_folders)
            estimate = est.describe()
            log.info("%s: the output needs %s", out, estimate)
            check_space(out, est, force=force)
        report = run(items, job, writer, executor=ex, max_failures=max_failures, resume=resume,
                     overwrite=overwrite, strict=strict, unit="video", desc="decode-frames",
                     sample_unit="frames")
    videos = open_reader(out, check_crc=False).manifest.videos
    if list_out is not None:
        atomic_write_bytes(list_out, rawframes_lines(videos).encode("utf-8"))
    return DecodeReport(**{k: getattr(report, k) for k in Report.__dataclass_fields__},
                        videos=len(videos),
                        partial=sum(1 for f in report.failures if f.get("stage") == "partial"),
                        disk_bytes=disk_used(out), estimate=estimate)


def _estimate(items: list[VideoItem], job: FrameJob, executor, *, per_file: bool) -> Estimate:
    """Probe a sample of the videos in the workers (a hanging file costs its timeout there,
    not the job) and extrapolate."""
    probes = [o.value for o in executor.map(job.probe, sample_items(items)) if o.ok]
    return estimate_output(probes, len(items), per_file=per_file)


def _remaining(items: list[VideoItem], state: Path | None) -> list[VideoItem]:
    """The items a run still has to decode (past a resumed run's checkpoint ``state``)."""
    try:
        done = int(json.loads(state.read_text())["items_done"]) if state is not None else 0
    except (OSError, ValueError, KeyError, TypeError):
        done = 0
    return items[done:]

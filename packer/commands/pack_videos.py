"""``packer pack-videos``: videos re-encoded for training and packed as video, one sample each.

``VideoPackJob`` is the per-video work (picklable; runs in an isolated worker with a timeout, as
``decode-frames``' ``FrameJob``): decode with ``packer.codecs.video`` (the same backends, frame
selection and partial-decode detection), resize to even sides, re-encode to H.264 with a fixed
keyframe interval and non-reference B-frames (``packer.codecs.video_pack``), index it, and decode
it back once: a video whose stored stream does not decode to exactly its indexed frame count is
a recorded failure here, never a wrong clip at training time. ``pack_videos`` is the library call
behind the command: the inputs, runner (resume, failures, claims, manifest, fingerprint) and
executors are ``decode-frames``' own.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import cv2
import numpy as np

from packer.claim import Claim
from packer.codecs.video import BACKENDS, FrameSelection, Resize, probe_video, read_video
from packer.codecs.video_copy import check_random_access, copy_stream
from packer.codecs.video_pack import NONREF, VIDEO_FMT, EncodeOptions, VideoEncoder, count_frames, pack_stream
from packer.conversion.executors import make_executor
from packer.conversion.executors.base import BackgroundClose
from packer.conversion.options import VIDEO_RUN, InputOptions, RunOptions
from packer.conversion.runner import WorkResult, run
from packer.conversion.video_inputs import VideoItem
from packer.commands.decode_frames import (DecodeReport, append_labels, appending, current_report, list_videos,
                                           partial_note, plan_video_run, run_record, source_entry,
                                           video_report)
from packer.conversion.inputs import run_failures
from packer.conversion.diskspace import disk_used, human_bytes
from packer.errors import CorruptSample, UsageError
from packer.formats import FORMATS, VIDEO_FILE_FORMATS, open_reader
from packer.formats.videofiles import MP4_FMT
from packer.formats.sample import Sample
from packer.manifest import created_by

__all__ = ["VideoPackJob", "VideoPackOptions", "VideoPackReport", "pack_videos", "output_formats", "DEFAULT_GOP",
           "even_size"]

# Chosen by scripts/bench/video.py --section packs (docs/video.md): see EncodeOptions' default.
DEFAULT_GOP = EncodeOptions().gop


def output_formats() -> list[str]:
    """What ``--to`` accepts: the packed formats, then ``files`` (plain MP4 files)."""
    return [*sorted(FORMATS), *VIDEO_FILE_FORMATS]


def even_size(height: int, width: int, resize: Optional[Resize]) -> tuple[int, int]:
    """The encoded size: the resize's target (or the source size) rounded down to even sides
    (4:2:0 video needs them), at least 2x2."""
    th, tw = resize.target(height, width) if resize is not None else (height, width)
    return max(2, th - th % 2), max(2, tw - tw % 2)


@dataclass(frozen=True)
class VideoPackJob:
    """Re-encode one video into one packed sample plus its manifest entry (a ``WorkResult``)."""

    selection: FrameSelection = FrameSelection()
    resize: Optional[Resize] = None
    encode: EncodeOptions = EncodeOptions()
    backend: str = "auto"
    prefer: str = "opencv"
    plain: bool = False  # ``--to files``: the sample is the MP4 itself, written as ``{frame_dir}.mp4``
    copy: bool = False  # ``--copy``: the source's stream, untouched (``packer.codecs.video_copy``)

    def __call__(self, item: VideoItem) -> WorkResult:
        if self.copy:
            return self._copy(item)
        try:
            src_fps = probe_video(item.path).fps
        except (ValueError, OSError):
            src_fps = 0.0  # read_video reports what it can; the MP4 then says 30 fps
        fps = self.selection.output_fps(src_fps) if src_fps else 0.0
        # one encoder per decode attempt: a fallback backend decodes the video again, and its
        # frames must not follow the first attempt's into one stream (a video played twice)
        encoders: dict[str, VideoEncoder] = {}
        sizes: dict[str, tuple[int, int]] = {}
        attempt: list[str] = []

        def start(name: str) -> None:
            attempt[:] = [name]
            encoders[name] = VideoEncoder(self.encode, fps)

        def process(frame):
            name = attempt[0]
            if name not in sizes:
                sizes[name] = even_size(frame.shape[0], frame.shape[1], self.resize)
            th, tw = sizes[name]
            h, w = frame.shape[:2]
            if (h, w) != (th, tw):
                interp = cv2.INTER_AREA if th * tw < h * w else cv2.INTER_LINEAR
                frame = cv2.resize(frame, (tw, th), interpolation=interp)
            return frame

        def emit(frame) -> None:  # once per output frame: a source frame --fps repeats is encoded again
            encoders[attempt[0]].add(frame)

        v = read_video(item.path, backend=self.backend, selection=self.selection, process=process,
                       key=item.key, prefer=self.prefer, on_attempt=start, emit=emit)
        encoder, size = encoders[v.backend], [sizes.get(v.backend)]
        if encoder.count != len(v.sources):
            raise CorruptSample(item.key, item.path, f"{encoder.count} frames encoded for the {len(v.sources)} "
                                f"decoded by {v.backend}", stage="encode")
        try:
            mp4, index = encoder.finish()
        except ValueError as e:
            raise CorruptSample(item.key, item.path, f"re-encode failed: {e}", stage="encode") from None
        demoted: list[int] = []
        if self.encode.codec != "h264":  # x265, SVT-AV1: every keyframe checked as a seek point too
            try:
                index, demoted = check_random_access(mp4, index)
            except Exception as e:  # ValueError (count, order), av.error.FFmpegError
                raise CorruptSample(item.key, item.path, f"the re-encoded stream fails its check ({e})",
                                    stage="verify") from None
        blob = pack_stream(mp4, index)
        try:
            decodable = count_frames(blob)
        except Exception as e:  # av.error.FFmpegError and kin: the stored stream does not decode
            raise CorruptSample(item.key, item.path, f"the re-encoded stream does not decode ({e})",
                                stage="verify") from None
        if decodable != index.frames:
            raise CorruptSample(item.key, item.path, f"the re-encoded stream decodes to {decodable} frames, "
                                f"its index holds {index.frames}", stage="verify")
        th, tw = size[0]
        # keyframes that are no seek points: a plain file's reader rebuilds its index from the
        # packets' flags, so it takes them from here
        entry = {"demoted_keyframes": demoted} if demoted else {}
        entry = {**entry, "key": item.key, "label": item.label, "frame_dir": item.frame_dir,
                 "fps": round(index.fps, 6), "height": th, "width": tw, "frames": index.frames,
                 "video_frames": index.frames, "keyframes": len(index.keyframes), "gop": self.encode.gop,
                 "bframes": self.encode.bframes, "codec": self.encode.codec, "crf": self.encode.crf,
                 "preset": self.encode.preset, "video_bytes": len(mp4),
                 **source_entry(v), "source": str(item.path)}
        if getattr(item, "labels", None):
            entry["labels"] = list(item.labels)
        note = partial_note(v)
        if self.plain:
            entry["file"] = f"{item.frame_dir}.mp4"
            sample = Sample(item.key, mp4, MP4_FMT, item.label, th, tw, 3, {"file": entry["file"]})
            return WorkResult([sample], entry, note)
        sample = Sample(item.key, blob, VIDEO_FMT, item.label, th, tw, 3,
                        {"frame_dir": item.frame_dir, "frames": index.frames})
        return WorkResult([sample], entry, note)

    def _copy(self, item: VideoItem) -> WorkResult:
        """The source's video stream kept as it is, indexed and checked for random access."""
        try:
            got = copy_stream(str(item.path))
        except Exception as e:  # ValueError (cannot be indexed safely), av.error.FFmpegError, OSError
            raise CorruptSample(item.key, item.path, f"--copy: {e}", stage="copy") from None
        index = got.index
        upright = (got.width, got.height) if got.rotation in (90, 270) else (got.height, got.width)
        entry = {"key": item.key, "label": item.label, "frame_dir": item.frame_dir, "fps": round(index.fps, 6),
                 "height": upright[0], "width": upright[1], "frames": index.frames, "video_frames": index.frames,
                 "keyframes": len(index.keyframes), "demoted_keyframes": got.demoted,
                 "nonref_frames": int(np.count_nonzero(index.flags & NONREF)), "copy": True,
                 "codec": index.decoder, "video_bytes": len(got.blob), "rotation": got.rotation,
                 "decoded_frames": index.frames, "source": str(item.path)}
        if getattr(item, "labels", None):
            entry["labels"] = list(item.labels)
        sample = Sample(item.key, got.blob, VIDEO_FMT, item.label, upright[0], upright[1], 3,
                        {"frame_dir": item.frame_dir, "frames": index.frames})
        return WorkResult([sample], entry, None)


@dataclass(frozen=True)
class VideoPackOptions:
    """What each video becomes: which frames, at what size, encoded how.

    Args:
        short_side: resize so the short side is this (None: keep the size); sides are then
            rounded down to even numbers.
        fps, stride, max_frames: the frame selection (as ``decode-frames``).
        codec, gop, crf, preset: the re-encode (``EncodeOptions``).
        backend: the source decoder: ``auto`` (OpenCV, falling back to decord), ``decord`` or ``opencv``.
        copy: keep each source's video stream as it is (no decode, resize or re-encode; the
            frame selection and the encode options do not apply); a stream that cannot be indexed
            for frame-exact reads is a recorded failure.
    """

    short_side: Optional[int] = 256
    fps: Optional[float] = None
    stride: Optional[int] = None
    max_frames: Optional[int] = None
    codec: str = "h264"
    gop: int = DEFAULT_GOP
    crf: Optional[int] = None  # the codec's default (``CODEC_DEFAULTS``)
    preset: Optional[str] = None
    backend: str = "auto"
    copy: bool = False

    def __post_init__(self) -> None:
        if self.copy and (self.fps or self.stride or self.max_frames):
            raise UsageError("--copy keeps every frame of the source: --fps, --stride and --max-frames do not apply")
        if self.backend not in BACKENDS:
            raise UsageError(f"--backend must be one of {', '.join(BACKENDS)}, not {self.backend!r}")
        if self.short_side is not None and self.short_side < 2:
            raise UsageError(f"--short-side must be >= 2, not {self.short_side}")
        try:
            _ = (self.selection, self.encode_options)
        except ValueError as e:
            raise UsageError(str(e)) from None

    @property
    def selection(self) -> FrameSelection:
        return FrameSelection(fps=self.fps, stride=self.stride, max_frames=self.max_frames)

    @property
    def encode_options(self) -> EncodeOptions:
        return EncodeOptions(codec=self.codec, gop=self.gop, crf=self.crf, preset=self.preset)

    def job(self) -> VideoPackJob:
        """The per-video work these options describe."""
        resize = Resize(short_side=self.short_side) if self.short_side else None
        return VideoPackJob(selection=self.selection, resize=resize, encode=self.encode_options,
                            backend=self.backend, copy=self.copy)

    def recorded(self) -> dict[str, Any]:
        """The options as the manifest's ``created_by`` records them."""
        if self.copy:
            return {"copy": True, "video_format": VIDEO_FMT}
        return {"short_side": self.short_side, "fps": self.fps, "stride": self.stride,
                "max_frames": self.max_frames, "codec": self.codec, "gop": self.gop,
                "crf": self.encode_options.crf, "preset": self.encode_options.preset, "backend": self.backend, "video_format": VIDEO_FMT}


@dataclass
class VideoPackReport(DecodeReport):
    """A conversion Report with the video figures of the end summary (``count``: videos stored)."""

    def summary(self) -> str:
        if self.status in ("complete", "current", "appended"):
            return super().summary()
        return (f"{self.out}: {self.videos} of {self.items} videos re-encoded ({self.partial} partial decodes, "
                f"{self.failed_videos} failed); {human_bytes(self.disk_bytes)} on disk; {self.elapsed:.1f}s "
                f"({self.videos / max(self.elapsed, 1e-9):.2f} videos/s)")


def pack_videos(src: str | os.PathLike, out: str | os.PathLike, *, to: str = "records",
                pack_options: VideoPackOptions = VideoPackOptions(), input_options: InputOptions = InputOptions(),
                run_options: RunOptions = VIDEO_RUN, claim: Claim | None = None,
                append_to: str | os.PathLike | None = None) -> VideoPackReport:
    """Re-encode every video under ``src`` and pack it, as video, into ``out`` (``to``: a packed
    format: ``records``, ``lmdb`` or ``hdf5``; or ``files``: plain MP4 files in a tree mirroring the
    inputs plus the mmaction2 video list ``videos.txt``, ``packer.formats.videofiles``).

    ``pack_options``: the re-encode; ``input_options``: which inputs; ``run_options``: how the run
    goes (the per-video ``timeout`` defaults to 600 s), all built where the library call is made
    (``packer.api.pack_videos``). Bad videos, and videos whose re-encoded stream
    does not decode to its indexed frame count, are recorded in ``failures.jsonl``; partial
    decodes of the source are kept and recorded with ``stage: "partial"``. ``claim``: the run's
    claim on ``out`` (taken by ``packer.api``), which guards the publish. ``append_to``: a split
    append (``packer.commands.decode_frames.plan_video_run``): this job's share of the videos
    that output lacks.
    """
    pack, inputs, run_opts = pack_options, input_options, run_options
    if to not in FORMATS and to not in VIDEO_FILE_FORMATS:
        raise UsageError(f"--to must be one of {', '.join(output_formats())}, not {to!r}")
    writer_cls = (FORMATS if to in FORMATS else VIDEO_FILE_FORMATS).writer(to)
    if pack.copy and to in VIDEO_FILE_FORMATS:
        raise UsageError("--copy keeps the source streams in a pack (--to records, lmdb or hdf5), not --to files")
    timeout = run_opts.timeout if run_opts.timeout is not None and run_opts.timeout > 0 else None
    append, run_opts = appending(out, run_opts, inputs)
    every: Optional[list] = [] if append_to is not None else None
    items, classes, bad, whole = list_videos(src, inputs, every=every)
    out = Path(out)
    recorded = run_record(to, src, inputs, run_opts, pack.recorded(), commit_every=100, classes=classes,
                          whole=whole)
    writer = writer_cls(out, classes=classes, kind="videos", created_by=created_by(recorded),
                        commit_every=run_opts.commit_every or 100)
    todo, plan = plan_video_run(out, items, every, classes, writer, append=append, append_to=append_to, to=to,
                                holds="videos", run_opts=run_opts, inputs=inputs, claim=claim)
    if plan is not None and plan.empty:
        return current_report(VideoPackReport, out, plan, len(items))
    items = todo
    ex = make_executor(run_opts.executor, workers=run_opts.workers, timeout=timeout, isolate=True)
    closing = BackgroundClose(ex)
    try:
        job = dataclasses.replace(pack.job(), plain=to in VIDEO_FILE_FORMATS)
        report = run(items, job, writer, executor=ex, options=run_opts, claim=claim, unit="video",
                     desc="pack-videos", sample_unit="videos", input_failures=run_failures(bad, inputs.shard_index),
                     all_in=closing.start, append=plan)
        report.labels = getattr(classes, "note", "") if plan is None else append_labels(plan)
        videos = open_reader(out, check_crc=False).manifest.videos
        disk = disk_used(out)
    finally:
        closing.wait()
    return video_report(VideoPackReport, report, videos, disk)


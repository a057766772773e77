"""``packer decode-frames``: pre-decode a video dataset into frame folders or packed shards.

``FrameJob`` is the per-video work (picklable; runs in an isolated worker with a timeout):
decode with ``packer.codecs.video``, resize, encode each selected frame, and describe the video
for the manifest. ``decode_frames`` is the library call behind the command: it lists the
inputs, checks the arguments and the disk space, then hands everything to ``convert.run``.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

import cv2

from packer.claim import Claim
from packer.conversion.append import AppendPlan, plan_append, plan_split
from packer.conversion.runner import Report, WorkResult, check_output_arg, run
from packer.errors import UsageError
from packer.conversion.executors import make_executor
from packer.conversion.executors.base import BackgroundClose
from packer.conversion.options import VIDEO_RUN, InputOptions, RunOptions
from packer.formats import FORMATS, VIDEO_FORMATS, open_reader
from packer.formats.sample import Sample, Stored
from packer.formats.sidecars import partial_path
from packer.integrity import crc32c
from packer.formats.frames import DEFAULT_TEMPLATE, check_template, rawframes_lines
from packer.manifest import Manifest, atomic_write_bytes, created_by
from packer.conversion.diskspace import (Estimate, check_space, disk_used, encoded_bound, estimate_output, fits,
                                        human_bytes, sample_items)
from packer.conversion.inputs import DEFAULT_VIDEO_EXTS, InputFailure, listing, parse_exts, partition, run_failures
from packer.conversion.video_inputs import VideoItem, video_items
from packer.codecs.resize import parse_size
from packer.codecs.video import (BACKENDS, FrameSelection, Resize, VideoFrames, probe_video, read_video,
                                 sample_frame)
from packer.codecs.flow import encode_grey, grey
from packer.commands.flow_frames import TASKS, FlowOptions, FlowProcess, flow_images

__all__ = ["FrameJob", "FrameOptions", "FlowOptions", "TASKS", "DecodeReport", "decode_frames", "output_formats", "disk_used",
           "list_videos", "run_record", "source_entry", "partial_note", "video_report", "appending",
           "plan_video_append", "plan_video_run", "current_report", "append_labels"]

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
    # ``--backend auto`` tries OpenCV first, decord when OpenCV cannot open a file or decodes
    # fewer frames than the container claims. Measured (python -m scripts.bench.write frames,
    # docs/writing.md): per frame OpenCV costs less CPU than decord (which decodes on a thread
    # of its own, ~1.4 cores a process, so a worker per core oversubscribes), the pixels are
    # the same, and a partial decode is caught whichever decodes: ``read_video`` holds a video
    # to the largest frame count any reader reports (OpenCV reads a truncated AVI's header: 30;
    # decord counts the 15 frames left).
    prefer: str = "opencv"
    # Frame folders only: write the frames into the output's working folder here, in the worker
    # (``FramesWriter.temp_folder``), and hand back stored samples without bytes.
    write_into: Optional[str] = None
    filename_tmpl: str = DEFAULT_TEMPLATE
    owner: Optional[int] = None  # the writer's pid: a worker it no longer parents stops writing
    flow: Optional[FlowOptions] = None  # resolved; None: RGB frames only

    def encode(self, frame) -> bytes:
        """One BGR frame -> JPEG/PNG bytes."""
        if self.fmt == "jpeg":
            ok, buf = cv2.imencode(".jpg", frame, [cv2.IMWRITE_JPEG_QUALITY, self.quality])
        else:
            ok, buf = cv2.imencode(".png", frame, [cv2.IMWRITE_PNG_COMPRESSION, 3])
        if not ok:
            raise ValueError(f"cannot encode a {frame.shape} frame as {self.fmt}")
        return buf.tobytes()

    def bound(self, item: VideoItem) -> tuple[int, float]:
        """(files, bytes per file) this job writes at most for ``item``, from its container's
        header alone (frame count, size, fps; nothing decoded): the disk space check's first,
        cheap step. Raises ValueError when the header lacks any of them."""
        info = probe_video(item.path)
        if not info.container_frames or not info.height or not info.width:
            raise ValueError(f"{item.path}: the header gives no frame count or size")
        th, tw = (self.resize.target(info.height, info.width) if self.resize is not None
                  else (info.height, info.width))
        frames = self.selection.count(info.container_frames, info.fps)
        rgb = encoded_bound(th * tw, 3)
        if self.flow is None:
            return frames, float(rgb)
        both = self.flow.task == "both"
        files = 2 * frames + (frames if both else 0)
        return files, float((2 * frames * encoded_bound(th * tw, 1) + (frames * rgb if both else 0))
                            / max(files, 1))

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
        frames = self.selection.count(info.container_frames, info.fps)
        if self.flow is None:
            return frames, float(size)
        # flow images are smooth: a grey frame's size bounds each of x and y from above
        small = self.resize(frame) if self.resize is not None and th * tw <= h * w else frame
        flow_size = len(encode_grey(grey(small), self.flow.fmt, self.quality)) * th * tw / (
            small.shape[0] * small.shape[1])
        files = 2 * frames + (frames if self.flow.task == "both" else 0)
        total = 2 * frames * flow_size + (frames * size if self.flow.task == "both" else 0)
        return files, float(total / max(files, 1))

    def __call__(self, item: VideoItem) -> WorkResult:
        rgb = self.flow is None or self.flow.task == "both"
        process = self.encode if self.flow is None else FlowProcess(self.flow, self.encode if rgb else None,
                                                                    self.quality)
        v = read_video(item.path, backend=self.backend, selection=self.selection, resize=self.resize,
                       process=process, key=item.key, prefer=self.prefer)
        rgb_data = v.frames if self.flow is None else [value[0] for value in v.frames] if rgb else []
        flows = (flow_images(item, v.frames, v.height, v.width, self.flow, self.quality)
                 if self.flow is not None else [])
        total = len(rgb_data) + len(flows)
        samples = [Sample(f"{item.key}/{self.start_index + j}", data, self.fmt, item.label,
                          v.height, v.width, 3, {"frame_dir": item.frame_dir, "frame": j, "frames": total})
                   for j, data in enumerate(rgb_data)]
        for k, data in enumerate(flows):
            direction, number = "xy"[k % 2], self.start_index + k // 2
            samples.append(Sample(f"{item.key}/{direction}/{number}", data, self.flow.fmt, item.label,
                                  v.height, v.width, 1,
                                  {"frame_dir": item.frame_dir, "frame": len(rgb_data) + k, "frames": total,
                                   "file": self.flow.flow_tmpl.format(direction, number)}))
        info = v.info
        entry = {"key": item.key, "label": item.label, "frame_dir": item.frame_dir,
                 "fps": round(self.selection.output_fps(info.fps), 6), "height": v.height,
                 "width": v.width, **source_entry(v)}
        if getattr(item, "labels", None):  # a multi-label list line
            entry["labels"] = list(item.labels)
        if self.flow is not None:
            entry.update(rgb_frames=len(rgb_data), flow_frames=len(flows) // 2)
        note = partial_note(v)
        if v.tried:
            log.debug("%s: %s", item.path, "; ".join(v.tried))
        if self.write_into is not None and samples:
            self._store(item, samples)
        return WorkResult(samples, entry, note)

    def _check_owner(self) -> None:
        """Exit when the writer that started this worker is gone (killed): an orphan must never
        touch the output beside the run that resumes it."""
        if self.owner is not None and os.getppid() != self.owner:
            os._exit(1)

    def _store(self, item: VideoItem, samples: list[Sample]) -> None:
        """Write the frames where ``FramesWriter`` expects them; keep only what it records.
        The writer's commit (``syncfs``) makes them durable like the frames it writes itself."""
        from packer.formats.frames import FramesWriter

        tmp = FramesWriter.temp_folder(Path(self.write_into), item.frame_dir)
        self._check_owner()
        if tmp.exists():  # an earlier try of this video (killed at its timeout)
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        for j, sample in enumerate(samples):
            self._check_owner()
            name = sample.extra.get("file") or self.filename_tmpl.format(self.start_index + j)  # flow: x/y files
            with open(tmp / name, "wb") as f:
                f.write(sample.data)
            sample.prepared = Stored(crc32c(sample.data), len(sample.data))
            sample.data = b""


@dataclass
class DecodeReport(Report):
    """A conversion Report with the video figures of the end summary."""

    videos: int = 0  # videos packed (partial decodes included)
    partial: int = 0
    disk_bytes: int = 0
    estimate: str = ""

    def summary(self) -> str:
        if self.status in ("complete", "current", "appended"):  # (an append: what it added, how many in all)
            return super().summary() + (f"; {self.videos} videos in all" if self.status == "appended" else "")
        el = max(self.elapsed, 1e-9)
        return (f"{self.out}: {self.videos} of {self.items} videos -> {self.count} frames "
                f"({self.partial} partial decodes, {self.failed_videos} failed); {human_bytes(self.disk_bytes)} "
                f"on disk; {self.elapsed:.1f}s ({self.videos / el:.2f} videos/s, "
                f"{self.count / el:.0f} frames/s)")

    @property
    def failed_videos(self) -> int:
        """Videos that failed (partial decodes, which were kept, not counted)."""
        return sum(1 for f in self.failures if f.get("stage") != "partial")


def list_videos(src: str | os.PathLike, inputs: InputOptions, *, every: Optional[list] = None
                ) -> tuple[list[VideoItem], list[str], list[InputFailure], Optional[dict[str, Any]]]:
    """(this shard's video items, class names, unusable list/CSV lines, the whole listing a part
    of a split run was cut from (None for one run: merge compares them)) of ``src``; UsageError
    when no video is left. Says where the labels came from. ``every``: a list that gets every
    item, before the shard's are cut (a split append plans from them all)."""
    bad: list[InputFailure] = []  # list/CSV lines that cannot be items: recorded, not dropped
    items, classes = video_items(src, list_path=inputs.list_path, csv_path=inputs.csv_path,
                                 class_index=inputs.class_index, exts=inputs.exts, failures=bad)
    if getattr(classes, "note", ""):
        log.info("%s: labels: %s", src, classes.note)
    whole = (listing(items, bad, {"list": inputs.list_path, "csv": inputs.csv_path,
                                  "class_index": inputs.class_index}) if inputs.num_shards > 1 else None)
    if every is not None:
        every.extend(items)
    items = partition(items, inputs.num_shards, inputs.shard_index)
    if not items and every is None:  # (a split append's share may be empty: an empty part merges)
        raise UsageError(f"{src}: no input videos found" + (f" ({len(bad)} unusable lines, e.g. {bad[0]})" if bad else ""))
    return items, classes, bad, whole


def run_record(to: str, src: str | os.PathLike, inputs: InputOptions, run_opts: RunOptions,
               options: dict[str, Any], *, commit_every: int, classes: Any = None,
               whole: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """The options a video conversion's manifest records (``created_by``): the inputs, the
    command's own ``options``, the run's; ``commit_every`` is the command's default; the label
    map that numbered ``classes`` (a dataset's, ``--class-index``; sorted and list orders by
    omission) and a split run's ``whole`` listing."""
    recorded = {"to": to, "src": str(Path(src).resolve()),
                "list": str(inputs.list_path) if inputs.list_path else None,
                "csv": str(inputs.csv_path) if inputs.csv_path else None, **options,
                "strict": run_opts.strict, "num_shards": inputs.num_shards, "shard_index": inputs.shard_index,
                "video_exts": list(parse_exts(inputs.exts, DEFAULT_VIDEO_EXTS)),
                "commit_every": run_opts.commit_every or commit_every}
    if getattr(classes, "label_map", None) not in (None, "sorted", "list"):
        recorded["label_map"] = classes.label_map
    if whole is not None:
        recorded["listing"] = whole
    return recorded


def source_entry(v: VideoFrames) -> dict[str, Any]:
    """What a manifest video entry records of the decoded source; ``source_frames`` (the frame
    list: the source frame index of each frame stored) only where it is not ``0, 1, 2, ...``
    (an ``--fps`` or ``--stride`` selection), so that other entries stay as they were."""
    info = v.info
    entry = {"decoded_frames": v.decoded_frames, "container_frames": info.container_frames,
             "source_fps": round(info.fps, 6), "source_height": info.height, "source_width": info.width,
             "rotation": info.rotation, "backend": v.backend}
    if v.sources != list(range(len(v.sources))):
        entry["source_frames"] = list(v.sources)
    return entry


def partial_note(v: VideoFrames) -> Optional[dict[str, Any]]:
    """The ``stage: "partial"`` failure record of a source that decoded short, else None."""
    if not v.partial:
        return None
    info = v.info
    return {"stage": "partial",
            "reason": f"decoded {v.decoded_frames} of the {info.container_frames} frames "
                      f"the container claims ({v.backend})",
            "decoded_frames": v.decoded_frames, "container_frames": info.container_frames}


def appending(out: str | os.PathLike, run_opts: RunOptions, inputs: InputOptions) -> tuple[bool, RunOptions]:
    """(whether this run appends to the output at ``out``, the run options it goes on with): an
    ``--append`` to an output not there yet is a plain run (continuing an interrupted one); any
    other run checks ``--resume``/``--overwrite`` against the output (``check_output_arg``)."""
    if not run_opts.append:
        check_output_arg(out, resume=run_opts.resume, overwrite=run_opts.overwrite)
        return False, run_opts
    if inputs.num_shards > 1:
        raise UsageError("--append packs the new inputs in one run, in input order: not with --num-shards")
    if Path(out).exists():
        return True, run_opts
    return False, dataclasses.replace(run_opts, append=False, prune=False, resume=partial_path(out).exists())


def plan_video_append(out: Path, items: list[VideoItem], classes: Any, writer: Any, *, append: bool, to: str,
                      holds: str, run_opts: RunOptions, inputs: InputOptions,
                      claim: Claim | None) -> AppendPlan | None:
    """The ``--append`` of a video run (``holds``: ``frames`` or ``videos``): the videos not in
    ``out`` yet, labelled as the pack labels them, into ``writer`` (its classes set); refuses
    what an append may not change (``packer.conversion.append``). An empty plan has discarded
    what an append published before its files went. None: not an append (``append`` False)."""
    from packer.commands.pack_images import _discard_partial

    if not append:
        return None

    plan = plan_append(out, items, classes, format=to, options=writer.created_by.get("options") or {},
                       prune=run_opts.prune, listed=inputs.list_path is not None, holds=holds)
    if plan.empty:
        _discard_partial(writer, claim)
        return plan
    _refuse_taken(out, to, plan)
    writer.classes = list(plan.classes)
    return plan


def plan_video_run(out: Path, items: list[VideoItem], every: Optional[list[VideoItem]], classes: Any, writer: Any, *,
                   append: bool, append_to: str | os.PathLike | None, to: str, holds: str, run_opts: RunOptions,
                   inputs: InputOptions, claim: Claim | None) -> tuple[list[VideoItem], AppendPlan | None]:
    """The videos a video run packs and its ``--append`` plan (``plan_video_append``; None: not
    an append): ``items``, the new ones of an append, or a split append's share of the videos
    the output ``append_to`` lacks (planned from ``every`` video; ``writer`` gets the grown
    classes and records the version planned against)."""
    if append_to is not None:
        from packer.commands.pack_images import check_split_append

        check_split_append(append_to, out, None, run_opts)
        items, writer.classes, writer.created_by["options"]["append_to"] = plan_split(
            append_to, every or [], classes, format=to, listed=inputs.list_path is not None, holds=holds,
            options=writer.created_by.get("options") or {}, num_shards=inputs.num_shards,
            shard_index=inputs.shard_index, check=lambda split: _refuse_taken(Path(append_to), to, split))
    plan = plan_video_append(out, items, classes, writer, append=append, to=to, holds=holds, run_opts=run_opts,
                             inputs=inputs, claim=claim)
    return (plan.items if plan is not None else items), plan


def _refuse_taken(out: Path, to: str, plan: AppendPlan) -> None:
    """An output of files (frame folders, video files) stores a video under its own name, which
    an earlier version may hold still (a video ``--prune`` left out, or a changed one it packs
    anew): refused, naming it, as the version reading it must keep it. (Files there that no
    version lists were moved in by an interrupted append: its rerun replaces them.)"""
    suffix = {"frames": "", "files": ".mp4"}.get(to)
    if suffix is None:
        return
    taken = [name for name in (it.frame_dir + suffix for it in plan.items) if (out / name).exists()]
    if taken:  # (rare: only then every version's manifest is read)
        latest = plan.base.manifest.version
        listed = {str(v["frame_dir"]) + suffix for n in range(1, latest + 1) for v in Manifest.load(out, n).videos}
        taken = [name for name in taken if name in listed]
    if taken:
        raise UsageError(f"{out}: {len(taken)} of the videos to add have files there already, kept for an earlier "
                         f"version (e.g. {taken[0]}: a video --prune left out, or one that changed since); an "
                         f"output of {'frame folders' if to == 'frames' else 'video files'} stores a video once under "
                         "its name: pack the videos into a new output")


def current_report(cls: type, out: Path, plan: AppendPlan, items: int) -> Any:
    """The report of an ``--append`` that found nothing to add (``cls``: a ``DecodeReport``)."""
    base = plan.base.manifest
    report = Report(str(out), count=len(plan.base.reader), items=items, status="current", version=base.version,
                    note=plan.note())
    return video_report(cls, report, base.videos, disk_used(out))


def _writer_for(to: str):
    if to in VIDEO_FORMATS:
        return VIDEO_FORMATS[to][0]
    if to in FORMATS:
        return FORMATS[to][0]
    raise UsageError(f"--to must be one of {', '.join(output_formats())}, not {to!r}")


@dataclass(frozen=True)
class FrameOptions:
    """What each video becomes: which frames, at what size, encoded how, named how.

    Args:
        short_side, size, keep_aspect: the resize (``size`` as ``"WxH"`` or ``(W, H)``).
        fps, stride, max_frames: the frame selection.
        ext: ``jpg`` or ``png``; quality: JPEG quality.
        tmpl: frame file names (default ``img_{:05d}.EXT``); start_index: the first frame's number.
        backend: ``auto`` (OpenCV, falling back to decord), ``decord`` or ``opencv``.
    """

    short_side: Optional[int] = None
    size: Optional[Union[str, tuple[int, int]]] = None
    keep_aspect: bool = True
    fps: Optional[float] = None
    stride: Optional[int] = None
    max_frames: Optional[int] = None
    ext: str = "jpg"
    quality: int = 95
    tmpl: Optional[str] = None
    start_index: int = 1
    backend: str = "auto"

    def __post_init__(self) -> None:
        if self.ext not in FRAME_EXTS:
            raise UsageError(f"--ext must be jpg or png, not {self.ext!r}")
        if not 1 <= self.quality <= 100:
            raise UsageError(f"--quality must be in 1..100, not {self.quality}")
        if self.start_index < 0:
            raise UsageError(f"--start-index must be >= 0, not {self.start_index}")
        if self.backend not in BACKENDS:
            raise UsageError(f"--backend must be one of {', '.join(BACKENDS)}, not {self.backend!r}")
        if FRAME_EXTS[self.ext] != check_template(self.template):
            raise UsageError(f"--tmpl {self.template!r} does not end in .{self.ext} (--ext {self.ext})")
        _ = (self.selection, self.resize)  # validate both now, before any work

    @property
    def template(self) -> str:
        return self.tmpl or DEFAULT_TEMPLATE.replace(".jpg", f".{self.ext}")

    @property
    def selection(self) -> FrameSelection:
        return FrameSelection(fps=self.fps, stride=self.stride, max_frames=self.max_frames)

    @property
    def resize(self) -> Resize:
        size = parse_size(self.size, zero_side=True) if isinstance(self.size, str) else self.size
        return Resize(short_side=self.short_side, size=size, keep_aspect=self.keep_aspect)

    def job(self) -> FrameJob:
        """The per-video work these options describe."""
        resize = self.resize
        return FrameJob(selection=self.selection, resize=resize if resize.active else None,
                        fmt=FRAME_EXTS[self.ext], quality=self.quality, start_index=self.start_index,
                        backend=self.backend)

    def recorded(self) -> dict[str, Any]:
        """The options as the manifest's ``created_by`` records them."""
        resize = self.resize
        return {"short_side": self.short_side, "size": list(resize.size) if resize.size else None,
                "keep_aspect": self.keep_aspect, "fps": self.fps, "stride": self.stride,
                "max_frames": self.max_frames, "ext": self.ext, "quality": self.quality,
                "tmpl": self.template, "start_index": self.start_index, "backend": self.backend}


def decode_frames(src: str | os.PathLike, out: str | os.PathLike, *, to: str = "frames",
                  list_out: str | os.PathLike | None = None, frame_options: FrameOptions = FrameOptions(),
                  flow_options: FlowOptions = FlowOptions(), input_options: InputOptions = InputOptions(),
                  run_options: RunOptions = VIDEO_RUN, claim: Claim | None = None,
                  append_to: str | os.PathLike | None = None) -> DecodeReport:
    """Decode every video under ``src`` into ``out``: mmaction2 frame folders plus
    ``rawframes.txt`` (``to="frames"``) or frames packed into any registered format.
    ``append_to``: a split append (``plan_video_run``): this job's share of the videos that
    output lacks.

    ``frame_options``: what each video becomes; ``flow_options`` (``task="flow"|"both"``: optical
    flow too, listed in ``rawframes_flow.txt``); ``input_options``: which inputs; ``run_options``:
    how the run goes (the per-video ``timeout`` defaults to 600 s here), all built where the
    library call is made (``packer.api.decode_frames``). ``list_out`` also writes the rawframes
    list there.

    Bad videos are skipped and recorded in ``failures.jsonl`` (hangs and crashes included:
    each video runs in a worker process with ``timeout`` seconds); partial decodes are kept
    and recorded with ``stage: "partial"``. Arguments, inputs and the disk space are checked
    before any work starts. See ``conversion.runner.run`` for ``resume``/``overwrite``;
    ``claim``: the run's claim on ``out`` (taken by ``packer.api``), which guards the publish.
    """
    frames, inputs, run_opts, flow_opts = frame_options, input_options, run_options, flow_options
    flow = flow_opts.resolved(frames.ext)
    writer_cls = _writer_for(to)
    if list_out is not None and to not in VIDEO_FORMATS:
        raise UsageError("--list-out applies to frame folders (--to frames) only")
    timeout = run_opts.timeout if run_opts.timeout is not None and run_opts.timeout > 0 else None
    append, run_opts = appending(out, run_opts, inputs)
    every: Optional[list] = [] if append_to is not None else None
    items, classes, bad, whole = list_videos(src, inputs, every=every)
    job = dataclasses.replace(frames.job(), flow=flow)
    out = Path(out)
    recorded = run_record(to, src, inputs, run_opts, frames.recorded(), commit_every=1000, classes=classes,
                          whole=whole)
    if flow is not None:
        recorded.update(task=flow.task, flow=flow.flow, bound=flow.bound, flow_tmpl=flow.flow_tmpl)
    frame_folders = to in VIDEO_FORMATS
    writer_options: dict[str, Any] = {"commit_every": run_opts.commit_every or 1000}
    if frame_folders:
        writer_options.update(filename_tmpl=frames.template, start_index=frames.start_index)
        if flow is not None:
            writer_options.update(flow_tmpl=flow.flow_tmpl)
    writer = writer_cls(out, classes=classes, kind="videos", created_by=created_by(recorded),
                        **writer_options)
    todo, plan = plan_video_run(out, items, every, classes, writer, append=append, append_to=append_to, to=to,
                                holds="frames", run_opts=run_opts, inputs=inputs, claim=claim)
    if plan is not None and plan.empty:
        return current_report(DecodeReport, out, plan, len(items))
    items = todo
    if frame_folders and run_opts.executor == "local" and run_opts.workers != 0:
        # the workers write the frame files themselves: no frame's bytes cross to this process
        job = dataclasses.replace(job, write_into=str(writer.workdir), filename_tmpl=frames.template,
                                  owner=os.getpid())
    ex = make_executor(run_opts.executor, workers=run_opts.workers, timeout=timeout, isolate=True)
    closing = BackgroundClose(ex)
    try:
        estimate = ""
        if not (run_opts.resume and out.exists() and not partial_path(out).exists()) or plan is not None:
            # (not already complete)
            todo = _remaining(items, writer.resume_state_path() if run_opts.resume or plan else None)
            est = _estimate(todo, job, ex, per_file=frame_folders, out=out)
            estimate = est.describe()
            log.info("%s: the output needs %s", out, estimate)
            check_space(out, est, force=run_opts.force)
        report = run(items, job, writer, executor=ex, options=run_opts, claim=claim, unit="video", desc="decode-frames",
                     sample_unit="frames", input_failures=run_failures(bad, inputs.shard_index),
                     all_in=closing.start, append=plan)
        report.labels = getattr(classes, "note", "") if plan is None else append_labels(plan)
        videos = open_reader(out, check_crc=False).manifest.videos
        if list_out is not None:
            _write_lists(Path(list_out), videos, flow)
        disk = disk_used(out)
    finally:
        closing.wait()
    return video_report(DecodeReport, report, videos, disk, estimate=estimate)


def append_labels(plan: AppendPlan) -> str:
    """What an append's report says of its labels."""
    old = len(plan.base.manifest.classes)
    return f"{old} classes keep the pack's labels" + (f", {len(plan.new_classes)} new ones labelled from {old}"
                                                       if plan.new_classes else "")


def video_report(cls: type, report: Report, videos: list[dict[str, Any]], disk: int, **extra: Any) -> Any:
    """A video conversion's report (``cls``, a ``DecodeReport``) from the run's ``Report``: the
    videos packed, the partial decodes among the failures, the bytes on disk."""
    return cls(**{k: getattr(report, k) for k in Report.__dataclass_fields__}, videos=len(videos),
               partial=sum(1 for f in report.failures if f.get("stage") == "partial"), disk_bytes=disk, **extra)


def _write_lists(path: Path, videos: list[dict[str, Any]], flow: FlowOptions | None) -> None:
    """``--list-out``: the RGB list at ``path`` and, with flow, the flow list (mmaction2's
    ``*_flow`` lists) at ``path`` with ``_flow`` before the suffix (at ``path`` itself for
    ``--task flow``)."""
    if flow is None or flow.task == "both":
        atomic_write_bytes(path, rawframes_lines(videos).encode("utf-8"))
    if flow is not None:
        target = path if flow.task == "flow" else path.with_name(f"{path.stem}_flow{path.suffix}")
        atomic_write_bytes(target, rawframes_lines(videos, modality="Flow").encode("utf-8"))


def _estimate(items: list[VideoItem], job: FrameJob, executor, *, per_file: bool, out: Path) -> Estimate:
    """The output's size, from a seeded sample of the videos, probed in the workers (a hanging
    file costs its timeout there, not the job), in two steps: an upper bound from the sampled
    containers' headers (``FrameJob.bound``: nothing decoded); only when that does not fit at
    ``out`` an estimate from one encoded frame of each (``FrameJob.probe``, which decodes a few
    dozen frames to reach it), so a run refuses exactly when it did before."""
    sample = sample_items(items)
    bounds = [o.value for o in executor.map(job.bound, sample) if o.ok]  # like probes: the readable ones
    est = dataclasses.replace(estimate_output(bounds, len(items), per_file=per_file), bound=True)
    if est.sampled and fits(out, est):
        return est
    probes = [o.value for o in executor.map(job.probe, sample) if o.ok]
    return estimate_output(probes, len(items), per_file=per_file)


def _remaining(items: list[VideoItem], state: Path | None) -> list[VideoItem]:
    """The items a run still has to decode (past a resumed run's checkpoint ``state``)."""
    try:
        done = int(json.loads(state.read_text())["items_done"]) if state is not None else 0
    except (OSError, ValueError, KeyError, TypeError):
        done = 0
    return items[done:]

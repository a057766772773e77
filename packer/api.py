"""The library API: one function per ``packer`` command, with the command's behaviour.

Each function takes the command's flags as keyword-only arguments (same names, same
defaults) and does what the command does: claims ``out`` for the run, builds a URL ``out``
(``s3://``, ``https://``, ...) in a local staging folder and uploads it, and raises
``TooManyFailures`` (after the output is published) where the command exits 1 because more
inputs failed than ``max_failures`` allows. ``packer.cli`` is a thin layer over these: what
the CLI can do, these can.

    import packer
    report = packer.pack("data/train", "train.lmdb", format="lmdb")
    print(report.summary())
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence, Union

from packer.arguments import checked
from packer.conversion.options import DEFAULT_IMAGE_EXTS, DEFAULT_VIDEO_EXTS
from packer.errors import TooManyFailures, UsageError, VerifyFailed

if TYPE_CHECKING:
    from packer.codecs.resize import ResizeSpec
    from packer.commands.decode_frames import DecodeReport
    from packer.commands.export import ExportReport
    from packer.commands.inspection import VerifyResult
    from packer.commands.merge import MergeReport
    from packer.commands.pack_videos import VideoPackReport
    from packer.commands.resize_tree import MirrorReport
    from packer.conversion.runner import Report

__all__ = ["pack", "decode_frames", "pack_videos", "resize", "merge", "export", "verify", "inspect", "index", "bench",
           "demo"]

PathLike = Union[str, "os.PathLike[str]"]

IMAGE_EXTS = ",".join(DEFAULT_IMAGE_EXTS)
VIDEO_EXTS = ",".join(DEFAULT_VIDEO_EXTS)


def _checked(report: Any, max_failures: int) -> Any:
    """``report``, or ``TooManyFailures`` when more inputs failed than ``max_failures``."""
    if report.failed > max_failures:
        raise TooManyFailures(report, max_failures)
    return report


def _sources(src: PathLike, *, list_path: Optional[PathLike] = None, csv_path: Optional[PathLike] = None,
             class_index: Optional[PathLike] = None) -> dict[str, list[Optional[PathLike]]]:
    """``check_placement``'s inputs of a command reading ``src``: the tree it walks (``src``
    without a list or CSV), or the list's root and files, and a class index given as a path."""
    listed = list_path is not None or csv_path is not None
    index = class_index if class_index is not None and Path(class_index).exists() else None
    return {"walked": [] if listed else [src],
            "read": [list_path, csv_path, index] + ([src] if listed else [])}


def _into(out: PathLike, build: Callable[[str, Any], Any], *, resume: bool, overwrite: bool,
          break_lock: bool, sources: dict[str, list[Optional[PathLike]]],
          extra_outputs: Sequence[Optional[PathLike]] = (), append: bool = False) -> Any:
    """Run ``build(path, claim)`` into ``out`` under the run's one claim (taken here and handed
    down: ``packer.claim``), once ``out`` is known to be apart from
    the run's ``sources`` (``check_placement``); a URL ``out`` is built in a local
    staging folder, its finished record shards uploaded while it runs, the rest when it is
    done, the manifest last (docs/remote.md); the Report's ``upload`` says what went up.
    ``append`` at a URL: the next version is made in a staging mirror of the output, its new
    objects uploaded, the manifest swapped last (``packer.remote.append``)."""
    from packer.claim import claim_output
    from packer.conversion.placement import check_placement
    from packer.remote.url import is_url

    check_placement([out, *extra_outputs], **sources)

    if not is_url(out):
        with claim_output(out, takeover=resume or overwrite, break_lock=break_lock) as claim:
            return build(out, claim)
    from packer.conversion.runner import Report
    from packer.remote.append import as_url, staged_append
    from packer.remote.upload import staged_output, staging_path
    from packer.remote.url import redact

    staged = None if append else staged_output(out, resume=resume, overwrite=overwrite)
    if staged is not None and staged.complete:
        return Report(out=redact(str(out)), status="uploaded")
    # an append mirrors the output at the URL into staging under the claim (packer.remote.append)
    with claim_output(staging_path(str(out)) if staged is None else staged.local, takeover=resume or overwrite,
                      break_lock=break_lock) as claim:
        if staged is None:
            staged = staged_append(out)
        with staged.uploading_shards(), as_url(staged):
            report = build(str(staged.local), claim)
        report.upload = staged.upload()
    return report


@checked
def pack(src: PathLike, out: PathLike, *, format: str = "lmdb", list_path: Optional[PathLike] = None,
         class_index: Optional[PathLike] = None, exts: str = IMAGE_EXTS, check: str = "full", resize: Optional[ResizeSpec] = None, raw: bool = False,
         shuffle: Optional[int] = None, shard_size: Union[int, str] = "256MB",
         samples_per_shard: Optional[int] = None, name: str = "train", commit_every: Optional[int] = None,
         workers: Optional[int] = None, executor: str = "local", max_failures: int = 0,
         resume: bool = False, overwrite: bool = False, num_shards: int = 1, shard_index: int = 0,
         timeout: Optional[float] = None, strict: bool = False, force: bool = False,
         break_lock: bool = False, coco: Optional[PathLike] = None, manifest: Optional[PathLike] = None,
         schema: Optional[dict] = None, drop_empty: bool = False, source_format: Optional[str] = None,
         append: bool = False, prune: bool = False, append_to: Optional[PathLike] = None) -> Report:
    """Pack an image folder (``src/<class>/<image>``) or a list file into ``out``; or, with
    ``coco`` or ``manifest``, samples of many typed fields (docs/fields.md); or a dataset
    source: WebDataset tar shards, a Hugging Face ``save_to_disk`` folder or Parquet files
    (docs/sources.md).

    The library form of ``packer to-lmdb`` / ``to-hdf5`` / ``to-records``. Bad images are
    skipped and recorded in ``failures.jsonl``; a run is resumable and refuses a resume that
    would change what is stored (docs/contracts.md).

    Args:
        src: the ImageFolder root; with ``list_path``, the folder the list's paths are relative to;
            or a dataset source: ``.tar`` shards (a file, a folder of them, a brace pattern such as
            ``shard-{000000..000099}.tar``, a glob, a URL), a ``save_to_disk`` folder, Parquet files.
        out: the output path (``out.lmdb``, ``out.h5``, a records folder) or a URL.
        format: ``lmdb``, ``hdf5`` or ``records``.
        list_path: a list file of ``relative/path label`` lines instead of walking ``src``.
        class_index: number the class folders as the training classes are (the training
            tree or its packed output, a label map, ``classInd.txt`` or a built-in map's name):
            for a validation tree that lacks some classes. None: the folders sorted (byte order).
        exts: comma-separated image extensions to take (case-insensitive).
        check: how much of each image is decoded to accept it: ``full``, ``header`` or ``none``.
        resize: a ``packer.ResizeSpec`` to resize every image while packing (None: stored as is).
        raw: HDF5 only: store decoded HxWx3 uint8 pixels (needs ``resize.size``).
        shuffle: store the samples in a permutation fixed by this seed (keys still name the sources).
        shard_size: records only: bytes per shard (``"256MB"``, ``"1GiB"`` or an int).
        samples_per_shard: records only: records per shard (wins over ``shard_size``).
        name: records only: shard names are ``{name}-{i:05d}.tfrecord``.
        commit_every: samples per durable commit (what a resume after a kill redoes at most;
            None: the format's default, 1000 for lmdb and hdf5; records commit whole shards).
        workers: worker processes (None: what is fastest for the format and check; 0: this process).
        executor: ``local`` or ``ray`` (``ray:ADDRESS`` joins a cluster).
        max_failures: failed inputs tolerated; more raise ``TooManyFailures`` after publishing.
        resume: continue an interrupted run with the same options and inputs.
        overwrite: replace an existing output when done.
        num_shards, shard_index: convert part ``shard_index`` of ``num_shards`` (``merge`` joins them).
        timeout: seconds one image may take in its worker (None or 0: no limit).
        strict: partial decodes count toward ``max_failures``.
        force: start even when the disk space estimate says the output will not fit.
        break_lock: take the claim on ``out`` even from a run that may still be alive.
        coco: a COCO instances or captions JSON over the images under ``src``: one sample per
            image with its boxes, labels, crowd flags, areas and masks (polygons or RLE, as
            given), or with its captions.
        manifest: a sample manifest (``.jsonl``, ``.csv``, ``.parquet``): one sample per row, a
            field per column, image paths relative to ``src``.
        schema: the manifest's ``{column: type}`` (``"int"``, ``"ndarray:float32:*,4"``, ...;
            None: inferred from its first row).
        drop_empty: leave out COCO images without annotations (kept by default, with no boxes).
        source_format: what ``src`` is: ``folder``, ``wds`` (tar shards), ``hf`` (a
            ``save_to_disk`` folder) or ``parquet``; None: detected from the path
            (``packer.conversion.sources.detect_source``).
        append: add the inputs not in ``out`` yet after its samples, as its next version
            (docs/append.md): the samples there stay byte for byte, the options must be the
            pack's, new classes get the labels after the pack's; an interrupted append is
            continued. A missing ``out`` is packed as by a plain run. Image packs of a folder
            or list file, and field packs (``coco``, ``manifest``: a sample is new unless its
            image file and annotations or row values are as packed; new COCO categories get
            the labels after the pack's), and packs of a dataset source grown by files (new tar
            shards or Parquet files: a sample is new unless its container file is as packed);
            at a URL, records outputs only (new objects uploaded, the manifest swapped last).
        prune: with ``append``: the next version leaves out the samples whose inputs are gone or
            changed (otherwise they are reported and kept).
        append_to: a split append (docs/append.md, "Split appends"): ``out`` is part
            ``shard_index`` of ``num_shards`` of the inputs ``append_to`` lacks (planned as
            ``append`` plans them, new classes labelled after its own), to be added to it as its
            next version by ``merge(parts, append_to, append=True)``. Image and field packs of a
            folder, a list file, a COCO file, a manifest or a dataset source, local paths.

    Returns:
        The run's ``Report`` (``summary()``, ``count``, ``failed``, ``failures``; an append's
        ``version`` and ``added``).
    """
    from packer.commands.pack_images import pack_images
    from packer.conversion.options import InputOptions, RunOptions

    # the option objects, built (and so checked) once, here, and handed down as they are
    inputs = InputOptions(list_path=list_path, class_index=class_index, exts=exts, num_shards=num_shards,
                          shard_index=shard_index)
    run = RunOptions(workers=workers, executor=executor, max_failures=max_failures, resume=resume,
                     overwrite=overwrite, strict=strict, timeout=timeout, commit_every=commit_every, force=force,
                     break_lock=break_lock, append=append, prune=prune)
    _appendable(out, append, "", format=format)
    records = {"shard_size": shard_size, "samples_per_shard": samples_per_shard, "name": name}
    if format != "records" and (shard_size != "256MB" or samples_per_shard is not None or name != "train"):
        raise UsageError("shard_size, samples_per_shard and name apply to format='records' only")
    writer_options = records if format == "records" else None

    if coco is not None or manifest is not None:
        if list_path is not None or class_index is not None or raw or shuffle is not None:
            raise UsageError("list_path, class_index, raw and shuffle do not apply to coco= or manifest=")
        if source_format not in (None, "folder"):
            raise UsageError("source_format does not apply to coco= or manifest= (their images are files under src)")
        from packer.commands.pack_fields import pack_fields

        def build_fields(path: str, claim: Any) -> Any:
            return pack_fields(src, path, format=format, coco=coco, manifest=manifest, schema=schema,
                               drop_empty=drop_empty, check=check, resize=resize, writer_options=writer_options,
                               input_options=inputs, run_options=run, claim=claim, append_to=append_to)

        # the annotation file or manifest names its images: the root is read, not walked
        sources = {"walked": [], "read": [src, coco, manifest, append_to]}
        return _checked(_into(out, build_fields, resume=resume or append, overwrite=overwrite, break_lock=break_lock,
                              sources=sources, append=append), max_failures)
    if schema is not None or drop_empty:
        raise UsageError("schema and drop_empty apply to coco= or manifest= only")
    from packer.conversion.sources import detect_source, source_paths

    if list_path is not None and source_format not in (None, "folder"):
        raise UsageError("list_path names files under a folder; source_format must be 'folder' or None with it")
    kind = "folder" if list_path is not None else detect_source(src, source_format)
    if kind != "folder":
        # an append tells a source's samples by their container file's size and mtime (their identity)
        _appendable(out, append, "", format=format)
        from packer.commands.pack_sources import pack_source

        def build_source(path: str, claim: Any) -> Any:
            return pack_source(src, path, kind=kind, format=format, check=check, resize=resize, raw=raw,
                               shuffle=shuffle, writer_options=writer_options, input_options=inputs, run_options=run,
                               claim=claim, append_to=append_to)

        sources = source_paths(src, kind)
        sources["read"] += _sources(src, class_index=class_index)["read"] + [append_to]
        return _checked(_into(out, build_source, resume=resume or append, overwrite=overwrite, break_lock=break_lock,
                              sources=sources, append=append), max_failures)

    def build(path: str, claim: Any) -> Any:
        return pack_images(src, path, format=format, check=check, resize=resize, raw=raw, shuffle=shuffle,
                           writer_options=writer_options, input_options=inputs, run_options=run, claim=claim,
                           append_to=append_to)

    sources = _sources(src, list_path=list_path, class_index=class_index)
    sources["read"].append(append_to)  # (a split append reads the output it plans against)
    return _checked(_into(out, build, resume=resume or append, overwrite=overwrite, break_lock=break_lock,
                          sources=sources, append=append), max_failures)


def _appendable(out: PathLike, append: bool, not_for: str, format: Optional[str] = None) -> None:
    """Refuse ``append`` where it is not (yet) supported: ``not_for`` names the command's outputs;
    at a URL, a ``format`` other than records (``packer.remote.append``)."""
    from packer.remote.url import is_url

    if append and not_for:
        raise UsageError(f"--append is not supported for {not_for} yet (docs/append.md); pack the "
                         "inputs again, or pack the new ones apart")
    if append and is_url(out) and format != "records":
        from packer.remote.append import refused

        raise refused(out, str(format))
    if append and not is_url(out):
        from packer.commands.export import EXPORT_NAME

        if (Path(out) / EXPORT_NAME).is_file():
            raise UsageError(f"{out}: is a `packer export` output (tar shards or Parquet files), not a pack: "
                             "--append adds to packs; append to the pack it was exported from, then export "
                             "that again")


@checked
def decode_frames(src: PathLike, out: PathLike, *, to: str = "frames", list_path: Optional[PathLike] = None,
                  csv_path: Optional[PathLike] = None, class_index: Optional[PathLike] = None,
                  exts: str = VIDEO_EXTS, short_side: Optional[int] = None,
                  size: Union[str, tuple[int, int], None] = None, keep_aspect: bool = True,
                  fps: Optional[float] = None, stride: Optional[int] = None, max_frames: Optional[int] = None,
                  ext: str = "jpg", quality: int = 95, tmpl: Optional[str] = None, start_index: int = 1,
                  backend: str = "auto", task: str = "rgb", flow: str = "tvl1", bound: float = 20.0,
                  flow_tmpl: Optional[str] = None, list_out: Optional[PathLike] = None,
                  commit_every: int = 1000, workers: Optional[int] = None, executor: str = "local",
                  max_failures: int = 0, resume: bool = False, overwrite: bool = False, num_shards: int = 1,
                  shard_index: int = 0, timeout: float = 600.0, strict: bool = False, force: bool = False,
                  break_lock: bool = False, append: bool = False, prune: bool = False,
                  append_to: Optional[PathLike] = None) -> DecodeReport:
    """Pre-decode every video under ``src`` into ``out``: mmaction2 frame folders plus
    ``rawframes.txt`` (``to="frames"``), or frames packed into ``lmdb``, ``hdf5`` or ``records``.

    The library form of ``packer decode-frames``. Each video runs in a worker process with
    ``timeout`` seconds; bad videos are recorded in ``failures.jsonl``, partial decodes are kept
    and recorded with ``stage: "partial"``.

    Args:
        src: the videos (class folders, or the folder ``list_path``/``csv_path`` are relative to).
        out: the output folder or packed output, or a URL.
        to: ``frames`` or a packed format (``lmdb``, ``hdf5``, ``records``).
        list_path: an mmaction2 video list (``path label`` lines) relative to ``src``.
        csv_path: a Kinetics CSV (``label,youtube_id,time_start,time_end,split``).
        class_index: class names by label (UCF-101 ``classInd.txt``, a label map, the training CSV,
            the training tree or its packed output, or a built-in map's name: ``ucf101``,
            ``hmdb51``, ``kinetics400``/``600``/``700``, ``sthv2``). None: a class-folder tree of a dataset packer knows takes its label map
            (a part of its classes is refused), any other is numbered in sorted order.
        exts: comma-separated video extensions to take.
        short_side, size, keep_aspect: the resize (``size`` as ``"WxH"``; 0 on a side: from the aspect).
        fps, stride, max_frames: which frames (resample to ``fps``, every ``stride``-th, at most ``max_frames``).
        ext, quality: frame image format (``jpg`` or ``png``) and JPEG quality.
        tmpl, start_index: frame file names (default ``img_{:05d}.EXT``) and the first number.
        backend: ``auto`` (OpenCV, falling back to decord), ``decord`` or ``opencv``.
        task, flow, bound, flow_tmpl: ``rgb``, ``flow`` or ``both``; the flow method
            (``tvl1``, ``farneback``, ``dis``), its quantization bound and file names.
        list_out: also write the rawframes list here (frame folders only).
        commit_every, workers, executor, max_failures, resume, overwrite, num_shards, shard_index,
            strict, force, break_lock: as for ``pack``.
        timeout: seconds one video may take before its worker is killed (0: no limit).
        append, prune: add the videos not in ``out`` yet after its own, as its next version, and
            leave out of it the videos gone or changed (``prune``), as for ``pack``
            (docs/append.md): the options that decide the frames must be the pack's.
        append_to: a split append, as for ``pack``: ``out`` is part ``shard_index`` of
            ``num_shards`` of the videos ``append_to`` lacks, added to it by
            ``merge(parts, append_to, append=True)``; local paths.

    Returns:
        The run's ``DecodeReport`` (a Report with ``videos``, ``partial``, ``disk_bytes``).
    """
    from packer.commands.decode_frames import FlowOptions, FrameOptions, decode_frames as decode
    from packer.conversion.options import InputOptions, RunOptions

    _appendable(out, append, "")

    # the option objects, built (and so checked) once, here, and handed down as they are
    frames = FrameOptions(short_side=short_side, size=size, keep_aspect=keep_aspect, fps=fps, stride=stride,
                          max_frames=max_frames, ext=ext, quality=quality, tmpl=tmpl, start_index=start_index,
                          backend=backend)
    flows = FlowOptions(task=task, flow=flow, bound=bound, flow_tmpl=flow_tmpl)
    inputs = InputOptions(list_path=list_path, csv_path=csv_path, class_index=class_index, exts=exts,
                          num_shards=num_shards, shard_index=shard_index)
    run = RunOptions(workers=workers, executor=executor, max_failures=max_failures, resume=resume,
                     overwrite=overwrite, strict=strict, timeout=timeout, commit_every=commit_every, force=force,
                     break_lock=break_lock, append=append, prune=prune)

    def build(path: str, claim: Any) -> Any:
        return decode(src, path, to=to, list_out=list_out, frame_options=frames, flow_options=flows,
                      input_options=inputs, run_options=run, claim=claim, append_to=append_to)

    sources = _sources(src, list_path=list_path, csv_path=csv_path, class_index=class_index)
    sources["read"].append(append_to)  # (a split append reads the output it plans against)
    return _checked(_into(out, build, resume=resume or append, overwrite=overwrite, break_lock=break_lock, sources=sources,
                          extra_outputs=[list_out]), max_failures)


@checked
def pack_videos(src: PathLike, out: PathLike, *, to: str = "records", list_path: Optional[PathLike] = None,
                csv_path: Optional[PathLike] = None, class_index: Optional[PathLike] = None,
                exts: str = VIDEO_EXTS, short_side: Optional[int] = 256, fps: Optional[float] = None,
                stride: Optional[int] = None, max_frames: Optional[int] = None, codec: str = "h264",
                gop: int = 8, crf: Optional[int] = None, preset: Optional[str] = None, backend: str = "auto",
                copy: bool = False, commit_every: int = 100, workers: Optional[int] = None, executor: str = "local",
                max_failures: int = 0, resume: bool = False, overwrite: bool = False, num_shards: int = 1,
                shard_index: int = 0, timeout: float = 600.0, strict: bool = False,
                break_lock: bool = False, append: bool = False, prune: bool = False,
                append_to: Optional[PathLike] = None) -> VideoPackReport:
    """Re-encode every video under ``src`` for training and pack it, as video, into ``out``.

    The library form of ``packer pack-videos``. Each video becomes one sample: H.264 (or HEVC, AV1) in MP4
    with a keyframe every ``gop`` frames and non-reference B-frames, plus a frame index; the manifest's
    ``videos`` entries describe it (frames, fps, size, rotation, source). ``PackedVideoDataset``
    reads the output with the same sampling options as a frame pack, decoding only the
    keyframe intervals that hold a clip's frames. A video whose re-encoded stream does not
    decode to its indexed frame count is recorded in ``failures.jsonl``.

    Args:
        src, list_path, csv_path, class_index, exts: the inputs, as for ``decode_frames``.
        out: the packed output, or a URL.
        to: a packed format: ``records``, ``lmdb`` or ``hdf5``; or ``files``: the re-encoded
            videos as plain MP4 files in a tree mirroring the inputs, plus the mmaction2 video list
            ``videos.txt`` (its ``VideoDataset`` reads them unchanged; ``PackedVideoDataset`` too).
        short_side: resize so the short side is N (None: keep the size); sides are rounded
            down to even numbers.
        fps, stride, max_frames: which frames, as for ``decode_frames``.
        codec, gop, crf, preset: the re-encode: ``h264`` (libx264), ``hevc`` (libx265) or ``av1``
            (SVT-AV1); keyframe interval; quality (None: 20, 21 or 30 by codec: the same PSNR) and speed preset
            (None: ``veryfast``, or ``10`` for SVT-AV1).
        backend: the source decoder, as for ``decode_frames``.
        copy: keep each source's video stream as it is (no decode, resize or re-encode; ``fps``,
            ``stride``, ``max_frames`` and the encode options do not apply), with a frame index
            built from its packets and checked by decoding every keyframe interval afresh
            against a sequential decode; a stream that cannot be indexed safely is a recorded
            failure naming why.
        commit_every, workers, executor, max_failures, resume, overwrite, num_shards, shard_index,
            strict, break_lock: as for ``pack``.
        timeout: seconds one video may take before its worker is killed (0: no limit).
        append, prune: add the videos not in ``out`` yet, as for ``decode_frames`` (docs/append.md).
        append_to: a split append, as for ``decode_frames``.

    Returns:
        The run's ``VideoPackReport`` (a Report with ``videos``, ``partial``, ``disk_bytes``).
    """
    from packer.commands.pack_videos import VideoPackOptions, pack_videos as pack_v
    from packer.conversion.options import InputOptions, RunOptions

    _appendable(out, append, "")

    # the option objects, built (and so checked) once, here, and handed down as they are
    pack = VideoPackOptions(short_side=short_side, fps=fps, stride=stride, max_frames=max_frames, codec=codec,
                            gop=gop, crf=crf, preset=preset, backend=backend, copy=copy)
    inputs = InputOptions(list_path=list_path, csv_path=csv_path, class_index=class_index, exts=exts,
                          num_shards=num_shards, shard_index=shard_index)
    run = RunOptions(workers=workers, executor=executor, max_failures=max_failures, resume=resume,
                     overwrite=overwrite, strict=strict, timeout=timeout, commit_every=commit_every,
                     break_lock=break_lock, append=append, prune=prune)

    def build(path: str, claim: Any) -> Any:
        return pack_v(src, path, to=to, pack_options=pack, input_options=inputs, run_options=run, claim=claim,
                      append_to=append_to)

    sources = _sources(src, list_path=list_path, csv_path=csv_path, class_index=class_index)
    sources["read"].append(append_to)  # (a split append reads the output it plans against)
    return _checked(_into(out, build, resume=resume or append, overwrite=overwrite, break_lock=break_lock, sources=sources),
                    max_failures)


@checked
def resize(src: PathLike, out: PathLike, spec: ResizeSpec, *, list_path: Optional[PathLike] = None,
           exts: str = IMAGE_EXTS, workers: Optional[int] = None, max_failures: int = 0,
           break_lock: bool = False) -> MirrorReport:
    """Mirror the images under ``src`` into ``out``, resized as ``spec`` (a ``packer.ResizeSpec``) says.

    The library form of ``packer resize``. Incremental: a rerun redoes only the images whose
    source or options changed; each output file is replaced atomically.

    Args:
        src: the image tree.
        out: the mirrored tree (created; a local folder).
        spec: the resize, e.g. ``packer.ResizeSpec(short_side=256)``.
        list_path: resize only the files of this list (``relative/path label`` lines, relative to ``src``).
        exts: comma-separated image extensions to take.
        workers: worker processes (None: all cores; 0: this process).
        max_failures: failed images tolerated; more raise ``TooManyFailures``.
        break_lock: take the claim on ``out`` even from a run that may still be alive.

    Returns:
        The run's report (``summary()``, ``failed``, ``failures``).
    """
    from packer.claim import claim_output
    from packer.commands.resize_tree import resize_tree
    from packer.conversion.placement import check_placement

    if spec is None:
        raise UsageError("give a ResizeSpec (short_side=N, max_side=N or size=(W, H))")
    check_placement([out], **_sources(src, list_path=list_path))
    with claim_output(out, takeover=True, break_lock=break_lock):  # incremental: a dead run's claim is taken
        report = resize_tree(src, out, spec, list_path=list_path, exts=exts, workers=workers,
                             max_failures=max_failures)
    return _checked(report, max_failures)


@checked
def merge(parts: Sequence[PathLike], out: PathLike, *, overwrite: bool = False, any_parts: bool = False,
          break_lock: bool = False, append: bool = False) -> MergeReport:
    """Combine the parts of a ``num_shards`` conversion into one output (the content of one run).

    The library form of ``packer merge``. Parts and ``out`` may be URLs (parts read through
    the node cache; ``out`` built locally, then uploaded). A part another run is writing, or
    one whose rewrite is half done, is refused, named.

    Args:
        parts: the part outputs (sorted by their shard index unless ``any_parts``).
        out: the merged output; it must not exist unless ``overwrite``.
        overwrite: replace an existing ``out``.
        any_parts: merge any outputs of one format and class list in the order given.
        break_lock: take the claim on ``out`` even from a run that may still be alive.
        append: the parts are a split append to ``out`` (``pack(..., append_to=out)``): add
            their samples to it as its next version, refused when it holds another version than
            the one they were planned against (docs/append.md, "Split appends").

    Returns:
        The merge's report (``summary()``).
    """
    from contextlib import nullcontext

    from packer.claim import claim_output
    from packer.commands.merge import merge_parts
    from packer.remote.url import is_url

    if len(parts) < 1:
        raise UsageError("merge needs at least one part")
    from packer.conversion.placement import check_placement

    check_placement([out], walked=parts)  # a part is a whole folder read, as a walked tree
    if append:  # into the output the parts were planned against (a local one; it says so)
        from packer.commands.merge_append import append_parts

        with (nullcontext() if is_url(out) else  # (refused there: a local output only)
              claim_output(out, takeover=True, break_lock=break_lock)) as claim:  # a dead merge's is taken
            return append_parts(parts, out, overwrite=overwrite, any_parts=any_parts, claim=claim)
    if is_url(out):
        return merge_parts(parts, out, overwrite=overwrite, any_parts=any_parts, break_lock=break_lock)
    with claim_output(out, takeover=True, break_lock=break_lock) as claim:  # a merge rebuilds: a dead one's is taken
        return merge_parts(parts, out, overwrite=overwrite, any_parts=any_parts, claim=claim)


@checked
def export(pack: PathLike, out: PathLike, *, to: str, shard_size: Union[int, str, None] = None,
           samples_per_shard: Optional[int] = None, max_failures: int = 0, resume: bool = False,
           overwrite: bool = False, break_lock: bool = False) -> ExportReport:
    """Export a pack as WebDataset tar shards (``to="wds"``) or Parquet files (``to="parquet"``).

    The library form of ``packer export``. Every sample is read through the pack's checked
    reader and written as it is, in stored order: encoded image bytes copied (raw-pixel packs:
    lossless PNG), keys, labels and fields kept. ``webdataset.WebDataset(...).decode()`` reads
    the tar shards, ``datasets.load_dataset("parquet", ...)`` the Parquet files (an ``Image``
    feature, a ``ClassLabel`` label with the class names). ``out`` gets ``export.json`` (the
    source pack's identity, each shard's size and sha256, the counts) and ``failures.jsonl``
    (damaged samples, never exported). docs/sources.md, "Exports".

    Args:
        pack: any packed output (``lmdb``, ``records``, ``hdf5``; a URL is read through the cache).
        out: the export folder (a local path; built at ``out.partial``, renamed when complete).
        to: ``wds`` or ``parquet``.
        shard_size: start a new shard before a sample would take it past this many bytes
            (``"256MB"``, ``"1GiB"``, an int; Parquet: the samples' bytes). None: 256MB, unless
            ``samples_per_shard`` alone is given.
        samples_per_shard: at most this many samples per shard (with ``shard_size``: whichever
            comes first).
        max_failures: damaged samples tolerated; more raise ``TooManyFailures`` after publishing.
        resume: continue an interrupted export of the same pack with the same options.
        overwrite: replace an existing export at ``out`` when done.
        break_lock: take the claim on ``out`` even from a run that may still be alive.

    Returns:
        The ``ExportReport`` (``summary()``, ``count``, ``shards``, ``failures``).
    """
    from packer.commands.export import ExportOptions, export_pack

    options = ExportOptions(to=to, shard_size=shard_size, samples_per_shard=samples_per_shard)

    def build(path: str, claim: Any) -> Any:
        return export_pack(pack, path, options=options, resume=resume, overwrite=overwrite, claim=claim)

    # the pack is read whole, as a merge reads a part: apart from OUT either way
    return _checked(_into(out, build, resume=resume, overwrite=overwrite, break_lock=break_lock,
                          sources={"walked": [pack], "read": []}), max_failures)


@checked
def verify(path: PathLike, *, decode: bool = True) -> VerifyResult:
    """Read every sample of a packed output and check its checksums and structure.

    The library form of ``packer verify``. ``path`` may be a URL (every records shard is
    downloaded again from the server and checked against its sha256; ``notes`` says so).

    Args:
        path: the packed output.
        decode: also decode every image (False: structure and checksums only).

    Returns:
        The ``VerifyResult`` (``count``, ``checked``) when everything is intact.

    Raises:
        VerifyFailed: with the result (``.result.problems``) when anything is not.
    """
    from packer.commands.inspection import verify_dataset

    result = verify_dataset(path, decode_images=decode)
    if not result.ok:
        raise VerifyFailed(result)
    return result


@checked
def inspect(path: PathLike, *, show: int = 5, grid: Optional[PathLike] = None, seed: int = 0,
            grid_boxes: bool = True, grid_labels: bool = False) -> dict[str, Any]:
    """What a packed output holds: format, count, classes, bytes on disk and the first samples.

    The library form of ``packer inspect``. ``path`` may be a URL (read through the cache).

    Args:
        path: the packed output.
        show: how many samples to describe.
        grid: also write a contact sheet PNG of a seeded random sample here.
        seed: the seed of the ``grid`` sample.
        grid_boxes: on a detection field pack, outline each sample's boxes on the sheet.
        grid_labels: with ``grid_boxes``, also write each box's class name.

    Returns:
        A dict (the fields ``packer inspect --json`` prints).
    """
    from packer.commands.inspection import inspect_dataset, render_grid

    info = inspect_dataset(path, show=show)
    if grid is not None:
        info["grid"] = {"path": str(grid), "positions": render_grid(path, grid, seed=seed, boxes=grid_boxes,
                                                                    labels=grid_labels)}
    return info


@checked
def index(paths: Sequence[PathLike], *, break_lock: bool = False) -> list[tuple[Path, int]]:
    """Write a DALI ``.idx`` beside each TFRecord file (a folder: each one in it).

    The library form of ``packer index``. Each path is claimed while its indexes are written.

    Returns:
        ``(tfrecord path, record count)`` per file indexed.
    """
    from packer.commands.index import index_paths

    return index_paths(paths, break_lock=break_lock)


@checked
def bench(path: PathLike, *, batch_size: int = 64, workers: Sequence[int] = (0, 1, 2), decode: str = "fast",
          resize: int = 256, crop: int = 224, steps: int = 30, model_ms: float = 0.0,
          device: Optional[str] = None, seed: int = 0, transform: Optional[str] = None, fidelity: int = 16,
          against: Optional[PathLike] = None, write: Optional[str] = None, check: str = "header",
          progress: bool = True, frames: Optional[PathLike] = None, clips: int = 60,
          clip_len: Optional[int] = None, frame_interval: Optional[int] = None, num_clips: Optional[int] = None,
          test_mode: Optional[bool] = None) -> dict[str, Any]:
    """Is data loading the bottleneck? Time the loaders over ``path``; or, with ``write``, the writer.

    The library form of ``packer bench``: the real DataLoader over ``path`` per ``workers``
    value beside the in-memory ceiling, a recommended ``num_workers``, ``packer.Loader``'s
    thread scaling and the fidelity of the fast decodes. On a ``pack-videos`` output it answers
    another question instead: for these sampling settings, read the videos or a frame pack of them?
    (clips/s, CPU ms per clip and bytes per video of both, and which to use:
    ``packer.benchmark.video``).

    Args:
        path: a packed output (or, with ``write``, an image folder).
        batch_size, steps: samples per batch and batches timed per setting.
        workers: the ``num_workers`` values to try.
        decode: ``fast`` (DCT-scaled decode + resize + centre crop), ``pil`` or ``tensor``.
        resize, crop: short side to resize to and the centre crop side.
        model_ms: simulated training step per batch, in ms.
        device: where batches go (None: CUDA when there is one).
        seed: fixes the order.
        transform: ``MODULE:CALLABLE`` applied after the decode.
        fidelity: samples for the fidelity table (0 skips it).
        against: the original image folder, to run the same pipeline over as a ratio.
        write: bench the write path instead: pack ``path`` into this format (``records``, ``lmdb``, ``hdf5``).
        check: with ``write``: the ``check`` of the packing runs.
        progress: show progress bars.
        frames: on a video pack: the frame pack of the same videos to compare with (None: one is
            made from the video pack's streams in a temporary folder, JPEG q95 at the same size).
        clips: on a video pack: clips timed per pack and sampling.
        clip_len, frame_interval, num_clips, test_mode: on a video pack: the sampling to time
            (``SampleFrames`` options; none given: TSN, 8 segments, and dense, 32 frames 2 apart in
            test mode).

    Returns:
        A dict (the fields ``packer bench --json`` prints).
    """
    from packer.benchmark.video import is_video_pack

    if write is None and is_video_pack(path):
        from packer.benchmark.video import run_video_bench

        return run_video_bench(path, frames=frames, clips=clips, seed=seed, clip_len=clip_len,
                               frame_interval=frame_interval, num_clips=num_clips, test_mode=test_mode)
    if frames is not None:
        raise UsageError(f"{path}: --frames is for a pack-videos output")
    if write is not None:
        from packer.benchmark.write import run_write_bench

        return run_write_bench(path, to=write, check=check, workers=list(workers))
    from packer.benchmark.run import BenchOptions, run_bench

    options = BenchOptions(batch_size=batch_size, workers=tuple(workers), decode=decode, resize=resize, crop=crop,
                           steps=steps, model_ms=model_ms, device=device, seed=seed, transform=transform,
                           fidelity=fidelity)
    return run_bench(path, options, against=against, progress=progress)


@checked
def demo(workdir: PathLike = "packer-demo", *, count: int = 200, workers: Optional[int] = None) -> dict[str, Any]:
    """Generate ``count`` sample images, pack them to LMDB and read them back (no download).

    The library form of ``packer demo``.

    Returns:
        What was made and the read throughput (``output``, ``pack``, ``read_samples_per_s``, ...).
    """
    from packer.benchmark.demo import run_demo

    return run_demo(workdir, count=count, workers=workers)

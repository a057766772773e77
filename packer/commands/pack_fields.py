"""Pack samples of many typed fields (a COCO file or a sample manifest) into any packed format.

The library call behind ``to-lmdb|to-records|to-hdf5 --coco`` / ``--manifest``. The sources
(``packer.conversion.coco``, ``packer.conversion.tables``) list one ``FieldItem`` per sample;
``FieldJob`` reads its images (checked or resized as for an image pack), fills in the other
fields and encodes the sample as one field blob (``packer.codecs.fields``); the writer stores it
and the manifest records the schema. The run loop, failures, resume and split runs are the
ones every pack uses (``packer.conversion.runner``).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Callable, Mapping

from packer.claim import Claim
from packer.codecs.fields import BLOB_FMT, Schema
from packer.codecs.image import CHECK_MODES, jpeg_orientation, probe
from packer.codecs.jpeg_header import jpeg_header
from packer.codecs.resize import ResizeSpec
from packer.commands.pack_images import ImageJob, _discard_partial, source_name
from packer.conversion.append import plan_append, plan_split
from packer.conversion.executors import make_executor
from packer.conversion.fingerprint import item_stat, writer_settings
from packer.conversion.inputs import (FieldItem, InputFailure, Item, SourceItem, SourceListing, partition,
                                     read_item, run_failures)
from packer.conversion.inputs import listing as listed
from packer.conversion.options import InputOptions, RunOptions
from packer.conversion.plans import choose_plan
from packer.conversion.runner import Report, check_output_arg, run
from packer.fileio import file_sha256
from packer.errors import CorruptSample, PackerError, UsageError
from packer.formats import open_reader, writer_class
from packer.formats.sidecars import partial_path
from packer.formats.sample import Sample
from packer.manifest import Manifest, created_by

__all__ = ["FieldJob", "pack_fields"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FieldJob:
    """The per-sample work (picklable; runs in worker processes): read and check (or resize)
    each image field, fill in the other fields, encode the sample's field blob.

    ``coco``: the item's values are a COCO image's annotations (``packer.conversion.coco``):
    boxes and masks are scaled with the image, and an image whose size differs from the
    annotation file's, or that is EXIF-rotated (its annotations' frame is then ambiguous), fails.
    """

    schema: Schema
    root: str
    check: str = "full"
    resize: ResizeSpec | None = None
    coco: bool = False

    def __call__(self, item: FieldItem) -> Sample:
        if self._instances is not None:  # the common COCO pack: its blob straight from the records
            data, stat = read_item(item)
            first = self._image(item, item.key, item.path, data)
            blob = self._instances(item.values, first.data, height=first.height, width=first.width)
            if blob is None:  # a value only the checked way takes: Schema.encode says what is wrong
                from packer.conversion.coco import sample_fields

                values = sample_fields(item.values, height=first.height, width=first.width, schema=self.schema)
                return self._encode(item, {"image": first.data, **values}, first, stat)
            return Sample(item.key, blob, BLOB_FMT, -1, first.height, first.width, first.channels,
                          source_stat=stat)
        if isinstance(item, SourceItem):
            return self._source_sample(item)
        # a sample without images is keyed by its video or row: nothing to read here (the
        # item's path is then the video file or the manifest, stat'ed for the resume)
        data, stat = read_item(item) if self.schema.image_fields else (b"", item_stat(item))
        values: dict[str, Any] = {}
        first: Sample | None = None
        for name in self.schema.image_fields:
            if first is None:
                sample = self._image(item, item.key, item.path, data)
                first = sample
            else:
                rel = item.values[name]
                path = str(Path(self.root) / rel)
                sample = self._image(item, rel, path, read_item(Item(rel, path, -1))[0])
            values[name] = sample.data
        for name in self.schema.video_fields:
            values[name] = self._video(item.values[name])
        if self.coco:
            from packer.conversion.coco import sample_fields

            values.update(sample_fields(item.values, height=first.height, width=first.width, schema=self.schema))
        else:
            values.update({k: v for k, v in item.values.items() if k not in values})
        return self._encode(item, values, first, stat)

    @cached_property
    def _instances(self) -> Callable[..., bytes | None] | None:
        """``instances_blob`` when the fields are a COCO instances pack's (it encodes their
        samples; where it cannot, None, the sample goes the general way), else None."""
        from packer.conversion.coco import instances_blob, instances_schema

        return instances_blob if self.coco and self.schema == instances_schema() else None

    @cached_property
    def _image_job(self) -> ImageJob:
        return ImageJob(check=self.check, resize=self.resize)

    def _source_sample(self, item: SourceItem) -> Sample:
        """A tar sample or a table row (``packer.conversion.sources``): every field, images
        included, read from its container."""
        given, stat = item.read_values()
        values: dict[str, Any] = {}
        first: Sample | None = None
        for name in self.schema.image_fields:
            sample = self._image(item, item.key, item.path, given[name])
            first = first or sample
            values[name] = sample.data
        values.update({k: v for k, v in given.items() if k not in values})
        return self._encode(item, values, first, stat)

    def _encode(self, item: FieldItem, values: dict[str, Any], first: Sample | None,
                stat: tuple[int, int] | None) -> Sample:
        try:
            blob = self.schema.encode(values)
        except ValueError as e:
            raise CorruptSample(item.key, item.path, str(e), stage="encode") from e
        h, w, c = (first.height, first.width, first.channels) if first is not None else (0, 0, 0)
        return Sample(item.key, blob, BLOB_FMT, -1, h, w, c, source_stat=stat)

    def _video(self, rel: str) -> bytes:
        """A video field's packed stream: the video re-encoded as ``pack-videos`` does it (its
        default GOP and quality; ``--short-side`` as the pack's resize says)."""
        from packer.commands.pack_videos import VideoPackOptions
        from packer.conversion.video_inputs import VideoItem

        short = self.resize.short_side if self.resize is not None else None
        job = VideoPackOptions(short_side=short).job()
        path = str(Path(self.root) / rel)
        result = job(VideoItem(rel, path, -1, frame_dir=rel))
        if result.note is not None:  # frames missing from the stored video: this row fails
            raise CorruptSample(rel, path, f"the video decodes only in part ({result.note['reason']})",
                                stage="decode")
        return result.samples[0].data

    def _image(self, item: FieldItem, key: str, path: str, data: bytes) -> Sample:
        if self.coco:
            self._check_geometry(item, key, path, data)
        return self._image_job._sample(Item(key, path, -1), data)

    def _check_geometry(self, item: FieldItem, key: str, path: str, data: bytes) -> None:
        hwc = jpeg_header(data)  # a plain JPEG (the common case) without probe's dispatch
        if hwc is not None:
            height, width, fmt = hwc[0], hwc[1], "jpeg"
        else:
            info = probe(data, check="header", key=key, source=path)
            height, width, fmt = info.height, info.width, info.fmt
        oh, ow = (int(v) for v in item.values["orig_size"])
        iid = item.values["image_id"]
        if (height, width) != (oh, ow):
            raise CorruptSample(key, path, f"image id {iid}: the image is {width}x{height}, the "
                                           f"annotation file says {ow}x{oh}", stage="decode")
        if fmt == "jpeg" and jpeg_orientation(data) != 1:
            raise CorruptSample(key, path, f"image id {iid}: EXIF orientation {jpeg_orientation(data)}: "
                                           "the annotations' frame is ambiguous", stage="decode")


def pack_fields(root: str | os.PathLike, out: str | os.PathLike, *, format: str = "lmdb",
                coco: str | os.PathLike | None = None, manifest: str | os.PathLike | None = None,
                schema: Mapping[str, Any] | Schema | None = None, drop_empty: bool = False, check: str = "full",
                resize: ResizeSpec | None = None, writer_options: dict[str, Any] | None = None,
                input_options: InputOptions = InputOptions(), run_options: RunOptions = RunOptions(),
                claim: Claim | None = None, listing: SourceListing | None = None,
                append_to: str | os.PathLike | None = None) -> Report:
    """Pack a COCO annotation file (``coco``) or a sample manifest (``manifest``) over the images
    under ``root`` into ``out`` (see the module doc and docs/fields.md); or, with ``listing``,
    the samples of a dataset source (tar shards, a Hugging Face dataset, Parquet files:
    ``packer.commands.pack_sources``; ``root`` is that source).

    ``run_options.append``: pack the samples ``out`` lacks as its next version (docs/append.md,
    "Field packs"): a sample is in ``out`` when its key is and its image file (size, mtime) and
    annotations or row values (the item's ``label``, their digest) are as packed; the fields must
    be the pack's, a COCO file's new categories get the labels after the pack's. ``append_to``:
    a split append (docs/append.md, "Split appends"): plan that append to ``append_to`` from the
    whole file or listing and pack this part's share of the new samples into ``out``.
    ``schema``: a manifest's ``{column: type}`` (inferred from its first row when None);
    ``drop_empty``: leave out COCO images without annotations. ``input_options``: ``num_shards``,
    ``shard_index``, ``exts``; ``run_options``: how the run goes (``packer.api.pack`` builds both).
    """
    inputs, run_opts = input_options, run_options
    if (coco is None) + (manifest is None) + (listing is None) != 2:
        raise UsageError("give exactly one of --coco and --manifest")
    if check not in CHECK_MODES:
        raise UsageError(f"--check must be one of {', '.join(CHECK_MODES)}")
    if coco is not None and schema is not None:
        raise UsageError("a COCO pack's fields are fixed; --schema is for --manifest")
    if coco is not None and resize is not None and resize.size is not None and resize.fit != "stretch":
        raise UsageError("a COCO pack resizes with --short-side, --max-side or --size --fit stretch "
                         "(a crop or pad would cut boxes and masks)")
    if inputs.list_path or inputs.csv_path or (inputs.class_index and listing is None):
        raise UsageError("--list, --csv and --class-index do not apply to --coco or --manifest")
    writer_cls = writer_class(format)
    writer_options = dict(writer_options or {})
    if run_opts.commit_every is not None:
        writer_options["commit_every"] = run_opts.commit_every
    if append_to is not None:
        from packer.commands.pack_images import check_split_append

        check_split_append(append_to, out, None, run_opts)
    appending = run_opts.append and Path(out).exists()
    if run_opts.append:
        if inputs.num_shards > 1:
            raise UsageError("--append packs the new samples in one run: not with --num-shards")
        if not appending:  # nothing to append to yet: a plain run (continuing an interrupted one)
            run_opts = dataclasses.replace(run_opts, append=False, prune=False, resume=partial_path(out).exists())
    else:
        check_output_arg(out, resume=run_opts.resume, overwrite=run_opts.overwrite)
    packed = _pack_manifest(append_to if append_to is not None else out) if appending or append_to else None
    source = str(coco if coco is not None else manifest if manifest is not None else root)
    bad: list[InputFailure] = []
    extra: dict[str, Any] = {}
    classes: list[str] = []
    if listing is not None:
        items, schema_obj, classes, bad = listing.items, listing.schema, list(listing.classes), listing.failures
    elif coco is not None:
        from packer.conversion.coco import coco_items

        pack_coco = (packed.extra.get("coco") or {}) if packed is not None else {}
        got = coco_items(coco, root, drop_empty=drop_empty, failures=bad,
                         labelled=pack_coco.get("categories") if pack_coco.get("kind") == "instances" else None)
        items, schema_obj = got.items, got.schema
        classes = [c["name"] for c in got.categories]
        extra = {"coco": {"kind": got.kind, "categories": got.categories}}
    else:
        from packer.conversion.inputs import parse_exts
        from packer.conversion.tables import table_items

        items, schema_obj = table_items(manifest, root, schema=schema, exts=parse_exts(inputs.exts), failures=bad)
    if not items:
        raise UsageError(f"{source}: no samples" + (f" ({len(bad)} unusable, e.g. {bad[0]})" if bad else ""))
    whole = listed(items, bad, {"list": source} if listing is None else {}) if inputs.num_shards > 1 else None
    every = items  # (a split append plans from all of them)
    items = partition(items, inputs.num_shards, inputs.shard_index)
    recorded: dict[str, Any] = {
        "format": format, "check": check, "src": source_name(root), "list": source if listing is None else None,
        "schema": [f.spec() for f in schema_obj.fields], "num_shards": inputs.num_shards,
        "shard_index": inputs.shard_index}
    if listing is None:
        recorded.update({"source": "coco" if coco is not None else "manifest", "source_sha256": file_sha256(source)})
    else:
        recorded.update(listing.recorded)
    if coco is not None:
        recorded["drop_empty"] = bool(drop_empty)
    if whole is not None:
        recorded["listing"] = whole
    if resize is not None:
        recorded["resize"] = resize.to_dict()
    writer = writer_cls(out, classes=classes, **writer_options)
    writer.schema = schema_obj
    writer.manifest_extra = extra
    recorded["writer"] = writer_settings(writer, writer_options)
    plan = None
    if append_to is not None:  # every job plans the same append from the whole file; this one packs its share
        _check_fields(append_to, packed, schema_obj, extra)
        items, writer.classes, recorded["append_to"] = plan_split(
            append_to, every, classes, format=format, fields=True, options=recorded,
            num_shards=inputs.num_shards, shard_index=inputs.shard_index)
    elif packed is not None:  # the samples not in OUT yet (by image file and annotations or row values)
        _check_fields(out, packed, schema_obj, extra)
        plan = plan_append(out, items, classes, format=format, options=recorded, prune=run_opts.prune, fields=True)
        if plan.empty:
            _discard_partial(writer, claim)  # an append published before its files went
            return Report(str(out), count=len(plan.base.reader), items=len(items), status="current",
                          version=plan.base.manifest.version, note=plan.note())
        items, writer.classes = plan.items, list(plan.classes)
    writer.created_by = created_by(recorded)
    job = FieldJob(schema=schema_obj, root=str(root), check=check, resize=resize, coco=coco is not None)
    if run_opts.workers is not None and run_opts.workers < 0:
        raise UsageError("--workers must be >= 0")
    # the plans image packs run (shared memory for LMDB, workers' own parts for records and
    # HDF5); every field is made in the worker, so there is no verdict-only plan
    how = choose_plan(writer=writer_cls, check=check, workers=run_opts.workers, resizing=resize is not None,
                      executor=run_opts.executor, fields=True,
                      fixed_layout=getattr(writer, "samples_per_shard", None) is not None)
    log.info("to-%s: %s (%s)", format, how.mode, how.why)
    ex = how.executor(writer)
    with ex:
        return run(items, how.job_for(job), writer, executor=ex, options=run_opts, claim=claim,
                   desc=f"to-{format}", input_failures=run_failures(bad, inputs.shard_index), append=plan)


def _pack_manifest(out: str | os.PathLike) -> Manifest:
    """The latest manifest of the output an append grows."""
    try:
        reader = open_reader(out)
    except PackerError as e:
        raise UsageError(f"{out}: cannot append to it ({e})") from e
    try:
        return reader.manifest
    finally:
        reader.close()


def _check_fields(out: str | os.PathLike, packed: Manifest, schema: Schema, extra: dict[str, Any]) -> None:
    """UsageError naming what of the samples' fields an append would change: a COCO file's kind
    (instances or captions), a field's type (a keypoint count among them), the fields themselves."""
    if not packed.schema:
        return  # (not a field pack: plan_append says so)
    then, now = (packed.extra.get("coco") or {}).get("kind"), (extra.get("coco") or {}).get("kind")
    if then != now:
        raise UsageError(f"{out}: holds COCO {then} samples, the annotation file {now}: they cannot be appended"
                         if then and now else f"{out}: is a COCO pack; append to it with --coco" if then
                         else f"{out}: is a sample manifest's pack; append to it with --manifest")
    old = {f["name"]: f for f in packed.schema}
    new = {f["name"]: f for f in schema.to_json()}
    diff = [f"{name}: {json.dumps(old.get(name))} in the pack, {json.dumps(new.get(name))} now"
            for name in list(old) + [n for n in new if n not in old] if old.get(name) != new.get(name)]
    if diff:
        raise UsageError(f"{out}: cannot append, the samples' fields differ from the pack's:\n  " + "\n  ".join(diff))

"""Pack an image dataset into any packed format: the library call behind ``to-lmdb`` & co."""
from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packer.claim import Claim
from packer.conversion.append import plan_append, plan_split
from packer.conversion.runner import Report, check_output_arg, run
from packer.fileio import remove_path
from packer.formats.sidecars import partial_path
from packer.errors import UsageError
from packer.conversion.options import InputOptions, RunOptions
from packer.conversion.plans import choose_plan
from packer.formats import writer_class
from packer.formats.sample import Sample
from packer.codecs.image import CHECK_MODES, EXT_FORMATS, probe
from packer.codecs.jpeg_header import jpeg_header
from packer.manifest import created_by
from packer.codecs.resize import ResizeSpec, resize_image, resize_pixels
from packer.conversion.fingerprint import writer_settings
from packer.conversion.inputs import (InputFailure, Item, SourceListing, image_items, parse_exts, partition, read_item,
                                     run_failures, shuffle_items)
from packer.conversion.inputs import listing as listed

__all__ = ["ImageJob", "pack_images", "check_split_append", "source_name"]

log = logging.getLogger(__name__)



@dataclass(frozen=True)
class ImageJob:
    """The per-image work (picklable; runs in worker processes): read, check, describe.

    Encoded bytes pass through unchanged, unless ``resize`` is given (then they are resized
    and re-encoded, or kept when already within bounds: see ``packer.codecs.resize``; every image is
    then fully decoded, whatever ``check`` says) or ``raw`` (decoded, resized to
    ``resize.size``, stored as HxWx3 RGB uint8 pixels).
    """

    check: str = "full"
    resize: ResizeSpec | None = None
    raw: bool = False

    def __call__(self, item: Item) -> Sample:
        data, stat = read_item(item)
        sample = self._sample(item, data)
        sample.source_stat = stat
        return sample

    def _sample(self, item: Item, data: bytes) -> Sample:
        if self.raw:
            arr = resize_pixels(data, self.resize, key=item.key, source=item.path)
            return Sample(item.key, arr.tobytes(), "raw", item.label, arr.shape[0], arr.shape[1], arr.shape[2])
        if self.resize is not None:
            r = resize_image(data, self.resize, key=item.key, source=item.path)
            return Sample(item.key, r.data, r.fmt, item.label, r.height, r.width, r.channels)
        if self.check == "header":  # a plain JPEG (the common case) without probe's dispatch
            hwc = jpeg_header(data)
            if hwc is not None:
                return Sample(item.key, data, "jpeg", item.label, *hwc)
        ext = item.key.rsplit(".", 1)[-1].lower()
        info = probe(data, check=self.check, key=item.key, source=item.path, ext_fmt=EXT_FORMATS.get(ext))
        return Sample(item.key, data, info.fmt, item.label, info.height, info.width, info.channels)


def _discard_partial(writer: Any, claim: Claim | None) -> None:
    """Remove what an append left after publishing its version (a kill before its cleanup)."""
    if not (writer.workdir.exists() or writer.journal_dir.exists()):
        return
    if claim is not None:
        claim.partial(writer.workdir, writer.journal_dir).adopt()  # never another live run's
    for path in (writer.workdir, writer.journal_dir):
        remove_path(path)


def pack_images(src: str | os.PathLike, out: str | os.PathLike, *, format: str = "lmdb",
                check: str = "full", resize: ResizeSpec | None = None, raw: bool = False,
                writer_options: dict[str, Any] | None = None, shuffle: int | None = None,
                input_options: InputOptions = InputOptions(), run_options: RunOptions = RunOptions(),
                claim: Claim | None = None, listing: SourceListing | None = None,
                append_to: str | os.PathLike | None = None) -> Report:
    """Pack the images under ``src`` (ImageFolder, or ``input_options.list_path`` lines) into ``out``.

    ``input_options``: which inputs (a list file, extensions, the part of a split run);
    ``run_options``: how the run goes (workers, failures tolerated, resume or overwrite), both
    built where the library call is made (``packer.api.pack``).
    Bad images are skipped and recorded in ``failures.jsonl``; see ``conversion.runner.run``.
    ``resize`` resizes every image while packing (recorded in the manifest's ``created_by``);
    ``raw`` (HDF5 only, needs ``resize.size``) stores fixed-size decoded pixels.
    ``shuffle`` (a seed) stores the samples in a seeded permutation of the sorted inputs
    (``shuffle_items``; keys still name the sources), so that even reading in stored order
    mixes classes; the seed is recorded in ``created_by`` and covered by the resume check.
    Arguments are validated before any work starts. ``claim``: the run's claim on ``out``
    (taken by ``packer.api``), which guards the publish; None: unclaimed. ``listing``: the
    items of a dataset source (tar shards, a Hugging Face dataset, Parquet files:
    ``packer.commands.pack_sources``) instead of walking ``src``. ``append_to``: a split
    append (docs/append.md, "Split appends"): plan an append to that output from the whole
    listing (the inputs it lacks, the new classes' labels after its own) and pack this part's
    share of the new inputs into ``out``, a part recording the version it was planned against
    (``packer merge PARTS... OUTPUT --append`` adds the parts to it).
    """
    inputs, run_opts = input_options, run_options
    if check not in CHECK_MODES:
        raise UsageError(f"--check must be one of {', '.join(CHECK_MODES)}")
    writer_cls = writer_class(format)
    writer_options = dict(writer_options or {})
    if run_opts.commit_every is not None:
        writer_options["commit_every"] = run_opts.commit_every
    if raw:
        if format != "hdf5":
            raise UsageError(f"--raw (decoded pixels) is for hdf5 output, not {format}")
        if resize is None or resize.size is None:
            raise UsageError("--raw needs --size WIDTHxHEIGHT (every stored image has one shape)")
        if resize.format != "keep":
            raise UsageError("--format does not apply to --raw (pixels are stored decoded)")
        writer_options["pixels_shape"] = (resize.size[1], resize.size[0], 3)
    if append_to is not None:
        check_split_append(append_to, out, shuffle, run_opts)
    appending = run_opts.append and Path(out).exists()
    if run_opts.append:
        if inputs.num_shards > 1:
            raise UsageError("--append packs the new inputs in one run: not with --num-shards (a split append "
                             "takes --append-to)")
        if not appending:  # nothing to append to yet: a plain run (continuing an interrupted one)
            run_opts = dataclasses.replace(run_opts, append=False, prune=False,
                                           resume=partial_path(out).exists())
    else:
        check_output_arg(out, resume=run_opts.resume, overwrite=run_opts.overwrite)
    bad: list[InputFailure] = []  # list lines / entries that cannot be items: recorded, not dropped
    if listing is None:
        items, classes = image_items(src, list_path=inputs.list_path, exts=inputs.exts,
                                     class_index=inputs.class_index, failures=bad)
    else:
        items, classes, bad = listing.items, listing.classes, listing.failures
    if not items:
        raise UsageError(f"{src}: no input images found" + (f" ({len(bad)} unusable lines, e.g. {bad[0]})" if bad else ""))
    # a part of a split run records the whole listing it was cut from (merge compares them)
    whole = (listed(items, bad, {"list": inputs.list_path}) if inputs.num_shards > 1 else None)
    if shuffle is not None:  # before partition: the parts of a split pack share one permutation
        items = shuffle_items(items, shuffle)
    every = items  # (a split append plans from all of them)
    items = partition(items, inputs.num_shards, inputs.shard_index)  # may be empty: an empty part still merges
    recorded = {"format": format, "check": check, "src": source_name(src),
                "list": str(inputs.list_path) if inputs.list_path else None,
                "num_shards": inputs.num_shards, "shard_index": inputs.shard_index,
                "ext": list(parse_exts(inputs.exts))}
    if listing is not None:
        recorded.update(listing.recorded)
    if getattr(classes, "label_map", None) is not None:  # --class-index (else as always)
        recorded["label_map"] = classes.label_map
    if whole is not None:
        recorded["listing"] = whole
    if resize is not None:
        recorded["resize"] = resize.to_dict()
    if raw:
        recorded["raw"] = True
    if shuffle is not None:
        recorded["shuffle"] = int(shuffle)
    writer = writer_cls(out, classes=classes, **writer_options)
    # every writer option (shard sizes, names, commit sizes) as the writer holds it is part of the
    # record and of the resume fingerprint (packer.conversion.fingerprint)
    recorded["writer"] = writer_settings(writer, writer_options)
    plan = None
    if append_to is not None:  # every job plans the same append from the whole listing; this one packs its share
        items, writer.classes, recorded["append_to"] = plan_split(
            append_to, every, classes, format=format, listed=inputs.list_path is not None, options=recorded,
            num_shards=inputs.num_shards, shard_index=inputs.shard_index)
    if appending:  # the inputs not in OUT yet, labelled as the pack labels them
        plan = plan_append(out, items, classes, format=format, options=recorded, prune=run_opts.prune,
                           listed=inputs.list_path is not None)
        if plan.empty:
            _discard_partial(writer, claim)  # an append published before its files went
            return Report(str(out), count=len(plan.base.reader), items=len(items), status="current",
                          version=plan.base.manifest.version, note=plan.note())
        items, writer.classes = plan.items, list(plan.classes)
    writer.created_by = created_by(recorded)
    job = ImageJob(check=check, resize=resize, raw=raw)
    if run_opts.workers is not None and run_opts.workers < 0:
        raise UsageError("--workers must be >= 0")
    how = choose_plan(writer=writer_cls, check=check, workers=run_opts.workers,
                      resizing=resize is not None or raw, executor=run_opts.executor,
                      fixed_layout=getattr(writer, "samples_per_shard", None) is not None)
    log.info("to-%s: %s (%s)", format, how.mode, how.why)
    ex = how.executor(writer)
    with ex:
        report = run(items, how.job_for(job), writer, executor=ex, options=run_opts, claim=claim,
                     desc=f"to-{format}", input_failures=run_failures(bad, inputs.shard_index), append=plan)
    if plan is not None:  # the tree's order may not be the pack's
        report.labels = (f"{len(plan.base.manifest.classes)} classes keep the pack's labels"
                         + (f", {len(plan.new_classes)} new ones labelled from {len(plan.base.manifest.classes)}"
                            if plan.new_classes else ""))
    else:
        report.labels = listing.note if listing is not None else getattr(classes, "note", "")
    return report


def check_split_append(append_to: str | os.PathLike, out: str | os.PathLike, shuffle: int | None,
                        run_opts: RunOptions) -> None:
    """Refuse a split append (``append_to``) where it does not apply, before any work."""
    from packer.remote.url import is_url

    if run_opts.append or run_opts.prune:
        raise UsageError("--append-to packs a part of a split append into OUT (a new part): not with "
                         "--append or --prune")
    if shuffle is not None:
        raise UsageError("--append-to: not with --shuffle (an append packs the inputs in input order)")
    if is_url(append_to) or is_url(out):
        raise UsageError("--append-to: the output appended to and the part are local paths "
                         "(append to a local copy, then upload it)")
    if not Path(append_to).exists():
        raise UsageError(f"{append_to}: does not exist; a split append adds to a pack (pack it first)")


def source_name(src: str | os.PathLike) -> str:
    """What ``created_by`` records as ``src``: the resolved path, or a URL without credentials."""
    from packer.remote.url import is_url, redact

    return redact(str(src)) if is_url(src) else str(Path(src).resolve())

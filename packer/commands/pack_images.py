"""Pack an image dataset into any packed format: the library call behind ``to-lmdb`` & co."""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packer.conversion.runner import Report, check_output_arg, run
from packer.errors import CorruptSample, UsageError
from packer.conversion.executors import make_executor
from packer.conversion.parallel_write import choose_plan, job_for, make_pack_executor
from packer.formats import writer_class
from packer.formats.base import Sample
from packer.codecs.image import CHECK_MODES, probe
from packer.manifest import created_by
from packer.codecs.resize import ResizeSpec, resize_image, resize_pixels
from packer.conversion.inputs import Item, image_items, partition

__all__ = ["ImageJob", "pack_images", "read_item_bytes"]

log = logging.getLogger(__name__)

_EXT_FMT = {"jpg": "jpeg", "jpeg": "jpeg", "png": "png", "webp": "webp", "bmp": "bmp"}


def read_item_bytes(item: Item) -> bytes:
    """Read an input file; an unreadable file is a ``CorruptSample`` at stage ``read``."""
    try:
        with open(item.path, "rb") as f:
            return f.read()
    except OSError as e:
        raise CorruptSample(item.key, item.path, f"cannot read file ({e.strerror or e})", stage="read") from None


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
        data = read_item_bytes(item)
        if self.raw:
            arr = resize_pixels(data, self.resize, key=item.key, source=item.path)
            return Sample(item.key, arr.tobytes(), "raw", item.label, arr.shape[0], arr.shape[1], arr.shape[2])
        if self.resize is not None:
            r = resize_image(data, self.resize, key=item.key, source=item.path)
            return Sample(item.key, r.data, r.fmt, item.label, r.height, r.width, r.channels)
        ext = item.key.rsplit(".", 1)[-1].lower()
        info = probe(data, check=self.check, key=item.key, source=item.path, ext_fmt=_EXT_FMT.get(ext))
        return Sample(item.key, data, info.fmt, item.label, info.height, info.width, info.channels)


def pack_images(src: str | os.PathLike, out: str | os.PathLike, *, format: str = "lmdb",
                list_path: str | os.PathLike | None = None, exts: str | None = None,
                workers: int | None = None, check: str = "full", max_failures: int = 0,
                resume: bool = False, overwrite: bool = False, num_shards: int = 1,
                shard_index: int = 0, executor: str = "local",
                writer_options: dict[str, Any] | None = None, resize: ResizeSpec | None = None,
                raw: bool = False) -> Report:
    """Pack the images under ``src`` (ImageFolder, or ``list_path`` lines) into ``out``.

    Bad images are skipped and recorded in ``failures.jsonl``; see ``convert.run``.
    ``resize`` resizes every image while packing (recorded in the manifest's ``created_by``);
    ``raw`` (HDF5 only, needs ``resize.size``) stores fixed-size decoded pixels.
    Arguments are validated before any work starts.
    """
    if check not in CHECK_MODES:
        raise UsageError(f"--check must be one of {', '.join(CHECK_MODES)}")
    if max_failures < 0:
        raise UsageError("--max-failures must be >= 0")
    writer_cls = writer_class(format)
    writer_options = dict(writer_options or {})
    if raw:
        if format != "hdf5":
            raise UsageError(f"--raw (decoded pixels) is for hdf5 output, not {format}")
        if resize is None or resize.size is None:
            raise UsageError("--raw needs --size WIDTHxHEIGHT (every stored image has one shape)")
        if resize.format != "keep":
            raise UsageError("--format does not apply to --raw (pixels are stored decoded)")
        writer_options["pixels_shape"] = (resize.size[1], resize.size[0], 3)
    check_output_arg(out, resume=resume, overwrite=overwrite)
    items, classes = image_items(src, list_path=list_path, exts=exts)
    if not items:
        raise UsageError(f"{src}: no input images found")
    items = partition(items, num_shards, shard_index)  # may be empty: an empty part still merges
    options = {"format": format, "check": check, "src": str(Path(src).resolve()),
               "list": str(list_path) if list_path else None, "num_shards": num_shards,
               "shard_index": shard_index}
    if resize is not None:
        options["resize"] = resize.to_dict()
    if raw:
        options["raw"] = True
    writer = writer_cls(out, classes=classes, created_by=created_by(options), **writer_options)
    job = ImageJob(check=check, resize=resize, raw=raw)
    if workers is not None and workers < 0:
        raise UsageError("--workers must be >= 0")
    plan = choose_plan(format=format, check=check, workers=workers, resizing=resize is not None or raw,
                       executor=executor, fixed_layout=getattr(writer, "samples_per_shard", None) is not None)
    log.info("to-%s: %s (%s)", format, plan.mode, plan.why)
    ex = make_executor(executor, workers=workers) if plan.mode == "pool" else make_pack_executor(plan, writer)
    with ex:
        return run(items, job_for(plan, job, writer_cls), writer, executor=ex, max_failures=max_failures,
                   resume=resume, overwrite=overwrite, desc=f"to-{format}")

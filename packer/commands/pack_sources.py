"""Pack a dataset source: WebDataset tar shards, a Hugging Face ``save_to_disk`` folder or
Parquet files (``packer.conversion.sources``), the library call behind ``to-lmdb SRC OUT`` when
SRC is one of those.

The source is listed once (its items hold where each sample's bytes are, never the bytes), then
packed by the command its samples call for: ``pack_images`` for a plain image pack (an image
and a label: a ``.cls`` member, a class folder in the member names, a ``ClassLabel`` column),
``pack_fields`` for anything with more fields (a caption, a JSON, an array). Both run the one
run loop (``packer.conversion.runner``), so failures, ``--resume``, split runs, resizing, the
claim and a URL OUT work as for a folder.
"""
from __future__ import annotations

import os
from typing import Any

from packer.claim import Claim
from packer.codecs.resize import ResizeSpec
from packer.commands.pack_fields import pack_fields
from packer.commands.pack_images import pack_images
from packer.conversion.inputs import parse_exts
from packer.conversion.options import InputOptions, RunOptions
from packer.conversion.runner import Report, check_output_arg
from packer.conversion.sources import close_sources, list_source
from packer.errors import UsageError

__all__ = ["pack_source"]


def pack_source(src: str | os.PathLike, out: str | os.PathLike, *, kind: str, format: str = "lmdb",
                check: str = "full", resize: ResizeSpec | None = None, raw: bool = False, shuffle: int | None = None,
                writer_options: dict[str, Any] | None = None, input_options: InputOptions = InputOptions(),
                run_options: RunOptions = RunOptions(), claim: Claim | None = None,
                append_to: str | os.PathLike | None = None) -> Report:
    """Pack the ``kind`` source ``src`` (``wds``, ``hf`` or ``parquet``) into ``out``; the
    options as ``pack_images`` takes them (``input_options.class_index`` numbers the labels,
    ``exts`` says which members are images; ``append_to``: a split append)."""
    if input_options.list_path is not None or input_options.csv_path is not None:
        raise UsageError(f"--list and --csv do not apply to a {kind} source")
    if not run_options.append:  # (an append continues OUT: pack_images checks it)
        check_output_arg(out, resume=run_options.resume, overwrite=run_options.overwrite)
    try:
        listing = list_source(src, kind, exts=parse_exts(input_options.exts), class_index=input_options.class_index,
                              failures=[])
        common = dict(format=format, check=check, resize=resize, writer_options=writer_options,
                      input_options=input_options, run_options=run_options, claim=claim, listing=listing)
        if listing.schema is None:
            return pack_images(src, out, raw=raw, shuffle=shuffle, append_to=append_to, **common)
        if raw or shuffle is not None:
            raise UsageError(f"raw and shuffle apply to plain image packs; this {kind} source has the fields "
                             f"{', '.join(listing.schema.names)}")
        report = pack_fields(src, out, append_to=append_to, **common)
        report.labels = listing.note
        return report
    finally:
        close_sources()

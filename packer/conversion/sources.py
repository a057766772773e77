"""Which kind of source a pack's SRC is, and its listing: a class-folder tree (or a list file's
root), WebDataset tar shards, a Hugging Face ``save_to_disk`` folder or Parquet files.

``detect_source(src)`` decides from the path alone (nothing is read but folder entries):

* ``wds``: a brace pattern or glob of ``.tar`` files, a ``.tar`` file, a URL ending in ``.tar``
  (or holding a brace pattern), or a folder whose visible entries are ``.tar`` files;
* ``hf``: a folder holding ``state.json`` and ``dataset_info.json`` (``Dataset.save_to_disk``),
  or ``dataset_dict.json`` (refused later, naming the splits to choose from);
* ``parquet``: a ``.parquet`` file, a glob of them, or a folder whose visible entries are
  ``.parquet`` files;
* ``folder``: anything else (an ImageFolder tree, or the root of a ``--list``).

``source_format=`` (``--source-format``) forces one. ``list_source`` lists a ``wds``, ``hf`` or
``parquet`` source through ``packer.conversion.shards`` or ``packer.conversion.arrow``.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

from packer.conversion.input_failures import InputFailure
from packer.conversion.inputs import SourceListing
from packer.conversion.options import SOURCE_FORMATS
from packer.errors import UsageError

__all__ = ["SOURCE_FORMATS", "detect_source", "list_source", "source_paths", "close_sources"]


def _entries(path: Path) -> list[Path]:
    try:
        return [p for p in path.iterdir() if not p.name.startswith(".")]
    except OSError:
        return []


def detect_source(src: str | os.PathLike, source_format: str | None = None) -> str:
    """The kind of ``src`` (see the module doc), or ``source_format`` checked."""
    if source_format is not None:
        if source_format not in SOURCE_FORMATS:
            raise UsageError(f"--source-format must be one of {', '.join(SOURCE_FORMATS)}, not {source_format!r}")
        return source_format
    from packer.remote.url import is_url

    text = os.fspath(src)
    name = text.split("?", 1)[0].lower()
    if is_url(text):
        return "wds" if name.endswith(".tar") or "{" in name else "folder"
    if "{" in text and name.endswith(".tar"):
        return "wds"
    if any(c in text for c in "*?["):
        if name.endswith(".tar"):
            return "wds"
        if name.endswith(".parquet"):
            return "parquet"
    path = Path(text)
    if path.is_file():
        if name.endswith(".tar"):
            return "wds"
        if name.endswith(".parquet"):
            return "parquet"
        return "folder"
    if path.is_dir():
        if (path / "state.json").is_file() and (path / "dataset_info.json").is_file() \
                or (path / "dataset_dict.json").is_file():
            return "hf"
        entries = _entries(path)
        if entries and all(p.is_file() for p in entries):
            suffixes = {p.suffix.lower() for p in entries}
            if ".tar" in suffixes and suffixes <= {".tar", ".json", ".txt", ".idx"}:
                return "wds"
            if ".parquet" in suffixes and suffixes <= {".parquet", ".json", ".txt", ".md"}:
                return "parquet"
    return "folder"


def source_paths(src: str | os.PathLike, kind: str) -> dict[str, list]:
    """``check_placement``'s inputs of a ``kind`` source: a folder is walked (no output may be,
    hold or lie in it); the files of a pattern are read (no output may be or hold one)."""
    from packer.remote.url import is_url

    text = os.fspath(src)
    if is_url(text):
        return {"walked": [], "read": []}
    if Path(text).is_dir():
        return {"walked": [text], "read": []}
    if kind == "wds" and "{" in text:
        from packer.conversion.shards import expand_shards

        return {"walked": [], "read": expand_shards(text)}
    if any(c in text for c in "*?["):
        import glob

        return {"walked": [], "read": sorted(glob.glob(text))}
    return {"walked": [], "read": [text]}


def list_source(src: str | os.PathLike, kind: str, *, exts: Sequence[str],
                class_index: str | os.PathLike | None = None,
                failures: list[InputFailure] | None = None) -> SourceListing:
    """The items of a ``wds``, ``hf`` or ``parquet`` source (unusable entries to ``failures``)."""
    if kind == "wds":
        from packer.conversion.shards import shard_items

        return shard_items(src, exts=exts, class_index=class_index, failures=failures)
    if kind in ("hf", "parquet"):
        from packer.conversion.arrow import table_source

        return table_source(src, kind, class_index=class_index, failures=failures)
    raise UsageError(f"{src}: a {kind} source is not listed here")


def close_sources() -> None:
    """Close the shards and drop the row batches this process holds open (the end of a run)."""
    import sys

    for name, fn in (("packer.conversion.shards", "close_shards"), ("packer.conversion.arrow", "close_tables")):
        module = sys.modules.get(name)
        if module is not None:
            getattr(module, fn)()

"""records format: TFRecord files written by other tools (no ``packer.json``), read through
the ``.idx`` indexes ``packer index`` writes beside them."""
from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np

from packer.codecs.tfrecord import INDEX_SUFFIX, index_path, looks_like_tfrecord, read_index, tfrecord_candidates
from packer.errors import FormatError
from packer.formats.records.layout import join_index
from packer.manifest import Manifest

if TYPE_CHECKING:
    from packer.formats.records.reader import RecordsReader

__all__ = ["foreign_files", "foreign_manifest", "has_tfrecords", "ForeignKeys"]


def foreign_files(path: Path) -> list[Path]:
    """The TFRecord files of a folder (or the file itself) that has no ``packer.json``."""
    if path.is_file():
        files = [path]
    else:
        files = [f for f in tfrecord_candidates(path) if index_path(f).is_file() or looks_like_tfrecord(f)]
    if not files:
        raise FormatError(f"{path}: no TFRecord files with {INDEX_SUFFIX} indexes here")
    return files


def has_tfrecords(path: Path) -> bool:
    """A folder or file of TFRecords (indexed, or starting with a valid record header)."""
    if path.is_file():
        return looks_like_tfrecord(path)
    return path.is_dir() and any(index_path(f).is_file() or looks_like_tfrecord(f) for f in tfrecord_candidates(path))


def foreign_manifest(files: Sequence[Path], root: Path) -> tuple[Manifest, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """The manifest a packer output would have for ``files`` (names relative to ``root``), and
    their joined index; FormatError naming a file that has no ``.idx``."""
    shards, offsets, sizes = [], [], []
    for f in files:
        idx = index_path(f)
        if not idx.is_file():
            raise FormatError(f"{f}: no index {idx.name} (write one with `packer index {f}`)")
        o, s = read_index(idx)
        offsets.append(o)
        sizes.append(s)
        shards.append({"file": os.path.relpath(f, root), "index": os.path.relpath(idx, root),
                       "count": len(o), "bytes": f.stat().st_size})
    return (Manifest(format="records", count=sum(s["count"] for s in shards), shards=shards,
                     created_by={"foreign": True}), join_index(offsets, sizes))


class ForeignKeys(Sequence[str]):
    """Keys of foreign records, read on demand: ``image/filename``, else ``{file}:{record}``."""

    def __init__(self, reader: "RecordsReader"):
        self._reader = reader

    def __len__(self) -> int:
        return len(self._reader)

    def __getitem__(self, index):  # type: ignore[override]
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        name = self._reader.read_features(index).get("image/filename")
        if name and isinstance(name[0], bytes):
            return name[0].decode("utf-8", "replace")
        k, local = self._reader.locate(index)
        return f"{self._reader.manifest.shards[k]['file']}:{local}"

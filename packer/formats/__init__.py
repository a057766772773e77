"""Packed formats: one package per format, each a Writer + Reader pair, chosen by name.

``FORMATS`` is the one name -> (Writer, Reader) table; a packed output's manifest names
its format, so a reader needs nothing but the path. Classes are named by dotted path and
imported on first use, and the reading functions here (``open_reader``, ``detect_format``)
import only readers: a training process never loads the writing side of any format.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator, Mapping

from packer.errors import FormatError
from packer.manifest import MANIFEST_NAME, Manifest
from packer.formats.lazy import lazy_exports, resolve
from packer.formats.reader import Reader
from packer.formats.sample import Record, Sample

__all__ = ["FORMATS", "VIDEO_FORMATS", "VIDEO_FILE_FORMATS", "Sample", "Record", "Writer", "Reader", "writer_class",
           "open_reader", "detect_format"]


class FormatTable(Mapping[str, tuple]):
    """name -> (Writer class, Reader class), each imported when first looked up.

    ``table[name]`` gives the pair (importing both); ``reader(name)``/``writer(name)`` import
    one side only.
    """

    def __init__(self, entries: dict[str, tuple[str, str]]):
        self._entries = dict(entries)

    def __getitem__(self, name: str) -> tuple[type, type[Reader]]:
        return (self.writer(name), self.reader(name))

    def __contains__(self, name: object) -> bool:  # Mapping's default would import both classes
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def writer(self, name: str) -> type:
        """The Writer class of ``name`` (KeyError if unknown)."""
        return resolve(self._entries[name][0])

    def reader(self, name: str) -> type[Reader]:
        """The Reader class of ``name`` (KeyError if unknown)."""
        return resolve(self._entries[name][1])

    def __repr__(self) -> str:
        return f"FormatTable({list(self._entries)})"


FORMATS = FormatTable({
    "lmdb": ("packer.formats.lmdb.writer:LmdbWriter", "packer.formats.lmdb.reader:LmdbReader"),
    "records": ("packer.formats.records.writer:RecordsWriter", "packer.formats.records.reader:RecordsReader"),
    "hdf5": ("packer.formats.hdf5.writer:HDF5Writer", "packer.formats.hdf5.reader:HDF5Reader"),
})

# Outputs that hold video frames only (``decode-frames``' frame folders): opened by path like
# any format, but no target for packing images, so they stay out of FORMATS.
VIDEO_FORMATS = FormatTable({
    "frames": ("packer.formats.frames.writer:FramesWriter", "packer.formats.frames.reader:FramesReader"),
})

# Outputs of whole plain video files (``pack-videos --to files``): opened by path like any format,
# but neither a target for images nor one for decode-frames' frames.
VIDEO_FILE_FORMATS = FormatTable({
    "files": ("packer.formats.videofiles.writer:VideoFilesWriter",
              "packer.formats.videofiles.reader:VideoFilesReader"),
})


def _reader_class(name: str) -> type[Reader]:
    table = FORMATS if name in FORMATS else VIDEO_FORMATS if name in VIDEO_FORMATS else VIDEO_FILE_FORMATS
    return table.reader(name)


def writer_class(name: str) -> type:
    """The Writer class of format ``name``."""
    try:
        return FORMATS.writer(name)
    except KeyError:
        raise FormatError(f"unknown format {name!r} (known: {', '.join(sorted(FORMATS))})") from None


def detect_format(path: str | os.PathLike) -> str:
    """The format name of a packed output, from its manifest (or the file itself)."""
    path = Path(path)
    if not path.exists():
        raise FormatError(f"{path}: does not exist")
    if path.is_dir() and (path / MANIFEST_NAME).exists():
        name = Manifest.load(path).format
        if name not in FORMATS and name not in VIDEO_FORMATS and name not in VIDEO_FILE_FORMATS:
            raise FormatError(f"{path}: manifest names unknown format {name!r}")
        return name
    for name in FORMATS:
        if FORMATS.reader(name).detect(path):
            return name
    raise FormatError(f"{path}: not a packed dataset (no {MANIFEST_NAME}, format not recognised)")


def open_reader(path: str | os.PathLike | list | tuple, *, check_crc: bool = True) -> Reader:
    """Open a local packed output by path; the manifest chooses the reader.

    A list of paths is a set of TFRecord files written by other tools (with ``.idx`` indexes).
    URLs are opened by ``packer.remote.open_reader``, which calls this for local paths.
    """
    if isinstance(path, (list, tuple)):
        return FORMATS.reader("records")(path, check_crc=check_crc)
    return _reader_class(detect_format(path))(path, check_crc=check_crc)


__getattr__ = lazy_exports(__name__, {"Writer": "packer.formats.writer"})  # the base writer

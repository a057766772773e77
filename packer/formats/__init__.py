"""Packed formats: one module per format, each a Writer + Reader pair, chosen by name.

``FORMATS`` is the one name -> (Writer, Reader) table; a packed output's manifest names
its format, so a reader needs nothing but the path.
"""
from __future__ import annotations

import os
from pathlib import Path

from packer.errors import FormatError
from packer.manifest import MANIFEST_NAME, Manifest
from packer.formats.base import Reader, Record, Sample, Writer
from packer.formats.frames import FramesReader, FramesWriter
from packer.formats.hdf5 import HDF5Reader, HDF5Writer
from packer.formats.lmdb import LmdbReader, LmdbWriter
from packer.formats.records import RecordsReader, RecordsWriter

__all__ = ["FORMATS", "VIDEO_FORMATS", "Sample", "Record", "Writer", "Reader", "writer_class",
           "open_reader", "detect_format"]

FORMATS: dict[str, tuple[type[Writer], type[Reader]]] = {
    "lmdb": (LmdbWriter, LmdbReader),
    "records": (RecordsWriter, RecordsReader),
    "hdf5": (HDF5Writer, HDF5Reader),
}

# Outputs that hold video frames only (``decode-frames``' frame folders): opened by path like
# any format, but no target for packing images, so they stay out of FORMATS.
VIDEO_FORMATS: dict[str, tuple[type[Writer], type[Reader]]] = {
    "frames": (FramesWriter, FramesReader),
}


def _known() -> dict[str, tuple[type[Writer], type[Reader]]]:
    return {**FORMATS, **VIDEO_FORMATS}


def writer_class(name: str) -> type[Writer]:
    """The Writer class of format ``name``."""
    try:
        return FORMATS[name][0]
    except KeyError:
        raise FormatError(f"unknown format {name!r} (known: {', '.join(sorted(FORMATS))})") from None


def detect_format(path: str | os.PathLike) -> str:
    """The format name of a packed output, from its manifest (or the file itself)."""
    path = Path(path)
    if not path.exists():
        raise FormatError(f"{path}: does not exist")
    if path.is_dir() and (path / MANIFEST_NAME).exists():
        name = Manifest.load(path).format
        if name not in _known():
            raise FormatError(f"{path}: manifest names unknown format {name!r}")
        return name
    for name, (_, reader) in FORMATS.items():
        if reader.detect(path):
            return name
    raise FormatError(f"{path}: not a packed dataset (no {MANIFEST_NAME}, format not recognised)")


def open_reader(path: str | os.PathLike | list | tuple, *, check_crc: bool = True) -> Reader:
    """Open any packed output by path; the manifest chooses the reader.

    A list of paths is a set of TFRecord files written by other tools (with ``.idx`` indexes).
    """
    if isinstance(path, (list, tuple)):
        return FORMATS["records"][1](path, check_crc=check_crc)
    return _known()[detect_format(path)][1](path, check_crc=check_crc)

"""Packed formats: one package per format, each a Writer + Reader pair, chosen by name.

``FORMATS`` is the one name -> (Writer, Reader) table of image targets (``VIDEO_FORMATS`` and
``VIDEO_FILE_FORMATS`` hold the video-only outputs); each entry names a format package whose
``FORMAT`` (``spec.FormatSpec``) says what the format is made of. A packed output's manifest
names its format, so a reader needs nothing but the path. Classes are named by dotted path and
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
from packer.formats.spec import FormatSpec, ShardFiles

__all__ = ["FORMATS", "VIDEO_FORMATS", "VIDEO_FILE_FORMATS", "TABLES", "FormatSpec", "ShardFiles", "Sample",
           "Record", "Writer", "Reader", "writer_class", "format_spec", "format_specs", "single_file_spec",
           "open_reader", "detect_format"]


class FormatTable(Mapping[str, tuple]):
    """name -> (Writer class, Reader class), each imported when first looked up.

    Each entry names the package whose ``FORMAT`` (a ``FormatSpec``) describes the format;
    ``spec(name)`` gives it (importing the package only), ``table[name]`` the class pair
    (importing both), ``reader(name)``/``writer(name)`` one side only.
    """

    def __init__(self, entries: dict[str, str]):
        self._entries = dict(entries)

    def __getitem__(self, name: str) -> tuple[type, type[Reader]]:
        return (self.writer(name), self.reader(name))

    def __contains__(self, name: object) -> bool:  # Mapping's default would import both classes
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def spec(self, name: str) -> FormatSpec:
        """What format ``name`` declares (KeyError if unknown)."""
        spec = resolve(f"{self._entries[name]}:FORMAT")
        if spec.name != name:
            raise FormatError(f"{self._entries[name]}.FORMAT is {spec.name!r}, registered as {name!r}")
        return spec

    def writer(self, name: str) -> type:
        """The Writer class of ``name`` (KeyError if unknown)."""
        return resolve(self.spec(name).writer)

    def reader(self, name: str) -> type[Reader]:
        """The Reader class of ``name`` (KeyError if unknown)."""
        return resolve(self.spec(name).reader)

    def __repr__(self) -> str:
        return f"FormatTable({list(self._entries)})"


# A new format is its package (with FORMAT in its __init__.py) plus one line in one of these.
FORMATS = FormatTable({
    "lmdb": "packer.formats.lmdb",
    "hdf5": "packer.formats.hdf5",
    "records": "packer.formats.records",
})

# Outputs that hold video frames only (``decode-frames``' frame folders): opened by path like
# any format, but no target for packing images, so they stay out of FORMATS.
VIDEO_FORMATS = FormatTable({
    "frames": "packer.formats.frames",
})

# Outputs of whole plain video files (``pack-videos --to files``): opened by path like any format,
# but neither a target for images nor one for decode-frames' frames.
VIDEO_FILE_FORMATS = FormatTable({
    "files": "packer.formats.videofiles",
})

TABLES = (FORMATS, VIDEO_FORMATS, VIDEO_FILE_FORMATS)


def format_spec(name: str) -> FormatSpec:
    """What the registered format ``name`` (of any table) declares."""
    for table in TABLES:
        if name in table:
            return table.spec(name)
    raise FormatError(f"unknown format {name!r} (known: {', '.join(n for t in TABLES for n in t)})")


def format_specs() -> list[FormatSpec]:
    """Every registered format's spec, in registration order (imports each format package)."""
    return [table.spec(name) for table in TABLES for name in table]


def single_file_spec(name: str) -> FormatSpec | None:
    """The single-file format whose outputs end like file (or URL) ``name``, if any."""
    return next((s for s in format_specs() if s.names_file(name)), None)


def _reader_class(name: str) -> type[Reader]:
    return resolve(format_spec(name).reader)


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
        if not any(name in table for table in TABLES):
            raise FormatError(f"{path}: manifest names unknown format {name!r}")
        return name
    for name in FORMATS:
        if FORMATS.reader(name).detect(path):
            return name
    raise FormatError(f"{path}: not a packed dataset (no {MANIFEST_NAME}, format not recognised)")


def open_reader(path: str | os.PathLike | list | tuple, *, check_crc: bool = True,
                version: int | None = None) -> Reader:
    """Open a local packed output by path; the manifest chooses the reader.

    A list of paths is a set of TFRecord files written by other tools (with ``.idx`` indexes).
    URLs are opened by ``packer.remote.open_reader``, which calls this for local paths.
    ``version``: of an output that was appended to, the version to read (None: the latest;
    docs/append.md).
    """
    more = {} if version is None else {"version": version}
    if isinstance(path, (list, tuple)):
        return FORMATS.reader("records")(path, check_crc=check_crc, **more)
    name = detect_format(path)
    return _reader_class(name)(path, check_crc=check_crc, **more)


__getattr__ = lazy_exports(__name__, {"Writer": "packer.formats.writer"})  # the base writer

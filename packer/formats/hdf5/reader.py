"""HDF5 format, reading: one positioned read per sample, CRC-checked, no chunk cache."""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import h5py
import numpy as np

from packer.codecs.fields import BLOB_FMT, encode_blob
from packer.codecs.image import sniff_format
from packer.errors import CorruptData, FormatError, OutputChanged
from packer.formats.hdf5.columns import FIELDS_GROUP, FieldColumns, chunk_table, read_rows
from packer.formats.hdf5.layout import H5_ERRORS, HDF5_SUFFIXES, MANIFEST_ATTR, has_signature
from packer.formats.reader import Reader
from packer.formats.sample import Record
from packer.formats.sidecars import array_checksum
from packer.manifest import Manifest

__all__ = ["HDF5Reader"]


_OPEN_LOCK = threading.Lock()


@dataclass
class _Open:
    """This process's open file, the small per-sample tables (loaded once) and, for direct
    positioned reads, a plain file descriptor and the data chunks' file offsets. A field pack
    has ``columns`` (its dataset per field) and no ``data``."""

    file: h5py.File
    data: h5py.Dataset | None
    labels: np.ndarray
    crcs: np.ndarray
    offsets: np.ndarray | None
    shapes: np.ndarray | None
    fd: int = -1
    chunk_offsets: np.ndarray | None = None
    columns: FieldColumns | None = None

    def __post_init__(self) -> None:  # h5py property lookups cost microseconds: ask once
        self.shape = tuple(self.data.shape) if self.data is not None else ()
        self.chunk_len = self.data.chunks[0] if self.data is not None and self.data.chunks else 0
        self.sample_bytes = int(np.prod(self.shape[1:]))

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        self.file.close()

    def read_bytes(self, index: int, start: int, end: int) -> bytes:
        """The stored bytes of a sample: ``pixels[index]``, or ``blobs[start:end]``."""
        if self.chunk_offsets is None:  # through HDF5
            return (self.data[index] if self.offsets is None else self.data[start:end]).tobytes()
        if self.offsets is None:  # one chunk per sample: one positioned read
            return self._pread(self.sample_bytes, int(self.chunk_offsets[index]))
        # one positioned read, two where a sample crosses a chunk boundary
        return read_rows(self.fd, self.chunk_offsets, self.chunk_len, start, end)

    def _pread(self, n: int, at: int) -> bytes:
        data = os.pread(self.fd, n, at)
        if len(data) != n:
            raise ValueError(f"short read: {len(data)} of {n} bytes at file offset {at} (file truncated?)")
        return data


class HDF5Reader(Reader):
    """Random access to a packer ``.h5`` file (encoded or raw)."""

    format_name = "hdf5"

    def __init__(self, path: str | os.PathLike, *, check_crc: bool = True):
        self._h: _Open | None = None
        super().__init__(path, check_crc=check_crc)

    @classmethod
    def detect(cls, path: Path) -> bool:
        return path.is_file() and (path.suffix.lower() in HDF5_SUFFIXES or has_signature(path))

    def _load_manifest(self) -> Manifest:
        if not has_signature(self.path):
            raise CorruptData(str(self.path), "not an HDF5 file (no HDF5 signature)")
        try:
            with h5py.File(self.path, "r") as f:
                text = f.attrs.get(MANIFEST_ATTR)
        except H5_ERRORS as e:
            raise CorruptData(str(self.path), f"cannot open HDF5 file ({e})") from e
        if text is None:
            raise FormatError(f"{self.path}: HDF5 file without a {MANIFEST_ATTR!r} attribute "
                              "(not a finished packer output)")
        if isinstance(text, bytes):
            text = text.decode("utf-8", "replace")
        return Manifest.from_json(str(text), f"{self.path}:{MANIFEST_ATTR}")

    # -- per-process state ------------------------------------------------------------------
    def _open(self) -> _Open:
        h, pid = self._h, os.getpid()
        if h is not None and self._pid == pid:
            return h
        with _OPEN_LOCK:  # packer.Loader's threads share one reader: open once
            return self._open_locked(pid)

    def _open_locked(self, pid: int) -> _Open:
        if self._h is not None and self._pid == pid:
            return self._h
        if self._h is not None and self._h.fd >= 0:  # inherited across fork: drop the parent's
            os.close(self._h.fd)  # (this process's copy of the descriptor only)
        self._h = None
        columns, f, schema = None, None, self.schema
        try:
            f = h5py.File(self.path, "r", rdcc_nbytes=0)
            raw = "pixels" in f
            n = len(self)
            labels = f["labels"][:]
            crcs = f["crc32c"][:]
            shapes = None if raw else f["shapes"][:]
            fields = FIELDS_GROUP in f
            if schema is not None and fields:  # a field pack: a dataset per field
                columns = FieldColumns(f, schema, n)
                offsets = data = None
            elif schema is None and not fields:
                offsets = None if raw else f["offsets"][:]
                data = f["pixels"] if raw else f["blobs"]
        except H5_ERRORS as e:
            if f is not None:
                f.close()
            self._check_unchanged()  # gone because the output was replaced: say so
            raise CorruptData(str(self.path), f"cannot read HDF5 datasets ({e})") from e
        if (schema is not None) != fields:
            f.close()
            raise FormatError(f"{self.path}: the manifest {'has' if schema is not None else 'has no'} field "
                              f"schema, the file {'has' if fields else 'has no'} '{FIELDS_GROUP}' datasets "
                              "(a field pack of a development version of packer kept one blob per sample: "
                              "pack it again)")
        for name, arr, want in (("labels", labels, n), ("crc32c", crcs, n),
                                ("offsets", offsets, n + 1), ("shapes", shapes, n)):
            if arr is not None and arr.shape[0] != want:
                f.close()
                raise CorruptData(str(self.path), f"dataset {name!r} holds {arr.shape[0]} entries, "
                                                  f"expected {want} (manifest count {n})")
        if raw and data.shape[0] != n:
            f.close()
            raise CorruptData(str(self.path), f"dataset 'pixels' holds {data.shape[0]} samples, manifest says {n}")
        try:  # the label and shape arrays live outside the CRC'd sample bytes: one pass over each
            self._check_integrity("labels", array_checksum(labels, "<i8"), f"{self.path}:labels")
            if shapes is not None:
                self._check_integrity("shapes", array_checksum(shapes, "<u4"), f"{self.path}:shapes")
        except CorruptData:
            f.close()
            raise
        h = _Open(f, data, labels, crcs, offsets, shapes, columns=columns)
        if columns is not None:
            table = None
            if columns.direct:
                h.fd = os.open(self.path, os.O_RDONLY)
        elif raw and data.chunks != (1,) + data.shape[1:]:
            table = None  # several samples per chunk: read through HDF5
        else:
            table = chunk_table(data)
        if table is not None:
            h.fd, h.chunk_offsets = os.open(self.path, os.O_RDONLY), table
        try:  # both handles opened the file the manifest came from, not an --overwrite's new one
            self._check_unchanged()
        except OutputChanged:
            h.close()
            raise
        self._h = h
        self._pid = pid
        return h

    def _handle_attrs(self) -> tuple[str, ...]:
        return ("_h",)

    def close(self) -> None:
        if self._h is not None and self._pid == os.getpid():
            self._h.close()
        self._h = None

    # -- reading ------------------------------------------------------------------------------
    def _keys_source(self) -> str:
        return f"{self.path}:keys"

    def _load_keys(self) -> Sequence[str]:
        """The ``keys`` dataset (the file stores its keys itself)."""
        try:
            with h5py.File(self.path, "r") as f:
                keys = list(f["keys"].asstr()[:])
        except H5_ERRORS as e:
            raise CorruptData(str(self.path), f"cannot read keys ({e})") from e
        if len(keys) != len(self):
            raise CorruptData(str(self.path), f"holds {len(keys)} keys, manifest says {len(self)}")
        return keys

    def read(self, index: int) -> Record:
        index = self._check_index(index)
        h = self._open()
        try:
            if h.columns is not None:
                data = encode_blob(h.columns.read(index, h.fd))
                height, width, channels = (int(v) for v in h.shapes[index])
                fmt = BLOB_FMT
            elif h.offsets is None:
                data = h.read_bytes(index, 0, 0)
                height, width, channels = h.shape[1:]
                fmt = "raw"
            else:
                start, end = int(h.offsets[index]), int(h.offsets[index + 1])
                if not 0 <= start <= end <= h.shape[0]:
                    raise CorruptData(str(self.path), f"offsets {start}..{end} outside the {h.shape[0]}-byte "
                                                      "blobs dataset", position=f"sample {index}",
                                      key=self._key_name(index))
                data = h.read_bytes(index, start, end)
                height, width, channels = (int(v) for v in h.shapes[index])
                fmt = sniff_format(data)
        except H5_ERRORS as e:
            raise CorruptData(str(self.path), f"HDF5 read failed ({e})", position=f"sample {index}",
                              key=self._key_name(index)) from e
        self._check_crc32c(data, index, file=self.path, expected=h.crcs[index])
        return Record(data, int(h.labels[index]), fmt, int(height), int(width), int(channels))

    def verify_structure(self) -> Iterator[CorruptData]:
        try:
            h = self._open()
            _ = self.keys
        except CorruptData as e:
            yield e
            return
        if h.columns is not None:
            for problem in h.columns.problems():
                yield CorruptData(str(self.path), problem)
        if h.offsets is not None:
            o = h.offsets
            if o[0] != 0 or np.any(np.diff(o) < 0) or o[-1] != h.data.shape[0]:
                yield CorruptData(str(self.path), "dataset 'offsets' is not a non-decreasing 0..len(blobs) index")
        videos = self.manifest.videos
        if videos:
            try:
                vo = h.file["video_offsets"][:]
            except H5_ERRORS as e:
                yield CorruptData(str(self.path), f"cannot read video_offsets ({e})")
                return
            want = [int(v["start"]) for v in videos[:1]] + [int(v["start"]) + int(v["length"]) for v in videos]
            if vo.tolist() != want:
                yield CorruptData(str(self.path), "dataset 'video_offsets' does not match the manifest's videos")

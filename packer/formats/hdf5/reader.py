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
from packer.errors import CorruptData, FormatError
from packer.formats.hdf5.columns import FIELDS_GROUP, FieldColumns, chunk_table, read_rows
from packer.formats.hdf5.layout import H5_ERRORS, HDF5_SUFFIXES, MANIFEST_ATTR, has_signature
from packer.formats.reader import Reader
from packer.formats.sample import Record
from packer.formats.sidecars import SOURCE_COLUMNS, array_checksum
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


class _Parts:
    """This process's open files of an output (one, or an appended output's parts in order) and
    the per-stored-position tables joined: labels, CRCs (``labels[p]`` is stored position ``p``'s)."""

    def __init__(self, parts: list[_Open]):
        self.parts = parts
        self.starts = np.cumsum([0] + [len(h.labels) for h in parts[:-1]], dtype=np.int64)
        self.one = parts[0] if len(parts) == 1 else None
        join = (lambda arrays: arrays[0] if len(arrays) == 1 else np.concatenate(arrays))
        self.labels = join([h.labels for h in parts])
        self.crcs = join([h.crcs for h in parts])

    def locate(self, position: int) -> tuple[_Open, int]:
        """The open part of stored position ``position`` and the position within it."""
        if self.one is not None:
            return self.one, position
        k = int(self.starts.searchsorted(position, side="right")) - 1
        return self.parts[k], position - int(self.starts[k])

    def close(self) -> None:
        for h in self.parts:
            h.close()


def _part_list(m: Manifest, head: Path) -> list[tuple[Path, int]] | None:
    """The part files (path, count) an appended output's ``parts`` names, beside ``head``; None
    when the file holds its samples itself. CorruptData for a name that leaves the folder."""
    if not m.parts:
        return None
    out = []
    for k, part in enumerate(m.parts):
        name, count = part.get("file") if isinstance(part, dict) else None, part.get("count") if isinstance(part, dict) else None
        if (not isinstance(name, str) or not name or os.path.isabs(name) or ".." in Path(name).parts
                or type(count) is not int or count < 0):
            raise CorruptData(f"{head}:{MANIFEST_ATTR}", f"parts[{k}] is not a file and count beside the head file")
        out.append((head.parent / name, count))
    return out


def _attr_text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class HDF5Reader(Reader):
    """Random access to a packer ``.h5`` file (encoded or raw).

    An output that was appended to is a *head* file (the manifest of every version, no data)
    whose ``parts`` are standard packer HDF5 files beside it, each holding the samples one
    version added (docs/append.md); the reader reads the stored positions through them.
    """

    format_name = "hdf5"

    def __init__(self, path: str | os.PathLike, *, check_crc: bool = True, version: int | None = None):
        self._h: _Parts | None = None
        self._parts: list[tuple[Path, int]] | None = None
        super().__init__(path, check_crc=check_crc, version=version)

    @classmethod
    def detect(cls, path: Path) -> bool:
        return path.is_file() and (path.suffix.lower() in HDF5_SUFFIXES or has_signature(path))

    @classmethod
    def files_beside(cls, path: Path) -> list[str]:
        """The part files an appended output's head names (none for a plain file)."""
        try:
            with h5py.File(path, "r") as f:
                text = _attr_text(f.attrs.get(MANIFEST_ATTR))
        except H5_ERRORS as e:
            raise CorruptData(str(path), f"cannot open HDF5 file ({e})") from e
        if text is None:
            return []
        parts = _part_list(Manifest.from_json(text, f"{path}:{MANIFEST_ATTR}"), Path(path)) or []
        return [p.relative_to(Path(path).parent).as_posix() for p, _ in parts]

    def _read_manifests(self, version: int | None) -> tuple[Manifest, Manifest]:
        """(the latest manifest, that of ``version``: the latest when None) in the file at ``path``."""
        if not has_signature(self.path):
            raise CorruptData(str(self.path), "not an HDF5 file (no HDF5 signature)")
        try:
            with h5py.File(self.path, "r") as f:
                text = _attr_text(f.attrs.get(MANIFEST_ATTR))
                latest = None if text is None else Manifest.from_json(text, f"{self.path}:{MANIFEST_ATTR}")
                old = None
                if latest is not None and version is not None and version != latest.version:
                    old = _attr_text(f.attrs.get(f"{MANIFEST_ATTR}_v{version}"))
        except H5_ERRORS as e:
            raise CorruptData(str(self.path), f"cannot open HDF5 file ({e})") from e
        if latest is None:
            raise FormatError(f"{self.path}: HDF5 file without a {MANIFEST_ATTR!r} attribute "
                              "(not a finished packer output)")
        if version is None or version == latest.version:
            return latest, latest
        if old is None or not 1 <= version < latest.version:
            raise FormatError(f"{self.path}: has no version {version} (versions 1..{latest.version})")
        m = Manifest.from_json(old, f"{self.path}:{MANIFEST_ATTR}_v{version}")
        if m.version != version:
            raise CorruptData(f"{self.path}:{MANIFEST_ATTR}_v{version}", f"holds version {m.version}, not {version}")
        return latest, m

    def _load_manifest(self) -> Manifest:
        latest, m = self._read_manifests(self.version_asked)
        self._parts = _part_list(latest, self.path)
        return m

    def _latest_manifest(self) -> Manifest:
        return self._read_manifests(None)[0]

    def manifest_text(self) -> str:
        """This version's manifest exactly as published: the head's attribute of it (a file
        never appended to: its own manifest attribute)."""
        try:
            with h5py.File(self.path, "r") as f:
                text = _attr_text(f.attrs.get(f"{MANIFEST_ATTR}_v{self.version}"))
                if text is None and not self.manifest.parts and self._parts is None:
                    text = _attr_text(f.attrs.get(MANIFEST_ATTR))
        except H5_ERRORS as e:
            raise CorruptData(str(self.path), f"cannot open HDF5 file ({e})") from e
        if text is None or Manifest.from_json(text, str(self.path)).identity() != self.manifest.identity():
            raise self._changed()
        return text

    def _followed(self, latest: Manifest) -> None:
        self._parts = _part_list(latest, self.path)  # the stored positions live in the parts now

    def _storage(self) -> list[tuple[Path, int]]:
        """The files that hold this version's stored positions, with their counts."""
        if self._parts is None:
            return [(self.path, self.manifest.physical)]
        used, total = [], 0
        for path, count in self._parts:
            if total >= self.manifest.physical:
                break
            used.append((path, count))
            total += count
        if total != self.manifest.physical:
            raise CorruptData(f"{self.path}:{MANIFEST_ATTR}", f"its parts hold {total} samples, not the "
                                                             f"{self.manifest.physical} stored at version {self.version}")
        return used

    # -- per-process state ------------------------------------------------------------------
    def _open(self) -> _Parts:
        h, pid = self._h, os.getpid()
        if h is not None and self._pid == pid:
            return h
        with _OPEN_LOCK:  # packer.Loader's threads share one reader: open once
            return self._open_locked(pid)

    def _open_locked(self, pid: int) -> _Parts:
        if self._h is not None and self._pid == pid:
            return self._h
        if self._h is not None:  # inherited across fork: drop the parent's descriptors
            for h in self._h.parts:  # (this process's copies only)
                if h.fd >= 0:
                    os.close(h.fd)
        self._h = None
        self._check_unchanged()  # an output appended to since: its samples are in the parts now
        parts: list[_Open] = []
        try:
            for path, count in self._storage():
                parts.append(self._open_part(path, count))
            opened = _Parts(parts)
            self._check_tables(opened)
            self._check_unchanged()  # every file opened is the output the manifest came from
        except BaseException:
            for h in parts:
                h.close()
            raise
        self._h = opened
        self._pid = pid
        return opened

    def _open_part(self, path: Path, n: int) -> _Open:
        """One file of the output, its tables loaded and checked against the ``n`` samples it holds."""
        columns, schema = None, self.schema
        try:
            f = h5py.File(path, "r", rdcc_nbytes=0)
        except H5_ERRORS as e:
            self._check_unchanged()  # gone because the output was replaced: say so
            raise CorruptData(str(path), f"cannot open HDF5 file ({e})") from e
        try:
            raw = "pixels" in f
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
            f.close()
            self._check_unchanged()  # gone because the output was replaced: say so
            raise CorruptData(str(path), f"cannot read HDF5 datasets ({e})") from e
        if (schema is not None) != fields:
            f.close()
            raise FormatError(f"{path}: the manifest {'has' if schema is not None else 'has no'} field "
                              f"schema, the file {'has' if fields else 'has no'} '{FIELDS_GROUP}' datasets "
                              "(a field pack of a development version of packer kept one blob per sample: "
                              "pack it again)")
        for name, arr, want in (("labels", labels, n), ("crc32c", crcs, n),
                                ("offsets", offsets, n + 1), ("shapes", shapes, n)):
            if arr is not None and arr.shape[0] != want:
                f.close()
                raise CorruptData(str(path), f"dataset {name!r} holds {arr.shape[0]} entries, "
                                             f"expected {want} (manifest count {n})")
        if raw and data.shape[0] != n:
            f.close()
            raise CorruptData(str(path), f"dataset 'pixels' holds {data.shape[0]} samples, manifest says {n}")
        h = _Open(f, data, labels, crcs, offsets, shapes, columns=columns)
        if columns is not None:
            table = None
            if columns.direct:
                h.fd = os.open(path, os.O_RDONLY)
        elif raw and data.chunks != (1,) + data.shape[1:]:
            table = None  # several samples per chunk: read through HDF5
        else:
            table = chunk_table(data)
        if table is not None:
            h.fd, h.chunk_offsets = os.open(path, os.O_RDONLY), table
        return h

    def _check_tables(self, opened: _Parts) -> None:
        """The label and shape arrays live outside the CRC'd sample bytes: one pass over each,
        this version's positions, against the manifest's ``integrity``."""
        chosen = None if self._select is None else self.positions()
        labels = opened.labels if chosen is None else opened.labels[chosen]
        self._check_integrity("labels", array_checksum(labels, "<i8"), f"{self.path}:labels")
        if all(h.shapes is not None for h in opened.parts):
            shapes = np.concatenate([h.shapes for h in opened.parts]) if len(opened.parts) > 1 else opened.parts[0].shapes
            self._check_integrity("shapes", array_checksum(shapes if chosen is None else shapes[chosen], "<u4"),
                                  f"{self.path}:shapes")

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
        """The ``keys`` datasets (the files store their keys themselves), by stored position."""
        self._check_unchanged()  # appended to since: the keys are in the parts now
        keys: list[str] = []
        for path, count in self._storage():
            try:
                with h5py.File(path, "r") as f:
                    part = list(f["keys"].asstr()[:])
            except H5_ERRORS as e:
                raise CorruptData(str(path), f"cannot read keys ({e})") from e
            if len(part) != count:
                raise CorruptData(str(path), f"holds {len(part)} keys, manifest says {count}")
            keys.extend(part)
        return keys

    def sources(self) -> np.ndarray | None:
        """The ``sources`` datasets (a part without one: -1 rows), by stored position."""
        self._check_unchanged()
        rows, found = [], False
        for path, count in self._storage():
            try:
                with h5py.File(path, "r") as f:
                    part = f["sources"][:] if "sources" in f else None
            except H5_ERRORS as e:
                raise CorruptData(str(path), f"cannot read the input table ({e})") from e
            if part is not None and part.shape != (count, SOURCE_COLUMNS):
                raise CorruptData(str(path), f"dataset 'sources' is {part.shape}, not {count} rows")
            found = found or part is not None
            rows.append(part if part is not None else np.full((count, SOURCE_COLUMNS), -1, dtype=np.int64))
        if not found:
            return None
        table = np.concatenate(rows).astype(np.int64, copy=False)
        self._check_integrity("sources", array_checksum(table, "<i8"), f"{self.path}:sources")
        return table

    def stored_tables(self) -> tuple[np.ndarray, np.ndarray | None]:
        """Labels and shapes (None for raw pixels) of every stored position (an append's
        manifest checks them over its selection)."""
        h = self._open()
        shapes = [p.shapes for p in h.parts]
        return h.labels, (None if any(s is None for s in shapes) else np.concatenate(shapes))

    def read(self, index: int) -> Record:
        index = self._check_index(index)
        h = self._open()
        part, local = h.locate(index)
        try:
            if part.columns is not None:
                data = encode_blob(part.columns.read(local, part.fd))
                height, width, channels = (int(v) for v in part.shapes[local])
                fmt = BLOB_FMT
            elif part.offsets is None:
                data = part.read_bytes(local, 0, 0)
                height, width, channels = part.shape[1:]
                fmt = "raw"
            else:
                start, end = int(part.offsets[local]), int(part.offsets[local + 1])
                if not 0 <= start <= end <= part.shape[0]:
                    raise CorruptData(str(self.path), f"offsets {start}..{end} outside the {part.shape[0]}-byte "
                                                      "blobs dataset", position=f"sample {index}",
                                      key=self._key_name(index))
                data = part.read_bytes(local, start, end)
                height, width, channels = (int(v) for v in part.shapes[local])
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
        for part, (path, _) in zip(h.parts, self._storage()):
            if part.columns is not None:
                for problem in part.columns.problems():
                    yield CorruptData(str(path), problem)
            if part.offsets is not None:
                o = part.offsets
                if o[0] != 0 or np.any(np.diff(o) < 0) or o[-1] != part.data.shape[0]:
                    yield CorruptData(str(path), "dataset 'offsets' is not a non-decreasing 0..len(blobs) index")
        videos = self.manifest.videos
        if videos and len(h.parts) > 1:  # appended: each part's videos, by stored position
            yield from self._verify_part_videos(h, videos)
        elif videos:
            try:
                vo = h.parts[0].file["video_offsets"][:]
            except H5_ERRORS as e:
                yield CorruptData(str(self.path), f"cannot read video_offsets ({e})")
                return
            want = [int(v["start"]) for v in videos[:1]] + [int(v["start"]) + int(v["length"]) for v in videos]
            if vo.tolist() != want:
                yield CorruptData(str(self.path), "dataset 'video_offsets' does not match the manifest's videos")

    def _verify_part_videos(self, h: Any, videos: list[dict[str, Any]]) -> Iterator[CorruptData]:
        """An appended output's videos: each one spans the stored positions of one video of a part
        file (its ``video_offsets``, counted from the part's first stored position)."""
        spans, first = set(), 0
        for part, (path, count) in zip(h.parts, self._storage()):
            try:
                vo = part.file["video_offsets"][:].tolist() if "video_offsets" in part.file else [0]
            except H5_ERRORS as e:
                yield CorruptData(str(path), f"cannot read video_offsets ({e})")
                return
            spans.update((first + a, first + b) for a, b in zip(vo[:-1], vo[1:]))
            first += count
        positions = self.positions()
        for v in videos:
            a, n = int(v["start"]), int(v["length"])
            if n < 1 or a < 0 or a + n > len(positions) or \
                    (int(positions[a]), int(positions[a + n - 1]) + 1) not in spans:
                yield CorruptData(str(self.path), f"video {v.get('key')!r} does not match a part's 'video_offsets'")
                return

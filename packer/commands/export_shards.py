"""How one packed sample becomes a WebDataset tar sample or a Parquet row, and the shard files.

``packer export`` (``packer.commands.export``) reads a pack and hands each sample here as its
**columns**: the pack's typed fields (``packer.codecs.fields``) with each field's canonical
bytes. An image-and-label pack is seen as the two columns ``image`` (the stored file's bytes)
and ``label`` (an ``int``), a field pack as its schema. Two shard writers take them:

* ``TarShard`` writes a WebDataset shard with Python's ``tarfile`` (POSIX pax: long and
  UTF-8 names), one member per column, named ``{key}.{ext}`` in an image pack (``.jpg``,
  ``.png``, ``.webp``, ... by the bytes' real format; ``.cls`` the label) and
  ``{key}.{field}.{ext}`` in a field pack, the extension by the field's type (``EXTENSIONS``)
  so that ``webdataset``'s default decoders give the value back. Members carry a fixed mtime,
  mode and owner, so an export is the same bytes every time (a resumed export equals an
  uninterrupted one). webdataset's own ``TarWriter`` stamps each member with the time of day.
* ``ParquetShard`` writes a Parquet file with pyarrow, one column per field (``__key__`` first),
  row groups of at most ``ROW_GROUP_ROWS`` rows and ``ROW_GROUP_BYTES`` bytes (the limits
  ``datasets`` writes with), image columns uncompressed and without statistics (JPEG bytes do
  not compress, and min/max of image bytes only bloat the footer); the schema metadata holds the
  Hugging Face features under ``huggingface`` (as ``datasets.Features.arrow_schema`` writes them:
  ``Image`` for image columns, ``ClassLabel`` with the class names for the label), so
  ``datasets.load_dataset("parquet", ...)`` reads images and class names without being told.

**Keys in a tar.** webdataset splits a member name at the first ``.`` of its last path part and
skips names that start ``__...__``; a pack key is a file path (``cat/001.jpg``). ``tar_key``
escapes, percent-style, every character that would move that split or that a tar name should
not hold (``.``, ``%``, ``#``, ``\\``, control characters, a leading ``_``, the ``/`` of an
empty path part): ``cat/001%2Ejpg``. ``urllib.parse.unquote`` gives the key back. A key the
pack holds twice gets ``#2``, ``#3``, ... on its later samples (a ``#`` of the key itself is
escaped), so no two tar samples share a key.
"""
from __future__ import annotations

import io
import json
import os
import re
import struct
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Sequence

import numpy as np

from packer.codecs.fields import Field, ImageField, IntField
from packer.codecs.image import sniff_format
from packer.errors import UsageError
from packer.fileio import fsync_path

__all__ = ["Column", "columns_of", "image_columns", "ExportFailure", "MalformedField", "tar_key", "escape_key", "image_ext", "EXTENSIONS",
           "ShardWriter", "TarShard", "ParquetShard", "SHARD_WRITERS", "ROW_GROUP_ROWS", "ROW_GROUP_BYTES",
           "hf_features"]

# Row groups: at most this many rows and (about) bytes: datasets' DEFAULT_MAX_BATCH_SIZE and
# MAX_ROW_GROUP_SIZE, so a reader holds one row group of images at a time.
ROW_GROUP_ROWS = 1000
ROW_GROUP_BYTES = 100_000_000

# The member extension of each field type in a tar: what webdataset's default decoders
# (``webdataset.autodecode``) turn back into the value (``.cls`` -> int, ``.json`` -> JSON,
# ``.txt`` -> str, ``.npy`` -> numpy array; ``.bin`` stays bytes). Images: their own format.
EXTENSIONS = {"int": "cls", "float": "json", "str": "txt", "bytes": "bin", "json": "json", "labels": "json",
              "ndarray": "npy", "rle": "json", "segmentation": "json", "video": "mp4"}

# sniff_format's names -> the file extension webdataset (and Pillow) know them by
_IMAGE_EXTS = {"jpeg": "jpg", "png": "png", "webp": "webp", "bmp": "bmp", "gif": "gif"}
_PIL_EXTS = {"JPEG": "jpg", "MPO": "jpg", "PNG": "png", "WEBP": "webp", "BMP": "bmp", "GIF": "gif",
             "TIFF": "tif", "PPM": "ppm", "JPEG2000": "jp2", "ICO": "ico", "TGA": "tga"}

_TAR_MTIME = 0  # fixed member metadata: an export is the same bytes every time
_TAR_MODE = 0o444


class ExportFailure(ValueError):
    """One sample cannot be exported (its image bytes are of no format a reader names); the
    command records it as a failure of that sample (stage ``export``)."""


class MalformedField(ValueError):
    """A stored field's bytes (under a good checksum) do not decode as its type: the sample is
    damaged, a failure of that sample (stage ``read``)."""


def _decoded(f: Field, data: bytes | memoryview) -> Any:
    """``f.decode(data)``, its ValueError a MalformedField naming the field."""
    try:
        return f.decode(data)
    except ValueError as e:
        raise MalformedField(str(e)) from e


@dataclass(frozen=True)
class Column:
    """One exported column: the pack's field (its type decodes the canonical bytes), and the class
    names when the column is a class label (``ClassLabel`` in Parquet)."""

    field: Field
    classes: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.field.name

    @property
    def type_name(self) -> str:
        return self.field.type_name


def image_columns(classes: Sequence[str]) -> list[Column]:
    """An image-and-label pack's columns: ``image`` and ``label`` (a class label when it has classes)."""
    return [Column(ImageField(name="image")), Column(IntField(name="label"), tuple(classes))]


def columns_of(schema: Any, classes: Sequence[str]) -> list[Column]:
    """A field pack's columns: its schema's fields in order; an ``int`` field named ``label`` is
    the class label when the pack has class names. Refuses field names that a tar or Parquet
    would merge: names equal but for case (webdataset lowercases extensions) or ``__key__``."""
    seen: dict[str, str] = {}
    for name in schema.names:
        if name == "__key__":
            raise UsageError("a field named '__key__' cannot be exported: the export's key column has that name")
        low = name.lower()
        if low in seen:
            raise UsageError(f"fields {seen[low]!r} and {name!r} differ only in case; webdataset lowercases "
                             "member extensions, so they cannot both be exported")
        seen[low] = name
    return [Column(f, tuple(classes) if f.name == "label" and f.type_name == "int" and classes else ())
            for f in schema.fields]


def image_ext(data: bytes | memoryview) -> str:
    """The file extension of encoded image bytes by their format (ExportFailure when none)."""
    ext = _IMAGE_EXTS.get(sniff_format(data))
    if ext is not None:
        return ext
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(bytes(data))) as im:
            fmt = im.format
    except (UnidentifiedImageError, OSError, ValueError) as e:
        raise ExportFailure(f"image bytes of no format Pillow knows ({e})") from e
    ext = _PIL_EXTS.get(fmt or "")
    if ext is None:
        raise ExportFailure(f"image format {fmt!r} has no file extension this export knows")
    return ext


# --------------------------------------------------------------------------- keys in a tar

_KEEP = frozenset("-+,;=@~!$&'()[]{} ")
_PLAIN = re.compile(r"[A-Za-z0-9_/.\-+,;=@~!$&'()\[\]{} ]*")  # ASCII keys whose only escapes are dots


def _escape_char(ch: str) -> str:
    return "".join(f"%{b:02X}" for b in ch.encode("utf-8", "surrogatepass"))


def tar_key(key: str, repeat: int = 0) -> str:
    """``key`` as a WebDataset sample key (see the module docstring); ``repeat`` > 0 marks the
    key's ``repeat + 1``-th sample (``#2``, ...). ``urllib.parse.unquote`` of the part before a
    ``#`` is ``key``. ExportFailure for an empty key (no member name can hold it)."""
    if not key:
        raise ExportFailure("an empty key cannot name a tar sample")
    if _PLAIN.fullmatch(key) and not key.startswith(("_", "/")) and not key.endswith("/") and "//" not in key:
        escaped = key.replace(".", "%2E")  # the usual key (a relative path): only its dots move
    else:
        escaped = escape_key(key)
    return escaped + (f"#{repeat + 1}" if repeat else "")


def escape_key(key: str) -> str:
    """``tar_key``'s escape of any key, character by character (the usual key takes a fast path
    that gives the same string)."""
    parts = []
    for i, part in enumerate(key.split("/")):
        parts.append("".join(ch if ch.isalnum() or ch in _KEEP or (ch == "_" and (i or j)) else _escape_char(ch)
                             for j, ch in enumerate(part)))
    out = [parts[0]]
    for before, part in zip(parts, parts[1:]):
        # a "/" that would make an empty path part (leading, trailing, doubled) is escaped
        out.append("/" if before and part else "%2F")
        out.append(part)
    return "".join(out)


def _field_suffix(name: str) -> str:
    """A field name in a member name: ``/`` and ``%`` escaped, lowercase as webdataset reads it."""
    return name.replace("%", "%25").replace("/", "%2F").lower()


# --------------------------------------------------------------------------- shard writers


class ShardWriter:
    """One shard file being written. A sample goes in two steps: ``prepare`` (a classmethod)
    turns its column bytes into what the shard stores, checking every field, so a damaged or
    unexportable sample fails before any shard is touched; ``cost`` says how many bytes that
    adds to ``size`` (the shard's bytes so far; Parquet: its samples' bytes), so the command
    starts a new shard before a sample would pass the size; ``add`` stores it; ``close`` finishes
    and fsyncs the file."""

    suffix: ClassVar[str] = ""

    def __init__(self, path: Path, *, columns: Sequence[Column]):
        self.path = path
        self.columns = list(columns)
        self.count = 0

    @classmethod
    def check_available(cls) -> None:
        """UsageError naming the extra to install when the library is missing."""

    @classmethod
    def prepare(cls, columns: Sequence[Column], *, plain: bool, key: str, tkey: str,
                values: Sequence[bytes | memoryview]) -> Any:
        """What ``add`` stores of one sample (MalformedField, ExportFailure when it cannot)."""
        raise NotImplementedError

    @staticmethod
    def cost(prepared: Any) -> int:
        """The bytes ``add(prepared)`` adds to ``size``."""
        raise NotImplementedError

    @property
    def size(self) -> int:
        raise NotImplementedError

    def add(self, prepared: Any) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Finish the file and fsync it."""
        raise NotImplementedError

    def abort(self) -> None:
        """Close handles after an error (the file is left for the caller to remove)."""


def _npy(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, arr, allow_pickle=False)
    return buf.getvalue()


def _member(column: Column, data: bytes | memoryview) -> tuple[str, bytes | memoryview]:
    """(extension, member bytes) of one column's canonical bytes (``EXTENSIONS``)."""
    f = column.field
    kind = f.type_name
    if kind == "image":
        return image_ext(data), data
    ext = EXTENSIONS[kind]
    if kind == "int":
        return ext, str(_decoded(f, data)).encode()
    if kind in ("float", "labels"):
        return ext, json.dumps(_decoded(f, data)).encode()
    if kind == "ndarray":
        return ext, _npy(_decoded(f, data))
    if kind == "video":
        return ext, _decoded(f, data).mp4  # the MP4 stream (its frame index is rebuilt from it)
    if kind == "segmentation":  # drawn: COCO RLE dicts, as an ``rle`` field exports
        return ext, json.dumps(_decoded(f, data).rle(), separators=(",", ":")).encode("ascii")
    if kind in ("str", "json", "rle"):
        _decoded(f, data)  # well-formed UTF-8 text, JSON, an RLE list: what a reader decodes
    return ext, data  # str (UTF-8), bytes, json and rle (compact JSON): stored as they are


class TarShard(ShardWriter):
    """A WebDataset tar shard (see the module docstring)."""

    suffix = ".tar"

    def __init__(self, path: Path, *, columns: Sequence[Column]):
        super().__init__(path, columns=columns)
        self._file = open(path, "wb")
        self._tar = tarfile.open(fileobj=self._file, mode="w", format=tarfile.PAX_FORMAT)

    @classmethod
    def prepare(cls, columns: Sequence[Column], *, plain: bool, key: str, tkey: str,
                values: Sequence[bytes | memoryview]) -> list[tuple[str, bytes | memoryview]]:
        """The sample's members, ``(name, bytes)``: ``{key}.{ext}`` (``plain``: an image-and-label
        pack, WebDataset's usual names) or ``{key}.{field}.{ext}``."""
        members = []
        for column, data in zip(columns, values):
            ext, payload = _member(column, data)
            members.append((f"{tkey}.{ext}" if plain else f"{tkey}.{_field_suffix(column.name)}.{ext}", payload))
        return members

    @staticmethod
    def cost(prepared: list[tuple[str, bytes | memoryview]]) -> int:
        # each member: a 512-byte header and its data padded to 512 (at most 1,024 bytes more
        # than its data; a pax header for a name past 100 bytes adds 1,024 more)
        return sum(len(payload) for _, payload in prepared) + 1024 * len(prepared)

    @property
    def size(self) -> int:
        return self._tar.offset

    def add(self, prepared: list[tuple[str, bytes | memoryview]]) -> None:
        for name, payload in prepared:
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            info.mtime = _TAR_MTIME
            info.mode = _TAR_MODE
            self._tar.addfile(info, io.BytesIO(payload))
        self.count += 1

    def close(self) -> None:
        self._tar.close()
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()

    def abort(self) -> None:
        try:
            self._file.close()
        except OSError:
            pass


def _require_pyarrow() -> Any:
    try:
        import pyarrow
        import pyarrow.parquet  # noqa: F401
    except ImportError as e:
        raise UsageError("exporting to Parquet needs pyarrow: pip install 'packer[export]'") from e
    return pyarrow


def _arrow_type(pa: Any, f: Field) -> Any:
    """The Arrow type of a field's column (docs/sources.md, "Exports")."""
    kind = f.type_name
    if kind == "image":
        return pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    if kind == "ndarray":
        t = pa.from_numpy_dtype(np.dtype(f.dtype_name))
        for d in reversed(f.shape[1:]):
            t = pa.list_(t, d)
        return pa.list_(t) if f.shape[0] is None else pa.list_(t, f.shape[0])
    if kind in ("rle", "segmentation"):  # (a segmentation's polygons drawn: ``_cell``)
        return pa.list_(pa.struct([("size", pa.list_(pa.int64())), ("counts", pa.string())]))
    return {"int": pa.int64(), "float": pa.float64(), "str": pa.string(), "bytes": pa.binary(), "video": pa.binary(),
            "json": pa.string(), "labels": pa.list_(pa.int64())}[kind]


def hf_features(columns: Sequence[Column]) -> dict[str, Any]:
    """The Hugging Face features of the columns that need naming (``Image``, ``ClassLabel``) as
    ``datasets.Features.to_dict`` writes them; ``datasets`` infers the others from the Arrow types."""
    out: dict[str, Any] = {}
    for c in columns:
        if c.type_name == "image":
            out[c.name] = {"_type": "Image"}
        elif c.classes:
            out[c.name] = {"_type": "ClassLabel", "names": list(c.classes)}
    return out


def _cell(f: Field, data: bytes | memoryview) -> Any:
    """One column's value in a row: bytes for images and bytes, the JSON text for ``json``, the
    decoded value for the rest (checked here, so a damaged field fails its sample only)."""
    kind = f.type_name
    if kind in ("image", "bytes"):
        return bytes(data)  # the read buffer is not kept alive
    if kind == "video":
        return bytes(_decoded(f, data).mp4)
    if kind == "json":
        _decoded(f, data)
        return bytes(data).decode("utf-8")
    if kind == "segmentation":
        return _decoded(f, data).rle()
    return _decoded(f, data)


class ParquetShard(ShardWriter):
    """A Parquet file of the columns (see the module docstring)."""

    suffix = ".parquet"

    def __init__(self, path: Path, *, columns: Sequence[Column], metadata: dict[str, Any] | None = None):
        super().__init__(path, columns=columns)
        pa = self._pa = _require_pyarrow()
        import pyarrow.parquet as pq

        names = ["__key__"] + [c.name for c in columns]
        fields = [pa.field("__key__", pa.string())] + [pa.field(c.name, _arrow_type(pa, c.field)) for c in columns]
        meta = {"huggingface": json.dumps({"info": {"features": hf_features(columns)}})}
        if metadata:
            meta["packer"] = json.dumps(metadata, sort_keys=True)
        self.schema = pa.schema(fields, metadata=meta)
        images = {c.name for c in columns if c.type_name == "image"}
        self._writer = pq.ParquetWriter(
            str(path), self.schema, compression={name: "NONE" if name in images else "SNAPPY" for name in names},
            use_dictionary=["__key__"] + [c.name for c in columns if c.type_name in ("int", "str")],
            write_statistics=["__key__"] + [c.name for c in columns if c.type_name in ("int", "float")])
        self._rows: list[tuple[str, list[Any]]] = []
        self._pending = 0
        self._size = 0

    @classmethod
    def check_available(cls) -> None:
        _require_pyarrow()

    @classmethod
    def prepare(cls, columns: Sequence[Column], *, plain: bool, key: str, tkey: str,
                values: Sequence[bytes | memoryview]) -> tuple[str, list[Any], int]:
        """``(key, the row's cells, its bytes)``."""
        return key, [_cell(c.field, v) for c, v in zip(columns, values)], sum(len(v) for v in values)

    @staticmethod
    def cost(prepared: tuple[str, list[Any], int]) -> int:
        return prepared[2]

    @property
    def size(self) -> int:
        return self._size

    def add(self, prepared: tuple[str, list[Any], int]) -> None:
        key, cells, cost = prepared
        self._rows.append((key, cells))
        self._pending += cost
        self._size += cost
        self.count += 1
        if len(self._rows) >= ROW_GROUP_ROWS or self._pending >= ROW_GROUP_BYTES:
            self._flush()

    def _column(self, i: int, column: Column) -> Any:
        pa, f = self._pa, column.field
        data = [row[1][i] for row in self._rows]
        kind = f.type_name
        if kind == "image":
            return pa.StructArray.from_arrays([pa.array(data, pa.binary()),
                                               pa.array([row[0] for row in self._rows], pa.string())],
                                              names=["bytes", "path"])
        if kind == "ndarray":  # flat values, a fixed size list per fixed dimension, offsets for the first
            flat = np.concatenate([a.reshape(-1) for a in data])
            values = pa.array(flat.astype(f.dtype_name, copy=False))
            for d in reversed(f.shape[1:]):
                values = pa.FixedSizeListArray.from_arrays(values, d)
            if f.shape[0] is not None:
                return pa.FixedSizeListArray.from_arrays(values, f.shape[0])
            offsets = np.concatenate([[0], np.cumsum([len(a) for a in data])]).astype(np.int32)
            return pa.ListArray.from_arrays(pa.array(offsets), values)
        return pa.array(data, _arrow_type(pa, f))

    def _flush(self) -> None:
        if not self._rows:
            return
        pa = self._pa
        arrays = [pa.array([row[0] for row in self._rows], pa.string())]
        arrays += [self._column(i, c) for i, c in enumerate(self.columns)]
        self._writer.write_table(pa.Table.from_arrays(arrays, schema=self.schema), row_group_size=len(self._rows))
        self._rows = []
        self._pending = 0

    def close(self) -> None:
        self._flush()
        self._writer.close()
        fsync_path(self.path)

    def abort(self) -> None:
        try:
            self._writer.close()
        except Exception:  # noqa: BLE001 - best effort on an error path; the file is removed
            pass


SHARD_WRITERS: dict[str, type[ShardWriter]] = {"wds": TarShard, "parquet": ParquetShard}


def int64_bytes(value: int) -> bytes:
    """The canonical bytes of an ``int`` field (a label's column value)."""
    return struct.pack("<q", int(value))

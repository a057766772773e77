"""HDF5 datasets read as columns: a field pack's dataset per field, and direct positioned reads
of the rows of any dataset chunked along its first axis.

A field pack (``packer.codecs.fields``) stores each field of its schema in a dataset of its own
under the group ``fields`` (a ``/`` in a field name is written ``%2F``), so h5py or pandas read a
field without packer:

* a **fixed-size** field (``int``, ``float``, an ``ndarray`` whose every dimension is fixed) is one
  ``(N, *shape)`` dataset of its dtype: sample i is row i;
* a **variable-length** field (``image``, ``str``, ``bytes``, ``json``, ``rle``, ``segmentation``: uint8 bytes;
  ``labels``: int64; an ``ndarray`` with a variable leading dimension: ``(rows, *shape[1:])`` of
  its dtype) is a flat dataset of every sample's values back to back, plus
  ``field_offsets/<name>`` (int64, N+1): sample i is rows ``offsets[i]:offsets[i+1]``.

Each dataset's ``type`` attribute is the field's type string (``ndarray:float32:*,4``). The rows
of sample i, in schema order, are the parts of the sample's field blob (``encode_blob``): the
``crc32c`` dataset holds the CRC32C of that blob, which a reader rebuilds and checks, so one
flipped bit in any field's dataset or in its offsets is caught and names the sample. A field
whose rows hold no bytes (an ``ndarray`` with a zero dimension) is stored as variable-length
bytes, since HDF5 chunks cannot be empty.

Why flat values + offsets and not h5py's variable-length types: a sample's field is then one
positioned read of its own bytes straight from the file (no HDF5 call, no per-element heap
objects) and h5py reads ``f["fields/boxes"][a:b]`` as an ordinary ``(n, 4)`` float32 array;
``python -m scripts.bench.hdf5_fields`` measures both (docs/fields.md quotes the figures).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import h5py
import numpy as np

from packer.codecs.fields import Field, FloatField, IntField, LabelsField, NdarrayField, Schema, encode_blob
from packer.formats.hdf5.layout import TABLE_CHUNK

__all__ = ["FIELDS_GROUP", "OFFSETS_GROUP", "Column", "columns_of", "chunk_table", "read_rows",
           "create_columns", "check_parts", "append_columns", "cut_back_columns", "iter_blobs", "FieldColumns"]

FIELDS_GROUP = "fields"
OFFSETS_GROUP = "field_offsets"
_SMALL_CHUNK = 1 << 16  # bytes per chunk of a field that is not an image: ~8,192 int64 rows


@dataclass(frozen=True)
class Column:
    """How one field is stored: its dataset (``path``), its offsets dataset (``offsets``, None for
    a fixed-size field), the rows' dtype and shape (``tail``) and the bytes of one row (``unit``)."""

    name: str
    path: str
    offsets: str | None
    dtype: np.dtype
    tail: tuple[int, ...]
    unit: int
    image: bool = False

    def chunk_rows(self, chunk_bytes: int) -> int:
        """Rows per chunk: about ``chunk_bytes`` for an image field, 64 KiB for any other."""
        target = chunk_bytes if self.image else min(chunk_bytes, _SMALL_CHUNK)
        return max(1, target // self.unit)


def _escape(name: str) -> str:
    return name.replace("/", "%2F")  # '%' is not allowed in a field name: the escape is unambiguous


def column_of(field: Field) -> Column:
    """The dataset layout of one field (see the module doc)."""
    path, offsets = f"{FIELDS_GROUP}/{_escape(field.name)}", f"{OFFSETS_GROUP}/{_escape(field.name)}"
    if isinstance(field, IntField):
        return Column(field.name, path, None, np.dtype("<i8"), (), 8)
    if isinstance(field, FloatField):
        return Column(field.name, path, None, np.dtype("<f8"), (), 8)
    if isinstance(field, LabelsField):
        return Column(field.name, path, offsets, np.dtype("<i8"), (), 8)
    if isinstance(field, NdarrayField):
        variable = field.shape[0] is None
        tail = tuple(int(d) for d in (field.shape[1:] if variable else field.shape))
        unit = int(np.prod(tail, dtype=np.int64)) * field.dtype.itemsize
        if unit:
            return Column(field.name, path, offsets if variable else None, field.dtype, tail, unit)
    return Column(field.name, path, offsets, np.dtype("u1"), (), 1, image=field.type_name == "image")


def columns_of(schema: Schema) -> list[Column]:
    """The columns of a schema, in its order."""
    return [column_of(f) for f in schema.fields]


# -- reading rows straight from the file ----------------------------------------------------------
def chunk_table(dset: h5py.Dataset) -> np.ndarray | None:
    """File offsets of the chunks of ``dset``, by chunk number along axis 0, when its stored
    bytes can be read straight from the file: no filters, chunked along axis 0 only, every
    chunk allocated. None otherwise (then reads go through HDF5)."""
    chunks = dset.chunks
    if (chunks is None or tuple(chunks[1:]) != tuple(dset.shape[1:]) or not hasattr(dset.id, "chunk_iter")
            or dset.id.get_create_plist().get_nfilters() != 0):
        return None
    table = np.full(-(-dset.shape[0] // chunks[0]), -1, dtype=np.int64)

    def visit(info: Any) -> None:
        table[info.chunk_offset[0] // chunks[0]] = info.byte_offset

    dset.id.chunk_iter(visit)
    return table if table.size == 0 or table.min() >= 0 else None


def read_rows(fd: int, table: np.ndarray, chunk_len: int, start: int, end: int) -> bytes:
    """Bytes ``start:end`` of a dataset's rows (as stored, row after row) read straight from the
    file: one positioned read per chunk they touch (``chunk_len``: the bytes of one chunk)."""
    parts = []
    while start < end:
        k, at = divmod(start, chunk_len)
        n = min(end - start, chunk_len - at)
        where = int(table[k]) + at
        data = os.pread(fd, n, where)
        if len(data) != n:
            raise ValueError(f"short read: {len(data)} of {n} bytes at file offset {where} (file truncated?)")
        parts.append(data)
        start += n
    return parts[0] if len(parts) == 1 else b"".join(parts)


# -- writing ---------------------------------------------------------------------------------
def create_columns(f: h5py.File, schema: Schema, *, chunk_bytes: int) -> None:
    """Create a field pack's empty datasets, one per field (and its offsets)."""
    for col, field in zip(columns_of(schema), schema.fields):
        d = f.create_dataset(col.path, shape=(0,) + col.tail, maxshape=(None,) + col.tail, dtype=col.dtype,
                             chunks=(col.chunk_rows(chunk_bytes),) + col.tail)
        d.attrs["type"] = field.spec()
        if col.offsets is not None:
            d.attrs["offsets"] = col.offsets
            f.create_dataset(col.offsets, data=np.zeros(1, dtype="i8"), maxshape=(None,), chunks=(TABLE_CHUNK,))


def _append(dset: h5py.Dataset, values: np.ndarray) -> None:
    if len(values):
        n = dset.shape[0]
        dset.resize(n + len(values), axis=0)
        dset[n:] = values


def check_parts(cols: Sequence[Column], parts: Sequence[Any]) -> None:
    """ValueError naming the field unless each of a blob's parts fills whole rows of its column
    (exactly one row for a fixed-size field)."""
    for col, p in zip(cols, parts):
        if (len(p) != col.unit) if col.offsets is None else (len(p) % col.unit):
            raise ValueError(f"field {col.name!r}: {len(p)} bytes do not make "
                             f"{'a row' if col.offsets is None else 'whole rows'} of {col.unit} bytes")


def append_columns(f: h5py.File, cols: Sequence[Column], stored: int, samples: Sequence[Sequence[Any]]) -> None:
    """Append samples after the first ``stored``: each one its blob's parts in schema order
    (each checked with ``check_parts``)."""
    for j, col in enumerate(cols):
        parts = [s[j] for s in samples]
        values = np.frombuffer(b"".join(parts), dtype=col.dtype).reshape((-1,) + col.tail)
        if col.offsets is not None:
            rows = np.fromiter((len(p) for p in parts), dtype=np.int64, count=len(parts)) // col.unit
            offsets = f[col.offsets]
            _append(offsets, int(offsets[stored]) + np.cumsum(rows, dtype="i8"))
        _append(f[col.path], values)


def cut_back_columns(f: h5py.File, schema: Schema, n: int) -> None:
    """Drop every row past the first ``n`` samples (a resume); ValueError when fewer are there."""
    for col in columns_of(schema):
        if col.path not in f or (col.offsets is not None and col.offsets not in f):
            raise ValueError(f"field {col.name!r} has no dataset (another schema?)")
        if col.offsets is None:
            _cut(f[col.path], n, col.name)
        else:
            offsets = f[col.offsets]
            _cut(offsets, n + 1, f"{col.name} offsets")
            rows = int(offsets[n])
            _cut(f[col.path], rows, col.name)


def _cut(dset: h5py.Dataset, n: int, what: str) -> None:
    if dset.shape[0] < n:
        raise ValueError(f"dataset of {what!r} holds {dset.shape[0]} rows, fewer than {n}")
    dset.resize(n, axis=0)


def iter_blobs(f: h5py.File, schema: Schema, n: int, slab: int = 64 << 20) -> Iterator[bytes]:
    """The field blobs of samples 0..n-1 rebuilt from the datasets, read in large slabs."""
    cols = columns_of(schema)
    starts = [f[c.offsets][:n + 1] if c.offsets is not None else np.arange(n + 1, dtype=np.int64) for c in cols]
    sizes = sum((np.diff(s) * c.unit for s, c in zip(starts, cols)), np.zeros(n, dtype=np.int64))
    i = 0
    while i < n:
        j, total = i + 1, int(sizes[i])
        while j < n and total + sizes[j] <= slab:
            total += int(sizes[j])
            j += 1
        blocks = [f[c.path][int(s[i]):int(s[j])].tobytes() for c, s in zip(cols, starts)]
        for k in range(i, j):
            yield encode_blob([memoryview(b)[(int(s[k]) - int(s[i])) * c.unit:(int(s[k + 1]) - int(s[i])) * c.unit]
                               for b, s, c in zip(blocks, starts, cols)])
        i = j


# -- reading -----------------------------------------------------------------------------------
@dataclass
class _Open:
    col: Column
    data: h5py.Dataset
    rows: int
    starts: np.ndarray | None  # offsets (N+1) of a variable-length field
    table: np.ndarray | None  # chunk file offsets for direct reads
    chunk_len: int  # bytes per chunk


class FieldColumns:
    """One process's view of a field pack's datasets: offsets loaded once, chunk tables for
    direct positioned reads. ``read(index, fd)`` gives a sample's parts in schema order.

    Args:
        f: the open file.
        schema: the pack's schema.
        count: the manifest's sample count (every dataset is checked against it).
    """

    def __init__(self, f: h5py.File, schema: Schema, count: int):
        self.opened: list[_Open] = []
        for col in columns_of(schema):
            if col.path not in f or (col.offsets is not None and col.offsets not in f):
                raise ValueError(f"no dataset for field {col.name!r} ({col.path})")
            data = f[col.path]
            if tuple(data.shape[1:]) != col.tail or data.dtype.itemsize * int(np.prod(col.tail, dtype=np.int64)) \
                    != col.unit:
                raise ValueError(f"dataset {col.path!r} is {data.shape} {data.dtype}, the schema says "
                                 f"rows of {col.tail} {col.dtype}")
            starts = None
            if col.offsets is not None:
                starts = f[col.offsets][:]
                if starts.shape != (count + 1,):
                    raise ValueError(f"dataset {col.offsets!r} holds {starts.shape[0]} entries, expected {count + 1}")
            elif data.shape[0] != count:
                raise ValueError(f"dataset {col.path!r} holds {data.shape[0]} rows, expected {count}")
            table = chunk_table(data)
            chunk_len = data.chunks[0] * col.unit if data.chunks else 0
            self.opened.append(_Open(col, data, int(data.shape[0]), starts, table, chunk_len))

    @property
    def direct(self) -> bool:
        """Whether some field is read straight from the file (a descriptor is needed)."""
        return any(o.table is not None for o in self.opened)

    def read(self, index: int, fd: int) -> list[bytes]:
        """Sample ``index``'s stored bytes of each field, in schema order (ValueError naming the
        field when its offsets point outside its dataset)."""
        out = []
        for o in self.opened:
            if o.starts is None:
                a, b = index, index + 1
            else:
                a, b = int(o.starts[index]), int(o.starts[index + 1])
                if not 0 <= a <= b <= o.rows:
                    raise ValueError(f"field {o.col.name!r}: offsets {a}..{b} outside its {o.rows}-row dataset")
            if a == b:
                out.append(b"")
            elif o.table is not None and fd >= 0:
                out.append(read_rows(fd, o.table, o.chunk_len, a * o.col.unit, b * o.col.unit))
            else:
                out.append(o.data[a:b].tobytes())
        return out

    def problems(self) -> Iterator[str]:
        """What is wrong with the offsets (each a non-decreasing 0..rows index)."""
        for o in self.opened:
            s = o.starts
            if s is not None and (s[0] != 0 or np.any(np.diff(s) < 0) or s[-1] != o.rows):
                yield f"dataset {o.col.offsets!r} is not a non-decreasing 0..{o.rows} index"

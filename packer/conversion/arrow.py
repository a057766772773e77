"""Hugging Face datasets and Parquet tables as items: one item per row, holding where the row is.

Two sources, read with pyarrow (the ``hf`` extra):

* a folder written by ``datasets.Dataset.save_to_disk``: ``state.json`` lists its Arrow files
  (IPC streams of record batches), ``dataset_info.json`` its features;
* Parquet files (one file, a folder of them, a glob), e.g. ``Dataset.to_parquet`` or the Hub's
  Parquet conversion; the features come from the files' ``huggingface`` schema metadata when
  they have it, else from the Arrow types.

Each column is a field of the sample, typed by its feature: ``Image`` (a struct of ``bytes`` and
``path``; a row whose bytes are null reads the file at ``path``, a relative one against the
source's folder) is ``image``; ``ClassLabel`` is ``int`` and its names are the pack's classes;
``Value`` is ``int``, ``float``, ``str`` or ``bytes`` by its dtype; a sequence of integers (or of
``ClassLabel``) is ``labels``, of floats ``ndarray:<dtype>:*``; ``Array2D``/``3D`` an
``ndarray`` of its shape; anything else ``json``. Without metadata a struct of ``bytes`` and
``path``, or a binary column named ``image``, ``img``, ``jpg``, ``jpeg``, ``png`` or ``webp``, is an
image. A table of one image column and one ``ClassLabel`` column and nothing else is a plain
image pack (image and label, as a class folder gives); any other is a field pack. Rows are in
the dataset's order, keyed by their index in it (``00000042``: ``ds[42]``).

Nothing holds the table: the listing reads only the row counts (Parquet: the footer; Arrow:
each record batch's header, through a memory map) and, for a plain image pack, the label
column; an item is the row's key, label and place (file, row group or record batch, row). The
work reads rows where it runs, a batch at a time: a Parquet row group through a cursor of
``iter_batches`` (32 rows a batch, 1 MiB read buffer, page checksums verified where the file has
them), an Arrow record batch by its offset; a process keeps the last few of these
(``_Rows``), so rows read in order decode each batch once. A row group that pyarrow cannot
decode (a damaged page) fails every row from the batch it is in to the end of the group, each
a recorded failure naming the file, the row and pyarrow's reason; the other row groups are
read as usual. A null image, or a null in another column, fails its row. A file that cannot be
opened as Parquet or Arrow is one failure naming it.
"""
from __future__ import annotations

import json
import logging
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from packer.codecs.fields import Schema
from packer.conversion import lists
from packer.conversion.input_failures import InputFailure, bad_line
from packer.conversion.inputs import SourceItem, SourceListing
from packer.errors import CorruptSample, UsageError
from packer.fileio import read_file

__all__ = ["RowItem", "table_source", "dataset_files", "column_types", "close_tables", "IMAGE_COLUMN_NAMES"]

log = logging.getLogger(__name__)

IMAGE_COLUMN_NAMES = ("image", "img", "jpg", "jpeg", "png", "webp")
_BATCH_ROWS = 32
_BUFFER = 1 << 20


def need_pyarrow() -> Any:
    """``pyarrow``, or a UsageError naming the extra that installs it."""
    try:
        import pyarrow
        import pyarrow.ipc  # noqa: F401
        import pyarrow.parquet  # noqa: F401
    except ImportError as e:
        raise UsageError("reading Hugging Face datasets and Parquet files needs pyarrow: "
                         "pip install 'packer[hf]'") from e
    return pyarrow


# -- which files, which features ----------------------------------------------------------------------
def dataset_files(src: str | os.PathLike, kind: str) -> tuple[list[str], dict | None, str]:
    """``(data files, HF features or None, root)`` of a ``save_to_disk`` folder (``kind="hf"``)
    or of Parquet files (``"parquet"``: a file, a folder of them, a glob); ``root`` is the folder
    relative image paths are read from."""
    text = os.fspath(src)
    from packer.remote.url import is_url

    if is_url(text):
        raise UsageError(f"{text}: Parquet and Arrow sources are read from local files (download them first; "
                         "WebDataset shards may be URLs)")
    path = Path(text)
    if kind == "hf":
        if (path / "dataset_dict.json").is_file():
            splits = json.loads((path / "dataset_dict.json").read_text()).get("splits", [])
            raise UsageError(f"{path}: a DatasetDict; give one split's folder ({', '.join(f'{path}/{s}' for s in splits)})")
        try:
            state = json.loads((path / "state.json").read_text())
            info = json.loads((path / "dataset_info.json").read_text())
        except (OSError, ValueError) as e:
            raise UsageError(f"{path}: not a folder written by Dataset.save_to_disk (state.json and "
                             f"dataset_info.json: {e})") from e
        files = [str(path / f["filename"]) for f in state.get("_data_files", [])]
        if not files:
            raise UsageError(f"{path}: state.json lists no data files")
        return files, info.get("features"), str(path)
    if any(c in text for c in "*?["):
        import glob

        files = sorted(glob.glob(text))
        root = str(Path(files[0]).parent) if files else text
    elif path.is_dir():
        files = [str(p) for p in sorted(path.iterdir()) if p.suffix == ".parquet" and not p.name.startswith(".")]
        root = str(path)
    else:
        files, root = [text], str(path.parent)
    if not files:
        raise UsageError(f"{text}: names no .parquet files")
    return files, None, root


def _hf_features(schema: Any) -> dict | None:
    raw = (schema.metadata or {}).get(b"huggingface")
    if not raw:
        return None
    try:
        return json.loads(raw).get("info", {}).get("features")
    except (ValueError, AttributeError):
        return None


def _value_type(pa: Any, t: Any) -> str:
    """A field type for an Arrow type (``json`` when nothing narrower fits)."""
    types = pa.types
    if types.is_boolean(t) or types.is_integer(t):
        return "int"
    if types.is_floating(t):
        return "float"
    if types.is_string(t) or types.is_large_string(t):
        return "str"
    if types.is_binary(t) or types.is_large_binary(t) or types.is_fixed_size_binary(t):
        return "bytes"
    if types.is_list(t) or types.is_large_list(t) or types.is_fixed_size_list(t):
        v = t.value_type
        if types.is_integer(v):
            return "labels"
        if types.is_floating(v):
            return f"ndarray:{v.to_pandas_dtype().__name__}:*"
    return "json"


def _is_image_struct(pa: Any, t: Any) -> bool:
    return pa.types.is_struct(t) and {t.field(i).name for i in range(t.num_fields)} >= {"bytes", "path"}


def column_types(schema: Any, features: dict | None) -> tuple[dict[str, str], dict[str, list[str]]]:
    """``({column: field type}, {ClassLabel column: names})`` of an Arrow schema and its HF
    features (see the module doc); UsageError naming a column that cannot be a field."""
    pa = need_pyarrow()
    types: dict[str, str] = {}
    classes: dict[str, list[str]] = {}
    for f in schema:
        feat = (features or {}).get(f.name)
        kind = feat.get("_type") if isinstance(feat, dict) else None
        if kind == "Image" or (kind is None and (_is_image_struct(pa, f.type) or (
                (pa.types.is_binary(f.type) or pa.types.is_large_binary(f.type)) and f.name.lower() in IMAGE_COLUMN_NAMES))):
            types[f.name] = "image"
        elif kind == "ClassLabel":
            names = feat.get("names") or [str(i) for i in range(int(feat.get("num_classes") or 0))]
            classes[f.name] = [str(n) for n in names]
            types[f.name] = "int"
        elif kind in ("Sequence", "List", "LargeList") and isinstance(feat.get("feature"), dict) \
                and feat["feature"].get("_type") == "ClassLabel":
            classes.setdefault(f.name, [str(n) for n in feat["feature"].get("names") or []])
            types[f.name] = "labels"
        elif kind in ("Array2D", "Array3D", "Array4D", "Array5D"):
            shape = ",".join("*" if d is None else str(d) for d in feat.get("shape", []))
            first, _, rest = shape.partition(",")
            types[f.name] = f"ndarray:{feat.get('dtype', 'float32')}:*" + (f",{rest}" if rest else "")
        elif kind in ("Audio", "Video", "Pdf", "Nifti"):
            raise UsageError(f"column {f.name!r}: {kind} features are not packed (drop the column first: "
                             "dataset.remove_columns)")
        else:
            types[f.name] = _value_type(pa, f.type)
    return types, classes


# -- reading rows where the work runs -----------------------------------------------------------------
@dataclass(frozen=True)
class _Table:
    """What every row of one data file shares (one object per file, referenced by its items):
    the file, its kind, the columns a row reads and their field types, the folder relative image
    paths are read from, and (Arrow) each record batch's offset."""

    path: str
    kind: str  # parquet | arrow
    columns: tuple
    types: tuple
    root: str
    offsets: tuple = ()

    @property
    def image(self) -> int:
        """The position of the first image column."""
        return self.types.index("image")


class _Unit:
    """The rows of one row group (Parquet, through a cursor) or record batch (Arrow) as the
    work reads them: the last two batches kept, a cursor moved forward, restarted for a row
    before them; a decode error fails that row and every later one of the unit."""

    def __init__(self, table: _Table, unit: int, opened: Any):
        pa = need_pyarrow()
        self.table, self.unit, self.opened = table, unit, opened
        st = os.stat(table.path)
        self.stat = (st.st_size, st.st_mtime_ns)
        self.kept: list[tuple[int, list]] = []  # (first row, prepared columns), at most two
        self.error: tuple[int, str] | None = None
        self.cursor = None
        self.next_row = 0
        if table.kind == "arrow":  # ``opened``: the stream's schema
            with pa.OSFile(table.path) as f:
                f.seek(table.offsets[unit])
                batch = pa.ipc.read_record_batch(pa.ipc.read_message(f), opened)
            self.kept = [(0, _prepare(batch, table.columns))]
            self.next_row = batch.num_rows

    def _restart(self) -> None:
        # ``opened``: the file's ParquetFile (its footer parsed once per process, not per row group)
        self.cursor = self.opened.iter_batches(batch_size=_BATCH_ROWS, row_groups=[self.unit],
                                               columns=list(self.table.columns), use_threads=False)
        self.kept, self.next_row = [], 0

    def row(self, r: int) -> tuple[list, int]:
        """(prepared columns, index in them) of row ``r`` of the unit; ``ValueError`` with
        pyarrow's reason when it cannot be decoded."""
        for start, cols in self.kept:
            if start <= r < start + _rows(cols):
                return cols, r - start
        if self.table.kind == "arrow":
            raise ValueError(f"row {r} is not in its record batch")
        if self.error is not None and r >= self.error[0]:
            raise ValueError(self.error[1])
        if self.cursor is None or not self.kept or r < self.kept[0][0]:
            self._restart()
        while True:
            try:
                batch = next(self.cursor)
            except StopIteration:
                raise ValueError(f"row group {self.unit} has fewer rows than its metadata says") from None
            except Exception as e:  # noqa: BLE001 - pyarrow's decode errors: OSError, ArrowInvalid, ...
                self.error = (self.next_row, f"row group {self.unit} cannot be decoded from row {self.next_row} of it "
                                             f"on ({type(e).__name__}: {e})")
                raise ValueError(self.error[1]) from e
            start, self.next_row = self.next_row, self.next_row + batch.num_rows
            self.kept = (self.kept + [(start, _prepare(batch, self.table.columns))])[-2:]
            if r < self.next_row:
                return self.kept[-1][1], r - start


def _prepare(batch: Any, columns: Sequence[str]) -> list:
    """Per column: the array, or for an image struct its ``(bytes, path)`` children."""
    import pyarrow as pa

    out = []
    for name in columns:
        col = batch.column(name)
        out.append((col.field("bytes"), col.field("path")) if _is_image_struct(pa, col.type) else col)
    return out


def _rows(cols: list) -> int:
    first = cols[0]
    return len(first[0]) if isinstance(first, tuple) else len(first)


class _Rows:
    """This process's open files and units (at most ``keep`` of each, least recently used
    dropped), behind a lock (the staged plan's completion threads read too)."""

    def __init__(self, keep: int = 4):
        self.keep, self.units, self.files, self.lock = keep, OrderedDict(), OrderedDict(), threading.Lock()
        self.last: tuple[Any, _Unit | None] = (None, None)

    def _opened(self, table: _Table) -> Any:
        """The file's ParquetFile (Parquet) or stream schema (Arrow), opened once per process."""
        got = self.files.get(table.path)
        if got is None:
            pa = need_pyarrow()
            if table.kind == "parquet":
                import pyarrow.parquet as pq

                got = pq.ParquetFile(table.path, pre_buffer=False, buffer_size=_BUFFER,
                                     page_checksum_verification=True)
            else:
                with pa.OSFile(table.path) as f:
                    got = pa.ipc.open_stream(f).schema
            self.files[table.path] = got
            while len(self.files) > self.keep:
                self.files.popitem(last=False)
        return got

    def _unit(self, item: "RowItem") -> _Unit:
        k = (item.table.path, item.unit)
        if self.last[0] == k:  # (rows come in order: the unit of the row before, most of the time)
            return self.last[1]
        unit = self.units.get(k)
        if unit is None:
            try:
                unit = _Unit(item.table, item.unit, self._opened(item.table))
            except Exception as e:  # noqa: BLE001 - OSError, ArrowInvalid: this row's failure
                raise CorruptSample(item.key, item.path, f"row {item.index}: cannot read its "
                                    f"{'record batch' if item.table.kind == 'arrow' else 'row group'} "
                                    f"{item.unit} ({type(e).__name__}: {e})", stage="read") from e
            self.units[k] = unit
            while len(self.units) > self.keep:
                self.units.popitem(last=False)
        else:
            self.units.move_to_end(k)
        self.last = (k, unit)
        return unit

    def _row(self, item: "RowItem") -> tuple[_Unit, list, int]:
        """The row's unit, its batch's prepared columns and its index in them (under the lock)."""
        unit = self._unit(item)
        try:
            cols, i = unit.row(item.row)
        except ValueError as e:
            raise CorruptSample(item.key, item.path, f"row {item.index}: {e}", stage="read") from e
        return unit, cols, i

    def values(self, item: "RowItem") -> tuple[dict[str, Any], tuple[int, int]]:
        """``{column: value}`` of the row and its file's stat."""
        with self.lock:
            unit, cols, i = self._row(item)
            table = item.table
            return {name: _cell(item, name, kind, col, i)
                    for name, kind, col in zip(table.columns, table.types, cols)}, unit.stat

    def image(self, item: "RowItem") -> tuple[bytes, tuple[int, int]]:
        """The row's first image column's bytes and its file's stat (a plain image pack's read)."""
        table = item.table
        j = table.image
        with self.lock:
            unit, cols, i = self._row(item)
            return _cell(item, table.columns[j], "image", cols[j], i), unit.stat

    def clear(self) -> None:
        with self.lock:
            self.units.clear()
            self.files.clear()
            self.last = (None, None)


_ROWS = _Rows()


def close_tables() -> None:
    """Drop the row groups and batches this process keeps (the command calls it when its run ends)."""
    _ROWS.clear()


def _cell(item: "RowItem", name: str, kind: str, col: Any, i: int) -> Any:
    """One value of a row; an image as its encoded bytes (read from its path when the row holds none)."""
    if isinstance(col, tuple):  # an Image struct
        data = col[0][i].as_py()
        if data is None:
            rel = col[1][i].as_py()
            if rel is None:
                raise CorruptSample(item.key, item.path, f"row {item.index}: column {name!r} is null (no bytes, "
                                                         "no path)", stage="read")
            return _image_file(item, name, rel)
        return data
    value = col[i].as_py()
    if value is None:
        raise CorruptSample(item.key, item.path, f"row {item.index}: column {name!r} is null", stage="read")
    if value.__class__ is bool and kind == "int":  # a bool column: 0 or 1 (an int field refuses bools)
        return int(value)
    if kind == "image" and isinstance(value, str):  # a path column
        return _image_file(item, name, value)
    return value


def _image_file(item: "RowItem", name: str, rel: str) -> bytes:
    """The image a row names by path (a relative one against the source's folder)."""
    path = rel if os.path.isabs(rel) else os.path.join(item.table.root, rel)
    try:
        return read_file(path)
    except OSError as e:
        raise CorruptSample(item.key, item.path, f"row {item.index}: column {name!r}: cannot read {path} "
                                                 f"({e.strerror or e})", stage="read") from e


@dataclass(frozen=True, init=False)
class RowItem(SourceItem):
    """One row of an Arrow or Parquet file: ``path`` is the file, ``table`` what its rows share,
    ``unit`` its row group (Parquet) or record batch (Arrow), ``row`` its place in that unit,
    ``index`` its place in the dataset."""

    def __init__(self, key: str, path: str, label: int, *, table: _Table, unit: int, row: int, index: int):
        # (every field set at once, not through the parents' __init__ chain: millions of items)
        self.__dict__.update(key=key, path=path, label=label, values=None, table=table, unit=unit, row=row,
                             index=index)

    def read(self) -> tuple[bytes, tuple[int, int] | None]:
        return _ROWS.image(self)

    def read_values(self) -> tuple[dict[str, Any], tuple[int, int] | None]:
        return _ROWS.values(self)


# -- listing -----------------------------------------------------------------------------------------
def _units(pa: Any, path: str, kind: str, label: str | None) -> tuple[Any, list[tuple[int, Any]], tuple, str]:
    """``(schema, [(rows, labels or None) per unit], arrow batch offsets, damage)`` of one data
    file, reading only the row counts and the ``label`` column. A unit that cannot be read gives
    ``(rows, exception)`` when its row count is known; an Arrow stream damaged part way ends
    its units there, ``damage`` saying where; a file that cannot be opened raises."""
    if kind == "parquet":
        import pyarrow.parquet as pq

        pf = pq.ParquetFile(path, pre_buffer=False, buffer_size=_BUFFER, page_checksum_verification=True)
        units = []
        for g in range(pf.metadata.num_row_groups):
            n = pf.metadata.row_group(g).num_rows
            if label is None:
                units.append((n, None))
                continue
            try:
                units.append((n, pf.read_row_group(g, columns=[label], use_threads=False).column(0).to_pylist()))
            except Exception as e:  # noqa: BLE001 - a damaged label page: this group's rows fail
                units.append((n, e))
        return pf.schema_arrow, units, (), ""
    with pa.memory_map(path) as mm:
        reader = pa.ipc.MessageReader.open_stream(mm)
        schema = pa.ipc.read_schema(reader.read_next_message())
        units, offsets, damage = [], [], ""
        while True:
            at = mm.tell()
            try:
                msg = reader.read_next_message()
                if msg is None:
                    break
                if msg.type == "dictionary":
                    raise UsageError(f"{path}: dictionary-encoded Arrow columns are not read (save the dataset "
                                     "as Parquet, or decode them first)")
                if msg.type != "record batch":
                    continue
                batch = pa.ipc.read_record_batch(msg, schema)
                labels = batch.column(label).to_pylist() if label is not None else None
            except StopIteration:
                break
            except UsageError:
                raise
            except Exception as e:  # noqa: BLE001 - a damaged stream: the batches after it cannot be found
                damage = (f"the Arrow stream is damaged at offset {at} ({type(e).__name__}: {e}): the rows after "
                          f"row {sum(n for n, _ in units) - 1} of this file cannot be listed")
                break
            units.append((batch.num_rows, labels))
            offsets.append(at)
            del batch, msg
        return schema, units, tuple(offsets), damage


def table_source(src: str | os.PathLike, kind: str, *, class_index: str | os.PathLike | None = None,
                 failures: list[InputFailure] | None = None) -> SourceListing:
    """The rows of a ``save_to_disk`` folder (``kind="hf"``) or of Parquet files (``"parquet"``)
    as items (see the module doc)."""
    pa = need_pyarrow()
    files, features, root = dataset_files(src, kind)
    fmt = "arrow" if kind == "hf" else "parquet"
    types: dict[str, str] | None = None
    classes_of: dict[str, list[str]] = {}
    plain = label = None
    items: list[RowItem] = []
    index = 0
    for path in files:
        try:
            if types is None:  # the first file's schema decides the fields
                schema = _open_schema(pa, path, fmt)
                feats = features if features is not None else _hf_features(schema)
                types, classes_of = column_types(schema, feats)
                images = [c for c, t in types.items() if t == "image"]
                plain = len(types) == 2 and len(images) == 1 and any(c in classes_of and t == "int"
                                                                     for c, t in types.items())
                label = next((c for c, t in types.items() if t == "int" and c in classes_of), None) if plain else None
            schema, units, offsets, damage = _units(pa, path, fmt, label)
        except UsageError:
            raise
        except Exception as e:  # noqa: BLE001 - not Parquet/Arrow, a damaged footer: this file's failure
            bad_line(failures, path, 0, f"cannot read this {fmt} file ({type(e).__name__}: {e}): its rows are not "
                                        "packed")
            continue
        if list(schema.names) != list(types):
            bad_line(failures, path, 0, f"its columns {schema.names} differ from the first file's {list(types)}: "
                                        "its rows are not packed")
            continue
        if damage:
            bad_line(failures, path, 0, damage)
        table = _Table(path, fmt, tuple(types), tuple(types.values()), root, offsets)
        for u, (n, labels) in enumerate(units):
            for r in range(n):
                key = f"{index:08d}"
                if isinstance(labels, Exception):
                    bad_line(failures, path, 0, f"row {index}: its label cannot be read "
                                                f"({type(labels).__name__}: {labels})", key)
                elif labels is not None and (labels[r] is None or not 0 <= labels[r] < len(classes_of[label])):
                    bad_line(failures, path, 0, f"row {index}: label {labels[r]} is none of the "
                                                f"{len(classes_of[label])} ClassLabel names", key)
                else:
                    items.append(RowItem(key, path, labels[r] if labels is not None else index, table=table,
                                         unit=u, row=r, index=index))
                index += 1
    if types is None:
        raise UsageError(f"{src}: no readable data files" + (f" ({failures[-1]})" if failures else ""))
    first_classes = next(iter(classes_of.values()), [])
    recorded: dict[str, Any] = {"source": kind, "columns": types}
    if plain:
        classes = lists.Classes(first_classes, note=f"{len(first_classes)} classes from the ClassLabel column "
                                                      f"{label!r}: {lists.Classes(first_classes).first_labels()}")
        if class_index is not None:
            items, classes = _renumber(items, classes, class_index, failures, str(src))
            recorded["label_map"] = classes.label_map
        return SourceListing(items, classes, None, failures if failures is not None else [], recorded, classes.note)
    if class_index is not None:
        raise UsageError("--class-index renumbers a plain image pack's ClassLabel; this table has other columns "
                         "(its ClassLabel names are kept as its classes)")
    try:
        schema_obj = Schema(types)
    except ValueError as e:
        raise UsageError(f"{src}: these columns cannot be fields ({e}); rename them first") from e
    return SourceListing(items, lists.Classes(first_classes), schema_obj, failures if failures is not None else [],
                         recorded, "")


def _open_schema(pa: Any, path: str, fmt: str) -> Any:
    if fmt == "parquet":
        import pyarrow.parquet as pq

        return pq.ParquetFile(path).schema_arrow
    with pa.memory_map(path) as mm:
        return pa.ipc.open_stream(mm).schema


def _renumber(items: list[RowItem], classes: list[str], class_index: Any, failures: list[InputFailure] | None,
              where: str) -> tuple[list[RowItem], lists.Classes]:
    """Labels by ``class_index``'s numbering of the ClassLabel names (a validation split
    numbered as its training classes are); a name the index lacks is refused."""
    index = lists.read_class_index(class_index)
    out = lists.Classes.of_index(index)
    label_of = lists.labels_of(classes, index, where, class_index)[1]
    for it in items:
        it.__dict__["label"] = label_of[classes[it.label]]
    return items, out

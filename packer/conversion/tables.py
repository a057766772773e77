"""Sample manifests as field items: JSON Lines, CSV or Parquet, one row per sample.

Each row is a sample and each column a field. Image columns hold paths relative to the root;
the schema is given (``{column: type}``, see ``packer.codecs.fields``) or inferred from the
first row: a string naming an image file (by extension) is ``image``, a video file ``video``,
other strings ``str``, an integer ``int``, a number ``float``, a list of integers ``labels``, a
list of numbers ``ndarray:float64:*`` (a list of equal-length number lists
``ndarray:float64:*,K``), an object ``json``, bytes (Parquet) ``bytes``. CSV cells are text: numbers are parsed as the schema says,
lists and objects are JSON text. Parquet is read a batch at a time (pyarrow, the ``fields``
extra). A row without a schema column, with an empty value or with a value of the wrong type is
an ``InputFailure`` naming its line (Parquet: its row number); every other row is packed.
"""
from __future__ import annotations

import csv
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping

from packer.codecs.fields import Field, NdarrayField, Schema, parse_field
from packer.conversion.input_failures import InputFailure, bad_line
from packer.conversion.inputs import FieldItem, has_ext, safe_key
from packer.conversion.options import DEFAULT_IMAGE_EXTS, DEFAULT_VIDEO_EXTS
from packer.errors import UsageError

__all__ = ["table_rows", "infer_schema", "table_items", "TABLE_SUFFIXES", "RowItem", "row_identity"]

TABLE_SUFFIXES = (".jsonl", ".ndjson", ".json", ".csv", ".parquet")


def _kind(path: str) -> str:
    suffix = Path(path).suffix.lower()
    if suffix in (".jsonl", ".ndjson", ".json"):
        return "jsonl"
    if suffix in (".csv", ".parquet"):
        return suffix[1:]
    raise UsageError(f"{path}: a sample manifest is .jsonl, .csv or .parquet, not {suffix or 'no suffix'}")


def table_rows(path: str | os.PathLike, *, batch_rows: int = 4096) -> Iterator[tuple[int, Any]]:
    """``(line, row)`` of each row (JSON Lines: 1-based line numbers, blank lines skipped; CSV:
    the header is line 1; Parquet: 1-based row numbers, read ``batch_rows`` at a time). A JSON
    line that does not parse gives a ``ValueError`` as its row."""
    path = str(path)
    kind = _kind(path)
    try:
        if kind == "jsonl":
            with open(path, "rb") as f:
                for n, line in enumerate(f, 1):
                    if line.strip():
                        try:
                            yield n, json.loads(line)
                        except ValueError as e:
                            yield n, ValueError(f"not JSON ({e})")
        elif kind == "csv":
            with open(path, newline="", encoding="utf-8") as f:
                for n, row in enumerate(csv.DictReader(f), 2):
                    yield n, row
        else:
            try:
                import pyarrow.parquet as pq
            except ImportError as e:
                raise UsageError(f"{path}: reading Parquet needs pyarrow: pip install 'packer[fields]'") from e
            n = 0
            for batch in pq.ParquetFile(path).iter_batches(batch_size=batch_rows):
                for row in batch.to_pylist():
                    n += 1
                    yield n, row
    except OSError as e:
        raise UsageError(f"{path}: cannot read the sample manifest ({e.strerror or e})") from e
    except UnicodeDecodeError as e:
        raise UsageError(f"{path}: not UTF-8 text ({e})") from e


def _infer(name: str, value: Any, exts: tuple[str, ...]) -> str:
    if value is None:
        raise UsageError(f"column {name!r}: only empty values; give its type in the schema")
    if isinstance(value, str):
        if has_ext(value, exts):
            return "image"
        return "video" if has_ext(value, DEFAULT_VIDEO_EXTS) else "str"
    if isinstance(value, bool) or isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, (bytes, bytearray)):
        return "bytes"
    if isinstance(value, dict):
        return "json"
    if isinstance(value, list):
        if not value:
            raise UsageError(f"column {name!r}: only empty lists; give its type in the schema")
        if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return "labels"
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
            return "ndarray:float64:*"
        if all(isinstance(v, list) for v in value) and value and len({len(v) for v in value}) == 1:
            return f"ndarray:float64:*,{len(value[0])}"
        return "json"
    raise UsageError(f"column {name!r}: cannot infer a type from {value!r}; give the schema")


def _csv_guess(text: str, exts: tuple[str, ...]) -> Any:
    """A CSV cell's value for type inference."""
    for parse in (int, float):
        try:
            return parse(text)
        except ValueError:
            pass
    if text[:1] in "[{":
        try:
            return json.loads(text)
        except ValueError:
            pass
    return text


def infer_schema(path: str | os.PathLike, *, exts: tuple[str, ...] = DEFAULT_IMAGE_EXTS,
                 rows: int = 1000) -> Schema:
    """The schema of a sample manifest (see the module doc): the first row's columns, each typed
    by its first value among the first ``rows`` rows that is not null or an empty list."""
    is_csv = _kind(str(path)) == "csv"
    seen: dict[str, Any] = {}
    names: list[str] | None = None
    for n, row in table_rows(path):
        if names is None:
            if isinstance(row, Exception) or not isinstance(row, dict) or not row:
                raise UsageError(f"{path}: the first row is not an object of columns; give the schema")
            names = list(row)
        if isinstance(row, dict):
            for name in names:
                v = row.get(name)
                if is_csv and isinstance(v, str):
                    v = _csv_guess(v, exts) if v != "" else None
                if name not in seen or seen[name] in (None, []):
                    seen[name] = v
        if n >= rows or all(seen.get(k) not in (None, []) for k in names):
            break
    if names is None:
        raise UsageError(f"{path}: the sample manifest has no rows")
    return Schema({name: _infer(name, seen[name], exts) for name in names})


def _coerce(f: Field, value: Any, is_csv: bool) -> Any:
    """A row's value as field ``f`` takes it (CSV text parsed); ValueError when it cannot be."""
    if value is None or (is_csv and value == ""):
        raise ValueError("is empty")
    if is_csv and isinstance(value, str) and f.type_name not in ("image", "video", "str", "bytes"):
        try:
            if f.type_name == "int":
                return int(value)
            if f.type_name == "float":
                return float(value)
            return json.loads(value)
        except ValueError as e:
            raise ValueError(f"{value!r} is not a {f.spec()} value") from e
    if is_csv and f.type_name == "bytes":
        return value.encode("utf-8")
    if f.type_name in ("image", "video") and not isinstance(value, str):
        raise ValueError(f"{value!r} is not an {f.type_name} path")
    if isinstance(f, NdarrayField) and isinstance(value, list):
        return value
    return value


def table_items(path: str | os.PathLike, root: str | os.PathLike, *, schema: Schema | Mapping[str, Any] | None = None,
                exts: tuple[str, ...] = DEFAULT_IMAGE_EXTS,
                failures: list[InputFailure] | None = None) -> tuple[list[FieldItem], Schema]:
    """The rows of a sample manifest as items, and the schema (given or inferred).

    Each item's key is its first image column's path (else its first video column's; its row
    number, ``row-00000042``, when the schema has neither); each value is checked against its field (encoded once and dropped),
    so a wrong type is this row's ``InputFailure``, not a failure of the work later.
    """
    path = str(path)
    try:
        schema = infer_schema(path, exts=exts) if schema is None else (
            schema if isinstance(schema, Schema) else Schema({n: parse_field(n, t) for n, t in schema.items()}))
    except ValueError as e:
        raise UsageError(f"--schema: {e}") from e
    is_csv = _kind(path) == "csv"
    images = schema.image_fields or schema.video_fields  # the key's column: an image's, else a video's
    root = Path(root)
    items: list[FieldItem] = []
    for n, row in table_rows(path):
        if isinstance(row, Exception) or not isinstance(row, dict):
            bad_line(failures, path, n, str(row) if isinstance(row, Exception) else "not an object of columns")
            continue
        values: dict[str, Any] = {}
        problem = None
        for f in schema.fields:
            if f.name not in row:
                problem = f"missing column {f.name!r}"
                break
            try:
                value = _coerce(f, row[f.name], is_csv)
                if f.type_name in ("image", "video"):
                    value = safe_key(value, f"{path}:{n}")
                else:
                    f.encode(value)  # the type is checked here, on the listing, not in a worker
            except (ValueError, UsageError) as e:
                problem = f"column {f.name!r}: {e}"
                break
            values[f.name] = value
        if problem is not None:
            key = str(row.get(images[0], "")) if images else ""
            bad_line(failures, path, n, problem, key=key)
            continue
        if images:
            key = values[images[0]]
            items.append(FieldItem(key, str(root / key), row_identity(values), values))
        else:
            items.append(RowItem(f"row-{n:08d}", path, row_identity(values), values))
    return items, schema


def row_identity(values: dict[str, Any]) -> int:
    """A row's ``label``: a 63-bit digest of its values (image and video columns: their paths),
    which the resume and ``--append`` compare, with its first image file's size and mtime."""
    text = json.dumps(values, sort_keys=True, ensure_ascii=False, default=_bytes_hex, separators=(",", ":"))
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little") >> 1


def _bytes_hex(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"bytes": bytes(value).hex()}
    raise TypeError(f"{type(value).__name__} is not a row value")


@dataclass(frozen=True, init=False)
class RowItem(FieldItem):
    """A row without an image or video column: keyed by its line, its ``path`` the manifest; its
    identity is its values alone (``label``), not the manifest file's size and mtime, which a
    grown manifest changes."""

    def identity(self) -> tuple[int, int]:
        """``(0, 0)``: nothing of a file to compare (``packer.conversion.fingerprint.item_stat``)."""
        return 0, 0

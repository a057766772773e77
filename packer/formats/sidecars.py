"""The small files beside a format's data, shared by every format.

``keys.json`` (sample keys by position), ``checksums.bin`` (one little-endian u32 CRC32C per
sample), ``failures.jsonl``, the ``{out}.partial`` working path, and the fsync'ed appends
the resume journals are made of.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from packer.errors import CorruptData
from packer.manifest import atomic_write_bytes

if TYPE_CHECKING:
    import numpy as np

__all__ = ["KEYS_FILE", "CHECKSUMS_FILE", "SOURCES_FILE", "KEYS_JOURNAL", "CRC_JOURNAL", "partial_path",
           "write_failures", "write_keys", "load_keys", "read_keys", "write_checksums", "load_checksums", "keys_checksum",
           "array_checksum", "fsync_append", "write_sources", "load_sources", "SOURCE_COLUMNS"]

KEYS_JOURNAL = ".keys.journal"
CRC_JOURNAL = ".crc.journal"
KEYS_FILE = "keys.json"
CHECKSUMS_FILE = "checksums.bin"
# what ``--append`` compares an input with (docs/append.md): per stored position the source
# file's size and mtime (ns) as it was read, and the label it was packed with; little-endian i64
SOURCES_FILE = "sources.bin"
SOURCE_COLUMNS = 3


def partial_path(out: str | os.PathLike) -> Path:
    """Where an output is built before its atomic rename."""
    out = Path(out)
    return out.with_name(out.name + ".partial")


def write_failures(path: Path, failures: list[dict[str, Any]]) -> None:
    """Write ``failures.jsonl`` (one JSON object per line) atomically."""
    text = "".join(json.dumps(f, ensure_ascii=False, sort_keys=True) + "\n" for f in failures)
    atomic_write_bytes(path, text.encode("utf-8"))


def write_keys(directory: Path, keys: list[str]) -> None:
    """Write ``keys.json`` (a JSON array of the sample keys by position) atomically."""
    atomic_write_bytes(Path(directory) / KEYS_FILE, json.dumps(keys, ensure_ascii=False).encode("utf-8"))


def load_keys(directory: Path, count: int, *, grown: bool = False) -> list[str]:
    """Read ``keys.json``; CorruptData naming it when unreadable or not ``count`` keys long.
    ``grown``: the output was appended to since (or at) the version read: the file may hold
    the keys of later stored positions after the first ``count`` (only those are returned)."""
    return read_keys(directory, count, grown=grown)[0]


def read_keys(directory: Path, count: int, *, grown: bool = False) -> tuple[list[str], str | None]:
    """``load_keys``, and the CRC32C of the file's bytes (as ``keys_checksum`` writes it) when the
    file holds only the keys returned (None when it holds more): for keys ``write_keys`` wrote,
    their ``keys_checksum``, got without encoding them again."""
    from packer.integrity import crc32c

    p = Path(directory) / KEYS_FILE
    try:
        raw = p.read_bytes()
        keys = json.loads(raw.decode("utf-8"))
    except (OSError, ValueError) as e:
        raise CorruptData(str(p), f"cannot read keys ({e})") from e
    if not isinstance(keys, list) or len(keys) < count or (len(keys) > count and not grown):
        raise CorruptData(str(p), f"holds {len(keys) if isinstance(keys, list) else 'no'} keys, "
                                  f"manifest says {count}")
    if len(keys) > count:
        return keys[:count], None
    return keys, f"{crc32c(raw):08x}"


def keys_checksum(keys: Sequence[str]) -> str:
    """CRC32C (8 hex digits) of a key list (its JSON form): the manifest's ``integrity.keys``."""
    from packer.integrity import crc32c

    return f"{crc32c(json.dumps(list(keys), ensure_ascii=False).encode('utf-8', 'surrogatepass')):08x}"


def array_checksum(values: Any, dtype: str) -> str:
    """CRC32C (8 hex digits) of an array's bytes as ``dtype`` (little-endian), e.g. HDF5 labels."""
    import numpy as np

    from packer.integrity import crc32c

    return f"{crc32c(np.ascontiguousarray(np.asarray(values), dtype=dtype).tobytes()):08x}"


def write_checksums(directory: Path, crcs: Sequence[int]) -> None:
    """Write ``checksums.bin`` (one little-endian u32 CRC32C per sample, by position) atomically."""
    import numpy as np

    atomic_write_bytes(Path(directory) / CHECKSUMS_FILE, np.asarray(crcs, dtype="<u4").tobytes())


def load_checksums(path: Path, count: int, *, grown: bool = False) -> "np.ndarray":
    """A ``checksums.bin`` sidecar: one little-endian u32 CRC32C per sample, ``count`` of them
    (``grown``: see ``load_keys``; the first ``count`` are returned)."""
    import numpy as np

    try:
        raw = path.read_bytes()
    except OSError as e:
        raise CorruptData(str(path), f"cannot read checksums ({e})") from e
    if len(raw) < 4 * count or (len(raw) != 4 * count and (not grown or len(raw) % 4)):
        raise CorruptData(str(path), f"{len(raw)} bytes, expected {4 * count} (one u32 per sample)")
    return np.frombuffer(raw, dtype="<u4", count=count)


def write_sources(directory: Path, rows: "np.ndarray") -> None:
    """Write ``sources.bin`` (``SOURCE_COLUMNS`` little-endian i64 per stored position) atomically."""
    import numpy as np

    atomic_write_bytes(Path(directory) / SOURCES_FILE, np.ascontiguousarray(rows, dtype="<i8").tobytes())


def load_sources(path: Path, count: int) -> "np.ndarray | None":
    """The first ``count`` rows of a ``sources.bin`` (size, mtime_ns, label per stored position),
    None when the output has none (packed before it was recorded); CorruptData when short."""
    import numpy as np

    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise CorruptData(str(path), f"cannot read the input table ({e})") from e
    row = 8 * SOURCE_COLUMNS
    if len(raw) < row * count or len(raw) % row:
        raise CorruptData(str(path), f"{len(raw)} bytes, expected {row * count} ({SOURCE_COLUMNS} i64 per sample)")
    return np.frombuffer(raw, dtype="<i8", count=SOURCE_COLUMNS * count).reshape(count, SOURCE_COLUMNS)


def fsync_append(path: Path, data: bytes) -> None:
    """Append ``data`` to ``path`` and fsync it (a journal line survives a kill once this returns)."""
    with open(path, "ab") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())

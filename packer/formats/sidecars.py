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

__all__ = ["KEYS_FILE", "CHECKSUMS_FILE", "KEYS_JOURNAL", "CRC_JOURNAL", "partial_path", "write_failures",
           "write_keys", "load_keys", "write_checksums", "load_checksums", "keys_checksum", "array_checksum",
           "fsync_append"]

KEYS_JOURNAL = ".keys.journal"
CRC_JOURNAL = ".crc.journal"
KEYS_FILE = "keys.json"
CHECKSUMS_FILE = "checksums.bin"


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


def load_keys(directory: Path, count: int) -> list[str]:
    """Read ``keys.json``; CorruptData naming it when unreadable or not ``count`` keys long."""
    p = Path(directory) / KEYS_FILE
    try:
        keys = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise CorruptData(str(p), f"cannot read keys ({e})") from e
    if not isinstance(keys, list) or len(keys) != count:
        raise CorruptData(str(p), f"holds {len(keys) if isinstance(keys, list) else 'no'} keys, "
                                  f"manifest says {count}")
    return keys


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


def load_checksums(path: Path, count: int) -> "np.ndarray":
    """A ``checksums.bin`` sidecar: one little-endian u32 CRC32C per sample, ``count`` of them."""
    import numpy as np

    try:
        raw = path.read_bytes()
    except OSError as e:
        raise CorruptData(str(path), f"cannot read checksums ({e})") from e
    if len(raw) != 4 * count:
        raise CorruptData(str(path), f"{len(raw)} bytes, expected {4 * count} (one u32 per sample)")
    return np.frombuffer(raw, dtype="<u4")


def fsync_append(path: Path, data: bytes) -> None:
    """Append ``data`` to ``path`` and fsync it (a journal line survives a kill once this returns)."""
    with open(path, "ab") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())

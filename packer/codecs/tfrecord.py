"""TFRecord files: record framing, scanning, and the DALI ``.idx`` index beside each file.

Each record is ``u64 length | u32 masked_crc32c(length) | payload | u32 masked_crc32c(payload)``,
little-endian. An index holds one ``"{offset} {size}\\n"`` line per record (size = length + 16),
what NVIDIA DALI's ``tfrecord2idx`` writes.
"""
from __future__ import annotations

import logging
import os
import struct
from pathlib import Path
from typing import Sequence

import numpy as np

from packer.errors import CorruptData, UsageError
from packer.integrity import masked_crc32c
from packer.manifest import atomic_write_bytes

__all__ = ["FRAMING", "INDEX_SUFFIX", "index_path", "frame_record", "unframe_record", "looks_like_tfrecord",
           "scan_tfrecord", "index_bytes", "write_index", "read_index", "index_tfrecords", "tfrecord_candidates",
           "CRC_STRUCT"]

log = logging.getLogger(__name__)

INDEX_SUFFIX = ".idx"
FRAMING = 16  # u64 length + u32 length CRC + u32 payload CRC
_HEAD = struct.Struct("<QI")
CRC_STRUCT = struct.Struct("<I")


def index_path(shard: str | os.PathLike) -> Path:
    """The DALI index beside a shard: ``{shard}.idx``."""
    return Path(f"{os.fspath(shard)}{INDEX_SUFFIX}")


def tfrecord_candidates(folder: Path) -> list[Path]:
    """The files of ``folder`` that may be TFRecord files: not hidden, not ``.idx``, sorted."""
    return [f for f in sorted(folder.iterdir()) if f.is_file() and not f.name.startswith(".")
            and not f.name.endswith(INDEX_SUFFIX)]


# -- framing -----------------------------------------------------------------------------------
def frame_record(payload: bytes) -> bytes:
    """Frame one payload as a TFRecord record (length, its masked CRC, payload, payload CRC)."""
    length = struct.pack("<Q", len(payload))
    return b"".join((length, CRC_STRUCT.pack(masked_crc32c(length)), payload, CRC_STRUCT.pack(masked_crc32c(payload))))


def unframe_record(buf: bytes, *, check_crc: bool = True, where: str = "",
                   position: object = None) -> memoryview:
    """The payload of one whole framed record; CorruptData naming ``where``/``position`` if bad."""
    n = len(buf)
    if n < FRAMING:
        raise CorruptData(where, f"record of {n} bytes is shorter than the {FRAMING}-byte framing",
                          position=position)
    length, length_crc = _HEAD.unpack_from(buf, 0)
    mv = memoryview(buf)
    if check_crc and masked_crc32c(mv[:8]) != length_crc:
        raise CorruptData(where, "length CRC mismatch (bad framing)", position=position)
    if length + FRAMING != n:
        raise CorruptData(where, f"framing says a {length}-byte payload, the index a {n - FRAMING}-byte one",
                          position=position)
    payload = mv[12:12 + length]
    if check_crc and masked_crc32c(payload) != CRC_STRUCT.unpack_from(buf, 12 + length)[0]:
        raise CorruptData(where, "CRC32C mismatch (payload)", position=position)
    return payload


def looks_like_tfrecord(path: str | os.PathLike) -> bool:
    """True when ``path`` is a file that starts with a valid TFRecord record header."""
    try:
        with open(path, "rb") as f:
            head = f.read(12)
    except OSError:
        return False
    return len(head) == 12 and masked_crc32c(head[:8]) == _HEAD.unpack(head)[1]


def scan_tfrecord(path: str | os.PathLike, limit: int | None = None) -> tuple[list[int], list[int]]:
    """Walk a TFRecord file's framing (seeking past payloads): the (offsets, sizes) of its records
    (of its first ``limit`` records when given).

    Raises CorruptData naming the file and record on a bad length CRC or a truncated record.
    """
    path = str(path)
    size = os.path.getsize(path)
    offsets: list[int] = []
    sizes: list[int] = []
    pos = 0
    with open(path, "rb") as f:
        while pos < size and (limit is None or len(offsets) < limit):
            where = f"record {len(offsets)} (byte {pos})"
            f.seek(pos)
            head = f.read(12)
            if len(head) < 12:
                raise CorruptData(path, f"truncated record header ({len(head)} of 12 bytes)", position=where)
            length, length_crc = _HEAD.unpack(head)
            if masked_crc32c(head[:8]) != length_crc:
                raise CorruptData(path, "length CRC mismatch (not a TFRecord file, or corrupt)", position=where)
            if pos + length + FRAMING > size:
                raise CorruptData(path, f"truncated record: needs {length + FRAMING} bytes, "
                                        f"{size - pos} left", position=where)
            offsets.append(pos)
            sizes.append(length + FRAMING)
            pos += length + FRAMING
    return offsets, sizes


# -- index files -------------------------------------------------------------------------------
def index_bytes(offsets: Sequence[int], sizes: Sequence[int]) -> bytes:
    """The bytes of a DALI index: ``"{offset} {size}\\n"`` per record."""
    return "".join(f"{o} {s}\n" for o, s in zip(offsets, sizes)).encode("ascii")


def write_index(path: str | os.PathLike, offsets: Sequence[int], sizes: Sequence[int]) -> None:
    """Write a DALI index (``"{offset} {size}\\n"`` per record) atomically."""
    atomic_write_bytes(path, index_bytes(offsets, sizes))


def read_index(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, sizes) as int64 arrays from a DALI index; CorruptData if unreadable or malformed."""
    try:
        raw = Path(path).read_bytes()
    except OSError as e:
        raise CorruptData(str(path), f"cannot read index ({e.strerror or e})") from e
    lines = [ln.split() for ln in raw.splitlines() if ln.strip()]
    bad = next((k for k, ln in enumerate(lines)
                if len(ln) != 2 or not (ln[0].isdigit() and ln[1].isdigit())), None)
    if bad is not None:
        raise CorruptData(str(path), f"malformed index line {bad + 1} (expected 'offset size')")
    try:
        pairs = np.array(lines, dtype=np.int64).reshape(len(lines), 2)
    except OverflowError:
        raise CorruptData(str(path), "index value out of range") from None
    return pairs[:, 0].copy(), pairs[:, 1].copy()


def index_tfrecords(paths: Sequence[str | os.PathLike]) -> list[tuple[Path, int]]:
    """Write ``{file}.idx`` beside each TFRecord file (a folder: each TFRecord file in it).

    What DALI's ``tfrecord2idx`` does, for files written by other tools. Returns (file,
    records) per file indexed. Raises CorruptData naming the file and record on bad framing.
    """
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = [f for f in tfrecord_candidates(p) if looks_like_tfrecord(f)]
            if not found:
                raise UsageError(f"{p}: no TFRecord files in this folder")
            files.extend(found)
        elif p.is_file():
            files.append(p)
        else:
            raise UsageError(f"{p}: does not exist")
    done = []
    for f in files:
        offsets, sizes = scan_tfrecord(f)
        write_index(index_path(f), offsets, sizes)
        log.info("indexed %s: %d records", f, len(offsets))
        done.append((f, len(offsets)))
    return done

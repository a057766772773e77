"""What crosses the Writer/Reader seam: a ``Sample`` to pack, a ``Record`` read back."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Sample", "Stored", "Record"]


@dataclass
class Sample:
    """One item to pack: encoded bytes (or raw pixels, ``fmt="raw"``) plus what describes them."""

    key: str
    data: bytes
    fmt: str
    label: int
    height: int
    width: int
    channels: int
    extra: dict[str, Any] = field(default_factory=dict)
    # None; the writer's ``prepare`` output, ``(value, crc32c)``, made ahead in a shared-memory
    # worker; or a ``Stored`` when a worker already stored the sample. Never part of equality or
    # of what is stored.
    prepared: Any = field(default=None, repr=False, compare=False)
    # ``(size, mtime_ns)`` of the source file as the work read it (its fstat), when it read one:
    # the resume fingerprint's per-input row, without a stat of its own.
    source_stat: tuple[int, int] | None = field(default=None, repr=False, compare=False)


@dataclass
class Stored:
    """``Sample.prepared`` of a sample a worker process already stored in the output's working
    folder (its ``data`` is then empty): the CRC32C the format records for it, the size of its
    data, the worker's part file it completes if it is that file's last sample (``shard``:
    a records shard is adopted when it arrives), and the part file its bytes are in with their
    offset there (``part``, ``offset``: where an HDF5 writer copies them from)."""

    crc: int
    size: int
    shard: Any = None
    part: Any = None
    offset: int = 0


@dataclass
class Record:
    """One stored sample as a reader returns it."""

    data: bytes
    label: int
    fmt: str = ""
    height: int = 0
    width: int = 0
    channels: int = 0

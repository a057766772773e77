"""What crosses the Writer/Reader seam: a ``Sample`` to pack, a ``Record`` read back."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Sample", "Record"]


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


@dataclass
class Record:
    """One stored sample as a reader returns it."""

    data: bytes
    label: int
    fmt: str = ""
    height: int = 0
    width: int = 0
    channels: int = 0

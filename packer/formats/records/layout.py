"""records format: shard names, sizes, the shards journal, and hashing a shard file."""
from __future__ import annotations

import hashlib
import os
import re

import numpy as np

from packer.errors import UsageError

__all__ = ["DEFAULT_SHARD_SIZE", "SHARDS_JOURNAL", "SHARD_RE", "parse_size", "shard_name", "sha256_file",
           "join_index"]

DEFAULT_SHARD_SIZE = 256 * 10**6
SHARDS_JOURNAL = ".shards.json"
SHARD_RE = r"^\.?{name}-(\d{{5,}})\.tfrecord(?:\.idx|\.partial)?$"
_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "t": 10**12, "tb": 10**12, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


def parse_size(value: int | str) -> int:
    """``256MB`` -> 256_000_000 (``KB/MB/GB/TB`` decimal, ``KiB/MiB/GiB/TiB`` binary, plain = bytes)."""
    if isinstance(value, int) and not isinstance(value, bool):
        size = value
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(value))
        unit = m.group(2).lower() if m else None
        if m is None or unit not in _UNITS:
            raise UsageError(f"bad size {value!r} (examples: 256MB, 1GiB, 1000000)")
        size = int(float(m.group(1)) * _UNITS[unit])
    if size < 1:
        raise UsageError(f"size must be positive, not {value!r}")
    return size


def shard_name(name: str, i: int) -> str:
    """The file name of shard ``i``: ``{name}-{i:05d}.tfrecord``."""
    return f"{name}-{i:05d}.tfrecord"


def sha256_file(path: str | os.PathLike, digest: "hashlib._Hash | None" = None) -> "hashlib._Hash":
    """``digest`` (a new sha256 when None) updated with the bytes of ``path``, read in 1 MiB blocks."""
    digest = hashlib.sha256() if digest is None else digest
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest


def join_index(offsets: list[np.ndarray], sizes: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-shard (offsets, sizes) joined: (offsets, sizes, first position of each shard)."""
    counts = [len(o) for o in offsets]
    starts = np.concatenate(([0], np.cumsum(counts)[:-1])).astype(np.int64) if counts else np.zeros(0, np.int64)
    cat = (lambda xs: np.concatenate(xs) if xs else np.zeros(0, np.int64))
    return cat(offsets), cat(sizes), starts

"""records format: shard names, sizes, the shards journal, and hashing a shard file."""
from __future__ import annotations

import hashlib
import os

import numpy as np


__all__ = ["DEFAULT_SHARD_SIZE", "SHARDS_JOURNAL", "SHARD_RE", "shard_name", "sha256_file",
           "join_index"]

DEFAULT_SHARD_SIZE = 256 * 10**6
SHARDS_JOURNAL = ".shards.json"
SHARD_RE = r"^\.?{name}-(\d{{5,}})\.tfrecord(?:\.idx|\.partial)?$"
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

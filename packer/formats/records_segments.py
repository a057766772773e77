"""Records shards written by the workers themselves (``to-records`` with several workers).

The writer's side of it (the worker's side is ``packer.conversion.sharded``). A worker runs
the per-item work over one *segment* (a range of consecutive inputs), frames
each sample as ``RecordsWriter`` does and appends it to its own shard file in the output's
working folder (``.seg-{writer pid}-{first}-{stop}-{j}.partial``, rolled over at
``--shard-size``), hashing it (sha256) as it goes, then fsyncs it and writes and fsyncs its
index beside it (``....idx.partial``). What comes back to the writer's process is small: per
input a ``WorkResult`` of *stored* samples (key, label, size, CRC32C of the payload, no
bytes); the last stored sample of each shard file carries that file's ``SegmentShard``
(its two files, record count, size, sha256). ``RecordsWriter.add`` adopts a shard when its
last sample arrives, in input order: it renames the index and the file to the next
``{name}-{i:05d}.tfrecord(.idx)``, fsyncs the folder and journals it, the same durable commit
as a shard it wrote itself. So the output,
``--resume`` (exact: a checkpoint is a whole number of adopted shards), per-sample CRCs, the
per-shard sha256, fsync and the atomic publish are those of a single writer; only the shard
boundaries differ (a segment's end also ends a shard).
"""
from __future__ import annotations

from dataclasses import dataclass

from packer.formats.sample import Stored  # noqa: F401 (re-exported: what a stored sample carries)

__all__ = ["SegmentShard", "Stored", "SegmentWriteError", "SEGMENT_PREFIX", "is_segment_file", "segment_file",
           "segment_index_file"]

SEGMENT_PREFIX = ".seg-"


def segment_file(tag: str, j: int) -> str:
    """The name of file ``j`` of the segment ``tag`` (a worker's shard, before adoption)."""
    return f"{SEGMENT_PREFIX}{tag}-{j:04d}.partial"


def segment_index_file(tag: str, j: int) -> str:
    """The name of the index of file ``j`` of the segment ``tag`` (renamed with it on adoption)."""
    return f"{SEGMENT_PREFIX}{tag}-{j:04d}.idx.partial"


def is_segment_file(name: str) -> bool:
    """A worker's shard file or index not adopted (yet): removed on resume and at the end."""
    return name.startswith(SEGMENT_PREFIX) and name.endswith(".partial")


@dataclass
class SegmentShard:
    """One shard file a worker completed, waiting to be adopted: the file and its index, both
    written and fsynced; its record count, size in bytes and sha256."""

    path: str
    index: str
    count: int
    bytes: int
    sha256: str


@dataclass
class SegmentWriteError:
    """A worker could not write its shard (disk full, ...): the run stops as on a writer error."""

    message: str

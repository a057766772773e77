"""Records shards written by the workers themselves (``to-records`` with several workers).

The writer's side of it (the worker's side is ``packer.conversion.sharded``). A worker runs
the per-item work over one *segment* (a range of consecutive inputs), frames
each sample as ``RecordsWriter`` does and appends it to its own shard file in the output's
working folder (``.seg-{first input}-{j}.partial``, rolled over at ``--shard-size``), hashing
it (sha256) as it goes, then fsyncs it. What comes back to the writer's process is small: per
input a ``WorkResult`` of *stored* samples (key, label, size, CRC32C of the payload, no
bytes); the last stored sample of each shard file carries that file's ``SegmentShard``
(offsets, sizes, sha256). ``RecordsWriter.add`` adopts a shard when its last sample arrives,
in input order: it renames the file to the next ``{name}-{i:05d}.tfrecord``, writes its
index and journals it, the same durable commit as a shard it wrote itself. So the output,
``--resume`` (exact: a checkpoint is a whole number of adopted shards), per-sample CRCs, the
per-shard sha256, fsync and the atomic publish are those of a single writer; only the shard
boundaries differ (a segment's end also ends a shard).
"""
from __future__ import annotations

from dataclasses import dataclass

from packer.formats.sample import Stored  # noqa: F401 (re-exported: what a stored sample carries)

__all__ = ["SegmentShard", "Stored", "SegmentWriteError", "SEGMENT_PREFIX", "is_segment_file", "segment_file"]

SEGMENT_PREFIX = ".seg-"


def segment_file(tag: str, j: int) -> str:
    """The name of file ``j`` of the segment ``tag`` (a worker's shard, before adoption)."""
    return f"{SEGMENT_PREFIX}{tag}-{j:04d}.partial"


def is_segment_file(name: str) -> bool:
    """A worker's shard file not adopted (yet): removed on resume and at the end."""
    return name.startswith(SEGMENT_PREFIX) and name.endswith(".partial")


@dataclass
class SegmentShard:
    """One shard file a worker completed (written and fsynced), waiting to be adopted."""

    path: str
    offsets: list[int]
    sizes: list[int]
    sha256: str

    @property
    def count(self) -> int:
        return len(self.offsets)

    @property
    def bytes(self) -> int:
        return (self.offsets[-1] + self.sizes[-1]) if self.offsets else 0


@dataclass
class SegmentWriteError:
    """A worker could not write its shard (disk full, ...): the run stops as on a writer error."""

    message: str

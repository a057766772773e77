"""Part files written by the workers themselves (``to-records`` and ``to-hdf5`` with workers).

The writer's side of it (the worker's side is ``packer.conversion.plans.sharded``). A worker runs
the per-item work over one *segment* (a range of consecutive inputs) and appends each sample's
stored bytes (the format's ``Writer.segments.record``) to part files of its own in the writer's
``segment_dir`` (``.seg-{writer pid}-{first}-{stop}-{j}.partial``), then closes them (a
records shard fsynced, an HDF5 part only flushed: see below). What
comes back to the writer's process is small: per input a ``WorkResult`` of *stored* samples
(key, label, size, CRC32C, where in which part file its bytes are; no bytes); the last stored
sample of each part file carries that file's ``SegmentShard``.

* **records** (``Segments.indexed``): a part file is a shard as it is, rolled over at
  ``--shard-size``, hashed (sha256) as it is written, its DALI index written and fsynced beside
  it (``....idx.partial``). ``RecordsWriter.add`` adopts a shard when its last sample arrives,
  in input order: it renames the index and the file to the next ``{name}-{i:05d}.tfrecord(.idx)``,
  fsyncs the folder and journals it, the same durable commit as a shard it wrote itself. Only
  the shard boundaries differ from a single writer's (a segment's end also ends a shard).
* **HDF5**: one part file per segment, in the journal folder beside the ``.h5.partial``. At
  each commit the writer copies the committed samples' bytes from the parts into the one file
  in large reads (checking each sample's CRC32C on the way: a part that changed on disk is an
  error, never a stored sample), fsyncs it, and deletes each part whose last sample it holds.
  The file is byte for byte the one a single writer makes. A part is never fsynced nor written
  back early: it is read once from the page cache, and a crash before the commit that copies
  it reruns its inputs, so its durability would buy nothing and cost every byte a second trip
  to the disk, with the worker waiting on it (``python -m scripts.bench.write``'s part-file rows).

Either way ``--resume`` is exact (a checkpoint counts only samples the writer made durable;
parts not taken over are removed on resume and at the end), and per-sample CRCs, fsync and
the atomic publish are those of a single writer.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from packer.formats.sample import Sample, Stored

__all__ = ["SegmentShard", "Stored", "StoredSamples", "SegmentWriteError", "SEGMENT_PREFIX", "is_segment_file",
           "segment_file", "segment_index_file", "remove_segment_files"]

SEGMENT_PREFIX = ".seg-"


def segment_file(tag: str, j: int) -> str:
    """The name of file ``j`` of the segment ``tag`` (a worker's shard, before adoption)."""
    return f"{SEGMENT_PREFIX}{tag}-{j:04d}.partial"


def segment_index_file(tag: str, j: int) -> str:
    """The name of the index of file ``j`` of the segment ``tag`` (renamed with it on adoption)."""
    return f"{SEGMENT_PREFIX}{tag}-{j:04d}.idx.partial"


def is_segment_file(name: str) -> bool:
    """A worker's part file or index not taken over (yet): removed on resume and at the end."""
    return name.startswith(SEGMENT_PREFIX) and name.endswith(".partial")


def remove_segment_files(folder: Path) -> None:
    """Remove the part files in ``folder`` no writer took over (a crashed worker's, a killed
    run's, or written for a retry before a resume)."""
    if folder.is_dir():
        for p in folder.iterdir():
            if is_segment_file(p.name):
                p.unlink()


@dataclass
class SegmentShard:
    """One part file a worker completed, waiting to be taken over: the file and (``indexed``
    formats) its index, both written and fsynced; its record count, size in bytes and (indexed)
    sha256. Unindexed parts have ``index`` and ``sha256`` empty."""

    path: str
    index: str
    count: int
    bytes: int
    sha256: str


@dataclass
class StoredSamples:
    """Samples workers stored, of consecutive inputs that gave one sample each (no manifest entry,
    no note), handed to the writer at once (``Writer.add_stored``): what a segment's inputs give
    back in the usual case, without a ``Sample`` per input.

    ``rows``: per sample ``(key, fmt, label, height, width, channels, extra or None, CRC32C, data
    size, part file number, source_stat, offset in the part file)``, in input order; ``parts``: the
    part files by number (a ``SegmentShard`` each); ``ends``: ``(n, part)`` for each part file
    whose last sample is among the rows, ``n`` the rows up to and including it, in order.
    """

    rows: list[tuple]
    parts: list[SegmentShard]
    ends: list[tuple[int, int]]

    def __len__(self) -> int:
        return len(self.rows)

    def keys(self) -> list[str]:
        return [r[0] for r in self.rows]

    def crcs(self) -> list[int]:
        return [r[7] for r in self.rows]

    def stats(self) -> list[Any]:
        """Per sample the ``source_stat`` its input's work read (None where it read none)."""
        return [r[10] for r in self.rows]

    def size(self, start: int = 0, stop: int | None = None) -> int:
        """The data bytes of rows ``start:stop``."""
        return sum(r[8] for r in itertools.islice(self.rows, start, stop))

    def head(self, n: int) -> "StoredSamples":
        """The first ``n`` samples."""
        return StoredSamples(self.rows[:n], self.parts, [(e, k) for e, k in self.ends if e <= n])

    def samples(self) -> Iterator[Sample]:
        """Each row as the ``Sample`` it stands for (``data`` empty, ``prepared`` its ``Stored``)."""
        parts, last = self.parts, {n - 1: k for n, k in self.ends}
        for j, (key, fmt, label, h, w, c, extra, crc, size, k, stat, at) in enumerate(self.rows):
            yield Sample(key, b"", fmt, label, h, w, c, extra if extra is not None else {},
                         Stored(crc, size, parts[k] if last.get(j) == k else None, parts[k], at), stat)


@dataclass
class SegmentWriteError:
    """A worker could not write its shard (disk full, ...): the run stops as on a writer error."""

    message: str

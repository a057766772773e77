"""HDF5 through part files: what the workers store and how the writer reads it back.

With worker processes (``packer.conversion.plans.sharded``) each worker appends the stored bytes of
its samples (``part_record``) to a part file of its own in the journal folder beside the
``.h5.partial``; the writer's process gets per sample a ``Stored`` (size, CRC32C, which part,
which offset) and no bytes. At each commit ``PartBytes.join`` reads a run of samples' bytes
back in one positioned read per stretch of consecutive bytes, checking each sample's CRC32C
against the worker's, and ``Deleter`` removes each part once its last sample is durable in the
file. See ``packer.formats.segments`` for the whole protocol.
"""
from __future__ import annotations

import os
import threading
from typing import Any

import numpy as np

from packer.errors import CorruptData
from packer.formats.sample import Sample, Stored
from packer.integrity import crc32c

__all__ = ["part_record", "stored_size", "PartBytes", "Deleter"]


def part_record(sample: Sample) -> tuple[bytes, int]:
    """What a worker appends to its part file for one sample: the bytes as stored, their CRC32C."""
    return sample.data, crc32c(sample.data)


def stored_size(sample: Sample) -> int:
    """The stored size of a sample, also of one a worker stored (its ``data`` is then empty)."""
    prepared = sample.prepared
    return prepared.size if isinstance(prepared, Stored) else len(sample.data)


class PartBytes:
    """The bytes of runs of samples, those workers stored read back from their part files:
    one positioned read per stretch of consecutive bytes in one part, each sample's CRC32C
    checked against the worker's (a part changed on disk stops the run, never stores). A
    context manager: the parts opened are closed at its end."""

    def __init__(self) -> None:
        self._fds: dict[str, int] = {}

    def __enter__(self) -> "PartBytes":
        return self

    def __exit__(self, *exc: Any) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds = {}

    def join(self, samples: list[Sample]) -> bytes | np.ndarray:
        """The samples' stored bytes, concatenated (in memory or read from their parts)."""
        if not any(isinstance(s.prepared, Stored) for s in samples):
            return b"".join(s.data for s in samples)
        buf = np.empty(sum(stored_size(s) for s in samples), dtype=np.uint8)  # every byte is filled below
        view = memoryview(buf)
        pos = 0
        run: tuple[str, int, int] | None = None  # (part path, its offset, where in buf) being gathered
        for s in samples:
            stored = s.prepared
            if not isinstance(stored, Stored):
                if run is not None:
                    self._read(run, view[run[2]:pos])
                    run = None
                view[pos:pos + len(s.data)] = s.data
            elif run is None or run[0] != stored.part.path or run[1] + (pos - run[2]) != stored.offset:
                if run is not None:
                    self._read(run, view[run[2]:pos])
                run = (stored.part.path, stored.offset, pos)
            pos += stored_size(s)
        if run is not None:
            self._read(run, view[run[2]:pos])
        pos = 0
        for s in samples:
            size = stored_size(s)
            stored = s.prepared
            if isinstance(stored, Stored) and crc32c(view[pos:pos + size]) != stored.crc:
                raise CorruptData(stored.part.path, "a worker's part file changed after it was written "
                                                    "(CRC32C mismatch); nothing of it was stored",
                                  position=f"byte {stored.offset}", key=s.key)
            pos += size
        return buf

    def _read(self, run: tuple[str, int, int], into: memoryview) -> None:
        path, offset, _ = run
        fd = self._fds.get(path)
        if fd is None:
            fd = self._fds[path] = os.open(path, os.O_RDONLY)
        done = 0
        while done < len(into):
            n = os.preadv(fd, [into[done:]], offset + done)
            if n == 0:
                raise CorruptData(path, f"a worker's part file ends at byte {offset + done}, "
                                        f"{len(into) - done} bytes short")
            done += n


class Deleter:
    """Deletes part files on a thread of its own: freeing a part's page cache is kernel work
    that grows with the part's size and can run beside the next batch. ``later(paths)`` waits
    for the previous batch first; ``join()`` waits for the last (a writer's close)."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None

    def later(self, paths: list[str]) -> None:
        """Delete ``paths`` in the background (after the previous ones are gone)."""
        self.join()
        if paths:
            self._thread = threading.Thread(target=_unlink_all, args=(paths,), name="packer-hdf5-parts",
                                            daemon=True)
            self._thread.start()

    def join(self) -> None:
        """Wait until every part handed to ``later`` is deleted (or found gone)."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None


def _unlink_all(paths: list[str]) -> None:
    for path in paths:
        try:
            os.unlink(path)
        except OSError:  # gone already; what is left is removed with the journal folder
            pass

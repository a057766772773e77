"""Whole-file reads with the fewest system calls and copies.

``open(path, "rb").read()`` builds a ``FileIO`` and a ``BufferedReader``, asks ``fstat`` for a
size hint and reads through the buffer; ``read_file`` makes the two ``read`` calls the kernel
needs into one exactly sized ``bytes``. Packing reads every input once in the writer's process
(the single writer's budget, see ``docs/writing.md``), so the difference counts there.
"""
from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Callable

import numpy as np

from packer.errors import UsageError

__all__ = ["read_file", "read_file_stat", "read_framed", "remove_path", "visible_files", "parse_bytes"]

_FLAGS = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
_CHUNK = 1 << 20


def read_file(path: str | os.PathLike) -> bytes:
    """The whole content of ``path``, read to its end (a file that grows while it is read is
    read to wherever its end is then, as ``open().read()`` would); raises ``OSError``."""
    return read_file_stat(path)[0]


def read_file_stat(path: str | os.PathLike) -> tuple[bytes, tuple[int, int]]:
    """``read_file`` and the ``(size, mtime_ns)`` the open file had when it was read (its fstat)."""
    fd = os.open(path, _FLAGS)
    try:
        st = os.fstat(fd)
        size = st.st_size
        data = os.read(fd, size + 1)  # one call for a regular file; the +1 sees a file that grew
        more = os.read(fd, _CHUNK)  # b"" at the end; a short read (a pipe, a network mount) goes on
        if not more:
            return data, (size, st.st_mtime_ns)
        return _to_end(fd, [data, more]), (size, st.st_mtime_ns)
    finally:
        os.close(fd)


def _to_end(fd: int, parts: list[bytes]) -> bytes:
    """``parts`` (what was read so far, the last one not empty) and the rest of ``fd``, joined."""
    more = parts[-1]
    while more:
        more = os.read(fd, _CHUNK)
        parts.append(more)
    return b"".join(parts)


def _buffer(n: int) -> memoryview:
    """``n`` writable bytes, not zeroed first: ``read_framed``'s caller sees only the bytes read and
    the fields it writes itself (``bytearray(n)`` would clear each file-sized buffer before the
    read fills it)."""
    return memoryview(np.empty(n, dtype=np.uint8))


def read_framed(path: str | os.PathLike, head: int, tail: int) -> tuple[memoryview, int, tuple[int, int]]:
    """The whole content of ``path`` read into a fresh writable buffer behind ``head`` free bytes
    and before at least ``tail``: ``(view of the buffer, size, (file size, mtime_ns))``, the
    content being ``view[head:head + size]`` and the last the open file's fstat. A format that
    stores the bytes inside a value it builds around them (LMDB's Datum, ``Writer.framing``)
    then writes its fields into the room instead of copying the data. Read to the file's end
    as ``read_file`` reads; raises ``OSError``."""
    fd = os.open(path, _FLAGS)
    try:
        st = os.fstat(fd)
        size = st.st_size
        buf = _buffer(head + size + 1 + tail)
        got = os.readv(fd, [buf[head:head + size + 1]])  # the +1 sees a file that grew
        if got == size:  # all fstat counted and no byte past it: the end (a regular file reads
            return buf, got, (size, st.st_mtime_ns)  # short only there; saves a read per file)
        more = os.read(fd, _CHUNK)  # b"" at the end; a short read (a pipe, a network mount) goes on
        if not more and got <= size:
            return buf, got, (size, st.st_mtime_ns)
        data = _to_end(fd, [bytes(buf[head:head + got]), more]) if more else bytes(buf[head:head + got])
    finally:
        os.close(fd)
    buf = memoryview(bytearray(head + len(data) + tail))
    buf[head:head + len(data)] = data
    return buf, len(data), (size, st.st_mtime_ns)


def remove_path(path: str | os.PathLike) -> None:
    """``path`` gone, whatever it is (a folder tree, a file, a link); nothing when it is not there."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def visible_files(top: str | os.PathLike, unlisted: Callable[[OSError], None]) -> list[str]:
    """Relative paths (``os.sep`` joined) of the non-hidden files below ``top``, its folders
    walked in sorted order; symlinked folders are not entered. ``unlisted(error)`` is called for
    each folder that cannot be listed (no permission, an I/O error, a path too long; the error's
    ``filename`` names it): ``os.walk`` alone skips such a folder in silence, so the caller must
    record it or raise."""
    found = []
    for dirpath, dirnames, filenames in os.walk(top, onerror=unlisted, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        rel = os.path.relpath(dirpath, top)
        for name in filenames:
            if name.startswith("."):
                continue
            found.append(name if rel == "." else os.path.join(rel, name))
    return found


_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "t": 10**12, "tb": 10**12, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


def parse_bytes(value: int | str) -> int:
    """A byte size: ``256MB`` -> 256_000_000 (``KB/MB/GB/TB`` decimal, ``KiB/MiB/GiB/TiB`` binary,
    plain = bytes, an int as is); UsageError when malformed or not positive."""
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

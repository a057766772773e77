"""Whole-file reads with the fewest system calls and copies.

``open(path, "rb").read()`` builds a ``FileIO`` and a ``BufferedReader``, asks ``fstat`` for a
size hint and reads through the buffer; ``read_file`` makes the two ``read`` calls the kernel
needs into one exactly sized ``bytes``. Packing reads every input once in the writer's process
(the single writer's budget, see ``docs/writing.md``), so the difference counts there.
"""
from __future__ import annotations

import os

__all__ = ["read_file"]

_FLAGS = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
_CHUNK = 1 << 20


def read_file(path: str | os.PathLike) -> bytes:
    """The whole content of ``path``, read to its end (a file that grows while it is read is
    read to wherever its end is then, as ``open().read()`` would); raises ``OSError``."""
    fd = os.open(path, _FLAGS)
    try:
        size = os.fstat(fd).st_size
        data = os.read(fd, size + 1)  # one call for a regular file; the +1 sees a file that grew
        more = os.read(fd, _CHUNK)  # b"" at the end; a short read (a pipe, a network mount) goes on
        if not more:
            return data
        parts = [data, more]
        while more:
            more = os.read(fd, _CHUNK)
            parts.append(more)
        return b"".join(parts)
    finally:
        os.close(fd)

"""Keep freed heap memory for reuse, instead of handing it back to the kernel.

glibc's malloc returns the top of its heap to the kernel whenever more than
``M_TRIM_THRESHOLD`` (128 KiB at start) is free there, and serves every block of 128 KiB or
more with its own ``mmap``. Packing allocates and frees a file-sized buffer per sample and,
in LMDB, a transaction's worth of dirty pages per commit (up to ``commit_bytes``), so a fresh
process gives those pages back and faults them in again, zeroed, over and over (a commit's
worth of 60 kB blocks freed and allocated again faults at least five times less once tuned:
``tests/test_heap.py``). glibc
raises both thresholds by itself only after the first large ``mmap``'d block is freed, which
a long-lived process (a notebook, a benchmark that ran other rows first) has usually done and
a command started on its own has not. ``tune_heap`` sets them once, before any worker is
forked (they inherit it): blocks below 32 MiB come from the heap, and up to 256 MiB of free
heap is kept. Elsewhere than glibc it does nothing.

Reading pays the same tax: every decoded image is a fresh block of about a megabyte, faulted in
zeroed when the heap was trimmed. A reader (``packer.formats.reader.Reader``: every packer
dataset) tunes the heap when it is opened and when a spawned DataLoader worker unpickles it, so
a training script is fast by default. ``PACKER_TUNE_HEAP=0`` in the environment leaves glibc's
defaults alone (``tune_heap`` then returns False).
"""
from __future__ import annotations

import contextlib
import ctypes
import gc
import logging
import os
import platform
from typing import Iterator

__all__ = ["tune_heap", "collector_paused"]

log = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
TRIM_BYTES = 256 << 20
MMAP_BYTES = 32 << 20  # glibc's largest (HEAP_MAX / 2 on 64-bit)
_result: bool | None = None  # the first call's answer (libc_ver reads the interpreter's binary)


def tune_heap() -> bool:
    """Raise glibc's trim and mmap thresholds for this process (once); True when set."""
    global _result
    if _result is None:
        _result = os.environ.get("PACKER_TUNE_HEAP", "1") != "0" and _tune()
    return _result


def _tune() -> bool:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(None)
        ok = libc.mallopt(_M_MMAP_THRESHOLD, MMAP_BYTES) == 1 and libc.mallopt(_M_TRIM_THRESHOLD, TRIM_BYTES) == 1
    except (OSError, AttributeError):  # pragma: no cover - no mallopt in this libc
        return False
    if not ok:  # pragma: no cover
        log.debug("mallopt refused the heap thresholds")
    return ok


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector while a bulk of long-lived objects without
    cycles is built (a listing's millions of items): each full collection it would start
    walks every object made so far, all of them still live, and frees nothing. Collections
    resume as before when the block ends (also on an error)."""
    # Pays: listing 101,000 inputs in an append's fresh process, 0.21 s of CPU against 0.25-0.27
    # without it (the phase table of `python -m scripts.bench.append append --n 100000
    # --rounds 3`, run beside the commit before).
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()

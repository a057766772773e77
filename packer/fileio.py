"""Whole-file reads with the fewest system calls and copies.

``open(path, "rb").read()`` builds a ``FileIO`` and a ``BufferedReader``, asks ``fstat`` for a
size hint and reads through the buffer; ``read_file`` makes the two ``read`` calls the kernel
needs into one exactly sized ``bytes``. Packing reads every input once in the writer's process
(the single writer's budget, see ``docs/writing.md``), so the difference counts there.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import stat as stat_mode
from pathlib import Path
from typing import Callable

from packer.errors import UsageError

__all__ = ["file_sha256", "MAX_INPUT_BYTES", "max_input_bytes", "not_regular", "read_file", "read_file_stat",
           "remove_path", "fsync_path", "visible_files", "parse_bytes", "place"]

# O_NONBLOCK: opening a named pipe must not wait for a writer (the fstat after the open refuses
# anything that is not a regular file before a byte is read; on a regular file it changes nothing)
_FLAGS = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0) | getattr(os, "O_NONBLOCK", 0)
_CHUNK = 1 << 20

MAX_INPUT_BYTES = 1 << 30
"""The default cap on one whole-file read (1 GiB: larger than any real image; the environment
variable ``PACKER_MAX_INPUT_BYTES`` sets another). A bigger file is refused as unreadable (a
recorded failure) before it is read, so no input can take a worker's memory."""


# ``os.environ``'s own table where it has one (POSIX: encoded keys and values, which setting or
# deleting a variable through ``os.environ`` updates): a miss there is a dict lookup, where
# ``os.environ.get`` of an unset variable raises and catches a KeyError (~2 µs, on every input read)
_ENVIRON = getattr(os.environ, "_data", None)
_CAP_KEY = os.environ.encodekey("PACKER_MAX_INPUT_BYTES") if _ENVIRON is not None else None


def max_input_bytes() -> int:
    """The cap on one whole-file read: ``PACKER_MAX_INPUT_BYTES`` when set (bytes), else
    ``MAX_INPUT_BYTES``. Read at each call, so worker processes see the parent's setting."""
    if _ENVIRON is not None and _CAP_KEY not in _ENVIRON:
        return MAX_INPUT_BYTES
    raw = os.environ.get("PACKER_MAX_INPUT_BYTES")
    if not raw:
        return MAX_INPUT_BYTES
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"PACKER_MAX_INPUT_BYTES must be a number of bytes, not {raw!r}") from None
    if value < 1:
        raise ValueError(f"PACKER_MAX_INPUT_BYTES must be >= 1, not {value}")
    return value


_KINDS = ((stat_mode.S_ISFIFO, "a named pipe (FIFO)"), (stat_mode.S_ISSOCK, "a socket"),
          (stat_mode.S_ISCHR, "a character device"), (stat_mode.S_ISBLK, "a block device"),
          (stat_mode.S_ISDIR, "a folder"))


def not_regular(mode: int) -> str | None:
    """None for a regular file's ``st_mode``, else what it is (``"a named pipe (FIFO)"``, ...)."""
    if stat_mode.S_ISREG(mode):
        return None
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _open(path: str | os.PathLike) -> int:
    """``os.open`` for reading an input; an open refused because the path is not a regular
    file (a socket: ENXIO) says what it is instead."""
    try:
        return os.open(path, _FLAGS)
    except OSError as e:
        try:
            kind = not_regular(os.stat(path).st_mode)
        except OSError:
            kind = None
        if kind is None or kind == "a folder":
            raise
        raise OSError(f"is {kind}, not a regular file") from e


def _checked(fd: int, limit: int | None) -> os.stat_result:
    """The fstat of an open input, refusing (OSError) anything but a regular file of at most
    ``limit`` bytes (None: ``max_input_bytes()``)."""
    st = os.fstat(fd)
    kind = not_regular(st.st_mode)
    if kind is not None:
        raise OSError(f"is {kind}, not a regular file")
    cap = max_input_bytes() if limit is None else limit
    if st.st_size > cap:
        raise OSError(f"{st.st_size} bytes, over the {cap}-byte cap on one input (PACKER_MAX_INPUT_BYTES)")
    return st


def read_file(path: str | os.PathLike, *, limit: int | None = None) -> bytes:
    """The whole content of ``path``, read to its end (a file that grows while it is read is
    read to wherever its end is then, as ``open().read()`` would); raises ``OSError``, also for
    anything but a regular file (a named pipe is never waited on) and for a file over ``limit``
    bytes (None: ``max_input_bytes()``), before or while it is read."""
    return read_file_stat(path, limit=limit)[0]


def read_file_stat(path: str | os.PathLike, *, limit: int | None = None) -> tuple[bytes, tuple[int, int]]:
    """``read_file`` and the ``(size, mtime_ns)`` the open file had when it was read (its fstat)."""
    fd = _open(path)
    try:
        st = _checked(fd, limit)
        size = st.st_size
        data = os.read(fd, size + 1)  # one call for a regular file; the +1 sees a file that grew
        more = os.read(fd, _CHUNK)  # b"" at the end; a short read (a network mount) goes on
        if not more:
            return data, (size, st.st_mtime_ns)
        return _to_end(fd, [data, more], max_input_bytes() if limit is None else limit), (size, st.st_mtime_ns)
    finally:
        os.close(fd)


def _to_end(fd: int, parts: list[bytes], limit: int) -> bytes:
    """``parts`` (what was read so far, the last one not empty) and the rest of ``fd``, joined;
    OSError once more than ``limit`` bytes came (a file that keeps growing)."""
    more, total = parts[-1], sum(map(len, parts))
    while more:
        if total > limit:
            raise OSError(f"grew past the {limit}-byte cap on one input while it was read (PACKER_MAX_INPUT_BYTES)")
        more = os.read(fd, _CHUNK)
        total += len(more)
        parts.append(more)
    return b"".join(parts)


def file_sha256(path: str | os.PathLike) -> str:
    """The hex sha256 of a local file, read 1 MiB at a time."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fsync_path(path: str | os.PathLike) -> None:
    """fsync a file or a folder by path (a folder: the names a rename put in it survive a crash)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_path(path: str | os.PathLike) -> None:
    """``path`` gone, whatever it is (a folder tree, a file, a link); nothing when it is not there."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def place(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """Make ``dst`` the file ``src`` is, atomically (whatever ``dst`` was is replaced), and keep
    ``src``: a hard link (no copy), a copy where the file system has none. Doing it again does
    nothing more (an append's publish, redone after a kill, uses it)."""
    src, dst = Path(src), Path(dst)
    try:
        if os.path.samefile(src, dst):
            return
    except OSError:
        pass
    tmp = dst.with_name(f".{dst.name}.place-{os.getpid()}")
    tmp.unlink(missing_ok=True)
    try:
        try:
            os.link(src, tmp)
        except OSError:  # no hard links here: a copy, made durable before it takes the name
            shutil.copyfile(src, tmp)
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
        os.replace(tmp, dst)
    finally:
        tmp.unlink(missing_ok=True)


def visible_files(top: str | os.PathLike, unlisted: Callable[[OSError], None],
                  irregular: Callable[[str, str], None] | None = None,
                  skip: Callable[[list[str]], bool] | None = None) -> list[str]:
    """Relative paths (``os.sep`` joined) of the non-hidden files below ``top``, its folders
    walked in sorted order; symlinked folders are not entered. ``unlisted(error)`` is called for
    each folder that cannot be listed (no permission, an I/O error, a path too long; the error's
    ``filename`` names it): ``os.walk`` alone skips such a folder in silence, so the caller must
    record it or raise. With ``irregular``, an entry that is neither a folder nor a regular
    file (a named pipe, a socket, a device, a symlink to one) is left out and
    ``irregular(relative path, what it is)`` called for it (the type comes from the directory
    entry: no system call for a plain file); a dangling symlink stays listed (its read fails).
    A folder below ``top`` for which ``skip(names of its entries)`` is true is left out whole."""
    found: list[str] = []
    top = os.fspath(top)
    stack = [""]
    while stack:
        rel = stack.pop()
        path = os.path.join(top, rel) if rel else top
        try:
            with os.scandir(path) as it:
                entries = list(it)
        except OSError as e:
            if e.filename is None:
                e.filename = path
            unlisted(e)
            continue
        if rel and skip is not None and skip([entry.name for entry in entries]):
            continue
        folders = []
        prefix = rel + os.sep if rel else ""  # (os.path.join of a name: a listing has millions)
        for entry in entries:
            name = entry.name
            if name.startswith("."):
                continue
            try:
                is_dir = entry.is_dir()
            except OSError:
                is_dir = False
            if is_dir:
                if not entry.is_symlink():  # as os.walk(followlinks=False): listed, not entered
                    folders.append(prefix + name)
                continue
            if irregular is not None:
                try:
                    regular = entry.is_file()
                except OSError:
                    regular = False
                if not regular:
                    kind = _entry_kind(entry)
                    if kind is not None:
                        irregular(prefix + name, kind)
                        continue
            found.append(prefix + name)
        stack.extend(sorted(folders, reverse=True))  # popped in sorted order, depth first
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
def _entry_kind(entry: os.DirEntry) -> str | None:
    """What a directory entry that is not a regular file is, followed through a symlink; None
    for a dangling symlink (or one that cannot be followed): it stays an input and fails its read."""
    try:
        kind = not_regular(os.stat(entry.path).st_mode)
    except OSError:
        return None
    if kind is None:
        return None
    return f"a symlink to {kind}" if entry.is_symlink() else kind

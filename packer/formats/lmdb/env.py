"""LMDB format: the key scheme and the per-process read-only environment cache."""
from __future__ import annotations

import os
import threading

import lmdb

from packer.errors import CorruptData, OutputChanged

__all__ = ["lmdb_key", "open_env", "close_env", "data_file"]

FileId = tuple[int, int, int, int]

# One read-only environment per (process, path, data.mdb identity): py-lmdb >= 2 refuses to open
# a file twice in a process, and a forked child inherits its parent's handles, which it must drop
# first. The identity in the key is what keeps an --overwrite from being served the old map (or
# an old reader the new one): an environment is only ever returned for the file it maps.
_ENVS: dict[tuple[str, FileId | None], tuple[int, lmdb.Environment]] = {}
_ENVS_LOCK = threading.RLock()


def lmdb_key(index: int) -> bytes:
    """The LMDB key of the sample at ``index`` (cursor order = index order)."""
    return b"%08d" % index


def data_file(path: str | os.PathLike) -> FileId | None:
    """Which ``data.mdb`` is at ``path`` now: (device, inode, size, mtime), None if absent.

    The inode alone is not enough: once the old file's environment is closed, the file system
    may give its number to the next output's data.mdb. Not the ctime: a remote cache marks a
    file used with ``utime``, which changes it.
    """
    try:
        st = os.stat(os.path.join(path, "data.mdb"))
    except (OSError, TypeError, ValueError):
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def close_env(path: str | os.PathLike) -> None:
    """Close this process's cached environments of ``path`` (they reopen on the next use)."""
    path = os.path.abspath(path)
    with _ENVS_LOCK:
        for key in [k for k in _ENVS if k[0] == path]:
            _close(key)


def _close(key: tuple[str, FileId | None]) -> None:
    _, env = _ENVS.pop(key)
    try:  # an inherited handle is this process's copy of the parent's: closing it is ours to do
        env.close()
    except lmdb.Error:
        pass


def _drop_dead_envs() -> None:
    """Close the environments this process inherited across ``fork`` and its own whose
    ``data.mdb`` was deleted or replaced (nothing can be served from them any more).

    py-lmdb refuses to open a file it believes already open, keyed by inode: a cached
    environment of a deleted output keeps its inode number claimed, and a new output that the
    file system gives the same number would be refused. One stat per cached environment, only
    when an environment is opened.
    """
    pid = os.getpid()
    for key, (owner, _) in list(_ENVS.items()):
        if owner != pid or data_file(key[0]) != key[1]:
            _close(key)


def open_env(path: str | os.PathLike, expect: FileId | None = None) -> lmdb.Environment:
    """The shared read-only environment of the ``data.mdb`` at ``path`` whose identity is
    ``expect`` (default: the one there now), for this process.

    Raises OutputChanged when ``path`` no longer holds that file: a reader opened before an
    ``--overwrite`` is never given the new file's map, nor one opened after it the old one's.
    """
    entry = _ENVS.get((os.path.abspath(path), expect))
    if entry is not None and entry[0] == os.getpid():
        return entry[1]
    with _ENVS_LOCK:  # packer.Loader's threads share the cache: open once
        return _open_env(path, expect)


def _open_env(path: str | os.PathLike, expect: FileId | None) -> lmdb.Environment:
    shown, path = str(path), os.path.abspath(path)
    before = data_file(path)
    if expect is None:
        expect = before
    key = (path, expect)
    entry = _ENVS.get(key)
    if entry is not None and entry[0] == os.getpid():
        return entry[1]
    _drop_dead_envs()
    if before != expect:
        raise OutputChanged(shown)
    try:
        env = lmdb.open(path, readonly=True, lock=False, readahead=False, meminit=False,
                        max_readers=1024, subdir=True)
    except lmdb.Error as e:
        if "already open" in str(e):  # this process's own writer holds it (an --append under way)
            raise OutputChanged(shown, "being appended to by this process (py-lmdb opens a file once per "
                                       "process); read it once the append is done") from e
        raise CorruptData(path, f"cannot open LMDB environment ({e})") from e
    if data_file(path) != expect:  # replaced while it was being opened: the map may be either
        env.close()
        raise OutputChanged(shown)
    try:  # a data.mdb shorter than its pages would crash the process (SIGBUS) on the first read
        need = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
        size = os.path.getsize(os.path.join(path, "data.mdb"))
    except (lmdb.Error, OSError) as e:
        env.close()
        raise CorruptData(path, f"cannot open LMDB environment ({e})") from e
    if size < need:
        env.close()
        raise CorruptData(os.path.join(path, "data.mdb"), f"truncated: {size} bytes, its pages need {need}")
    _ENVS[key] = (os.getpid(), env)
    return env

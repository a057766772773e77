"""LMDB format: the key scheme and the per-process read-only environment cache."""
from __future__ import annotations

import os
import threading

import lmdb

from packer.errors import CorruptData

__all__ = ["lmdb_key", "open_env", "close_env", "drop_stale_env", "mapped_file"]


# One read-only environment per (process, path): py-lmdb >= 2 refuses to open a path twice
# in a process, and a forked child inherits its parent's handle, which it must drop first.
_ENVS: dict[str, tuple[int, lmdb.Environment]] = {}
_ENVS_LOCK = threading.RLock()
_INODES: dict[str, tuple[int, int]] = {}  # the data.mdb each cached environment maps


def lmdb_key(index: int) -> bytes:
    """The LMDB key of the sample at ``index`` (cursor order = index order)."""
    return b"%08d" % index


def drop_stale_env(path: str | os.PathLike) -> None:
    """Close this process's cached environment of ``path`` if ``data.mdb`` there was replaced
    since it was opened (a re-pack into the same path must not be read through the old map)."""
    path = os.path.abspath(path)
    entry = _ENVS.get(path)
    if entry is None or entry[0] != os.getpid():
        return
    try:
        st = os.stat(os.path.join(path, "data.mdb"))
        current = (st.st_dev, st.st_ino)
    except OSError:
        current = None
    if current != _INODES.get(path):
        close_env(path)


def mapped_file(path: str | os.PathLike) -> tuple[int, int] | None:
    """(device, inode) of the ``data.mdb`` this process's cached environment of ``path`` maps."""
    return _INODES.get(os.path.abspath(path))


def close_env(path: str | os.PathLike) -> None:
    """Close this process's cached environment of ``path`` (it reopens on the next use)."""
    path = os.path.abspath(path)
    entry = _ENVS.pop(path, None)
    _INODES.pop(path, None)
    if entry is not None and entry[0] == os.getpid():
        entry[1].close()


def _drop_dead_envs() -> None:
    """Close this process's cached environments whose ``data.mdb`` was deleted or replaced.

    py-lmdb refuses to open a file it believes already open, keyed by inode: a cached
    environment of a deleted output keeps its inode number claimed, and a new output that the
    file system gives the same number would be refused. One stat per cached environment, only
    when a path is opened for the first time.
    """
    for cached in list(_ENVS):
        drop_stale_env(cached)


def open_env(path: str | os.PathLike) -> lmdb.Environment:
    """The shared read-only environment of ``path`` for this process (opened on first use)."""
    entry = _ENVS.get(os.path.abspath(path))
    if entry is not None and entry[0] == os.getpid():
        return entry[1]
    with _ENVS_LOCK:  # packer.Loader's threads share the cache: open once
        return _open_env(path)


def _open_env(path: str | os.PathLike) -> lmdb.Environment:
    path = os.path.abspath(path)
    pid = os.getpid()
    entry = _ENVS.get(path)
    if entry is not None:
        if entry[0] == pid:
            return entry[1]
        try:  # inherited across fork: close our copy of the parent's handle
            entry[1].close()
        except lmdb.Error:
            pass
        del _ENVS[path]
    _drop_dead_envs()
    try:
        env = lmdb.open(path, readonly=True, lock=False, readahead=False, meminit=False,
                        max_readers=1024, subdir=True)
    except lmdb.Error as e:
        raise CorruptData(path, f"cannot open LMDB environment ({e})") from e
    try:  # a data.mdb shorter than its pages would crash the process (SIGBUS) on the first read
        need = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
        size = os.path.getsize(os.path.join(path, "data.mdb"))
    except (lmdb.Error, OSError) as e:
        env.close()
        raise CorruptData(path, f"cannot open LMDB environment ({e})") from e
    if size < need:
        env.close()
        raise CorruptData(os.path.join(path, "data.mdb"), f"truncated: {size} bytes, its pages need {need}")
    _ENVS[path] = (pid, env)
    st = os.stat(os.path.join(path, "data.mdb"))
    _INODES[path] = (st.st_dev, st.st_ino)
    return env

"""The node-local cache of remote files: shared by every worker and rank on one machine.

Layout: ``{cache_dir}/{dataset key}/{name}`` (the dataset's own relative names, so a cached
dataset folder is an ordinary packed output once its files are there), lock files under
``{cache_dir}/.locks/``, and ``{cache_dir}/.events.jsonl`` (one line per download: bytes,
attempts, retries, refetches) from which ``cache_events`` totals what every process did.

* One download per file per node: a process takes an exclusive ``flock`` on the file's lock
  before downloading and checks again under it, so concurrent readers wait for the one
  download instead of repeating it (prefetchers only try the lock and move on when it is held).
* Atomic landing: downloads go to a temporary name, are checked (size and sha256 from the
  manifest) and renamed into place, so a file in the cache is always whole and verified.
* Verified stamps: beside each checked file, ``.{name}.verified`` records the sha256 it was
  checked against and the file's identity then (device, inode, size, mtime). A reader that
  takes a file from the cache trusts it without hashing only while that identity holds; a
  file replaced or rewritten since (another process refilled the cache) is hashed again.
* LRU eviction: each use sets the file's atime (the mtime stays the download's, part of the
  identity above); past ``limit`` bytes the least recently used data files are deleted
  (metadata - manifests, indexes, keys - stays). A reader that still has an evicted file
  mapped keeps reading it (POSIX unlink semantics).
"""
from __future__ import annotations

import errno
import fcntl
import functools
import json
import logging
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from packer.errors import UsageError
from packer.manifest import MANIFEST_NAME
from packer.remote.fetch import FetchStats

__all__ = ["NodeCache", "cache_events", "default_cache_dir", "file_identity",
           "read_verified", "write_verified"]

log = logging.getLogger(__name__)

EVENTS = ".events.jsonl"
LOCKS = ".locks"


@functools.cache
def _metadata() -> tuple[frozenset[str], tuple[str, ...]]:
    """(names, endings) of the files eviction keeps: the manifest and hash lists, and the
    sidecars each format read over URLs declares (``FormatSpec``)."""
    from packer.formats import format_specs

    specs = [s for s in format_specs() if s.fetch is not None]
    names = {MANIFEST_NAME, "packer.sha256"}
    names.update(n for s in specs if not s.single_file for n in (*s.sidecars, *s.optional))
    endings = {".sha256"}
    endings.update(x for s in specs for x in s.sidecar_suffixes)
    endings.update(f".{n}" for s in specs if s.single_file for n in s.optional)
    return frozenset(names), tuple(sorted(endings))


def default_cache_dir() -> Path:
    """``$PACKER_CACHE_DIR``, else ``$XDG_CACHE_HOME/packer``, else ``~/.cache/packer``."""
    if os.environ.get("PACKER_CACHE_DIR"):
        return Path(os.environ["PACKER_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "packer"


def _is_metadata(path: Path) -> bool:
    names, endings = _metadata()
    return path.name in names or path.name.endswith(endings)


def file_identity(st: os.stat_result) -> tuple[int, int, int, int]:
    """(device, inode, size, mtime in ns) of a cached file: changes whenever it is replaced or
    rewritten (a download lands under a new inode with its own mtime; uses set only the atime)."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _verified_path(local: Path) -> Path:
    return local.with_name(f".{local.name}.verified")


def read_verified(local: Path) -> tuple[tuple[int, ...], str] | None:
    """(identity, sha256) recorded when ``local`` was last checked, or None."""
    try:
        rec = json.loads(_verified_path(local).read_text(encoding="utf-8"))
        return tuple(rec["identity"]), str(rec["sha256"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_verified(local: Path, identity: tuple[int, ...], sha256: str) -> None:
    """Record that ``local``, while it has ``identity``, was checked to hash to ``sha256``."""
    target = _verified_path(local)
    tmp = target.with_name(f"{target.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(json.dumps({"identity": list(identity), "sha256": sha256}), encoding="utf-8")
        os.replace(tmp, target)
    except OSError as e:  # a stamp saves a later hash; without one the next reader hashes again
        tmp.unlink(missing_ok=True)
        log.debug("cache: cannot record the check of %s (%s)", local, e)


class NodeCache:
    """A cache folder shared by the processes of one node.

    Args:
        directory: the cache folder (created if missing).
        limit: bytes of data files to keep; older ones are evicted past it (None: no limit).
    """

    def __init__(self, directory: str | os.PathLike, *, limit: int | None = None):
        if limit is not None and limit < 1:
            raise ValueError("cache_limit must be positive (or None for no limit)")
        self.directory = Path(directory)
        self.limit = limit
        try:
            (self.directory / LOCKS).mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UsageError(f"{self.directory}: cannot create the cache folder ({e.strerror or e})") from e

    def __getstate__(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def path(self, dataset: str, name: str) -> Path:
        """Where file ``name`` of dataset folder ``dataset`` lands."""
        return self.directory / dataset / name

    @contextmanager
    def _lock(self, local: Path, *, wait: bool) -> Iterator[bool]:
        rel = local.relative_to(self.directory).as_posix().replace("/", "%")
        fd = os.open(self.directory / LOCKS / f"{rel}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            except OSError as e:
                if e.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                    yield False
                    return
                raise
            yield True
        finally:
            os.close(fd)  # releases the lock

    def ensure(self, local: Path, fetch: Callable[[Path], FetchStats], *, url: str = "",
               wait: bool = True) -> Path | None:
        """``local``, downloaded by ``fetch(local)`` first unless already cached.

        With ``wait=False`` (prefetch) returns None at once when another process holds the
        file's lock (it is downloading it).
        """
        if local.is_file():
            self.touch(local)
            return local
        with self._lock(local, wait=wait) as held:
            if not held:
                return None
            if local.is_file():  # another process fetched it while we waited
                self.touch(local)
                return local
            prefix = f".{local.name}.download-"
            try:
                names = os.listdir(local.parent)
            except FileNotFoundError:
                names = []
            for name in names:  # a download left by a killed process (we hold the lock: none is live)
                if name.startswith(prefix):
                    (local.parent / name).unlink(missing_ok=True)
            start = time.monotonic()
            stats = fetch(local)
            self._record(url, local, stats, time.monotonic() - start)
        if self.limit is not None and not _is_metadata(local):
            self.evict(keep=local)
        return local

    def discard(self, local: Path) -> None:
        """Delete cached file ``local`` (and its check record) so the next ``ensure`` fetches it."""
        with self._lock(local, wait=True):
            local.unlink(missing_ok=True)
            _verified_path(local).unlink(missing_ok=True)

    def touch(self, local: Path) -> None:
        """Mark ``local`` as just used: its atime is the LRU clock (the mtime is left alone)."""
        try:
            os.utime(local, ns=(time.time_ns(), os.stat(local).st_mtime_ns))
        except OSError:  # evicted meanwhile: the next ensure fetches it again
            pass

    def evict(self, *, keep: Path | None = None) -> list[Path]:
        """Delete least recently used data files until the cache holds at most ``limit`` bytes."""
        if self.limit is None:
            return []
        files = []
        for p in self.directory.rglob("*"):
            if p.name.startswith(".") or any(part.startswith(".") for part in p.relative_to(self.directory).parts):
                continue
            try:
                st = p.stat()
            except OSError:
                continue
            if p.is_file() and not _is_metadata(p):
                files.append((st.st_atime, st.st_size, p))
        total = sum(size for _, size, _ in files)
        removed = []
        for _, size, p in sorted(files, key=lambda t: t[0]):
            if total <= self.limit:
                break
            if keep is not None and p == keep:
                continue
            with self._lock(p, wait=False) as held:
                if not held:
                    continue
                try:
                    p.unlink()
                except OSError:
                    continue
                _verified_path(p).unlink(missing_ok=True)
            total -= size
            removed.append(p)
            log.info("cache: evicted %s (%d bytes)", p, size)
        if total > self.limit:
            log.warning("cache %s holds %d bytes, over its %d-byte limit (files in use)",
                        self.directory, total, self.limit)
        return removed

    def _record(self, url: str, local: Path, stats: FetchStats, seconds: float) -> None:
        line = json.dumps({"url": url, "file": local.name, "bytes": stats.bytes, "downloaded": stats.bytes > 0, "attempts": stats.attempts,
                           "retries": stats.retries, "refetches": stats.refetches, "seconds": round(seconds, 4),
                           "pid": os.getpid()}) + "\n"
        fd = os.open(self.directory / EVENTS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
        log.info("cache: fetched %s (%d bytes, %d attempts, %d refetches)", url, stats.bytes,
                 stats.attempts, stats.refetches)


def cache_events(directory: str | os.PathLike) -> list[dict[str, Any]]:
    """Every download recorded in a cache folder (one dict per download, any process)."""
    p = Path(directory) / EVENTS
    if not p.is_file():
        return []
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]

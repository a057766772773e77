"""A packed output at a URL, seen through the node cache: ``RemoteOptions`` says how,
``RemoteSource`` fetches its files, ``open_remote`` returns an ordinary Reader over the
cached copy (the seam ``packer.formats.open_reader`` calls for URLs).

What is fetched when:

* records: the manifest, ``keys.json``, ``failures.jsonl`` and every ``.idx`` at open; each
  shard when first read (or prefetched), checked against the manifest's sha256. With
  ``access="range"`` shards are never downloaded: each record is one ranged read through the
  index (CRC-checked; no shard hash applies), for sparse random access.
* lmdb: the whole folder at open (``data.mdb`` is memory-mapped by LMDB, so it must be local).
* hdf5: the whole file at open (one request; see docs/remote.md for why not ranged reads).
* frame folders: refused (thousands of small files); pack frames as records instead.

Per-file hashes: records shards carry ``sha256`` in the manifest. ``packer.sha256`` (folder
outputs) or ``{file}.sha256`` (single files), written by the upload, lists every file's sha256
in ``sha256sum`` format; files it lists are checked too. Files with no hash anywhere (outputs
copied up by other tools) are still CRC32C-checked per sample when read.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packer.errors import OutputChanged, UsageError
from packer.manifest import MANIFEST_NAME
from packer.remote.cache import NodeCache, default_cache_dir, file_identity, read_verified, write_verified
from packer.remote.fetch import (FetchStats, RemoteMissing, RetryPolicy, fetch_file, file_sha256, http_status,
                                 retrying)
from packer.remote.url import cache_key, is_url, join_url, redact, secrets_of, url_filesystem

__all__ = ["RemoteOptions", "RemoteSource", "SUMS_NAME", "parse_sums"]

log = logging.getLogger(__name__)

SUMS_NAME = "packer.sha256"
ACCESS = ("shard", "range")


@dataclass(frozen=True)
class RemoteOptions:
    """How URLs are read.

    Args:
        cache_dir: the node cache folder (default ``$PACKER_CACHE_DIR`` or ``~/.cache/packer``).
        cache_limit: bytes of data files the cache keeps (int or ``"50GB"``; None: no limit).
        storage_options: passed to fsspec (credentials, ``endpoint_url``, ...); never logged.
        prefetch: shards fetched ahead of the one being read, in the epoch's order.
        access: ``"shard"`` (download whole shards into the cache) or ``"range"`` (records
            only: one ranged read per record, nothing cached).
        retry: retries, backoff, budget and per-request timeout.
    """

    cache_dir: str | os.PathLike | None = None
    cache_limit: int | str | None = None
    storage_options: dict[str, Any] | None = None
    prefetch: int = 2
    access: str = "shard"
    retry: RetryPolicy = field(default_factory=RetryPolicy)

    def __post_init__(self) -> None:
        if self.access not in ACCESS:
            raise UsageError(f"access must be one of {ACCESS}, not {self.access!r}")
        if self.prefetch < 0:
            raise UsageError("prefetch must be >= 0")

    def __repr__(self) -> str:  # storage_options may hold credentials
        return (f"RemoteOptions(cache_dir={self.cache_dir!r}, cache_limit={self.cache_limit!r}, "
                f"storage_options={'<set>' if self.storage_options else None}, prefetch={self.prefetch}, "
                f"access={self.access!r})")

    def limit_bytes(self) -> int | None:
        if self.cache_limit is None:
            return None
        from packer.fileio import parse_bytes

        return parse_bytes(self.cache_limit)


def parse_sums(text: str) -> dict[str, str]:
    """``sha256sum`` lines (``{hex}  {name}``) -> {name: hex}."""
    sums = {}
    for line in text.splitlines():
        parts = line.strip().split(None, 1)
        if len(parts) == 2 and len(parts[0]) == 64:
            sums[parts[1].lstrip("*")] = parts[0].lower()
    return sums


class RemoteSource:
    """The files of one packed output at ``url``, fetched into ``cache`` on demand."""

    def __init__(self, url: str, options: RemoteOptions):
        if not is_url(url):
            raise UsageError(f"{url!r} is not a URL")
        self.url = url.rstrip("/")
        self.options = options
        self.cache = NodeCache(options.cache_dir or default_cache_dir(), limit=options.limit_bytes())
        self.key = cache_key(self.url)
        self.sums: dict[str, str] = {}
        self.manifest_text: str | None = None  # the manifest as opened (what readers are pinned to)
        self._fs: Any = None
        self._fs_pid: int | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_fs"] = None
        state["_fs_pid"] = None
        return state

    @property
    def secrets(self) -> list[str]:
        return secrets_of(self.url, self.options.storage_options)

    @property
    def fs(self) -> tuple[Any, str]:
        """(filesystem, base path); made again in each process (never crosses a fork)."""
        if self._fs is None or self._fs_pid != os.getpid():
            self._fs = url_filesystem(self.url, self.options.storage_options, timeout=self.options.retry.timeout)
            self._fs_pid = os.getpid()
        return self._fs

    def name_url(self, name: str) -> str:
        return join_url(self.url, name)

    def remote_path(self, name: str) -> str:
        return join_url(self.fs[1], name)

    @property
    def local_root(self) -> Path:
        """The cached copy's folder (single-file outputs sit inside it under their name)."""
        return self.cache.directory / self.key

    def local(self, name: str) -> Path:
        return self.cache.path(self.key, name)

    def fetch(self, name: str, *, sha256: str | None = None, size: int | None = None,
              wait: bool = True) -> Path | None:
        """The cached path of file ``name``, downloaded (once per node) and checked first.

        A file with a known sha256 (the manifest's, or the hash list's) taken from the cache is
        checked too: as is while it has the identity recorded when it was last hashed, else
        hashed again; one that is not the hash's is fetched again (OutputChanged when the
        dataset was republished since it was opened).
        """
        listed = sha256 is None and name in self.sums  # its hash from the hash list, not the manifest
        sha256 = sha256 or self.sums.get(name)
        url = self.name_url(name)
        fs, _ = self.fs
        landed: list[Path] = []

        def changed() -> None:
            self.check_republished()
            if listed:
                self.check_listed(name, sha256)

        def download(dest: Path) -> FetchStats:
            def record(tmp: Path) -> None:  # before the rename: no reader sees the file unrecorded
                write_verified(dest, file_identity(os.stat(tmp)), sha256)

            stats = fetch_file(fs, self.remote_path(name), dest, url=url, sha256=sha256, size=size,
                               policy=self.options.retry, secrets=self.secrets,
                               changed=changed if self.manifest_text is not None else None,
                               landing=record if sha256 else None)
            landed.append(dest)
            return stats

        path = self.cache.ensure(self.local(name), download, url=redact(url), wait=wait)
        if path is None or landed or not sha256 or self._cached_is(path, sha256):
            return path
        log.warning("%s: the cached copy is not the one the manifest lists; fetching it again", redact(url))
        self.cache.discard(path)
        return self.cache.ensure(self.local(name), download, url=redact(url), wait=wait)

    def _cached_is(self, path: Path, sha256: str) -> bool:
        """True when cached ``path`` hashes to ``sha256`` (recorded for its identity, else hashed);
        OutputChanged when it does not and the dataset was republished since it was opened."""
        try:
            ident = file_identity(os.stat(path))
        except OSError:  # evicted meanwhile: fetched again
            return False
        if read_verified(path) == (ident, sha256):
            return True
        if file_sha256(path) == sha256:
            write_verified(path, ident, sha256)
            return True
        self.check_republished()
        return False

    def read_text(self, name: str) -> str:
        """A small file's text, always fetched fresh (no cache)."""
        fs, _ = self.fs
        stats = FetchStats()
        start = time.monotonic()
        try:
            raw = retrying(redact(self.name_url(name)), lambda: fs.cat_file(self.remote_path(name)),
                           policy=self.options.retry, secrets=self.secrets, stats=stats)
        finally:
            if stats.retries:  # retries of small reads are counted with the downloads
                self.cache._record(redact(self.name_url(name)), self.local(name), stats, time.monotonic() - start)
        return raw.decode("utf-8")

    def read_range(self, name: str, start: int, end: int, *, pin: dict[str, Any] | None = None) -> bytes:
        """Bytes ``[start, end)`` of file ``name`` (one ranged request, retried).

        ``pin`` (``head(name)`` as seen when the dataset was opened) holds the read to that
        version of the file: over HTTP(S) with a strong ETag the request carries ``If-Match``
        (the server answers 412 for any other version); elsewhere the file's stamp is asked
        again after the read. Either way another version raises OutputChanged, never its bytes.
        """
        fs, _ = self.fs
        what = redact(self.name_url(name))
        etag = _strong_etag(pin) if pin is not None and _is_http(fs) else None

        def get() -> bytes:
            if etag is None:
                return fs.cat_file(self.remote_path(name), start=start, end=end)
            try:
                return fs.cat_file(self.remote_path(name), start=start, end=end, headers={"If-Match": etag})
            except Exception as e:  # noqa: BLE001 - only 412 is ours; the rest is classified by retrying
                if http_status(e) == 412:
                    raise self._republished(name) from e
                raise

        data = retrying(what, get, policy=self.options.retry, secrets=self.secrets)
        if pin is not None and etag is None and _stamp_of(self.head(name)) != _stamp_of(pin):
            raise self._republished(name)
        return data

    def head(self, name: str) -> dict[str, Any]:
        """What the server says of file ``name`` (size, ETag, modification time: one HEAD)."""
        fs, _ = self.fs
        return retrying(redact(self.name_url(name)), lambda: fs.info(self.remote_path(name)),
                        policy=self.options.retry, secrets=self.secrets)

    def _republished(self, name: str) -> OutputChanged:
        return OutputChanged(redact(self.name_url(name)), "changed on the server since this dataset was opened "
                                                          "(republished?); open it again to read the new version")

    def check_republished(self) -> None:
        """Raise OutputChanged when the manifest at the URL is no longer the one opened."""
        if self.manifest_text is None:
            return
        try:
            now = self.read_text(MANIFEST_NAME)
        except RemoteMissing:
            now = None
        if now != self.manifest_text:
            raise OutputChanged(redact(self.url), "republished at this URL since this dataset was opened "
                                                  "(its manifest changed); open it again to read the new version")

    def check_listed(self, name: str, sha256: str) -> None:
        """Raise OutputChanged when the hash list at the URL no longer gives file ``name`` the
        hash ``sha256`` read at open: an append at the URL took it off the list before it
        rewrote the file (packer.remote.append), so other bytes are another version's."""
        if parse_sums(self.optional_text(SUMS_NAME) or "").get(name) != sha256:
            raise OutputChanged(redact(self.name_url(name)), "rewritten at this URL since this dataset was opened "
                                                             "(its hash list changed: appended to?); open it again")

    def optional_text(self, name: str) -> str | None:
        try:
            return self.read_text(name)
        except RemoteMissing:
            return None

    def refresh_manifest(self, name: str = MANIFEST_NAME) -> str:
        """Fetch the manifest fresh; when it differs from the cached copy the dataset changed
        at the URL, and everything cached for it is dropped before the new one is stored."""
        text = self.refresh_identity(name, self.read_text(name))
        if name == MANIFEST_NAME:
            self.manifest_text = text
        return text

    def stamp(self, name: str) -> str:
        """What the server says of file ``name`` that changes when it is rewritten (size, ETag,
        modification time), for files that come with no hash."""
        return _stamp_of(self.head(name))

    def refresh_identity(self, name: str, text: str) -> str:
        """Keep ``text`` (what identifies the dataset now) as the cached ``name``; when it differs
        from the cached copy, everything cached for this URL is dropped first."""
        local = self.local(name)
        with self.cache._lock(local, wait=True):
            old = local.read_text(encoding="utf-8") if local.is_file() else None
            if old != text:
                if old is not None:
                    log.warning("%s changed since it was cached; dropping the cached copy", redact(self.url))
                    shutil.rmtree(self.local_root, ignore_errors=True)
                local.parent.mkdir(parents=True, exist_ok=True)
                tmp = local.with_name(f".{local.name}.tmp-{os.getpid()}")
                tmp.write_text(text, encoding="utf-8")
                os.replace(tmp, local)
        return text


_STAMP_KEYS = ("size", "ETag", "etag", "LastModified", "last_modified", "mtime", "Last-Modified")


def _stamp_of(info: dict[str, Any]) -> str:
    return json.dumps({k: info[k] for k in _STAMP_KEYS if k in info}, default=str, sort_keys=True)


def _is_http(fs: Any) -> bool:
    return any(p in ("http", "https") for p in ((fs.protocol,) if isinstance(fs.protocol, str) else fs.protocol))


def _strong_etag(info: dict[str, Any]) -> str | None:
    """The ETag of a HEAD answer when ``If-Match`` can use it (strong comparison: not ``W/``)."""
    etag = info.get("ETag") or info.get("etag")
    return etag if isinstance(etag, str) and etag and not etag.startswith("W/") else None

"""Record shards at a URL: a ``RecordsReader`` over the cached copy that fetches each shard
when first read, prefetches the next shards of the epoch's order, or reads single records
by range (``access="range"``).

A reader is pinned to the version it opened: every shard it maps from the cache is the one
whose sha256 its manifest lists (hashed unless the file still has the identity recorded when
it was last checked), and a cache refilled with a republished version, a download of another
version, or a ranged read of a changed file raises ``OutputChanged``, never another version's
bytes."""
from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterator, Sequence

import numpy as np

from pathlib import Path

from packer.errors import CorruptData, OutputChanged, PackerError
from packer.codecs.tfrecord import unframe_record
from packer.formats.records.reader import RecordsReader
from packer.manifest import MANIFEST_NAME
from packer.remote.cache import file_identity, read_verified, write_verified
from packer.remote.fetch import RemoteMissing
from packer.remote.source import RemoteSource
from packer.remote.url import redact

__all__ = ["RemoteRecordsReader"]

log = logging.getLogger(__name__)


class RemoteRecordsReader(RecordsReader):
    """A records output at a URL (``source``), read through the node cache.

    At open the small files (manifest, keys, failures, every ``.idx``) are fetched; shards are
    fetched when first read, checked against the manifest's sha256 and size. ``plan(positions)``
    starts prefetching the shards those positions need, ``options.prefetch`` ahead.
    """

    def __init__(self, source: RemoteSource, *, check_crc: bool = True):
        self.source = source
        self._prefetcher: _Prefetcher | None = None
        self._bad: dict[int, PackerError] = {}
        self._checked: dict[int, tuple[int, ...]] = {}  # shard -> identity of the cached file hashed
        self._pins: list[dict[str, Any]] | None = None
        self.verify_note: str | None = None  # how verify_structure checked the server's bytes
        # The cached manifest's identity is this reader's (Reader._check_unchanged holds it): another
        # process that opens the URL after a republish replaces it (and empties the folder), and
        # every later use of the cache sees it.
        pinned = self._current_identity()
        if source.local(MANIFEST_NAME).read_text(encoding="utf-8") != source.manifest_text:
            raise self._changed()
        manifest = json.loads(source.manifest_text)
        small = ["keys.json"] + [s.get("index", s["file"] + ".idx") for s in manifest.get("shards", [])
                                 if isinstance(s, dict) and isinstance(s.get("file"), str)]
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(source.fetch, small))
        try:
            source.fetch("failures.jsonl")
        except RemoteMissing:
            pass
        super().__init__(source.local_root, check_crc=check_crc)
        self._identity = pinned
        self._check_unchanged()
        self._load_index()  # now, from the indexes of this version (checked against the manifest after)
        if source.options.access == "range":
            self._pin_shards()

    def _current_identity(self) -> tuple[int, ...] | None:
        """The cached manifest's (the folder's own stat changes as shards arrive): OutputChanged
        once the node cache holds another version of the dataset (a process opened the URL after
        a republish), since files taken from it now would not be this version's."""
        return _identity_of(self.source.local(MANIFEST_NAME))

    def _changed(self) -> OutputChanged:
        return OutputChanged(redact(self.source.url), "republished at this URL since this dataset was opened "
                                                      "(the node cache now holds the new version); open it "
                                                      "again to read it")

    def _pin_shards(self) -> None:
        """Range access: hold every shard to the server's version now (ETag, size, modification
        time; one HEAD each) and check it is the manifest's (size, and the manifest unchanged)."""
        names = [s["file"] for s in self.manifest.shards]
        with ThreadPoolExecutor(max_workers=8) as pool:
            pins = list(pool.map(self.source.head, names))
        for s, pin in zip(self.manifest.shards, pins):
            if "bytes" in s and pin.get("size") is not None and int(pin["size"]) != int(s["bytes"]):
                self.source.check_republished()
                raise CorruptData(redact(self.source.name_url(s["file"])),
                                  f"{pin['size']} bytes on the server, the manifest says {s['bytes']}")
        self.source.check_republished()  # the shards seen are those of the manifest read at open
        self._pins = pins

    @property
    def grown(self) -> bool:
        """Always: at a URL an append uploads the grown ``keys.json`` before it swaps the manifest
        (packer.remote.append), and the cache keeps no ``versions/`` folder to say so. The first
        ``count`` keys are still checked against this version's manifest."""
        return True

    @property
    def url(self) -> str:
        return self.source.url

    def _handle_attrs(self) -> tuple[str, ...]:
        return ("_maps", "_prefetcher")

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._prefetcher = None
        self._bad = {}

    def _own_prefetcher(self) -> "_Prefetcher | None":
        """This process's prefetcher (one inherited across ``fork`` has no thread: dropped)."""
        if self._prefetcher is not None and self._prefetcher.pid != os.getpid():
            self._prefetcher = None
        return self._prefetcher

    # -- fetching ----------------------------------------------------------------------------
    def fetch_shard(self, k: int, *, wait: bool = True) -> None:
        """Make shard ``k`` local (downloaded once per node, hash-checked)."""
        if k in self._bad:  # already failed after every retry: fail fast for its other samples
            raise self._bad[k]
        self._check_unchanged()  # never download this version's shard into another version's cache
        s = self.manifest.shards[k]
        try:
            try:
                self.source.fetch(s["file"], sha256=s.get("sha256"), size=s.get("bytes"), wait=wait)
            except RemoteMissing:  # a shard the manifest lists is gone: a damaged dataset
                raise CorruptData(redact(self.source.name_url(s["file"])),
                                  "missing shard (not found on the server)") from None
        except PackerError as e:
            if wait:  # a reader's own fetch, after its retries (a prefetch failure is retried by the read)
                self._bad[k] = e
            raise

    def fetch_all(self) -> None:
        """Every shard local (what a whole-dataset pass like ``verify`` or ``merge`` needs)."""
        for k in range(len(self.manifest.shards)):
            self.fetch_shard(k)

    def _view(self, k: int) -> memoryview:
        if self._pid == os.getpid() and k in self._maps:
            return super()._view(k)
        prefetcher = self._own_prefetcher()
        if prefetcher is not None:
            prefetcher.reading(k)
        attempt = 0
        while True:
            self.fetch_shard(k)
            try:
                return super()._view(k)
            except _DamagedInCache as e:  # fetched again, once: the server's copy is checked on landing
                attempt += 1
                if attempt > 1:
                    raise CorruptData(e.path, e.reason) from e
                self.source.cache.discard(self.shard_path(k))
            except CorruptData:
                attempt += 1
                if self.shard_path(k).exists() or attempt == 3:  # not an eviction race
                    raise

    def _shard_opened(self, k: int, path: Path, st: os.stat_result, view: memoryview) -> None:
        """The cached file just mapped must be the manifest's shard ``k``: trusted without hashing
        while it has the identity this reader, or the process that checked it, recorded."""
        want = self.manifest.shards[k].get("sha256")
        ident = file_identity(st)
        if not want or self._checked.get(k) == ident:
            return
        if read_verified(path) != (ident, want):
            got = hashlib.sha256(view).hexdigest()
            if got != want:
                self._check_unchanged()
                self.source.check_republished()
                raise _DamagedInCache(str(path), "cached shard's sha256 differs from the manifest's "
                                                 "(changed in the cache)")
            write_verified(path, ident, got)
        self._checked[k] = ident

    def _read_framed(self, index: int) -> tuple[memoryview, int, int]:
        if self.source.options.access != "range":
            return super()._read_framed(index)
        index, k, local, offset, size, where = self._locate(index)
        pin = self._pins[k] if self._pins is not None else None
        buf = self.source.read_range(self.manifest.shards[k]["file"], offset, offset + size, pin=pin)
        if len(buf) != size:
            raise CorruptData(self.source.name_url(self.manifest.shards[k]["file"]),
                              f"ranged read gave {len(buf)} of {size} bytes", position=where)
        try:
            payload = unframe_record(buf, check_crc=self.check_crc)
        except CorruptData as e:
            raise self._corrupt(index, k, e.reason, where) from e
        return payload, k, local

    def verify_structure(self) -> Iterator[CorruptData]:
        """Download every shard from the server (a cached copy is dropped first: it says nothing
        of the server's bytes), each checked against its sha256, then the local checks."""
        for k in range(len(self.manifest.shards)):
            try:
                self._check_unchanged()
                if self.shard_path(k).exists():
                    self.source.cache.discard(self.shard_path(k))
                self.fetch_shard(k)
            except CorruptData as e:
                yield e
            except OutputChanged:
                raise
            except PackerError as e:
                yield CorruptData(self.source.name_url(self.manifest.shards[k]["file"]), str(e))
        self.verify_note = (f"server: all {len(self.manifest.shards)} shards downloaded again and checked "
                            "against the manifest's sha256")
        yield from super().verify_structure()

    # -- prefetch ----------------------------------------------------------------------------
    def plan(self, positions: Sequence[int]) -> None:
        """Prefetch, in a background thread of this process, the shards ``positions`` read, in
        that order, keeping ``options.prefetch`` shards ahead of the one being read."""
        if self.source.options.access == "range" or self.source.options.prefetch < 1 or not len(positions):
            return
        starts = self._load_index()[2]
        shards = np.searchsorted(starts, np.asarray(positions, dtype=np.int64), side="right") - 1
        seq: list[int] = []
        seen: set[int] = set()
        for k in shards.tolist():
            if k not in seen:
                seen.add(k)
                seq.append(k)
        if self._own_prefetcher() is not None:
            self._prefetcher.stop()
        self._prefetcher = _Prefetcher(self, seq, self.source.options.prefetch)


class _DamagedInCache(CorruptData):
    """A cached shard whose bytes are not the manifest's while the dataset is unchanged."""


def _identity_of(path: Path) -> tuple[int, ...] | None:
    try:
        return file_identity(os.stat(path))
    except OSError:
        return None


class _Prefetcher:
    """Fetches ``seq``'s shards in order, at most ``ahead`` past the one being read."""

    def __init__(self, reader: RemoteRecordsReader, seq: list[int], ahead: int):
        self.reader = reader
        self.seq = seq
        self.pos = {k: j for j, k in enumerate(seq)}
        self.ahead = ahead
        self.pid = os.getpid()
        self.cursor = 0
        self.cond = threading.Condition()
        self.stopped = False
        self.thread = threading.Thread(target=self._run, name="packer-prefetch", daemon=True)
        self.thread.start()

    def reading(self, k: int) -> None:
        with self.cond:
            self.cursor = max(self.cursor, self.pos.get(k, self.cursor))
            self.cond.notify_all()

    def stop(self) -> None:
        with self.cond:
            self.stopped = True
            self.cond.notify_all()

    def _run(self) -> None:
        for j, k in enumerate(self.seq):
            with self.cond:
                while not self.stopped and j > self.cursor + self.ahead:
                    self.cond.wait()
                if self.stopped:
                    return
            try:
                self.reader.fetch_shard(k, wait=False)  # held by another process: it is fetching it
            except Exception as e:  # noqa: BLE001 - the reader's own fetch reports it properly
                log.debug("prefetch of shard %d failed: %s", k, e)

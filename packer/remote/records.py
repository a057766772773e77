"""Record shards at a URL: a ``RecordsReader`` over the cached copy that fetches each shard
when first read, prefetches the next shards of the epoch's order, or reads single records
by range (``access="range"``)."""
from __future__ import annotations

import json
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterator, Sequence

import numpy as np

from packer.errors import CorruptData, PackerError
from packer.codecs.tfrecord import unframe_record
from packer.formats.records.reader import RecordsReader
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
        manifest = json.loads(source.local("packer.json").read_text(encoding="utf-8"))
        small = ["keys.json"] + [s.get("index", s["file"] + ".idx") for s in manifest.get("shards", [])
                                 if isinstance(s, dict) and isinstance(s.get("file"), str)]
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(source.fetch, small))
        try:
            source.fetch("failures.jsonl")
        except RemoteMissing:
            pass
        super().__init__(source.local_root, check_crc=check_crc)
        self._identity = None  # the node cache fills in as shards arrive: no output identity to check

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
            except CorruptData:
                attempt += 1
                if self.shard_path(k).exists() or attempt == 3:  # not an eviction race
                    raise

    def _read_framed(self, index: int) -> tuple[memoryview, int, int]:
        if self.source.options.access != "range":
            return super()._read_framed(index)
        index, k, local, offset, size, where = self._locate(index)
        buf = self.source.read_range(self.manifest.shards[k]["file"], offset, offset + size)
        if len(buf) != size:
            raise CorruptData(self.source.name_url(self.manifest.shards[k]["file"]),
                              f"ranged read gave {len(buf)} of {size} bytes", position=where)
        try:
            payload = unframe_record(buf, check_crc=self.check_crc)
        except CorruptData as e:
            raise self._corrupt(index, k, e.reason, where) from None
        return payload, k, local

    def verify_structure(self) -> Iterator[CorruptData]:
        """Fetch every shard (each checked against its sha256), then the local checks."""
        for k in range(len(self.manifest.shards)):
            try:
                self.fetch_shard(k)
            except CorruptData as e:
                yield e
            except PackerError as e:
                yield CorruptData(self.source.name_url(self.manifest.shards[k]["file"]), str(e))
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

"""LMDB format: Caffe ``Datum`` values under ``%08d`` keys, as NVIDIA DALI's Caffe reader expects.

Directory layout: ``data.mdb`` (+ ``lock.mdb``), ``packer.json``, ``keys.json`` (keys by
position), ``checksums.bin`` (little-endian u32 CRC32C of each stored value, by position),
``failures.jsonl``. Nothing but samples lives in the main database.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import lmdb
import numpy as np

from packer.errors import CorruptData, WriteError
from packer.codecs.image import sniff_format
from packer.integrity import crc32c
from packer.manifest import Manifest, atomic_write_bytes
from packer.codecs.protowire import decode_datum, encode_datum
from packer.formats.base import KEYS_FILE  # noqa: F401 (kept importable from here)
from packer.formats.base import Reader, Record, Sample, Writer, load_checksums, load_keys, write_keys

__all__ = ["LmdbWriter", "LmdbReader", "lmdb_key", "open_env", "close_env", "drop_stale_env"]

CHECKSUMS_FILE = "checksums.bin"
_INITIAL_MAP = 64 << 20

# One read-only environment per (process, path): py-lmdb >= 2 refuses to open a path twice
# in a process, and a forked child inherits its parent's handle, which it must drop first.
_ENVS: dict[str, tuple[int, lmdb.Environment]] = {}
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


def close_env(path: str | os.PathLike) -> None:
    """Close this process's cached environment of ``path`` (it reopens on the next use)."""
    path = os.path.abspath(path)
    entry = _ENVS.pop(path, None)
    _INODES.pop(path, None)
    if entry is not None and entry[0] == os.getpid():
        entry[1].close()


def open_env(path: str | os.PathLike) -> lmdb.Environment:
    """The shared read-only environment of ``path`` for this process (opened on first use)."""
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
    try:
        env = lmdb.open(path, readonly=True, lock=False, readahead=False, meminit=False,
                        max_readers=1024, subdir=True)
    except lmdb.Error as e:
        raise CorruptData(path, f"cannot open LMDB environment ({e})") from None
    try:  # a data.mdb shorter than its pages would crash the process (SIGBUS) on the first read
        need = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
        size = os.path.getsize(os.path.join(path, "data.mdb"))
    except (lmdb.Error, OSError) as e:
        env.close()
        raise CorruptData(path, f"cannot open LMDB environment ({e})") from None
    if size < need:
        env.close()
        raise CorruptData(os.path.join(path, "data.mdb"), f"truncated: {size} bytes, its pages need {need}")
    _ENVS[path] = (pid, env)
    st = os.stat(os.path.join(path, "data.mdb"))
    _INODES[path] = (st.st_dev, st.st_ino)
    return env


class LmdbWriter(Writer):
    """Writes Caffe ``Datum`` values in batched transactions; the map grows on ``MapFullError``."""

    format_name = "lmdb"

    def _open(self, resume_samples: int) -> None:
        self._batch: list[tuple[bytes, bytes]] = []
        data = self.workdir / "data.mdb"
        size = max(_INITIAL_MAP, 2 * data.stat().st_size if data.exists() else 0)
        # meminit=True: unused page bytes are zeroed, not leftover heap memory, so the same
        # samples committed in the same batches give a byte-identical data.mdb.
        try:
            self._env = lmdb.open(str(self.workdir), map_size=size, subdir=True, meminit=True,
                                  max_dbs=0, readahead=False)
            if resume_samples:
                with self._env.begin(write=True) as txn:
                    cur = txn.cursor()
                    if cur.set_range(lmdb_key(resume_samples)):
                        while cur.delete():
                            pass
        except lmdb.Error as e:
            raise WriteError(f"{data}: cannot open the LMDB environment for writing ({e})") from None

    @staticmethod
    def prepare(sample: Sample) -> tuple[bytes, int]:
        """The stored ``Datum`` value and its CRC32C."""
        value = encode_datum(sample.data, sample.label, sample.height, sample.width,
                             sample.channels, encoded=sample.fmt != "raw")
        return value, crc32c(value)

    def _write(self, index: int, sample: Sample) -> int:
        value, crc = sample.prepared or self.prepare(sample)
        self._batch.append((lmdb_key(index), value))
        return crc

    def _commit(self) -> None:
        self._grow_ahead()
        while True:
            try:
                with self._env.begin(write=True) as txn:
                    txn.cursor().putmulti(self._batch, append=True)
                break
            except lmdb.MapFullError:
                new = self._env.info()["map_size"] * 2
                self._env.set_mapsize(new)
            except lmdb.Error as e:  # disk full, file size limit, I/O error: the txn is not committed
                raise WriteError(f"{self.workdir / 'data.mdb'}: write failed ({e})") from None
        self._batch = []

    def _grow_ahead(self) -> None:
        """Double the map until this batch fits, before the transaction: a ``MapFullError``
        aborts it, and redoing a batch of 1,000 puts costs more than the whole commit."""
        try:
            info, psize = self._env.info(), self._env.stat()["psize"]
        except lmdb.Error:
            return  # the commit below reports it
        # values take whole overflow pages, plus a branch/leaf entry each; then 1 MiB of slack
        need = (info["last_pgno"] + 1) * psize + (1 << 20) + sum(
            (len(v) // psize + 2) * psize for _, v in self._batch)
        size = info["map_size"]
        while size < need:
            size *= 2
        if size != info["map_size"]:
            self._env.set_mapsize(size)

    def _finish(self, manifest: Manifest) -> None:
        write_keys(self.workdir, self.keys)
        atomic_write_bytes(self.workdir / CHECKSUMS_FILE,
                           np.asarray(self.crcs, dtype="<u4").tobytes())
        manifest.save(self.workdir)

    def _close_handles(self) -> None:
        env = getattr(self, "_env", None)
        if env is not None:
            env.close()
            self._env = None


class LmdbReader(Reader):
    """Random access to a packer LMDB (or any Caffe-Datum LMDB with a packer manifest)."""

    format_name = "lmdb"

    def __init__(self, path: str | os.PathLike, *, check_crc: bool = True):
        super().__init__(path, check_crc=check_crc)
        drop_stale_env(self.path)
        self._keys: list[str] | None = None
        self._crcs: np.ndarray | None = None

    @classmethod
    def detect(cls, path: Path) -> bool:
        return (path / "data.mdb").is_file()

    @property
    def keys(self) -> list[str]:
        if self._keys is None:
            self._keys = load_keys(self.path, len(self))
        return self._keys

    def _checksums(self) -> np.ndarray:
        if self._crcs is None:
            self._crcs = load_checksums(self.path / CHECKSUMS_FILE, len(self))
        return self._crcs

    def _env(self) -> lmdb.Environment:
        return open_env(self.path)

    def read_value(self, index: int) -> bytes:
        """The raw stored value (a serialized ``Datum``) at ``index``, CRC-checked if enabled."""
        index = self._check_index(index)
        try:
            with self._env().begin(buffers=False) as txn:
                value = txn.get(lmdb_key(index))
        except lmdb.Error as e:
            raise CorruptData(str(self.path / "data.mdb"), f"LMDB read failed ({e})",
                              position=f"sample {index}") from None
        if value is None:
            raise CorruptData(str(self.path / "data.mdb"), "missing key", position=f"sample {index}",
                              key=lmdb_key(index).decode())
        if self.check_crc and crc32c(value) != int(self._checksums()[index]):
            raise CorruptData(str(self.path / "data.mdb"), "CRC32C mismatch",
                              position=f"sample {index}", key=self._key_name(index))
        return value

    def _key_name(self, index: int) -> str:
        try:
            return self.keys[index]
        except CorruptData:
            return lmdb_key(index).decode()

    def read(self, index: int) -> Record:
        value = self.read_value(index)
        try:
            d = decode_datum(value)
        except ValueError as e:
            raise CorruptData(str(self.path / "data.mdb"), f"malformed Datum ({e})",
                              position=f"sample {index}", key=self._key_name(index)) from None
        fmt = sniff_format(d.data) if d.encoded else "raw"
        return Record(d.data, d.label, fmt, d.height, d.width, d.channels)

    def verify_structure(self) -> Iterator[CorruptData]:
        try:
            _ = self.keys
        except CorruptData as e:
            yield e
        try:
            self._checksums()
        except CorruptData as e:
            yield e
        try:
            entries = self._env().stat()["entries"]
        except CorruptData as e:
            yield e
            return
        if entries != len(self):
            yield CorruptData(str(self.path / "data.mdb"),
                              f"{entries} entries, manifest says {len(self)}")

    def _handle_attrs(self) -> tuple[str, ...]:
        return ()

    def close(self) -> None:
        close_env(self.path)

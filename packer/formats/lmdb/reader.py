"""LMDB format, reading: random access to ``Datum`` values by position, CRC-checked."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator, Sequence

import lmdb

from packer.codecs.fields import BLOB_FMT
from packer.codecs.image import sniff_format
from packer.codecs.protowire import decode_datum
from packer.errors import CorruptData, OutputChanged, PackerError
from packer.formats.lmdb.env import close_env, data_file, lmdb_key, open_env
from packer.integrity import crc32c
from packer.formats.reader import Reader
from packer.formats.sample import Record
from packer.formats.sidecars import partial_path

__all__ = ["LmdbReader"]


class LmdbReader(Reader):
    """Random access to a packer LMDB (or any Caffe-Datum LMDB with a packer manifest).

    An ``--append`` adds keys to the same ``data.mdb`` while readers read it (docs/append.md):
    a reader follows the grown file as long as the output still holds its version
    (``_follow``), and a read that meets the writer (an environment closed or out of map, a
    torn page) is read again once from the file as it is now, CRC-checked.
    """

    format_name = "lmdb"

    def __init__(self, path: str | os.PathLike, *, check_crc: bool = True, version: int | None = None):
        super().__init__(path, check_crc=check_crc, version=version)
        self._mdb = data_file(self.path)  # the data.mdb this reader's manifest describes
        self._file = str(self.path / "data.mdb")  # (what an error names: made once, not per read)
        self._tied: lmdb.Environment | None = None  # the environment ``_tie`` last checked
        self._check_unchanged()  # that data.mdb was in the output the manifest came from

    @classmethod
    def detect(cls, path: Path) -> bool:
        return (path / "data.mdb").is_file()

    def _env(self) -> lmdb.Environment:
        # The environment of exactly that data.mdb (keyed by its identity): one opened before an
        # --overwrite keeps mapping the old file (the old data, consistently); once it is gone,
        # OutputChanged, never the new file under the old manifest. A data.mdb that only grew
        # (an append) still holds this version: followed.
        try:
            env = open_env(self.path, self._mdb)
        except OutputChanged:
            self._follow()
            env = open_env(self.path, self._mdb)
        if env is not self._tied:
            self._tie(env)
        return env

    def _tie(self, env: lmdb.Environment) -> None:
        """Before this reader reads an environment it has not read yet: is its data.mdb the one
        this manifest describes? The file's identity (device, inode, size, mtime) can match
        another output's data.mdb (a freed inode number given again, the mtime copied with it),
        so the output must still hold this version (``_check_unchanged``: a replaced manifest is
        OutputChanged) and the stored CRC32C of this version's first and last samples must match,
        whatever ``check_crc`` says (two reads per environment and process). One damaged sample
        is left to its own read to name; both differing is a data.mdb from elsewhere."""
        self._check_unchanged()
        n = self.manifest.physical
        if n:
            crcs = self._checksums()
            with env.begin(buffers=False) as txn:
                differ = [i for i in {0, n - 1}
                          if (v := txn.get(lmdb_key(i))) is None or crc32c(v) != int(crcs[i])]
            if len(differ) == len({0, n - 1}):
                raise CorruptData(self._file,
                                  "not this output's data.mdb: the stored CRC32C of samples "
                                  f"{sorted(differ)} differ (replaced without its manifest?)")
        self._tied = env

    def _follow(self) -> bool:
        """The data.mdb changed since this reader last looked: go on with the file as it is now
        when the output still holds this reader's version (an append added keys past it; True),
        else OutputChanged. False when data.mdb is the one this reader knows."""
        now = data_file(self.path)
        if now == self._mdb:
            return False
        self._check_unchanged()
        if not self._holds_my_version():
            raise self._changed()
        self._mdb = now
        return True

    def read_value(self, index: int, txn: lmdb.Transaction | None = None) -> bytes:
        """The raw stored value (a serialized ``Datum``) at ``index``, CRC-checked if enabled."""
        index = self._check_index(index)
        try:
            return self._value(index, txn)
        except (lmdb.Error, CorruptData):
            if not self._follow():  # the same file as before: the error is the file's
                raise
        close_env(self.path)  # an environment mapped before the append grew the file
        return self._value(index, None)

    def _value(self, index: int, txn: lmdb.Transaction | None) -> bytes:
        try:
            if txn is None:
                with self._env().begin(buffers=False) as txn:
                    value = txn.get(lmdb_key(index))
            else:
                value = txn.get(lmdb_key(index))
        except lmdb.Error as e:
            if data_file(self.path) != self._mdb:
                raise  # read_value follows the file and reads again
            self._check_unchanged()  # its environment closed because the output was replaced: say so
            raise CorruptData(self._file, f"LMDB read failed ({e})",
                              position=f"sample {index}") from e
        if value is None:
            raise CorruptData(self._file, "missing key", position=f"sample {index}",
                              key=lmdb_key(index).decode())
        self._check_crc32c(value, index, file=self._file)
        return value

    def _fallback_key(self, index: int) -> str:
        return lmdb_key(index).decode()

    def read(self, index: int, txn: lmdb.Transaction | None = None) -> Record:
        value = self.read_value(index, txn)
        if self.manifest.schema:  # a field pack: the value is the sample's field blob
            return Record(value, -1, BLOB_FMT)
        try:
            d = decode_datum(value)
        except ValueError as e:
            raise CorruptData(self._file, f"malformed Datum ({e})",
                              position=f"sample {index}", key=self._key_name(index)) from e
        fmt = sniff_format(d.data) if d.encoded else "raw"
        return Record(d.data, d.label, fmt, d.height, d.width, d.channels)

    def read_many(self, indices: Sequence[int]) -> Iterator[Record]:
        """Several samples in one read transaction, lazily."""
        try:
            txn = self._env().begin(buffers=False)
        except lmdb.Error as e:
            self._check_unchanged()
            raise CorruptData(self._file, f"LMDB read failed ({e})") from e
        with txn:
            for i in indices:
                yield self.read(i, txn)

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
        stored = self.manifest.physical
        # keys past the stored positions: a later version's, or an append's until it publishes
        if entries < stored or (entries > stored and not partial_path(self.path).exists()
                                and not self._later_versions()):
            yield CorruptData(self._file,
                              f"{entries} entries, manifest says {stored}")

    def _later_versions(self) -> bool:
        """True when a later version than this reader's has been published."""
        try:
            return self._latest_manifest().version > self.manifest.version
        except PackerError:
            return False

    def _handle_attrs(self) -> tuple[str, ...]:
        return ("_tied",)

    def close(self) -> None:
        close_env(self.path)

"""LMDB format, reading: random access to ``Datum`` values by position, CRC-checked."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator, Sequence

import lmdb

from packer.codecs.fields import BLOB_FMT
from packer.codecs.image import sniff_format
from packer.codecs.protowire import decode_datum
from packer.errors import CorruptData
from packer.formats.lmdb.env import close_env, data_file, lmdb_key, open_env
from packer.formats.reader import Reader
from packer.formats.sample import Record

__all__ = ["LmdbReader"]


class LmdbReader(Reader):
    """Random access to a packer LMDB (or any Caffe-Datum LMDB with a packer manifest)."""

    format_name = "lmdb"

    def __init__(self, path: str | os.PathLike, *, check_crc: bool = True):
        super().__init__(path, check_crc=check_crc)
        self._mdb = data_file(self.path)  # the data.mdb this reader's manifest describes
        self._check_unchanged()  # that data.mdb was in the output the manifest came from

    @classmethod
    def detect(cls, path: Path) -> bool:
        return (path / "data.mdb").is_file()

    def _env(self) -> lmdb.Environment:
        # The environment of exactly that data.mdb (keyed by its identity): one opened before an
        # --overwrite keeps mapping the old file (the old data, consistently); once it is gone,
        # OutputChanged, never the new file under the old manifest.
        return open_env(self.path, self._mdb)

    def read_value(self, index: int, txn: lmdb.Transaction | None = None) -> bytes:
        """The raw stored value (a serialized ``Datum``) at ``index``, CRC-checked if enabled."""
        index = self._check_index(index)
        try:
            if txn is None:
                with self._env().begin(buffers=False) as txn:
                    value = txn.get(lmdb_key(index))
            else:
                value = txn.get(lmdb_key(index))
        except lmdb.Error as e:
            self._check_unchanged()  # its environment closed because the output was replaced: say so
            raise CorruptData(str(self.path / "data.mdb"), f"LMDB read failed ({e})",
                              position=f"sample {index}") from e
        if value is None:
            raise CorruptData(str(self.path / "data.mdb"), "missing key", position=f"sample {index}",
                              key=lmdb_key(index).decode())
        self._check_crc32c(value, index, file=self.path / "data.mdb")
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
            raise CorruptData(str(self.path / "data.mdb"), f"malformed Datum ({e})",
                              position=f"sample {index}", key=self._key_name(index)) from e
        fmt = sniff_format(d.data) if d.encoded else "raw"
        return Record(d.data, d.label, fmt, d.height, d.width, d.channels)

    def read_many(self, indices: Sequence[int]) -> Iterator[Record]:
        """Several samples in one read transaction, lazily."""
        try:
            txn = self._env().begin(buffers=False)
        except lmdb.Error as e:
            self._check_unchanged()
            raise CorruptData(str(self.path / "data.mdb"), f"LMDB read failed ({e})") from e
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
        if entries != len(self):
            yield CorruptData(str(self.path / "data.mdb"),
                              f"{entries} entries, manifest says {len(self)}")

    def _handle_attrs(self) -> tuple[str, ...]:
        return ()

    def close(self) -> None:
        close_env(self.path)

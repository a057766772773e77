"""LMDB format, writing: Caffe ``Datum`` values in batched transactions."""
from __future__ import annotations

import lmdb

from packer.codecs.protowire import encode_datum
from packer.errors import WriteError
from packer.formats.lmdb.env import lmdb_key
from packer.formats.sample import Sample
from packer.formats.sidecars import write_checksums, write_keys
from packer.formats.writer import Writer
from packer.integrity import crc32c
from packer.manifest import Manifest

__all__ = ["LmdbWriter"]

_INITIAL_MAP = 64 << 20


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
        write_checksums(self.workdir, self.crcs)
        manifest.save(self.workdir)

    def _close_handles(self) -> None:
        env = getattr(self, "_env", None)
        if env is not None:
            env.close()
            self._env = None

"""LMDB format, writing: Caffe ``Datum`` values in batched transactions."""
from __future__ import annotations

from typing import Any

import lmdb

from packer.codecs.fields import BLOB_FMT
from packer.codecs.protowire import datum_pieces, encode_datum
from packer.errors import WriteError
from packer.formats.lmdb.env import close_env, lmdb_key
from packer.formats.sample import Sample
from packer.formats.sidecars import write_checksums, write_keys
from packer.formats.writer import Writer
from packer.integrity import crc32c
from packer.manifest import Manifest

__all__ = ["LmdbWriter"]

_INITIAL_MAP = 64 << 20


class LmdbWriter(Writer):
    """Writes Caffe ``Datum`` values into one open write transaction per batch.

    Each value is put as it arrives (``txn.put`` releases the GIL and copies it into LMDB's
    dirty pages at once), not held in a list until the commit: holding a batch of 1,000 values
    costs a fresh 50 MB of process memory per batch, about a third of a bare put loop's time.
    A put cannot grow the map inside a transaction, so before each put the writer estimates the
    pages the transaction needs; when the next value would not fit it commits early, grows the
    map, and opens a new transaction (the base's journal still marks durability only at its own
    commits; a resume drops anything stored past the journal).

    Appending (``append_to``), the new values go into the output's own ``data.mdb`` under the
    keys after its stored positions: invisible to every published version (each reads its own
    positions), and published by the next version's manifest (docs/append.md).
    """

    format_name = "lmdb"
    keeps_samples = False  # each value is copied into LMDB's pages by the put, during ``add``

    def _open(self, resume_samples: int) -> None:
        self._txn: lmdb.Transaction | None = None
        self._need = 0  # bytes the open transaction may take, estimated (see ``_write``)
        where = self.workdir if self.append_to is None else self.out
        self._first = 0 if self.append_to is None else self.append_to.stored
        data = where / "data.mdb"
        size = max(_INITIAL_MAP, 2 * data.stat().st_size if data.exists() else 0)
        if self.append_to is not None:
            close_env(self.out)  # py-lmdb opens a file once per process: this process's readers let go
        # meminit=True: unused page bytes are zeroed, not leftover heap memory, so the same
        # samples committed in the same batches give a byte-identical data.mdb.
        try:
            self._env = lmdb.open(str(where), map_size=size, subdir=True, meminit=True,
                                  max_dbs=0, readahead=False)
            self._psize = self._env.stat()["psize"]
            if resume_samples or self._first:  # (appending: an interrupted append's keys past the journal too)
                with self._env.begin(write=True) as txn:
                    cur = txn.cursor()
                    if cur.set_range(lmdb_key(self._first + resume_samples)):
                        while cur.delete():
                            pass
        except lmdb.Error as e:
            raise WriteError(f"{data}: cannot open the LMDB environment for writing ({e})") from e

    @staticmethod
    def prepare(sample: Sample) -> tuple[bytes, int]:
        """The stored ``Datum`` value and its CRC32C (a field pack's blob is stored as it is)."""
        if sample.fmt == BLOB_FMT:
            value = bytes(sample.data)
            return value, crc32c(value)
        value = encode_datum(sample.data, sample.label, sample.height, sample.width,
                             sample.channels, encoded=sample.fmt != "raw")
        return value, crc32c(value)

    @staticmethod
    def prepare_pieces(sample: Sample) -> tuple[tuple[bytes, ...], int, int] | None:
        """``prepare``'s value in pieces (joined, they are that value), the index of the piece
        that is the sample's bytes, and the CRC32C of the value; None where the value is the
        sample's bytes themselves (a field pack's blob)."""
        if sample.fmt == BLOB_FMT:
            return None
        pieces = datum_pieces(sample.data, sample.label, sample.height, sample.width, sample.channels,
                              encoded=sample.fmt != "raw")
        crc = 0
        for piece in pieces:
            crc = crc32c(piece, crc)
        return pieces, 1, crc

    def _write(self, index: int, sample: Sample) -> int:
        value, crc = sample.prepared or self.prepare(sample)
        # an upper bound on what the value takes: its overflow pages plus a leaf/branch entry
        # (counted as two pages, far more than the ~1/150 page an entry really takes)
        need = (len(value) // self._psize + 3) * self._psize
        try:
            if self._txn is None or self._need + need > self._room:
                self._begin(need)
            self._need += need
            self._txn.put(lmdb_key(self._first + index), value, append=True)
        except lmdb.Error as e:  # disk full, an estimate too small: the open txn is lost, the run fails
            self._abort_txn()
            raise WriteError(f"{self.workdir / 'data.mdb'}: write failed ({e})") from e
        return crc

    def _begin(self, need: int) -> None:
        """Commit the open transaction (if any), grow the map so ``need`` more bytes fit beside
        what is stored (plus 1 MiB of slack), and open a new write transaction."""
        self._commit_txn()
        info = self._env.info()
        used = (info["last_pgno"] + 1) * self._psize + (1 << 20)
        size = info["map_size"]
        while size < used + max(need, self.commit_bytes + (self.commit_bytes >> 2)):
            size *= 2
        if size != info["map_size"]:
            self._env.set_mapsize(size)
        self._room = size - used
        self._need = 0
        self._txn = self._env.begin(write=True)

    def _commit_txn(self) -> None:
        if self._txn is not None:
            txn, self._txn = self._txn, None
            txn.commit()

    def _abort_txn(self) -> None:
        if self._txn is not None:
            txn, self._txn = self._txn, None
            txn.abort()

    def _commit(self) -> None:
        try:
            self._commit_txn()
        except lmdb.Error as e:  # disk full, file size limit, I/O error: the txn is not committed
            raise WriteError(f"{self.workdir / 'data.mdb'}: write failed ({e})") from e

    def _finish(self, manifest: Manifest) -> None:
        write_keys(self.workdir, self.keys)
        write_checksums(self.workdir, self.crcs)
        manifest.save(self.workdir)

    def _added(self, first: int) -> dict[str, Any]:
        return {"keys": [lmdb_key(first).decode(), lmdb_key(first + self.count - 1).decode()]} if self.count else {}

    def _finish_appended(self, version: Manifest, added: Manifest, keys: list[str]) -> None:
        """The values are in ``data.mdb`` already: the sidecars of every stored position."""
        import numpy as np

        old = self.append_to.reader._checksums()
        write_keys(self.out, keys)
        write_checksums(self.out, np.concatenate([np.asarray(old, dtype="<u4"), np.asarray(self.crcs, dtype="<u4")]))

    def _close_handles(self) -> None:
        env = getattr(self, "_env", None)
        if env is not None:
            self._abort_txn()  # an uncommitted batch never becomes durable
            env.close()
            self._env = None

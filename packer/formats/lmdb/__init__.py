"""LMDB format: Caffe ``Datum`` values under ``%08d`` keys, as NVIDIA DALI's Caffe reader expects.

Directory layout: ``data.mdb`` (+ ``lock.mdb``), ``packer.json``, ``keys.json`` (keys by
position), ``checksums.bin`` (little-endian u32 CRC32C of each stored value, by position),
``failures.jsonl``. Nothing but samples lives in the main database.

Modules: ``env`` (key scheme, read-only environment cache), ``writer``, ``reader``; the
classes are exported from here on first use, so reading never imports the writer.
"""
from __future__ import annotations

from packer.formats.lazy import lazy_exports
from packer.formats.lmdb.env import close_env, lmdb_key, open_env
from packer.formats.sidecars import CHECKSUMS_FILE, KEYS_FILE
from packer.formats.spec import FormatSpec

__all__ = ["FORMAT", "LmdbWriter", "LmdbReader", "lmdb_key", "open_env", "close_env"]

# At a URL the whole folder is fetched: LMDB memory-maps data.mdb, so it must be local.
FORMAT = FormatSpec(name="lmdb", writer="packer.formats.lmdb.writer:LmdbWriter",
                    reader="packer.formats.lmdb.reader:LmdbReader",
                    sidecars=(KEYS_FILE, CHECKSUMS_FILE), data=("data.mdb",), fetch="whole")

__getattr__ = lazy_exports(__name__, {"LmdbWriter": "packer.formats.lmdb.writer",
                                      "LmdbReader": "packer.formats.lmdb.reader"})

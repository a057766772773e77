"""records format: sharded TFRecord files of ``tf.train.Example``, a DALI ``.idx`` beside each.

Bytes on disk (DESIGN.md): each record is ``u64 length | u32 masked_crc32c(length) | payload |
u32 masked_crc32c(payload)``, little-endian; the payload is a ``tf.train.Example`` with the
ImageNet feature names (``image/encoded``, ``image/format``, ``image/class/label``,
``image/height``, ``image/width``, ``image/channels``, ``image/filename``; video frames add
``video/index`` and ``frame/index``). Shards are ``{name}-{i:05d}.tfrecord``, each with
``{shard}.idx`` holding one ``"{offset} {size}\\n"`` line per record (size = length + 16), so
TensorFlow, NVIDIA DALI and the ``tfrecord`` package read them as they are. The output folder
also holds ``packer.json`` (``shards: [{file, index, count, bytes, sha256}]``), ``keys.json``
(keys by position, so listing keys needs no scan) and ``failures.jsonl``.

Writing: a shard is written under ``.{shard}.partial`` and renamed when complete; a durable
commit (what ``--resume`` keeps) is a completed shard. Reading: random access through the
index into the shard mapped read-only (no scanning, no read syscall; a record past the end of
the file is refused before the mapping is touched), the CRCs checked by default. Folders or lists of
TFRecord files written by other tools read the same way once ``packer index`` gave them
``.idx`` files (no ``packer.json`` needed).

Modules: ``packer.codecs.tfrecord`` (framing, scanning, ``.idx`` files), ``layout`` (shard names,
sizes, hashing), ``example`` (Sample <-> Example features), ``writer``, ``reader``, ``foreign``
(TFRecord files of other tools). The classes are exported from here on first use.
"""
from __future__ import annotations

from packer.codecs.tfrecord import (FRAMING, INDEX_SUFFIX, frame_record, index_path, index_tfrecords,
                                    looks_like_tfrecord, read_index, scan_tfrecord, unframe_record, write_index)  # noqa: F401
from packer.formats.lazy import lazy_exports
from packer.formats.records.example import sample_features
from packer.formats.records.layout import DEFAULT_SHARD_SIZE, SHARDS_JOURNAL, shard_name
from packer.formats.sidecars import KEYS_FILE
from packer.formats.spec import FormatSpec, ShardFiles

__all__ = ["FORMAT", "RecordsWriter", "RecordsReader", "DEFAULT_SHARD_SIZE", "shard_name",
           "index_path", "frame_record", "unframe_record", "scan_tfrecord", "write_index",
           "read_index", "index_tfrecords", "looks_like_tfrecord", "sample_features"]

# At a URL the sidecars and every shard's .idx are fetched at open, each shard when first read
# (or one record per ranged request); an upload sends each shard once its writer completes it.
FORMAT = FormatSpec(name="records", writer="packer.formats.records.writer:RecordsWriter",
                    reader="packer.formats.records.reader:RecordsReader",
                    sidecars=(KEYS_FILE,), sidecar_suffixes=(INDEX_SUFFIX,), fetch="shards", ranged=True,
                    shards=ShardFiles(glob="*.tfrecord", companions=(INDEX_SUFFIX,), journal=SHARDS_JOURNAL))

__getattr__ = lazy_exports(__name__, {"RecordsWriter": "packer.formats.records.writer",
                                      "RecordsReader": "packer.formats.records.reader"})

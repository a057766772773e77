"""The Writer/Reader seam every packed format implements (re-exported from its modules).

``Sample``/``Record`` live in :mod:`packer.formats.sample`, the sidecar files (keys,
checksums, failures, journals) in :mod:`packer.formats.sidecars`, the base ``Reader`` in
:mod:`packer.formats.reader` and the base ``Writer`` in :mod:`packer.formats.writer`. The
writer side is imported only when asked for, so a reading process never loads it.
"""
from __future__ import annotations

from packer.formats.lazy import lazy_exports
from packer.formats.reader import Reader
from packer.formats.sample import Record, Sample, Stored  # noqa: F401 (re-exported)
from packer.formats.sidecars import (CHECKSUMS_FILE, CRC_JOURNAL, KEYS_FILE, KEYS_JOURNAL, fsync_append,
                                     load_checksums, load_keys, partial_path, write_checksums, write_failures,
                                     write_keys)  # noqa: F401 (re-exported)

__all__ = ["Sample", "Record", "Writer", "Reader", "partial_path", "write_failures", "load_checksums",
           "KEYS_FILE", "write_keys", "load_keys"]

__getattr__ = lazy_exports(__name__, {"Writer": "packer.formats.writer"})  # pyflakes: Writer is lazy

"""HDF5 format: one self-describing ``.h5`` file.

Datasets (N samples, in packed order):

* encoded images: ``blobs`` (uint8, 1-D, every sample's bytes back to back, chunked by 1 MiB)
  and ``offsets`` (int64, N+1): sample i is ``blobs[offsets[i]:offsets[i+1]]``, one positioned
  read; ``shapes`` (uint32, Nx3: height, width, channels as stored);
* raw pixels (``to-hdf5 --raw``): ``pixels`` (uint8, NxHxWxC, one chunk per sample);
* a field pack (``--coco``, ``--manifest``): a dataset per field, ``fields/<name>`` (N rows of a
  fixed-size field, or every sample's rows of a variable-length one back to back with
  ``field_offsets/<name>``, int64 N+1), and ``shapes`` of the first image field
  (``packer.formats.hdf5.columns``; ``crc32c`` is then of the sample's field blob);
* always ``labels`` (int64), ``keys`` (utf-8 strings), ``crc32c`` (uint32, of the stored bytes);
* videos add ``video_offsets`` (int64, V+1), ``video_labels`` (int64), ``video_keys``.

The manifest is the JSON string attribute ``packer_manifest`` of the root group; it is written
last, so a file without it is not a finished output. Failures go to ``{out}.failures.jsonl``.

Writing happens in ``{out}.partial`` (journals beside it) and is flushed and fsync'ed at each
durable commit; ``--resume`` reopens the partial file, cuts every dataset back to the resume
point and checks the kept samples against the CRC journal (a file damaged by the kill is
refused with a clear error instead of being trusted). Readers open the file lazily in each
process (HDF5 handles do not survive ``fork``) without a chunk cache, so a sample costs one
positioned read of its own bytes.
"""
from __future__ import annotations

from packer.formats.hdf5.layout import HDF5_SIGNATURE, HDF5_SUFFIXES, MANIFEST_ATTR
from packer.formats.lazy import lazy_exports
from packer.formats.spec import FormatSpec

__all__ = ["FORMAT", "HDF5Writer", "HDF5Reader", "MANIFEST_ATTR", "HDF5_SIGNATURE"]

# One file, its manifest inside it: at a URL it is fetched whole (docs/remote.md says why).
FORMAT = FormatSpec(name="hdf5", writer="packer.formats.hdf5.writer:HDF5Writer",
                    reader="packer.formats.hdf5.reader:HDF5Reader", suffixes=HDF5_SUFFIXES, fetch="file")

__getattr__ = lazy_exports(__name__, {"HDF5Writer": "packer.formats.hdf5.writer",
                                      "HDF5Reader": "packer.formats.hdf5.reader"})

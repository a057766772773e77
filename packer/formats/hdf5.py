"""HDF5 format: one self-describing ``.h5`` file.

Datasets (N samples, in packed order):

* encoded images: ``blobs`` (uint8, 1-D, every sample's bytes back to back, chunked by 1 MiB)
  and ``offsets`` (int64, N+1): sample i is ``blobs[offsets[i]:offsets[i+1]]``, one positioned
  read; ``shapes`` (uint32, Nx3: height, width, channels as stored);
* raw pixels (``to-hdf5 --raw``): ``pixels`` (uint8, NxHxWxC, one chunk per sample);
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

import errno
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import h5py
import numpy as np

from packer.errors import CorruptData, FormatError
from packer.codecs.image import sniff_format
from packer.integrity import crc32c
from packer.manifest import Manifest
from packer.formats.base import Reader, Record, Sample, Writer

__all__ = ["HDF5Writer", "HDF5Reader", "MANIFEST_ATTR", "HDF5_SIGNATURE"]

log = logging.getLogger(__name__)

MANIFEST_ATTR = "packer_manifest"
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
HDF5_SUFFIXES = (".h5", ".hdf5", ".hdf", ".he5")
BLOB_CHUNK = 1 << 20
TABLE_CHUNK = 1 << 13
_H5_ERRORS = (OSError, KeyError, ValueError, RuntimeError, TypeError)


def _has_signature(path: Path) -> bool:
    """HDF5's signature sits at offset 0, 512, 1024, 2048, ... (after an optional user block)."""
    try:
        with open(path, "rb") as f:
            for at in [0] + [512 << k for k in range(8)]:
                f.seek(at)
                head = f.read(8)
                if len(head) < 8:
                    return False
                if head == HDF5_SIGNATURE:
                    return True
    except OSError:
        return False
    return False


def _append(dset: h5py.Dataset, values: Any) -> None:
    values = np.asarray(values) if not isinstance(values, list) else values
    n = dset.shape[0]
    dset.resize(n + len(values), axis=0)
    dset[n:] = values


class HDF5Writer(Writer):
    """Writes one ``.h5`` file: encoded blobs + offsets, or fixed-size raw ``pixels``.

    Args:
        pixels_shape: ``(height, width, channels)`` to store raw pixels (samples with
            ``fmt="raw"`` of that shape); None stores encoded bytes.
        chunk_bytes: chunk size of the ``blobs`` dataset.
        (and the base Writer's arguments)
    """

    format_name = "hdf5"
    single_file = True

    def __init__(self, out: str | os.PathLike, *, pixels_shape: tuple[int, int, int] | None = None,
                 chunk_bytes: int = BLOB_CHUNK, **kwargs: Any):
        super().__init__(out, **kwargs)
        if pixels_shape is not None:
            pixels_shape = tuple(int(v) for v in pixels_shape)
            if len(pixels_shape) != 3 or min(pixels_shape) < 1:
                raise ValueError(f"pixels_shape must be (height, width, channels), not {pixels_shape!r}")
        if chunk_bytes < 1:
            raise ValueError("chunk_bytes must be positive")
        self.pixels_shape = pixels_shape
        self.chunk_bytes = chunk_bytes
        self._f: h5py.File | None = None
        self._pending: list[Sample] = []

    @classmethod
    def merge_parts(cls, parts: Sequence[Reader], out: str | os.PathLike, **options: Any) -> Manifest:
        """The default re-pack; raw-pixel parts (``to-hdf5 --raw``) merge into a raw-pixel file."""
        with h5py.File(parts[0].path, "r") as f:
            if "pixels" in f:
                options["pixels_shape"] = tuple(int(v) for v in f["pixels"].shape[1:])
        return super().merge_parts(parts, out, **options)

    # -- opening -------------------------------------------------------------------------
    def _open(self, resume_samples: int) -> None:
        self._pending = []
        if self.workdir.exists():
            try:
                self._f = h5py.File(self.workdir, "r+")
                self._cut_back(resume_samples)
            except _H5_ERRORS as e:
                self._close_handles()
                raise CorruptData(str(self.workdir), f"the interrupted output cannot be continued ({e}); "
                                                     "start again with --overwrite") from None
            self._check_prefix(resume_samples)
        elif resume_samples:
            raise CorruptData(str(self.workdir), "the interrupted output is missing; start again with --overwrite")
        else:
            self._create()

    def _create(self) -> None:
        f = self._f = h5py.File(self.workdir, "w")
        self._stored = 0

        def table(name: str, dtype: Any, tail: tuple[int, ...] = (), chunk: int = TABLE_CHUNK) -> None:
            f.create_dataset(name, shape=(0,) + tail, maxshape=(None,) + tail, dtype=dtype,
                             chunks=(chunk,) + tail)

        table("labels", "i8")
        table("keys", h5py.string_dtype("utf-8"), chunk=4096)
        table("crc32c", "u4")
        if self.pixels_shape is not None:
            table("pixels", "u1", self.pixels_shape, chunk=1)
        else:
            table("blobs", "u1", chunk=self.chunk_bytes)
            table("shapes", "u4", (3,))
            f.create_dataset("offsets", data=np.zeros(1, dtype="i8"), maxshape=(None,),
                             chunks=(TABLE_CHUNK,))

    def _cut_back(self, n: int) -> None:
        f = self._f
        raw = "pixels" in f
        if raw != (self.pixels_shape is not None):
            raise ValueError("the interrupted output was written in the other layout (raw vs encoded)")
        if raw and f["pixels"].shape[1:] != self.pixels_shape:
            raise ValueError(f"the interrupted output stores {f['pixels'].shape[1:]} pixels, "
                             f"not {self.pixels_shape}")
        names = ["labels", "keys", "crc32c"] + (["pixels"] if raw else ["shapes"])
        for name in names:
            if f[name].shape[0] < n:
                raise ValueError(f"dataset {name!r} holds {f[name].shape[0]} samples, fewer than {n}")
            f[name].resize(n, axis=0)
        if not raw:
            offsets = f["offsets"]
            if offsets.shape[0] < n + 1:
                raise ValueError(f"dataset 'offsets' holds fewer than {n + 1} entries")
            offsets.resize(n + 1, axis=0)
            f["blobs"].resize(int(offsets[n]), axis=0)
        self._stored = n

    def _check_prefix(self, n: int) -> None:
        """The kept samples must match the CRC journal, stored and recomputed."""
        stored = self._f["crc32c"][:n]
        for i, (data, crc) in enumerate(zip(_iter_stored(self._f, n), self.crcs)):
            if crc32c(data) != crc or int(stored[i]) != crc:
                self._close_handles()
                raise CorruptData(str(self.workdir), "the interrupted output does not match its journal; "
                                                     "start again with --overwrite", position=f"sample {i}")

    # -- writing -------------------------------------------------------------------------
    @staticmethod
    def prepare(sample: Sample) -> int:
        """The CRC32C of the stored bytes."""
        return crc32c(sample.data)

    def _write(self, index: int, sample: Sample) -> int:
        if self.pixels_shape is not None:
            shape = (sample.height, sample.width, sample.channels)
            if sample.fmt != "raw" or shape != self.pixels_shape or len(sample.data) != int(np.prod(shape)):
                raise ValueError(f"{sample.key}: expected {self.pixels_shape} raw pixels, "
                                 f"got {sample.fmt} {shape} ({len(sample.data)} bytes)")
        elif sample.fmt == "raw":
            raise ValueError(f"{sample.key}: raw pixels need an HDF5Writer made with pixels_shape")
        self._pending.append(sample)
        return sample.prepared if sample.prepared is not None else crc32c(sample.data)

    def _commit(self) -> None:
        if not self._pending:
            return
        f, n, batch = self._f, self._stored, self._pending
        k = len(batch)
        self._reserve(sum(len(s.data) for s in batch))
        _append(f["labels"], np.array([s.label for s in batch], dtype="i8"))
        _append(f["keys"], self.keys[n:n + k])
        _append(f["crc32c"], np.array(self.crcs[n:n + k], dtype="u4"))
        data = np.frombuffer(b"".join(s.data for s in batch), dtype=np.uint8)
        if self.pixels_shape is not None:
            _append(f["pixels"], data.reshape((k,) + self.pixels_shape))
        else:
            base = int(f["offsets"][n])
            _append(f["blobs"], data)
            _append(f["offsets"], base + np.cumsum([len(s.data) for s in batch], dtype="i8"))
            _append(f["shapes"], np.array([(s.height, s.width, s.channels) for s in batch], dtype="u4"))
        f.flush()
        os.fsync(f.id.get_vfd_handle())
        self._stored = n + k
        self._pending = []

    def _reserve(self, nbytes: int) -> None:
        """Allocate room for the next commit before HDF5 writes a byte of it.

        HDF5 cannot recover from a failed write (ENOSPC, EFBIG): it reports it while evicting
        cached chunks, then crashes in the next flush. So the room is tried first: allocate it
        with ``posix_fallocate`` (a full disk or a file-size limit fails here, as an ``OSError``,
        with the file as the last commit left it), then give it back for HDF5 to write into.
        """
        fd = os.open(self.workdir, os.O_WRONLY)
        try:
            size = os.fstat(fd).st_size
            try:
                os.posix_fallocate(fd, size, nbytes + 2 * self.chunk_bytes + (1 << 20))
            except OSError as e:
                if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):  # no fallocate here: write and see
                    raise
            os.ftruncate(fd, size)
        finally:
            os.close(fd)

    def _finish(self, manifest: Manifest) -> None:
        f = self._f
        self._reserve(len(manifest.to_json()) + 64 * len(manifest.videos))
        if manifest.videos:
            starts = [int(v["start"]) for v in manifest.videos]
            ends = [int(v["start"]) + int(v["length"]) for v in manifest.videos]
            f.create_dataset("video_offsets", data=np.array(starts[:1] + ends, dtype="i8"))
            f.create_dataset("video_labels", data=np.array([int(v.get("label", -1)) for v in manifest.videos],
                                                           dtype="i8"))
            f.create_dataset("video_keys", data=[str(v["key"]) for v in manifest.videos],
                             dtype=h5py.string_dtype("utf-8"))
        f.attrs[MANIFEST_ATTR] = manifest.to_json()
        f.flush()

    def _close_handles(self) -> None:
        if self._f is not None:
            try:
                self._f.close()
            finally:
                self._f = None


def _iter_stored(f: h5py.File, n: int, slab: int = 64 << 20) -> Iterator[memoryview]:
    """The stored bytes of samples 0..n-1, read in large sequential slabs."""
    if "pixels" in f:
        ds = f["pixels"]
        per = max(1, slab // max(1, int(np.prod(ds.shape[1:]))))
        for start in range(0, n, per):
            block = ds[start:min(n, start + per)]
            for row in block:
                yield memoryview(np.ascontiguousarray(row)).cast("B")
        return
    offsets = f["offsets"][:n + 1]
    blobs = f["blobs"]
    i = 0
    while i < n:
        j = i + 1
        while j < n and offsets[j + 1] - offsets[i] <= slab:
            j += 1
        block = blobs[int(offsets[i]):int(offsets[j])]
        for k in range(i, j):
            yield memoryview(block)[int(offsets[k] - offsets[i]):int(offsets[k + 1] - offsets[i])]
        i = j


def _chunk_table(dset: h5py.Dataset) -> np.ndarray | None:
    """File offsets of the chunks of ``dset``, by chunk number along axis 0, when its stored
    bytes can be read straight from the file: no filters, chunked along axis 0 only, every
    chunk allocated. None otherwise (then reads go through HDF5)."""
    chunks = dset.chunks
    if (chunks is None or tuple(chunks[1:]) != tuple(dset.shape[1:]) or not hasattr(dset.id, "chunk_iter")
            or dset.id.get_create_plist().get_nfilters() != 0):
        return None
    table = np.full(-(-dset.shape[0] // chunks[0]), -1, dtype=np.int64)

    def visit(info: Any) -> None:
        table[info.chunk_offset[0] // chunks[0]] = info.byte_offset

    dset.id.chunk_iter(visit)
    return table if table.size == 0 or table.min() >= 0 else None


@dataclass
class _Open:
    """This process's open file, the small per-sample tables (loaded once) and, for direct
    positioned reads, a plain file descriptor and the data chunks' file offsets."""

    file: h5py.File
    data: h5py.Dataset
    labels: np.ndarray
    crcs: np.ndarray
    offsets: np.ndarray | None
    shapes: np.ndarray | None
    fd: int = -1
    chunk_offsets: np.ndarray | None = None

    def __post_init__(self) -> None:  # h5py property lookups cost microseconds: ask once
        self.shape = tuple(self.data.shape)
        self.chunk_len = self.data.chunks[0] if self.data.chunks else 0
        self.sample_bytes = int(np.prod(self.shape[1:]))

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        self.file.close()

    def read_bytes(self, index: int, start: int, end: int) -> bytes:
        """The stored bytes of a sample: ``pixels[index]``, or ``blobs[start:end]``."""
        if self.chunk_offsets is None:  # through HDF5
            return (self.data[index] if self.offsets is None else self.data[start:end]).tobytes()
        if self.offsets is None:  # one chunk per sample: one positioned read
            return self._pread(self.sample_bytes, int(self.chunk_offsets[index]))
        parts = []
        while start < end:  # one positioned read, two where a sample crosses a chunk boundary
            k, at = divmod(start, self.chunk_len)
            n = min(end - start, self.chunk_len - at)
            parts.append(self._pread(n, int(self.chunk_offsets[k]) + at))
            start += n
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def _pread(self, n: int, at: int) -> bytes:
        data = os.pread(self.fd, n, at)
        if len(data) != n:
            raise ValueError(f"short read: {len(data)} of {n} bytes at file offset {at} (file truncated?)")
        return data


class HDF5Reader(Reader):
    """Random access to a packer ``.h5`` file (encoded or raw)."""

    format_name = "hdf5"

    def __init__(self, path: str | os.PathLike, *, check_crc: bool = True):
        self._h: _Open | None = None
        self._keys: list[str] | None = None
        super().__init__(path, check_crc=check_crc)

    @classmethod
    def detect(cls, path: Path) -> bool:
        return path.is_file() and (path.suffix.lower() in HDF5_SUFFIXES or _has_signature(path))

    def _load_manifest(self) -> Manifest:
        if not _has_signature(self.path):
            raise CorruptData(str(self.path), "not an HDF5 file (no HDF5 signature)")
        try:
            with h5py.File(self.path, "r") as f:
                text = f.attrs.get(MANIFEST_ATTR)
        except _H5_ERRORS as e:
            raise CorruptData(str(self.path), f"cannot open HDF5 file ({e})") from None
        if text is None:
            raise FormatError(f"{self.path}: HDF5 file without a {MANIFEST_ATTR!r} attribute "
                              "(not a finished packer output)")
        if isinstance(text, bytes):
            text = text.decode("utf-8", "replace")
        return Manifest.from_json(str(text), f"{self.path}:{MANIFEST_ATTR}")

    # -- per-process state ------------------------------------------------------------------
    def _open(self) -> _Open:
        pid = os.getpid()
        if self._h is not None and self._pid == pid:
            return self._h
        if self._h is not None and self._h.fd >= 0:  # inherited across fork: drop the parent's
            os.close(self._h.fd)  # (this process's copy of the descriptor only)
        self._h = None
        try:
            f = h5py.File(self.path, "r", rdcc_nbytes=0)
            raw = "pixels" in f
            n = len(self)
            labels = f["labels"][:]
            crcs = f["crc32c"][:]
            offsets = None if raw else f["offsets"][:]
            shapes = None if raw else f["shapes"][:]
            data = f["pixels"] if raw else f["blobs"]
        except _H5_ERRORS as e:
            raise CorruptData(str(self.path), f"cannot read HDF5 datasets ({e})") from None
        for name, arr, want in (("labels", labels, n), ("crc32c", crcs, n),
                                ("offsets", offsets, n + 1), ("shapes", shapes, n)):
            if arr is not None and arr.shape[0] != want:
                f.close()
                raise CorruptData(str(self.path), f"dataset {name!r} holds {arr.shape[0]} entries, "
                                                  f"expected {want} (manifest count {n})")
        if raw and data.shape[0] != n:
            f.close()
            raise CorruptData(str(self.path), f"dataset 'pixels' holds {data.shape[0]} samples, manifest says {n}")
        h = _Open(f, data, labels, crcs, offsets, shapes)
        if raw and data.chunks != (1,) + data.shape[1:]:
            table = None  # several samples per chunk: read through HDF5
        else:
            table = _chunk_table(data)
        if table is not None:
            h.fd, h.chunk_offsets = os.open(self.path, os.O_RDONLY), table
        self._h = h
        self._pid = pid
        return h

    def _handle_attrs(self) -> tuple[str, ...]:
        return ("_h",)

    def close(self) -> None:
        if self._h is not None and self._pid == os.getpid():
            self._h.close()
        self._h = None

    # -- reading ------------------------------------------------------------------------------
    @property
    def keys(self) -> list[str]:
        if self._keys is None:
            try:
                with h5py.File(self.path, "r") as f:
                    keys = list(f["keys"].asstr()[:])
            except _H5_ERRORS as e:
                raise CorruptData(str(self.path), f"cannot read keys ({e})") from None
            if len(keys) != len(self):
                raise CorruptData(str(self.path), f"holds {len(keys)} keys, manifest says {len(self)}")
            self._keys = keys
        return self._keys

    def _key_name(self, index: int) -> str | None:
        try:
            return self.keys[index]
        except CorruptData:
            return None

    def read(self, index: int) -> Record:
        index = self._check_index(index)
        h = self._open()
        try:
            if h.offsets is None:
                data = h.read_bytes(index, 0, 0)
                height, width, channels = h.shape[1:]
                fmt = "raw"
            else:
                start, end = int(h.offsets[index]), int(h.offsets[index + 1])
                if not 0 <= start <= end <= h.shape[0]:
                    raise CorruptData(str(self.path), f"offsets {start}..{end} outside the {h.shape[0]}-byte "
                                                      "blobs dataset", position=f"sample {index}",
                                      key=self._key_name(index))
                data = h.read_bytes(index, start, end)
                height, width, channels = (int(v) for v in h.shapes[index])
                fmt = sniff_format(data)
        except _H5_ERRORS as e:
            raise CorruptData(str(self.path), f"HDF5 read failed ({e})", position=f"sample {index}",
                              key=self._key_name(index)) from None
        if self.check_crc and crc32c(data) != int(h.crcs[index]):
            raise CorruptData(str(self.path), "CRC32C mismatch", position=f"sample {index}",
                              key=self._key_name(index))
        return Record(data, int(h.labels[index]), fmt, int(height), int(width), int(channels))

    def verify_structure(self) -> Iterator[CorruptData]:
        try:
            h = self._open()
            _ = self.keys
        except CorruptData as e:
            yield e
            return
        if h.offsets is not None:
            o = h.offsets
            if o[0] != 0 or np.any(np.diff(o) < 0) or o[-1] != h.data.shape[0]:
                yield CorruptData(str(self.path), "dataset 'offsets' is not a non-decreasing 0..len(blobs) index")
        videos = self.manifest.videos
        if videos:
            try:
                vo = h.file["video_offsets"][:]
            except _H5_ERRORS as e:
                yield CorruptData(str(self.path), f"cannot read video_offsets ({e})")
                return
            want = [int(v["start"]) for v in videos[:1]] + [int(v["start"]) + int(v["length"]) for v in videos]
            if vo.tolist() != want:
                yield CorruptData(str(self.path), "dataset 'video_offsets' does not match the manifest's videos")

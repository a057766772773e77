"""HDF5 format, writing: one ``.h5`` file, flushed and fsync'ed at each durable commit."""
from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any, Iterator, Sequence

import h5py
import numpy as np

from packer.codecs.fields import BLOB_FMT, split_blob
from packer.errors import CorruptData
from packer.formats.hdf5 import FORMAT
from packer.formats.hdf5.columns import (FIELDS_GROUP, Column, append_columns, check_parts, columns_of,
                                         create_columns, cut_back_columns, iter_blobs)
from packer.formats.hdf5.layout import BLOB_CHUNK, H5_ERRORS, MANIFEST_ATTR, TABLE_CHUNK
from packer.formats.hdf5.parts import Deleter, PartBytes, part_record, stored_size
from packer.formats.reader import Reader
from packer.formats.sample import Sample, Stored
from packer.formats.segments import remove_segment_files
from packer.formats.sidecars import array_checksum
from packer.fileio import place
from packer.formats.writer import Segments, Writer
from packer.integrity import crc32c
from packer.manifest import Manifest

__all__ = ["HDF5Writer"]

# A commit's bytes go to HDF5 in joins of at most this size: a join of the whole batch (up to
# ``commit_bytes``, 64 MB) is a block past glibc's largest mmap threshold (32 MiB), mapped and
# unmapped at every commit, its pages faulted in and zeroed anew each time (~12 page faults per
# 50 kB sample in ``python -m scripts.bench.write``'s page-fault column); smaller joins reuse the heap.
_PIECE_BYTES = 8 << 20


def _append(dset: h5py.Dataset, values: Any) -> None:
    values = np.asarray(values) if not isinstance(values, list) else values
    n = dset.shape[0]
    dset.resize(n + len(values), axis=0)
    dset[n:] = values


class HDF5Writer(Writer):
    """Writes one ``.h5`` file: encoded blobs + offsets, fixed-size raw ``pixels``, or for a
    field pack (``schema`` set) a dataset per field (``packer.formats.hdf5.columns``).

    Args:
        pixels_shape: ``(height, width, channels)`` to store raw pixels (samples with
            ``fmt="raw"`` of that shape); None stores encoded bytes.
        chunk_bytes: chunk size of the ``blobs`` dataset.
        (and the base Writer's arguments)
    """

    format_name = FORMAT.name
    single_file = FORMAT.single_file
    # workers may store the samples into part files; each commit copies them into the file. A
    # part is extra disk space until then: <= 1,024 inputs each; a part ends no commit and is
    # never fsynced, so inputs split into ~8 parts per worker (>= 64 inputs a part)
    segments = Segments(record=part_record, indexed=False, inputs=(64, 1024), per_worker=8)

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
        self._pending_parts: list[list[memoryview]] = []  # a field pack's pending blobs, split
        self._columns: list[Column] = []  # a field pack's datasets (set at open, once the schema is)
        self._deleter = Deleter()

    @classmethod
    def merge_options(cls, parts: Sequence[Reader]) -> dict[str, Any]:
        """Raw-pixel parts (``to-hdf5 --raw``) merge into a raw-pixel file of their shape."""
        with h5py.File(parts[0].path, "r") as f:
            if "pixels" in f:
                return {"pixels_shape": tuple(int(v) for v in f["pixels"].shape[1:])}
        return {}

    # -- opening -------------------------------------------------------------------------
    def _open(self, resume_samples: int) -> None:
        self._pending = []
        self._pending_parts = []
        self._columns = columns_of(self.schema) if self.schema is not None else []
        remove_segment_files(self.segment_dir)  # a killed run's workers' parts: redone from the inputs
        if self.workdir.exists():
            try:
                self._f = h5py.File(self.workdir, "r+")
                self._cut_back(resume_samples)
            except H5_ERRORS as e:
                self._close_handles()
                raise CorruptData(str(self.workdir), f"the interrupted output cannot be continued ({e}); "
                                                     "start again with --overwrite") from e
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
        if self.schema is not None:  # a field pack: a dataset per field, the first image's shapes
            if self.pixels_shape is not None:
                raise ValueError("a field pack stores encoded images; raw pixels (pixels_shape) do not apply")
            table("shapes", "u4", (3,))
            create_columns(f, self.schema, chunk_bytes=self.chunk_bytes)
        elif self.pixels_shape is not None:
            table("pixels", "u1", self.pixels_shape, chunk=1)
        else:
            table("blobs", "u1", chunk=self.chunk_bytes)
            table("shapes", "u4", (3,))
            f.create_dataset("offsets", data=np.zeros(1, dtype="i8"), maxshape=(None,),
                             chunks=(TABLE_CHUNK,))

    def _cut_back(self, n: int) -> None:
        f = self._f
        raw = "pixels" in f
        if (FIELDS_GROUP in f) != (self.schema is not None):
            raise ValueError("the interrupted output was written in another layout (a dataset per field "
                             "vs one per sample)")
        if self.schema is not None:
            for name in ("labels", "keys", "crc32c", "shapes"):
                if f[name].shape[0] < n:
                    raise ValueError(f"dataset {name!r} holds {f[name].shape[0]} samples, fewer than {n}")
                f[name].resize(n, axis=0)
            cut_back_columns(f, self.schema, n)
            self._stored = n
            return
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
        blobs = iter_blobs(self._f, self.schema, n) if self.schema is not None else _iter_stored(self._f, n)
        for i, (data, crc) in enumerate(zip(blobs, self.crcs)):
            if crc32c(data) != crc or int(stored[i]) != crc:
                self._close_handles()
                raise CorruptData(str(self.workdir), "the interrupted output does not match its journal; "
                                                     "start again with --overwrite", position=f"sample {i}")

    # -- writing -------------------------------------------------------------------------
    def _write(self, index: int, sample: Sample) -> int:
        prepared = sample.prepared
        stored = prepared if isinstance(prepared, Stored) else None
        size = stored.size if stored is not None else len(sample.data)
        if self.pixels_shape is not None:
            shape = (sample.height, sample.width, sample.channels)
            if sample.fmt != "raw" or shape != self.pixels_shape or size != int(np.prod(shape)):
                raise ValueError(f"{sample.key}: expected {self.pixels_shape} raw pixels, "
                                 f"got {sample.fmt} {shape} ({size} bytes)")
        elif sample.fmt == "raw":
            raise ValueError(f"{sample.key}: raw pixels need an HDF5Writer made with pixels_shape")
        if (sample.fmt == BLOB_FMT) != (self.schema is not None):
            raise ValueError(f"{sample.key}: a field sample needs a writer with a schema, and a writer with "
                             f"a schema field samples (got {sample.fmt!r})")
        if self.schema is not None:  # refused here, not halfway through a commit
            if stored is not None:  # (field packs run on the item executors: samples come back whole)
                raise ValueError(f"{sample.key}: a field sample is split into its fields here, not stored by "
                                 "a worker")
            try:
                parts = split_blob(sample.data, len(self._columns))
                check_parts(self._columns, parts)
            except ValueError as e:
                raise ValueError(f"{sample.key}: {e}") from e
            self._pending_parts.append(parts)
        self._pending.append(sample)
        if stored is not None:  # in a worker's part file: its size counts toward the commit here
            if stored.part is None:
                raise ValueError(f"{sample.key}: a stored sample without its part file")
            self._pending_bytes += size
            return stored.crc
        return crc32c(sample.data)

    def _commit(self) -> None:
        if not self._pending:
            return
        f, n, batch = self._f, self._stored, self._pending
        k = len(batch)
        sizes = [stored_size(s) for s in batch]
        self._reserve(sum(sizes))
        _append(f["labels"], np.array([s.label for s in batch], dtype="i8"))
        _append(f["keys"], self.keys[n:n + k])
        _append(f["crc32c"], np.array(self.crcs[n:n + k], dtype="u4"))
        with PartBytes() as parts:
            if self.pixels_shape is not None:
                for part in _pieces(batch):
                    data = np.frombuffer(parts.join(part), dtype=np.uint8)
                    _append(f["pixels"], data.reshape((len(part),) + self.pixels_shape))
            elif self.schema is not None:
                self._commit_fields()
            else:
                base = int(f["offsets"][n])
                for part in _pieces(batch):
                    _append(f["blobs"], np.frombuffer(parts.join(part), dtype=np.uint8))
                _append(f["offsets"], base + np.cumsum(sizes, dtype="i8"))
            if self.pixels_shape is None:
                _append(f["shapes"], np.array([(s.height, s.width, s.channels) for s in batch], dtype="u4"))
        f.flush()
        os.fsync(f.id.get_vfd_handle())
        self._stored = n + k
        self._pending = []
        self._pending_parts = []
        # a part whose last sample is now in the file is done with; deleting it frees its page
        # cache, kernel work that grows with its size, done on a thread beside the next batch
        self._deleter.later([s.prepared.shard.path for s in batch
                             if isinstance(s.prepared, Stored) and s.prepared.shard is not None])

    def _commit_fields(self) -> None:
        """Append each field of the pending samples (split at ``add``) to its dataset, a run of
        at most ``_PIECE_BYTES`` at a time."""
        n, at = self._stored, 0
        for piece in _pieces(self._pending):
            append_columns(self._f, self._columns, n + at, self._pending_parts[at:at + len(piece)])
            at += len(piece)

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
        # labels and shapes are arrays beside the CRC'd sample bytes: the manifest keeps their CRCs
        manifest.integrity["labels"] = array_checksum(f["labels"][:self.count], "<i8")
        if "shapes" in f:
            manifest.integrity["shapes"] = array_checksum(f["shapes"][:self.count], "<u4")
        self._reserve(len(manifest.to_json()) + 64 * len(manifest.videos))
        if manifest.videos:
            starts = [int(v["start"]) for v in manifest.videos]
            ends = [int(v["start"]) + int(v["length"]) for v in manifest.videos]
            f.create_dataset("video_offsets", data=np.array(starts[:1] + ends, dtype="i8"))
            f.create_dataset("video_labels", data=np.array([int(v.get("label", -1)) for v in manifest.videos],
                                                           dtype="i8"))
            f.create_dataset("video_keys", data=[str(v["key"]) for v in manifest.videos],
                             dtype=h5py.string_dtype("utf-8"))
        sources = self._sources_rows()
        if sources is not None:  # what --append compares inputs with (docs/append.md)
            if "sources" in f:
                del f["sources"]
            f.create_dataset("sources", data=sources)
        f.attrs[MANIFEST_ATTR] = manifest.to_json()
        f.flush()

    # -- appending: the new samples are a part file beside a head file -------------------------
    def parts_dir(self) -> Path:
        """The folder of an appended output's part files: ``{out}.parts`` beside it."""
        return self.belonging(self.out)[0]

    @classmethod
    def belonging(cls, out: Path) -> list[Path]:
        return [out.with_name(out.name + ".parts")]

    def _part_name(self, version: int) -> str:
        return f"{self.parts_dir().name}/v{version}.h5"

    def _added(self, first: int) -> dict[str, Any]:
        return {"parts": [self._part_name(self.append_to.manifest.version + 1)]} if self.count else {}

    def _finish_appended(self, version: Manifest, added: Manifest, keys: list[str]) -> None:
        """The partial file is finished as a standalone pack of the new samples (``added``) and
        linked into ``{out}.parts`` as the new version's part; the first append links the output
        itself there as the part of version 1 (no copy: a reader holding it keeps reading it)."""
        base = self.append_to
        self._finish(added)
        self._close_handles()
        folder = self.parts_dir()
        folder.mkdir(exist_ok=True)
        parts = [dict(p) for p in base.manifest.parts]
        if not parts:  # the output is one plain file yet: it becomes the first part
            first = self._part_name(base.manifest.version)
            place(self.out, self.out.parent / first)
            parts = [{"file": first, "count": base.stored}]
        if self.count:
            name = self._part_name(version.version)
            place(self.workdir, self.out.parent / name)
            parts.append({"file": name, "count": self.count})
        version.parts = parts
        labels, shapes = base.reader.stored_tables()
        with h5py.File(self.workdir, "r") as f:
            labels = np.concatenate([labels, f["labels"][:]])
            if shapes is not None and "shapes" in f:
                shapes = np.concatenate([shapes, f["shapes"][:]])
            else:
                shapes = None
        chosen = np.concatenate([np.arange(a, b) for a, b in version.ranges()] or [np.zeros(0, np.int64)])
        version.integrity["labels"] = array_checksum(labels[chosen], "<i8")
        if shapes is not None:
            version.integrity["shapes"] = array_checksum(shapes[chosen], "<u4")

    def _publish_version(self, version: Manifest) -> None:
        """A new head file (every version's manifest, no data) replaces the output atomically."""
        texts = dict(self._version_texts())
        texts[version.version] = version.to_json()
        tmp = self.out.with_name(f".{self.out.name}.head-{os.getpid()}")
        try:
            with h5py.File(tmp, "w") as f:
                f.attrs[MANIFEST_ATTR] = texts[version.version]
                for n, text in sorted(texts.items()):
                    f.attrs[f"{MANIFEST_ATTR}_v{n}"] = text
            with open(tmp, "rb+") as fh:
                os.fsync(fh.fileno())
            os.replace(tmp, self.out)
        finally:
            tmp.unlink(missing_ok=True)

    def _version_texts(self) -> Iterator[tuple[int, str]]:
        """Every published version's manifest as it was published (the base's head, or file)."""
        base = self.append_to
        if not base.manifest.parts:
            yield base.manifest.version, base.text
            return
        with h5py.File(self.out, "r") as f:
            for n in range(1, base.manifest.version + 1):
                text = f.attrs.get(f"{MANIFEST_ATTR}_v{n}")
                if text is not None:
                    yield n, text.decode("utf-8") if isinstance(text, bytes) else str(text)

    def _close_handles(self) -> None:
        self._deleter.join()
        if self._f is not None:
            try:
                self._f.close()
            finally:
                self._f = None


def _pieces(batch: list[Sample], limit: int | None = None) -> Iterator[list[Sample]]:
    """``batch`` in runs of at most ``limit`` bytes (default ``_PIECE_BYTES``; a run holds one
    sample at least)."""
    limit = limit or _PIECE_BYTES
    part: list[Sample] = []
    size = 0
    for s in batch:
        n = stored_size(s)
        if part and size + n > limit:
            yield part
            part, size = [], 0
        part.append(s)
        size += n
    if part:
        yield part


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

"""records format, reading: random access through the DALI indexes into shards mapped read-only."""
from __future__ import annotations

import collections
import mmap
import os
import threading
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from packer.codecs.tfexample import decode_example
from packer.codecs.tfrecord import INDEX_SUFFIX, read_index, unframe_record
from packer.errors import CorruptData, FormatError
from packer.formats.reader import Reader
from packer.codecs.fields import BLOB_FMT
from packer.codecs.tfexample import int64_feature
from packer.formats.records.example import fields_blob, record_of
from packer.formats.records.foreign import ForeignKeys, foreign_files, foreign_manifest, has_tfrecords
from packer.formats.records.layout import join_index, sha256_file
from packer.formats.sample import Record, Sample
from packer.manifest import MANIFEST_NAME, Manifest

__all__ = ["RecordsReader"]

_MAX_OPEN = 64  # shard files a reader keeps mapped per process
_MAPS_LOCK = threading.RLock()  # readers are shared by packer.Loader's threads


def _checked_shards(manifest: Manifest, source: Path) -> Manifest:
    """Refuse a manifest whose shard list is damaged (missing fields, bad types, counts that do
    not add up, names that leave the folder) with CorruptData naming it, never a KeyError later."""
    total = 0
    if not isinstance(manifest.shards, list):
        raise CorruptData(str(source), "'shards' is not a list")
    for k, shard in enumerate(manifest.shards):
        where = f"shards[{k}]"
        if not isinstance(shard, dict):
            raise CorruptData(str(source), f"{where} is not an object")
        name, count = shard.get("file"), shard.get("count")
        if not isinstance(name, str) or not name or os.path.isabs(name) or ".." in Path(name).parts:
            raise CorruptData(str(source), f"{where} has no valid 'file'")
        if "index" in shard and not isinstance(shard["index"], str):
            raise CorruptData(str(source), f"{where} has an invalid 'index'")
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise CorruptData(str(source), f"{where} has no valid 'count'")
        for field in ("bytes",):
            if field in shard and (not isinstance(shard[field], int) or shard[field] < 0):
                raise CorruptData(str(source), f"{where} has an invalid '{field}'")
        if "sha256" in shard and not isinstance(shard["sha256"], str):
            raise CorruptData(str(source), f"{where} has an invalid 'sha256'")
        total += count
    if total != manifest.physical:
        raise CorruptData(str(source), f"shard counts add up to {total}, manifest count is {manifest.physical}")
    return manifest


class RecordsReader(Reader):
    """Random access to record shards through their DALI indexes (shards mapped read-only, no scan).

    ``path`` is a packer records output, or TFRecord files written by other tools that have
    ``.idx`` indexes (``packer index``): a folder of them, one file, or a list of files. Such
    foreign records need ``image/encoded``; the label is ``image/class/label`` (-1 when absent)
    and the key ``image/filename`` (else ``{file}:{record}``).
    """

    format_name = "records"

    def __init__(self, path: str | os.PathLike | Sequence[str | os.PathLike], *, check_crc: bool = True,
                 version: int | None = None):
        self._foreign: list[Path] | None = None
        if isinstance(path, (list, tuple)):
            if not path:
                raise FormatError("no TFRecord files given")
            self._foreign = [Path(p) for p in path]
            path = self._foreign[0].parent
        elif not (Path(path) / MANIFEST_NAME).is_file():
            self._foreign = foreign_files(Path(path))
        self._index: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._maps: collections.OrderedDict[int, tuple[mmap.mmap | None, memoryview]] = collections.OrderedDict()
        self._root: Path | None = None
        if self._foreign is not None and version is not None:
            raise FormatError(f"{path}: TFRecord files without a packer manifest have no versions")
        super().__init__(path, check_crc=check_crc, version=version)

    def _current_identity(self) -> tuple[int, ...] | None:
        return None if self._foreign is not None else super()._current_identity()  # other tools' files

    @classmethod
    def detect(cls, path: Path) -> bool:
        """A folder or file of TFRecords with no manifest (foreign shards)."""
        return has_tfrecords(path)

    @property
    def root(self) -> Path:
        """The folder shard names are relative to."""
        if self._root is None:
            self._root = self.path if self.path.is_dir() else self.path.parent
        return self._root

    @property
    def foreign(self) -> bool:
        """True for TFRecord files without a packer manifest."""
        return self._foreign is not None

    def _load_manifest(self) -> Manifest:
        if self._foreign is None:
            return _checked_shards(Manifest.load(self.path, self.version_asked), self.path / MANIFEST_NAME)
        manifest, self._index = foreign_manifest(self._foreign, self.root)
        return manifest

    # -- index and files -------------------------------------------------------------------------
    def shard_path(self, k: int) -> Path:
        """The file of shard ``k``."""
        return self.root / self.manifest.shards[k]["file"]

    def shard_index_path(self, k: int) -> Path:
        """The ``.idx`` file of shard ``k``."""
        s = self.manifest.shards[k]
        return self.root / s.get("index", s["file"] + INDEX_SUFFIX)

    @property
    def shard_counts(self) -> list[int]:
        """This version's samples per shard, in shard order (all the shard's records, unless a
        pruned version leaves some out)."""
        counts = [int(s["count"]) for s in self.manifest.shards]
        if self._select is None:
            return counts
        ends = np.cumsum(counts)
        return np.bincount(np.searchsorted(ends, self.positions(), side="right"), minlength=len(counts)).tolist()

    def _load_index(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self._index is None:
            offsets, sizes = [], []
            for k, s in enumerate(self.manifest.shards):
                o, z = read_index(self.shard_index_path(k))
                if len(o) != int(s["count"]):
                    raise CorruptData(str(self.shard_index_path(k)),
                                      f"{len(o)} entries, manifest says {s['count']} records")
                offsets.append(o)
                sizes.append(z)
            self._check_unchanged()  # the indexes of the shards the manifest lists
            index = join_index(offsets, sizes)
            if len(index[0]) != self.manifest.physical:
                raise CorruptData(str(self.path), f"shards hold {len(index[0])} records, "
                                                  f"manifest says {self.manifest.physical}")
            self._index = index
        return self._index

    def _view(self, k: int) -> memoryview:
        """Shard ``k`` mapped read-only (opened lazily in each process, at most _MAX_OPEN at once)."""
        with _MAPS_LOCK:
            return self._view_locked(k)

    def _view_locked(self, k: int) -> memoryview:
        if self._pid != os.getpid():  # inherited across fork: map our own
            self._unmap_all()
            self._pid = os.getpid()
        entry = self._maps.get(k)
        if entry is not None:
            self._maps.move_to_end(k)
            return entry[1]
        path = self.shard_path(k)
        try:
            with open(path, "rb") as f:
                st = os.fstat(f.fileno())
                m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if st.st_size else None
        except OSError as e:
            self._check_unchanged()  # a shard gone because the output was replaced says so
            raise CorruptData(str(path), f"cannot open shard ({e.strerror or e})") from e
        entry = (m, memoryview(m) if m is not None else memoryview(b""))
        try:  # streamed shard by shard: a shard mapped after an --overwrite is not the one listed
            self._check_unchanged()
            self._shard_opened(k, path, st, entry[1])
        except Exception:
            _unmap(entry)
            raise
        self._maps[k] = entry
        if len(self._maps) > _MAX_OPEN:
            _unmap(self._maps.popitem(last=False)[1])
        return self._maps[k][1]

    def _shard_opened(self, k: int, path: Path, st: os.stat_result, view: memoryview) -> None:
        """Hook: shard ``k`` was just mapped from ``path`` (``st``: its fstat). The node cache's
        reader checks there that the file is the version its manifest lists."""

    def _unmap_all(self) -> None:
        for entry in self._maps.values():
            _unmap(entry)
        self._maps = collections.OrderedDict()

    def locate(self, index: int) -> tuple[int, int]:
        """(shard, record within the shard) of sample ``index``."""
        index = self._check_index(index)
        starts = self._load_index()[2]
        k = int(np.searchsorted(starts, index, side="right")) - 1
        return k, index - int(starts[k])

    def _key_name(self, index: int) -> str | None:
        """The key of sample ``index`` for an error message, when known without reading it."""
        return None if self._foreign is not None else super()._key_name(index)

    def _corrupt(self, index: int, k: int, reason: str, position: str) -> CorruptData:
        return CorruptData(str(self.shard_path(k)), reason, position=position, key=self._key_name(index))

    def _locate(self, index: int) -> tuple[int, int, int, int, int, str]:
        """``(index, shard, record in the shard, offset, size, where)`` of sample ``index``
        (``where`` names the record for an error message)."""
        index = self._check_index(index)
        offsets, sizes, starts = self._load_index()
        k = int(np.searchsorted(starts, index, side="right")) - 1
        offset, size = int(offsets[index]), int(sizes[index])
        local = index - int(starts[k])
        return index, k, local, offset, size, f"record {local} (byte {offset})"

    def _read_framed(self, index: int) -> tuple[memoryview, int, int]:
        index, k, local, offset, size, where = self._locate(index)
        view = self._view(k)
        if offset + size > len(view):  # checked before touching the mapping: no SIGBUS
            left = max(0, len(view) - offset)
            raise self._corrupt(index, k, f"truncated shard: record needs {size} bytes, {left} left", where)
        buf = view[offset:offset + size]
        try:
            payload = unframe_record(buf, check_crc=self.check_crc)
        except CorruptData as e:
            raise self._corrupt(index, k, e.reason, where) from e
        return payload, k, local

    def read_payload(self, index: int) -> memoryview:
        """The serialized Example of sample ``index`` (framing and CRC checked)."""
        return self._read_framed(index)[0]

    def _features(self, index: int) -> tuple[dict[str, list], int, int]:
        payload, k, local = self._read_framed(index)
        try:
            return decode_example(payload), k, local
        except ValueError as e:
            index = self._check_index(index)
            raise self._corrupt(index, k, f"malformed Example ({e})", f"record {local}") from e

    def read_features(self, index: int) -> dict[str, list]:
        """Every feature of sample ``index``'s Example."""
        return self._features(index)[0]

    def sample(self, index: int) -> Sample:
        """The stored sample as a writer takes it, with ``video_index``/``frame_index`` extras."""
        feats, k, local = self._features(index)
        try:
            rec = self._record(feats)
        except ValueError as e:
            raise self._corrupt(self._check_index(index), k, str(e), f"record {local}") from e
        names = (("video/index", "video_index"), ("frame/index", "frame_index"))
        extra = {key: feats[name][0] for name, key in names if feats.get(name) and isinstance(feats[name][0], int)}
        return Sample(self.stored_key(self._check_index(index)), rec.data, rec.fmt, rec.label, rec.height,
                      rec.width, rec.channels, extra)

    def read(self, index: int) -> Record:
        feats, k, local = self._features(index)
        try:
            return self._record(feats)
        except ValueError as e:
            raise self._corrupt(self._check_index(index), k, str(e), f"record {local}") from e

    def _record(self, feats: dict[str, list]) -> Record:
        """The Record of an Example: a field pack's is its field blob (``fields_blob``)."""
        schema = self.schema
        if schema is None:
            return record_of(feats)
        return Record(fields_blob(schema, feats), -1, BLOB_FMT, int64_feature(feats, "image/height", 0),
                      int64_feature(feats, "image/width", 0), int64_feature(feats, "image/channels", 0))

    def _load_keys(self) -> Sequence[str]:
        return ForeignKeys(self) if self._foreign is not None else super()._load_keys()

    # -- integrity -------------------------------------------------------------------------------
    def verify_structure(self) -> Iterator[CorruptData]:
        """Counts, index against shard sizes (contiguous, covering the file), sha256 per shard."""
        total = 0
        for k, s in enumerate(self.manifest.shards):
            shard, idx = self.shard_path(k), self.shard_index_path(k)
            total += int(s["count"])
            if not shard.is_file():
                yield CorruptData(str(shard), "missing shard")
                continue
            size = shard.stat().st_size
            if "bytes" in s and size != int(s["bytes"]):
                yield CorruptData(str(shard), f"{size} bytes, manifest says {s['bytes']}"
                                              f"{' (truncated shard)' if size < int(s['bytes']) else ''}")
            try:
                offsets, sizes = read_index(idx)
            except CorruptData as e:
                yield e
                continue
            if len(offsets) != int(s["count"]):
                yield CorruptData(str(idx), f"{len(offsets)} entries, manifest says {s['count']} records")
            ends = offsets + sizes
            gaps = np.flatnonzero(offsets != np.concatenate(([0], ends[:-1])))
            if len(gaps):
                yield CorruptData(str(idx), "entry is not where the previous record ends",
                                  position=f"record {int(gaps[0])}")
            end = int(ends[-1]) if len(ends) else 0
            if end != size:
                yield CorruptData(str(shard), f"index covers {end} bytes, shard has {size}"
                                              f"{' (truncated shard)' if size < end else ''}")
            if s.get("sha256"):
                if sha256_file(shard).hexdigest() != s["sha256"]:
                    yield CorruptData(str(shard), "sha256 mismatch (shard changed since it was written)")
        if total != self.manifest.physical:
            yield CorruptData(str(self.path), f"shards list {total} records, manifest says {self.manifest.physical}")
        if self._foreign is None:
            try:
                _ = self.keys
            except CorruptData as e:
                yield e

    # -- handles ---------------------------------------------------------------------------------
    def _handle_attrs(self) -> tuple[str, ...]:
        return ("_maps",)

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._maps = collections.OrderedDict()

    def close(self) -> None:
        if self._pid == os.getpid():
            self._unmap_all()
        self._maps = collections.OrderedDict()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # pragma: no cover - interpreter shutdown
            pass


def _unmap(entry: tuple[mmap.mmap | None, memoryview]) -> None:
    m, view = entry
    try:
        view.release()
        if m is not None:
            m.close()
    except BufferError:  # a caller still holds a slice: the mapping goes when it does
        pass

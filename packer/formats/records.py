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
"""
from __future__ import annotations

import collections
import hashlib
import json
import logging
import mmap
import os
import re
import struct
import sys
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from packer.errors import CorruptData, FormatError, UsageError
from packer.codecs.tfexample import decode_example, encode_example, example_pieces, int64_feature
from packer.codecs.image import sniff_format
from packer.integrity import crc32c, mask_crc, masked_crc32c
from packer.manifest import MANIFEST_NAME, Manifest, atomic_write_bytes
from packer.formats.base import Reader, Record, Sample, Writer, load_keys, write_keys
from packer.formats.records_segments import SegmentShard, Stored, is_segment_file

__all__ = ["RecordsWriter", "RecordsReader", "DEFAULT_SHARD_SIZE", "parse_size", "shard_name",
           "index_path", "frame_record", "unframe_record", "scan_tfrecord", "write_index",
           "read_index", "index_tfrecords", "looks_like_tfrecord", "sample_features"]

log = logging.getLogger(__name__)

DEFAULT_SHARD_SIZE = 256 * 10**6
INDEX_SUFFIX = ".idx"
SHARDS_JOURNAL = ".shards.json"
FRAMING = 16  # u64 length + u32 length CRC + u32 payload CRC
_HEAD = struct.Struct("<QI")
_CRC = struct.Struct("<I")
_MAX_OPEN = 64  # shard files a reader keeps mapped per process
_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "t": 10**12, "tb": 10**12, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


# -- names and sizes ---------------------------------------------------------------------------
def parse_size(value: int | str) -> int:
    """``256MB`` -> 256_000_000 (``KB/MB/GB/TB`` decimal, ``KiB/MiB/GiB/TiB`` binary, plain = bytes)."""
    if isinstance(value, int) and not isinstance(value, bool):
        size = value
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(value))
        unit = m.group(2).lower() if m else None
        if m is None or unit not in _UNITS:
            raise UsageError(f"bad size {value!r} (examples: 256MB, 1GiB, 1000000)")
        size = int(float(m.group(1)) * _UNITS[unit])
    if size < 1:
        raise UsageError(f"size must be positive, not {value!r}")
    return size


def shard_name(name: str, i: int) -> str:
    """The file name of shard ``i``: ``{name}-{i:05d}.tfrecord``."""
    return f"{name}-{i:05d}.tfrecord"


def index_path(shard: str | os.PathLike) -> Path:
    """The DALI index beside a shard: ``{shard}.idx``."""
    return Path(f"{os.fspath(shard)}{INDEX_SUFFIX}")


# -- framing -----------------------------------------------------------------------------------
def frame_record(payload: bytes) -> bytes:
    """Frame one payload as a TFRecord record (length, its masked CRC, payload, payload CRC)."""
    length = struct.pack("<Q", len(payload))
    return b"".join((length, _CRC.pack(masked_crc32c(length)), payload, _CRC.pack(masked_crc32c(payload))))


def unframe_record(buf: bytes, *, check_crc: bool = True, where: str = "",
                   position: object = None) -> memoryview:
    """The payload of one whole framed record; CorruptData naming ``where``/``position`` if bad."""
    n = len(buf)
    if n < FRAMING:
        raise CorruptData(where, f"record of {n} bytes is shorter than the {FRAMING}-byte framing",
                          position=position)
    length, length_crc = _HEAD.unpack_from(buf, 0)
    mv = memoryview(buf)
    if check_crc and masked_crc32c(mv[:8]) != length_crc:
        raise CorruptData(where, "length CRC mismatch (bad framing)", position=position)
    if length + FRAMING != n:
        raise CorruptData(where, f"framing says a {length}-byte payload, the index a {n - FRAMING}-byte one",
                          position=position)
    payload = mv[12:12 + length]
    if check_crc and masked_crc32c(payload) != _CRC.unpack_from(buf, 12 + length)[0]:
        raise CorruptData(where, "CRC32C mismatch (payload)", position=position)
    return payload


def looks_like_tfrecord(path: str | os.PathLike) -> bool:
    """True when ``path`` is a file that starts with a valid TFRecord record header."""
    try:
        with open(path, "rb") as f:
            head = f.read(12)
    except OSError:
        return False
    return len(head) == 12 and masked_crc32c(head[:8]) == _HEAD.unpack(head)[1]


def scan_tfrecord(path: str | os.PathLike, limit: int | None = None) -> tuple[list[int], list[int]]:
    """Walk a TFRecord file's framing (seeking past payloads): the (offsets, sizes) of its records
    (of its first ``limit`` records when given).

    Raises CorruptData naming the file and record on a bad length CRC or a truncated record.
    """
    path = str(path)
    size = os.path.getsize(path)
    offsets: list[int] = []
    sizes: list[int] = []
    pos = 0
    with open(path, "rb") as f:
        while pos < size and (limit is None or len(offsets) < limit):
            where = f"record {len(offsets)} (byte {pos})"
            f.seek(pos)
            head = f.read(12)
            if len(head) < 12:
                raise CorruptData(path, f"truncated record header ({len(head)} of 12 bytes)", position=where)
            length, length_crc = _HEAD.unpack(head)
            if masked_crc32c(head[:8]) != length_crc:
                raise CorruptData(path, "length CRC mismatch (not a TFRecord file, or corrupt)", position=where)
            if pos + length + FRAMING > size:
                raise CorruptData(path, f"truncated record: needs {length + FRAMING} bytes, "
                                        f"{size - pos} left", position=where)
            offsets.append(pos)
            sizes.append(length + FRAMING)
            pos += length + FRAMING
    return offsets, sizes


# -- index files -------------------------------------------------------------------------------
def write_index(path: str | os.PathLike, offsets: Sequence[int], sizes: Sequence[int]) -> None:
    """Write a DALI index (``"{offset} {size}\\n"`` per record) atomically."""
    atomic_write_bytes(path, "".join(f"{o} {s}\n" for o, s in zip(offsets, sizes)).encode("ascii"))


def read_index(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, sizes) as int64 arrays from a DALI index; CorruptData if unreadable or malformed."""
    try:
        raw = Path(path).read_bytes()
    except OSError as e:
        raise CorruptData(str(path), f"cannot read index ({e.strerror or e})") from None
    lines = [ln.split() for ln in raw.splitlines() if ln.strip()]
    bad = next((k for k, ln in enumerate(lines)
                if len(ln) != 2 or not (ln[0].isdigit() and ln[1].isdigit())), None)
    if bad is not None:
        raise CorruptData(str(path), f"malformed index line {bad + 1} (expected 'offset size')")
    try:
        pairs = np.array(lines, dtype=np.int64).reshape(len(lines), 2)
    except OverflowError:
        raise CorruptData(str(path), "index value out of range") from None
    return pairs[:, 0].copy(), pairs[:, 1].copy()


def index_tfrecords(paths: Sequence[str | os.PathLike]) -> list[tuple[Path, int]]:
    """Write ``{file}.idx`` beside each TFRecord file (a folder: each TFRecord file in it).

    What DALI's ``tfrecord2idx`` does, for files written by other tools. Returns (file,
    records) per file indexed. Raises CorruptData naming the file and record on bad framing.
    """
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = [f for f in sorted(p.iterdir()) if f.is_file() and not f.name.startswith(".")
                     and not f.name.endswith(INDEX_SUFFIX) and looks_like_tfrecord(f)]
            if not found:
                raise UsageError(f"{p}: no TFRecord files in this folder")
            files.extend(found)
        elif p.is_file():
            files.append(p)
        else:
            raise UsageError(f"{p}: does not exist")
    done = []
    for f in files:
        offsets, sizes = scan_tfrecord(f)
        write_index(index_path(f), offsets, sizes)
        log.info("indexed %s: %d records", f, len(offsets))
        done.append((f, len(offsets)))
    return done


# -- sample <-> Example ------------------------------------------------------------------------
def sample_features(sample: Sample) -> dict[str, Any]:
    """The ImageNet-style features of one sample; video frames add ``video/index`` (from
    ``extra["video_index"]``) and ``frame/index`` (``extra["frame_index"]`` or ``["frame"]``)."""
    feats: dict[str, Any] = {
        "image/encoded": sample.data,
        "image/format": sample.fmt.encode("ascii"),
        "image/class/label": int(sample.label),
        "image/height": int(sample.height),
        "image/width": int(sample.width),
        "image/channels": int(sample.channels),
        "image/filename": sample.key.encode("utf-8"),
    }
    for extras, name in ((("video_index",), "video/index"), (("frame_index", "frame"), "frame/index")):
        value = next((sample.extra[e] for e in extras if e in sample.extra), None)
        if value is not None:
            feats[name] = int(value)
    return feats


_FMT_ALIASES = {"jpg": "jpeg", "tif": "tiff"}


def _record_of(feats: dict[str, list]) -> Record:
    data = feats.get("image/encoded")
    if not data or not isinstance(data[0], bytes):
        raise ValueError("no image/encoded bytes feature")
    fmt_value = feats.get("image/format")
    if fmt_value and isinstance(fmt_value[0], bytes) and fmt_value[0]:
        fmt = fmt_value[0].decode("ascii", "replace").lower()
        fmt = _FMT_ALIASES.get(fmt, fmt)
    else:
        fmt = sniff_format(data[0])
    return Record(data[0], int64_feature(feats, "image/class/label", -1), fmt,
                  int64_feature(feats, "image/height", 0), int64_feature(feats, "image/width", 0),
                  int64_feature(feats, "image/channels", 0))


# -- writer ------------------------------------------------------------------------------------
_SHARD_RE = r"^\.?{name}-(\d{{5,}})\.tfrecord(?:\.idx|\.partial)?$"


class RecordsWriter(Writer):
    """Writes TFRecord shards in input order; a durable commit is a completed shard.

    Args (besides the base Writer's):
        shard_size: bytes per shard (int or ``"256MB"``); a shard never exceeds it unless one
            record alone does.
        samples_per_shard: records per shard; when given it wins over ``shard_size``.
        name: shard name prefix (``{name}-{i:05d}.tfrecord``).
        commit_every: a durable commit here is a completed shard (what ``--resume`` keeps), so
            when given and ``samples_per_shard`` is not, it caps the records per shard.
        commit_bytes: taken for the Writer interface; ``shard_size`` plays its part.
    """

    format_name = "records"

    def __init__(self, out: str | os.PathLike, *, classes: list[str], kind: str = "images",
                 created_by: dict[str, Any] | None = None, shard_size: int | str = DEFAULT_SHARD_SIZE,
                 samples_per_shard: int | None = None, name: str = "train", commit_every: int | None = None,
                 commit_bytes: int | None = None):
        self.shard_size = parse_size(shard_size)
        if samples_per_shard is None and commit_every is not None:
            samples_per_shard = commit_every
        if samples_per_shard is not None and samples_per_shard < 1:
            raise UsageError(f"--samples-per-shard must be >= 1, not {samples_per_shard}")
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name or ""):
            raise UsageError(f"--name {name!r}: use letters, digits, '_', '-' and '.' (not first)")
        self.samples_per_shard = samples_per_shard
        self.name = name
        created_by = dict(created_by or {})
        created_by["options"] = {**created_by.get("options", {}), "shard_size": self.shard_size,
                                 "samples_per_shard": samples_per_shard, "name": name}
        # Commits happen only when a shard completes (see add), never on the base's counters.
        super().__init__(out, classes=classes, kind=kind, created_by=created_by,
                         commit_every=sys.maxsize, commit_bytes=sys.maxsize)
        self.shards: list[dict[str, Any]] = []
        self._fh = None
        self._next: tuple[bytes, int] | None = None
        self._adopting: SegmentShard | None = None

    # -- rollover: close the current shard before a record that would not fit ---------------
    @staticmethod
    def prepare(sample: Sample) -> tuple[bytes, int]:
        """The framed record and the CRC32C of its payload (the image bytes copied once)."""
        pieces, length = example_pieces(sample_features(sample))
        crc = 0
        for piece in pieces:
            crc = crc32c(piece, crc)
        head = struct.pack("<Q", length)
        record = b"".join((head, _CRC.pack(masked_crc32c(head)), *pieces, _CRC.pack(mask_crc(crc))))
        return record, crc

    def add(self, sample: Sample) -> None:
        if isinstance(sample.prepared, Stored):  # already in a worker's shard file
            self._add_stored(sample, sample.prepared)
            return
        record, crc = sample.prepared or self.prepare(sample)
        if self._fh is not None and self._full(len(record)):
            self.flush()  # completes the shard: the durable commit
        self._next = (record, crc)
        super().add(sample)

    def _add_stored(self, sample: Sample, stored: Stored) -> None:
        """A sample a worker stored (``packer.formats.records_segments``); the last one of its
        shard file adopts the file: the durable commit."""
        if self._fh is not None:  # a shard this writer has open (a resumed one): complete it first
            if self.count > self.durable:
                self.flush()
            else:
                self._commit()
        super().add(sample)  # ``_write`` stores nothing: the bytes are in the worker's file
        self._pending_bytes += stored.size
        if stored.shard is not None:
            self._adopting = stored.shard
            self.flush()

    def _adopt(self, shard: SegmentShard) -> None:
        """Make a worker's completed (fsynced) shard file the next shard."""
        final = self._shard_path(len(self.shards))
        write_index(index_path(final), shard.offsets, shard.sizes)
        os.replace(shard.path, final)
        _fsync_dir(self.workdir)
        self.shards.append({"file": final.name, "index": index_path(final).name, "count": shard.count,
                            "bytes": shard.bytes, "sha256": shard.sha256})
        atomic_write_bytes(self.workdir / SHARDS_JOURNAL,
                           json.dumps({"options": self._options(), "shards": self.shards}).encode())

    def _remove_segment_files(self) -> None:
        for p in self.workdir.iterdir():
            if is_segment_file(p.name):
                p.unlink()

    def _full(self, next_size: int) -> bool:
        if self.samples_per_shard is not None:
            return len(self._offsets) >= self.samples_per_shard
        return self._shard_bytes + next_size > self.shard_size

    # -- the seam ------------------------------------------------------------------------------
    def _shard_path(self, i: int) -> Path:
        return self.workdir / shard_name(self.name, i)

    def _tmp_path(self, i: int) -> Path:
        return self.workdir / f".{shard_name(self.name, i)}.partial"

    def _start_shard(self, offsets: list[int] | None = None, sizes: list[int] | None = None) -> None:
        i = len(self.shards)
        self._tmp = self._tmp_path(i)
        self._offsets = offsets or []
        self._sizes = sizes or []
        self._shard_bytes = sum(self._sizes)
        self._hash = hashlib.sha256()
        if self._offsets:  # a resumed shard: hash what is kept, then append
            with open(self._tmp, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    self._hash.update(block)
        self._fh = open(self._tmp, "ab" if self._offsets else "wb")

    def _open(self, resume_samples: int) -> None:
        self.shards = []
        self._fh = None
        self._offsets, self._sizes, self._shard_bytes = [], [], 0
        reopened = False
        if resume_samples:
            journal = self._load_journal()
            kept = 0
            while kept < resume_samples:
                i = len(self.shards)
                path, tmp, need = self._shard_path(i), self._tmp_path(i), resume_samples - kept
                if path.is_file() and index_path(path).is_file():
                    offsets, sizes = read_index(index_path(path))
                    if len(offsets) <= need:  # a complete shard inside the checkpoint: keep it
                        entry = journal.get(path.name)
                        if (not entry or entry.get("count") != len(offsets)
                                or entry.get("bytes") != path.stat().st_size):
                            entry = self._entry(path, len(offsets))
                        self.shards.append(entry)
                        kept += len(offsets)
                        continue
                    # the checkpoint falls inside this shard: cut it (idempotent), make it the open one
                    with open(path, "r+b") as f:
                        f.truncate(int(offsets[need]))
                    os.replace(path, tmp)
                elif tmp.is_file():  # reopened by an earlier resume, killed before it completed
                    offsets, sizes = scan_tfrecord(tmp, limit=need)
                    if len(offsets) < need:
                        raise CorruptData(str(tmp), f"holds {len(offsets)} whole records, the checkpoint "
                                                    f"needs {need}")
                    with open(tmp, "r+b") as f:
                        f.truncate(int(offsets[-1] + sizes[-1]) if need else 0)
                else:
                    raise CorruptData(str(path), f"missing: the checkpoint says {resume_samples} samples "
                                                 f"are stored, complete shards hold {kept}")
                index_path(path).unlink(missing_ok=True)
                if need:
                    self._start_shard(list(map(int, offsets[:need])), list(map(int, sizes[:need])))
                    reopened = True
                kept = resume_samples
        self._remove_shards_from(len(self.shards) + (1 if reopened else 0))
        self._remove_segment_files()  # workers' shards not adopted before the kill

    def _remove_shards_from(self, first: int) -> None:
        pattern = re.compile(_SHARD_RE.format(name=re.escape(self.name)))
        for p in self.workdir.iterdir():
            m = pattern.match(p.name)
            if m and int(m.group(1)) >= first:
                p.unlink()

    def _options(self) -> dict[str, Any]:
        return {"shard_size": self.shard_size, "samples_per_shard": self.samples_per_shard, "name": self.name}

    def _load_journal(self) -> dict[str, dict[str, Any]]:
        """Entries of the shards completed so far (their sha256 need not be recomputed)."""
        try:
            journal = json.loads((self.workdir / SHARDS_JOURNAL).read_text())
            options, entries = journal["options"], journal["shards"]
        except (OSError, ValueError, KeyError, TypeError):
            return {}
        if options != self._options():
            raise UsageError(f"{self.out}: the interrupted run used {options}; resume with the same "
                             "--shard-size/--samples-per-shard/--name (or --overwrite)")
        return {e["file"]: e for e in entries if isinstance(e, dict) and "file" in e}

    def _entry(self, path: Path, count: int) -> dict[str, Any]:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        return {"file": path.name, "index": index_path(path).name, "count": count,
                "bytes": path.stat().st_size, "sha256": h.hexdigest()}

    def _write(self, index: int, sample: Sample) -> int:
        if isinstance(sample.prepared, Stored):
            return sample.prepared.crc
        record, crc = self._next if self._next is not None else (
            frame_record(encode_example(sample_features(sample))), 0)
        self._next = None
        if self._fh is None:
            self._start_shard()
        self._fh.write(record)
        self._hash.update(record)
        self._offsets.append(self._shard_bytes)
        self._sizes.append(len(record))
        self._shard_bytes += len(record)
        return crc

    def _commit(self) -> None:
        if self._adopting is not None:
            shard, self._adopting = self._adopting, None
            self._adopt(shard)
            return
        if self._fh is None:
            return
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._fh.close()
        self._fh = None
        final = self._shard_path(len(self.shards))
        write_index(index_path(final), self._offsets, self._sizes)
        os.replace(self._tmp, final)
        _fsync_dir(self.workdir)
        self.shards.append({"file": final.name, "index": index_path(final).name, "count": len(self._offsets),
                            "bytes": self._shard_bytes, "sha256": self._hash.hexdigest()})
        atomic_write_bytes(self.workdir / SHARDS_JOURNAL,
                           json.dumps({"options": self._options(), "shards": self.shards}).encode())
        self._offsets, self._sizes, self._shard_bytes = [], [], 0

    def _finish(self, manifest: Manifest) -> None:
        self._remove_segment_files()  # a crashed worker's, or written for a retry before a resume
        manifest.shards = list(self.shards)
        write_keys(self.workdir, self.keys)
        manifest.save(self.workdir)
        self._remove(self.workdir / SHARDS_JOURNAL)

    def _close_handles(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# -- reader ------------------------------------------------------------------------------------
def _foreign_files(path: Path) -> list[Path]:
    """The TFRecord files of a folder (or the file itself) that has no ``packer.json``."""
    if path.is_file():
        files = [path]
    else:
        files = [f for f in sorted(path.iterdir()) if f.is_file() and not f.name.startswith(".")
                 and not f.name.endswith(INDEX_SUFFIX)
                 and (index_path(f).is_file() or looks_like_tfrecord(f))]
    if not files:
        raise FormatError(f"{path}: no TFRecord files with {INDEX_SUFFIX} indexes here")
    return files


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
    if total != manifest.count:
        raise CorruptData(str(source), f"shard counts add up to {total}, manifest count is {manifest.count}")
    return manifest


class RecordsReader(Reader):
    """Random access to record shards through their DALI indexes (shards mapped read-only, no scan).

    ``path`` is a packer records output, or TFRecord files written by other tools that have
    ``.idx`` indexes (``packer index``): a folder of them, one file, or a list of files. Such
    foreign records need ``image/encoded``; the label is ``image/class/label`` (-1 when absent)
    and the key ``image/filename`` (else ``{file}:{record}``).
    """

    format_name = "records"

    def __init__(self, path: str | os.PathLike | Sequence[str | os.PathLike], *, check_crc: bool = True):
        self._foreign: list[Path] | None = None
        if isinstance(path, (list, tuple)):
            if not path:
                raise FormatError("no TFRecord files given")
            self._foreign = [Path(p) for p in path]
            path = self._foreign[0].parent
        elif not (Path(path) / MANIFEST_NAME).is_file():
            self._foreign = _foreign_files(Path(path))
        self._index: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._maps: collections.OrderedDict[int, tuple[mmap.mmap | None, memoryview]] = collections.OrderedDict()
        self._keys: Sequence[str] | None = None
        self._root: Path | None = None
        super().__init__(path, check_crc=check_crc)

    @classmethod
    def detect(cls, path: Path) -> bool:
        """A folder or file of TFRecords with no manifest (foreign shards)."""
        if path.is_file():
            return looks_like_tfrecord(path)
        return path.is_dir() and any(index_path(f).is_file() or looks_like_tfrecord(f)
                                     for f in path.iterdir() if f.is_file() and not f.name.startswith(".")
                                     and not f.name.endswith(INDEX_SUFFIX))

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
            return _checked_shards(Manifest.load(self.path), self.path / MANIFEST_NAME)
        root = self.root
        shards, offsets, sizes = [], [], []
        for f in self._foreign:
            idx = index_path(f)
            if not idx.is_file():
                raise FormatError(f"{f}: no index {idx.name} (write one with `packer index {f}`)")
            o, s = read_index(idx)
            offsets.append(o)
            sizes.append(s)
            shards.append({"file": os.path.relpath(f, root), "index": os.path.relpath(idx, root),
                           "count": len(o), "bytes": f.stat().st_size})
        self._index = _join_index(offsets, sizes)
        return Manifest(format="records", count=sum(s["count"] for s in shards), shards=shards,
                        created_by={"foreign": True})

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
        """Records per shard, in shard order."""
        return [int(s["count"]) for s in self.manifest.shards]

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
            index = _join_index(offsets, sizes)
            if len(index[0]) != len(self):
                raise CorruptData(str(self.path), f"shards hold {len(index[0])} records, "
                                                  f"manifest says {len(self)}")
            self._index = index
        return self._index

    def _view(self, k: int) -> memoryview:
        """Shard ``k`` mapped read-only (opened lazily in each process, at most _MAX_OPEN at once)."""
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
                size = os.fstat(f.fileno()).st_size
                m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else None
        except OSError as e:
            raise CorruptData(str(path), f"cannot open shard ({e.strerror or e})") from None
        self._maps[k] = (m, memoryview(m) if m is not None else memoryview(b""))
        if len(self._maps) > _MAX_OPEN:
            _unmap(self._maps.popitem(last=False)[1])
        return self._maps[k][1]

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

    def _key_hint(self, index: int) -> str | None:
        """The key of sample ``index`` for an error message, when known without reading it."""
        if self._foreign is not None:
            return None
        try:
            return self.keys[index]
        except (CorruptData, IndexError):
            return None

    def _corrupt(self, index: int, k: int, reason: str, position: str) -> CorruptData:
        return CorruptData(str(self.shard_path(k)), reason, position=position, key=self._key_hint(index))

    def _read_framed(self, index: int) -> tuple[memoryview, int, int]:
        index = self._check_index(index)
        offsets, sizes, starts = self._load_index()
        k = int(np.searchsorted(starts, index, side="right")) - 1
        local = index - int(starts[k])
        offset, size = int(offsets[index]), int(sizes[index])
        where = f"record {local} (byte {offset})"
        view = self._view(k)
        if offset + size > len(view):  # checked before touching the mapping: no SIGBUS
            left = max(0, len(view) - offset)
            raise self._corrupt(index, k, f"truncated shard: record needs {size} bytes, {left} left", where)
        buf = view[offset:offset + size]
        try:
            payload = unframe_record(buf, check_crc=self.check_crc)
        except CorruptData as e:
            raise self._corrupt(index, k, e.reason, where) from None
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
            raise self._corrupt(index, k, f"malformed Example ({e})", f"record {local}") from None

    def read_features(self, index: int) -> dict[str, list]:
        """Every feature of sample ``index``'s Example."""
        return self._features(index)[0]

    def sample(self, index: int) -> Sample:
        """The stored sample as a writer takes it, with ``video_index``/``frame_index`` extras."""
        feats, k, local = self._features(index)
        try:
            rec = _record_of(feats)
        except ValueError as e:
            raise self._corrupt(self._check_index(index), k, str(e), f"record {local}") from None
        names = (("video/index", "video_index"), ("frame/index", "frame_index"))
        extra = {key: feats[name][0] for name, key in names if feats.get(name) and isinstance(feats[name][0], int)}
        return Sample(self.keys[self._check_index(index)], rec.data, rec.fmt, rec.label, rec.height, rec.width,
                      rec.channels, extra)

    def read(self, index: int) -> Record:
        feats, k, local = self._features(index)
        try:
            return _record_of(feats)
        except ValueError as e:
            raise self._corrupt(self._check_index(index), k, str(e), f"record {local}") from None

    @property
    def keys(self) -> Sequence[str]:
        if self._keys is None:
            if self._foreign is not None:
                self._keys = _ForeignKeys(self)
            else:
                self._keys = load_keys(self.path, len(self))
        return self._keys

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
                digest = hashlib.sha256()
                with open(shard, "rb") as f:
                    for block in iter(lambda: f.read(1 << 20), b""):
                        digest.update(block)
                if digest.hexdigest() != s["sha256"]:
                    yield CorruptData(str(shard), "sha256 mismatch (shard changed since it was written)")
        if total != len(self):
            yield CorruptData(str(self.path), f"shards list {total} records, manifest says {len(self)}")
        if self._foreign is None:
            try:
                _ = self.keys
            except CorruptData as e:
                yield e

    # -- handles ---------------------------------------------------------------------------------
    def _handle_attrs(self) -> tuple[str, ...]:
        return ("_maps",)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
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


def _join_index(offsets: list[np.ndarray], sizes: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    counts = [len(o) for o in offsets]
    starts = np.concatenate(([0], np.cumsum(counts)[:-1])).astype(np.int64) if counts else np.zeros(0, np.int64)
    cat = (lambda xs: np.concatenate(xs) if xs else np.zeros(0, np.int64))
    return cat(offsets), cat(sizes), starts


class _ForeignKeys(Sequence[str]):
    """Keys of foreign records, read on demand: ``image/filename``, else ``{file}:{record}``."""

    def __init__(self, reader: RecordsReader):
        self._reader = reader

    def __len__(self) -> int:
        return len(self._reader)

    def __getitem__(self, index):  # type: ignore[override]
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        name = self._reader.read_features(index).get("image/filename")
        if name and isinstance(name[0], bytes):
            return name[0].decode("utf-8", "replace")
        k, local = self._reader.locate(index)
        return f"{self._reader.manifest.shards[k]['file']}:{local}"

"""records format, writing: TFRecord shards in input order; a durable commit is a completed shard."""
from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import struct
import sys
from pathlib import Path
from typing import Any, Sequence

from packer.codecs.fields import BLOB_FMT
from packer.codecs.tfexample import encode_example, example_pieces
from packer.codecs.tfrecord import CRC_STRUCT, frame_record, index_path, read_index, scan_tfrecord, write_index
from packer.errors import CorruptData, UsageError
from packer.formats.records.example import field_features, sample_features, sample_pieces
from packer.fileio import fsync_path, parse_bytes, place
from packer.formats.records.layout import (DEFAULT_SHARD_SIZE, SHARD_RE, SHARDS_JOURNAL, sha256_file,
                                           shard_name)
from packer.formats.segments import SegmentShard, remove_segment_files
from packer.formats.reader import Reader
from packer.formats.sample import Sample, Stored
from packer.formats.sidecars import write_keys
from packer.formats.writer import Segments, Writer
from packer.integrity import crc32c, mask_crc, masked_crc32c
from packer.manifest import Manifest, atomic_write_bytes
from packer.writeback import WRITE_BUFFER, Writeback

__all__ = ["RecordsWriter"]


def field_record(schema: Any, sample: Sample) -> tuple[bytearray, int]:
    """The framed record of a field sample (one feature per field of ``schema``) and the CRC32C
    of its payload; any other sample as ``RecordsWriter.prepare`` frames it."""
    if sample.fmt != BLOB_FMT:
        return RecordsWriter.prepare(sample)
    return frame_pieces(*example_pieces(field_features(schema, sample)))


def frame_pieces(pieces: list, length: int) -> tuple[bytearray, int]:
    """The framed record of an Example's ``pieces`` (``length`` bytes, copied once) and the
    CRC32C of its payload."""
    head = struct.pack("<Q", length)
    record = bytearray().join((head, CRC_STRUCT.pack(masked_crc32c(head)), *pieces, b"\0\0\0\0"))
    crc = crc32c(memoryview(record)[12:12 + length])
    CRC_STRUCT.pack_into(record, 12 + length, mask_crc(crc))
    return record, crc


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
        self.shard_size = parse_bytes(shard_size)
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
        self._writeback = Writeback()  # starts the disk on a shard as it grows (the fsync stays)

    # -- rollover: close the current shard before a record that would not fit ---------------
    @classmethod
    def merge_options(cls, parts: Sequence[Reader]) -> dict[str, Any]:
        """A merge keeps the parts' shard layout (``shard_size``, ``samples_per_shard``, ``name``:
        what they recorded; a video run's shards follow its commit size), so the merged output
        records the layout an ``--append`` to it compares."""
        options = parts[0].manifest.created_by.get("options") or {}
        return {k: options[k] for k in ("shard_size", "samples_per_shard", "name") if options.get(k) is not None}

    @staticmethod
    def prepare(sample: Sample) -> tuple[bytes, int]:
        """The framed record and the CRC32C of its payload (the image bytes copied once)."""
        if sample.fmt == BLOB_FMT:
            raise ValueError(f"{sample.key}: a field sample is framed by a writer with its schema")
        return frame_pieces(*sample_pieces(sample))

    def _prepare_fields(self, sample: Sample) -> tuple[bytes, int]:
        """``prepare`` of a field sample: one feature per field of the writer's schema."""
        if self.schema is None:
            raise ValueError(f"{sample.key}: a field sample needs a writer with a schema")
        return field_record(self.schema, sample)

    # the workers' part files are shards as they are: hashed, indexed, adopted by renaming
    segments = Segments(record=prepare.__func__, indexed=True)

    def segment_record(self) -> Any:
        """A field pack's workers frame each sample with the schema (``field_record``)."""
        return functools.partial(field_record, self.schema) if self.schema is not None else self.segments.record

    def add(self, sample: Sample) -> None:
        if isinstance(sample.prepared, Stored):  # already in a worker's shard file
            self._add_stored(sample, sample.prepared)
            return
        record, crc = self.prepare(sample) if sample.fmt != BLOB_FMT else self._prepare_fields(sample)
        if self._fh is not None and self._full(len(record)):
            self.flush()  # completes the shard: the durable commit
        self._next = (record, crc)
        super().add(sample)

    def _add_stored(self, sample: Sample, stored: Stored) -> None:
        """A sample a worker stored (``packer.formats.segments``); the last one of its
        shard file adopts the file: the durable commit."""
        self._complete_open()
        super().add(sample)  # ``_write`` stores nothing: the bytes are in the worker's file
        self._pending_bytes += stored.size
        if stored.shard is not None:
            self._adopt_part(stored.shard)

    def _adopt_part(self, part: SegmentShard) -> None:
        self._adopting = part  # (``_commit`` adopts it)
        self.flush()

    def _complete_open(self) -> None:
        if self._fh is not None:
            if self.count > self.durable:
                self.flush()
            else:
                self._commit()

    def _adopt(self, shard: SegmentShard) -> None:
        """Make a worker's completed shard file and its index (both fsynced) the next shard."""
        final = self._shard_path(len(self.shards))
        os.replace(shard.index, index_path(final))  # the index first: a shard file is never without it
        os.replace(shard.path, final)
        fsync_path(self.workdir)
        self.shards.append({"file": final.name, "index": index_path(final).name, "count": shard.count,
                            "bytes": shard.bytes, "sha256": shard.sha256})
        atomic_write_bytes(self.workdir / SHARDS_JOURNAL,
                           json.dumps({"options": self._options(), "shards": self.shards}).encode())

    def _full(self, next_size: int) -> bool:
        if self.samples_per_shard is not None:
            return len(self._offsets) >= self.samples_per_shard
        return self._shard_bytes + next_size > self.shard_size

    # -- the seam ------------------------------------------------------------------------------
    # (``i``: the shard's number among this writer's; appending, the output's shards come first)
    def _shard_path(self, i: int) -> Path:
        return self.workdir / shard_name(self.name, self._first_shard + i)

    def _tmp_path(self, i: int) -> Path:
        return self.workdir / f".{shard_name(self.name, self._first_shard + i)}.partial"

    def _start_shard(self, offsets: list[int] | None = None, sizes: list[int] | None = None) -> None:
        i = len(self.shards)
        self._tmp = self._tmp_path(i)
        self._offsets = offsets or []
        self._sizes = sizes or []
        self._shard_bytes = sum(self._sizes)
        self._hash = hashlib.sha256()
        if self._offsets:  # a resumed shard: hash what is kept, then append
            sha256_file(self._tmp, self._hash)
        self._fh = open(self._tmp, "ab" if self._offsets else "wb", buffering=WRITE_BUFFER)
        self._writeback.reset(self._shard_bytes)

    def _open(self, resume_samples: int) -> None:
        self.shards = []
        self._first_shard = 0 if self.append_to is None else len(self.append_to.manifest.shards)
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
        remove_segment_files(self.workdir)  # workers' shards not adopted before the kill

    def _remove_shards_from(self, first: int) -> None:
        pattern = re.compile(SHARD_RE.format(name=re.escape(self.name)))
        for p in self.workdir.iterdir():
            m = pattern.match(p.name)
            if m and int(m.group(1)) >= self._first_shard + first:
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
        return {"file": path.name, "index": index_path(path).name, "count": count,
                "bytes": path.stat().st_size, "sha256": sha256_file(path).hexdigest()}

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
        self._writeback.wrote(self._fh, self._shard_bytes)
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
        fsync_path(self.workdir)
        self.shards.append({"file": final.name, "index": index_path(final).name, "count": len(self._offsets),
                            "bytes": self._shard_bytes, "sha256": self._hash.hexdigest()})
        atomic_write_bytes(self.workdir / SHARDS_JOURNAL,
                           json.dumps({"options": self._options(), "shards": self.shards}).encode())
        self._offsets, self._sizes, self._shard_bytes = [], [], 0

    def _finish(self, manifest: Manifest) -> None:
        remove_segment_files(self.workdir)  # a crashed worker's, or written for a retry before a resume
        manifest.shards = list(self.shards)
        write_keys(self.workdir, self.keys)
        manifest.save(self.workdir)
        self._remove(self.workdir / SHARDS_JOURNAL)

    def _added(self, first: int) -> dict[str, Any]:
        return {"shards": [s["file"] for s in self.shards]} if self.shards else {}

    def _finish_appended(self, version: Manifest, added: Manifest, keys: list[str]) -> None:
        """Each new shard (and its index first) goes into the output under its own name, linked
        so that the partial keeps it until the version is published; then ``keys.json``."""
        remove_segment_files(self.workdir)
        for shard in self.shards:
            for name in (shard["index"], shard["file"]):
                place(self.workdir / name, self.out / name)
        fsync_path(self.out)
        version.shards = [*self.append_to.manifest.shards, *self.shards]
        write_keys(self.out, keys)

    def _close_handles(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

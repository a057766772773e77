"""The base ``Writer`` every packed format implements.

It owns the boring parts: the ``{out}.partial`` working path and the atomic rename on close,
the key and CRC32C journals that make ``--resume`` exact, durable-point callbacks, the
manifest and ``failures.jsonl``. A format only says how samples become bytes (``_open``,
``_write``, ``_commit``, ``_finish``, ``_close_handles``), and which writer options a merge
takes from the parts (``merge_options``).
"""
from __future__ import annotations

import abc
import dataclasses
import json
import logging
import os
import shutil
import struct
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Sequence

from packer.errors import CorruptData, UsageError, WriteError
from packer.fileio import remove_path
from packer.formats.reader import Reader
from packer.formats.sample import Sample
from packer.formats.sidecars import (CRC_JOURNAL, KEYS_JOURNAL, SOURCE_COLUMNS, array_checksum, fsync_append,
                                     keys_checksum, partial_path, write_failures, write_sources)
from packer.formats.versions import AppendBase, keep_base, next_version, save_versions, video_index
from packer.manifest import FAILURES_NAME, VERSIONS_DIR, Manifest

if TYPE_CHECKING:
    from packer.formats.segments import StoredSamples

__all__ = ["Writer", "Segments"]

log = logging.getLogger(__name__)

_json_str = json.encoder.encode_basestring_ascii  # json.dumps(str), without its dispatch


@dataclasses.dataclass(frozen=True)
class Segments:
    """How worker processes store a format's samples themselves (``packer.conversion.plans.sharded``):
    each worker appends ``record(sample)`` (the bytes to store and the CRC32C the format records)
    for a run of consecutive inputs to part files of its own in the writer's ``segment_dir``;
    the writer's process then takes the parts over in input order. ``indexed``: each part file
    is hashed (sha256) and gets a DALI index beside it, because it becomes a records shard as it
    is (an HDF5 writer copies its parts into the one file instead). ``inputs``: the fewest and
    the most inputs of one segment; ``per_worker``: how many segments a run makes per worker
    within those bounds. A records segment ends a shard, which costs a commit of several fsyncs:
    few and large (2 per worker). A part the writer copies costs no fsync, and the smaller the
    parts, the sooner the writer copies each one beside the workers' next ones instead of all
    of the last ones after them (8 per worker: ``python -m scripts.bench.write full``)."""

    record: Callable[[Sample], tuple[Any, int]]
    indexed: bool
    inputs: tuple[int, int] = (256, 8192)
    per_worker: int = 2


def _no_check() -> None:
    """The publish re-check of an unclaimed writer: nothing to check."""


class Writer(abc.ABC):
    """Base writer: a context manager; ``add(sample)`` in packed order, ``close() -> Manifest``.

    Publishing is ``close()``'s rename of ``{out}.partial`` to ``out``, and only there (an
    append publishes a new version of ``out`` instead: see ``append_to``). A run
    that holds a claim on ``out`` sets ``guard`` before ``open`` (``packer.claim.PartialGuard``;
    a format knows it only by its three methods): ``open`` has it ``adopt()`` an existing
    partial before touching it and ``stamp()`` the run token into it, and ``close`` calls
    ``before_publish()`` and the re-check it returns right before the rename. A writer that
    publishes by another path (per-worker shard writers included) must do the same.

    Args:
        out: the output path (a directory, or a file for single-file formats).
        classes: class names, index = label.
        kind: ``"images"`` or ``"videos"``.
        created_by: the manifest's ``created_by`` block.
        commit_every: samples per durable commit (the resume granularity).
        commit_bytes: bytes per durable commit, whichever comes first.
    """

    format_name: ClassVar[str] = ""
    # The output is one file (HDF5), not a folder: where the partial and journals go (a layout
    # fact, not a speed hook).
    single_file: ClassVar[bool] = False
    # The guard of the partial output under the run's claim (see the class docstring), or None.
    guard: Any = None
    # The published version of ``out`` this writer appends to (``packer.formats.versions``), set
    # before ``open``; None: a new output. Appending, ``{out}.partial`` holds the run's journals
    # (and what the format writes apart: record shards, an HDF5 part file) and the publish is
    # the next version's manifest (``_close_appended``).
    append_to: AppendBase | None = None
    # Whether ``add`` may keep a reference to ``sample.data`` / ``sample.prepared`` after it
    # returns (a batch held until the commit). A writer that copies them during ``add`` says
    # False and may be handed views into shared memory (``packer.conversion.plans.shm``).
    # Pays: to-lmdb --workers 2 on shared memory vs verdict workers, writer CPU 68 vs 114
    # us/sample (1.66x), all CPU 1.16x (`python -m scripts.bench.write hooks`, 2,000 JPEGs, load 10-14).
    keeps_samples: ClassVar[bool] = True
    # Set by a format whose samples worker processes may store into part files (see ``Segments``).
    # Pays: the writer's CPU 3.93x less for to-records (28 vs 108 us/sample; 0.83x all CPU), 1.33x
    # for to-hdf5 --check full --workers 2 (112 vs 155; 0.99x all) (`python -m scripts.bench.write hooks`).
    segments: ClassVar[Segments | None] = None

    def __init__(self, out: str | os.PathLike, *, classes: list[str], kind: str = "images",
                 created_by: dict[str, Any] | None = None, commit_every: int = 1000,
                 commit_bytes: int = 64 << 20):
        if commit_every < 1 or commit_bytes < 1:
            raise ValueError("commit_every and commit_bytes must be positive")
        if kind not in ("images", "videos"):
            raise ValueError(f"kind must be 'images' or 'videos', not {kind!r}")
        self.out = Path(out)
        self.workdir = partial_path(self.out)
        self.classes = list(classes)
        self.kind = kind
        self.created_by = created_by or {}
        self.commit_every = commit_every
        self.commit_bytes = commit_bytes
        self.count = 0  # samples added
        self.durable = 0  # samples safely on disk
        self.keys: list[str] = []
        self.crcs: list[int] = []
        self.bytes_written = 0
        self._pending_bytes = 0
        self.on_durable: Callable[[int], None] | None = None
        self.fingerprint: dict[str, Any] = {}  # set by the runner; kept in the manifest
        # a field pack's ``packer.codecs.fields.Schema`` (its samples' data are field blobs);
        # set by the command, kept in the manifest
        self.schema: Any = None
        self.manifest_extra: dict[str, Any] = {}  # the manifest's ``extra`` (a COCO pack's categories)
        # per sample, the source file's size and mtime (ns) as read and the label (``sources.bin``:
        # what ``--append`` compares inputs with); set by the runner before ``close``, or None
        self.sources: Any = None
        self._opened = False

    def segment_record(self) -> Callable[[Sample], tuple[Any, int]]:
        """The ``Segments.record`` workers store this writer's samples with (picklable: it goes
        to each worker). A format whose field samples need the writer's schema to be framed
        (records: one feature per field) binds it here."""
        if type(self).segments is None:
            raise ValueError(f"{self.format_name}: its workers cannot store samples themselves")
        return type(self).segments.record

    @staticmethod
    def prepare(sample: Sample) -> Any:
        """What ``_write`` computes from ``sample`` alone (its stored value and CRC32C), done
        ahead in shared-memory workers (``keeps_samples`` False), so the writer only appends;
        None where there is nothing worth doing ahead. The result goes into ``sample.prepared``."""
        # Pays: to-lmdb --workers 2, writer CPU 62 vs 75 us/sample without it (1.28x), all
        # CPU 1.07x (`python -m scripts.bench.write hooks`).
        return None

    # -- lifecycle ---------------------------------------------------------------------
    def open(self, resume_samples: int | None = None) -> None:
        """Start fresh (``None``) or continue a partial output keeping its first ``resume_samples``."""
        if self.guard is not None:
            self.guard.adopt()  # a partial another live run writes is never touched
        try:
            if not resume_samples:  # nothing durable yet: a clean start is the exact resume
                self._remove(self.workdir)
                if self.single_file:
                    self._remove(self.journal_dir)
                if not self.single_file:
                    self.workdir.mkdir(parents=True)
                else:
                    self.workdir.parent.mkdir(parents=True, exist_ok=True)
                self.journal_dir.mkdir(parents=True, exist_ok=True)
                self._open(0)
            else:
                for stale in self.journal_dir.glob(".*.tmp-*"):  # a write cut short by a kill
                    stale.unlink()
                self.keys = self._read_keys_journal(resume_samples)
                self.crcs = self._read_crc_journal(resume_samples)
                self._open(resume_samples)
                self.count = self.durable = resume_samples
        except OSError as e:
            raise WriteError(f"{self.workdir}: cannot open output ({e.strerror or e})") from e
        if self.guard is not None:
            self.guard.stamp()
        self._opened = True

    def __enter__(self) -> "Writer":
        if not self._opened:
            self.open()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()

    def add(self, sample: Sample) -> None:
        """Append one sample at position ``self.count``; commits when a batch is full."""
        try:
            crc = self._write(self.count, sample)
        except OSError as e:  # formats that write as they go (frame files) hit a full disk here
            raise WriteError(f"{self.workdir}: write failed ({e.strerror or e})") from e
        self.keys.append(sample.key)
        self.crcs.append(crc)
        self.count = count = self.count + 1
        self._pending_bytes = pending = self._pending_bytes + len(sample.data)
        if count - self.durable >= self.commit_every or pending >= self.commit_bytes:
            self.flush()

    def add_stored(self, samples: StoredSamples) -> None:
        """Append samples worker processes already stored (``packer.formats.segments``), in order,
        as ``add`` would one by one. Where the part files are the output's own files
        (``segments.indexed``: records' shards) only their keys and CRC32Cs are taken, at once, and
        each part file is adopted at its last sample (``_adopt_part``: a durable commit); else (an
        HDF5 writer copies each sample in from its part) each sample goes to ``add``."""
        layout = type(self).segments
        if layout is None or not layout.indexed:
            for sample in samples.samples():
                self.add(sample)
            return
        self._complete_open()
        keys, crcs, start = samples.keys(), samples.crcs(), 0
        for end, part in [*samples.ends, (len(samples), None)]:
            if end > start:
                self.keys += keys[start:end]
                self.crcs += crcs[start:end]
                self.count += end - start
                self._pending_bytes += samples.size(start, end)
                start = end
            if part is not None:
                self._adopt_part(samples.parts[part])

    def _complete_open(self) -> None:
        """Before samples workers stored are added: what the writer has open of its own (a
        resumed shard) completed. A format with indexed ``segments`` says how."""

    def _adopt_part(self, part: Any) -> None:
        """Make a worker's completed part file (a ``SegmentShard``) the output's next file: the
        durable commit (a format with indexed ``segments``)."""
        raise NotImplementedError(f"{self.format_name}: its part files are not its output's files")

    def flush(self) -> None:
        """Make every added sample durable, then journal keys/CRCs and report the durable count."""
        if self.count == self.durable:
            return
        try:
            self._commit()
            new_keys = self.keys[self.durable:self.count]
            new_crcs = self.crcs[self.durable:self.count]
            jd = self.journal_dir
            fsync_append(jd / KEYS_JOURNAL, ("\n".join(map(_json_str, new_keys)) + "\n").encode())
            fsync_append(jd / CRC_JOURNAL, struct.pack(f"<{len(new_crcs)}I", *new_crcs))
        except OSError as e:
            raise WriteError(f"{self.workdir}: write failed ({e.strerror or e})") from e
        self.bytes_written += self._pending_bytes
        self._pending_bytes = 0
        self.durable = self.count
        if self.on_durable is not None:
            self.on_durable(self.durable)  # the converter's checkpoint; raises WriteError itself

    def close(self, *, failures: list[dict[str, Any]] | None = None,
              videos: list[dict[str, Any]] | None = None, overwrite: bool = False,
              counted: int | None = None) -> Manifest:
        """Finish the output: manifest, failures file, then the atomic rename to ``out``.

        ``counted``: the manifest's failure count (default: every record but partial decodes).
        """
        failures = failures or []
        self.flush()
        if counted is None:
            counted = sum(1 for f in failures if f.get("stage") != "partial")
        manifest = Manifest(format=self.format_name, kind=self.kind, count=self.count,
                            classes=self.classes, created_by=self.created_by,
                            failures=counted,
                            videos=list(videos or []), fingerprint=self.fingerprint,
                            extra=dict(self.manifest_extra),
                            integrity={"keys": keys_checksum(self.keys)},  # a format may add more in _finish
                            **({"schema": self.schema.to_json(),
                                "fields": self.schema.names + ["key"]} if self.schema is not None else {}))
        sources = self._sources_rows()
        if sources is not None:
            manifest.integrity["sources"] = array_checksum(sources, "<i8")
        if self.append_to is not None:
            return self._close_appended(manifest, failures)
        try:
            if sources is not None and not self.single_file:
                write_sources(self.workdir, sources)
            self._finish(manifest)
            self._close_handles()
            write_failures(self.failures_path(self.workdir), failures)
            self._remove(self.journal_dir / KEYS_JOURNAL)
            self._remove(self.journal_dir / CRC_JOURNAL)
            self._remove(self.resume_state_path())  # a finished output holds no resume marker
            recheck = self.guard.before_publish() if self.guard is not None else _no_check
            self._remove_journal_dir()
            if self.out.exists() or self.out.is_symlink():
                if not overwrite:
                    raise UsageError(f"{self.out}: exists (use --overwrite or --resume)")
                self._remove(self.out)
                self._remove(self.failures_path(self.out))
                for extra in self.belonging(self.out):  # an appended output's files beside it
                    self._remove(extra)
            if self.single_file:
                os.replace(self.failures_path(self.workdir), self.failures_path(self.out))
            recheck()
            os.replace(self.workdir, self.out)
        except OSError as e:
            raise WriteError(f"{self.out}: cannot finish output ({e.strerror or e})") from e
        self._opened = False
        log.info("wrote %s: %d samples, %d failures", self.out, self.count, len(failures))
        return manifest

    def _sources_rows(self) -> Any:
        """``sources`` as an int64 array of one row per sample, or None (not given, or not one
        row per sample: a video's frames)."""
        if self.sources is None:
            return None
        import numpy as np

        rows = np.asarray(self.sources, dtype=np.int64)
        return rows if rows.shape == (self.count, SOURCE_COLUMNS) else None

    # -- appending (``append_to``) -----------------------------------------------------------
    def _close_appended(self, added: Manifest, failures: list[dict[str, Any]]) -> Manifest:
        """Publish the next version of ``out``: the format makes the new samples part of the
        output (``_finish_appended``: idempotent, nothing a reader of a published version reads
        changes), then the version's manifest is published atomically (``_publish_version``)
        and the working files go. A kill anywhere before that leaves the published version as
        it was, and the journals to resume from."""
        import numpy as np

        base = self.append_to
        keys = base.stored_keys() + self.keys
        ours = self._sources_rows()
        old = base.reader.sources()
        sources = None
        if ours is not None or old is not None:
            if old is None:  # packed before inputs were recorded: unknown for the old positions
                old = np.full((base.stored, SOURCE_COLUMNS), -1, dtype=np.int64)
            if ours is None:
                ours = np.full((self.count, SOURCE_COLUMNS), -1, dtype=np.int64)
            sources = np.concatenate([old, ours])
        version = next_version(base, added, keys=keys, sources=sources, extra_added=self._added(base.stored))
        try:
            self._sweep()
            if not self.single_file:
                keep_base(self.out, base)  # first: the sidecars are about to grow
            self._finish_appended(version, added, keys)
            self._close_handles()
            if sources is not None and not self.single_file:
                write_sources(self.out, sources)
            write_failures(self.failures_path(self.out), failures)
            recheck = self.guard.before_publish() if self.guard is not None else _no_check
            recheck()
            self._publish_version(version)
            self._remove(self.workdir)
            self._remove_journal_dir()
        except OSError as e:
            raise WriteError(f"{self.out}: cannot publish version {version.version} ({e.strerror or e})") from e
        self._opened = False
        log.info("appended to %s: version %d, %d samples added, %d in all", self.out, version.version,
                 self.count, version.count)
        return version

    def _sweep(self) -> None:
        """Remove the temporaries a publish killed half way left in the output (this run holds
        its claim: no other run writes there): ``.{name}.tmp-*``, ``.place-*``, ``.head-*``."""
        if self.single_file:
            places = [(self.out.parent, f".{self.out.name}"), (self.out.with_name(self.out.name + ".parts"), ".")]
        else:
            places = [(self.out, "."), (self.out / VERSIONS_DIR, ".")]
        for folder, prefix in places:
            if folder.is_dir():
                for p in folder.iterdir():
                    if p.name.startswith(prefix) and any(t in p.name for t in (".tmp-", ".place-", ".head-")):
                        p.unlink(missing_ok=True)

    def _added(self, first: int) -> dict[str, Any]:
        """What a format says of the samples an append added after stored position ``first``
        (the manifest's ``added``: LMDB key range, record shards, HDF5 part file)."""
        return {}

    def _finish_appended(self, version: Manifest, added: Manifest, keys: list[str]) -> None:
        """Appending: make the new samples part of ``out`` (without changing anything a reader of
        a published version reads), fill in ``version``'s format fields. ``added``: the new
        samples' own manifest; ``keys``: every stored position's. Must be idempotent (a resumed
        append does it again). The formats that can be appended to implement it."""
        raise UsageError(f"{self.out}: the {self.format_name} format cannot be appended to")

    def _publish_version(self, version: Manifest) -> None:
        """Appending: publish ``version`` atomically (a folder output: ``packer.json``)."""
        save_versions(self.out, self.append_to, version)

    def abort(self) -> None:
        """Release handles, keeping the partial output for ``--resume``."""
        try:
            self._close_handles()
        except Exception:  # pragma: no cover - best effort on an error path
            log.debug("closing %s after an error failed", self.workdir, exc_info=True)
        self._opened = False

    # -- merging parts (``packer merge``) ----------------------------------------------
    @classmethod
    def merge_parts(cls, parts: Sequence["Reader"], out: str | os.PathLike, *,
                    created_by: dict[str, Any], failures: list[dict[str, Any]],
                    videos: list[dict[str, Any]], overwrite: bool = False,
                    progress: Callable[[int], None] | None = None,
                    guard: Callable[["Writer"], Any] | None = None, **writer_options: Any) -> Manifest:
        """Combine complete outputs of this format, in order, into one output at ``out``.

        ``packer.commands.merge`` has already checked the parts and combined ``failures`` and ``videos``
        (starts offset by the preceding parts' counts). This default re-packs every sample
        through a new writer, so it works for any format (the data is read CRC-checked on the
        way), with the layout options ``merge_options`` takes from the parts; a format may
        override it and call this one (no format merges without rewriting the data yet).
        ``progress(n)`` is called as samples are written; ``guard(writer)`` builds the new
        writer's ``guard`` (the run's claim on ``out``).
        """
        first = parts[0]
        writer = cls(out, classes=first.classes, kind=first.manifest.kind, created_by=created_by,
                     **{**writer_options, **cls.merge_options(parts)})
        if guard is not None:
            writer.guard = guard(writer)
        writer.schema = getattr(first, "schema", None)  # field packs merge into a field pack
        if writer.schema is not None:
            writer.manifest_extra = dict(first.manifest.extra)
        tables = [reader.sources() for reader in parts]  # the inputs' table goes along (--append uses it)
        if all(t is not None for t in tables):
            import numpy as np

            chosen = [t[reader.positions()] for t, reader in zip(tables, parts)]
            writer.sources = np.concatenate(chosen) if chosen else None
        videos_before = 0
        with writer:
            for reader in parts:
                # a sample's video_index: its entry's position in the merged videos (a part's own
                # index may differ from its entry's position: ``packer.formats.versions.video_index``)
                entry_of = {video_index(reader.manifest.videos, p): p for p in range(len(reader.manifest.videos))}
                for i in range(len(reader)):
                    sample = reader.sample(i)
                    if "video_index" in sample.extra:
                        sample.extra["video_index"] = videos_before + entry_of[sample.extra["video_index"]]
                    writer.add(sample)
                    if progress is not None:
                        progress(1)
                videos_before += len(reader.manifest.videos)
            return writer.close(failures=failures, videos=videos, overwrite=overwrite)

    @classmethod
    def merge_options(cls, parts: Sequence["Reader"]) -> dict[str, Any]:
        """Writer options a merge of ``parts`` must keep (their layout: frame file names, raw
        pixel shape); read from the parts, not given by the caller. None by default."""
        return {}

    # -- paths ---------------------------------------------------------------------------
    @property
    def segment_dir(self) -> Path:
        """Where workers write part files (``Segments``): the working folder, or for a
        single-file format the journal folder beside it (gone with it at the publish)."""
        return self.journal_dir if self.single_file else self.workdir

    @property
    def journal_dir(self) -> Path:
        """Where journals and the resume checkpoint live (inside the partial dir, or beside the file)."""
        if self.single_file:
            return self.workdir.with_name(self.workdir.name + ".journal")
        return self.workdir

    def _remove_journal_dir(self) -> None:
        if self.single_file:
            shutil.rmtree(self.journal_dir, ignore_errors=True)

    def resume_state_path(self) -> Path:
        """The checkpoint file the converter writes after each durable commit."""
        return self.journal_dir / ".resume.json"

    @classmethod
    def belonging(cls, out: Path) -> list[Path]:
        """Files or folders beside the output ``out`` that are part of it (an appended HDF5
        output's ``.parts``): an ``--overwrite`` removes them with it. None by default."""
        return []

    @classmethod
    def failures_path(cls, out: Path) -> Path:
        """``failures.jsonl`` inside a directory output, ``{out}.failures.jsonl`` beside a file."""
        if cls.single_file:
            return out.with_name(out.name + ".failures.jsonl")
        return out / FAILURES_NAME

    _remove = staticmethod(remove_path)

    def _read_keys_journal(self, n: int) -> list[str]:
        p = self.journal_dir / KEYS_JOURNAL
        keys = []
        with open(p, "rb") as f:
            for _ in range(n):
                line = f.readline()
                if not line.endswith(b"\n"):
                    raise CorruptData(str(p), f"journal holds fewer than {n} keys")
                keys.append(json.loads(line))
        with open(p, "r+b") as f:
            f.truncate(sum(len(json.dumps(k)) + 1 for k in keys))
        return keys

    def _read_crc_journal(self, n: int) -> list[int]:
        p = self.journal_dir / CRC_JOURNAL
        raw = p.read_bytes()
        if len(raw) < 4 * n:
            raise CorruptData(str(p), f"journal holds fewer than {n} checksums")
        with open(p, "r+b") as f:
            f.truncate(4 * n)
        return [int.from_bytes(raw[i:i + 4], "little") for i in range(0, 4 * n, 4)]

    # -- what a format implements ------------------------------------------------------
    @abc.abstractmethod
    def _open(self, resume_samples: int) -> None:
        """Create (0) or reopen the data files, dropping anything stored past ``resume_samples``."""

    @abc.abstractmethod
    def _write(self, index: int, sample: Sample) -> int:
        """Store one sample (possibly buffered); return the CRC32C of what is stored."""

    @abc.abstractmethod
    def _commit(self) -> None:
        """Make everything written so far durable."""

    @abc.abstractmethod
    def _finish(self, manifest: Manifest) -> None:
        """Write the format's index/sidecar files and the manifest into ``workdir``."""

    @abc.abstractmethod
    def _close_handles(self) -> None:
        """Close open files/environments (idempotent)."""

"""The base ``Reader`` every packed format implements.

Random access to stored samples by position. Handles open lazily in each process (they never
cross ``fork`` or pickling). The base owns what every format checks the same way: the keys
(``keys.json`` unless a format stores them itself), the ``checksums.bin`` sidecar, the CRC32C
check of a stored value, and ``verify`` (structure, then every value).
"""
from __future__ import annotations

import abc
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Iterator, Sequence

from packer.codecs.fields import Schema
from packer.errors import CorruptData, FormatError, OutputChanged, PackerError
from packer.formats.sample import Record, Sample
from packer.formats.sidecars import (CHECKSUMS_FILE, KEYS_FILE, SOURCES_FILE, array_checksum, keys_checksum,
                                     load_checksums, load_sources, read_keys)
from packer.integrity import crc32c
from packer.heap import tune_heap
from packer.manifest import MANIFEST_NAME, VERSIONS_DIR, Manifest

if TYPE_CHECKING:
    import numpy as np

__all__ = ["Reader", "output_identity"]


def output_identity(path: str | os.PathLike) -> tuple[int, int, int] | None:
    """Which output is at ``path`` now: (device, inode, ctime). A published output is never
    modified in place, so a replaced one (even on a reused inode) compares different."""
    try:
        st = os.stat(path)
    except (OSError, TypeError, ValueError):
        return None
    return (st.st_dev, st.st_ino, st.st_ctime_ns)


class Reader(abc.ABC):
    """Random access to a packed output. Handles open lazily per process; picklable.

    An output that was appended to (docs/append.md) has versions; a reader reads one of them,
    the latest by default, and keeps reading exactly that version's samples while later ones
    are published: storage only grows, and a sample's *stored position* never changes. A
    version's samples are a selection of stored positions (``Manifest.ranges``): position
    ``i`` of the reader is stored position ``_check_index(i)``.

    Args:
        path: the packed output.
        check_crc: verify each value's CRC32C when it is read (default on).
        version: which version to read (None: the latest).
    """

    format_name: ClassVar[str] = ""

    def __init__(self, path: str | os.PathLike, *, check_crc: bool = True, version: int | None = None):
        tune_heap()  # decoded images reuse freed heap pages instead of faulting in fresh ones (packer.heap)
        if version is not None and (type(version) is not int or version < 1):
            raise FormatError(f"{path}: version must be a positive int, not {version!r}")
        self.path = Path(path)
        self.check_crc = check_crc
        self.version_asked = version
        self._identity = self._current_identity()
        self.manifest = self._load_manifest()
        self._check_unchanged()  # not replaced between the stat and the manifest read
        if self.manifest.format != self.format_name:
            raise CorruptData(str(self.path), f"manifest says format {self.manifest.format!r}, "
                                              f"not {self.format_name!r}")
        self._pid: int | None = None
        self._keys: Sequence[str] | None = None
        self._stored_keys: Sequence[str] | None = None
        self._keys_file_crc: str | None = None  # the CRC32C of keys.json's bytes (read_keys)
        self._crcs: "np.ndarray | None" = None
        self._schema: Schema | None = None
        self._set_selection()

    def _set_selection(self) -> None:
        """The stored position of each of this version's samples, by ranges (None: ``0..count-1``)."""
        ranges = self.manifest.ranges() if self.manifest.select else None
        if ranges is None or ranges == [(0, self.manifest.count)]:
            self._select = None
            return
        import numpy as np

        starts = np.cumsum([0] + [b - a for a, b in ranges[:-1]], dtype=np.int64)
        self._select = (starts, np.array([a for a, _ in ranges], dtype=np.int64))

    @property
    def version(self) -> int:
        """The version this reader reads (1 for an output never appended to)."""
        return self.manifest.version

    @property
    def grown(self) -> bool:
        """True when the output holds (or may hold) stored positions past this version's: its
        sidecars are then longer than this version needs (docs/append.md)."""
        return self.manifest.version > 1 or (self.path / VERSIONS_DIR).is_dir()

    def positions(self) -> "np.ndarray":
        """The stored position of each sample of this version, in order."""
        import numpy as np

        if self._select is None:
            return np.arange(len(self), dtype=np.int64)
        return np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in self.manifest.ranges()]
                              or [np.zeros(0, np.int64)])

    @property
    def schema(self) -> Schema | None:
        """A field pack's typed fields (its records' data are field blobs); None otherwise."""
        if self._schema is None and self.manifest.schema:
            try:
                self._schema = Schema.from_json(self.manifest.schema)
            except ValueError as e:
                raise FormatError(f"{self.path}: malformed schema in the manifest ({e})") from e
        return self._schema

    def _check_unchanged(self) -> None:
        """The guard against an output replaced under an open reader (docs/contracts.md):
        raise OutputChanged if the output at ``path`` is no longer the one this reader opened (an
        ``--overwrite`` renames a new output over it). Formats call it after opening any file of
        the output by path, and where a read fails, so a reader never mixes the old manifest with
        new data nor calls a replaced file damaged. The identity travels with a pickled reader.
        An output that was only appended to still holds this reader's version: the reader
        follows it (``_holds_my_version``) and goes on reading its version's samples."""
        if self._identity is not None:
            now = self._current_identity()
            if now != self._identity:
                if not self._holds_my_version():
                    raise self._changed()
                self._identity = now

    def _holds_my_version(self) -> bool:
        """Does the output at ``path`` now still hold this reader's version, unchanged (only later
        versions were published, or an append is under way)? Its latest manifest is this version's
        or lists it, by ``identity()``, among the earlier ones."""
        try:
            latest = self._latest_manifest()
        except PackerError:
            return False
        mine = self.manifest
        if latest.version == mine.version:
            held = latest.identity() == mine.identity()
        else:
            want = mine.identity()
            held = any(h.get("version") == mine.version and h.get("identity") == want for h in latest.history)
        if held:
            self._followed(latest)
        return held

    def _followed(self, latest: Manifest) -> None:
        """Hook: the output was appended to and still holds this reader's version; ``latest`` is
        its latest manifest (a format whose storage moved says where it is now)."""

    def manifest_text(self) -> str:
        """This version's manifest exactly as it was published (what ``versions/`` keeps of it)."""
        kept = self.path / VERSIONS_DIR / f"{self.version}.json"
        path = kept if kept.is_file() else self.path / MANIFEST_NAME
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise FormatError(f"{path}: cannot read manifest ({e})") from e
        if Manifest.from_json(text, str(path)).identity() != self.manifest.identity():
            raise self._changed()
        return text

    def _latest_manifest(self) -> Manifest:
        """The latest manifest now at ``path`` (read again)."""
        return Manifest.load(self.path)

    def _current_identity(self) -> tuple[int, ...] | None:
        """Which version of the output is there now (None: none to hold on to)."""
        return output_identity(self.path)

    def _changed(self) -> OutputChanged:
        """The error ``_check_unchanged`` raises."""
        return OutputChanged(str(self.path))

    def _load_manifest(self) -> Manifest:
        return Manifest.load(self.path, self.version_asked)

    @classmethod
    def detect(cls, path: Path) -> bool:
        """True when ``path`` looks like this format (used where no manifest says so)."""
        return False

    @classmethod
    def files_beside(cls, path: Path) -> list[str]:
        """Files beside the single-file output at ``path`` that its samples are read from
        (names relative to its folder: an appended HDF5 output's parts); none by default."""
        return []

    def __len__(self) -> int:
        return self.manifest.count

    @property
    def classes(self) -> list[str]:
        return self.manifest.classes

    @property
    def keys(self) -> Sequence[str]:
        """Sample keys by position (loaded once, checked against the manifest's ``integrity``)."""
        if self._keys is None:
            stored = self._load_keys()
            self._check_unchanged()  # the keys of the output the manifest came from
            keys = stored if self._select is None else [stored[int(p)] for p in self.positions()]
            source = self._keys_source()
            if source is not None:  # (the file's own CRC when it is the keys as written: no encoding again)
                crc = self._keys_file_crc if keys is stored else None
                self._check_integrity("keys", crc if crc is not None and crc == self.manifest.integrity.get("keys")
                                      else keys_checksum(keys), source)
            self._stored_keys, self._keys = stored, keys
        return self._keys

    def _load_keys(self) -> Sequence[str]:
        """The keys by stored position (``manifest.physical`` of them): ``keys.json`` unless the
        format stores them itself."""
        keys, self._keys_file_crc = read_keys(self.path, self.manifest.physical, grown=self.grown)
        return keys

    def sources(self) -> "np.ndarray | None":
        """Per stored position of this version: the source file's size and mtime (ns) as it was
        packed, and the label (``--append`` compares inputs with it); None when not recorded."""
        rows = load_sources(self.path / SOURCES_FILE, self.manifest.physical)
        if rows is not None:
            self._check_integrity("sources", array_checksum(rows, "<i8"), self.path / SOURCES_FILE)
        return rows

    def stored_key(self, position: int) -> str:
        """The key of stored position ``position`` (``_check_index``'s result)."""
        if self._select is None:
            return self.keys[position]
        return self.stored_keys()[position]

    def stored_keys(self) -> Sequence[str]:
        """The key of every stored position of this version (a pruned version's too)."""
        _ = self.keys  # loads (and checks) both lists
        return self._stored_keys

    def _keys_source(self) -> Path | None:
        """Where the keys are stored, or None when they derive from the (checksummed) manifest."""
        return self.path / KEYS_FILE

    def _check_integrity(self, name: str, actual: str, source: str | os.PathLike) -> None:
        """CorruptData naming ``source`` unless ``actual`` is the manifest's ``integrity[name]``
        (outputs written before these checksums carry none and are read unchecked)."""
        want = self.manifest.integrity.get(name)
        if want is not None and want != actual:
            self._check_unchanged()  # replaced by an --overwrite: OutputChanged, not damage
            raise CorruptData(str(source), f"{name} checksum mismatch: the {name} were changed or damaged "
                                           f"(manifest records {want}, stored {name} give {actual})")

    def _key_name(self, index: int) -> str | None:
        """The key of stored position ``index`` for an error message; never raises."""
        try:
            return self.stored_key(index)
        except (PackerError, IndexError):
            return self._fallback_key(index)

    def _fallback_key(self, index: int) -> str | None:
        """What names sample ``index`` in an error when its key cannot be read."""
        return None

    def _checksums(self) -> "np.ndarray":
        """The ``checksums.bin`` sidecar (loaded once), for formats that keep CRCs there."""
        if self._crcs is None:
            crcs = load_checksums(self.path / CHECKSUMS_FILE, self.manifest.physical, grown=self.grown)
            self._check_unchanged()
            self._crcs = crcs
        return self._crcs

    def _check_crc32c(self, data: Any, index: int, *, file: str | os.PathLike,
                      expected: int | None = None) -> None:
        """When ``check_crc`` is on: CorruptData naming ``file``, the position and the key unless
        ``data`` has the CRC32C stored for stored position ``index`` (``expected``, else
        ``checksums.bin``)."""
        if not self.check_crc:
            return
        want = int(self._checksums()[index]) if expected is None else int(expected)
        if crc32c(data) != want:
            raise CorruptData(str(file), "CRC32C mismatch", position=f"sample {index}",
                              key=self._key_name(index))

    @abc.abstractmethod
    def read(self, index: int) -> Record:
        """The stored sample at ``index``; raises CorruptData naming the file and position."""

    def read_many(self, indices: Sequence[int]) -> Iterator[Record]:
        """``read`` of each index, lazily (use each record before the next is read: the bytes stay
        in the CPU cache); formats with a cheaper batched read override it."""
        return (self.read(i) for i in indices)

    def sample(self, index: int) -> Sample:
        """The stored sample at ``index`` as a writer takes it (what a re-pack needs).

        Formats that keep per-sample ``extra`` fields (video frame numbers) override this.
        """
        rec = self.read(index)
        return Sample(self.stored_key(self._check_index(index)), rec.data, rec.fmt, rec.label,
                      rec.height, rec.width, rec.channels)

    def _check_index(self, index: int) -> int:
        """The stored position of sample ``index`` (IndexError when out of range)."""
        n = len(self)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(f"{self.path}: index {index} out of range for {n} samples")
        if self._select is not None:
            starts, firsts = self._select
            k = int(starts.searchsorted(index, side="right")) - 1
            return int(firsts[k]) + index - int(starts[k])
        return index

    def verify(self, *, check_record: Callable[[int, Record], None] | None = None,
               indices: Sequence[int] | None = None) -> Iterator[CorruptData]:
        """Check structure and every value's checksum; yield each problem found.

        ``check_record(index, record)`` runs on each record read (``packer verify`` decodes the
        image there) and raises CorruptData for a problem of its own. ``indices``: read only
        these samples (``packer verify`` reads an older version's samples that a later version
        dropped; the others it reads once, in the latest version).
        """
        try:
            self.keys  # noqa: B018 (loading them checks them)
        except CorruptData as e:
            yield e
        for problem in self.verify_structure():
            yield problem
        for i in (range(len(self)) if indices is None else indices):
            try:
                rec = self.read(i)
                if check_record is not None:
                    check_record(i, rec)
            except CorruptData as e:
                yield e

    def verify_structure(self) -> Iterator[CorruptData]:
        """Structural checks against the manifest (count, keys, index files)."""
        return iter(())

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for k in self._handle_attrs():
            state[k] = None
        state["_pid"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        tune_heap()  # a spawned DataLoader worker (a forked one inherits its parent's heap settings)
        self.__dict__.update(state)

    def _handle_attrs(self) -> tuple[str, ...]:
        """Attributes holding open handles, dropped when pickled."""
        return ()

    def close(self) -> None:
        """Drop open handles (they reopen lazily on the next read)."""

"""The ``packer.json`` manifest: a dataclass model with load/save and versioning."""
from __future__ import annotations

import dataclasses
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packer.errors import CorruptData, FormatError

__all__ = ["FORMAT_VERSION", "MANIFEST_NAME", "FAILURES_NAME", "VERSIONS_DIR", "Manifest", "created_by",
           "atomic_write_bytes", "manifest_checksum"]

FORMAT_VERSION = 1
MANIFEST_NAME = "packer.json"
FAILURES_NAME = "failures.jsonl"
# every published version's manifest of an output that was appended to (``versions/{n}.json``)
VERSIONS_DIR = "versions"


@dataclass
class Manifest:
    """What a packed output holds; a reader needs nothing but this and the path."""

    format: str
    kind: str = "images"
    count: int = 0
    classes: list[str] = field(default_factory=list)
    fields: list[str] = field(default_factory=lambda: ["image", "label", "key"])
    created_by: dict[str, Any] = field(default_factory=dict)
    failures: int = 0
    format_version: int = FORMAT_VERSION
    shards: list[dict[str, Any]] = field(default_factory=list)
    videos: list[dict[str, Any]] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    # What decided the bytes (options, format, input digest): ``packer.conversion.fingerprint``.
    fingerprint: dict[str, Any] = field(default_factory=dict)
    # CRC32C (8 hex digits) of what a reader returns besides sample bytes and is kept outside
    # the manifest: ``keys`` (the key list), ``labels`` (a format's separate label array).
    integrity: dict[str, str] = field(default_factory=dict)
    # A field pack's typed fields (``packer.codecs.fields.Schema.to_json``); empty for
    # image-and-label outputs, which then keep their bytes as before.
    schema: list[dict[str, Any]] = field(default_factory=list)
    # Versions (docs/append.md). A pack is version 1; each ``--append`` publishes the next one.
    # Storage only grows: samples keep their *stored position* for good, and a version is a
    # selection of stored positions (``select``: half-open ``[start, stop)`` ranges, in order;
    # empty: the first ``count``). ``stored``: how many positions the storage holds at this
    # version (0: ``count``). ``added``/``removed``: what this version changed against
    # ``parent``; ``history``: a summary of every earlier version (with its ``identity()``).
    version: int = 1
    parent: int | None = None
    stored: int = 0
    select: list[list[int]] = field(default_factory=list)
    added: dict[str, Any] = field(default_factory=dict)
    removed: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    # HDF5 after an append: the files that hold the stored positions, in order (``{file, count}``,
    # relative to the head file's folder).
    parts: list[dict[str, Any]] = field(default_factory=list)

    @property
    def physical(self) -> int:
        """Stored positions at this version (a pruned version selects fewer of them)."""
        return self.stored or self.count

    def ranges(self) -> list[tuple[int, int]]:
        """The stored positions of this version's samples, as ``[start, stop)`` ranges in order."""
        if not self.select:
            return [(0, self.count)] if self.count else []
        return [(int(a), int(b)) for a, b in self.select]

    @property
    def holds(self) -> str:
        """What a sample is: ``"images"`` (an image pack), ``"frames"`` (``decode-frames``: each
        video's frames as images) or ``"videos"`` (``pack-videos``: each video one encoded stream)."""
        if self.kind != "videos":
            return "images"
        return "videos" if self.videos and all("video_frames" in v for v in self.videos) else "frames"

    def identity(self) -> str:
        """CRC32C (8 hex digits) of what the pack holds: every field but ``created_by`` (the
        command line and paths, which a copy or a rerun of the same conversion may change).
        Two packs of other samples, classes, shards or conversion options differ in it."""
        return manifest_checksum({f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                                  if f.name != "created_by"})

    def to_json(self) -> str:
        """Serialize with stable key order (empty per-format lists are left out), plus the
        ``checksum`` of everything else (see :func:`manifest_checksum`)."""
        # (a shallow dict: ``dataclasses.asdict`` deep-copies every nested list and dict, a
        # video dataset's entries included, only for them to be serialized)
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for k in ("shards", "videos", "extra", "fingerprint", "integrity", "schema", "stored", "select", "added",
                  "removed", "history", "parts"):
            if not d[k]:
                d.pop(k)
        if d["version"] == 1:  # a pack never appended to reads as it always did
            d.pop("version")
        if d["parent"] is None:
            d.pop("parent")
        d["checksum"] = manifest_checksum(d)
        return json.dumps(d, indent=1, ensure_ascii=False) + "\n"

    @classmethod
    def from_json(cls, text: str, source: str) -> "Manifest":
        """Parse and validate; a bad or unknown-version manifest raises FormatError naming ``source``."""
        try:
            d = json.loads(text)
        except (ValueError, UnicodeDecodeError) as e:
            raise FormatError(f"{source}: manifest is not valid JSON ({e})") from e
        if not isinstance(d, dict) or "format" not in d:
            raise FormatError(f"{source}: manifest has no 'format' field")
        version = d.get("format_version")
        if version != FORMAT_VERSION:
            raise FormatError(f"{source}: unknown format_version {version!r} (this packer reads {FORMAT_VERSION})")
        recorded = d.pop("checksum", None)
        if recorded is not None and recorded != manifest_checksum(d):
            raise CorruptData(source, "manifest checksum mismatch: its classes, labels, counts or "
                                      "other fields were changed or damaged")
        known = {f.name for f in dataclasses.fields(cls)}
        try:
            m = cls(**{k: v for k, v in d.items() if k in known})
            m.count = int(m.count)
            m.failures = int(m.failures)
            m.version = int(m.version)
            m.stored = int(m.stored)
        except (TypeError, ValueError) as e:
            raise FormatError(f"{source}: malformed manifest ({e})") from e
        if not isinstance(m.classes, list) or m.count < 0:
            raise FormatError(f"{source}: malformed manifest (classes/count)")
        _check_versioning(m, source)
        return m

    def save(self, directory: str | os.PathLike) -> None:
        """Write ``packer.json`` into ``directory`` atomically."""
        atomic_write_bytes(Path(directory) / MANIFEST_NAME, self.to_json().encode())

    @classmethod
    def load(cls, directory: str | os.PathLike, version: int | None = None) -> "Manifest":
        """Read ``packer.json`` from ``directory`` (the latest version), or the manifest of
        ``version`` (``versions/{version}.json``; FormatError naming the versions there when
        the output has no such version)."""
        p = Path(directory) / MANIFEST_NAME
        try:
            text = p.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise FormatError(f"{directory}: no {MANIFEST_NAME} (not a packer output)") from None
        except (OSError, UnicodeDecodeError) as e:
            raise FormatError(f"{p}: cannot read manifest ({e})") from e
        latest = cls.from_json(text, str(p))
        if version is None or version == latest.version:
            return latest
        old = Path(directory) / VERSIONS_DIR / f"{version}.json"
        if not 1 <= version < latest.version or not old.is_file():
            raise FormatError(f"{directory}: has no version {version} (versions 1..{latest.version})")
        try:
            m = cls.from_json(old.read_text(encoding="utf-8"), str(old))
        except (OSError, UnicodeDecodeError) as e:
            raise FormatError(f"{old}: cannot read manifest ({e})") from e
        if m.version != version:
            raise CorruptData(str(old), f"holds version {m.version}, not {version}")
        return m


def _check_versioning(m: Manifest, source: str) -> None:
    """FormatError unless the version fields are whole: a version >= 1, a selection of sorted,
    disjoint ranges inside the storage that adds up to ``count``."""
    if m.version < 1 or m.stored < 0 or (m.stored and m.stored < m.count):
        raise FormatError(f"{source}: malformed manifest (version {m.version}, stored {m.stored}, count {m.count})")
    if not m.select:
        return
    total, end = 0, 0
    for r in m.select:
        if (not isinstance(r, list) or len(r) != 2 or not all(type(v) is int for v in r)
                or not end <= r[0] <= r[1] <= m.physical):
            raise FormatError(f"{source}: malformed manifest (select range {r!r})")
        total, end = total + r[1] - r[0], r[1]
    if total != m.count:
        raise FormatError(f"{source}: malformed manifest (select holds {total} positions, count is {m.count})")


def manifest_checksum(fields: dict[str, Any]) -> str:
    """CRC32C (8 hex digits) of a manifest's fields (without ``checksum``) in canonical JSON
    (sorted keys, no whitespace): it covers the classes, counts, video entries with their
    labels, shards, fingerprint and the ``integrity`` checksums, while reformatting the file
    changes nothing. A manifest written before checksums (no field) is read unchecked."""
    from packer.integrity import crc32c

    canon = json.dumps({k: v for k, v in fields.items() if k != "checksum"}, sort_keys=True,
                       ensure_ascii=False, separators=(",", ":"))
    return f"{crc32c(canon.encode('utf-8', 'surrogatepass')):08x}"


def created_by(options: dict[str, Any]) -> dict[str, Any]:
    """The manifest's ``created_by`` block: packer version, command line and options."""
    from packer._version import __version__

    return {"packer": __version__, "command": " ".join([Path(sys.argv[0]).name] + sys.argv[1:]),
            "options": options}


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file, fsync, then rename."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:  # a full disk: no half-written temporary left behind
        tmp.unlink(missing_ok=True)
        raise

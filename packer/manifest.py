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

__all__ = ["FORMAT_VERSION", "MANIFEST_NAME", "FAILURES_NAME", "Manifest", "created_by", "atomic_write_bytes",
           "manifest_checksum"]

FORMAT_VERSION = 1
MANIFEST_NAME = "packer.json"
FAILURES_NAME = "failures.jsonl"


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
        for k in ("shards", "videos", "extra", "fingerprint", "integrity", "schema"):
            if not d[k]:
                d.pop(k)
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
        except (TypeError, ValueError) as e:
            raise FormatError(f"{source}: malformed manifest ({e})") from e
        if not isinstance(m.classes, list) or m.count < 0:
            raise FormatError(f"{source}: malformed manifest (classes/count)")
        return m

    def save(self, directory: str | os.PathLike) -> None:
        """Write ``packer.json`` into ``directory`` atomically."""
        atomic_write_bytes(Path(directory) / MANIFEST_NAME, self.to_json().encode())

    @classmethod
    def load(cls, directory: str | os.PathLike) -> "Manifest":
        """Read ``packer.json`` from ``directory``."""
        p = Path(directory) / MANIFEST_NAME
        try:
            text = p.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise FormatError(f"{directory}: no {MANIFEST_NAME} (not a packer output)") from None
        except (OSError, UnicodeDecodeError) as e:
            raise FormatError(f"{p}: cannot read manifest ({e})") from e
        return cls.from_json(text, str(p))


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

"""Video files format, writing: each MP4 under a temporary name, renamed when complete."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from packer.errors import WriteError
from packer.formats.frames.writer import _syncfs, publish_folders
from packer.formats.sample import Sample
from packer.formats.sidecars import fsync_append, write_checksums
from packer.formats.videofiles import LIST_NAME, list_text
from packer.formats.writer import Writer
from packer.integrity import crc32c
from packer.manifest import Manifest, atomic_write_bytes

__all__ = ["VideoFilesWriter"]

FILES_JOURNAL = ".files.journal"


def _checked(rel: str) -> str:
    """A sample's file name, relative to the output, refused when it could leave it."""
    p = Path(rel)
    if not rel or p.is_absolute() or ".." in p.parts or p.suffix != ".mp4" or p.name.startswith("."):
        raise WriteError(f"{rel!r}: not a relative .mp4 file name inside the output")
    return p.as_posix()


class VideoFilesWriter(Writer):
    """Writes each video sample (MP4 bytes, ``extra["file"]`` its relative name) as a file."""

    format_name = "files"

    def __init__(self, out: str | os.PathLike, *, classes: list[str], kind: str = "videos",
                 created_by: dict[str, Any] | None = None, commit_every: int = 100,
                 commit_bytes: int = 256 << 20):
        if kind != "videos":
            raise ValueError("the files format holds videos only (kind='videos')")
        super().__init__(out, classes=classes, kind=kind, created_by=created_by,
                         commit_every=commit_every, commit_bytes=commit_bytes)

    def _open(self, resume_samples: int) -> None:
        journal = self.workdir / FILES_JOURNAL
        kept: list[str] = []
        if journal.exists():
            for line in journal.read_text(encoding="utf-8").splitlines():
                try:
                    name, position = json.loads(line)
                except ValueError:
                    break  # a torn last line
                if position >= resume_samples:
                    break
                kept.append(name)
            atomic_write_bytes(journal, "".join(json.dumps([n, i]) + "\n" for i, n in enumerate(kept)).encode())
        self._drop_unlisted(set(kept))
        self._completed: list[tuple[str, int]] = []  # files written since the last commit

    def _drop_unlisted(self, keep: set[str]) -> None:
        """Remove video files (and temporary ones) past the resume point, then empty folders."""
        for dirpath, dirnames, filenames in os.walk(self.workdir, topdown=False):
            d = Path(dirpath)
            for name in filenames:
                rel = (d / name).relative_to(self.workdir).as_posix()
                ours = d != self.workdir or name.endswith((".mp4", ".mp4.tmp"))  # not the journals
                if ours and rel not in keep:
                    (d / name).unlink()
            if d != self.workdir and not any(d.iterdir()):
                d.rmdir()

    def _write(self, index: int, sample: Sample) -> int:
        try:
            rel = _checked(str(sample.extra["file"]))
        except (KeyError, TypeError):
            raise WriteError(f"{self.workdir}: sample {sample.key!r} names no file") from None
        final = self.workdir / rel
        tmp = final.with_name(f".{final.name}.tmp")
        final.parent.mkdir(parents=True, exist_ok=True)
        data = sample.data
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, final)
        self._completed.append((rel, index))
        return crc32c(data)

    def _commit(self) -> None:
        _syncfs(self.workdir)
        if self._completed:
            fsync_append(self.workdir / FILES_JOURNAL,
                         "".join(json.dumps(list(v)) + "\n" for v in self._completed).encode())
            self._completed = []

    def _finish(self, manifest: Manifest) -> None:
        missing = [v.get("key") for v in manifest.videos if "file" not in v]
        if missing:
            raise WriteError(f"{self.workdir}: video entries without a file: {missing[:3]}")
        self._remove(self.workdir / FILES_JOURNAL)
        self._drop_unlisted({v["file"] for v in manifest.videos})  # a failed video's leftovers
        write_checksums(self.workdir, self.crcs)
        atomic_write_bytes(self.workdir / LIST_NAME, list_text(manifest.videos).encode("utf-8"))
        manifest.extra["list_file"] = LIST_NAME
        manifest.save(self.workdir)

    def _finish_appended(self, version: Manifest, added: Manifest, keys: list[str]) -> None:
        """The new videos' files move into the output; ``videos.txt`` gives the new version's."""
        files = [v["file"] for v in added.videos]
        if self.workdir.is_dir():  # (gone once an earlier try of this publish finished)
            self._drop_unlisted(set(files))
        publish_folders(self, files, keys, {LIST_NAME: list_text(version.videos)})

    def _close_handles(self) -> None:
        pass  # every file is closed as soon as it is written

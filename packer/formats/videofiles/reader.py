"""Video files format, reading: the MP4 file at a packed position, CRC-checked."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterator

from packer.errors import CorruptData
from packer.formats.frames.reader import FileTreeReader
from packer.formats.sample import Record, Sample
from packer.formats.videofiles import LIST_NAME, MP4_FMT, list_text

__all__ = ["VideoFilesReader"]


class VideoFilesReader(FileTreeReader):
    """Random access to the videos of a ``files`` output (``pack-videos --to files``), by position."""

    format_name = "files"

    def __init__(self, path: str | os.PathLike, *, check_crc: bool = True, version: int | None = None):
        super().__init__(path, check_crc=check_crc, version=version)
        self.videos = self.manifest.videos

    def _derived_keys(self) -> list[str]:
        return [v["key"] for v in self.videos]

    def _key_name(self, index: int) -> None:
        return None  # a video's errors name its own file

    def file_path(self, index: int) -> tuple[Path, dict[str, Any]]:
        """The file of the video at ``index`` and its manifest entry."""
        self._check_index(index)
        v = self.videos[index]
        return self.path / v["file"], v

    def read(self, index: int) -> Record:
        path, v = self.file_path(index)
        try:
            data = path.read_bytes()
        except OSError as e:
            self._check_unchanged()
            raise CorruptData(str(path), f"cannot read video ({e.strerror or e})", position=f"sample {index}") from e
        self._check_unchanged()
        self._check_crc32c(data, self._check_index(index), file=path)
        return Record(data, int(v["label"]), MP4_FMT, int(v.get("height", 0)), int(v.get("width", 0)), 3)

    def sample(self, index: int) -> Sample:
        rec = self.read(index)
        return Sample(self.keys[index], rec.data, rec.fmt, rec.label, rec.height, rec.width, rec.channels,
                      extra={"file": self.videos[index]["file"]})

    def verify_structure(self) -> Iterator[CorruptData]:
        try:
            self._checksums()
        except CorruptData as e:
            yield e
        if len(self.videos) != len(self):
            yield CorruptData(str(self.path), f"{len(self.videos)} videos, manifest count says {len(self)}")
        listed = self.path / LIST_NAME
        if not self._latest():
            return  # an earlier version: the list gives the latest one's videos
        try:
            if listed.read_text(encoding="utf-8") != list_text(self.videos):
                yield CorruptData(str(listed), "does not match the manifest's videos")
        except (OSError, ValueError) as e:
            yield CorruptData(str(listed), f"cannot read list file ({e})")

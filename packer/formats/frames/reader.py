"""Frames format, reading: the frame file at a packed position, CRC-checked."""
from __future__ import annotations

import bisect
import os
from pathlib import Path
from typing import Any, Iterator, Sequence

from packer.errors import CorruptData
from packer.formats.frames.layout import DEFAULT_TEMPLATE, LIST_NAME, check_template, rawframes_lines
from packer.formats.reader import Reader
from packer.formats.sample import Record, Sample

__all__ = ["FramesReader"]


class FramesReader(Reader):
    """Random access to the frames of a ``frames`` output, by packed position."""

    format_name = "frames"

    def __init__(self, path: str | os.PathLike, *, check_crc: bool = True):
        super().__init__(path, check_crc=check_crc)
        extra = self.manifest.extra
        self.filename_tmpl = extra.get("filename_tmpl", DEFAULT_TEMPLATE)
        self.start_index = int(extra.get("start_index", 1))
        self.fmt = check_template(self.filename_tmpl)
        self.videos = self.manifest.videos
        self._starts = [int(v["start"]) for v in self.videos]

    def _load_keys(self) -> Sequence[str]:
        return [f"{v['key']}/{self.start_index + j}" for v in self.videos for j in range(int(v["length"]))]

    def _key_name(self, index: int) -> None:
        return None  # a frame's errors name its own file

    def frame_path(self, index: int) -> tuple[Path, dict[str, Any]]:
        """The file of the frame at packed position ``index`` and its video's entry."""
        index = self._check_index(index)
        v = self.videos[bisect.bisect_right(self._starts, index) - 1]
        return self.path / v["frame_dir"] / self.filename_tmpl.format(
            self.start_index + index - int(v["start"])), v

    def sample(self, index: int) -> Sample:
        """The frame at ``index`` with the extras the frames writer takes (``packer merge``)."""
        index = self._check_index(index)
        _, v = self.frame_path(index)
        rec = self.read(index)
        return Sample(self.keys[index], rec.data, rec.fmt, rec.label, rec.height, rec.width, rec.channels,
                      extra={"frame_dir": v["frame_dir"], "frame": index - int(v["start"]),
                             "frames": int(v["length"])})

    def read(self, index: int) -> Record:
        path, v = self.frame_path(index)
        try:
            data = path.read_bytes()
        except OSError as e:
            raise CorruptData(str(path), f"cannot read frame ({e.strerror or e})",
                              position=f"sample {index}") from None
        self._check_crc32c(data, index, file=path)
        return Record(data, int(v["label"]), self.fmt, int(v.get("height", 0)), int(v.get("width", 0)), 3)

    def verify_structure(self) -> Iterator[CorruptData]:
        try:
            self._checksums()
        except CorruptData as e:
            yield e
        total = sum(int(v["length"]) for v in self.videos)
        if total != len(self):
            yield CorruptData(str(self.path), f"videos hold {total} frames, manifest count says {len(self)}")
        listed = self.path / LIST_NAME
        try:
            if listed.read_text(encoding="utf-8") != rawframes_lines(self.videos):
                yield CorruptData(str(listed), "does not match the manifest's videos")
        except OSError as e:
            yield CorruptData(str(listed), f"cannot read list file ({e.strerror or e})")
        except ValueError as e:  # not UTF-8
            yield CorruptData(str(listed), f"cannot read list file ({e})")
        for v in self.videos:
            d = self.path / v["frame_dir"]
            try:
                n = sum(1 for p in d.iterdir())
            except OSError:
                yield CorruptData(str(d), "frame folder missing")
                continue
            if n != int(v["length"]):
                yield CorruptData(str(d), f"holds {n} files, the list says {v['length']} frames")

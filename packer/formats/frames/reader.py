"""Frames format, reading: the frame file at a packed position, CRC-checked."""
from __future__ import annotations

import bisect
import os
from pathlib import Path
from typing import Any, Iterator, Sequence

from packer.errors import CorruptData, PackerError
from packer.formats.frames.layout import DEFAULT_TEMPLATE, EXT_FMT, check_template, list_files, video_streams
from packer.formats.reader import Reader
from packer.formats.sample import Record, Sample
from packer.formats.sidecars import KEYS_FILE, partial_path
from packer.manifest import Manifest

__all__ = ["FramesReader", "FileTreeReader"]


class FileTreeReader(Reader):
    """A reader of an output of files that the manifest's ``videos`` name (frame folders, video
    files). Its keys derive from the manifest; an appended output's ``keys.json`` holds every
    stored position's (a pruned version lists fewer videos), and its list files give the
    latest version (docs/append.md)."""

    def _keys_source(self) -> Path | None:
        return self.path / KEYS_FILE if self._appended() else None  # else the manifest's checksum covers them

    def _appended(self) -> bool:
        return self.grown and (self.path / KEYS_FILE).is_file()

    def _load_keys(self) -> Sequence[str]:
        return super()._load_keys() if self._appended() else self._derived_keys()

    def _derived_keys(self) -> list[str]:
        """The keys by position, from the manifest's videos (an output never appended to)."""
        raise NotImplementedError

    def _latest(self) -> bool:
        """Whether the list files give this reader's videos: it reads the output's latest version,
        and no append is under way (``OUT.partial``: it rewrites them before its publish)."""
        if not self.grown:
            return True
        if partial_path(self.path).exists():
            return False
        try:
            return Manifest.load(self.path).identity() == self.manifest.identity()
        except PackerError:
            return False


class FramesReader(FileTreeReader):
    """Random access to the frames of a ``frames`` output, by packed position (of ``version``:
    an appended output's, docs/append.md; the videos' ``start`` count this version's samples)."""

    format_name = "frames"

    def __init__(self, path: str | os.PathLike, *, check_crc: bool = True, version: int | None = None):
        super().__init__(path, check_crc=check_crc, version=version)
        extra = self.manifest.extra
        self.filename_tmpl = extra.get("filename_tmpl", DEFAULT_TEMPLATE)
        self.start_index = int(extra.get("start_index", 1))
        self.fmt = check_template(self.filename_tmpl)
        self.flow_tmpl = extra.get("flow_tmpl")
        self.videos = self.manifest.videos
        self._starts = [int(v["start"]) for v in self.videos]

    def _derived_keys(self) -> list[str]:
        return [f"{v['key']}/{self._name(v, j)[1]}" for v in self.videos for j in range(int(v["length"]))]

    def _locate(self, index: int) -> tuple[int, int]:
        """(sample ``index`` of this version, its stored position); IndexError out of range."""
        position = self._check_index(index)
        return (index + len(self) if index < 0 else index), position

    def _name(self, v: dict[str, Any], j: int) -> tuple[str, str]:
        """(file name, key suffix) of sample ``j`` of video entry ``v``."""
        rgb, _ = video_streams(v)
        if j < rgb or self.flow_tmpl is None:
            return self.filename_tmpl.format(self.start_index + j), str(self.start_index + j)
        direction, number = "xy"[(j - rgb) % 2], self.start_index + (j - rgb) // 2
        return self.flow_tmpl.format(direction, number), f"{direction}/{number}"

    def _key_name(self, index: int) -> None:
        return None  # a frame's errors name its own file

    def frame_path(self, index: int) -> tuple[Path, dict[str, Any]]:
        """The file of the frame at packed position ``index`` and its video's entry."""
        index = self._locate(index)[0]
        v = self.videos[bisect.bisect_right(self._starts, index) - 1]
        return self.path / v["frame_dir"] / self._name(v, index - int(v["start"]))[0], v

    def sample(self, index: int) -> Sample:
        """The frame at ``index`` with the extras the frames writer takes (``packer merge``)."""
        index = self._locate(index)[0]
        path, v = self.frame_path(index)
        rec = self.read(index)
        extra = {"frame_dir": v["frame_dir"], "frame": index - int(v["start"]), "frames": int(v["length"])}
        if index - int(v["start"]) >= video_streams(v)[0]:
            extra["file"] = path.name
        return Sample(self.keys[index], rec.data, rec.fmt, rec.label, rec.height, rec.width, rec.channels,
                      extra=extra)

    def read(self, index: int) -> Record:
        path, v = self.frame_path(index)
        try:
            data = path.read_bytes()
        except OSError as e:
            self._check_unchanged()  # a frame gone because the output was replaced says so
            raise CorruptData(str(path), f"cannot read frame ({e.strerror or e})",
                              position=f"sample {index}") from e
        # Frames are opened file by file by path: one stat per frame makes sure this file came
        # from the output the manifest describes, not from an --overwrite renamed over it.
        self._check_unchanged()
        index, position = self._locate(index)
        self._check_crc32c(data, position, file=path)
        flow = index - int(v["start"]) >= video_streams(v)[0]
        fmt = EXT_FMT[path.suffix[1:].lower()] if flow else self.fmt
        return Record(data, int(v["label"]), fmt, int(v.get("height", 0)), int(v.get("width", 0)),
                      1 if flow else 3)

    def verify_structure(self) -> Iterator[CorruptData]:
        try:
            self._checksums()
        except CorruptData as e:
            yield e
        total = sum(int(v["length"]) for v in self.videos)
        if total != len(self):
            yield CorruptData(str(self.path), f"videos hold {total} frames, manifest count says {len(self)}")
        lists = list_files(self.videos, flow=self.flow_tmpl is not None) if self._latest() else {}
        for name, text in lists.items():
            listed = self.path / name
            try:
                if listed.read_text(encoding="utf-8") != text:
                    yield CorruptData(str(listed), "does not match the manifest's videos")
            except OSError as e:
                yield CorruptData(str(listed), f"cannot read list file ({e.strerror or e})")
            except ValueError as e:  # not UTF-8
                yield CorruptData(str(listed), f"cannot read list file ({e})")
        for v in self.videos:  # (an appended output's folder may hold the videos of later versions)
            d = self.path / v["frame_dir"]
            try:
                n = sum(1 for p in d.iterdir())
            except OSError:
                yield CorruptData(str(d), "frame folder missing")
                continue
            if n != int(v["length"]):
                yield CorruptData(str(d), f"holds {n} files, the list says {v['length']} frames")

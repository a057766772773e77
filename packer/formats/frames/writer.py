"""Frames format, writing: each video's frame files in a temporary folder, renamed when complete."""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import json
import os
import shutil
from pathlib import Path
from typing import Any, Sequence

from packer.errors import WriteError
from packer.formats.frames.layout import (DEFAULT_TEMPLATE, FLOW_LIST_NAME, LIST_NAME, VIDEOS_JOURNAL, check_template,
                                         list_files)
from packer.formats.reader import Reader
from packer.formats.sample import Sample, Stored
from packer.formats.sidecars import fsync_append, write_checksums, write_keys
from packer.formats.writer import Writer
from packer.integrity import crc32c
from packer.manifest import Manifest, atomic_write_bytes

__all__ = ["FramesWriter", "publish_folders"]


@functools.lru_cache(maxsize=1)
def _syncfs_fn() -> Any:
    """libc's ``syncfs``, looked up once. The symbols already loaded come first: ``find_library``
    runs ``ldconfig`` in a subprocess, and a subprocess started while a process pool forks a
    replacement worker from its manager thread can hang forever (the forked worker inherits the
    pipe ``subprocess`` waits on)."""
    fn = getattr(ctypes.CDLL(None, use_errno=True), "syncfs", None)
    if fn is None:
        libc_name = ctypes.util.find_library("c")
        fn = getattr(ctypes.CDLL(libc_name, use_errno=True), "syncfs", None) if libc_name else None
    return fn


def _syncfs(path: Path) -> None:
    """Flush the file system holding ``path`` (one call instead of an fsync per frame file)."""
    fn = _syncfs_fn()
    if fn is None:
        os.sync()
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        if fn(fd) != 0:
            os.sync()
    finally:
        os.close(fd)


def publish_folders(writer: Writer, names: Sequence[str], keys: list[str], lists: dict[str, str]) -> None:
    """Appending to an output of files (frame folders, video files): move each new video's
    ``names`` (its folder or file, relative) from the partial into the output (``os.replace``;
    one moved by an earlier try of the publish stays), then rewrite what grows with the stored
    positions (``checksums.bin``, ``keys.json``: every stored position's, the base's first) and
    the list files of the new version (``lists``). Nothing a published version reads changes: its
    files stay where they are, and its manifest gives its own list (docs/append.md)."""
    import numpy as np

    for name in names:
        src, dst = writer.workdir / name, writer.out / name
        if not (src.exists() or src.is_symlink()):
            if not dst.exists():
                raise WriteError(f"{src}: a new video's files are missing")
            continue  # moved by an earlier try of this publish
        if dst.exists() or dst.is_symlink():  # moved by an interrupted append never published (the
            writer._remove(dst)               # plan refuses the names a published version holds)
        dst.parent.mkdir(parents=True, exist_ok=True)
        os.replace(src, dst)
    old = np.asarray(writer.append_to.reader._checksums(), dtype="<u4")
    write_checksums(writer.out, np.concatenate([old, np.asarray(writer.crcs, dtype="<u4")]))
    write_keys(writer.out, keys)
    for name, text in lists.items():
        atomic_write_bytes(writer.out / name, text.encode("utf-8"))


class FramesWriter(Writer):
    """Writes each video's frames as files in its own folder (temporary name, then rename).

    Args (beyond the base Writer's):
        filename_tmpl: frame file names (``img_{:05d}.jpg``).
        start_index: the number of a video's first frame file (mmaction2: 1).
        flow_tmpl: flow file names (``{}_{:05d}.jpg``) when the output holds optical flow.
    """

    format_name = "frames"

    def __init__(self, out: str | os.PathLike, *, classes: list[str], kind: str = "videos",
                 created_by: dict[str, Any] | None = None, commit_every: int = 1000,
                 commit_bytes: int = 64 << 20, filename_tmpl: str = DEFAULT_TEMPLATE,
                 start_index: int = 1, flow_tmpl: str | None = None):
        if kind != "videos":
            raise ValueError("the frames format holds video frames only (kind='videos')")
        super().__init__(out, classes=classes, kind=kind, created_by=created_by,
                         commit_every=commit_every, commit_bytes=commit_bytes)
        check_template(filename_tmpl)
        if start_index < 0:
            raise ValueError("start_index must be >= 0")
        self.filename_tmpl = filename_tmpl
        self.start_index = start_index
        self.flow_tmpl = flow_tmpl  # set when the output holds optical flow

    @classmethod
    def merge_options(cls, parts: Sequence[Reader]) -> dict[str, Any]:
        """A merge keeps the parts' frame file names (``filename_tmpl``, ``start_index``, ``flow_tmpl``)."""
        extra = parts[0].manifest.extra
        return {"filename_tmpl": extra.get("filename_tmpl", DEFAULT_TEMPLATE),
                "start_index": int(extra.get("start_index", 1)), "flow_tmpl": extra.get("flow_tmpl")}

    @staticmethod
    def temp_folder(workdir: Path, frame_dir: str) -> Path:
        """Where a video's frames are written before the folder is renamed into place (by this
        writer, or by a worker process that writes them itself: ``FrameJob(write_into=...)``)."""
        final = Path(workdir) / frame_dir
        return final.with_name(f".{final.name}.tmp")

    # -- the format's part of the seam --------------------------------------------------------
    def _open(self, resume_samples: int) -> None:
        journal = self.workdir / VIDEOS_JOURNAL
        kept = []
        if journal.exists():
            for line in journal.read_text(encoding="utf-8").splitlines():
                try:
                    frame_dir, start, count = json.loads(line)
                except ValueError:
                    break  # a torn last line
                if start + count > resume_samples:
                    break
                kept.append((frame_dir, start, count))
            atomic_write_bytes(journal, "".join(json.dumps(list(v)) + "\n" for v in kept).encode())
        self._drop_unlisted({v[0] for v in kept})
        self._current: tuple[str, Path, int] | None = None  # frame_dir, temporary folder, start
        self._completed: list[tuple[str, int, int]] = []  # videos finished since the last commit

    def _drop_unlisted(self, keep: set[str]) -> None:
        """Remove temporary folders and frame folders past the resume point (a killed run's).

        Kept frame folders are not entered, so this lists only the class-level folders."""
        visited = []
        for dirpath, dirnames, filenames in os.walk(self.workdir):
            d = Path(dirpath)
            if d == self.workdir:
                continue
            rel = d.relative_to(self.workdir).as_posix()
            if rel in keep:
                dirnames[:] = []
            elif filenames:
                shutil.rmtree(d)
                dirnames[:] = []
            else:
                visited.append(d)
        for d in reversed(visited):  # children before parents
            if d.exists() and not any(d.iterdir()):
                d.rmdir()

    def _write(self, index: int, sample: Sample) -> int:
        extra = sample.extra
        try:
            frame_dir, j, total = extra["frame_dir"], int(extra["frame"]), int(extra["frames"])
        except (KeyError, TypeError, ValueError):
            raise WriteError(f"{self.workdir}: sample {sample.key!r} is not a video frame "
                             "(the frames format needs frame_dir/frame/frames)") from None
        stored = sample.prepared if isinstance(sample.prepared, Stored) else None
        if j == 0:
            tmp = self.temp_folder(self.workdir, frame_dir)
            if stored is None:
                self._remove(tmp)
                tmp.mkdir(parents=True)
            elif not tmp.is_dir():
                raise WriteError(f"{tmp}: the frames a worker wrote are missing")
            self._current = (frame_dir, tmp, index)
        elif self._current is None or self._current[0] != frame_dir:
            raise WriteError(f"{self.workdir}: frame {j} of {frame_dir!r} arrived out of order")
        tmp = self._current[1]
        data = sample.data
        if stored is None:
            with open(tmp / (extra.get("file") or self.filename_tmpl.format(self.start_index + j)), "wb") as f:
                f.write(data)
        if j == total - 1:
            final = self.workdir / frame_dir
            if final.exists():  # left by a killed run past the resume point
                self._remove(final)
            os.rename(tmp, final)
            self._completed.append((frame_dir, self._current[2], total))
            self._current = None
        return stored.crc if stored is not None else crc32c(data)

    def add(self, sample: Sample) -> None:
        super().add(sample)
        if isinstance(sample.prepared, Stored):
            self._pending_bytes += sample.prepared.size

    def _commit(self) -> None:
        _syncfs(self.workdir)
        if self._completed:
            fsync_append(self.workdir / VIDEOS_JOURNAL,
                          "".join(json.dumps(list(v)) + "\n" for v in self._completed).encode())
            self._completed = []

    def _finish(self, manifest: Manifest) -> None:
        if self._current is not None:
            raise WriteError(f"{self.workdir}: video {self._current[0]!r} ended before its last frame")
        missing = [v.get("key") for v in manifest.videos if "frame_dir" not in v]
        if missing:
            raise WriteError(f"{self.workdir}: video entries without frame_dir: {missing[:3]}")
        # a worker's temporary folder of a video that then failed (killed at its timeout)
        self._drop_unlisted({v["frame_dir"] for v in manifest.videos})
        write_checksums(self.workdir, self.crcs)
        lists = list_files(manifest.videos, flow=self.flow_tmpl is not None)
        for name, text in lists.items():
            atomic_write_bytes(self.workdir / name, text.encode("utf-8"))
        manifest.extra.update({"filename_tmpl": self.filename_tmpl, "start_index": self.start_index})
        if LIST_NAME in lists:
            manifest.extra["list_file"] = LIST_NAME
        if self.flow_tmpl is not None:
            manifest.extra.update(flow_tmpl=self.flow_tmpl, flow_list_file=FLOW_LIST_NAME)
        manifest.save(self.workdir)
        self._remove(self.workdir / VIDEOS_JOURNAL)

    def _finish_appended(self, version: Manifest, added: Manifest, keys: list[str]) -> None:
        """The new videos' frame folders move into the output; the list files give the new version's."""
        if self._current is not None:
            raise WriteError(f"{self.workdir}: video {self._current[0]!r} ended before its last frame")
        folders = [v["frame_dir"] for v in added.videos]
        if self.workdir.is_dir():  # (gone once an earlier try of this publish finished)
            self._drop_unlisted(set(folders))
        publish_folders(self, folders, keys, list_files(version.videos, flow=self.flow_tmpl is not None))

    def _close_handles(self) -> None:
        pass  # every frame file is closed as soon as it is written

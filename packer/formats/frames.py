"""Frames format: mmaction2 rawframes folders, the default output of ``decode-frames``.

Layout: ``{out}/{class}/{video}/img_00001.jpg`` (``filename_tmpl``/``start_index`` from the
manifest's ``extra``), the list file ``{out}/rawframes.txt`` (``{frame_dir} {total_frames}
{label}`` lines, mmaction2's ``RawframeDataset`` with ``data_prefix={out}``), ``packer.json``
(one ``videos`` entry per video, with ``frame_dir``), ``checksums.bin`` (u32 CRC32C of each
frame file by position) and ``failures.jsonl``. Frame folders hold only frame files.

Each video is written into a hidden temporary folder beside its final place and renamed
when its last frame is written, so a frame folder appears only complete. Video samples
carry ``extra = {"frame_dir", "frame" (0-based), "frames" (the video's count)}``.
"""
from __future__ import annotations

import bisect
import ctypes
import ctypes.util
import json
import os
import shutil
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from packer.errors import CorruptData, UsageError, WriteError
from packer.integrity import crc32c
from packer.manifest import Manifest, atomic_write_bytes
from packer.formats.base import Reader, Record, Sample, Stored, Writer, _fsync_append, load_checksums

__all__ = ["FramesWriter", "FramesReader", "LIST_NAME", "DEFAULT_TEMPLATE", "check_template",
           "rawframes_lines"]

LIST_NAME = "rawframes.txt"
DEFAULT_TEMPLATE = "img_{:05d}.jpg"
CHECKSUMS_FILE = "checksums.bin"
VIDEOS_JOURNAL = ".videos.journal"
_EXT_FMT = {"jpg": "jpeg", "jpeg": "jpeg", "png": "png"}


def check_template(tmpl: str) -> str:
    """Validate a frame file name template (``img_{:05d}.jpg``); return its image format."""
    try:
        a, b = tmpl.format(1), tmpl.format(2)
    except (IndexError, KeyError, ValueError) as e:
        raise UsageError(f"--tmpl {tmpl!r} is not a format string with one number field ({e})") from None
    if a == b or "/" in a or "\\" in a or a.startswith("."):
        raise UsageError(f"--tmpl {tmpl!r} must put the frame number in a plain file name")
    ext = a.rsplit(".", 1)[-1].lower() if "." in a else ""
    if ext not in _EXT_FMT:
        raise UsageError(f"--tmpl {tmpl!r} must end in .jpg or .png")
    return _EXT_FMT[ext]


def rawframes_lines(videos: list[dict[str, Any]]) -> str:
    """The mmaction2 rawframes list: ``{frame_dir} {total_frames} {label}`` per video."""
    return "".join(f"{v['frame_dir']} {v['length']} {v['label']}\n" for v in videos)


def _syncfs(path: Path) -> None:
    """Flush the file system holding ``path`` (one call instead of an fsync per frame file)."""
    libc_name = ctypes.util.find_library("c")
    fn = getattr(ctypes.CDLL(libc_name, use_errno=True), "syncfs", None) if libc_name else None
    if fn is None:
        os.sync()
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        if fn(fd) != 0:
            os.sync()
    finally:
        os.close(fd)


class FramesWriter(Writer):
    """Writes each video's frames as files in its own folder (temporary name, then rename).

    Args (beyond the base Writer's):
        filename_tmpl: frame file names (``img_{:05d}.jpg``).
        start_index: the number of a video's first frame file (mmaction2: 1).
    """

    format_name = "frames"

    def __init__(self, out: str | os.PathLike, *, classes: list[str], kind: str = "videos",
                 created_by: dict[str, Any] | None = None, commit_every: int = 1000,
                 commit_bytes: int = 64 << 20, filename_tmpl: str = DEFAULT_TEMPLATE,
                 start_index: int = 1):
        if kind != "videos":
            raise ValueError("the frames format holds video frames only (kind='videos')")
        super().__init__(out, classes=classes, kind=kind, created_by=created_by,
                         commit_every=commit_every, commit_bytes=commit_bytes)
        check_template(filename_tmpl)
        if start_index < 0:
            raise ValueError("start_index must be >= 0")
        self.filename_tmpl = filename_tmpl
        self.start_index = start_index

    @classmethod
    def merge_parts(cls, parts: Sequence[Reader], out: str | os.PathLike, **options: Any) -> Manifest:
        """The default re-pack, with the parts' frame file names (``filename_tmpl``, ``start_index``)."""
        extra = parts[0].manifest.extra
        return super().merge_parts(parts, out, filename_tmpl=extra.get("filename_tmpl", DEFAULT_TEMPLATE),
                                   start_index=int(extra.get("start_index", 1)), **options)

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
        final = self.workdir / frame_dir
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
            with open(tmp / self.filename_tmpl.format(self.start_index + j), "wb") as f:
                f.write(data)
        if j == total - 1:
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
            _fsync_append(self.workdir / VIDEOS_JOURNAL,
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
        atomic_write_bytes(self.workdir / CHECKSUMS_FILE, np.asarray(self.crcs, dtype="<u4").tobytes())
        atomic_write_bytes(self.workdir / LIST_NAME, rawframes_lines(manifest.videos).encode("utf-8"))
        manifest.extra.update({"filename_tmpl": self.filename_tmpl, "start_index": self.start_index,
                               "list_file": LIST_NAME})
        manifest.save(self.workdir)
        self._remove(self.workdir / VIDEOS_JOURNAL)

    def _close_handles(self) -> None:
        pass  # every frame file is closed as soon as it is written


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
        self._keys: list[str] | None = None
        self._crcs: np.ndarray | None = None

    @property
    def keys(self) -> list[str]:
        if self._keys is None:
            self._keys = [f"{v['key']}/{self.start_index + j}" for v in self.videos
                          for j in range(int(v["length"]))]
        return self._keys

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

    def _checksums(self) -> np.ndarray:
        if self._crcs is None:
            self._crcs = load_checksums(self.path / CHECKSUMS_FILE, len(self))
        return self._crcs

    def read(self, index: int) -> Record:
        path, v = self.frame_path(index)
        try:
            data = path.read_bytes()
        except OSError as e:
            raise CorruptData(str(path), f"cannot read frame ({e.strerror or e})",
                              position=f"sample {index}") from None
        if self.check_crc and crc32c(data) != int(self._checksums()[index]):
            raise CorruptData(str(path), "CRC32C mismatch", position=f"sample {index}")
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

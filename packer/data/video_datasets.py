"""The two video datasets (clip sampling lives in ``packer.data.clips``).

``FrameDataset`` reads mmaction2 rawframe folders through their list file;
``PackedVideoDataset`` reads any packed video output (its manifest's ``videos``). Both
decode only the chosen frames and return ``(clip, label)`` with ``clip`` a uint8 tensor
``T x C x H x W`` (or ``C x T x H x W``), and accept ``ClipRequest`` keys from a multigrid
batch sampler (per-sample ``num_frames``/``frame_interval``/``crop_size``).
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Union

import numpy as np
import torch

from packer.errors import CorruptData, UsageError
from packer.formats import open_reader
from packer.codecs.image import decode
from packer.data.clips import (LAYOUTS, RNG, ClipSampling, assemble_clip, random_resized_crop_box,
                               sample_frames)
from packer.data.requests import ClipRequest, split_request

__all__ = ["sample_frames", "ClipSampling", "FrameDataset", "PackedVideoDataset", "parse_rawframes",
           "RawframeInfo", "random_resized_crop_box", "assemble_clip", "LAYOUTS"]

# -- the shared dataset part ------------------------------------------------------------------
class _ClipDataset(torch.utils.data.Dataset):
    """What both video datasets share: sampling, the per-sample RNG, crops, layout, transform."""

    def __init__(self, sampling: Optional[ClipSampling], sampling_fields: dict[str, Any], *, layout: str,
                 crop_size: Optional[int], transform: Optional[Callable[[torch.Tensor], Any]],
                 seed: Optional[int]):
        if layout not in LAYOUTS:
            raise UsageError(f"layout must be one of {LAYOUTS}, not {layout!r}")
        if crop_size is not None and crop_size < 1:
            raise UsageError(f"crop_size must be >= 1, not {crop_size}")
        try:
            self.sampling = dataclasses.replace(sampling or ClipSampling(), **sampling_fields)
        except ValueError as e:
            raise UsageError(str(e)) from None
        self.layout = layout
        self.crop_size = crop_size
        self.transform = transform
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """With a ``seed``, clip choices depend on (seed, epoch, index): call once per epoch."""
        self.epoch = int(epoch)

    def _rng(self, index: int, epoch: Optional[int] = None) -> RNG:
        """The draws of clip ``index``; ``epoch`` (a request's) overrides ``set_epoch``'s."""
        if self.seed is None:
            return np.random  # numpy's global state, as mmaction2 (DataLoader seeds it per worker)
        epoch = self.epoch if epoch is None else int(epoch)
        state = np.random.SeedSequence([self.seed, epoch, index]).generate_state(1)[0]
        return np.random.RandomState(int(state))

    def _video(self, index: int) -> tuple[int, int]:
        """(total frames, label) of video ``index``."""
        raise NotImplementedError

    def _load(self, index: int, frame_inds: np.ndarray) -> list[np.ndarray]:
        """Decoded RGB frames (HxWx3 uint8) of video ``index`` for each distinct index."""
        raise NotImplementedError

    _start_index = 0

    def _request(self, key: Union[int, ClipRequest]) -> ClipRequest:
        """``key`` as a request for an index in ``[0, len)`` (negative ones count from the end)."""
        req = split_request(key)
        index = req.index + len(self) if req.index < 0 else req.index
        if not 0 <= index < len(self):
            raise IndexError(f"video index {req.index} out of range for {len(self)} videos")
        return req._replace(index=index)

    def clip_indices(self, key: Union[int, ClipRequest]) -> np.ndarray:
        """The frame indices ``__getitem__(key)`` reads (consumes the same draws)."""
        req = self._request(key)
        return self._indices(req, self._rng(req.index, req.epoch))

    def _indices(self, req: ClipRequest, rng: RNG) -> np.ndarray:
        total, _ = self._video(req.index)
        return self.sampling.indices(total, rng, start_index=self._start_index,
                                     clip_len=req.num_frames, frame_interval=req.frame_interval)

    def __getitem__(self, key: Union[int, ClipRequest]) -> tuple[Any, int]:
        req = self._request(key)
        index = req.index
        rng = self._rng(index, req.epoch)
        inds = self._indices(req, rng)
        unique, inverse = np.unique(inds, return_inverse=True)
        decoded = self._load(index, unique)
        try:
            clip = assemble_clip(decoded, inverse.reshape(-1), clip_len=req.num_frames or self.sampling.clip_len,
                                 layout=self.layout, crop_size=req.crop_size or self.crop_size,
                                 rng=None if self.sampling.test_mode else rng)
        except ValueError as e:
            raise CorruptData(self._where(index), str(e)) from None
        clip = torch.from_numpy(clip)
        _, label = self._video(index)
        if self.transform is not None:
            clip = self.transform(clip)
        return clip, label

    def _where(self, index: int) -> str:
        return f"video {index}"


# -- rawframe folders -------------------------------------------------------------------------
@dataclass(frozen=True)
class RawframeInfo:
    """One line of an mmaction2 rawframes list."""

    frame_dir: str
    total_frames: int
    label: int
    offset: int = 0


def parse_rawframes(list_file: str | os.PathLike, *, with_offset: bool = False) -> list[RawframeInfo]:
    """Parse an mmaction2 rawframes list as ``RawframeDataset.load_data_list`` does: each line
    split on whitespace into ``frame_dir [offset] total_frames label`` (blank lines skipped)."""
    list_file = Path(list_file)
    try:
        lines = list_file.read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise UsageError(f"{list_file}: cannot read list file ({e.strerror or e})") from None
    infos = []
    for lineno, line in enumerate(lines, 1):
        parts = line.strip().split()
        if not parts:
            continue
        want = 4 if with_offset else 3
        where = f"{list_file}:{lineno}"
        if len(parts) < want:
            raise CorruptData(where, f"expected 'frame_dir {'offset ' if with_offset else ''}"
                                     f"total_frames label', got {line.strip()!r}")
        if len(parts) > want:
            raise CorruptData(where, "more than one label (multi-label lists are not supported)")
        try:
            numbers = [int(p) for p in parts[1:]]
        except ValueError:
            raise CorruptData(where, f"non-integer field in {line.strip()!r}") from None
        offset = numbers.pop(0) if with_offset else 0
        total, label = numbers
        if total < 1:
            raise CorruptData(where, f"{parts[0]} has {total} frames")
        infos.append(RawframeInfo(parts[0], total, label, offset))
    return infos


class FrameDataset(_ClipDataset):
    """Clips from mmaction2 rawframe folders (``decode-frames`` output or any rawframes tree).

    Args:
        root: the folder the list's ``frame_dir`` paths are relative to (mmaction2's
            ``data_prefix``).
        list_file: the rawframes list (default ``root/rawframes.txt``).
        sampling: a ``ClipSampling`` (mmaction2 ``SampleFrames`` options); its fields may also
            be given as keywords (``clip_len``, ``frame_interval``, ``num_clips``, ``test_mode``,
            ``out_of_bound_opt``, ``twice_sample``, ``keep_tail_frames``, ``temporal_jitter``),
            which override ``sampling``'s.
        filename_tmpl: frame file names (mmaction2 default ``img_{:05}.jpg``).
        start_index: the number of each folder's first frame file (mmaction2 default 1).
        with_offset: list lines carry an offset before the frame count.
        layout: ``"TCHW"`` -> ``(num_clips*clip_len, 3, H, W)``; ``"CTHW"`` -> ``(3, clip_len, H, W)``,
            or ``(num_clips, 3, clip_len, H, W)`` when ``num_clips > 1`` (mmaction2's NCTHW).
        crop_size: crop every clip to this square (random-resized crop in training, centre crop
            in testing); a ``ClipRequest`` may set it per sample.
        transform: applied to the uint8 clip tensor.
        seed: None draws from numpy's global RNG (as mmaction2); an int makes each clip a
            function of (seed, epoch, index), whatever the workers (the epoch of a
            ``ClipRequest`` key when it has one, else ``set_epoch``'s).
    """

    def __init__(self, root: str | os.PathLike, list_file: str | os.PathLike | None = None, *,
                 sampling: Optional[ClipSampling] = None, filename_tmpl: str = "img_{:05}.jpg",
                 start_index: int = 1, with_offset: bool = False, layout: str = "TCHW",
                 crop_size: Optional[int] = None, transform: Optional[Callable[[torch.Tensor], Any]] = None,
                 seed: Optional[int] = None, **sampling_fields: Any):
        super().__init__(sampling, sampling_fields, layout=layout, crop_size=crop_size, transform=transform,
                         seed=seed)
        self.root = Path(root)
        if not self.root.is_dir():
            raise UsageError(f"{self.root}: frame root folder does not exist")
        self.list_file = Path(list_file) if list_file is not None else self.root / "rawframes.txt"
        self.videos = parse_rawframes(self.list_file, with_offset=with_offset)
        try:
            filename_tmpl.format(1)
        except (IndexError, KeyError, ValueError):
            raise UsageError(f"filename_tmpl {filename_tmpl!r} needs one number field") from None
        self.filename_tmpl = filename_tmpl
        self._start_index = start_index

    def __len__(self) -> int:
        return len(self.videos)

    def _video(self, index: int) -> tuple[int, int]:
        v = self.videos[index]
        return v.total_frames, v.label

    def _where(self, index: int) -> str:
        return str(self.root / self.videos[index].frame_dir)

    def _load(self, index: int, frame_inds: np.ndarray) -> list[np.ndarray]:
        v = self.videos[index]
        folder = self.root / v.frame_dir
        frames = []
        for i in frame_inds:
            path = folder / self.filename_tmpl.format(int(i) + v.offset)
            try:
                data = path.read_bytes()
            except OSError as e:
                raise CorruptData(str(path), f"cannot read frame ({e.strerror or e})") from None
            try:
                frames.append(decode(data))
            except ValueError as e:
                raise CorruptData(str(path), str(e)) from None
        return frames


# -- packed outputs ---------------------------------------------------------------------------
class PackedVideoDataset(_ClipDataset):
    """Clips from any packed video output (``decode-frames --to lmdb|hdf5|records|frames``),
    located through the manifest's ``videos`` entries; storage opens lazily per process.

    Arguments as ``FrameDataset`` (no list file or file names: the manifest has them), plus
    ``check_crc`` (verify each frame's CRC32C as it is read).
    """

    def __init__(self, path: str | os.PathLike, *, sampling: Optional[ClipSampling] = None,
                 layout: str = "TCHW", crop_size: Optional[int] = None,
                 transform: Optional[Callable[[torch.Tensor], Any]] = None, seed: Optional[int] = None,
                 check_crc: bool = True, **sampling_fields: Any):
        super().__init__(sampling, sampling_fields, layout=layout, crop_size=crop_size, transform=transform,
                         seed=seed)
        self.path = str(path)
        self.reader = open_reader(path, check_crc=check_crc)
        videos = self.reader.manifest.videos
        if self.reader.manifest.kind != "videos" or not videos:
            raise UsageError(f"{path}: not a packed video output (no videos in its manifest)")
        self._videos = [(int(v["start"]), int(v["length"]), int(v["label"])) for v in videos]
        self.keys = [v["key"] for v in videos]

    @property
    def classes(self) -> list[str]:
        """Class names, index = label."""
        return self.reader.classes

    def __len__(self) -> int:
        return len(self._videos)

    def _video(self, index: int) -> tuple[int, int]:
        _, length, label = self._videos[index]
        return length, label

    def _where(self, index: int) -> str:
        return f"{self.path} video {self.keys[index]!r}"

    def _load(self, index: int, frame_inds: np.ndarray) -> list[np.ndarray]:
        start = self._videos[index][0]
        frames = []
        for i in frame_inds:
            rec = self.reader.read(start + int(i))
            if rec.fmt == "raw":
                pixels = np.frombuffer(rec.data, dtype=np.uint8)
                frames.append(pixels.reshape(rec.height, rec.width, rec.channels))
                continue
            try:
                frames.append(decode(rec.data))
            except ValueError as e:
                raise CorruptData(self._where(index), f"frame {int(i)}: {e}") from None
        return frames

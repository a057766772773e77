"""Clip sampling exactly as mmaction2's ``SampleFrames``, and the two video datasets.

``sample_frames`` chooses frame indices the way mmaction2 (1.x) does for training and
testing: ``clip_len`` frames ``frame_interval`` apart in each of ``num_clips`` clips; with
``clip_len=1`` that is TSN segment sampling (one random frame per segment in training, the
segment middles in testing). With ``rng=np.random.RandomState(s)`` the draws are the ones
mmaction2 makes after ``np.random.seed(s)`` (the same calls in the same order).

``FrameDataset`` reads mmaction2 rawframe folders through their list file;
``PackedVideoDataset`` reads any packed video output (its manifest's ``videos``). Both
decode only the chosen frames and return ``(clip, label)`` with ``clip`` a uint8 tensor
``T x C x H x W`` (or ``C x T x H x W``), and accept ``ClipRequest`` keys from a multigrid
batch sampler (per-sample ``num_frames``/``frame_interval``/``crop_size``).
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Union

import cv2
import numpy as np
import torch

from ..errors import CorruptData, UsageError
from ..formats import open_reader
from ..imaging import decode
from .requests import ClipRequest, split_request

__all__ = ["sample_frames", "ClipSampling", "FrameDataset", "PackedVideoDataset", "parse_rawframes",
           "RawframeInfo", "random_resized_crop_box", "assemble_clip", "LAYOUTS"]

LAYOUTS = ("TCHW", "CTHW")
OUT_OF_BOUND = ("loop", "repeat_last")
RNG = Union[np.random.RandomState, Any]  # np.random.RandomState, or the np.random module itself


# -- sampling ---------------------------------------------------------------------------------
def _train_offsets(n: int, clip_len: int, interval: int, num_clips: int, keep_tail: bool,
                   rng: RNG) -> np.ndarray:
    span = clip_len * interval
    if keep_tail:
        avg = (n - span + 1) / float(num_clips)
        if n > span - 1:
            return (np.arange(num_clips) * avg + rng.uniform(0, avg, num_clips)).astype(np.int32)
        return np.zeros((num_clips,), dtype=np.int32)
    avg = (n - span + 1) // num_clips
    if avg > 0:
        return np.arange(num_clips) * avg + rng.randint(avg, size=num_clips)
    if n > max(num_clips, span):
        return np.sort(rng.randint(n - span + 1, size=num_clips))
    if avg == 0:
        return np.around(np.arange(num_clips) * ((n - span + 1.0) / num_clips))
    return np.zeros((num_clips,), dtype=np.int32)


def _test_offsets(n: int, clip_len: int, interval: int, num_clips: int, twice: bool) -> np.ndarray:
    if clip_len == 1:  # TSN: the middle of each segment (plus the segment starts when twice)
        avg = n / float(num_clips)
        base = np.arange(num_clips) * avg
        offsets = base + avg / 2.0
        return np.concatenate([offsets, base]) if twice else offsets
    max_offset = max(n - ((clip_len - 1) * interval + 1), 0)
    count = num_clips * (2 if twice else 1)
    if count > 1:
        if num_clips == 1:
            raise ValueError("twice_sample with num_clips=1 and clip_len>1 has no clip spacing "
                             "(mmaction2 divides by num_clips - 1)")
        return np.round(np.arange(count) * (max_offset / float(num_clips - 1)))
    return np.array([max_offset // 2])


def sample_frames(total_frames: int, *, clip_len: int, frame_interval: int = 1, num_clips: int = 1,
                  test_mode: bool = False, start_index: int = 0, out_of_bound_opt: str = "loop",
                  twice_sample: bool = False, keep_tail_frames: bool = False,
                  temporal_jitter: bool = False, rng: Optional[RNG] = None) -> np.ndarray:
    """Frame indices of ``num_clips`` clips of ``clip_len`` frames, as mmaction2's
    ``SampleFrames`` picks them (its ``frame_inds``: int32, ``start_index``-based, clips
    concatenated; ``twice_sample`` doubles the clips in test mode).

    Args:
        total_frames: frames in the video (> 0).
        rng: a ``np.random.RandomState`` (default: numpy's global one, as mmaction2).
    """
    if total_frames < 1:
        raise ValueError(f"total_frames must be >= 1, not {total_frames}")
    if clip_len < 1 or frame_interval < 1 or num_clips < 1:
        raise ValueError("clip_len, frame_interval and num_clips must be >= 1")
    if out_of_bound_opt not in OUT_OF_BOUND:
        raise ValueError(f"out_of_bound_opt must be one of {OUT_OF_BOUND}, not {out_of_bound_opt!r}")
    rng = np.random if rng is None else rng
    if test_mode:
        offsets = _test_offsets(total_frames, clip_len, frame_interval, num_clips, twice_sample)
    else:
        offsets = _train_offsets(total_frames, clip_len, frame_interval, num_clips, keep_tail_frames, rng)
    inds = np.concatenate(offsets[:, None] + np.arange(clip_len)[None, :] * frame_interval)
    if temporal_jitter:
        inds = inds + rng.randint(frame_interval, size=len(inds))
    inds = inds.reshape((-1, clip_len))
    if out_of_bound_opt == "loop":
        inds = np.mod(inds, total_frames)
    else:  # repeat_last: past the end, repeat the clip's last frame inside the video
        safe = inds < total_frames
        last = np.max(safe * inds, axis=1)
        inds = safe * inds + ((1 - safe).T * last).T
    return (np.concatenate(inds) + start_index).astype(np.int32)


@dataclass(frozen=True)
class ClipSampling:
    """The ``SampleFrames`` options of a dataset (see ``sample_frames``)."""

    clip_len: int = 1
    frame_interval: int = 1
    num_clips: int = 1
    test_mode: bool = False
    out_of_bound_opt: str = "loop"
    twice_sample: bool = False
    keep_tail_frames: bool = False
    temporal_jitter: bool = False

    def __post_init__(self) -> None:
        if self.clip_len < 1 or self.frame_interval < 1 or self.num_clips < 1:
            raise ValueError("clip_len, frame_interval and num_clips must be >= 1")
        if self.out_of_bound_opt not in OUT_OF_BOUND:
            raise ValueError(f"out_of_bound_opt must be one of {OUT_OF_BOUND}")

    def indices(self, total_frames: int, rng: RNG, *, start_index: int = 0,
                clip_len: Optional[int] = None, frame_interval: Optional[int] = None) -> np.ndarray:
        return sample_frames(total_frames, clip_len=clip_len or self.clip_len,
                             frame_interval=frame_interval or self.frame_interval,
                             num_clips=self.num_clips, test_mode=self.test_mode,
                             start_index=start_index, out_of_bound_opt=self.out_of_bound_opt,
                             twice_sample=self.twice_sample, keep_tail_frames=self.keep_tail_frames,
                             temporal_jitter=self.temporal_jitter, rng=rng)


# -- cropping ---------------------------------------------------------------------------------
def random_resized_crop_box(height: int, width: int, rng: RNG, *, area_range=(0.08, 1.0),
                            aspect_ratio_range=(3 / 4, 4 / 3),
                            max_attempts: int = 10) -> tuple[int, int, int, int]:
    """(top, left, h, w) of a random crop covering ``area_range`` of the frame with an aspect in
    ``aspect_ratio_range`` (log-uniform), as mmaction2's ``RandomResizedCrop``; center crop of
    the whole frame if no attempt fits."""
    area = height * width
    log_ratio = (math.log(aspect_ratio_range[0]), math.log(aspect_ratio_range[1]))
    for _ in range(max_attempts):
        target = rng.uniform(*area_range) * area
        ratio = math.exp(rng.uniform(*log_ratio))
        w = int(round(math.sqrt(target * ratio)))
        h = int(round(math.sqrt(target / ratio)))
        if 0 < w <= width and 0 < h <= height:
            top = int(rng.randint(0, height - h + 1))
            left = int(rng.randint(0, width - w + 1))
            return top, left, h, w
    side = min(height, width)
    return (height - side) // 2, (width - side) // 2, side, side


def assemble_clip(frames: list[np.ndarray], order: np.ndarray, *, clip_len: int, layout: str = "TCHW",
                  crop_size: Optional[int] = None, rng: Optional[RNG] = None) -> np.ndarray:
    """Frames (distinct HxWxC uint8 arrays) in ``order`` -> one channels-first uint8 array.

    ``layout="TCHW"``: ``(len(order), C, H, W)``; ``"CTHW"``: ``(C, clip_len, H, W)`` for one
    clip, ``(clips, C, clip_len, H, W)`` for several. With ``crop_size`` every frame is cropped
    the same way and resized to a square: a random-resized crop when ``rng`` is given
    (training), the centre square otherwise. Each distinct frame is cropped and split into
    channel planes once (OpenCV's SIMD split beats a strided transpose copy by 2x).
    """
    h, w = frames[0].shape[:2]
    if any(f.shape != frames[0].shape for f in frames):
        raise ValueError("frames of one clip differ in size")
    channels = frames[0].shape[2] if frames[0].ndim == 3 else 1
    if crop_size:
        if rng is not None:
            top, left, ch, cw = random_resized_crop_box(h, w, rng)
        else:
            side = min(h, w)
            top, left, ch, cw = (h - side) // 2, (w - side) // 2, side, side
        interp = cv2.INTER_AREA if ch * cw > crop_size * crop_size else cv2.INTER_LINEAR
        h = w = crop_size
    t = len(order)
    if layout == "TCHW":
        out = np.empty((t, channels, h, w), dtype=np.uint8)
        slots = [out[k] for k in range(t)]
    else:
        out = np.empty((t // clip_len, channels, clip_len, h, w), dtype=np.uint8)
        slots = [out[k // clip_len, :, k % clip_len] for k in range(t)]
    planes: dict[int, list[np.ndarray]] = {}
    for k, u in enumerate(order.tolist()):
        if u not in planes:
            img = frames[u]
            if crop_size:
                img = cv2.resize(img[top:top + ch, left:left + cw], (crop_size, crop_size), interpolation=interp)
            planes[u] = cv2.split(img) if channels > 1 else [img.reshape(h, w)]
        for c, plane in enumerate(planes[u]):
            slots[k][c] = plane
    if layout != "TCHW" and out.shape[0] == 1:
        out = out[0]
    return out


# -- the shared dataset part ------------------------------------------------------------------
class _ClipDataset(torch.utils.data.Dataset):
    """What both video datasets share: sampling, the per-sample RNG, crops, layout, transform."""

    def __init__(self, *, clip_len: int, frame_interval: int, num_clips: int, test_mode: bool,
                 out_of_bound_opt: str, twice_sample: bool, keep_tail_frames: bool, temporal_jitter: bool,
                 layout: str, crop_size: Optional[int], transform: Optional[Callable[[torch.Tensor], Any]],
                 seed: Optional[int]):
        if layout not in LAYOUTS:
            raise UsageError(f"layout must be one of {LAYOUTS}, not {layout!r}")
        if crop_size is not None and crop_size < 1:
            raise UsageError(f"crop_size must be >= 1, not {crop_size}")
        try:
            self.sampling = ClipSampling(clip_len, frame_interval, num_clips, test_mode, out_of_bound_opt,
                                         twice_sample, keep_tail_frames, temporal_jitter)
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
        clip_len, frame_interval, num_clips, test_mode, out_of_bound_opt, twice_sample,
            keep_tail_frames, temporal_jitter: mmaction2 ``SampleFrames`` options.
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
                 clip_len: int = 1, frame_interval: int = 1, num_clips: int = 1, test_mode: bool = False,
                 out_of_bound_opt: str = "loop", twice_sample: bool = False, keep_tail_frames: bool = False,
                 temporal_jitter: bool = False, filename_tmpl: str = "img_{:05}.jpg", start_index: int = 1,
                 with_offset: bool = False, layout: str = "TCHW", crop_size: Optional[int] = None,
                 transform: Optional[Callable[[torch.Tensor], Any]] = None, seed: Optional[int] = None):
        super().__init__(clip_len=clip_len, frame_interval=frame_interval, num_clips=num_clips,
                         test_mode=test_mode, out_of_bound_opt=out_of_bound_opt, twice_sample=twice_sample,
                         keep_tail_frames=keep_tail_frames, temporal_jitter=temporal_jitter, layout=layout,
                         crop_size=crop_size, transform=transform, seed=seed)
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

    def __init__(self, path: str | os.PathLike, *, clip_len: int = 1, frame_interval: int = 1,
                 num_clips: int = 1, test_mode: bool = False, out_of_bound_opt: str = "loop",
                 twice_sample: bool = False, keep_tail_frames: bool = False, temporal_jitter: bool = False,
                 layout: str = "TCHW", crop_size: Optional[int] = None,
                 transform: Optional[Callable[[torch.Tensor], Any]] = None, seed: Optional[int] = None,
                 check_crc: bool = True):
        super().__init__(clip_len=clip_len, frame_interval=frame_interval, num_clips=num_clips,
                         test_mode=test_mode, out_of_bound_opt=out_of_bound_opt, twice_sample=twice_sample,
                         keep_tail_frames=keep_tail_frames, temporal_jitter=temporal_jitter, layout=layout,
                         crop_size=crop_size, transform=transform, seed=seed)
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

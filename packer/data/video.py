"""Video on the training side: clip sampling, frame-list parsing, frame requests and the video datasets.

The per-sample request a batch sampler may send to a dataset instead of a plain index.

``MultigridBatchSampler`` yields lists of ``ClipRequest``; the video datasets
(``FrameDataset``, ``PackedVideoDataset``) accept either an ``int`` or a ``ClipRequest`` in
``__getitem__`` and then sample ``num_frames`` frames ``frame_interval`` apart and crop to
``crop_size`` (random-resized crop in training), so one plain ``DataLoader(dataset,
batch_sampler=...)`` yields batches whose shape changes batch by batch.

``epoch`` travels with the request because a ``DataLoader`` with ``persistent_workers=True``
keeps its workers' copies of the dataset for the whole run: ``dataset.set_epoch()`` in the
main process never reaches them, so a seeded dataset would draw the same clips (offsets and
crops) every epoch. The sampler knows the epoch; with it in the key, the draws of a seeded
dataset follow the sampler's ``set_epoch`` whatever the workers.

mmaction2 rawframes list files: ``frame_dir [offset] total_frames [label ...]`` lines, parsed as
mmaction2's ``RawframeDataset.load_data_list`` parses them.

Clip sampling exactly as mmaction2's ``SampleFrames``, crops and clip assembly.

``sample_frames`` chooses frame indices the way mmaction2 (1.x) does for training and
testing: ``clip_len`` frames ``frame_interval`` apart in each of ``num_clips`` clips; with
``clip_len=1`` that is TSN segment sampling (one random frame per segment in training, the
segment middles in testing). With ``rng=np.random.RandomState(s)`` the draws are the ones
mmaction2 makes after ``np.random.seed(s)`` (the same calls in the same order).
``assemble_clip`` turns decoded frames into one channels-first uint8 array.

The two video datasets (clip sampling lives in ``packer.data.video``).

``FrameDataset`` reads mmaction2 rawframe folders through their list file;
``PackedVideoDataset`` reads any packed video output (its manifest's ``videos``). Both
decode only the chosen frames and return ``(clip, label)`` with ``clip`` a uint8 tensor
``T x C x H x W`` (or ``C x T x H x W``), and accept ``ClipRequest`` keys from a multigrid
batch sampler (per-sample ``num_frames``/``frame_interval``/``crop_size``).

``sampling=`` takes a ``ClipSampling`` (mmaction2 ``SampleFrames`` options) or any sampler of
``packer.data.samplers`` (``SampleFrames(target_fps=...)``, ``DenseSampleFrames``,
``UntrimmedSampleFrames``); its fields may also be given as keywords. ``modality="Flow"`` reads optical flow (``decode-frames
--task flow|both``) as ``(T, 2, H, W)`` uint8 clips (x, y), as mmaction2's ``RawFrameDecode``
stacks them; ``multi_class=True`` returns mmaction2's multi-hot target (float32, ``num_classes``)
for multi-label videos. A video without a label (a label-less list line) has label -1.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, NamedTuple, Optional, Sequence, Union

import cv2
import numpy as np
import torch

from packer.codecs.flow import decode_grey
from packer.codecs.image import decode
from packer.codecs.video_copy import rotate_upright
from packer.codecs.video_pack import (CODECS, KEY, Run, StreamIndex, decode_frames_at, decode_indexed, index_mp4,
                                      plan_runs, run_packets, unpack_stream)
from packer.data import batch_memory
from packer.data.datasets import require_holds
from packer.errors import CorruptData, OutputChanged, PackerError, UsageError
from packer.formats.frames import FLOW_LIST_NAME, LIST_NAME, rawframes_lines, video_streams
from packer.formats.reader import output_identity
from packer.integrity import crc32c
from packer.manifest import MANIFEST_NAME, Manifest
from packer.remote import open_reader

__all__ = ["ClipRequest", "split_request", "RawframeInfo", "parse_rawframes", "sample_frames",
           "sampling_options", "train_offsets", "clip_frames", "bound_clips", "ClipSampling", "ClipOptions",
           "random_resized_crop_box", "assemble_clip", "ClipPackets", "collate_clips", "DECODE_ON", "LAYOUTS",
           "MODALITIES", "OUT_OF_BOUND", "RNG", "FrameDataset", "PackedVideoDataset"]

class ClipRequest(NamedTuple):
    """Fetch sample ``index`` as a clip of ``num_frames`` x ``crop_size``^2 (None = dataset default);
    ``epoch`` (None = the dataset's own ``set_epoch``) picks a seeded dataset's draws."""

    index: int
    num_frames: Optional[int] = None
    frame_interval: Optional[int] = None
    crop_size: Optional[int] = None
    epoch: Optional[int] = None


def split_request(key: "int | ClipRequest") -> ClipRequest:
    """Normalise a dataset key: an int becomes a request with every field left to the dataset."""
    if isinstance(key, ClipRequest):
        return key
    if isinstance(key, tuple) and len(key) in (4, 5):  # DataLoader may hand tuples back as tuples
        return ClipRequest(*key)
    return ClipRequest(int(key))

@dataclass(frozen=True)
class RawframeInfo:
    """One line of an mmaction2 rawframes list (``label`` -1 for a label-less line; ``labels``
    holds every label of a multi-label line)."""

    frame_dir: str
    total_frames: int
    label: int
    offset: int = 0
    labels: tuple[int, ...] = ()


def parse_rawframes(list_file: str | os.PathLike, *, with_offset: bool = False) -> list[RawframeInfo]:
    """Parse an mmaction2 rawframes list as ``RawframeDataset.load_data_list`` does: each line
    split on whitespace into ``frame_dir [offset] total_frames [label ...]`` (blank lines
    skipped; no label reads as -1, several as a multi-label line)."""
    list_file = Path(list_file)
    try:
        lines = list_file.read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise UsageError(f"{list_file}: cannot read list file ({e.strerror or e})") from e
    infos = []
    for lineno, line in enumerate(lines, 1):
        parts = line.strip().split()
        if not parts:
            continue
        want = 3 if with_offset else 2
        where = f"{list_file}:{lineno}"
        if len(parts) < want:
            raise CorruptData(where, f"expected 'frame_dir {'offset ' if with_offset else ''}"
                                     f"total_frames [label ...]', got {line.strip()!r}")
        try:
            numbers = [int(p) for p in parts[1:]]
        except ValueError:
            raise CorruptData(where, f"non-integer field in {line.strip()!r}") from None
        offset = numbers.pop(0) if with_offset else 0
        total, labels = numbers[0], tuple(numbers[1:]) or (-1,)
        if total < 1:
            raise CorruptData(where, f"{parts[0]} has {total} frames")
        infos.append(RawframeInfo(parts[0], total, labels[0], offset, labels))
    return infos

LAYOUTS = ("TCHW", "CTHW")
DECODE_ON = ("cpu", "gpu")  # where PackedVideoDataset's clips are decoded (gpu: by packer.data.gpu)
MODALITIES = ("RGB", "Flow")
OUT_OF_BOUND = ("loop", "repeat_last")
RNG = Union[np.random.RandomState, Any]  # np.random.RandomState, or the np.random module itself


# -- sampling ---------------------------------------------------------------------------------
def train_offsets(n: int, clip_len: int, interval: int, num_clips: int, keep_tail: bool,
                  rng: RNG) -> np.ndarray:
    """The first frame of each training clip, as mmaction2's ``SampleFrames._get_train_clips``
    (``interval`` may be fractional: ``SampleFrames(target_fps=...)`` passes a span)."""
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


def sampling_options(cls: type, sampling: Any, fields: dict[str, Any], total_frames: int) -> Any:
    """The options a frame-sampling function uses: ``sampling`` (an instance of ``cls``) with
    ``fields`` applied, or ``cls(**fields)``, which must then name ``clip_len``; checks
    ``total_frames`` first."""
    if sampling is None and "clip_len" not in fields:
        raise TypeError(f"needs clip_len (or a {cls.__name__})")
    if total_frames < 1:
        raise ValueError(f"total_frames must be >= 1, not {total_frames}")
    if not fields:
        return sampling
    return dataclasses.replace(sampling, **fields) if sampling is not None else cls(**fields)


def sample_frames(total_frames: int, sampling: Optional["ClipSampling"] = None, *, start_index: int = 0,
                  rng: Optional[RNG] = None, **sampling_fields: Any) -> np.ndarray:
    """Frame indices of ``num_clips`` clips of ``clip_len`` frames, as mmaction2's
    ``SampleFrames`` picks them (its ``frame_inds``: int32, ``start_index``-based, clips
    concatenated; ``twice_sample`` doubles the clips in test mode).

    Args:
        total_frames: frames in the video (> 0).
        sampling: a ``ClipSampling``; its fields may also be given as keywords (``clip_len``,
            which is then required, ``frame_interval``, ``num_clips``, ``test_mode``,
            ``out_of_bound_opt``, ``twice_sample``, ``keep_tail_frames``, ``temporal_jitter``).
        rng: a ``np.random.RandomState`` (default: numpy's global one, as mmaction2).
    """
    s = sampling_options(ClipSampling, sampling, sampling_fields, total_frames)
    clip_len, frame_interval, num_clips = s.clip_len, s.frame_interval, s.num_clips
    rng = np.random if rng is None else rng
    if s.test_mode:
        offsets = _test_offsets(total_frames, clip_len, frame_interval, num_clips, s.twice_sample)
    else:
        offsets = train_offsets(total_frames, clip_len, frame_interval, num_clips, s.keep_tail_frames, rng)
    return clip_frames(offsets, total_frames, s, start_index, rng)


def clip_frames(offsets: np.ndarray, total_frames: int, s: Any, start_index: int, rng: RNG) -> np.ndarray:
    """The frames of clips starting at ``offsets``: ``s.clip_len`` frames ``s.frame_interval``
    apart (each shifted by a random jitter below the interval when ``s.temporal_jitter``), the
    ones past the end bounded (``bound_clips``), as mmaction2's ``frame_inds``."""
    clip_len, frame_interval = s.clip_len, s.frame_interval
    inds = np.concatenate(offsets[:, None] + np.arange(clip_len)[None, :] * frame_interval)
    if s.temporal_jitter:
        inds = inds + rng.randint(frame_interval, size=len(inds))
    inds = bound_clips(inds, total_frames, clip_len, s.out_of_bound_opt)
    return (np.concatenate(inds) + start_index).astype(np.int32)


def bound_clips(inds: np.ndarray, total: int, clip_len: int, out_of_bound_opt: str) -> np.ndarray:
    """Clips (rows of ``clip_len``) with indices past the end looped or clamped, as mmaction2."""
    inds = inds.reshape((-1, clip_len))
    if out_of_bound_opt == "loop":
        return np.mod(inds, total)
    safe = inds < total  # repeat_last: past the end, repeat the clip's last frame inside the video
    last = np.max(safe * inds, axis=1)
    return safe * inds + ((1 - safe).T * last).T


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
            raise ValueError(f"out_of_bound_opt must be one of {OUT_OF_BOUND}, not {self.out_of_bound_opt!r}")

    def indices(self, total_frames: int, rng: RNG, *, start_index: int = 0, fps: Optional[float] = None,
                clip_len: Optional[int] = None, frame_interval: Optional[int] = None) -> np.ndarray:
        """``sample_frames`` with these options (``fps`` is for samplers that use it)."""
        override = {k: v for k, v in (("clip_len", clip_len), ("frame_interval", frame_interval)) if v}
        return sample_frames(total_frames, self, start_index=start_index, rng=rng, **override)


@dataclass(frozen=True)
class ClipOptions:
    """What a video dataset returns for each clip (see ``FrameDataset``): layout, crop, draws, labels.

    Args:
        layout: ``"TCHW"`` or ``"CTHW"``.
        crop_size: crop every clip to this square (None: no crop).
        seed: None draws from numpy's global RNG (as mmaction2); an int makes each clip a
            function of (seed, epoch, index).
        modality: ``"RGB"`` or ``"Flow"``.
        multi_class, num_classes: return mmaction2's multi-hot target.
    """

    layout: str = "TCHW"
    crop_size: Optional[int] = None
    seed: Optional[int] = None
    modality: str = "RGB"
    multi_class: bool = False
    num_classes: Optional[int] = None

    def __post_init__(self) -> None:  # the usual choice checks, as every options class has them
        if self.modality not in MODALITIES:
            raise UsageError(f"modality must be one of {MODALITIES}, not {self.modality!r}")
        if self.multi_class and (self.num_classes is None or self.num_classes < 1):
            raise UsageError("multi_class=True needs num_classes (as mmaction2)")
        if self.layout not in LAYOUTS:
            raise UsageError(f"layout must be one of {LAYOUTS}, not {self.layout!r}")
        if self.crop_size is not None and self.crop_size < 1:
            raise UsageError(f"crop_size must be >= 1, not {self.crop_size}")


# -- cropping ---------------------------------------------------------------------------------
def random_resized_crop_box(height: int, width: int, rng: RNG, *, area_range=(0.08, 1.0),
                            aspect_ratio_range=(3 / 4, 4 / 3),
                            max_attempts: int = 10) -> tuple[int, int, int, int]:
    """(top, left, h, w) of a random crop covering ``area_range`` of the frame with an aspect in
    ``aspect_ratio_range`` (log-uniform), as mmaction2's ``RandomResizedCrop``; center crop of
    the whole frame if no attempt fits."""
    # Not crops.sample_box on purpose: mmaction2's draws (RandomState.randint, centre-square
    # fallback) differ from torchvision's (Generator.integers, aspect-clamped fallback).
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
                  crop_size: Optional[int] = None, rng: Optional[RNG] = None,
                  box: Optional[tuple[int, int, int, int]] = None) -> np.ndarray:
    """Frames (distinct HxWxC uint8 arrays) in ``order`` -> one channels-first uint8 array.

    ``layout="TCHW"``: ``(len(order), C, H, W)``; ``"CTHW"``: ``(C, clip_len, H, W)`` for one
    clip, ``(clips, C, clip_len, H, W)`` for several. With ``crop_size`` every frame is cropped
    the same way and resized to a square: a random-resized crop when ``rng`` is given
    (training), the centre square otherwise; ``box`` (top, left, height, width): that crop,
    drawn earlier (``packer.data.gpu``'s clips). Each distinct frame is cropped and split into
    channel planes once (OpenCV's SIMD split beats a strided transpose copy by 2x).
    """
    h, w = frames[0].shape[:2]
    if any(f.shape != frames[0].shape for f in frames):
        raise ValueError("frames of one clip differ in size")
    channels = frames[0].shape[2] if frames[0].ndim == 3 else 1
    if crop_size:
        if box is not None:
            top, left, ch, cw = box
        elif rng is not None:
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

_CLIP_FIELDS = frozenset(f.name for f in dataclasses.fields(ClipOptions))


# The fields both video datasets also take as keywords: ClipOptions' and the common sampling ones.
_SHORTHANDS = _CLIP_FIELDS | {"clip_len", "frame_interval", "num_clips", "test_mode"}


def _split_fields(fields: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The shorthand keywords given (not None) -> (``ClipOptions`` fields, the sampler's fields)."""
    given = {k: v for k, v in fields.items() if v is not None}
    return ({k: v for k, v in given.items() if k in _CLIP_FIELDS},
            {k: v for k, v in given.items() if k not in _CLIP_FIELDS})


def _clip_options(options: Optional[ClipOptions], fields: dict[str, Any]) -> ClipOptions:
    return dataclasses.replace(options, **fields) if options is not None else ClipOptions(**fields)


@dataclass(frozen=True)
class ClipPackets:
    """One clip as its loader worker chose it, not yet decoded: the packets of each decoder run
    (``plan_runs``' selection, in decode order), which decoded frame goes where, and the crop.

    ``order``: per clip position, the index of its frame among the runs' wanted frames (sorted);
    ``crop``: the random crop box (top, left, height, width) on the upright frame, None for the
    centre square (with ``crop_size``) or no crop; ``size``: the upright frame (height, width)
    the manifest records, which every decoded frame must have."""

    where: str
    decoder: str
    extradata: bytes
    runs: tuple[Run, ...]
    packets: tuple[bytes, ...]  # every run's fed packets, run after run
    order: np.ndarray
    clip_len: int
    layout: str
    crop_size: Optional[int]
    crop: Optional[tuple[int, int, int, int]]
    rotation: int
    size: tuple[int, int]

    def run_packets(self) -> list[tuple[Run, tuple[bytes, ...]]]:
        """Each run with its packets."""
        out, at = [], 0
        for run in self.runs:
            out.append((run, self.packets[at:at + len(run.fed)]))
            at += len(run.fed)
        return out


def collate_clips(batch: Sequence[tuple[ClipPackets, Any]]) -> tuple[list[ClipPackets], Any]:
    """A ``DataLoader``/``Loader`` batch of ``(ClipPackets, target)`` -> (the list, the targets collated)."""
    return [c for c, _ in batch], torch.utils.data.default_collate([t for _, t in batch])


# -- the shared dataset part ------------------------------------------------------------------
class _ClipDataset(torch.utils.data.Dataset):
    """What both video datasets share: sampling, the per-sample RNG, crops, layout, transform."""

    def __init__(self, sampling: Any, sampling_fields: dict[str, Any], options: ClipOptions, *,
                 transform: Optional[Callable[[torch.Tensor], Any]]):
        self.options = options
        self.modality = options.modality
        self.multi_class = options.multi_class
        self.num_classes = options.num_classes
        if sampling is not None and not callable(getattr(sampling, "indices", None)):
            raise UsageError(f"sampling must be a ClipSampling or a packer.data.samplers sampler, not {sampling!r}")
        try:
            self.sampling = dataclasses.replace(sampling or ClipSampling(), **sampling_fields)
        except ValueError as e:
            raise UsageError(str(e)) from e
        except TypeError as e:  # a field this sampler does not have
            raise UsageError(f"{type(sampling or ClipSampling()).__name__}: {e}") from e
        self.layout = options.layout
        self.crop_size = options.crop_size
        self.transform = transform
        self.seed = options.seed
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

    def _video(self, index: int) -> tuple[int, Any]:
        """(total frames, label or tuple of labels) of video ``index``."""
        raise NotImplementedError

    def _fps(self, index: int) -> Optional[float]:
        """The frame rate of video ``index`` when known (``SampleFrames(target_fps=...)``)."""
        return None

    def _target(self, label: Any) -> Any:
        """The label as returned: an int, or mmaction2's multi-hot float32 vector."""
        labels = label if isinstance(label, tuple) else (label,)
        if not self.multi_class:
            if len(labels) != 1:
                raise UsageError(f"a video has {len(labels)} labels: pass multi_class=True, num_classes=N")
            return labels[0]
        target = torch.zeros(self.num_classes)
        for x in labels:
            if x >= self.num_classes:
                raise UsageError(f"label {x} is not below num_classes={self.num_classes}")
            if x >= 0:  # -1: no label (mmaction2 would set the last class here)
                target[x] = 1.0
        return target

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
        return self.sampling.indices(total, rng, start_index=self._start_index, fps=self._fps(req.index),
                                     clip_len=req.num_frames, frame_interval=req.frame_interval)

    def __getitem__(self, key: Union[int, ClipRequest]) -> tuple[Any, int]:
        batch_memory.use_in_worker()
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
            raise CorruptData(self._where(index), str(e)) from e
        clip = torch.from_numpy(clip)
        _, label = self._video(index)
        if self.transform is not None:
            clip = self.transform(clip)
        return clip, self._target(label)

    def _where(self, index: int) -> str:
        return f"video {index}"


# -- rawframe folders -------------------------------------------------------------------------
def _manifest_extra(root: Path) -> dict[str, Any]:
    """``extra`` of the packer manifest in ``root`` (a decode-frames output), or {}."""
    try:
        return dict(json.loads((root / "packer.json").read_text(encoding="utf-8")).get("extra") or {})
    except (OSError, ValueError, AttributeError):
        return {}


class FrameDataset(_ClipDataset):
    """Clips from mmaction2 rawframe folders (``decode-frames`` output or any rawframes tree).

    Args:
        root: the folder the list's ``frame_dir`` paths are relative to (mmaction2's
            ``data_prefix``).
        list_file: the rawframes list (default ``root/rawframes.txt``, or
            ``root/rawframes_flow.txt`` for ``modality="Flow"``).
        sampling: a ``ClipSampling`` (mmaction2 ``SampleFrames`` options) or a sampler of
            ``packer.data.samplers``; ``clip_len``, ``frame_interval``, ``num_clips`` and
            ``test_mode`` may also be given as keywords, which override its own (the other
            fields, ``out_of_bound_opt``, ``twice_sample``, ..., are set on the object).
            Rawframe lists carry no frame rate: ``SampleFrames(target_fps=...)`` samples with
            the ratio 1, as mmaction2's ``RawframeDataset`` does.
        options: a ``ClipOptions`` (``layout``, ``crop_size``, ``seed``, ``modality``,
            ``multi_class``, ``num_classes``, described below); its fields may also be given as
            keywords, which override its own. A shorthand keyword left at None keeps the
            object's value (or the default).
        filename_tmpl: frame file names (mmaction2 defaults ``img_{:05}.jpg``, and
            ``{}_{:05d}.jpg`` for flow: direction ``x``/``y``, then number).
        start_index: the number of each folder's first frame file (mmaction2 default 1).
        with_offset: list lines carry an offset before the frame count.
        layout: ``"TCHW"`` -> ``(num_clips*clip_len, C, H, W)``; ``"CTHW"`` -> ``(C, clip_len, H, W)``,
            or ``(num_clips, C, clip_len, H, W)`` when ``num_clips > 1`` (mmaction2's NCTHW);
            C is 3 (RGB) or 2 (flow x, y).
        crop_size: crop every clip to this square (random-resized crop in training, centre crop
            in testing); a ``ClipRequest`` may set it per sample.
        transform: applied to the uint8 clip tensor.
        seed: None draws from numpy's global RNG (as mmaction2); an int makes each clip a
            function of (seed, epoch, index), whatever the workers (the epoch of a
            ``ClipRequest`` key when it has one, else ``set_epoch``'s).
        modality: ``"RGB"`` or ``"Flow"``.
        multi_class, num_classes: return mmaction2's multi-hot target.
        check_crc: when ``root`` is a ``decode-frames`` output (it has ``packer.json``), check
            each frame read against the output's ``checksums.bin`` and, for its own
            list file (``rawframes.txt``, or the flow list), every line (frames, labels) against the manifest at open, like
            every other reader: damage is a ``CorruptData`` naming the file, never a wrong clip.
            ``False`` opts out. A plain mmaction2 tree has no checksums to check.
        version: of a ``decode-frames`` output that was appended to, the version to read, its
            videos taken from that version's manifest instead of a list file (None: the list;
            docs/append.md). A dataset opened before an append keeps reading its videos.
    """

    def __init__(self, root: str | os.PathLike, list_file: str | os.PathLike | None = None, *,
                 sampling: Any = None, options: Optional[ClipOptions] = None, filename_tmpl: Optional[str] = None,
                 start_index: int = 1, with_offset: bool = False,
                 transform: Optional[Callable[[torch.Tensor], Any]] = None, check_crc: bool = True,
                 clip_len: Optional[int] = None, frame_interval: Optional[int] = None,
                 num_clips: Optional[int] = None, test_mode: Optional[bool] = None, layout: Optional[str] = None,
                 crop_size: Optional[int] = None, seed: Optional[int] = None, modality: Optional[str] = None,
                 multi_class: Optional[bool] = None, num_classes: Optional[int] = None,
                 version: Optional[int] = None):
        clip_fields, sampling_fields = _split_fields({k: v for k, v in locals().items() if k in _SHORTHANDS})
        super().__init__(sampling, sampling_fields, _clip_options(options, clip_fields), transform=transform)
        modality = self.modality
        self.root = Path(root)
        if not self.root.is_dir():
            raise UsageError(f"{self.root}: frame root folder does not exist")
        self._require_frame_folders()
        self._version = version
        if version is not None and (list_file is not None or not (self.root / MANIFEST_NAME).is_file()):
            raise UsageError(f"{self.root}: version= reads a decode-frames output's version from its manifest "
                             "(no list_file)")
        flow = modality == "Flow"
        extra = _manifest_extra(self.root) if flow else {}
        default_list = extra.get("flow_list_file", "rawframes_flow.txt") if flow else "rawframes.txt"
        self.list_file = Path(list_file) if list_file is not None else self.root / default_list
        # Frames are read by path: see _check_root. A packer output is never changed in place
        # (device, inode, ctime); any other rawframes tree may be added to (device, inode).
        identity = output_identity(self.root)
        packed = (self.root / "packer.json").is_file()
        self._identity = identity if packed or identity is None else identity[:2]
        self.videos = (parse_rawframes(self.list_file, with_offset=with_offset) if version is None
                       else self._version_videos())
        self._check_root()
        if filename_tmpl is None:
            filename_tmpl = extra.get("flow_tmpl", "{}_{:05d}.jpg") if flow else "img_{:05}.jpg"
        try:
            filename_tmpl.format("x", 1) if flow else filename_tmpl.format(1)
        except (IndexError, KeyError, ValueError):
            raise UsageError(f"filename_tmpl {filename_tmpl!r} needs "
                             f"{'a direction field and ' if flow else ''}one number field") from None
        self.filename_tmpl = filename_tmpl
        self._start_index = start_index
        self.check_crc = check_crc
        self._packed = None  # the frames output's reader, when root is one and check_crc
        self._entries: dict[str, dict[str, Any]] = {}  # frame_dir -> its manifest video entry
        self._names: dict[str, dict[str, int]] = {}  # frame_dir -> {file name: position}, on demand
        if check_crc and (self.root / MANIFEST_NAME).is_file():
            self._open_packed()

    def _version_videos(self, reader: Any = None) -> list[RawframeInfo]:
        """The rawframes lines of the version asked for (``reader``'s), from its manifest."""
        col = 1 if self.modality == "Flow" else 0
        infos = []
        for v in (reader or open_reader(self.root, version=self._version)).videos:
            labels = tuple(int(x) for x in v.get("labels") or [v["label"]])
            infos.append(RawframeInfo(v["frame_dir"], video_streams(v)[col], labels[0], 0, labels))
        return infos

    def _require_frame_folders(self) -> None:
        """``UsageError`` naming the class to use when ``root`` is a packer output other than
        frame folders (``decode-frames --to frames``); a damaged manifest is left to the reads."""
        try:
            manifest = Manifest.load(self.root) if (self.root / MANIFEST_NAME).is_file() else None
        except PackerError:
            return
        if manifest is None:
            return
        require_holds(manifest, self.root, "FrameDataset", ("frames",))
        if manifest.format != "frames":
            raise UsageError(f"{self.root}: FrameDataset reads frame folders (decode-frames --to frames), "
                             f"this decode-frames output is packed as {manifest.format}; use PackedVideoDataset")

    def _open_packed(self) -> None:
        reader = open_reader(self.root, version=self._version)
        if reader.format_name != "frames":
            return
        self._packed = reader
        self._entries = {v["frame_dir"]: v for v in reader.videos}
        own = reader.manifest.extra.get("flow_list_file", FLOW_LIST_NAME) if self.modality == "Flow" else LIST_NAME
        if self._version is None and self.list_file.resolve() == (self.root / own).resolve() and reader.grown:
            # an appended output: its own list is its latest version's, which an append in
            # progress rewrites; the version this reader opened gives the videos
            self._version = reader.version
            self.videos = self._version_videos(reader)
        elif self._version is None and self.list_file.resolve() == (self.root / own).resolve():
            # The output's own list: every line must be the manifest's entry (labels included).
            try:
                text = self.list_file.read_text(encoding="utf-8")
            except (OSError, ValueError) as e:
                raise CorruptData(str(self.list_file), f"cannot read list file ({e})") from e
            if text != rawframes_lines(reader.videos, self.modality):
                raise CorruptData(str(self.list_file), f"does not match the manifest's videos "
                                  f"({reader.path / MANIFEST_NAME}): the list was changed or damaged")

    def _check_frame(self, path: Path, data: bytes) -> None:
        """CorruptData unless ``data`` has the CRC32C the frames output recorded for ``path``."""
        folder = path.parent.relative_to(self.root).as_posix()
        names = self._names.get(folder)
        if names is None:
            v = self._entries.get(folder)
            if v is None:
                return  # a folder the packed output does not hold (a list over other frames)
            start = int(v["start"])
            names = self._names[folder] = {self._packed._name(v, j)[0]: start + j for j in range(int(v["length"]))}
        position = names.get(path.name)
        if position is None:
            raise CorruptData(str(path), "not a frame the packed output holds")
        if crc32c(data) != int(self._packed._checksums()[self._packed._check_index(position)]):
            raise CorruptData(str(path), "CRC32C mismatch", position=f"sample {position}")

    def __len__(self) -> int:
        return len(self.videos)

    def _video(self, index: int) -> tuple[int, Any]:
        v = self.videos[index]
        return v.total_frames, v.labels if len(v.labels) > 1 else v.label

    def _where(self, index: int) -> str:
        return str(self.root / self.videos[index].frame_dir)

    def _check_root(self) -> None:
        """The frame root is still the folder the list was read from: a ``decode-frames
        --overwrite`` renames a new one over it, whose frames must not fill the old list."""
        now = output_identity(self.root)
        if self._identity is not None and (now[:len(self._identity)] if now else None) != self._identity:
            packed = getattr(self, "_packed", None)
            if packed is None:
                raise OutputChanged(str(self.root))
            packed._check_unchanged()  # only appended to: its version's frames are still there (docs/append.md)
            self._identity = now

    def _read(self, path: Path, flow: bool) -> np.ndarray:
        try:
            data = path.read_bytes()
        except OSError as e:
            self._check_root()
            raise CorruptData(str(path), f"cannot read frame ({e.strerror or e})") from e
        self._check_root()
        if self._packed is not None:
            self._check_frame(path, data)
        try:
            return decode_grey(data) if flow else decode(data)
        except ValueError as e:
            raise CorruptData(str(path), str(e)) from e

    def _load(self, index: int, frame_inds: np.ndarray) -> list[np.ndarray]:
        v = self.videos[index]
        folder = self.root / v.frame_dir
        if self.modality == "Flow":  # x and y stacked per frame, as mmaction2's RawFrameDecode
            return [np.stack([self._read(folder / self.filename_tmpl.format(d, int(i) + v.offset), True)
                              for d in "xy"], axis=-1) for i in frame_inds]
        return [self._read(folder / self.filename_tmpl.format(int(i) + v.offset), False) for i in frame_inds]


# -- packed outputs ---------------------------------------------------------------------------
class PackedVideoDataset(_ClipDataset):
    """Clips from any packed video output (``decode-frames --to lmdb|hdf5|records|frames``, or
    ``pack-videos``: videos kept as H.264/HEVC/AV1 or, with ``--copy``, as the source coded them,
    each clip decoding only the keyframe intervals that hold its frames, by the stored frame index;
    ``pack-videos --to files``: plain MP4 files, indexed from their packets when first read),
    located through the manifest's ``videos`` entries; storage opens lazily per process.

    Arguments as ``FrameDataset`` (no list file or file names: the manifest has them), plus
    ``check_crc`` (verify each frame's CRC32C as it is read), for a URL ``path``, ``remote``
    (a ``packer.remote.RemoteOptions``: cache folder, access mode, retries; docs/remote.md), and
    ``version``: of an output that was appended to, the version to read (None: the latest;
    docs/append.md); the dataset reads its version's videos whatever is appended later.
    ``decode_on="gpu"`` (a ``pack-videos`` output): ``__getitem__`` chooses the clip and its
    packets without decoding and returns ``(ClipPackets, target)``, for ``GpuClipDecode`` to
    decode on the GPU (``packer.data.gpu``; batch with ``collate_fn=collate_clips``).
    ``num_classes`` defaults to the manifest's class count; ``SampleFrames(target_fps=...)`` uses
    each video's stored fps.
    """

    def __init__(self, path: str | os.PathLike, *, sampling: Any = None, options: Optional[ClipOptions] = None,
                 transform: Optional[Callable[[torch.Tensor], Any]] = None, check_crc: bool = True,
                 remote: Any = None, clip_len: Optional[int] = None, frame_interval: Optional[int] = None,
                 num_clips: Optional[int] = None, test_mode: Optional[bool] = None, layout: Optional[str] = None,
                 crop_size: Optional[int] = None, seed: Optional[int] = None, modality: Optional[str] = None,
                 multi_class: Optional[bool] = None, num_classes: Optional[int] = None,
                 version: Optional[int] = None, decode_on: str = "cpu"):
        clip_fields, sampling_fields = _split_fields({k: v for k, v in locals().items() if k in _SHORTHANDS})
        if decode_on not in DECODE_ON:
            raise UsageError(f"decode_on must be one of {DECODE_ON}, not {decode_on!r}")
        self.decode_on = decode_on
        self.path = str(path)
        self.reader = open_reader(path, check_crc=check_crc, remote=remote, version=version)
        given = {**(dataclasses.asdict(options) if options is not None else {}), **clip_fields}
        if given.get("multi_class") and given.get("num_classes") is None:
            clip_fields["num_classes"] = len(self.reader.classes)
        super().__init__(sampling, sampling_fields, _clip_options(options, clip_fields), transform=transform)
        modality = self.modality
        videos = self.reader.manifest.videos
        require_holds(self.reader.manifest, path, "PackedVideoDataset", ("frames", "videos"))
        if not videos:
            raise UsageError(f"{path}: not a packed video output (no videos in its manifest)")
        flow = modality == "Flow"
        # a pack-videos output: one sample per video, its frames decoded by the stored index
        self.encoded = all("video_frames" in v for v in videos) if videos else False
        if self.encoded and flow:
            raise UsageError(f"{path}: a pack-videos output holds RGB video only, not Flow")
        # ``--to files``: plain MP4 files, indexed from their packets when first read in a process
        self.plain = self.reader.manifest.format == "files"
        self._indexes: dict[int, Any] = {}
        # ``--copy``: a source stream kept as coded; its frames are turned upright when read
        self._rotation = [int(v.get("rotation") or 0) if v.get("copy") else 0 for v in videos]
        self._videos = []  # (first sample of the stream, frames, label(s), fps)
        for v in videos:
            rgb, flows = (int(v["video_frames"]), 0) if self.encoded else video_streams(v)
            labels = tuple(int(x) for x in v["labels"]) if v.get("labels") else int(v["label"])
            start = int(v["start"]) + (rgb if flow else 0)
            self._videos.append((start, flows if flow else rgb, labels, v.get("fps")))
        empty = [v["key"] for v, (_, n, _, _) in zip(videos, self._videos) if n < 1]
        if empty:
            raise UsageError(f"{path}: {len(empty)} videos hold no {modality} frames (e.g. {empty[0]!r})"
                             + ("; decode with --task flow or both" if flow else ""))
        self.keys = [v["key"] for v in videos]
        if decode_on == "gpu":
            if not self.encoded:
                raise UsageError(f"{path}: decode_on='gpu' decodes pack-videos outputs (video streams), "
                                 "not frame packs")
            if transform is not None:
                raise UsageError("decode_on='gpu' returns packets: apply the transform to GpuClipDecode's clips")
        self._sizes = [(int(v.get("height") or 0), int(v.get("width") or 0)) for v in videos]
        if decode_on == "gpu" and not all(h and w for h, w in self._sizes):
            raise UsageError(f"{path}: decode_on='gpu' draws crops from each video's size, which its manifest lacks")

    @property
    def classes(self) -> list[str]:
        """Class names, index = label."""
        return self.reader.classes

    def __getitem__(self, key: Union[int, ClipRequest]) -> tuple[Any, Any]:
        if self.decode_on == "cpu":
            return super().__getitem__(key)
        req = self._request(key)
        index = req.index
        rng = self._rng(index, req.epoch)
        inds = self._indices(req, rng)  # the CPU path's draws, in its order: frames, then the crop
        unique, inverse = np.unique(inds, return_inverse=True)
        crop_size = req.crop_size or self.crop_size
        size = self._sizes[index]
        box = random_resized_crop_box(*size, rng) if crop_size and not self.sampling.test_mode else None
        start = self._videos[index][0]
        rec = self.reader.read(start)
        try:
            mp4, stream = ((memoryview(rec.data), self._plain_index(index, rec.data)) if self.plain
                           else unpack_stream(rec.data))
            runs = tuple(plan_runs(stream, [int(i) for i in unique]))
        except (ValueError, IndexError) as e:
            raise CorruptData(self._where(index), f"sample {start}: {e}") from None
        packets = tuple(p for run in runs for p in run_packets(mp4, stream, run))
        _, label = self._video(index)
        clip = ClipPackets(self._where(index), stream.decoder, stream.extradata, runs, packets, inverse.reshape(-1),
                           req.num_frames or self.sampling.clip_len, self.layout, crop_size, box,
                           0 if self.plain else self._rotation[index], size)
        return clip, self._target(label)

    def __len__(self) -> int:
        return len(self._videos)

    def _video(self, index: int) -> tuple[int, Any]:
        _, length, label, _ = self._videos[index]
        return length, label

    def _fps(self, index: int) -> Optional[float]:
        fps = self._videos[index][3]
        return float(fps) if fps else None

    def _where(self, index: int) -> str:
        return f"{self.path} video {self.keys[index]!r}"

    def _decode(self, index: int, position: int, flow: bool) -> np.ndarray:
        rec = self.reader.read(position)
        if rec.fmt == "raw":
            return np.frombuffer(rec.data, dtype=np.uint8).reshape(rec.height, rec.width, rec.channels)
        try:
            return decode_grey(rec.data) if flow else decode(rec.data)
        except ValueError as e:
            raise CorruptData(self._where(index), f"sample {position}: {e}") from e

    def _plain_index(self, index: int, mp4: bytes) -> Any:
        """The frame index of plain video file ``index`` (built from its packets once per
        process), checked against the frame count the manifest recorded when it was verified."""
        got = self._indexes.get(index)
        if got is None:
            v = self.reader.manifest.videos[index]
            got = index_mp4(mp4, CODECS[v.get("codec", "h264")][1], float(v.get("fps") or 0) or None)
            if v.get("demoted_keyframes"):  # flagged keyframes the pack-time check found no seek points
                flags = got.flags.copy()
                flags[np.asarray(v["demoted_keyframes"], dtype=np.int64)] &= ~KEY & 0xFF
                got = StreamIndex(got.packets, flags, got.extradata, got.decoder, got.fps)
            if got.frames != self._videos[index][1]:
                raise ValueError(f"the file holds {got.frames} frames, its manifest entry {self._videos[index][1]}")
            if len(self._indexes) >= 4096:  # a bounded cache: a few KB each
                self._indexes.clear()
            self._indexes[index] = got
        return got

    def _load(self, index: int, frame_inds: np.ndarray) -> list[np.ndarray]:
        start = self._videos[index][0]
        if self.encoded:  # decode only the GOPs holding the frames, from the stored index
            rec = self.reader.read(start)
            # reuse: into one array per thread, copied out by assemble_clip before the next clip
            try:
                if self.plain:
                    return decode_indexed(rec.data, self._plain_index(index, rec.data), [int(i) for i in frame_inds],
                                          reuse=True)
                return rotate_upright(decode_frames_at(rec.data, [int(i) for i in frame_inds], reuse=True),
                                      self._rotation[index])
            except (ValueError, IndexError) as e:
                raise CorruptData(self._where(index), f"sample {start}: {e}") from None
        if self.modality == "Flow":  # flow frame i is the samples x, y at start + 2i, 2i + 1
            return [np.stack([self._decode(index, start + 2 * int(i) + d, True) for d in (0, 1)], axis=-1)
                    for i in frame_inds]
        return [self._decode(index, start + int(i), False) for i in frame_inds]

"""Clip sampling exactly as mmaction2's ``SampleFrames``, crops and clip assembly.

``sample_frames`` chooses frame indices the way mmaction2 (1.x) does for training and
testing: ``clip_len`` frames ``frame_interval`` apart in each of ``num_clips`` clips; with
``clip_len=1`` that is TSN segment sampling (one random frame per segment in training, the
segment middles in testing). With ``rng=np.random.RandomState(s)`` the draws are the ones
mmaction2 makes after ``np.random.seed(s)`` (the same calls in the same order).
``assemble_clip`` turns decoded frames into one channels-first uint8 array.
"""
from __future__ import annotations

import math
import dataclasses
from dataclasses import dataclass
from typing import Any, Optional, Union

import cv2
import numpy as np

from packer.errors import UsageError

__all__ = ["sample_frames", "sampling_options", "train_offsets", "clip_frames", "bound_clips", "ClipSampling", "ClipOptions", "random_resized_crop_box", "assemble_clip",
           "LAYOUTS", "MODALITIES", "OUT_OF_BOUND", "RNG"]

LAYOUTS = ("TCHW", "CTHW")
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

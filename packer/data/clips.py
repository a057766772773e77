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
from dataclasses import dataclass
from typing import Any, Optional, Union

import cv2
import numpy as np

__all__ = ["sample_frames", "ClipSampling", "random_resized_crop_box", "assemble_clip", "LAYOUTS",
           "OUT_OF_BOUND", "RNG"]

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

    def indices(self, total_frames: int, rng: RNG, *, start_index: int = 0, fps: Optional[float] = None,
                clip_len: Optional[int] = None, frame_interval: Optional[int] = None) -> np.ndarray:
        """``sample_frames`` with these options (``fps`` is for samplers that use it)."""
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

"""mmaction2's other frame samplers: ``SampleFrames(target_fps=...)``, ``DenseSampleFrames`` and
``UntrimmedSampleFrames``, as objects the video datasets take (``sampler=``).

Each sampler has ``indices(total_frames, rng, *, start_index, fps, clip_len, frame_interval)``
returning mmaction2's ``frame_inds`` (int32, ``start_index``-based, clips concatenated), plus
``clip_len`` and ``test_mode``. ``clip_len``/``frame_interval`` given to ``indices`` override
the sampler's (a multigrid ``ClipRequest``); ``fps`` is the video's frame rate (the
``avg_fps`` mmaction2 reads from the decoder; packed outputs keep it in their manifest).
With ``rng=np.random.RandomState(s)`` the draws are the ones mmaction2 makes after
``np.random.seed(s)``: the same numpy calls in the same order (checked against index arrays
computed by mmaction2 1.2's own transforms, ``tests/reference/mmaction2_samplers.json.gz``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from packer.data.video import (OUT_OF_BOUND, RNG, ClipSampling, bound_clips, clip_frames, sampling_options,
                               train_offsets)

__all__ = ["SampleFrames", "DenseSampleFrames", "UntrimmedSampleFrames", "fps_sample_frames",
           "dense_sample_frames", "untrimmed_sample_frames"]


def _check(total_frames: int, clip_len: int, frame_interval: int, num_clips: int, oob: str) -> None:
    if total_frames < 1:
        raise ValueError(f"total_frames must be >= 1, not {total_frames}")
    if clip_len < 1 or frame_interval < 1 or num_clips < 1:
        raise ValueError("clip_len, frame_interval and num_clips must be >= 1")
    if oob not in OUT_OF_BOUND:
        raise ValueError(f"out_of_bound_opt must be one of {OUT_OF_BOUND}, not {oob!r}")


# -- SampleFrames(target_fps=...) -------------------------------------------------------------
def fps_sample_frames(total_frames: int, sampling: Optional["SampleFrames"] = None, *,
                      fps: Optional[float] = None, start_index: int = 0, rng: Optional[RNG] = None,
                      **sampling_fields: Any) -> np.ndarray:
    """mmaction2 ``SampleFrames(target_fps=...)``: a clip spans ``clip_len * frame_interval``
    frames at ``target_fps``, i.e. ``clip_len * frame_interval * fps / target_fps`` source
    frames (at least 1), and its ``clip_len`` frames are spread evenly over that span
    (PySlowFast's sampling). ``fps=None`` (unknown) samples as if ``fps == target_fps``.
    Test clips are spaced by the floor of the span between them, as mmaction2 does.
    ``sampling`` is a ``SampleFrames`` (its fields may also be given as keywords: ``clip_len``,
    then required, ``target_fps``, ``frame_interval``, ``num_clips``, ``test_mode``, ...)."""
    s = sampling_options(SampleFrames, sampling, sampling_fields, total_frames)
    target_fps, clip_len, num_clips = s.target_fps, s.clip_len, s.num_clips
    if not target_fps or target_fps <= 0:
        raise ValueError(f"target_fps must be > 0, not {target_fps}")
    rng = np.random if rng is None else rng
    ratio = fps / target_fps if fps else 1.0
    span = np.maximum(1, clip_len * s.frame_interval * ratio)  # a numpy float, as mmaction2's
    if s.test_mode:
        offsets = _fps_test_offsets(total_frames, span, clip_len, num_clips, s.twice_sample)
    else:
        # the train offsets of SampleFrames with a (fractional) span of ``span`` frames
        offsets = train_offsets(total_frames, 1, span, num_clips, s.keep_tail_frames, rng)
    inds = offsets[:, None] + np.linspace(0, span - 1, clip_len).astype(np.int32)
    inds = bound_clips(inds, total_frames, clip_len, s.out_of_bound_opt)
    return (np.concatenate(inds) + start_index).astype(np.int32)


def _fps_test_offsets(n: int, span: float, clip_len: int, num_clips: int, twice: bool) -> np.ndarray:
    if clip_len == 1:  # TSN segments: target_fps changes nothing but the span
        avg = n / float(num_clips)
        base = np.arange(num_clips) * avg
        offsets = base + avg / 2.0
        return np.concatenate([offsets, base]) if twice else offsets
    max_offset = max(n - span, 0)
    count = num_clips * (2 if twice else 1)
    if count > 1:
        if num_clips == 1:
            raise ValueError("twice_sample with num_clips=1 and clip_len>1 has no clip spacing "
                             "(mmaction2 divides by num_clips - 1)")
        return np.arange(count) * np.floor(max_offset / float(num_clips - 1))
    return np.array([max_offset // 2])


@dataclass(frozen=True)
class SampleFrames(ClipSampling):
    """mmaction2 ``SampleFrames`` including ``target_fps`` (None: plain ``SampleFrames``)."""

    target_fps: Optional[float] = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.target_fps is not None:
            if not self.target_fps > 0:
                raise ValueError(f"target_fps must be > 0, not {self.target_fps}")
            if self.temporal_jitter:
                # mmaction2 adds one jitter per clip to a (clips, clip_len) array there: a
                # broadcasting error, or one shift for the whole clip; neither is a jitter
                raise ValueError("temporal_jitter does not combine with target_fps (mmaction2 "
                                 "cannot apply it either)")

    def indices(self, total_frames: int, rng: RNG, *, start_index: int = 0, fps: Optional[float] = None,
                clip_len: Optional[int] = None, frame_interval: Optional[int] = None) -> np.ndarray:
        if self.target_fps is None:
            return super().indices(total_frames, rng, start_index=start_index, clip_len=clip_len,
                                   frame_interval=frame_interval)
        override = {k: v for k, v in (("clip_len", clip_len), ("frame_interval", frame_interval)) if v}
        return fps_sample_frames(total_frames, self, fps=fps, start_index=start_index, rng=rng, **override)


# -- DenseSampleFrames ------------------------------------------------------------------------
def dense_sample_frames(total_frames: int, sampling: Optional["DenseSampleFrames"] = None, *,
                        start_index: int = 0, rng: Optional[RNG] = None, **sampling_fields: Any) -> np.ndarray:
    """mmaction2 ``DenseSampleFrames``: ``num_clips`` clip starts ``sample_range // num_clips``
    apart inside a window of ``sample_range`` frames; the window starts at a random frame of
    ``[0, max(1, total - sample_range))`` in training (mmaction2's ``randint(0, positions - 1)``,
    so the last position is never drawn), and at ``num_sample_positions`` evenly spaced
    positions in testing (``num_clips * num_sample_positions`` clips). ``sampling`` is a
    ``DenseSampleFrames`` (its fields may also be given as keywords; ``clip_len`` then required)."""
    s = sampling_options(DenseSampleFrames, sampling, sampling_fields, total_frames)
    num_clips, sample_range = s.num_clips, s.sample_range
    rng = np.random if rng is None else rng
    positions = max(1, 1 + total_frames - sample_range)
    step = sample_range // num_clips
    base = np.arange(num_clips) * step
    if s.test_mode:
        starts = np.linspace(0, positions - 1, num=s.num_sample_positions, dtype=int)
        offsets = np.array([o for at in starts for o in (base + at) % total_frames])
    else:
        start = 0 if positions == 1 else rng.randint(0, positions - 1)
        offsets = (base + start) % total_frames
    return clip_frames(offsets, total_frames, s, start_index, rng)


@dataclass(frozen=True)
class DenseSampleFrames:
    """mmaction2 ``DenseSampleFrames`` options (see ``dense_sample_frames``)."""
    # Fields like ClipSampling's on purpose, but not a subclass: mmaction2's DenseSampleFrames has
    # no twice_sample/keep_tail_frames, and the datasets tell samplers apart by type.

    clip_len: int = 1
    frame_interval: int = 1
    num_clips: int = 1
    sample_range: int = 64
    num_sample_positions: int = 10
    test_mode: bool = False
    out_of_bound_opt: str = "loop"
    temporal_jitter: bool = False

    def __post_init__(self) -> None:
        _check(1, self.clip_len, self.frame_interval, self.num_clips, self.out_of_bound_opt)
        if self.sample_range < 1 or self.num_sample_positions < 1:
            raise ValueError("sample_range and num_sample_positions must be >= 1")

    def indices(self, total_frames: int, rng: RNG, *, start_index: int = 0, fps: Optional[float] = None,
                clip_len: Optional[int] = None, frame_interval: Optional[int] = None) -> np.ndarray:
        override = {k: v for k, v in (("clip_len", clip_len), ("frame_interval", frame_interval)) if v}
        return dense_sample_frames(total_frames, self, start_index=start_index, rng=rng, **override)


# -- UntrimmedSampleFrames --------------------------------------------------------------------
def untrimmed_sample_frames(total_frames: int, *, clip_len: int = 1, clip_interval: int = 16,
                            frame_interval: int = 1, start_index: int = 0) -> np.ndarray:
    """mmaction2 ``UntrimmedSampleFrames``: a clip centred every ``clip_interval`` frames from
    ``clip_interval // 2`` on, ``clip_len`` frames ``frame_interval`` apart around each centre,
    clamped to the video (deterministic; the number of clips grows with the video)."""
    if total_frames < 1:
        raise ValueError(f"total_frames must be >= 1, not {total_frames}")
    if clip_len < 1 or clip_interval < 1 or frame_interval < 1:
        raise ValueError("clip_len, clip_interval and frame_interval must be >= 1")
    centres = np.arange(clip_interval // 2, total_frames, clip_interval)
    if not len(centres):
        raise ValueError(f"a video of {total_frames} frames has no clip centre (the first is at "
                         f"clip_interval // 2 = {clip_interval // 2}); mmaction2 samples nothing")
    around = np.arange(-(clip_len // 2 * frame_interval), frame_interval * (clip_len - clip_len // 2),
                       frame_interval)
    inds = np.clip(centres[:, None] + around[None, :], 0, total_frames - 1)
    return (np.concatenate(inds) + start_index).astype(np.int32)


@dataclass(frozen=True)
class UntrimmedSampleFrames:
    """mmaction2 ``UntrimmedSampleFrames`` options (test-time feature extraction; every clip)."""

    clip_len: int = 1
    clip_interval: int = 16
    frame_interval: int = 1
    test_mode: bool = True  # deterministic: no random crop either

    def __post_init__(self) -> None:
        if self.clip_len < 1 or self.clip_interval < 1 or self.frame_interval < 1:
            raise ValueError("clip_len, clip_interval and frame_interval must be >= 1")

    def indices(self, total_frames: int, rng: RNG, *, start_index: int = 0, fps: Optional[float] = None,
                clip_len: Optional[int] = None, frame_interval: Optional[int] = None) -> np.ndarray:
        return untrimmed_sample_frames(total_frames, clip_len=clip_len or self.clip_len,
                                       clip_interval=self.clip_interval,
                                       frame_interval=frame_interval or self.frame_interval,
                                       start_index=start_index)

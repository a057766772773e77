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
from typing import Optional

import numpy as np

from packer.data.clips import OUT_OF_BOUND, RNG, ClipSampling, _train_offsets

__all__ = ["SampleFrames", "DenseSampleFrames", "UntrimmedSampleFrames", "fps_sample_frames",
           "dense_sample_frames", "untrimmed_sample_frames"]


def _bound(inds: np.ndarray, total: int, clip_len: int, out_of_bound_opt: str) -> np.ndarray:
    """Clips (rows of ``clip_len``) with indices past the end looped or clamped, as mmaction2."""
    inds = inds.reshape((-1, clip_len))
    if out_of_bound_opt == "loop":
        return np.mod(inds, total)
    safe = inds < total  # repeat_last: the clip's last in-range index
    last = np.max(safe * inds, axis=1)
    return safe * inds + ((1 - safe).T * last).T


def _check(total_frames: int, clip_len: int, frame_interval: int, num_clips: int, oob: str) -> None:
    if total_frames < 1:
        raise ValueError(f"total_frames must be >= 1, not {total_frames}")
    if clip_len < 1 or frame_interval < 1 or num_clips < 1:
        raise ValueError("clip_len, frame_interval and num_clips must be >= 1")
    if oob not in OUT_OF_BOUND:
        raise ValueError(f"out_of_bound_opt must be one of {OUT_OF_BOUND}, not {oob!r}")


# -- SampleFrames(target_fps=...) -------------------------------------------------------------
def fps_sample_frames(total_frames: int, *, clip_len: int, frame_interval: int = 1, num_clips: int = 1,
                      target_fps: float, fps: Optional[float] = None, test_mode: bool = False,
                      start_index: int = 0, out_of_bound_opt: str = "loop", twice_sample: bool = False,
                      keep_tail_frames: bool = False, rng: Optional[RNG] = None) -> np.ndarray:
    """mmaction2 ``SampleFrames(target_fps=...)``: a clip spans ``clip_len * frame_interval``
    frames at ``target_fps``, i.e. ``clip_len * frame_interval * fps / target_fps`` source
    frames (at least 1), and its ``clip_len`` frames are spread evenly over that span
    (PySlowFast's sampling). ``fps=None`` (unknown) samples as if ``fps == target_fps``.
    Test clips are spaced by the floor of the span between them, as mmaction2 does."""
    _check(total_frames, clip_len, frame_interval, num_clips, out_of_bound_opt)
    if not target_fps or target_fps <= 0:
        raise ValueError(f"target_fps must be > 0, not {target_fps}")
    rng = np.random if rng is None else rng
    ratio = fps / target_fps if fps else 1.0
    span = np.maximum(1, clip_len * frame_interval * ratio)  # a numpy float, as mmaction2's
    if test_mode:
        offsets = _fps_test_offsets(total_frames, span, clip_len, num_clips, twice_sample)
    else:
        # the train offsets of SampleFrames with a (fractional) span of ``span`` frames
        offsets = _train_offsets(total_frames, 1, span, num_clips, keep_tail_frames, rng)
    inds = offsets[:, None] + np.linspace(0, span - 1, clip_len).astype(np.int32)
    inds = _bound(inds, total_frames, clip_len, out_of_bound_opt)
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
        return fps_sample_frames(total_frames, clip_len=clip_len or self.clip_len,
                                 frame_interval=frame_interval or self.frame_interval,
                                 num_clips=self.num_clips, target_fps=self.target_fps, fps=fps,
                                 test_mode=self.test_mode, start_index=start_index,
                                 out_of_bound_opt=self.out_of_bound_opt, twice_sample=self.twice_sample,
                                 keep_tail_frames=self.keep_tail_frames, rng=rng)


# -- DenseSampleFrames ------------------------------------------------------------------------
def dense_sample_frames(total_frames: int, *, clip_len: int, frame_interval: int = 1, num_clips: int = 1,
                        sample_range: int = 64, num_sample_positions: int = 10, test_mode: bool = False,
                        start_index: int = 0, out_of_bound_opt: str = "loop",
                        temporal_jitter: bool = False, rng: Optional[RNG] = None) -> np.ndarray:
    """mmaction2 ``DenseSampleFrames``: ``num_clips`` clip starts ``sample_range // num_clips``
    apart inside a window of ``sample_range`` frames; the window starts at a random frame of
    ``[0, max(1, total - sample_range))`` in training (mmaction2's ``randint(0, positions - 1)``,
    so the last position is never drawn), and at ``num_sample_positions`` evenly spaced
    positions in testing (``num_clips * num_sample_positions`` clips)."""
    _check(total_frames, clip_len, frame_interval, num_clips, out_of_bound_opt)
    if sample_range < 1 or num_sample_positions < 1:
        raise ValueError("sample_range and num_sample_positions must be >= 1")
    rng = np.random if rng is None else rng
    positions = max(1, 1 + total_frames - sample_range)
    step = sample_range // num_clips
    base = np.arange(num_clips) * step
    if test_mode:
        starts = np.linspace(0, positions - 1, num=num_sample_positions, dtype=int)
        offsets = np.array([o for s in starts for o in (base + s) % total_frames])
    else:
        start = 0 if positions == 1 else rng.randint(0, positions - 1)
        offsets = (base + start) % total_frames
    inds = np.concatenate(offsets[:, None] + np.arange(clip_len)[None, :] * frame_interval)
    if temporal_jitter:
        inds = inds + rng.randint(frame_interval, size=len(inds))
    inds = _bound(inds, total_frames, clip_len, out_of_bound_opt)
    return (np.concatenate(inds) + start_index).astype(np.int32)


@dataclass(frozen=True)
class DenseSampleFrames:
    """mmaction2 ``DenseSampleFrames`` options (see ``dense_sample_frames``)."""

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
        return dense_sample_frames(total_frames, clip_len=clip_len or self.clip_len,
                                   frame_interval=frame_interval or self.frame_interval,
                                   num_clips=self.num_clips, sample_range=self.sample_range,
                                   num_sample_positions=self.num_sample_positions, test_mode=self.test_mode,
                                   start_index=start_index, out_of_bound_opt=self.out_of_bound_opt,
                                   temporal_jitter=self.temporal_jitter, rng=rng)


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

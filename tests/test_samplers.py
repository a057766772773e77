"""packer's samplers against index arrays that mmaction2 1.2's own transforms drew.

``tests/reference/mmaction2_samplers.json.gz`` was written by ``scripts/mmaction2_samplers.py``
running mmaction2's real ``SampleFrames(target_fps=...)``, ``DenseSampleFrames`` and
``UntrimmedSampleFrames`` after ``np.random.seed(seed)`` (mmaction2 installed in a separate
venv); here packer's samplers get ``np.random.RandomState(seed)`` and must return the same
``frame_inds``, or refuse where mmaction2 raised.
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from packer.data.samplers import (DenseSampleFrames, SampleFrames, UntrimmedSampleFrames,
                                  dense_sample_frames, fps_sample_frames)

REFERENCE = Path(__file__).parent / "reference" / "mmaction2_samplers.json.gz"
CASES = json.loads(gzip.decompress(REFERENCE.read_bytes()))["cases"]
SAMPLERS = {"SampleFrames": SampleFrames, "DenseSampleFrames": DenseSampleFrames,
            "UntrimmedSampleFrames": UntrimmedSampleFrames}


def _ours(case) -> np.ndarray:
    sampler = SAMPLERS[case["sampler"]](**case["kwargs"])
    return sampler.indices(case["total_frames"], np.random.RandomState(case["seed"]), start_index=1,
                           fps=case["fps"])


@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_samplers_draw_what_mmaction2_draws(name):
    cases = [c for c in CASES if c["sampler"] == name]
    assert len(cases) > 50
    mismatches = []
    for case in cases:
        want = case["frame_inds"]
        if isinstance(want, dict):  # mmaction2 raised: packer refuses too
            with pytest.raises(ValueError):
                _ours(case)
            continue
        got = _ours(case)
        assert got.dtype == np.int32
        if got.tolist() != want:
            mismatches.append((case["kwargs"], case["total_frames"], case["fps"], case["seed"]))
    assert not mismatches, f"{len(mismatches)} of {len(cases)} differ, e.g. {mismatches[:3]}"


def test_the_reference_covers_the_random_branches():
    fps = [c for c in CASES if c["sampler"] == "SampleFrames"]
    assert {c["fps"] for c in fps} == {None, 29.97, 60.0}
    assert {c["kwargs"]["test_mode"] for c in fps} == {False, True}
    assert any(c["kwargs"]["keep_tail_frames"] for c in fps)
    dense = [c for c in CASES if c["sampler"] == "DenseSampleFrames"]
    assert any(c["kwargs"]["temporal_jitter"] and not c["kwargs"]["test_mode"] for c in dense)
    # two seeds give different training draws, so the seed really reaches the sampler
    a = [c["frame_inds"] for c in dense if c["total_frames"] == 301 and not c["kwargs"]["test_mode"]
         and c["seed"] == 0]
    b = [c["frame_inds"] for c in dense if c["total_frames"] == 301 and not c["kwargs"]["test_mode"]
         and c["seed"] == 7]
    assert a != b


def test_target_fps_spans_source_frames_by_the_fps_ratio():
    # 8 frames 4 apart at 30 fps span 32 frames; a 60 fps video needs twice the source frames
    inds = fps_sample_frames(600, clip_len=8, frame_interval=4, num_clips=1, target_fps=30, fps=60.0,
                             test_mode=True)
    assert inds[-1] - inds[0] == 63
    same = fps_sample_frames(600, clip_len=8, frame_interval=4, target_fps=30, fps=None, test_mode=True)
    assert same[-1] - same[0] == 31


def test_dense_training_never_draws_the_last_window_position():
    # mmaction2 draws randint(0, positions - 1): with 65 frames and a range of 64 the window
    # could start at 0 or 1, but only 0 is ever drawn
    rng = np.random.RandomState(0)
    starts = {int(dense_sample_frames(65, clip_len=1, num_clips=1, rng=rng)[0]) for _ in range(50)}
    assert starts == {0}


def test_bad_options_are_refused():
    with pytest.raises(ValueError):
        SampleFrames(clip_len=4, target_fps=30, temporal_jitter=True)
    with pytest.raises(ValueError):
        SampleFrames(clip_len=4, target_fps=0)
    with pytest.raises(ValueError):
        DenseSampleFrames(clip_len=0)
    with pytest.raises(ValueError):
        UntrimmedSampleFrames(clip_interval=0)

"""packer's samplers against index arrays that mmaction2 1.2's own transforms drew.

``tests/reference/mmaction2_samplers.json.gz`` was written by ``python -m scripts.check.mmaction2 --record-samplers``
running mmaction2's real ``SampleFrames(target_fps=...)``, ``DenseSampleFrames`` and
``UntrimmedSampleFrames`` after ``np.random.seed(seed)`` (mmaction2 installed in a separate
venv); here packer's samplers get ``np.random.RandomState(seed)`` and must return the same
``frame_inds``, or refuse where mmaction2 raised.
"""
from __future__ import annotations

import gzip
import json

import numpy as np
import pytest
import torch

from packer.conversion.options import RunOptions
from packer.data.samplers import (DenseSampleFrames, SampleFrames, UntrimmedSampleFrames,
                                  dense_sample_frames, fps_sample_frames)
from tests.support import SUPPORT

REFERENCE = SUPPORT / "reference" / "mmaction2_samplers.json.gz"
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


# -- through the datasets and the multigrid sampler ---------------------------------------------
@pytest.fixture(scope="module")
def decoded(tmp_path_factory):
    """Two classes of 30/31-frame videos decoded to frame folders and LMDB."""
    from tests.support.inputs import write_video_folder
    from packer.commands.decode_frames import decode_frames

    base = tmp_path_factory.mktemp("smp")
    src = write_video_folder(base / "src", frames=30, size=(32, 40))
    decode_frames(src, base / "frames", run_options=RunOptions(workers=1, timeout=600.0))
    decode_frames(src, base / "packed", to="lmdb", run_options=RunOptions(workers=1, timeout=600.0))
    return base / "frames", base / "packed"


def test_datasets_sample_with_the_given_sampler(decoded):
    from packer import FrameDataset, PackedVideoDataset

    frames, packed = decoded
    dense = DenseSampleFrames(clip_len=4, frame_interval=2, num_clips=2, sample_range=16)
    fds = FrameDataset(frames, sampling=dense, seed=3, layout="CTHW")
    pds = PackedVideoDataset(packed, sampling=dense, seed=3, layout="CTHW")
    for i in range(len(fds)):
        inds = fds.clip_indices(i)
        want = dense_sample_frames(fds.videos[i].total_frames, clip_len=4, frame_interval=2, num_clips=2,
                                   sample_range=16, start_index=1, rng=fds._rng(i))
        assert inds.tolist() == want.tolist()
        assert (pds.clip_indices(i) + 1).tolist() == inds.tolist()  # packed frames count from 0
        clip, _ = fds[i]
        assert clip.shape == (2, 3, 4, 32, 40) and torch.equal(clip, pds[i][0])
    untrimmed = FrameDataset(frames, sampling=UntrimmedSampleFrames(clip_len=3, clip_interval=8), layout="CTHW")
    assert untrimmed[0][0].shape == (4, 3, 3, 32, 40)  # centres 4, 12, 20, 28 of 30 frames


def test_target_fps_uses_the_stored_frame_rate(decoded):
    from packer import FrameDataset, PackedVideoDataset

    frames, packed = decoded
    fps = SampleFrames(clip_len=4, frame_interval=2, target_fps=12.5, test_mode=True)
    pds = PackedVideoDataset(packed, sampling=fps)
    assert pds._fps(0) == 25.0  # the videos are 25 fps: a clip spans twice the frames
    inds = pds.clip_indices(0)
    assert inds[-1] - inds[0] == 15
    # rawframe lists carry no frame rate: ratio 1, as mmaction2's RawframeDataset
    f = FrameDataset(frames, sampling=fps).clip_indices(0)
    assert f[-1] - f[0] == 7


def test_multigrid_requests_reach_the_sampler(decoded):
    from torch.utils.data import DataLoader

    from packer import PackedVideoDataset
    from packer.data.multigrid import MultigridBatchSampler, MultigridSchedule
    from packer.data.video import ClipRequest

    _, packed = decoded
    dense = DenseSampleFrames(clip_len=8, frame_interval=1, num_clips=1, sample_range=16)
    ds = PackedVideoDataset(packed, sampling=dense, seed=0, crop_size=24)
    req = ClipRequest(1, num_frames=2, frame_interval=4, crop_size=16, epoch=0)
    want = dense_sample_frames(ds._video(1)[0], clip_len=2, frame_interval=4, num_clips=1, sample_range=16,
                               rng=ds._rng(1, 0))
    assert ds.clip_indices(req).tolist() == want.tolist()
    assert ds[req][0].shape == (2, 3, 16, 16)
    schedule = MultigridSchedule(base_batch_size=1, num_frames=8, crop_size=24, lr_steps=[0, 2], max_epoch=4)
    sampler = MultigridBatchSampler(len(ds), schedule, seed=0)
    shapes = set()
    for epoch in range(4):
        sampler.set_epoch(epoch)
        for (clips, _), reqs in zip(DataLoader(ds, batch_sampler=sampler), list(sampler)):
            t, crop = reqs[0].num_frames, reqs[0].crop_size
            assert clips.shape[1:] == (t, 3, crop, crop)
            shapes.add((t, crop))
    assert len({t for t, _ in shapes}) >= 2  # the schedule changed T, and the dense sampler followed

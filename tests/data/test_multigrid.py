"""Multigrid schedule, batch sampler and SubBatchNorm3d.

The expected schedules below are derived by hand from the rules of SlowFast's
``get_long_cycle_schedule`` / ``ShortCycleBatchSampler`` (see packer/data/multigrid/), not
computed by the code under test.
"""
from __future__ import annotations

import os
from fractions import Fraction

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from packer.data.multigrid import (MultigridBatchSampler, MultigridSchedule, SubBatchNorm3d,
                                   aggregate_sub_bn_stats, set_sub_bn_splits)
from packer.data.video import ClipRequest, split_request
from packer.synth import natural_image
from tests.support import FIXTURE_VIDEOS

KINETICS = dict(base_batch_size=8, num_frames=16, crop_size=224, lr_steps=[0, 94, 154, 196], max_epoch=239)
SMALL = dict(base_batch_size=2, num_frames=8, crop_size=64, lr_steps=[0, 8, 12], max_epoch=14)


def shapes(plan):
    return [(s["num_frames"], s["crop_size"], s["batch_size"]) for s in plan]


def bounds(plan):
    return [(s["start_epoch"], s["end_epoch"]) for s in plan]


# ---------------------------------------------------------------------------- schedule


def test_kinetics_schedule_matches_slowfast():
    """SlowFast's Kinetics multigrid numbers (8 per process, 16x224, steps 0/94/154/196, 239 epochs).

    Shapes: T' = round(16 t), S' = round(224 s) -> (4, 158), (8, 158), (8, 224), (16, 224);
    multipliers round(16*224^2 / (T' S'^2)) = round(8.04), round(4.02), 2, 1.
    Average multipliers over the short cycle (112 px, 158.39 px, S'):
      (4,158): round(802816/(4*112^2))=16, round(802816/(4*158.39^2))=8, 8 -> 32/3
      (8,158): 8, 4, 4 -> 16/3;  (8,224): 8, 4, 2 -> 14/3;  (16,224): 4, 2, 1 -> 7/3;  sum 23.
    Stage of E epochs: shape i gets E a_i / 23. Iterations (units of N/B) = 4*196/23, so the
    saving is 196 / (4*196/23) = 23/4 and the fine-tune gets (239-196) * 4/23 * 7/3 = 1204/69.
    Total before scaling 196 + 1204/69 = 14728/69; scale = 239*1.5 / (14728/69) = 49473/29456.
    Cumulative ends, rounded half to even:
      94*32/69*scale = 73.22 -> 73, +94*16/69*scale -> 109.83 -> 110, 141.86 -> 142, 157.88 -> 158,
      204.61 -> 205, 227.98 -> 228, 248.43 -> 248, 258.65 -> 259,
      291.37 -> 291, 307.72 -> 308, 322.04 -> 322, 329.19 -> 329, and exactly 358.5 -> 358.
    SlowFast's rewritten SOLVER.STEPS end with (329 + 358) // 2 = 343.
    """
    s = MultigridSchedule(**KINETICS, sampling_rate=8)
    long = [(4, 158, 64), (8, 158, 32), (8, 224, 16), (16, 224, 8)]
    assert shapes(s.plan) == long * 3 + [(16, 224, 8)]
    assert [p["lr_multiplier"] for p in s.plan] == [8, 4, 2, 1] * 3 + [1]
    assert [p["lr_stage"] for p in s.plan] == [0] * 4 + [1] * 4 + [2] * 4 + [3]
    assert [p["fine_tune"] for p in s.plan] == [False] * 12 + [True]
    ends = [73, 110, 142, 158, 205, 228, 248, 259, 291, 308, 322, 329, 358]
    assert bounds(s.plan) == list(zip([0] + ends[:-1], ends))
    assert s.total_epochs == 358
    assert s.lr_steps == [0] + ends[:-1] + [343]
    # Clips span the same time: 16 x 8 = 8 x 16 = 4 x 32 frames.
    assert [p["sampling_rate"] for p in s.plan[:4]] == [32, 16, 16, 8]
    # Short cycle: crops of the FULL size (112, round(158.39)=158); batch multipliers
    # round((S'/(f*224))^2): at 158 -> round(1.99)=2, round(0.995)=1; at 224 -> 4, round(2.0001)=2.
    assert [p["short_cycle"] for p in s.plan[:4]] == [
        [(128, 112), (64, 158), (64, 158)],
        [(64, 112), (32, 158), (32, 158)],
        [(64, 112), (32, 158), (16, 224)],
        [(32, 112), (16, 158), (8, 224)],
    ]
    assert s.plan[-1]["short_cycle"] == [(32, 112), (16, 158), (8, 224)]
    # Relative learning rate: gamma ** stage * multiplier; the fine-tune's first half keeps stage 2.
    assert s.lr_at(0) == 8 and s.lr_at(72) == 8 and s.lr_at(73) == 4 and s.lr_at(157) == 1
    assert s.lr_at(158) == pytest.approx(0.8) and s.lr_at(328) == pytest.approx(0.01)
    assert s.lr_at(329) == pytest.approx(0.01) and s.lr_at(342) == pytest.approx(0.01)
    assert s.lr_at(343) == pytest.approx(0.001) and s.lr_at(357) == pytest.approx(0.001)


def test_small_schedule_by_hand():
    """B=2, 8x64, steps 0/8/12, 14 epochs, factor 1.5 (so 21 epochs in all).

    Shapes (2, 45), (4, 45), (4, 64), (8, 64) [round(64*0.7071)=round(45.25)=45], multipliers
    round(8*64^2/(2*45^2))=round(8.09)=8, 4, 2, 1; averages over the short cycle (32 px, 45.25 px, S'):
    (16+8+8)/3, (8+4+4)/3, (8+4+2)/3, (4+2+1)/3 = 32/3, 16/3, 14/3, 7/3 (sum 23) as at 224 px.
    Saving 23/4, fine-tune (14-12) * 4/23 * 7/3 = 56/69; total 12 + 56/69 = 884/69;
    scale 21 / (884/69) = 1449/884. Shape i of a stage of E epochs lasts E k_i/69 * 1449/884
    = 21 E k_i / 884 epochs (k = 32, 16, 14, 7). Cumulative:
      stage 0 (E=8): 168*32/884 = 6.08 -> 6, 168*48/884 = 9.12 -> 9, 168*62/884 = 11.78 -> 12,
                     168*69/884 = 13.11 -> 13;
      stage 1 (E=4): + 84*32/884 -> 16.15 -> 16, + 84*16/884 -> 17.67 -> 18, -> 19.005 -> 19,
                     -> 19.67 -> 20;
      fine-tune: 56/69 * 1449/884 = 1.33 -> exactly 21.
    """
    s = MultigridSchedule(**SMALL)
    assert bounds(s.plan) == [(0, 6), (6, 9), (9, 12), (12, 13), (13, 16), (16, 18), (18, 19),
                              (19, 20), (20, 21)]
    assert shapes(s.plan) == [(2, 45, 16), (4, 45, 8), (4, 64, 4), (8, 64, 2)] * 2 + [(8, 64, 2)]
    assert [p["lr_multiplier"] for p in s.plan] == [8, 4, 2, 1, 8, 4, 2, 1, 1]
    assert [p["sampling_rate"] for p in s.plan[:4]] == [4, 2, 2, 1]
    # (45/32)^2 = 1.98 -> 2, (45/45.25)^2 = 0.99 -> 1; (64/32)^2 = 4, (64/45.25)^2 = 2.0
    assert [p["short_cycle"] for p in s.plan[:4]] == [
        [(32, 32), (16, 45), (16, 45)],
        [(16, 32), (8, 45), (8, 45)],
        [(16, 32), (8, 45), (4, 64)],
        [(8, 32), (4, 45), (2, 64)],
    ]
    # Iterations over 96 samples: an epoch cycles the short-cycle batch sizes:
    #   [32,16,16] (period 64): 96 = 64 + 32 -> 4 batches x 6 epochs = 24
    #   [16,8,8] (32): 3 periods -> 9 x 3 = 27;  [16,8,4] (28): 3 periods + 12 -> 10 x 3 = 30
    #   [8,4,2] (14): 6 periods + 8 + 4 -> 20 x 1 = 20
    assert s.iterations(96)[:4] == [24, 27, 30, 20]
    # drop_last: the trailing 12 of [16,8,4] is dropped -> 9 x 3 = 27
    assert s.iterations(96, drop_last=True)[:4] == [24, 27, 27, 20]
    # Two processes get ceil(97/2) = 49 each: [32,16,16] -> 32+16 = 48, then 1 left -> 3 batches
    assert s.iterations(97, num_replicas=2)[0] == 3 * 6
    # Fine-tune 20..21: its midpoint (20+21)//2 = 20, so no epoch keeps stage 1's rate.
    assert s.lr_steps == [0, 6, 9, 12, 13, 16, 18, 19, 20]
    assert s.lr_at(19) == pytest.approx(0.1) and s.lr_at(20) == pytest.approx(0.01)


def test_short_cycle_only_stretches_steps_with_int():
    s = MultigridSchedule(**KINETICS, long_cycle=False)
    # SlowFast: STEPS = [int(s * 1.5)], MAX_EPOCH = int(239 * 1.5) = 358
    assert bounds(s.plan) == [(0, 141), (141, 231), (231, 294), (294, 358)]
    assert all(p["short_cycle"] == [(32, 112), (16, 158), (8, 224)] for p in s.plan)
    assert shapes(s.plan) == [(16, 224, 8)] * 4 and s.total_epochs == 358
    assert [s.lr_at(e) for e in (0, 141, 231, 294)] == pytest.approx([1, 0.1, 0.01, 0.001])


def test_relative_cost_by_hand():
    # Short cycle only: 358 epochs of 16 frames; per sample S^2 = (32*112^2 + 16*158^2 + 8*224^2) / 56
    s = MultigridSchedule(**KINETICS, long_cycle=False)
    per_sample = (32 * 112 ** 2 + 16 * 158 ** 2 + 8 * 224 ** 2) / 56
    assert s.relative_cost() == pytest.approx(358 * per_sample / (239 * 224 ** 2))
    plain = MultigridSchedule(**KINETICS, long_cycle=False, short_cycle=False)
    assert plain.relative_cost() == 1.0
    # Long + short: each iteration costs about one full-shape batch, so the cost ratio is
    # about the ratio of iterations (3.42x fewer on 240k samples; 239 * 30000 plain ones).
    full = MultigridSchedule(**KINETICS)
    assert 1 / full.relative_cost() == pytest.approx(239 * 30000 / sum(full.iterations(240_000)), rel=0.01)


def test_no_cycle_is_the_plain_schedule():
    s = MultigridSchedule(**KINETICS, long_cycle=False, short_cycle=False, sampling_rate=8)
    assert bounds(s.plan) == [(0, 94), (94, 154), (154, 196), (196, 239)]
    assert all(p["short_cycle"] == [(8, 224)] and p["sampling_rate"] == 8 for p in s.plan)


def test_long_cycle_only_fine_tunes_at_full_shape():
    """Averages are the multipliers themselves (8+4+2+1 = 15): saving 15/4, fine-tune
    43 * 4/15 = 172/15; total 196 + 172/15 = 3112/15; scale 358.5 / (3112/15) = 5377.5/3112."""
    s = MultigridSchedule(**KINETICS, short_cycle=False)
    assert shapes(s.plan)[-2:] == [(16, 224, 8), (16, 224, 8)]
    assert all(p["short_cycle"] == [(p["batch_size"], p["crop_size"])] for p in s.plan)
    scale = Fraction(717, 2) / Fraction(3112, 15)
    # first stage: 94 * 8/15 epochs, scaled
    assert s.plan[0]["end_epoch"] == round(Fraction(94 * 8, 15) * scale) == 87
    assert s.plan[-1]["start_epoch"] == round((196 * scale)) == 339
    assert s.total_epochs == 358


def test_at_and_stage_index():
    s = MultigridSchedule(**KINETICS)
    assert s.at(0)["num_frames"] == 4 and s.at(72)["num_frames"] == 4
    assert s.at(73)["num_frames"] == 8 and s.at(73)["crop_size"] == 158
    assert s.at(357)["fine_tune"] and s.at(10_000)["fine_tune"]
    assert s.stage_index(158) == 4
    s.at(0)["short_cycle"].append("changed")  # a copy: the plan is not touched
    assert len(s.plan[0]["short_cycle"]) == 3
    with pytest.raises(ValueError, match="epoch"):
        s.at(-1)
    assert "fine-tune" in s.describe() and "358 epochs" in repr(s)


@pytest.mark.parametrize("kwargs, match", [
    (dict(lr_steps=[1, 94]), "start at 0"),
    (dict(lr_steps=[0, 94, 94]), "increase strictly"),
    (dict(lr_steps=[0, 239]), "before max_epoch"),
    (dict(lr_steps=[0]), "at least two"),
    (dict(base_batch_size=0), "base_batch_size"),
    (dict(crop_size=2.5), "crop_size"),
    (dict(long_cycle_factors=((0.5, 1),)), r"\(1, 1\)"),
    (dict(long_cycle_factors=((0, 1), (1, 1))), r"\(0, 1\]"),
    (dict(short_cycle_factors=(1.5,)), "short_cycle_factors"),
    (dict(epoch_factor=0), "epoch_factor"),
    (dict(num_frames=1, long_cycle_factors=((0.25, 1), (1, 1))), "empty clip"),
    (dict(crop_size=1), "empty crop"),
])
def test_schedule_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MultigridSchedule(**{**KINETICS, **kwargs})


@settings(max_examples=60, deadline=None)
@given(batch=st.integers(1, 16), frames=st.sampled_from([4, 8, 16, 32]), crop=st.integers(32, 320),
       first=st.integers(1, 40), more=st.lists(st.integers(1, 40), min_size=0, max_size=3),
       tail=st.integers(1, 40), factor=st.sampled_from([1.0, 1.5, 2.0]),
       short=st.booleans(), rate=st.integers(1, 8))
def test_schedule_invariants(batch, frames, crop, first, more, tail, factor, short, rate):
    steps = [0, first]
    for m in more:
        steps.append(steps[-1] + m)
    s = MultigridSchedule(batch, frames, crop, steps, steps[-1] + tail, epoch_factor=factor,
                          short_cycle=short, sampling_rate=rate)
    assert s.plan[0]["start_epoch"] == 0
    assert all(a["end_epoch"] == b["start_epoch"] for a, b in zip(s.plan, s.plan[1:]))
    assert all(p["end_epoch"] > p["start_epoch"] for p in s.plan)
    # Exact arithmetic: the last boundary is the rounded stretched length.
    assert s.total_epochs == round(Fraction(steps[-1] + tail) * Fraction(factor))
    # A fine-tune stage (full shape) can only be last; on a short tail it may round to 0 epochs.
    assert not any(p["fine_tune"] for p in s.plan[:-1])
    if s.plan[-1]["fine_tune"]:
        assert (s.plan[-1]["num_frames"], s.plan[-1]["crop_size"]) == (frames, crop)
    for p in s.plan:
        assert p["batch_size"] == batch * p["lr_multiplier"]
        assert p["sampling_rate"] == rate * (frames // p["num_frames"])
        assert p["short_cycle"][-1] == (p["batch_size"], p["crop_size"])
        assert len(p["short_cycle"]) == (3 if short else 1)
        # B T S^2 stays within rounding of the full shape's
        work = p["lr_multiplier"] * p["num_frames"] * p["crop_size"] ** 2
        assert 0.5 < work / (frames * crop ** 2) < 2
    assert s.lr_steps == sorted(s.lr_steps)


# ---------------------------------------------------------------------------- batch sampler


def flat(batches):
    return [r.index for b in batches for r in b]


def test_sampler_batches_follow_short_cycle():
    s = MultigridSchedule(**SMALL)
    sampler = MultigridBatchSampler(96, s, epoch=9, seed=3)  # stage (4, 64, B=4): [16,8,4] x [32,45,64]
    batches = list(sampler)
    assert len(batches) == len(sampler) == 10
    assert [len(b) for b in batches] == [16, 8, 4] * 3 + [12]
    assert [b[0].crop_size for b in batches] == [32, 45, 64] * 3 + [32]
    assert all(isinstance(r, ClipRequest) and r.num_frames == 4 and r.frame_interval == 2
               and r.crop_size == b[0].crop_size for b in batches for r in b)
    assert sorted(flat(batches)) == list(range(96))
    assert flat(batches) == flat(MultigridBatchSampler(96, s, epoch=9, seed=3))  # deterministic
    assert flat(batches) != flat(MultigridBatchSampler(96, s, epoch=9, seed=4))
    dropped = MultigridBatchSampler(96, s, epoch=9, seed=3, drop_last=True)
    assert [len(b) for b in dropped] == [16, 8, 4] * 3 and len(dropped) == 9
    ordered = MultigridBatchSampler(96, s, epoch=9, shuffle=False)
    assert flat(ordered) == list(range(96))


def test_sampler_set_epoch_changes_shape_and_order():
    s = MultigridSchedule(**SMALL)
    sampler = MultigridBatchSampler(64, s)
    first = list(sampler)
    assert first[0][0][1:] == (2, 4, 32, 0) and sampler.stage["num_frames"] == 2
    sampler.set_epoch(5)  # still stage 0, new permutation
    assert list(sampler)[0][0][1:] == (2, 4, 32, 5) and flat(sampler) != flat(first)
    sampler.set_epoch(6)  # stage 1: T=4, interval 2, [16,8,8] x [32,45,45]
    assert [(len(b), b[0][1:4]) for b in sampler][:3] == [(16, (4, 2, 32)), (8, (4, 2, 45)), (8, (4, 2, 45))]
    sampler.set_epoch(500)  # past the end: the fine-tune stage
    # [8,4,2] (period 14): 64 = 4 * 14 + 8, and the last 8 fill one more batch exactly
    assert sampler.stage["fine_tune"] and len(sampler) == 13
    assert [len(b) for b in sampler] == [8, 4, 2] * 4 + [8]


def test_sampler_rank_split_is_distributed_samplers():
    s = MultigridSchedule(**SMALL)
    for n, replicas in [(97, 2), (50, 3), (5, 4)]:
        lengths = set()
        for rank in range(replicas):
            mine = MultigridBatchSampler(n, s, epoch=7, seed=11, num_replicas=replicas, rank=rank)
            ref = DistributedSampler(range(n), num_replicas=replicas, rank=rank, shuffle=True, seed=11)
            ref.set_epoch(7)
            assert flat(mine) == list(ref)
            lengths.add(len(mine))
            # wrapping the DistributedSampler gives the same batches
            wrapped = MultigridBatchSampler(ref, s, epoch=7)
            assert list(wrapped) == list(mine) and len(wrapped) == len(mine)
        assert len(lengths) == 1  # every process runs the same number of iterations


def test_sampler_forwards_set_epoch_to_wrapped_sampler():
    s = MultigridSchedule(**SMALL)
    ref = DistributedSampler(range(40), num_replicas=2, rank=1, seed=0)
    sampler = MultigridBatchSampler(ref, s)
    sampler.set_epoch(13)
    assert ref.epoch == 13 and sampler.stage["lr_multiplier"] == 8 and sampler.rank == 1


@settings(max_examples=80, deadline=None)
@given(n=st.integers(0, 300), replicas=st.integers(1, 5), epoch=st.integers(0, 25),
       drop_last=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_sampler_covers_every_index_on_every_rank_count(n, replicas, epoch, drop_last, seed):
    s = MultigridSchedule(**SMALL)
    seen, counts = [], set()
    for rank in range(replicas):
        sampler = MultigridBatchSampler(n, s, epoch=epoch, seed=seed, num_replicas=replicas,
                                        rank=rank, drop_last=drop_last)
        batches = list(sampler)
        assert len(batches) == len(sampler)
        phases = s.at(epoch)["short_cycle"]
        for k, b in enumerate(batches):
            size, crop = phases[k % len(phases)]
            assert len(b) == size or (k == len(batches) - 1 and not drop_last and len(b) < size)
            assert {r.crop_size for r in b} == {crop}
        counts.add(len(batches))
        seen += flat(batches)
    assert len(counts) == 1
    if not drop_last:
        assert set(seen) == set(range(n))
        assert len(seen) == -(-n // replicas) * replicas


def test_sampler_jitter_interval():
    s = MultigridSchedule(**SMALL, sampling_rate=2)  # stage 0: T=2, interval 2 * 4 = 8
    jittered = MultigridBatchSampler(200, s, seed=1, jitter_interval=True)
    intervals = [r.frame_interval for b in jittered for r in b]
    assert set(intervals) <= set(range(2, 9)) and len(set(intervals)) > 3
    assert intervals == [r.frame_interval for b in jittered for r in b]  # seeded
    plain = MultigridBatchSampler(200, s, seed=1)
    assert {r.frame_interval for b in plain for r in b} == {8}


def test_sampler_rejects_bad_arguments():
    s = MultigridSchedule(**SMALL)
    with pytest.raises(ValueError, match="rank"):
        MultigridBatchSampler(10, s, num_replicas=2, rank=2)
    with pytest.raises(ValueError, match="len\\(dataset\\)"):
        MultigridBatchSampler(ClipDataset([np.zeros((4, 8, 8, 3), np.uint8)]), s)
    with pytest.raises(ValueError, match="wrapped sampler"):
        MultigridBatchSampler(DistributedSampler(range(10), num_replicas=1, rank=0), s, num_replicas=1)
    with pytest.raises(ValueError, match="MultigridSchedule"):
        MultigridBatchSampler(10, {"plan": []})
    with pytest.raises(ValueError, match=">= 0"):
        MultigridBatchSampler(-1, s)
    with pytest.raises(ValueError, match="epoch"):
        MultigridBatchSampler(10, s, epoch=-2)


class ClipDataset(Dataset):
    """A small video dataset honouring ClipRequest: T frames `interval` apart, random crop
    (scale 0.5-1 of the short side) resized to S x S. Returns (T x 3 x S x S uint8, label, request)."""

    def __init__(self, videos, *, num_frames=8, frame_interval=1, crop_size=64):
        self.videos = videos
        self.defaults = (num_frames, frame_interval, crop_size)

    def __len__(self):
        return len(self.videos)

    def __getitem__(self, key):
        req = split_request(key)
        frames = self.videos[req.index]
        t = req.num_frames or self.defaults[0]
        step = req.frame_interval or self.defaults[1]
        size = req.crop_size or self.defaults[2]
        rng = np.random.default_rng()
        span = (t - 1) * step + 1
        start = int(rng.integers(0, max(1, len(frames) - span + 1)))
        idx = [(start + i * step) % len(frames) for i in range(t)]
        h, w = frames.shape[1:3]
        side = int(min(h, w) * rng.uniform(0.5, 1.0))
        y, x = int(rng.integers(0, h - side + 1)), int(rng.integers(0, w - side + 1))
        clip = torch.from_numpy(frames[idx, y:y + side, x:x + side]).permute(0, 3, 1, 2).float()
        clip = F.interpolate(clip, size=(size, size), mode="bilinear", align_corners=False)
        clip = clip.round().clamp(0, 255).to(torch.uint8)
        return clip, req.index % 3, torch.tensor([t, step, size])


@pytest.fixture(scope="module")
def videos():
    """Synthetic clips, plus windows of a real decoded video when the fixtures are present."""
    rng = np.random.default_rng(0)
    out = [np.stack([natural_image(rng, 48, 64)] * 24) for _ in range(4)]
    real = FIXTURE_VIDEOS / "mmaction2_part_0.mp4"
    if real.is_file():
        import decord

        frames = decord.VideoReader(str(real), width=96, height=72).get_batch(range(32)).asnumpy()
        out += [frames[i:i + 24] for i in range(0, 8, 2)]
    while len(out) < 40:
        out += out
    return out[:40]


@pytest.mark.parametrize("epoch", [0, 6, 9, 12, 20])
def test_dataloader_batches_have_the_scheduled_shapes(videos, epoch):
    s = MultigridSchedule(**SMALL)
    sampler = MultigridBatchSampler(len(videos), s, epoch=epoch, seed=5)
    loader = DataLoader(ClipDataset(videos), batch_sampler=sampler, num_workers=2)
    stage = s.at(epoch)
    left, batches = len(videos), 0
    for k, (clips, labels, meta) in enumerate(loader):
        size, crop = stage["short_cycle"][k % len(stage["short_cycle"])]
        b = min(size, left)
        assert clips.dtype == torch.uint8
        assert tuple(clips.shape) == (b, stage["num_frames"], 3, crop, crop)
        assert meta.tolist() == [[stage["num_frames"], stage["sampling_rate"], crop]] * b
        assert labels.shape == (b,)
        left -= b
        batches += 1
    assert left == 0 and batches == len(sampler)


def test_dataloader_follows_set_epoch_across_stages(videos):
    s = MultigridSchedule(**SMALL)
    sampler = MultigridBatchSampler(len(videos), s, drop_last=True)
    loader = DataLoader(ClipDataset(videos), batch_sampler=sampler, num_workers=2, persistent_workers=True)
    for epoch in (0, 6, 9, 12):
        sampler.set_epoch(epoch)
        stage = s.at(epoch)
        got = [tuple(clips.shape) for clips, _, _ in loader]
        want = [(b, stage["num_frames"], 3, c, c) for b, c in stage["short_cycle"]]
        assert got == [want[k % 3] for k in range(len(sampler))] and got


def _dist_worker(rank, world, init_file, out_dir):
    torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        s = MultigridSchedule(**SMALL)
        sampler = MultigridBatchSampler(45, s, epoch=12, seed=2)  # ranks from torch.distributed
        batches = [[r.index for r in b] for b in sampler]
        gathered = [None] * world
        torch.distributed.all_gather_object(gathered, (sampler.num_replicas, sampler.rank, len(sampler), batches))
        if rank == 0:
            import json

            with open(os.path.join(out_dir, "result.json"), "w") as f:
                json.dump(gathered, f)
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.slow
def test_sampler_splits_across_real_distributed_ranks(tmp_path):
    import json

    torch.multiprocessing.spawn(_dist_worker, args=(2, str(tmp_path / "init"), str(tmp_path)), nprocs=2)
    result = json.loads((tmp_path / "result.json").read_text())
    assert [(r[0], r[1]) for r in result] == [(2, 0), (2, 1)]
    # stage (8, 64, B=2): [8, 4, 2] on ceil(45/2) = 23 per rank -> 8, 4, 2, 8, 1
    assert result[0][2] == result[1][2] == 5
    assert [len(b) for b in result[0][3]] == [len(b) for b in result[1][3]] == [8, 4, 2, 8, 1]
    r0 = [i for b in result[0][3] for i in b]
    r1 = [i for b in result[1][3] for i in b]
    assert set(r0) | set(r1) == set(range(45)) and len(r0) == len(r1) == 23


# ---------------------------------------------------------------------------- SubBatchNorm3d


def _hand_bn(x, mean, var, eps, weight, bias):
    shape = (1, -1, 1, 1, 1)
    return (x - mean.view(shape)) / torch.sqrt(var.view(shape) + eps) * weight.view(shape) + bias.view(shape)


def test_one_split_matches_batchnorm3d():
    torch.manual_seed(0)
    for momentum in (0.1, None):
        ref = nn.BatchNorm3d(5, momentum=momentum)
        sub = SubBatchNorm3d(5, 1, momentum=momentum)
        with torch.no_grad():
            ref.weight.uniform_(0.5, 2)
            ref.bias.uniform_(-1, 1)
            sub.weight.copy_(ref.weight)
            sub.bias.copy_(ref.bias)
        for _ in range(3):
            x = torch.randn(6, 5, 2, 4, 4) * 3 + 1
            xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
            ya, yb = ref(xa), sub(xb)
            torch.testing.assert_close(yb, ya)
            g = torch.randn_like(ya)
            (ya * g).sum().backward()
            (yb * g).sum().backward()
            torch.testing.assert_close(xb.grad, xa.grad, rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(sub.weight.grad, ref.weight.grad, rtol=1e-4, atol=1e-5)
        ref.eval()
        sub.eval()
        torch.testing.assert_close(sub.running_mean, ref.running_mean)
        torch.testing.assert_close(sub.running_var, ref.running_var)
        assert int(sub.num_batches_tracked) == int(ref.num_batches_tracked) == 3
        x = torch.randn(3, 5, 2, 4, 4)
        torch.testing.assert_close(sub(x), ref(x))


def test_training_normalises_each_split_by_hand():
    torch.manual_seed(1)
    k, n, c = 4, 8, 3
    sub = SubBatchNorm3d(c, k)
    with torch.no_grad():
        sub.weight.copy_(torch.tensor([1.5, 0.5, 2.0]))
        sub.bias.copy_(torch.tensor([0.1, -0.2, 0.3]))
    x = torch.randn(n, c, 3, 5, 5) * torch.tensor([1.0, 4.0, 0.5]).view(1, -1, 1, 1, 1)
    y = sub(x)
    for s in range(k):
        part = x[s::k]  # split s holds samples s, s + k, ...
        mean = part.mean(dim=(0, 2, 3, 4))
        var = part.var(dim=(0, 2, 3, 4), unbiased=False)
        torch.testing.assert_close(y[s::k], _hand_bn(part, mean, var, sub.eps, sub.weight, sub.bias))


def test_aggregated_stats_are_the_whole_batch_stats():
    """One step with momentum 1: split running stats = split batch stats (unbiased variance)."""
    torch.manual_seed(2)
    k, n, c = 4, 8, 3
    sub = SubBatchNorm3d(c, k, momentum=1.0)
    # splits with different means, so the between-split term matters
    x = torch.randn(n, c, 2, 6, 6) + torch.arange(n, dtype=torch.float32).view(-1, 1, 1, 1, 1) % k * 2
    sub(x)
    dims = (0, 2, 3, 4)
    m = (n // k) * 2 * 6 * 6  # values per split and channel
    split_means = torch.stack([x[s::k].mean(dim=dims) for s in range(k)])
    split_vars = torch.stack([x[s::k].var(dim=dims, unbiased=True) for s in range(k)])
    torch.testing.assert_close(sub.split_running_mean.view(k, c), split_means)
    torch.testing.assert_close(sub.split_running_var.view(k, c), split_vars)
    sub.aggregate_stats()
    mean = split_means.mean(0)
    between = ((split_means - mean) ** 2).mean(0)
    torch.testing.assert_close(sub.running_mean, x.mean(dim=dims))
    torch.testing.assert_close(sub.running_var, split_vars.mean(0) + between)
    # The rule is exact for biased variances: whole-batch variance = within + between.
    biased = torch.stack([x[s::k].var(dim=dims, unbiased=False) for s in range(k)])
    torch.testing.assert_close(x.var(dim=dims, unbiased=False), biased.mean(0) + between)
    # With BatchNorm's unbiased split variances it exceeds that by avg(v_s) / (m - 1) ...
    torch.testing.assert_close(sub.running_var - x.var(dim=dims, unbiased=False), biased.mean(0) / (m - 1))
    # ... which is within 1/m of the whole batch's unbiased variance.
    whole = x.var(dim=dims, unbiased=True)
    assert torch.all((sub.running_var - whole).abs() / whole < 1.0 / m)
    assert float(between.min()) > 0.5  # the between term was exercised


def test_eval_uses_aggregated_stats():
    torch.manual_seed(3)
    sub = SubBatchNorm3d(2, 2, momentum=0.3)
    with torch.no_grad():
        sub.weight.copy_(torch.tensor([2.0, 0.5]))
        sub.bias.copy_(torch.tensor([1.0, -1.0]))
    for i in range(4):
        sub(torch.randn(4, 2, 2, 3, 3) + i)
    means = sub.split_running_mean.view(2, 2).clone()
    variances = sub.split_running_var.view(2, 2).clone()
    assert torch.equal(sub.running_mean, torch.zeros(2))  # not aggregated during training
    sub.eval()  # leaving training aggregates
    mean = means.mean(0)
    var = variances.mean(0) + ((means - mean) ** 2).mean(0)
    torch.testing.assert_close(sub.running_mean, mean)
    x = torch.randn(3, 2, 2, 3, 3)
    torch.testing.assert_close(sub(x), _hand_bn(x, mean, var, sub.eps, sub.weight, sub.bias))
    # eval accepts any batch size, and changing the splits keeps the evaluation the same
    before = sub(x)
    sub.train()
    sub.set_num_splits(3)
    assert sub.split_running_mean.shape == (6,)
    torch.testing.assert_close(sub.split_running_mean.view(3, 2), mean.expand(3, 2))
    sub.eval()
    torch.testing.assert_close(sub(x), before)


def test_without_running_stats_eval_uses_the_batch():
    sub = SubBatchNorm3d(2, 2, track_running_stats=False, affine=False)
    x = torch.randn(4, 2, 2, 3, 3) * 5
    sub.eval()
    torch.testing.assert_close(sub(x), F.batch_norm(x, None, None, training=True))
    assert sub.running_mean is None and "num_splits=2" in repr(sub)


def test_sub_bn_errors():
    sub = SubBatchNorm3d(2, 4)
    with pytest.raises(ValueError, match="6 samples does not split into 4"):
        sub(torch.randn(6, 2, 1, 2, 2))
    with pytest.raises(ValueError, match=r"\(N, C, T, H, W\)"):
        sub(torch.randn(4, 2, 2, 2))
    with pytest.raises(ValueError, match="3 channels"):
        sub(torch.randn(4, 3, 1, 2, 2))
    with pytest.raises(ValueError, match="num_splits"):
        SubBatchNorm3d(2, 0)
    with pytest.raises(ValueError, match="momentum"):
        SubBatchNorm3d(2, 2, momentum=2.0)


def test_model_helpers_and_state_dict():
    torch.manual_seed(4)

    def model(splits):
        return nn.Sequential(nn.Conv3d(3, 4, 3, padding=1), SubBatchNorm3d(4, splits), nn.ReLU(),
                             nn.Conv3d(4, 4, 1), SubBatchNorm3d(4, splits))

    net = model(2)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for _ in range(3):
        loss = net(torch.randn(8, 3, 2, 6, 6)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert aggregate_sub_bn_stats(net) == 2
    assert set_sub_bn_splits(net, 4) == 2 and net[1].num_splits == 4
    net(torch.randn(8, 3, 2, 6, 6))  # trains with 4 splits
    net.eval()
    other = model(4)
    other.load_state_dict(net.state_dict())
    other.eval()
    x = torch.randn(2, 3, 2, 6, 6)
    torch.testing.assert_close(other(x), net(x))


def test_training_loop_with_schedule_sampler_and_sub_bn(videos):
    """The loop of docs/multigrid.md on a tiny 3D CNN: shapes, lr and BN splits follow the plan."""
    torch.manual_seed(0)
    s = MultigridSchedule(**SMALL, sampling_rate=1)
    sampler = MultigridBatchSampler(len(videos), s, drop_last=True)
    loader = DataLoader(ClipDataset(videos), batch_sampler=sampler, num_workers=2)
    model = nn.Sequential(nn.Conv3d(3, 4, 3, padding=1, bias=False), SubBatchNorm3d(4, s.at(0)["lr_multiplier"]),
                          nn.ReLU(), nn.AdaptiveAvgPool3d(1), nn.Flatten(), nn.Linear(4, 3))
    base_lr = 0.05
    opt = torch.optim.SGD(model.parameters(), lr=base_lr * s.lr_at(0))
    seen, splits = set(), None
    for epoch in (0, 6, 9, 12, 20):  # one epoch of each kind of stage
        sampler.set_epoch(epoch)
        stage = s.at(epoch)
        if stage["lr_multiplier"] != splits:
            splits = stage["lr_multiplier"]
            set_sub_bn_splits(model, splits)
        for group in opt.param_groups:
            group["lr"] = base_lr * s.lr_at(epoch)
        model.train()
        for clips, labels, _ in loader:
            x = clips.permute(0, 2, 1, 3, 4).float().div(255)  # (B, 3, T, S, S)
            loss = F.cross_entropy(model(x), labels)
            opt.zero_grad()
            loss.backward()
            opt.step()
            assert torch.isfinite(loss)
            seen.add((epoch, tuple(x.shape[1:]), x.shape[0], model[1].num_splits, round(opt.param_groups[0]["lr"], 8)))
        model.eval()
        with torch.no_grad():
            assert torch.isfinite(model(torch.rand(2, 3, 8, 64, 64))).all()
    assert (0, (3, 2, 32, 32), 32, 8, 0.4) in seen  # 8x batch, 8 BN splits, 8x lr
    assert (6, (3, 4, 45, 45), 8, 4, 0.2) in seen
    assert (12, (3, 8, 64, 64), 2, 1, 0.05) in seen
    assert (20, (3, 8, 32, 32), 8, 1, 0.0005) in seen  # fine-tune, second half: decayed twice

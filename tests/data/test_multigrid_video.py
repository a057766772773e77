"""Multigrid batches over real decoded videos, end to end.

``packer decode-frames`` (the CLI) decodes the fixture videos (plus synthetic ones; only
synthetic ones without the fixtures) into frame folders and into every packed format; then a
plain ``DataLoader(dataset, batch_sampler=MultigridBatchSampler(...), num_workers=2)`` over
``FrameDataset`` / ``PackedVideoDataset`` must give batches of the scheduled shapes, holding
the clips the requests ask for (frame count, frame interval, crop), split across ranks.

The schedule (B=1, T=8, S=32, steps 0/4/6, 8 epochs, frame interval 2) by hand, with
SlowFast's rounding: long-cycle shapes (T', S') = (round(8/4), round(32 x 0.7071)) = (2, 23),
(4, 23), (4, 32), (8, 32); batch multipliers round(8 x 32^2 / (T' S'^2)) = round(7.74) = 8,
round(3.87) = 4, 2, 1; frame intervals 2 x 8 / T' = 8, 4, 4, 2. Short-cycle crops are
fractions of the full 32 px: round(16) = 16 and round(22.63) = 23, with batch multipliers
round((S'/16)^2), round((S'/22.63)^2): at 23 px round(2.07) = 2, round(1.03) = 1; at 32 px
4, round(2.0) = 2.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from torch.utils.data import DataLoader

from packer import FrameDataset, PackedVideoDataset
from packer.cli import main
from packer.data.multigrid import MultigridBatchSampler, MultigridSchedule
from packer.data.video import ClipRequest
from packer.formats import FORMATS, open_reader
from packer.codecs.image import decode
from tests.support import FIXTURE_VIDEOS
from tests.support.inputs import write_video

# xdist: these tests share one worker, so the decoded inputs (module fixtures) are made once
pytestmark = pytest.mark.xdist_group("multigrid_video")

SCHEDULE = dict(base_batch_size=1, num_frames=8, crop_size=32, lr_steps=[0, 4, 6], max_epoch=8,
                sampling_rate=2)
# (T, frame interval, short cycle [(B, S), ...]) of the first four stages and the fine-tune.
STAGES = [
    (2, 8, [(16, 16), (8, 23), (8, 23)]),
    (4, 4, [(8, 16), (4, 23), (4, 23)]),
    (4, 4, [(8, 16), (4, 23), (2, 32)]),
    (8, 2, [(4, 16), (2, 23), (1, 32)]),
    (8, 2, [(4, 16), (2, 23), (1, 32)]),
]
# Every fixture video that decodes (the AV1 one never does: it is decode-frames' failure test).
REAL = ["mmaction2_test.mp4", "mmaction2_part_0.mp4", "mmaction2_test.avi", "decord_flipping_a_pancake.mkv",
        "decord_video_90.mov", "decord_unordered.mov", "decord_corrupted.mp4", "torchcodec_h265_video.mp4"]
NUM_VIDEOS = 16
KINDS = ["FrameDataset", "PackedVideoDataset:frames"] + [f"PackedVideoDataset:{f}" for f in sorted(FORMATS)]


def schedule() -> MultigridSchedule:
    return MultigridSchedule(**SCHEDULE)


def stage_epochs(s: MultigridSchedule) -> list[int]:
    """The first epoch of each long-cycle shape of the first lr stage, and of the fine-tune."""
    return [p["start_epoch"] for p in s.plan[:4]] + [s.plan[-1]["start_epoch"]]


def expected_batches(num_samples: int, short_cycle) -> list[tuple[int, int]]:
    """(B, S) of each batch: the short cycle's phases in turn, the last batch holding the rest."""
    out, left, k = [], num_samples, 0
    while left > 0:
        b, s = short_cycle[k % len(short_cycle)]
        out.append((min(b, left), s))
        left -= b
        k += 1
    return out


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> tuple[Path, int]:
    """``src/real/<fixture>`` (links to the fixture videos, when present) and ``src/synthetic/``
    (generated: 24-31 frames of 48x64, mp4 and avi), 16 videos in all."""
    src = tmp_path_factory.mktemp("mgv") / "src"
    real = [FIXTURE_VIDEOS / name for name in REAL if (FIXTURE_VIDEOS / name).is_file()]
    for path in real:
        (src / "real").mkdir(parents=True, exist_ok=True)
        (src / "real" / path.name).symlink_to(path)
    for k in range(NUM_VIDEOS - len(real)):
        ext = "mp4" if k % 2 == 0 else "avi"
        write_video(src / "synthetic" / f"synth_{k:02d}.{ext}", frames=24 + k % 8, seed=k)
    return src, len(real)


def decode_to(src: Path, out: Path, to: str) -> Path:
    result = CliRunner().invoke(main, ["decode-frames", str(src), str(out), "--to", to, "--short-side", "64",
                                       "--max-frames", "40", "--workers", "2"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def outputs(sources, tmp_path_factory) -> dict[str, Path]:
    """``packer decode-frames`` into frame folders and into every packed format."""
    src, _ = sources
    root = tmp_path_factory.mktemp("mgout")
    outs = {"frames": decode_to(src, root / "frames", "frames")}
    for fmt in sorted(FORMATS):
        name = "packed.h5" if FORMATS[fmt][0].single_file else f"packed_{fmt}"
        outs[fmt] = decode_to(src, root / name, fmt)
    return outs


def make_dataset(kind: str, outputs: dict[str, Path], **kw):
    if kind == "FrameDataset":
        return FrameDataset(outputs["frames"], **kw)
    return PackedVideoDataset(outputs[kind.split(":")[1]], **kw)


def video_length(ds, index: int) -> int:
    if isinstance(ds, FrameDataset):
        return ds.videos[index].total_frames
    return int(ds.reader.manifest.videos[index]["length"])


def source_frames(kind: str, outputs: dict[str, Path], ds, index: int) -> list[np.ndarray]:
    """Every frame of video ``index`` as stored (0-based), read without the dataset."""
    if kind == "FrameDataset":
        folder = outputs["frames"] / ds.videos[index].frame_dir
        return [decode(p.read_bytes()) for p in sorted(folder.glob("img_*.jpg"))]
    reader = open_reader(ds.path)
    entry = reader.manifest.videos[index]
    return [decode(reader.read(entry["start"] + i).data) for i in range(entry["length"])]


def test_decoded_inputs(sources, outputs):
    _, real = sources
    ds = FrameDataset(outputs["frames"])
    assert len(ds) == NUM_VIDEOS
    assert sum(v.frame_dir.startswith("real/") for v in ds.videos) == real
    assert all(v.total_frames <= 40 for v in ds.videos)
    for fmt in sorted(FORMATS):
        assert len(PackedVideoDataset(outputs[fmt])) == NUM_VIDEOS


def test_schedule_is_the_hand_derived_one():
    s = schedule()
    got = [(s.at(e)["num_frames"], s.at(e)["sampling_rate"], s.at(e)["short_cycle"]) for e in stage_epochs(s)]
    assert got == STAGES
    assert s.plan[-1]["fine_tune"]


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_dataloader_batches_follow_the_schedule(kind, outputs):
    """Every stage: batch shapes (B, T, C, S, S), the requested frame intervals, and the very
    clips the requests ask for (seeded, so the main process can redo each one)."""
    s = schedule()
    ds = make_dataset(kind, outputs, seed=7)
    sampler = MultigridBatchSampler(len(ds), s, seed=3)
    loader = DataLoader(ds, batch_sampler=sampler, num_workers=2, persistent_workers=True)
    for epoch, (t, interval, cycle) in zip(stage_epochs(s), STAGES):
        sampler.set_epoch(epoch)
        requests = list(sampler)
        batches = list(loader)
        want = expected_batches(len(ds), cycle)
        assert [tuple(c.shape) for c, _ in batches] == [(b, t, 3, c, c) for b, c in want]
        assert len(batches) == len(sampler) == len(requests)
        assert sorted(r.index for batch in requests for r in batch) == list(range(len(ds)))
        for (clips, labels), reqs in zip(batches, requests):
            assert clips.dtype == torch.uint8
            assert {(r.num_frames, r.frame_interval, r.epoch) for r in reqs} == {(t, interval, epoch)}
            for clip, label, r in zip(clips, labels, reqs):
                # the frames read: T of them, `interval` apart (looping past the end, as mmaction2)
                total = video_length(ds, r.index)
                inds = ds.clip_indices(r)
                first = 1 if kind == "FrameDataset" else 0  # frame files are numbered from 1
                assert len(inds) == t and first <= inds.min() and inds.max() < first + total
                assert np.all(np.diff(inds) % total == interval % total)
                # the worker built exactly the clip of this request
                mine, my_label = ds[r]
                assert torch.equal(clip, mine) and int(label) == my_label


@pytest.mark.parametrize("kind", KINDS)
def test_clip_frames_are_the_requested_frames_by_content(kind, outputs):
    """Test mode, no crop: clip frame k is, pixel for pixel, stored frame off + k x interval
    (mmaction2's test-mode offset, max(n - ((T - 1) x interval + 1), 0) // 2, looping)."""
    ds = make_dataset(kind, outputs, test_mode=True)
    distinct = 0
    for index in range(len(ds)):
        frames = source_frames(kind, outputs, ds, index)
        n = len(frames)
        for t, interval, _ in STAGES[:4]:
            clip, _ = ds[ClipRequest(index, t, interval)]
            assert clip.shape == (t, 3, *frames[0].shape[:2])
            off = max(n - ((t - 1) * interval + 1), 0) // 2
            for k in range(t):
                got = clip[k].permute(1, 2, 0).numpy()
                matches = [j for j, f in enumerate(frames) if np.array_equal(f, got)]
                assert (off + k * interval) % n in matches
                distinct += len(matches) == 1
    assert distinct > 100  # most frames are unlike every other: a wrong interval cannot pass


def test_frame_folders_and_packed_formats_give_the_same_clips(outputs):
    """Training mode, seeded: the same requests give the same random clips from every output."""
    s = schedule()
    sampler = MultigridBatchSampler(NUM_VIDEOS, s, seed=1, epoch=stage_epochs(s)[2])
    requests = [r for batch in sampler for r in batch]
    ref = make_dataset("FrameDataset", outputs, seed=5)
    for kind in KINDS[1:]:
        ds = make_dataset(kind, outputs, seed=5)
        for r in requests:
            assert torch.equal(ds[r][0], ref[r][0]) and ds[r][1] == ref[r][1]


@pytest.mark.parametrize("kind", ["FrameDataset", "PackedVideoDataset:lmdb"])
def test_rank_split_gives_disjoint_equal_batches(kind, outputs):
    """num_replicas=2: disjoint index sets covering the dataset, the same number of batches of
    the same shapes on both ranks, and each rank's loader delivers its own requests."""
    s = schedule()
    ds = make_dataset(kind, outputs, seed=2, layout="CTHW")
    for epoch, (t, _, cycle) in zip(stage_epochs(s)[::2], STAGES[::2]):
        per_rank = []
        for rank in (0, 1):
            sampler = MultigridBatchSampler(len(ds), s, epoch=epoch, seed=9, num_replicas=2, rank=rank)
            requests = list(sampler)
            batches = list(DataLoader(ds, batch_sampler=sampler, num_workers=2))
            assert len(batches) == len(requests) == len(sampler)
            # CTHW: (B, C, T, S, S), the layout a 3D CNN takes
            assert [tuple(c.shape) for c, _ in batches] == [(b, 3, t, c, c) for b, c in
                                                          expected_batches(len(ds) // 2, cycle)]
            for (clips, _), reqs in zip(batches, requests):
                assert torch.equal(clips, torch.stack([ds[r][0] for r in reqs]))
            per_rank.append([[r.index for r in b] for b in requests])
        first, second = ({i for b in lists for i in b} for lists in per_rank)
        assert len(per_rank[0]) == len(per_rank[1])
        assert [len(b) for b in per_rank[0]] == [len(b) for b in per_rank[1]]
        assert not first & second and first | second == set(range(len(ds)))


def test_seeded_clips_follow_the_sampler_epoch_in_persistent_workers(outputs):
    """Persistent workers keep their own copy of the dataset, so only the requests can tell
    them the epoch: a seeded dataset must still draw new clips each epoch, and the same
    clips for the same epoch."""
    s = MultigridSchedule(**SCHEDULE, long_cycle=False, short_cycle=False)
    ds = make_dataset("FrameDataset", outputs, seed=0, crop_size=32)
    sampler = MultigridBatchSampler(len(ds), s, shuffle=False)
    loader = DataLoader(ds, batch_sampler=sampler, num_workers=2, persistent_workers=True)
    seen = []
    for epoch in (0, 1, 0):
        sampler.set_epoch(epoch)
        seen.append(torch.cat([clips for clips, _ in loader]))
    assert not torch.equal(seen[0], seen[1])
    assert torch.equal(seen[0], seen[2])

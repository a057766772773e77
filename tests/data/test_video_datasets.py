"""Clip sampling (mmaction2 SampleFrames rules) and the video datasets over real decoded frames."""
from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from packer import FrameDataset, PackedVideoDataset
from packer.data.video import ClipRequest
from packer.data.video import parse_rawframes, sample_frames
from packer.commands.decode_frames import decode_frames
from packer.errors import CorruptData, UsageError
from packer.formats import FORMATS
from packer.codecs.image import decode
from packer.conversion.options import RunOptions


# -- sampling, against expectations worked out by hand from the rules ------------------------
def test_tsn_test_mode_takes_segment_middles():
    # 300 frames, 8 segments of 37.5: middles 18.75, 56.25, ...; + start_index 1, truncated
    assert sample_frames(300, clip_len=1, num_clips=8, test_mode=True, start_index=1).tolist() == \
        [19, 57, 94, 132, 169, 207, 244, 282]
    assert sample_frames(300, clip_len=1, num_clips=8, test_mode=True).tolist() == \
        [18, 56, 93, 131, 168, 206, 243, 281]
    # twice_sample adds the segment starts 0, 37.5, 75, ...
    assert sample_frames(300, clip_len=1, num_clips=4, test_mode=True, twice_sample=True).tolist() == \
        [37, 112, 187, 262, 0, 75, 150, 225]


def test_dense_test_mode_spreads_clips_evenly():
    # 100 frames, 8 frames 2 apart span 15: max offset 85; one clip sits at 85 // 2 = 42
    assert sample_frames(100, clip_len=8, frame_interval=2, test_mode=True).tolist() == list(range(42, 57, 2))
    # three clips at round(0, 42.5, 85) = 0, 42, 85 (numpy rounds half to even)
    got = sample_frames(100, clip_len=8, frame_interval=2, num_clips=3, test_mode=True).tolist()
    assert got == list(range(0, 15, 2)) + list(range(42, 57, 2)) + list(range(85, 100, 2))


def test_short_videos_loop_or_repeat_last():
    # 10 frames, clip 0,2,..,14: out of bound indices wrap (loop) or repeat the last valid one
    assert sample_frames(10, clip_len=8, frame_interval=2, test_mode=True).tolist() == [0, 2, 4, 6, 8, 0, 2, 4]
    assert sample_frames(10, clip_len=8, frame_interval=2, test_mode=True,
                         out_of_bound_opt="repeat_last").tolist() == [0, 2, 4, 6, 8, 8, 8, 8]
    # train, 5 frames, span 8 > 5: avg interval < 0, every clip at offset 0, then loop
    assert sample_frames(5, clip_len=4, frame_interval=2, rng=np.random.RandomState(0)).tolist() == [0, 2, 4, 1]


def test_tsn_train_mode_one_random_frame_per_segment():
    # 300 frames, 8 segments of 37 frames: offset k*37 + randint(37), the rule's only draw
    draws = np.random.RandomState(0).randint(37, size=8)
    got = sample_frames(300, clip_len=1, num_clips=8, rng=np.random.RandomState(0))
    assert got.tolist() == [k * 37 + int(d) for k, d in enumerate(draws)]
    assert draws.tolist() == [0, 3, 3, 9, 19, 21, 36, 23]  # numpy's legacy MT19937 stream, seed 0
    assert got.tolist() == [0, 40, 77, 120, 167, 206, 258, 282]


def test_train_mode_fewer_frames_than_clips():
    # 5 frames, 8 segments: avg interval 0 -> round(k * 5/8) = 0,1,1,2,2,3,4,4, no randomness
    assert sample_frames(5, clip_len=1, num_clips=8, rng=np.random.RandomState(1)).tolist() == \
        [0, 1, 1, 2, 2, 3, 4, 4]
    # 10 frames, 4 clips of span 8: avg interval 0 but 10 > 8: sorted randint(3) offsets
    offs = np.sort(np.random.RandomState(3).randint(3, size=4))
    got = sample_frames(10, clip_len=4, frame_interval=2, num_clips=4, rng=np.random.RandomState(3))
    assert got.tolist() == [int(o) + d for o in offs for d in (0, 2, 4, 6)]


def test_global_numpy_state_as_mmaction2():
    np.random.seed(7)
    a = sample_frames(120, clip_len=2, frame_interval=3, num_clips=3)
    b = sample_frames(120, clip_len=2, frame_interval=3, num_clips=3, rng=np.random.RandomState(7))
    assert a.tolist() == b.tolist() and a.dtype == np.int32


@settings(max_examples=80, deadline=None)
@given(total=st.integers(1, 500), clip_len=st.integers(1, 16), interval=st.integers(1, 4),
       clips=st.integers(1, 10), test_mode=st.booleans(), seed=st.integers(0, 2 ** 31 - 1))
def test_indices_always_inside_the_video(total, clip_len, interval, clips, test_mode, seed):
    inds = sample_frames(total, clip_len=clip_len, frame_interval=interval, num_clips=clips,
                         test_mode=test_mode, start_index=1, rng=np.random.RandomState(seed))
    assert len(inds) == clip_len * clips and inds.min() >= 1 and inds.max() <= total
    if clip_len == 1 and interval == 1 and not test_mode and total >= clips:  # TSN: one per segment
        seg = total // clips
        assert all(k * seg + 1 <= i <= (k + 1) * seg for k, i in enumerate(inds))


# -- datasets over decoded frames -------------------------------------------------------------
@pytest.fixture(scope="module")
def frames_out(video_folder, tmp_path_factory):
    out = tmp_path_factory.mktemp("dv") / "frames"
    decode_frames(video_folder, out, run_options=RunOptions(workers=0, timeout=600.0))
    return out


@pytest.fixture(scope="module", params=sorted(FORMATS) + ["frames"])
def packed_out(request, video_folder, frames_out, tmp_path_factory):
    if request.param == "frames":
        return frames_out
    single = FORMATS[request.param][0].single_file
    out = tmp_path_factory.mktemp("dp") / ("p.h5" if single else "p")
    decode_frames(video_folder, out, to=request.param, run_options=RunOptions(workers=0, timeout=600.0))
    return out


def files_of(out, ds, index, inds):
    folder = out / ds.videos[index].frame_dir
    return np.stack([decode((folder / f"img_{i:05d}.jpg").read_bytes()) for i in inds])


def test_frame_dataset_returns_the_chosen_frames(frames_out):
    ds = FrameDataset(frames_out, clip_len=1, num_clips=8, seed=3)
    assert len(ds) == 4
    clip, label = ds[2]
    assert clip.dtype == torch.uint8 and clip.shape == (8, 3, 48, 64) and label == 1
    inds = ds.clip_indices(2)
    np.testing.assert_array_equal(clip.permute(0, 2, 3, 1).numpy(), files_of(frames_out, ds, 2, inds))
    again, _ = ds[2]
    assert torch.equal(clip, again)  # (seed, epoch, index) fixes the clip
    ds.set_epoch(1)
    assert not np.array_equal(ds.clip_indices(2), inds)


def test_clip_indices_take_negative_and_request_keys(frames_out):
    ds = FrameDataset(frames_out, clip_len=3, frame_interval=2, seed=4)
    assert np.array_equal(ds.clip_indices(-1), ds.clip_indices(len(ds) - 1))
    assert np.array_equal(ds.clip_indices(ClipRequest(-1, 5)), ds.clip_indices(ClipRequest(len(ds) - 1, 5)))
    assert torch.equal(ds[-1][0], ds[len(ds) - 1][0])
    # a request's epoch picks the seeded draws, as set_epoch does for plain keys
    ds.set_epoch(2)
    assert np.array_equal(ds.clip_indices(ClipRequest(1, epoch=5)), FrameDataset(
        frames_out, clip_len=3, frame_interval=2, seed=4).clip_indices(ClipRequest(1, epoch=5)))
    assert np.array_equal(ds.clip_indices(ClipRequest(1)), ds.clip_indices(ClipRequest(1, epoch=2)))
    with pytest.raises(IndexError):
        ds.clip_indices(len(ds))


def test_only_the_chosen_frames_are_read(frames_out, tmp_path):
    root = tmp_path / "copy"
    shutil.copytree(frames_out, root)
    ds = FrameDataset(root, clip_len=2, frame_interval=3, num_clips=2, test_mode=True)
    inds = set(ds.clip_indices(0).tolist())
    folder = root / ds.videos[0].frame_dir
    for p in folder.iterdir():
        if int(p.stem.split("_")[1]) not in inds:
            p.unlink()  # frames nobody asked for are gone: the clip still loads
    clip, _ = ds[0]
    assert clip.shape == (4, 3, 48, 64)
    ds_all = FrameDataset(root, clip_len=1, num_clips=8, test_mode=True)
    with pytest.raises(CorruptData, match="img_"):
        ds_all[0]


def test_layouts_and_clip_requests(frames_out):
    ds = FrameDataset(frames_out, clip_len=4, frame_interval=2, num_clips=1, layout="CTHW", test_mode=True)
    clip, _ = ds[0]
    assert clip.shape == (3, 4, 48, 64)
    tchw = FrameDataset(frames_out, clip_len=4, frame_interval=2, test_mode=True)[0][0]
    assert torch.equal(clip, tchw.permute(1, 0, 2, 3))
    multi = FrameDataset(frames_out, clip_len=4, num_clips=2, layout="CTHW", test_mode=True)[0][0]
    assert multi.shape == (2, 3, 4, 48, 64)
    # a multigrid sampler's request: 6 frames 3 apart, cropped to 32 x 32
    req = ClipRequest(1, num_frames=6, frame_interval=3, crop_size=32)
    assert ds[req][0].shape == (3, 6, 32, 32)
    assert ds[tuple(req)][0].shape == (3, 6, 32, 32)  # as a DataLoader hands it back
    train = FrameDataset(frames_out, clip_len=4, seed=0, crop_size=40)
    a, b = train[ClipRequest(0)][0], train[0][0]
    assert a.shape == (4, 3, 40, 40) and torch.equal(a, b)
    with pytest.raises(UsageError):
        FrameDataset(frames_out, layout="NTHWC")
    with pytest.raises(IndexError):
        ds[4]


def test_transform_sees_the_uint8_clip(frames_out):
    ds = FrameDataset(frames_out, clip_len=2, transform=lambda c: (c.dtype, tuple(c.shape)), test_mode=True)
    assert ds[0][0] == (torch.uint8, (2, 3, 48, 64))


def test_packed_video_dataset_matches_frame_folders(frames_out, packed_out):
    kw = dict(clip_len=2, frame_interval=2, num_clips=3, seed=11)
    fd, pd = FrameDataset(frames_out, **kw), PackedVideoDataset(packed_out, **kw)
    assert len(pd) == len(fd) == 4 and pd.classes == ["class_0", "class_1"]
    for i in range(4):
        a, la = fd[i]
        b, lb = pd[i]
        assert la == lb and torch.equal(a, b)


def test_dataloader_fork_workers(frames_out, packed_out):
    ds = PackedVideoDataset(packed_out, clip_len=1, num_clips=8, seed=5, crop_size=32)
    expected = [ds[i] for i in range(len(ds))]
    loader = DataLoader(ds, batch_size=2, num_workers=2, multiprocessing_context="fork")
    got = [(c, int(l)) for clips, labels in loader for c, l in zip(clips, labels)]
    assert len(got) == len(expected) == 4
    for (a, la), (b, lb) in zip(expected, got):
        assert la == lb and torch.equal(a, b)


@pytest.mark.slow
def test_dataloader_spawn_workers(video_folder, frames_out, tmp_path):
    packed = tmp_path / "p"
    decode_frames(video_folder, packed, to=sorted(FORMATS)[0], run_options=RunOptions(workers=0, timeout=600.0))
    kw = dict(clip_len=1, num_clips=8, seed=5, crop_size=32)
    both = torch.utils.data.ConcatDataset([FrameDataset(frames_out, **kw), PackedVideoDataset(packed, **kw)])
    expected = torch.stack([both[i][0] for i in range(len(both))])
    loader = DataLoader(both, batch_size=2, num_workers=2, multiprocessing_context="spawn")
    batches = list(loader)  # four batches: both workers load from both datasets
    clips, labels = torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])
    assert clips.shape == (8, 8, 3, 32, 32) and labels.tolist() == [0, 0, 1, 1] * 2
    assert torch.equal(clips, expected)


def test_rawframes_list_parsing(tmp_path):
    (tmp_path / "a.txt").write_text("some/dir-1 163 1\n\n  some/dir-2   122 3  \n")
    infos = parse_rawframes(tmp_path / "a.txt")
    assert [(i.frame_dir, i.total_frames, i.label) for i in infos] == [("some/dir-1", 163, 1), ("some/dir-2", 122, 3)]
    (tmp_path / "b.txt").write_text("some/dir-1 12 163 3\n")
    (info,) = parse_rawframes(tmp_path / "b.txt", with_offset=True)
    assert (info.offset, info.total_frames, info.label) == (12, 163, 3)
    # mmaction2: a line without a label reads as -1, several labels make a multi-label line
    (tmp_path / "d.txt").write_text("d 10\r\ne 11 1 2\r\n")
    assert [(i.total_frames, i.label, i.labels) for i in parse_rawframes(tmp_path / "d.txt")] == [
        (10, -1, (-1,)), (11, 1, (1, 2))]
    for bad, match in (("d\n", "expected"), ("d x 1\n", "non-integer"), ("d 0 1\n", "0 frames")):
        (tmp_path / "c.txt").write_text(bad)
        with pytest.raises(CorruptData, match=match):
            parse_rawframes(tmp_path / "c.txt")


def test_frame_dataset_checks_frame_crcs_by_default(frames_out, tmp_path):
    """A damaged frame (here: every frame file holds its neighbour's valid JPEG, so it decodes
    to a wrong clip) is a CorruptData naming the file (PackedVideoDataset on the same folder
    raised already); check_crc=False opts out and decodes what is there."""
    out = tmp_path / "frames"
    shutil.copytree(frames_out, out)
    first = FrameDataset(out, clip_len=1, num_clips=1, test_mode=True)
    v = first.videos[0]
    frames = sorted((out / v.frame_dir).iterdir())
    assert len(frames) == v.total_frames  # the comparison below covers every frame
    data = [p.read_bytes() for p in frames]
    assert len(set(data)) == len(data)
    for k, p in enumerate(frames):
        p.write_bytes(data[(k + 1) % len(data)])
    ds = FrameDataset(out, clip_len=1, num_clips=1, test_mode=True)
    with pytest.raises(CorruptData, match="CRC32C mismatch") as e:
        ds[0]
    assert e.value.path.startswith(str(out / v.frame_dir))
    with pytest.raises(CorruptData):
        PackedVideoDataset(out, clip_len=1, num_clips=1, test_mode=True)[0]
    clip, label = FrameDataset(out, clip_len=1, num_clips=1, test_mode=True, check_crc=False)[0]
    assert label == v.label and clip.shape[0] == 1


def test_frame_dataset_refuses_a_changed_label_in_its_list(frames_out, tmp_path):
    out = tmp_path / "frames"
    shutil.copytree(frames_out, out)
    lines = (out / "rawframes.txt").read_text().splitlines()
    d, n, label = lines[0].rsplit(" ", 2)
    lines[0] = f"{d} {n} {int(label) + 1}"
    (out / "rawframes.txt").write_text("\n".join(lines) + "\n")
    with pytest.raises(CorruptData, match="rawframes.txt"):
        FrameDataset(out)
    assert FrameDataset(out, check_crc=False).videos[0].label == int(label) + 1  # opted out

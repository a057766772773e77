"""Video packs (``pack-videos``): frame-exact clips by the stored index, for every sampler.

Frame ``i`` of a clip must be, bit for bit, frame ``i`` of a sequential decode of the stored
stream (``decode_all``) with the same decoder. Checked on a synthetic video that draws each
frame's number into its pixels (so a wrong frame is visible, not only different) and on the
real fixtures (H.264 with B-frames, XviD, Matroska, HEVC, a rotated mov; AV1 is a recorded failure).
"""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

av = pytest.importorskip("av")

from packer.api import pack_videos, verify  # noqa: E402
from packer.codecs.video_pack import (NONREF, EncodeOptions, VideoEncoder, decode_all, decode_frames_at,  # noqa: E402
                                      pack_stream, unpack_stream)
from packer.data.video import PackedVideoDataset  # noqa: E402
from packer.formats import open_reader  # noqa: E402
from tests.support.numbered_video import (SAMPLERS, SYNTH_FRAMES, check_clips,  # noqa: E402
                                          numbered, read_number, write_numbered)

# xdist: one worker runs this module, so its packs (module fixtures, seconds each) are built once
pytestmark = pytest.mark.xdist_group("video_packs")

VIDEOS = Path(__file__).resolve().parents[1] / "fixtures" / "videos"


@pytest.fixture(scope="module")
def synth_src(tmp_path_factory) -> Path:
    """``src/numbers/count.mp4``: H.264 with B-frames (the source side), each frame's number drawn in."""
    src = tmp_path_factory.mktemp("synth") / "src"
    write_numbered(src / "numbers" / "count.mp4")
    return src


@pytest.fixture(scope="module")
def synth_pack(synth_src, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("synthpack") / "numbers.lmdb"
    report = pack_videos(synth_src, out, to="lmdb", gop=8, workers=0)
    assert report.videos == 1 and not report.failures
    return out


@pytest.fixture(scope="module")
def fixture_pack(tmp_path_factory) -> tuple[Path, object]:
    """Every fixture video except the broken one, packed as records (AV1 must fail, recorded)."""
    src = tmp_path_factory.mktemp("fixtures") / "src"
    names = ["mmaction2_test.mp4", "mmaction2_test.avi", "decord_flipping_a_pancake.mkv", "decord_video_90.mov",
             "decord_unordered.mov", "torchcodec_h265_video.mp4", "torchcodec_av1_video.mkv",
             "mmaction2_part_0.mp4"]
    for k, name in enumerate(names):
        (src / f"c{k % 2}").mkdir(parents=True, exist_ok=True)
        shutil.copy(VIDEOS / name, src / f"c{k % 2}" / name)
    out = tmp_path_factory.mktemp("fixturepack") / "fixtures.rec"
    report = pack_videos(src, out, to="records", gop=16, workers=2, max_failures=1)
    return out, report


@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_synthetic_clips_are_the_frames_they_claim(synth_pack, name):
    ds = PackedVideoDataset(synth_pack, sampling=SAMPLERS[name], seed=3)
    blob = ds.reader.read(0).data
    ref = decode_all(blob)
    assert len(ref) == SYNTH_FRAMES == ds._video(0)[0]
    assert [read_number(f) for f in ref] == list(range(SYNTH_FRAMES))  # the reference itself is right
    assert check_clips(ds, [ref], numbers=True) > 0


def test_manifest_describes_the_stream(synth_pack):
    reader = open_reader(synth_pack)
    (v,) = reader.manifest.videos
    _, index = unpack_stream(reader.read(0).data)
    assert v["video_frames"] == index.frames == SYNTH_FRAMES
    assert v["keyframes"] == len(index.keyframes) == -(-SYNTH_FRAMES // 8)
    assert index.keyframes.tolist() == list(range(0, SYNTH_FRAMES, 8))
    assert (v["height"], v["width"], v["fps"], v["rotation"]) == (256, 320, 25.0, 0)
    assert v["source"].endswith("count.mp4")
    assert verify(synth_pack).ok


def test_fixture_pack_records_av1_and_keeps_the_rest(fixture_pack):
    out, report = fixture_pack
    failed = [Path(f["source"]).name for f in report.failures if f.get("stage") != "partial"]
    assert failed == ["torchcodec_av1_video.mkv"]
    videos = {Path(v["key"]).name: v for v in open_reader(out).manifest.videos}
    assert videos["mmaction2_test.mp4"]["video_frames"] == 300
    assert videos["mmaction2_test.avi"]["video_frames"] == 164
    assert videos["decord_flipping_a_pancake.mkv"]["video_frames"] == 310
    assert videos["torchcodec_h265_video.mp4"]["video_frames"] == 10
    rotated = videos["decord_video_90.mov"]
    assert rotated["rotation"] in (90, -90, 270) and rotated["height"] > rotated["width"]  # upright
    for v in videos.values():
        assert v["height"] % 2 == 0 and v["width"] % 2 == 0 and min(v["height"], v["width"]) in (254, 256)


@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_fixture_clips_are_frame_exact(fixture_pack, name):
    out, _ = fixture_pack
    ds = PackedVideoDataset(out, sampling=SAMPLERS[name], seed=11)
    refs = [decode_all(ds.reader.read(ds._videos[i][0]).data) for i in range(len(ds))]
    assert [len(r) for r in refs] == [ds._video(i)[0] for i in range(len(ds))]
    assert check_clips(ds, refs, numbers=False) > 0


def test_random_frame_sets_match_the_sequential_decode():
    enc = VideoEncoder(EncodeOptions(gop=5), 30)
    for i in range(61):
        enc.add(numbered(i))
    blob = pack_stream(*enc.finish())
    ref = decode_all(blob)
    rng = np.random.RandomState(0)
    for _ in range(40):
        want = rng.randint(0, 61, size=rng.randint(1, 12))
        got = decode_frames_at(blob, want)
        assert all(np.array_equal(g, ref[w]) and read_number(g) == w for g, w in zip(got, want))
    with pytest.raises(IndexError):
        decode_frames_at(blob, [61])


def test_reused_frame_buffers_give_the_same_frames_and_clips_do_not_alias_them(synth_pack):
    """``reuse=True`` (the dataset's path) writes frames into one per-thread array: the frames
    equal a fresh decode's, and a clip already returned keeps its pixels after later reads."""
    enc = VideoEncoder(EncodeOptions(gop=8), 30)
    for i in range(40):
        enc.add(numbered(i))
    blob = pack_stream(*enc.finish())
    ref = decode_all(blob)
    for want in ([3, 9, 9, 30, 1], list(range(0, 40, 2)), [39]):
        got = decode_frames_at(blob, want, reuse=True)
        assert all(np.array_equal(g, ref[w]) for g, w in zip(got, want))
    ds = PackedVideoDataset(synth_pack, sampling=SAMPLERS["dense-test"], seed=3)
    held = ds[0][0]
    first = held.clone()
    taken = set(ds.clip_indices(0).tolist())
    others = [f for f in range(ds._video(0)[0]) if f not in taken][:32]
    later = decode_frames_at(ds.reader.read(ds._videos[0][0]).data, others, reuse=True)  # the same buffers
    assert [read_number(f) for f in later] == others
    assert torch.equal(held, first)


def test_a_damaged_index_is_refused():
    enc = VideoEncoder(EncodeOptions(gop=4), 30)
    for i in range(8):
        enc.add(numbered(i))
    blob = bytearray(pack_stream(*enc.finish()))
    with pytest.raises(ValueError, match="magic"):
        unpack_stream(b"X" + bytes(blob[1:]))
    mp4, index = unpack_stream(bytes(blob))
    cut = len(blob) - len(mp4) + int(index.packets[:, 0].max()) + 1  # inside the last packet
    with pytest.raises(ValueError, match="past the end"):
        unpack_stream(bytes(blob[:cut]))


def test_resume_of_a_finished_pack_keeps_it(synth_src, tmp_path):
    out = tmp_path / "again.rec"
    first = pack_videos(synth_src, out, to="records", max_frames=40, workers=0)
    assert first.videos == 1
    again = pack_videos(synth_src, out, to="records", max_frames=40, workers=0, resume=True)
    assert again.status == "complete"
    ds = PackedVideoDataset(out, clip_len=4, frame_interval=10, test_mode=True)
    assert ds._video(0)[0] == 40


@pytest.mark.parametrize("codec", ["hevc", "av1"])
def test_other_codecs_keep_the_frame_exact_contract(synth_src, tmp_path, codec):
    """HEVC (x265, non-reference B-frames skipped as in H.264) and AV1 (SVT-AV1, keyframe
    seeking only): the same fixed GOP and the same frame-exact reads, checked by frame number."""
    out = tmp_path / f"{codec}.rec"
    report = pack_videos(synth_src, out, to="records", codec=codec, gop=8, max_frames=72, workers=0)
    assert report.videos == 1 and not report.failures
    (v,) = open_reader(out).manifest.videos
    ds = PackedVideoDataset(out, sampling=SAMPLERS["dense-sample"], seed=2)
    blob = ds.reader.read(0).data
    _, index = unpack_stream(blob)
    assert index.keyframes.tolist() == list(range(0, 72, 8)) and v["codec"] == codec and "demoted_keyframes" not in v
    assert (index.flags & NONREF).any() == (codec == "hevc")  # AV1: nothing skipped, every frame fed
    ref = decode_all(blob)
    assert [read_number(f) for f in ref] == list(range(72))
    for name in ("tsn-train", "dense-sample", "slowfast-train-jitter"):
        assert check_clips(PackedVideoDataset(out, sampling=SAMPLERS[name], seed=4), [ref], numbers=True) > 0

"""``pack-videos --copy``: source streams kept as coded, frame-exact reads by an index built from
their packets, or a recorded failure naming why.

Every fixture that can be indexed safely must read, for every sampler, frame ``i`` of a
sequential decode of the stored stream (``decode_all``, turned upright as the reader turns it);
those that cannot (a broken stream, XviD's packed B-frames whose timestamps do not give the
decoder's output order) must be refused at pack time, never read as a wrong clip.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import cv2
import numpy as np
import pytest

av = pytest.importorskip("av")

from packer.api import pack_videos, verify  # noqa: E402
from packer.codecs.video_copy import rotate_upright  # noqa: E402
from packer.codecs.video_pack import decode_all, unpack_stream  # noqa: E402
from packer.data.video import PackedVideoDataset  # noqa: E402
from packer.errors import UsageError  # noqa: E402
from packer.formats import open_reader  # noqa: E402

from tests.support.numbered_video import SAMPLERS, check_clips  # noqa: E402

# xdist: one worker runs this module, so its packs (module fixtures, seconds each) are built once
pytestmark = pytest.mark.xdist_group("video_copy")

VIDEOS = Path(__file__).resolve().parents[1] / "fixtures" / "videos"
KEPT = ["mmaction2_test.mp4", "mmaction2_part_0.mp4", "decord_flipping_a_pancake.mkv", "decord_video_90.mov",
        "decord_unordered.mov", "torchcodec_h265_video.mp4", "torchcodec_av1_video.mkv"]
REFUSED = {"mmaction2_test.avi": "decoder returned frame", "decord_corrupted.mp4": "does not decode"}


@pytest.fixture(scope="module")
def copy_pack(tmp_path_factory):
    src = tmp_path_factory.mktemp("copy") / "src"
    for k, name in enumerate([*KEPT, *REFUSED]):
        (src / f"c{k % 2}").mkdir(parents=True, exist_ok=True)
        shutil.copy(VIDEOS / name, src / f"c{k % 2}" / name)
    out = tmp_path_factory.mktemp("copyout") / "copied.lmdb"
    report = pack_videos(src, out, to="lmdb", copy=True, workers=2, max_failures=len(REFUSED))
    return out, report


def test_unsafe_streams_are_recorded_failures_naming_why(copy_pack):
    _, report = copy_pack
    failed = {Path(f["source"]).name: f for f in report.failures}
    assert sorted(failed) == sorted(REFUSED)
    for name, why in REFUSED.items():
        assert failed[name]["stage"] == "copy" and why in failed[name]["reason"], failed[name]


def test_the_stream_is_stored_untouched(copy_pack):
    out, _ = copy_pack
    reader = open_reader(out)
    videos = {Path(v["key"]).name: (i, v) for i, v in enumerate(reader.manifest.videos)}
    assert sorted(videos) == sorted(KEPT)
    for name, (i, v) in videos.items():
        stored, index = unpack_stream(reader.read(v["start"]).data)
        with av.open(str(VIDEOS / name)) as c:
            packets = [bytes(p) for p in c.demux(c.streams.video[0]) if p.size]
        assert bytes(stored) == b"".join(packets)  # the source's packets, byte for byte, in decode order
        assert v["copy"] and v["video_frames"] == index.frames == len(packets)
    assert videos["mmaction2_test.mp4"][1]["video_frames"] == 300
    assert videos["torchcodec_h265_video.mp4"][1]["codec"] == "hevc"
    rotated = videos["decord_video_90.mov"][1]
    assert rotated["rotation"] == 90 and (rotated["height"], rotated["width"]) == (568, 320)
    assert verify(out).ok


@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_copied_clips_are_frame_exact(copy_pack, name):
    out, _ = copy_pack
    ds = PackedVideoDataset(out, sampling=SAMPLERS[name], seed=7)
    refs = [rotate_upright(decode_all(ds.reader.read(ds._videos[i][0]).data), ds._rotation[i])
            for i in range(len(ds))]
    assert [len(r) for r in refs] == [ds._video(i)[0] for i in range(len(ds))]
    assert check_clips(ds, refs, numbers=False) > 0


def test_a_rotated_source_reads_upright_as_opencv_shows_it(copy_pack):
    out, _ = copy_pack
    ds = PackedVideoDataset(out, clip_len=3, test_mode=True)
    i = [Path(k).name for k in ds.keys].index("decord_video_90.mov")
    clip, _ = ds[i]
    cap = cv2.VideoCapture(str(VIDEOS / "decord_video_90.mov"))
    ok, bgr = cap.read()
    cap.release()
    ours = clip[0].permute(1, 2, 0).numpy().astype(int)
    assert ok and ours.shape == bgr.shape and np.abs(ours - bgr[:, :, ::-1]).mean() < 3


def test_copy_refuses_frame_selection_and_files(tmp_path):
    (tmp_path / "src" / "a").mkdir(parents=True)
    shutil.copy(VIDEOS / "mmaction2_part_0.mp4", tmp_path / "src" / "a")
    with pytest.raises(UsageError, match="--copy"):
        pack_videos(tmp_path / "src", tmp_path / "x.rec", copy=True, max_frames=8, workers=0)
    with pytest.raises(UsageError, match="--copy"):
        pack_videos(tmp_path / "src", tmp_path / "y", to="files", copy=True, workers=0)

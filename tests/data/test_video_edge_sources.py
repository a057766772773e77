"""Frame-exact video packs from awkward sources (issue 32, item 3): a variable frame rate, an edit
list that hides the leading frames, and rotation in the display matrix (tests/support/edge_videos.py
writes them with PyAV, each frame drawing its number).

For each: ``pack-videos`` stores the frames ``decode-frames`` takes from the same source (the same
count, in the same order: the numbers they show; the edit list made pack-videos store a fallback
decoder's frames after the first decoder's, a video played twice, until each decode attempt got its
own encoder), every clip ``PackedVideoDataset`` returns is the sequential decode of the stored
stream frame for frame, and the rotated video is stored upright. The edit list's hidden frames are
left out (by decode-frames too): see ``test_an_edit_list_gives_the_presented_frames``.
"""
from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest

av = pytest.importorskip("av")

import packer  # noqa: E402
from packer.codecs.video import decord_available, read_video  # noqa: E402
from packer.codecs.video_sources import presented_frames  # noqa: E402
from packer.codecs.video_pack import decode_all  # noqa: E402
from packer.data.video import PackedVideoDataset  # noqa: E402
from packer.formats import open_reader  # noqa: E402
from packer.formats.frames import video_streams  # noqa: E402
from tests.support.numbered_video import SAMPLERS, check_clips, read_number  # noqa: E402
from tests.support.edge_videos import write_edit_list, write_numbered, write_rotated  # noqa: E402

FRAMES, HIDE = 40, 10
# the numbers of the frames each source presents, in order (the edit list hides frames 0..9)
EXPECTED = {"vfr": list(range(FRAMES)), "rotated": list(range(FRAMES)), "editlist": list(range(HIDE, FRAMES))}


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("edge") / "src"
    plain = write_numbered(root.parent / "plain.mp4", FRAMES)
    write_numbered(root / "vfr" / "vfr.mp4", FRAMES, vfr=True)
    write_edit_list(plain, root / "editlist" / "editlist.mp4", HIDE)
    write_rotated(plain, root / "rotated" / "rotated.mp4", 90)
    return root


@pytest.fixture(scope="module")
def packs(src, tmp_path_factory) -> tuple[Path, Path]:
    """(the pack-videos output, the decode-frames output) of the same sources."""
    base = tmp_path_factory.mktemp("edgepacks")
    video = base / "videos.rec"
    report = packer.pack_videos(src, video, to="records", gop=8, workers=0)
    assert report.videos == 3 and not report.failures, report.failures  # none partial either
    frames = base / "frames.rec"
    packer.decode_frames(src, frames, to="records", short_side=256, workers=0)
    return video, frames


def upright_numbers(frames: list[np.ndarray], name: str) -> list[int]:
    """The numbers the frames show; a rotated source's frames are turned back first (either way:
    the one that reads as 0, 1, 2, ... is the rotation undone)."""
    if name != "rotated":
        return [read_number(f) for f in frames]
    assert all(f.shape[0] > f.shape[1] for f in frames)  # stored upright: portrait
    turns = [[read_number(np.rot90(f, k)) for f in frames] for k in (1, 3)]
    return max(turns, key=lambda ns: sum(a == b for a, b in zip(ns, EXPECTED[name])))


def test_the_sources_are_what_they_claim(src):
    with av.open(str(src / "vfr" / "vfr.mp4")) as c:
        pts = [f.pts for f in c.decode(video=0)]
    assert len(set(np.diff(pts).tolist())) > 1  # not a constant rate
    data = (src / "editlist" / "editlist.mp4").read_bytes()
    assert b"elst" in data
    with av.open(str(src / "editlist" / "editlist.mp4")) as c:
        assert c.streams.video[0].frames == FRAMES  # the container holds every frame; 30 are shown
        assert [read_number(f.to_ndarray(format="bgr24")) for f in c.decode(video=0)] == list(range(HIDE, FRAMES))
    with av.open(str(src / "rotated" / "rotated.mp4")) as c:
        assert next(c.decode(video=0)).rotation in (90, -90, 270)


def stored_and_decoded(packs) -> dict[str, tuple[list[int], list[int], dict]]:
    """Per source: the numbers of the pack's stored frames, of decode-frames' frames, the entry."""
    video, frames = packs
    vr, fr = open_reader(video), open_reader(frames)
    by_key = {Path(v["key"]).parts[0]: v for v in fr.manifest.videos}
    out = {}
    for v in vr.manifest.videos:
        name = Path(v["key"]).parts[0]
        stored = decode_all(vr.read(int(v["start"])).data)
        f = by_key[name]
        jpegs = [cv2.cvtColor(cv2.imdecode(np.frombuffer(fr.read(int(f["start"]) + j).data, np.uint8),
                                           cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB) for j in range(video_streams(f)[0])]
        assert len(stored) == v["video_frames"]
        out[name] = (upright_numbers(stored, name), upright_numbers(jpegs, name), v)
    return out


def test_packed_frames_are_the_frames_decode_frames_takes(packs):
    got = stored_and_decoded(packs)
    for name, (stored, decoded, v) in got.items():
        assert stored == decoded, name  # the same count, the same frames in the same order
    for name in ("vfr", "rotated"):
        assert got[name][0] == EXPECTED[name], name
    v = got["rotated"][2]
    assert v["rotation"] in (90, -90, 270) and (v["height"], v["width"]) == (320, 256)


def test_an_edit_list_gives_the_presented_frames(packs, src):
    """OpenCV honours the edit list (frames 10..39) where the container counts 40: that clean,
    short decode is not taken for a partial one, so no fallback to decord runs (which ignores the
    edit list and repeats frame 39 in place of the hidden ones: 10..39, then 39 ten times)."""
    stored, decoded, v = stored_and_decoded(packs)["editlist"]
    assert stored == decoded == EXPECTED["editlist"]
    assert v["backend"] == "opencv" and v["container_frames"] == FRAMES - HIDE
    path = src / "editlist" / "editlist.mp4"
    assert presented_frames(path) == FRAMES - HIDE
    assert presented_frames(src / "vfr" / "vfr.mp4") is None  # no frame hidden: no edit-list count
    if decord_available():  # what the fallback would have stored
        with_decord = read_video(path, backend="decord", process=lambda f: read_number(f))
        assert with_decord.frames == EXPECTED["editlist"] + [FRAMES - 1] * HIDE


@pytest.mark.parametrize("sampler", ["dense-test", "tsn-train", "repeat-last", "target-fps"])
def test_clips_are_the_sequential_decode(packs, sampler):
    video, _ = packs
    ds = PackedVideoDataset(video, sampling=SAMPLERS[sampler], seed=7)
    refs = [decode_all(ds.reader.read(ds._videos[i][0]).data) for i in range(len(ds))]
    assert check_clips(ds, refs, numbers=False) > 0

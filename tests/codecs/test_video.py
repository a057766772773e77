"""packer.codecs.video: decoding one video with decord and OpenCV, frame selection, resizing."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packer.errors import CorruptSample, UsageError
from packer.codecs.resize import parse_size
from packer.codecs.video import FrameSelection, Resize, decord_available, read_video
from tests.support import FIXTURE_VIDEOS
from tests.support.inputs import write_video

BACKENDS = ["opencv"] + (["decord"] if decord_available() else [])

# The fixtures README: frames, (rows, cols) as decoded (upright).
READABLE = {
    "mmaction2_test.mp4": (300, (256, 340)),
    "mmaction2_part_0.mp4": (32, (256, 340)),
    "mmaction2_test.avi": (164, (240, 320)),
    "decord_flipping_a_pancake.mkv": (310, (240, 426)),
    "decord_video_90.mov": (3, (568, 320)),
    "decord_unordered.mov": (4, (50, 50)),
    "torchcodec_h265_video.mp4": (10, (128, 128)),
}


@pytest.mark.parametrize("backend", ["auto"] + BACKENDS)
@pytest.mark.parametrize("name", sorted(READABLE))
def test_fixture_decodes_to_documented_count_and_size(name, backend):
    frames, shape = READABLE[name]
    v = read_video(FIXTURE_VIDEOS / name, backend=backend, process=lambda f: f.shape)
    assert len(v.frames) == frames == v.decoded_frames
    assert set(v.frames) == {shape + (3,)}
    assert not v.partial and v.error is None


@pytest.mark.parametrize("backend", BACKENDS)
def test_rotated_mov_comes_out_upright_once(backend):
    v = read_video(FIXTURE_VIDEOS / "decord_video_90.mov", backend=backend)
    assert v.info.rotation == 90
    assert (v.height, v.width) == (568, 320)  # rotated by the decoder, not again by us


def test_decord_and_opencv_agree_pixel_for_pixel():
    if not decord_available():
        pytest.skip("decord not importable")
    a = read_video(FIXTURE_VIDEOS / "mmaction2_part_0.mp4", backend="decord")
    b = read_video(FIXTURE_VIDEOS / "mmaction2_part_0.mp4", backend="opencv")
    assert len(a.frames) == len(b.frames) == 32  # zip would stop at the shorter list
    assert all(np.array_equal(x, y) for x, y in zip(a.frames, b.frames))


@pytest.mark.parametrize("backend", ["auto", "opencv"])
def test_av1_is_a_recorded_failure(backend):
    with pytest.raises(CorruptSample) as e:
        read_video(FIXTURE_VIDEOS / "torchcodec_av1_video.mkv", backend=backend, key="k")
    assert e.value.stage == "decode" and "no decodable video frames" in e.value.reason


@pytest.mark.parametrize("backend", ["auto"] + BACKENDS)
def test_corrupted_mp4_is_a_partial_decode(backend):
    v = read_video(FIXTURE_VIDEOS / "decord_corrupted.mp4", backend=backend, process=lambda f: 0)
    assert v.info.container_frames == 50
    assert v.partial and v.decoded_frames == len(v.frames)
    if backend == "decord":  # decord's threaded decoder stops at a varying frame (25..28 seen)
        assert 0 < v.decoded_frames <= 28 and v.error
    else:  # OpenCV is deterministic, and auto prefers it once decord stopped early
        assert v.decoded_frames == 28 and v.backend == "opencv"


@pytest.fixture(scope="module")
def truncated_avi(tmp_path_factory):
    """An MJPG AVI cut to 60%: its header still says 30 frames, its index is gone, and
    decord counts only the ~15 frames left (the packets it finds)."""
    path = write_video(tmp_path_factory.mktemp("cut") / "cut.avi", frames=30, size=(32, 40))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) * 6 // 10])
    return path


@pytest.mark.parametrize("backend,prefer", [("auto", "opencv"), ("auto", "decord")]
                         + [(b, "decord") for b in BACKENDS])
def test_truncated_avi_is_partial_whatever_decodes_it(truncated_avi, backend, prefer):
    for _ in range(5):  # decord's threaded decoder stops at a varying frame on it
        try:
            v = read_video(truncated_avi, backend=backend, prefer=prefer, process=lambda f: 0)
        except CorruptSample as e:  # decord alone may decode nothing of it: a recorded failure
            assert backend == "decord" and e.stage == "decode"
            continue
        # the header's 30 stands even when the backend that decoded it counted fewer
        assert v.info.container_frames == 30 and v.partial and 0 < v.decoded_frames < 30


def test_missing_and_empty_files_fail_at_read(tmp_path):
    with pytest.raises(CorruptSample) as e:
        read_video(tmp_path / "nope.mp4")
    assert e.value.stage == "read"
    (tmp_path / "empty.mp4").write_bytes(b"")
    with pytest.raises(CorruptSample) as e:
        read_video(tmp_path / "empty.mp4")
    assert e.value.stage == "read" and "empty" in e.value.reason
    (tmp_path / "text.mp4").write_text("not a video")
    with pytest.raises(CorruptSample) as e:
        read_video(tmp_path / "text.mp4")
    assert e.value.stage == "decode"


@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    return write_video(tmp_path_factory.mktemp("v") / "a.mp4", frames=30, size=(48, 64), fps=30)


@pytest.mark.parametrize("backend", BACKENDS)
def test_stride_and_max_frames(synth, backend):
    all_frames = read_video(synth, backend=backend).frames
    v = read_video(synth, backend=backend, selection=FrameSelection(stride=4))
    assert len(v.frames) == 8 and all(np.array_equal(a, all_frames[4 * i]) for i, a in enumerate(v.frames))
    v = read_video(synth, backend=backend, selection=FrameSelection(stride=4, max_frames=3))
    assert len(v.frames) == 3 and v.stopped_early and not v.partial


@pytest.mark.parametrize("backend", BACKENDS)
def test_fps_resampling_by_timestamps(synth, backend):
    all_frames = read_video(synth, backend=backend).frames
    down = read_video(synth, backend=backend, selection=FrameSelection(fps=10)).frames
    # 30 -> 10 fps: output k shows time k/10, i.e. source frame 3k
    assert len(down) == 10 and all(np.array_equal(a, all_frames[3 * k]) for k, a in enumerate(down))
    up = read_video(synth, backend=backend, selection=FrameSelection(fps=60)).frames
    # 30 -> 60 fps: every source frame twice (nearest frame to k/60; a tie goes to the earlier)
    assert len(up) == 60 and all(np.array_equal(up[k], all_frames[k // 2]) for k in range(60))
    same = read_video(synth, backend=backend, selection=FrameSelection(fps=30)).frames
    assert len(same) == 30


def test_selection_count_matches_what_decoding_keeps(synth):
    for sel in (FrameSelection(), FrameSelection(stride=4), FrameSelection(fps=10),
                FrameSelection(fps=60), FrameSelection(fps=7, max_frames=4)):
        assert sel.count(30, 30.0) == len(read_video(synth, backend="opencv", selection=sel).frames)


def test_resize_rules():
    assert Resize(short_side=128).target(256, 340) == (128, 170)
    assert Resize(short_side=512).target(240, 320) == (512, 683)  # up as well as down
    assert Resize(size=(340, 256)).target(240, 426) == (192, 340)  # fit inside, aspect kept
    assert Resize(size=(340, 256), keep_aspect=False).target(240, 426) == (256, 340)
    assert Resize(size=(0, 120)).target(240, 320) == (120, 160)
    assert Resize().target(10, 20) == (10, 20)
    assert parse_size("340x256", zero_side=True) == (340, 256)
    assert parse_size("0x120", zero_side=True) == (0, 120)
    for bad in ("340x", "ax2", "0x0", "-1x5"):
        with pytest.raises(UsageError):
            parse_size(bad, zero_side=True)
    with pytest.raises(UsageError):
        Resize(short_side=10, size=(1, 1))
    with pytest.raises(UsageError):
        FrameSelection(fps=10, stride=2)


def nearest(times: list[float], target: float) -> int:
    """The frame nearest to ``target`` (a tie: the earlier), by brute force."""
    best = min(abs(t - target) for t in times)
    return next(i for i, t in enumerate(times) if abs(t - target) <= best + 1e-9)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(frames=st.integers(1, 200), src=st.integers(1, 60), fps=st.one_of(st.none(), st.integers(1, 60)),
       stride=st.integers(1, 9), cap=st.one_of(st.none(), st.integers(1, 50)))
def test_frame_list_is_the_nearest_frame_to_each_target(frames, src, fps, stride, cap):
    """A constant-rate source: ``--fps`` output frame k is the source frame nearest to k/fps (a
    tie to the earlier), for every target up to half a frame past the last; ``--stride`` every
    K-th frame; ``--max-frames`` a prefix; ``count`` is the list's length. (Integer rates keep
    every non-tie at least 1/3600 s from a tie: float noise cannot flip one.)"""
    sel = FrameSelection(fps=fps, stride=None if fps else stride, max_frames=cap)
    times = [i / src for i in range(frames)]
    if fps:
        targets = [k / fps for k in range(int(frames * fps / src) + 2) if k / fps <= (frames - 0.5) / src + 1e-9]
        want = [nearest(times, t) for t in targets]
    else:
        want = list(range(0, frames, stride))
    want = want[:cap] if cap else want
    assert sel.select(times, float(src)) == want
    assert sel.count(frames, float(src)) == len(want)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(steps=st.lists(st.integers(1, 200), min_size=0, max_size=80), src=st.integers(5, 60),
       fps=st.integers(1, 90), cap=st.one_of(st.none(), st.integers(1, 50)))
def test_frame_list_of_a_variable_rate_source(steps, src, fps, cap):
    """Any increasing timestamps (ms steps): output frame k is the first source frame less than
    half a nominal source frame before k/fps, for every target up to half a frame past the last
    frame; so the list never goes back, and a frame repeats only when the next is too late."""
    times = [0.0]
    for ms in steps:
        times.append(times[-1] + ms / 1000)
    got = FrameSelection(fps=fps, max_frames=cap).select(times, float(src))
    half, tie = 0.5 / src, 1e-4
    want, k = [], 0
    while k / fps <= times[-1] + half + tie:
        want.append(next(i for i, t in enumerate(times) if k / fps <= t + half + tie))
        k += 1
    assert got == (want[:cap] if cap else want)
    assert got == sorted(got)

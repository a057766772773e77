"""Faults: a video stream whose keyframe flags or timestamps would make ``--copy`` return wrong
frames without an error. Open GOPs (x264 ``open-gop``: a keyframe's leading B-frames refer to the
interval before it) and P-frames falsely flagged as keyframes must not become seek points; every
clip must still be frame ``i`` of the sequential decode.
"""
from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

av = pytest.importorskip("av")

from packer.codecs.video_copy import check_random_access, copy_stream  # noqa: E402
from packer.codecs.video_pack import KEY, decode_all, decode_frames_at, unpack_stream  # noqa: E402

from tests.support.numbered_video import numbered, read_number  # noqa: E402


def _open_gop_h264(path: Path, frames: int = 90) -> None:
    """H.264 with open GOPs (x264 ``open-gop``): I-frames flagged key whose leading B-frames refer
    to the interval before, and keyframes every 10 frames."""
    with av.open(str(path), "w") as out:
        s = out.add_stream("libx264", rate=Fraction(25))
        s.width, s.height, s.pix_fmt = 256, 64, "yuv420p"
        s.codec_context.options = {"bf": "3", "g": "10", "keyint_min": "10", "x264-params": "open-gop=1:scenecut=0",
                                   "crf": "18"}
        for i in range(frames):
            for p in s.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(numbered(i)[:64, :256]), format="bgr24")):
                out.mux(p)
        for p in s.encode(None):
            out.mux(p)


def test_open_gops_read_frame_exact(tmp_path):
    path = tmp_path / "open.mp4"
    _open_gop_h264(path)
    got = copy_stream(str(path))
    flagged = copy_stream(str(path), check=False).index
    ref = decode_all(got.blob)
    assert [read_number(f) for f in ref] == list(range(90))
    # whatever the demuxer flagged, every seek point left gives the sequential frames
    assert set(got.index.keyframes.tolist()) <= set(flagged.keyframes.tolist())
    assert len(got.demoted) >= 1 and len(flagged.keyframes) == 9  # some open-GOP keyframes are no seek points
    rng = np.random.RandomState(1)
    for _ in range(60):
        want = rng.randint(0, 90, size=rng.randint(1, 10))
        frames = decode_frames_at(got.blob, want)
        assert all(np.array_equal(f, ref[w]) for f, w in zip(frames, want))


def test_a_false_keyframe_is_demoted_not_used(tmp_path):
    """A keyframe flag on a P-frame (a demuxer's wrong claim) must not become a seek point."""
    path = tmp_path / "closed.mp4"
    with av.open(str(path), "w") as out:
        s = out.add_stream("libx264", rate=Fraction(25))
        s.width, s.height, s.pix_fmt = 256, 64, "yuv420p"
        s.codec_context.options = {"bf": "0", "g": "30", "x264-params": "scenecut=0", "crf": "18"}
        for i in range(40):
            for p in s.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(numbered(i)[:64, :256]), format="bgr24")):
                out.mux(p)
        for p in s.encode(None):
            out.mux(p)
    got = copy_stream(str(path), check=False)
    stored, index = unpack_stream(got.blob)
    flags = index.flags.copy()
    flags[[13, 20]] |= KEY  # P-frames claimed as keyframes
    lied = type(index)(index.packets, flags, index.extradata, index.decoder, index.fps)
    fixed, dropped = check_random_access(bytes(stored), lied)
    assert dropped == [13, 20] and fixed.keyframes.tolist() == index.keyframes.tolist() == [0, 30]

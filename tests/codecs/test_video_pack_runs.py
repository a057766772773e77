"""``plan_runs``: the packets a clip's decode is fed, against their definition, for any stream
layout and any wanted frames (hypothesis). The CPU decode and the GPU decode both feed these."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from packer.codecs.video_pack import KEY, NONREF, StreamIndex, plan_runs


@st.composite
def streams(draw: st.DrawFn) -> StreamIndex:
    """A stream as an encoder lays it out: GOPs opened by a keyframe, each reference frame
    followed in presentation order by 0-3 non-reference B-frames that are decoded after it."""
    frames = draw(st.integers(1, 60))
    gop = draw(st.integers(1, 16))
    bframes = draw(st.integers(0, 3))
    flags = np.zeros(frames, np.uint8)
    decode = []  # frame numbers in decode order
    f = 0
    while f < frames:
        if f % gop == 0:  # a keyframe: closed GOP, decoded first
            flags[f] |= KEY
            decode.append(f)
            f += 1
            continue
        ref = min(f + bframes, frames - 1, (f // gop + 1) * gop - 1)  # the P after the Bs, in this GOP
        decode.append(ref)
        for b in range(f, ref):
            flags[b] |= NONREF
            decode.append(b)
        f = ref + 1
    packets = np.zeros((frames, 3), np.uint32)
    packets[decode, 2] = np.arange(frames)
    return StreamIndex(packets, flags, b"", "h264", 25.0)


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_runs_feed_exactly_what_the_wanted_frames_need(data):
    index = data.draw(streams())
    wanted = data.draw(st.lists(st.integers(0, index.frames - 1), min_size=1, max_size=20))
    runs = plan_runs(index, wanted)
    pos = index.packets[:, 2].astype(int)
    assert set().union(*(r.want for r in runs)) == set(wanted)
    for r in runs:
        first = r.fed[0]
        assert index.flags[first] & KEY  # a fresh decoder starts at a keyframe
        assert [pos[f] for f in r.fed] == sorted(pos[f] for f in r.fed)  # in decode order
        assert first <= min(r.want) and not any(index.flags[k] & KEY for k in range(first + 1, min(r.want) + 1))
        last = max(pos[f] for f in r.want)
        assert max(pos[f] for f in r.fed) == last  # nothing decoded past the last wanted frame's position
        span = [f for f in range(index.frames) if pos[first] <= pos[f] <= last]
        # every reference frame on the way, and of the non-reference ones only the wanted
        assert set(r.fed) == {f for f in span if not index.flags[f] & NONREF or f in r.want}
    # runs are disjoint and in order: a later run starts at a keyframe after the earlier's frames
    for a, b in zip(runs, runs[1:]):
        assert max(a.want) < min(b.want) and b.fed[0] > max(a.want)


def test_frames_outside_the_stream_are_an_index_error():
    index = StreamIndex(np.zeros((3, 3), np.uint32) + np.arange(3, dtype=np.uint32)[:, None] * [0, 0, 1],
                        np.array([KEY, 0, 0], np.uint8), b"", "h264", 25.0)
    assert plan_runs(index, []) == []
    with pytest.raises(IndexError):
        plan_runs(index, [3])
    with pytest.raises(IndexError):
        plan_runs(index, [-1])


@pytest.fixture(scope="module")
def stream():
    """A real H.264 stream (GOP 8, two B-frames) of 24 numbered frames, and its index."""
    from packer.codecs.video_pack import EncodeOptions, VideoEncoder, pack_stream, unpack_stream
    from tests.support.numbered_video import numbered

    enc = VideoEncoder(EncodeOptions(gop=8), 25)
    for i in range(24):
        enc.add(numbered(i))
    return unpack_stream(pack_stream(*enc.finish()))


def fed(mp4, index, run, numbers=None):
    from packer.codecs.video_pack import _decoder, _packet, feed_run

    return list(feed_run(_decoder(index), [_packet(mp4, index, f) for f in (numbers or run.fed)], run))


def test_feed_run_gives_the_wanted_frames_and_checks_the_decoder(stream):
    from tests.support.numbered_video import read_number
    from packer.codecs.video_pack import to_rgb

    mp4, index = stream
    (run,) = plan_runs(index, [9, 12, 13])
    got = fed(mp4, index, run)
    assert [f for f, _ in got] == [9, 12, 13] and [read_number(to_rgb(x)) for _, x in got] == [9, 12, 13]
    with pytest.raises(ValueError, match="gave more frames"):  # a packet the run does not count
        fed(mp4, index, run, run.fed + [run.fed[-1] + 1])
    longer = type(run)(run.fed + [max(run.fed) + 1], run.want)
    with pytest.raises(ValueError, match=r"gave \d+ frames"):  # counted a packet never fed
        fed(mp4, index, longer, run.fed)
    with pytest.raises(ValueError):  # a reference frame's packet missing: the frames come out shifted
        fed(mp4, index, run, run.fed[:1] + run.fed[2:])
    with pytest.raises(ValueError, match="returned frame"):  # the packets in another order than counted
        swapped = type(run)([run.fed[0], *reversed(run.fed[1:])], run.want)
        fed(mp4, index, swapped, swapped.fed[:1] + sorted(swapped.fed[1:], key=lambda f: -f))

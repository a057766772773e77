"""A stored video stream that does not decode to the frames its index says (issue 32): a pack
whose stream was doctored after it was encoded and indexed, under valid CRCs (written by packer's
own writer, so every checksum, manifest and claim is right and only the stream lies).

Doctored: one packet's bytes replaced, at the same size, by an H.264 filler NAL unit, a packet
with no picture: a non-reference B-frame, or a reference P-frame (the frames after it in its GOP
need it). FFmpeg's decoder refuses such a packet (``InvalidDataError``) rather than skipping it
(so does an access unit delimiter, an SEI or zeroes in its place): the frame count never comes
out short silently. The pack-time check (a sequential decode against the index, which
``pack-videos`` records as a ``stage: "verify"`` failure) fails; ``packer verify`` fails the
pack; and every clip of every sampler, over three epochs, is either the undamaged stream's
frames or a ``CorruptData``: never a wrong clip.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

av = pytest.importorskip("av")

import packer  # noqa: E402
from packer.claim import claim_output  # noqa: E402
from packer.codecs.video_pack import (KEY, NONREF, count_frames, decode_all, decode_frames_at,  # noqa: E402
                                      index_mp4, pack_stream, unpack_stream)
from packer.data.video import PackedVideoDataset  # noqa: E402
from packer.errors import CorruptData, VerifyFailed  # noqa: E402
from packer.formats import FORMATS, open_reader  # noqa: E402
from packer.formats.sample import Sample  # noqa: E402
from tests.support.numbered_video import SAMPLERS  # noqa: E402
from tests.support.edge_videos import write_numbered  # noqa: E402

FRAMES = 48


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    """A pack-videos output (records, --gop 8) of one numbered H.264 source."""
    src = tmp_path_factory.mktemp("vstream") / "src"
    write_numbered(src / "n" / "count.mp4", FRAMES)
    pack = src.parent / "good.rec"
    assert packer.pack_videos(src, pack, to="records", gop=8, workers=0).videos == 1
    return pack


def filler(size: int) -> bytes:
    """``size`` bytes of one AVCC (4-byte length) H.264 filler-data NAL unit: no picture."""
    return (size - 4).to_bytes(4, "big") + b"\x0c" + b"\xff" * (size - 6) + b"\x80"


def doctored(blob: bytes, frame: int) -> bytes:
    """The packed video with frame ``frame``'s packet turned into filler, re-indexed as
    ``pack-videos`` indexes a stream it encoded (the index still counts the packet as a frame)."""
    mp4, index = unpack_stream(blob)
    mp4 = bytearray(mp4)
    off, size = int(index.packets[frame, 0]), int(index.packets[frame, 1])
    mp4[off:off + size] = filler(size)
    again = index_mp4(bytes(mp4), index.decoder, index.fps)
    assert again.frames == index.frames
    return pack_stream(bytes(mp4), again)


def republish(good: Path, out: Path, blob: bytes) -> Path:
    """``good`` rewritten by packer's records writer with ``blob`` as its video: valid CRCs,
    manifest, claim; the same manifest entries."""
    reader = open_reader(good)
    rec = reader.read(0)
    with claim_output(out):
        w = FORMATS["records"][0](out, classes=reader.classes, kind="videos",
                                  created_by=reader.manifest.created_by)
        w.open()
        v = reader.manifest.videos[0]
        w.add(Sample(reader.keys[0], blob, rec.fmt, rec.label, rec.height, rec.width, rec.channels,
                     {"frame_dir": v["frame_dir"], "frames": v["video_frames"]}))
        w.close(videos=reader.manifest.videos)
    return out


@pytest.fixture(scope="module", params=["b-frame", "p-frame"])
def damaged(request, good, tmp_path_factory) -> tuple[Path, int, list[np.ndarray]]:
    """(the doctored pack, the doctored frame, the undamaged stream's frames)."""
    blob = open_reader(good).read(0).data
    _, index = unpack_stream(blob)
    flags = index.flags
    kind = NONREF if request.param == "b-frame" else 0
    frame = next(f for f in range(9, FRAMES) if (flags[f] & NONREF) == kind and not flags[f] & KEY)
    bad = doctored(blob, frame)
    out = republish(good, tmp_path_factory.mktemp("vstream") / f"{request.param}.rec", bad)
    return out, frame, decode_all(blob)


def test_the_pack_time_check_fails_the_stream(damaged):
    out, frame, _ = damaged
    blob = open_reader(out).read(0).data
    assert unpack_stream(blob)[1].frames == FRAMES  # the index still holds every frame
    with pytest.raises(ValueError):  # av's InvalidDataError: pack-videos records it (stage "verify")
        count_frames(blob)


def test_verify_fails_the_pack(damaged):
    out, _, _ = damaged
    with pytest.raises(VerifyFailed) as e:
        packer.verify(out)
    assert any("undecodable video" in p for p in e.value.result.problems), e.value.result.problems


@pytest.mark.parametrize("sampler", sorted(SAMPLERS))
def test_every_clip_is_right_or_corrupt_data(damaged, sampler):
    out, frame, ref = damaged
    ds = PackedVideoDataset(out, sampling=SAMPLERS[sampler], seed=1)
    right = corrupt = 0
    for epoch in range(3):
        ds.set_epoch(epoch)
        for _ in range(4):
            inds = ds.clip_indices(0)
            try:
                clip, _ = ds[0]
            except CorruptData:
                corrupt += 1
                continue
            for k, j in enumerate(inds.tolist()):
                assert np.array_equal(clip[k].permute(1, 2, 0).numpy(), ref[j]), f"clip frame {k}: not frame {j}"
            right += 1
    assert right + corrupt == 12


def test_the_doctored_frame_itself_is_corrupt_data(damaged):
    out, frame, ref = damaged
    blob = open_reader(out).read(0).data
    with pytest.raises(ValueError):
        decode_frames_at(blob, [frame])
    ds = PackedVideoDataset(out, clip_len=1, num_clips=FRAMES, test_mode=True)
    with pytest.raises(CorruptData):
        ds[0]
    keys = [0, 8, 16, 24, 32, 40]
    before = [k for k in keys if k + 8 <= frame]  # whole GOPs before the damage decode right
    got = decode_frames_at(blob, before)
    assert all(np.array_equal(g, ref[k]) for g, k in zip(got, before))


"""``pack-videos --copy``: a source's video stream kept as it is (no re-encode), indexed for
frame-exact random access, or refused with the reason.

``copy_stream(path)`` demuxes the source's first video stream and keeps its packets' bytes
untouched, in decode order, back to back (the stored "container" is nothing but the packets:
``decode_indexed`` reads each by offset and size, with the stream's extradata). The frame index
comes from the packets alone: presentation order is the rank of their timestamps (every packet
needs one, no two alike, and the first frame shown must be the first decoded); keyframes are
the demuxer's; a frame is non-reference only where the bitstream says so for certain (H.264 in
AVCC form: ``nal_ref_idc`` 0 on every slice; HEVC with one temporal sub-layer: every slice a
sub-layer non-reference type), else every frame is fed.

A keyframe flag is a claim, not a proof (open GOPs, HEVC CRA pictures with leading frames,
B-frames across a keyframe). So ``check_random_access`` decodes the whole stream once as the
reference (``decode_all``: its frame count must equal the index's, each frame coming out with
the number the index gave its packet), then decodes every keyframe interval afresh from its
keyframe exactly as a clip read does, and compares the frames bit for bit: a keyframe whose
interval differs stops being a seek point (its interval joins the previous one, which is checked
again). The first keyframe is the sequential decode's own start. What remains is what
``decode_indexed`` may seek to, so every read returns frame ``i`` of the sequential decode, and a
stream that cannot be decoded in order is a ``ValueError`` naming why (a recorded failure).
"""
from __future__ import annotations

import hashlib
from typing import NamedTuple, Optional

import numpy as np

from packer.codecs.video_pack import (KEY, NONREF, StreamIndex, _check, _run, _sequential, nonref_test, pack_stream,
                                      plan_runs, run_packets, to_rgb)

__all__ = ["copy_stream", "check_random_access", "CopyResult", "rotate_upright"]


class CopyResult(NamedTuple):
    """A copied stream: the packed sample, its index, and the keyframes the demuxer flagged that
    failed the random-access check (frame numbers: no longer seek points)."""

    blob: bytes
    index: StreamIndex
    demoted: list[int]
    rotation: int  # degrees clockwise to turn a frame upright (OpenCV's CAP_PROP_ORIENTATION_META)
    height: int  # as coded (before rotation)
    width: int


def copy_stream(path: str, *, check: bool = True) -> CopyResult:
    """The source's video packets, untouched, with a frame index built from them and checked
    (``check_random_access``); ValueError naming why the stream cannot be indexed safely."""
    import av

    with av.open(str(path)) as container:
        if not container.streams.video:
            raise ValueError("no video stream")
        stream = container.streams.video[0]
        ctx = stream.codec_context
        decoder = ctx.name
        extradata = bytes(ctx.extradata or b"")
        fps = float(stream.average_rate or stream.guessed_rate or 0) or 30.0
        nonref = nonref_test(decoder, extradata)
        chunks, rows, pts, flags = [], [], [], []
        at = 0
        for packet in container.demux(stream):
            if packet.size == 0:
                continue
            if packet.pts is None:
                raise ValueError(f"packet {len(rows)} (decode order) has no presentation timestamp")
            data = bytes(packet)
            rows.append((at, len(data), len(rows)))
            at += len(data)
            chunks.append(data)
            pts.append(int(packet.pts))
            flags.append((KEY if packet.is_keyframe else 0) | (NONREF if nonref is not None and nonref(data) else 0))
        rotation, height, width = 0, ctx.height, ctx.width
        if rows:  # the display matrix reaches the frames the container's own decoder returns
            container.seek(0)
            for frame in container.decode(stream):
                rotation = (-int(round(getattr(frame, "rotation", 0) or 0))) % 360
                height, width = frame.height, frame.width
                break
    if not rows:
        raise ValueError("the video stream holds no packets")
    if len(set(pts)) != len(pts):
        raise ValueError("two packets share a presentation timestamp")
    if at >= 1 << 32:
        raise ValueError("the video stream is larger than 4 GiB")
    order = np.argsort(np.asarray(pts), kind="stable")
    packets = np.asarray(rows, dtype=np.uint32).reshape(-1, 3)[order]
    flag_arr = np.asarray(flags, dtype=np.uint8)[order]
    if packets[0, 2] != 0:
        raise ValueError("the first frame shown is not the first decoded (frames before the first keyframe)")
    if not flag_arr[0] & KEY:
        raise ValueError("the stream does not start with a keyframe")
    index = StreamIndex(packets, flag_arr, extradata, decoder, fps)
    stored = b"".join(chunks)
    if not check:
        return CopyResult(pack_stream(stored, index), index, [], rotation, height, width)
    index, demoted = check_random_access(stored, index)
    return CopyResult(pack_stream(stored, index), index, demoted, rotation, height, width)


def _digest_rgb(rgb: np.ndarray) -> bytes:
    return hashlib.blake2b(np.ascontiguousarray(rgb).data, digest_size=16).digest()


def _digest(frame) -> bytes:
    return _digest_rgb(to_rgb(frame))


def check_random_access(stored: bytes, index: StreamIndex) -> tuple[StreamIndex, list[int]]:
    """(the index keeping only the keyframes a fresh decode from which gives the sequential
    decode's frames, bit for bit; the frame numbers of those it dropped). ValueError when the sequential decode
    itself does not match the index (frame count, order)."""
    import av

    blob = pack_stream(stored, index)
    reference: list[bytes] = []
    try:
        for n, frame in enumerate(_sequential(blob)):
            if frame.pts is None:
                raise ValueError("the decoder returns frames without the packets' timestamps: their order "
                                 "cannot be checked")
            _check(frame, n)
            reference.append(_digest(frame))
    except av.error.FFmpegError as e:
        raise ValueError(f"the stream does not decode in order ({e})") from None
    if len(reference) != index.frames:
        raise ValueError(f"a sequential decode gives {len(reference)} frames, the packets {index.frames}")
    flags = index.flags.copy()
    mp4 = memoryview(stored)
    keys = [int(k) for k in np.flatnonzero(flags & KEY)]
    dropped: list[int] = []
    j = 0
    while j < len(keys):
        start, end = keys[j], keys[j + 1] if j + 1 < len(keys) else index.frames
        current = StreamIndex(index.packets, flags, index.extradata, index.decoder, index.fps)
        out: dict[int, np.ndarray] = {}
        try:
            for run in plan_runs(current, range(start, end)):  # one run: the next keyframe ends it
                _run(current, run_packets(mp4, current, run), run, out)
            ok = all(_digest_rgb(out[f]) == reference[f] for f in range(start, end))
        except Exception:  # a fresh decoder that cannot start here (ValueError, FFmpegError)
            ok = False
        if ok:
            j += 1
        elif j == 0:
            raise ValueError("a fresh decode from the first frame differs from the sequential one")
        else:
            flags[start] &= ~KEY & 0xFF
            del keys[j]
            dropped.append(start)
            j -= 1  # the previous interval now runs on: check it again
    return StreamIndex(index.packets, flags, index.extradata, index.decoder, index.fps), sorted(dropped)


ROT90_TURNS = {0: 0, 90: 3, 180: 2, 270: 1}  # rotation -> np.rot90 k (90: as OpenCV shows the fixture)


def rotate_upright(frames: list[np.ndarray], rotation: Optional[int]) -> list[np.ndarray]:
    """Frames of a copied stream turned as its container's rotation says (what OpenCV and decord
    show: they rotate a rotated video's frames upright)."""
    k = ROT90_TURNS[int(rotation or 0) % 360]
    return frames if not k else [np.ascontiguousarray(np.rot90(f, k)) for f in frames]

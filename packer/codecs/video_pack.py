"""Videos kept as video: re-encode to H.264 in MP4 with a stored frame index; decode frames by it.

``VideoEncoder`` turns frames (BGR uint8, one size) into an in-memory MP4 with a fixed keyframe
interval (``gop``) and no B-frames, so decode order is presentation order and every packet is
one frame. ``finish`` demuxes the result once to build the ``StreamIndex``: each frame's packet
(offset and size in the MP4), the keyframes, the codec's extradata. A packed sample is
``pack_stream(mp4, index)``: a small binary header (the index) followed by the MP4 bytes.

``decode_frames_at(blob, frames)`` decodes only what ``frames`` needs: for each run of wanted
frames it starts a fresh decoder at the keyframe at or before the first of them and counts
frames out of it (the j-th frame out is frame ``keyframe + j``); timestamps are never read.
``decode_all`` is the sequential reference decode (one decoder, frame 0 to the end): frame i
of ``decode_frames_at`` equals frame i of ``decode_all``, bit for bit (tests/data/test_video_packs.py).
"""
from __future__ import annotations

import io
import struct
from dataclasses import dataclass
from fractions import Fraction
from typing import Iterable, Optional, Sequence

import cv2
import numpy as np

__all__ = ["VIDEO_FMT", "CODECS", "EncodeOptions", "StreamIndex", "VideoEncoder", "pack_stream",
           "unpack_stream", "decode_frames_at", "decode_all", "count_frames"]

VIDEO_FMT = "video"  # the Sample.fmt of a packed video (sniff_format names it from MAGIC)
CODECS = {"h264": ("libx264", "h264")}  # --codec -> (encoder, decoder)
MAGIC = b"PKVID1\0\0"
_HEAD = struct.Struct("<8sIIII")  # magic, frames, extradata bytes, codec name bytes, fps x 1000


@dataclass(frozen=True)
class EncodeOptions:
    """How ``pack-videos`` re-encodes: codec, keyframe interval, quality, encoder speed.

    Args:
        codec: ``h264`` (libx264 through PyAV's FFmpeg).
        gop: frames from one keyframe to the next (>= 1; 1 is all-intra).
        crf: constant rate factor (0..51, lower is better quality and bigger).
        preset: the x264 speed/size preset (``ultrafast`` .. ``veryslow``).
        threads: encoder threads per video (1: one worker per core does the parallelism).
        fastdecode: x264's ``tune=fastdecode`` (no CABAC, no deblocking filter): measured ~30%
            less decode time per frame for ~11% more bytes (docs/video.md); clips are decode-bound.
    """

    codec: str = "h264"
    gop: int = 8  # scripts/bench/video.py packs: the longest GOP meeting every clip target
    crf: int = 20
    preset: str = "veryfast"
    threads: int = 1
    fastdecode: bool = True

    def __post_init__(self) -> None:
        if self.codec not in CODECS:
            raise ValueError(f"codec must be one of {', '.join(CODECS)}, not {self.codec!r}")
        if self.gop < 1:
            raise ValueError(f"gop must be >= 1, not {self.gop}")
        if not 0 <= self.crf <= 51:
            raise ValueError(f"crf must be in 0..51, not {self.crf}")
        presets = ("ultrafast", "superfast", "veryfast", "faster", "fast", "medium", "slow", "slower",
                   "veryslow")
        if self.preset not in presets:
            raise ValueError(f"preset must be one of {', '.join(presets)}, not {self.preset!r}")
        if self.threads < 1:
            raise ValueError(f"threads must be >= 1, not {self.threads}")


@dataclass(frozen=True)
class StreamIndex:
    """Where each frame of a packed stream is: packet (offset, size) rows in presentation order
    (= decode order: no B-frames), the keyframes, the decoder's extradata, the frame rate."""

    packets: np.ndarray  # (frames, 2) uint32: offset, size in the MP4
    keyframes: np.ndarray  # sorted frame numbers of the keyframes (0 first)
    extradata: bytes
    decoder: str
    fps: float

    @property
    def frames(self) -> int:
        return len(self.packets)


class VideoEncoder:
    """Frames in (``add``: BGR uint8, all one even size), MP4 bytes and their index out (``finish``)."""

    def __init__(self, options: EncodeOptions, fps: float):
        self.options = options
        self.fps = float(fps) if fps and fps > 0 else 30.0
        self._buf = io.BytesIO()
        self._out = None
        self._stream = None
        self.count = 0

    def _open(self, height: int, width: int) -> None:
        import av

        o = self.options
        self._out = av.open(self._buf, "w", format="mp4")
        rate = Fraction(self.fps).limit_denominator(1001)
        stream = self._out.add_stream(CODECS[o.codec][0], rate=rate)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.time_base = 1 / rate
        stream.codec_context.thread_count = o.threads
        # a fixed GOP: keyframes every gop frames only (no scene-cut keyframes), closed, no B-frames
        stream.codec_context.options = {"crf": str(o.crf), "preset": o.preset, "bf": "0", "g": str(o.gop),
                                        "keyint_min": str(o.gop), "sc_threshold": "0",
                                        "x264-params": "scenecut=0:open-gop=0"}
        if o.fastdecode:
            stream.codec_context.options = {**stream.codec_context.options, "tune": "fastdecode"}
        self._stream = stream

    def add(self, frame: np.ndarray) -> None:
        """Encode one BGR frame (HxWx3 uint8, even height and width)."""
        import av

        h, w = frame.shape[:2]
        if self._out is None:
            if h % 2 or w % 2:
                raise ValueError(f"a {w}x{h} frame: 4:2:0 video needs an even width and height")
            self._open(h, w)
        elif (h, w) != (self._stream.height, self._stream.width):
            raise ValueError(f"frame {self.count} is {w}x{h}, the video {self._stream.width}x{self._stream.height}")
        vf = av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="bgr24")
        vf.pts = self.count
        for packet in self._stream.encode(vf):
            self._out.mux(packet)
        self.count += 1

    def finish(self) -> tuple[bytes, StreamIndex]:
        """Flush the encoder, close the MP4 and index it (ValueError when no frame was added or
        the MP4 does not hold one packet per frame)."""
        if self._out is None:
            raise ValueError("no frames to encode")
        for packet in self._stream.encode(None):
            self._out.mux(packet)
        self._out.close()
        mp4 = self._buf.getvalue()
        index = index_mp4(mp4, CODECS[self.options.codec][1], self.fps)
        if index.frames != self.count:
            raise ValueError(f"the MP4 holds {index.frames} packets for {self.count} frames")
        return mp4, index


def index_mp4(mp4: bytes, decoder: str, fps: float) -> StreamIndex:
    """The packets of the MP4's video stream in file order (decode order), checked to be its bytes."""
    import av

    with av.open(io.BytesIO(mp4)) as container:
        stream = container.streams.video[0]
        extradata = bytes(stream.codec_context.extradata or b"")
        rows, keys = [], []
        for packet in container.demux(stream):
            if packet.size == 0:
                continue
            pos = int(packet.pos)
            if pos < 0 or mp4[pos:pos + packet.size] != bytes(packet):
                raise ValueError(f"packet {len(rows)} is not stored contiguously in the MP4")
            if packet.is_keyframe:
                keys.append(len(rows))
            rows.append((pos, packet.size))
    if not keys or keys[0] != 0:
        raise ValueError("the stream does not start with a keyframe")
    return StreamIndex(np.asarray(rows, dtype=np.uint32).reshape(-1, 2), np.asarray(keys, dtype=np.int64),
                       extradata, decoder, float(fps))


def pack_stream(mp4: bytes, index: StreamIndex) -> bytes:
    """One packed sample: the index (header, extradata, decoder name, packet rows, a keyframe
    flag per frame) followed by the MP4 bytes."""
    name = index.decoder.encode("ascii")
    flags = np.zeros(index.frames, dtype=np.uint8)
    flags[index.keyframes] = 1
    head = _HEAD.pack(MAGIC, index.frames, len(index.extradata), len(name), int(round(index.fps * 1000)))
    return b"".join([head, index.extradata, name, index.packets.astype("<u4").tobytes(), flags.tobytes(), mp4])


def unpack_stream(blob: bytes | memoryview) -> tuple[memoryview, StreamIndex]:
    """(the MP4 bytes, their index) of a packed sample (ValueError when it is not one)."""
    view = memoryview(blob)
    if len(view) < _HEAD.size:
        raise ValueError("too short for a packed video")
    magic, frames, n_extra, n_name, fps = _HEAD.unpack_from(view)
    if magic != MAGIC:
        raise ValueError("not a packed video (bad magic)")
    at = _HEAD.size
    extradata = bytes(view[at:at + n_extra])
    at += n_extra
    decoder = bytes(view[at:at + n_name]).decode("ascii")
    at += n_name
    packets = np.frombuffer(view, dtype="<u4", count=2 * frames, offset=at).reshape(frames, 2)
    at += 8 * frames
    flags = np.frombuffer(view, dtype=np.uint8, count=frames, offset=at)
    at += frames
    mp4 = view[at:]
    if frames and int((packets[:, 0].astype(np.int64) + packets[:, 1]).max()) > len(mp4):
        raise ValueError("a packet lies past the end of the stored video")
    return mp4, StreamIndex(packets, np.flatnonzero(flags), extradata, decoder, fps / 1000.0)


def _rgb(frame) -> np.ndarray:
    """A decoded frame as HxWx3 RGB uint8: 4:2:0 through OpenCV's I420 (BT.601) conversion, at
    about a third of the cost of PyAV's ``to_ndarray(format="rgb24")`` (0.05-0.1 against 0.23 ms
    a 340x256 frame, where decoding it costs about 0.3 ms)."""
    if frame.format.name == "yuv420p":
        return cv2.cvtColor(frame.to_ndarray(), cv2.COLOR_YUV2RGB_I420)
    return frame.to_ndarray(format="rgb24")


def _decoder(index: StreamIndex):
    import av

    ctx = av.CodecContext.create(index.decoder, "r")
    if index.extradata:
        ctx.extradata = index.extradata
    ctx.thread_count = 1  # one decode per loader worker: the workers are the parallelism
    return ctx


def _run(mp4: memoryview, index: StreamIndex, first: int, last: int, want: set[int],
         out: dict[int, np.ndarray]) -> None:
    """Decode frames ``first`` (a keyframe) to ``last`` with a fresh decoder, keeping ``want``."""
    import av

    ctx = _decoder(index)
    n = first

    def take(frames: Iterable) -> None:
        nonlocal n
        for frame in frames:
            if n in want:
                out[n] = _rgb(frame)
            n += 1

    for i in range(first, last + 1):
        off, size = int(index.packets[i, 0]), int(index.packets[i, 1])
        take(ctx.decode(av.Packet(bytes(mp4[off:off + size]))))
    if n <= last:  # frames the decoder still holds
        take(ctx.decode(None))
    if n <= last:
        raise ValueError(f"decoding frames {first}..{last} gave only {n - first} frames")


def decode_frames_at(blob: bytes | memoryview, frames: Sequence[int]) -> list[np.ndarray]:
    """RGB frames (HxWx3 uint8) number ``frames`` (0-based, any order, repeats allowed) of a
    packed video, decoding from the keyframe at or before each run of wanted frames."""
    mp4, index = unpack_stream(blob)
    wanted = sorted(set(int(f) for f in frames))
    if wanted and (wanted[0] < 0 or wanted[-1] >= index.frames):
        raise IndexError(f"frames {wanted[0]}..{wanted[-1]} outside 0..{index.frames - 1}")
    out: dict[int, np.ndarray] = {}
    keys = index.keyframes
    i = 0
    while i < len(wanted):
        start = int(keys[np.searchsorted(keys, wanted[i], side="right") - 1])
        # one run: every wanted frame before the next keyframe past the last one taken is on the way
        j = i
        while j + 1 < len(wanted):
            nxt = int(keys[np.searchsorted(keys, wanted[j + 1], side="right") - 1])
            if nxt > wanted[j]:  # a keyframe after the last wanted: start afresh there
                break
            j += 1
        _run(mp4, index, start, wanted[j], set(wanted[i:j + 1]), out)
        i = j + 1
    return [out[int(f)] for f in frames]


def decode_all(blob: bytes | memoryview, *, limit: Optional[int] = None) -> list[np.ndarray]:
    """Every frame of a packed video, decoded sequentially by one decoder from frame 0 (the
    reference ``decode_frames_at`` is held to); ``limit``: stop after that many."""
    import av

    mp4, index = unpack_stream(blob)
    ctx = _decoder(index)
    out: list[np.ndarray] = []
    end = index.frames if limit is None else min(limit, index.frames)
    for i in range(end):
        off, size = int(index.packets[i, 0]), int(index.packets[i, 1])
        out.extend(_rgb(f) for f in ctx.decode(av.Packet(bytes(mp4[off:off + size]))))
    out.extend(_rgb(f) for f in ctx.decode(None))
    return out[:end]


def count_frames(blob: bytes | memoryview) -> int:
    """Frames a sequential decode of the whole stored stream yields (no colour conversion)."""
    import av

    mp4, index = unpack_stream(blob)
    ctx = _decoder(index)
    n = 0
    for i in range(index.frames):
        off, size = int(index.packets[i, 0]), int(index.packets[i, 1])
        n += len(ctx.decode(av.Packet(bytes(mp4[off:off + size]))))
    return n + len(ctx.decode(None))

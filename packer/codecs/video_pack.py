"""Videos kept as video: re-encode to H.264 (or HEVC, AV1) in MP4 with a stored frame index;
decode frames by it.

``VideoEncoder`` turns frames (BGR uint8, one size) into an in-memory MP4 with a fixed keyframe
interval (``gop``, closed GOPs) and a fixed pattern of ``bframes`` non-reference B-frames
between reference frames (``I B B P B B P ...``). ``finish`` demuxes the result once to build the
``StreamIndex``: per frame in presentation order, its packet (offset and size in the MP4), its
decode position and whether it is a keyframe or a non-reference frame (from its NAL headers,
``nonref_test``; AV1: none marked);
the codec's extradata. Presentation order is the rank of the packets' timestamps, which are
this encoder's own frame counter (a source's timestamps are never used); ``finish`` checks that a
sequential decode returns the frames in that order. A packed sample is ``pack_stream(mp4,
index)``: a small binary header (the index) followed by the MP4 bytes.

``decode_frames_at(blob, frames)`` decodes only what ``frames`` needs: for each run of wanted
frames it starts a fresh decoder at the keyframe at or before the first of them, feeds (in
decode order) every reference frame up to the last wanted one plus the wanted non-reference
frames, skipping the others (nothing refers to them, so the rest decode unchanged), flushes, and
takes the frames out in order: the j-th is the j-th fed frame in presentation order.
``decode_all`` is the sequential reference decode (one decoder, frame 0 to the end): frame i
of ``decode_frames_at`` equals frame i of ``decode_all``, bit for bit (tests/data/test_video_packs.py).
"""
from __future__ import annotations

import io
import os
import struct
import threading
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Iterator, NamedTuple, Optional, Sequence

import cv2
import numpy as np

__all__ = ["VIDEO_FMT", "CODECS", "CODEC_DEFAULTS", "EncodeOptions", "encoder_options", "x264_asm", "nonref_test", "StreamIndex",
           "VideoEncoder", "pack_stream", "unpack_stream", "index_mp4", "decode_frames_at", "decode_indexed",
           "decode_all", "count_frames", "to_rgb", "PackedVideo", "Run", "plan_runs", "run_packets", "packet_bytes",
           "av_packets", "feed_run"]

VIDEO_FMT = "video"  # the Sample.fmt of a packed video (sniff_format names it from MAGIC)
# --codec -> (encoder, decoder), all in PyAV's bundled FFmpeg
CODECS = {"h264": ("libx264", "h264"), "hevc": ("libx265", "hevc"), "av1": ("libsvtav1", "libdav1d")}
# per codec: the default crf, the default preset and the presets the encoder takes
X26X_PRESETS = ("ultrafast", "superfast", "veryfast", "faster", "fast", "medium", "slow", "slower", "veryslow")
# (the hevc and av1 crf give h264's PSNR within 0.3 dB: scripts/bench/video.py packs --codecs, docs/video.md)
CODEC_DEFAULTS = {"h264": (20, "veryfast", X26X_PRESETS), "hevc": (21, "veryfast", X26X_PRESETS),
                  "av1": (30, "10", tuple(str(p) for p in range(14)))}
CRF_MAX = {"h264": 51, "hevc": 51, "av1": 63}
MAGIC = b"PKVID2\0\0"
KEY, NONREF = 1, 2  # per-frame flag bits
_HEAD = struct.Struct("<8sIIII")  # magic, frames, extradata bytes, codec name bytes, fps x 1000
# OpenCV's id of AVX-512 F+CD+BW+DQ+VL (cv::CPU_AVX512_SKX), the set x264 needs to take its AVX-512 code
_CPU_AVX512_SKX = 256


def x264_asm() -> Optional[str]:
    """The x264 ``asm`` (CPU features) option that keeps its output reproducible: ``AVX2`` where
    the CPU has AVX-512, else None (x264's own detection).

    x264 0.165's AVX-512 code reads memory it never wrote: with it, the bytes an encode stores
    depend on what the heap held before (two runs of the same frames differ from the first
    frame on; ``MALLOC_PERTURB_`` changes them at will; tests/commands/test_pack_videos_repro.py).
    Its AVX2 code does not, and costs no measurable encode time (docs/video.md)."""
    return "AVX2" if cv2.checkHardwareSupport(_CPU_AVX512_SKX) else None


@dataclass(frozen=True)
class EncodeOptions:
    """How ``pack-videos`` re-encodes: codec, keyframe interval, quality, encoder speed.

    Args:
        codec: ``h264`` (libx264), ``hevc`` (libx265) or ``av1`` (SVT-AV1, decoded by dav1d), all
            through PyAV's FFmpeg.
        gop: frames from one keyframe to the next (>= 1; 1 is all-intra).
        bframes: non-reference B-frames between reference frames (0..3): a clip skips decoding
            those it does not take. H.264 and HEVC; AV1 has no such frames here (SVT-AV1's own
            hierarchical structure, in temporal units that each show one frame, every one fed).
        crf: constant rate factor (lower is better quality and bigger; 0..51, AV1 0..63); None:
            the codec's default (``CODEC_DEFAULTS``: 20 for h264, 21 hevc, 30 av1: the same PSNR).
        preset: the encoder's speed/size preset: x264/x265 names (``ultrafast`` .. ``veryslow``),
            SVT-AV1 numbers (``0`` .. ``13``); None: ``veryfast``, or ``10`` for av1.
        threads: encoder threads per video (1: one worker per core does the parallelism).
        fastdecode: x264's ``tune=fastdecode`` (no CABAC, no deblocking filter): measured ~30%
            less decode time per frame for ~11% more bytes (docs/video.md); clips are decode-bound.
    """

    codec: str = "h264"
    gop: int = 8  # scripts/bench/video.py packs: the longest GOP meeting every clip target
    bframes: int = 2
    crf: Optional[int] = None
    preset: Optional[str] = None
    threads: int = 1
    fastdecode: bool = True

    def __post_init__(self) -> None:
        if self.codec not in CODECS:
            raise ValueError(f"codec must be one of {', '.join(CODECS)}, not {self.codec!r}")
        crf, preset, presets = CODEC_DEFAULTS[self.codec]
        object.__setattr__(self, "crf", crf if self.crf is None else self.crf)
        object.__setattr__(self, "preset", preset if self.preset is None else str(self.preset))
        if self.gop < 1:
            raise ValueError(f"gop must be >= 1, not {self.gop}")
        if not 0 <= self.bframes <= 3:
            raise ValueError(f"bframes must be in 0..3, not {self.bframes}")
        if not 0 <= self.crf <= CRF_MAX[self.codec]:
            raise ValueError(f"crf must be in 0..{CRF_MAX[self.codec]} for {self.codec}, not {self.crf}")
        if self.preset not in presets:
            raise ValueError(f"preset must be one of {', '.join(presets)}, not {self.preset!r}")
        if self.threads < 1:
            raise ValueError(f"threads must be >= 1, not {self.threads}")


@dataclass(frozen=True)
class StreamIndex:
    """Where each frame of a packed stream is: per frame in presentation order its packet
    (offset, size), decode position and flags (``KEY``, ``NONREF``); the decoder's extradata,
    the frame rate."""

    packets: np.ndarray  # (frames, 3) uint32: offset, size in the MP4, decode position
    flags: np.ndarray  # (frames,) uint8: KEY | NONREF bits
    extradata: bytes
    decoder: str
    fps: float

    @property
    def frames(self) -> int:
        return len(self.packets)

    @property
    def keyframes(self) -> np.ndarray:
        """Frame numbers of the keyframes (0 first)."""
        return np.flatnonzero(self.flags & KEY)

    @property
    def decode_order(self) -> np.ndarray:
        """Frame numbers in decode order."""
        return np.argsort(self.packets[:, 2], kind="stable")


def encoder_options(o: EncodeOptions) -> dict[str, str]:
    """The encoder's options for ``o``: in every codec a fixed GOP (keyframes every ``gop`` frames
    only, no scene-cut keyframes, closed), one encoder thread; x264/x265 a fixed number of
    B-frames (no adaptive placement), none of them a reference (no pyramid); x264 kept off its
    AVX-512 code (``x264_asm``), so the same frames encode to the same bytes."""
    g = str(o.gop)
    if o.codec == "h264":
        asm = x264_asm()
        params = "scenecut=0:open-gop=0:b-adapt=0:b-pyramid=none" + (f":asm={asm}" if asm else "")
        opts = {"crf": str(o.crf), "preset": o.preset, "bf": str(o.bframes), "g": g, "keyint_min": g,
                "sc_threshold": "0", "x264-params": params}
        return {**opts, "tune": "fastdecode"} if o.fastdecode else opts
    if o.codec == "hevc":
        opts = {"crf": str(o.crf), "preset": o.preset,
                "x265-params": f"keyint={g}:min-keyint={g}:scenecut=0:open-gop=0:bframes={o.bframes}:b-adapt=0:"
                               f"b-pyramid=0:pools={o.threads}:frame-threads={o.threads}:log-level=error"}
        return {**opts, "tune": "fastdecode"} if o.fastdecode else opts
    # SVT-AV1: key frames (irefresh-type=2: closed) every gop frames, no scene-change detection
    return {"crf": str(o.crf), "preset": o.preset, "g": g,
            "svtav1-params": f"keyint={g}:irefresh-type=2:scd=0:lp={o.threads}"
                             + (":fast-decode=1" if o.fastdecode else "")}


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
        os.environ.setdefault("SVT_LOG", "1")  # SVT-AV1: errors only, not its banner on every video
        self._out = av.open(self._buf, "w", format="mp4")
        rate = Fraction(self.fps).limit_denominator(1001)
        stream = self._out.add_stream(CODECS[o.codec][0], rate=rate)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.time_base = 1 / rate
        stream.codec_context.thread_count = o.threads
        stream.codec_context.options = encoder_options(o)
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


def _hevc_nonref(packet: bytes, length_size: int) -> bool:
    """Whether a length-prefixed HEVC packet's slices are all sub-layer non-reference pictures
    (NAL types 0..14 even: TRAIL_N, TSA_N, STSA_N, RADL_N, RASL_N, reserved _N); only meaningful
    when the stream has one temporal sub-layer (then nothing refers to them)."""
    at, slices, ref = 0, 0, False
    while at + length_size + 1 < len(packet):
        n = int.from_bytes(packet[at:at + length_size], "big")
        nal_type = (packet[at + length_size] >> 1) & 0x3F
        if nal_type < 32:  # a VCL NAL unit (a slice)
            slices += 1
            ref = ref or nal_type >= 16 or nal_type % 2 == 1
        at += length_size + n
    return slices > 0 and not ref


def nonref_test(decoder: str, extradata: bytes):
    """The per-packet non-reference test for a stream, or None where the bitstream cannot say
    for certain (then every frame of a clip's span is fed): H.264 in AVCC form (``avcC``
    extradata: ``nal_ref_idc`` 0 on every slice), HEVC in ``hvcC`` form with one temporal sub-layer."""
    if decoder == "h264" and len(extradata) > 4 and extradata[0] == 1:
        size = (extradata[4] & 3) + 1
        return lambda data: _nonref(data, size)
    if decoder == "hevc" and len(extradata) > 22 and extradata[0] == 1:
        if (extradata[21] >> 3) & 7 == 1:  # numTemporalLayers
            size = (extradata[21] & 3) + 1
            return lambda data: _hevc_nonref(data, size)
    return None


def _nonref(packet: bytes, length_size: int) -> bool:
    """Whether an AVCC (length-prefixed) H.264 packet's pictures are all non-reference
    (``nal_ref_idc`` 0 on every slice NAL unit)."""
    at, slices, ref = 0, 0, False
    while at + length_size < len(packet):
        n = int.from_bytes(packet[at:at + length_size], "big")
        header = packet[at + length_size]
        if header & 0x1F in (1, 5):  # a coded slice (non-IDR, IDR)
            slices += 1
            ref = ref or (header >> 5) & 3 != 0
        at += length_size + n
    return slices > 0 and not ref


def index_mp4(mp4: bytes | memoryview, decoder: Optional[str] = None, fps: Optional[float] = None) -> StreamIndex:
    """The packets of the MP4's video stream in file order (decode order), checked to be its bytes
    (``decoder`` and ``fps`` default to the stream's codec and average frame rate)."""
    import av

    with av.open(io.BytesIO(mp4)) as container:
        stream = container.streams.video[0]
        if decoder is None:
            decoder = stream.codec_context.name
        if fps is None:
            fps = float(stream.average_rate or 0)
        extradata = bytes(stream.codec_context.extradata or b"")
        nonref = nonref_test(decoder, extradata)
        rows, pts, flags = [], [], []
        for packet in container.demux(stream):
            if packet.size == 0:
                continue
            pos, data = int(packet.pos), bytes(packet)
            if pos < 0 or mp4[pos:pos + packet.size] != data or packet.pts is None:
                raise ValueError(f"packet {len(rows)} is not stored contiguously in the MP4, or has no pts")
            flags.append((KEY if packet.is_keyframe else 0) | (NONREF if nonref is not None and nonref(data) else 0))
            rows.append((pos, packet.size, len(rows)))
            pts.append(int(packet.pts))
    order = np.argsort(np.asarray(pts), kind="stable")  # decode positions in presentation order
    if len(set(pts)) != len(pts):
        raise ValueError("two packets share a presentation time")
    packets = np.asarray(rows, dtype=np.uint32).reshape(-1, 3)[order]
    flag_arr = np.asarray(flags, dtype=np.uint8)[order]
    if not len(packets) or not flag_arr[0] & KEY or packets[0, 2] != 0:
        raise ValueError("the stream does not start with a keyframe")
    return StreamIndex(packets, flag_arr, extradata, decoder, float(fps))


def pack_stream(mp4: bytes, index: StreamIndex) -> bytes:
    """One packed sample: the index (header, extradata, decoder name, packet rows, flags per
    frame) followed by the MP4 bytes."""
    name = index.decoder.encode("ascii")
    head = _HEAD.pack(MAGIC, index.frames, len(index.extradata), len(name), int(round(index.fps * 1000)))
    return b"".join([head, index.extradata, name, index.packets.astype("<u4").tobytes(),
                     index.flags.astype(np.uint8).tobytes(), mp4])


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
    packets = np.frombuffer(view, dtype="<u4", count=3 * frames, offset=at).reshape(frames, 3)
    at += 12 * frames
    flags = np.frombuffer(view, dtype=np.uint8, count=frames, offset=at)
    at += frames
    mp4 = view[at:]
    if frames and int((packets[:, 0].astype(np.int64) + packets[:, 1]).max()) > len(mp4):
        raise ValueError("a packet lies past the end of the stored video")
    if frames and (sorted(packets[:, 2].tolist()) != list(range(frames)) or not flags[0] & KEY):
        raise ValueError("the frame index is not a permutation of the packets starting at a keyframe")
    return mp4, StreamIndex(packets, flags, extradata, decoder, fps / 1000.0)


class PackedVideo:
    """One packed video (``pack_stream``'s bytes), decoded on demand: a video field's value.

    ``frames(indices)`` decodes only the GOPs those frames need (``decode_frames_at``: RGB,
    FFmpeg's colour conversion, the same frames as a sequential decode); ``mp4`` is the stored
    MP4 stream. ValueError when the bytes are not a packed video.
    """

    def __init__(self, blob: bytes | memoryview):
        self._blob = bytes(blob)
        mp4, self.index = unpack_stream(self._blob)
        self._mp4_at = len(self._blob) - len(mp4)

    @property
    def num_frames(self) -> int:
        """The frames stored."""
        return self.index.frames

    @property
    def fps(self) -> float:
        """The stored frame rate."""
        return self.index.fps

    @property
    def mp4(self) -> memoryview:
        """The MP4 bytes (a view into the packed video)."""
        return memoryview(self._blob)[self._mp4_at:]

    def frames(self, indices: Sequence[int]) -> np.ndarray:
        """Frames ``indices`` (0-based, any order, repeats allowed) as one (T, H, W, 3) RGB uint8 array."""
        got = decode_frames_at(self._blob, [int(i) for i in indices])
        if not got:
            raise ValueError("frames() needs at least one index")
        return np.stack(got)

    def __len__(self) -> int:
        return self.index.frames

    def __repr__(self) -> str:
        return f"PackedVideo({self.index.frames} frames, {self.index.fps:g} fps, {self.index.decoder})"


def to_rgb(frame, dst: Optional[np.ndarray] = None) -> np.ndarray:
    """A decoded frame as HxWx3 RGB uint8, converted by FFmpeg's swscale as decord and PyAV's
    ``to_ndarray(format="rgb24")`` convert it (their pixels, bit for bit; torchcodec's too): a 4:2:0
    frame of even height takes swscale's unscaled YUV -> RGB path (each chroma sample over its 2x2
    block; the frame's matrix and range, BT.601 limited where untagged, as a re-encoded pack is).
    Through this thread's reformatter (its context kept between frames) on one thread; into
    ``dst`` when given (of the frame's size). Cheaper than OpenCV's I420 conversion it replaces
    (docs/video.md, "Colour")."""
    rgb = _reformatter().reformat(frame, format="rgb24", threads=1).to_ndarray()
    if dst is None:
        return rgb
    np.copyto(dst, rgb)
    return dst


def _reformatter():
    """This thread's swscale context (PyAV's ``VideoReformatter``), made on first use."""
    have = getattr(_SCRATCH, "sws", None)
    if have is None:
        from av.video.reformatter import VideoReformatter

        have = _SCRATCH.sws = VideoReformatter()
    return have


# per thread: the array ``decode_indexed(..., reuse=True)`` writes into, the swscale context
_SCRATCH = threading.local()


def _scratch(frames: int, height: int, width: int) -> np.ndarray:
    """This thread's reusable (frames, height, width, 3) uint8 array (grown or reshaped on need).
    Fresh memory costs a page fault per 4 KiB on first write: for a clip's 32 frames at 340x256,
    as much CPU as their colour conversion; a reused array is already mapped."""
    have = getattr(_SCRATCH, "array", None)
    if have is None or have.shape[1:] != (height, width, 3) or len(have) < frames:
        have = _SCRATCH.array = np.empty((frames, height, width, 3), dtype=np.uint8)
    return have[:frames]


def _decoder(index: Any):
    """A fresh decoder for ``index``'s stream (a ``StreamIndex``, or anything with its
    ``decoder`` and ``extradata``: ``packer.data.video.ClipPackets``)."""
    import av

    ctx = av.CodecContext.create(index.decoder, "r")
    if index.extradata:
        ctx.extradata = index.extradata
    ctx.thread_count = 1  # one decode per loader worker: the workers are the parallelism
    return ctx


def packet_bytes(mp4: memoryview, index: StreamIndex, frame: int) -> bytes:
    """The stored packet of frame ``frame``."""
    off, size = int(index.packets[frame, 0]), int(index.packets[frame, 1])
    return bytes(mp4[off:off + size])


def run_packets(mp4: memoryview, index: StreamIndex, run: Run) -> list[bytes]:
    """The stored packets ``run`` feeds, in its order."""
    return [packet_bytes(mp4, index, f) for f in run.fed]


def _av_packet(data: bytes, frame: int):
    import av

    packet = av.Packet(data)
    packet.pts = frame  # the index's frame number: checked on the way out (``_check``)
    return packet


def _packet(mp4: memoryview, index: StreamIndex, frame: int):
    return _av_packet(packet_bytes(mp4, index, frame), frame)


def av_packets(run: Run, packets: Sequence[bytes]) -> list:
    """``run``'s stored packets (``run_packets``) as PyAV packets, each carrying its frame number."""
    if len(packets) != len(run.fed):
        raise ValueError(f"{len(packets)} packets for a run of {len(run.fed)} frames")
    return [_av_packet(data, f) for f, data in zip(run.fed, packets)]


def _check(frame, number: int) -> None:
    """ValueError unless the decoder returned frame ``number`` (the pts ``_packet`` gave it)."""
    if frame.pts is not None and frame.pts != number:
        raise ValueError(f"the decoder returned frame {frame.pts} where the index expects {number}")


class Run(NamedTuple):
    """What one fresh decoder is fed for a run of wanted frames: ``fed``, frame numbers in decode
    order (every reference frame from the keyframe up to the run's last decode position, plus
    the wanted non-reference frames), and ``want``, the frames the run keeps."""

    fed: list[int]
    want: frozenset[int]


def plan_runs(index: StreamIndex, frames: Sequence[int]) -> list[Run]:
    """The decoder runs that give ``frames`` (0-based, any order, repeats allowed): one per run
    of wanted frames that no later keyframe interrupts, each starting at the keyframe at or
    before its first frame. The one home of packet selection: the CPU decode and the GPU's
    (``packer.data.gpu``) feed exactly these packets."""
    wanted = sorted(set(int(f) for f in frames))
    if wanted and (wanted[0] < 0 or wanted[-1] >= index.frames):
        raise IndexError(f"frames {wanted[0]}..{wanted[-1]} outside 0..{index.frames - 1}")
    keys, order = index.keyframes, index.decode_order
    runs = []
    i = 0
    while i < len(wanted):
        first = int(keys[np.searchsorted(keys, wanted[i], side="right") - 1])
        # one run: every wanted frame before the next keyframe past the last one taken is on the way
        j = i
        while j + 1 < len(wanted):
            nxt = int(keys[np.searchsorted(keys, wanted[j + 1], side="right") - 1])
            if nxt > wanted[j]:  # a keyframe after the last wanted: start afresh there
                break
            j += 1
        want = frozenset(wanted[i:j + 1])
        d0 = int(index.packets[first, 2])
        d1 = int(index.packets[first:wanted[j] + 1, 2].max())
        runs.append(Run([int(f) for f in order[d0:d1 + 1] if not index.flags[f] & NONREF or int(f) in want], want))
        i = j + 1
    return runs


def feed_run(ctx: Any, packets: Sequence[Any], run: Run) -> Iterator[tuple[int, Any]]:
    """Feed ``packets`` (run.fed's, each carrying its frame number: ``av_packets``) to decoder
    ``ctx`` and drain it, yielding the wanted (frame number, frame) pairs in presentation order
    as they come out (a frame not wanted is let go at once). ValueError, once the run is through,
    when the decoder gave another count of frames than it was fed; at once for a frame the index
    does not put where it came out."""
    numbers = sorted(run.fed)
    given = 0
    for packet in [*packets, None]:  # None: drain
        for frame in ctx.decode(packet):
            if given == len(numbers):
                raise ValueError(f"decoding {len(numbers)} packets of frames {numbers[0]}..{numbers[-1]} "
                                 f"gave more frames")
            f = numbers[given]
            given += 1
            _check(frame, f)
            if f in run.want:
                yield f, frame
    if given != len(numbers):
        raise ValueError(f"decoding {len(numbers)} packets of frames {numbers[0]}..{numbers[-1]} gave {given} frames")


def _run(index: Any, packets: Sequence[bytes], run: Run, out: dict[int, np.ndarray],
         slots: Optional[list[int]] = None) -> None:
    """Decode ``run`` from its ``packets`` with a fresh decoder for ``index``'s stream (as
    ``_decoder``) into ``out`` (frame number -> RGB array). ``slots``: frames go into this
    thread's scratch array (``_scratch``), at ``slots[0]`` of ``slots[1]`` rows (the count of all
    wanted frames) onward."""
    for f, frame in feed_run(_decoder(index), av_packets(run, packets), run):
        if slots is None:
            out[f] = to_rgb(frame)
        else:
            out[f] = to_rgb(frame, _scratch(slots[1], frame.height, frame.width)[slots[0]])
            slots[0] += 1


def decode_frames_at(blob: bytes | memoryview, frames: Sequence[int], *, reuse: bool = False) -> list[np.ndarray]:
    """RGB frames (HxWx3 uint8) number ``frames`` (0-based, any order, repeats allowed) of a
    packed video, decoding from the keyframe at or before each run of wanted frames
    (``reuse``: as in ``decode_indexed``)."""
    return decode_indexed(*unpack_stream(blob), frames, reuse=reuse)


def decode_indexed(mp4: bytes | memoryview, index: StreamIndex, frames: Sequence[int], *,
                   reuse: bool = False) -> list[np.ndarray]:
    """``decode_frames_at`` over MP4 bytes and their index held apart (a plain ``--to files``
    video, indexed by ``index_mp4`` when it is read). ``reuse``: the frames are views of one
    array this thread reuses, valid until its next ``reuse`` decode (for a caller that copies
    them out at once, as a clip's assembly does)."""
    mp4 = memoryview(mp4)
    runs = plan_runs(index, frames)
    out: dict[int, np.ndarray] = {}
    slots = [0, sum(len(r.want) for r in runs)] if reuse else None
    for run in runs:
        _run(index, run_packets(mp4, index, run), run, out, slots)
    return [out[int(f)] for f in frames]


def _sequential(blob: bytes | memoryview):
    """Every frame of the stored stream, decoded by one decoder from the first packet in decode order."""
    mp4, index = unpack_stream(blob)
    ctx = _decoder(index)
    for f in index.decode_order:
        yield from ctx.decode(_packet(mp4, index, int(f)))
    yield from ctx.decode(None)


def decode_all(blob: bytes | memoryview) -> list[np.ndarray]:
    """Every frame of a packed video, decoded sequentially by one decoder (the reference
    ``decode_frames_at`` is held to)."""
    out = []
    for n, frame in enumerate(_sequential(blob)):
        _check(frame, n)
        out.append(to_rgb(frame))
    return out


def count_frames(blob: bytes | memoryview) -> int:
    """Frames a sequential decode of the whole stored stream yields (no colour conversion);
    ValueError when one comes out where the index does not put it."""
    n = 0
    for frame in _sequential(blob):
        _check(frame, n)
        n += 1
    return n

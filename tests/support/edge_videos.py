"""Small real videos with the sources' awkward cases, written with PyAV: a variable frame rate,
an edit list that hides the leading frames, and rotation in the track's display matrix. Every
frame draws its number (``tests.data.test_video_packs.numbered``), so what a decoder returns can
be read back (``read_number``), in order."""
from __future__ import annotations

import math
import struct
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

from tests.support.numbered_video import numbered

WIDTH, HEIGHT = 320, 256
VFR_STEPS_MS = (17, 33, 50, 100)  # frame durations drawn at random: no constant rate


def write_numbered(path: Path, frames: int, *, gop: int = 12, vfr: bool = False, seed: int = 0,
                   fps: int = 25) -> Path:
    """H.264 (two B-frames) in MP4 of ``frames`` numbered frames, ``fps`` (25) frames per second,
    or with ``vfr`` each frame lasting one of ``VFR_STEPS_MS`` at random (a millisecond time base)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.RandomState(seed)
    with av.open(str(path), "w") as out:
        s = out.add_stream("libx264", rate=Fraction(fps))
        s.width, s.height, s.pix_fmt = WIDTH, HEIGHT, "yuv420p"
        if vfr:
            s.time_base = s.codec_context.time_base = Fraction(1, 1000)
        s.codec_context.options = {"crf": "12", "bf": "2", "g": str(gop)}
        t = 0
        for i in range(frames):
            f = av.VideoFrame.from_ndarray(numbered(i), format="bgr24")
            if vfr:
                f.pts, f.time_base = t, Fraction(1, 1000)
                t += int(rng.choice(VFR_STEPS_MS))
            for p in s.encode(f):
                out.mux(p)
        for p in s.encode(None):
            out.mux(p)
    return path


def write_edit_list(src: Path, path: Path, hide: int) -> Path:
    """``src`` remuxed (no re-encode) with every timestamp moved ``hide`` frames earlier: the
    MP4 muxer writes an edit list that starts the presentation at frame ``hide``, so the frames
    before it are decoded (the GOP needs them) but not shown, as ``ffmpeg -ss`` with stream copy
    leaves a cut clip."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(src)) as inp, av.open(str(path), "w") as out:
        ins = inp.streams.video[0]
        outs = out.add_stream_from_template(ins)
        shift = int(hide / ins.average_rate / ins.time_base)
        for p in inp.demux(ins):
            if p.dts is None:
                continue
            p.pts, p.dts, p.stream = p.pts - shift, p.dts - shift, outs
            out.mux(p)
    return path


def write_rotated(src: Path, path: Path, degrees: int = 90) -> Path:
    """``src`` with its track header's display matrix set to a ``degrees`` rotation (the bytes a
    phone writes; FFmpeg reads them as display-matrix side data)."""
    data = bytearray(src.read_bytes())
    at = data.find(b"tkhd")
    if at < 0 or data[at + 4] != 0:
        raise ValueError(f"{src}: no version-0 tkhd box")
    c, s = round(math.cos(math.radians(degrees))), round(math.sin(math.radians(degrees)))

    def fixed(v: int) -> int:  # 16.16 fixed point, two's complement
        return (v * 0x10000) & 0xFFFFFFFF

    matrix = at + 4 + 40  # after version/flags, times, track id, duration, layer, volume
    data[matrix:matrix + 36] = struct.pack(">9I", fixed(c), fixed(s), 0, fixed(-s), fixed(c), 0, 0, 0, 0x40000000)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(bytes(data))
    return path

"""JPEG files with generated metadata layouts, for the metadata fault cases.

``build`` takes an encoded JPEG and puts metadata segments where the JPEG syntax allows them:
fill bytes (extra ``0xFF``) before any marker, APPn/COM segments of any size before or between
the tables and the frame header, in any order. ``layouts`` is the hypothesis strategy over
those layouts (EXIF orientation in either byte order as SHORT, LONG, SSHORT, SLONG, BYTE or
FLOAT, in IFD0 or where Pillow does not look; Adobe APP14 transforms 0/1/2; ICC profiles and
XMP past 64 KB; JFIF or not) for grey, YCbCr and CMYK sources.
"""
from __future__ import annotations

import io
import struct
from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st
from PIL import Image

from packer.synth import natural_image

__all__ = ["Layout", "layouts", "build", "segments", "exif_segment", "source_jpeg"]

_STANDALONE = {0x01, *range(0xD0, 0xD8)}


def segments(data: bytes) -> tuple[list[tuple[int, bytes]], bytes]:
    """The marker segments of a plain JPEG up to its SOS, as ``(marker, payload)``, and the
    bytes from the SOS marker on."""
    assert data[:2] == b"\xff\xd8"
    pos, out = 2, []
    while True:
        assert data[pos] == 0xFF
        marker = data[pos + 1]
        if marker == 0xDA:
            return out, data[pos:]
        length = int.from_bytes(data[pos + 2:pos + 4], "big")
        out.append((marker, data[pos + 4:pos + 2 + length]))
        pos += 2 + length


# TIFF tag types -> how one inline value is packed (count 1; RATIONAL's 8 bytes lie elsewhere)
_PACK = {1: "B3x", 2: "B3x", 3: "H2x", 4: "I", 6: "b3x", 7: "B3x", 8: "h2x", 9: "i", 11: "f", 13: "I"}


def exif_segment(orientation: int, *, order: str = "II", kind: int = 3, where: str = "ifd0",
                 pad: int = 0, twice: bool = False) -> bytes:
    """An APP1 payload ``Exif\\0\\0`` + TIFF whose orientation tag has ``orientation`` as tag
    type ``kind`` (3 SHORT, 4 LONG, 8 SSHORT, 9 SLONG, 1 BYTE, 11 FLOAT, 5 RATIONAL, ...) in
    ``where`` (``ifd0``; ``ifd1``, the thumbnail's; ``exif``, the Exif sub-IFD): Pillow's
    ``exif_transpose`` reads IFD0 only. ``pad`` bytes lie between the TIFF header and IFD0;
    ``twice`` repeats the tag in IFD0."""
    e = "<" if order == "II" else ">"
    tail = b""  # out-of-line values, after the IFDs

    def entry(tag: int, typ: int, count: int, value) -> bytes:
        if typ == 5:
            return struct.pack(e + "HHII", tag, typ, count, 0xFFFFFFFF)  # offset patched below
        return struct.pack(e + "HHI", tag, typ, count) + struct.pack(e + _PACK[typ], value)

    def ifd(entries: list[bytes], next_ifd: int) -> bytes:
        return struct.pack(e + "H", len(entries)) + b"".join(entries) + struct.pack(e + "I", next_ifd)

    orient = entry(0x0112, kind, 1, float(orientation) if kind == 11 else orientation)
    ifd0_at = 8 + pad
    xres = entry(0x011A, 4, 1, 72)  # a plain LONG beside it (types are not all SHORT)
    if where == "ifd0":
        body = ifd([entry(0x0100, 4, 1, 16), orient, xres] + ([orient] if twice else []), 0)
    elif where == "ifd1":
        first = ifd([entry(0x0100, 4, 1, 16), xres], 0)
        body = ifd([entry(0x0100, 4, 1, 16), xres], ifd0_at + len(first))
        body += ifd([orient], 0)
    else:  # the Exif sub-IFD (0x8769)
        first_len = 2 + 12 * 2 + 4
        body = ifd([entry(0x0100, 4, 1, 16), entry(0x8769, 4, 1, ifd0_at + first_len)], 0) + ifd([orient], 0)
    if kind == 5:
        tail = struct.pack(e + "II", orientation, 1)
        body = body.replace(struct.pack(e + "I", 0xFFFFFFFF), struct.pack(e + "I", ifd0_at + len(body)))
    return b"Exif\0\0" + order.encode() + struct.pack(e + "HI", 42, ifd0_at) + b"\0" * pad + body + tail


def adobe_segment(transform: int) -> bytes:
    """An APP14 ``Adobe`` payload with the colour transform (0 none, 1 YCbCr, 2 YCCK)."""
    return b"Adobe" + struct.pack(">HHHB", 100, 0, 0, transform)


def icc_segments(size: int, chunk: int = 65519) -> list[bytes]:
    """APP2 ``ICC_PROFILE`` payloads carrying ``size`` bytes of profile in ``chunk``-byte parts."""
    blob = bytes(range(256)) * (size // 256 + 1)
    parts = [blob[i:i + chunk] for i in range(0, size, chunk)] or [b""]
    return [b"ICC_PROFILE\0" + bytes([i + 1, len(parts)]) + p for i, p in enumerate(parts)]


@dataclass(frozen=True)
class Layout:
    """How one generated file is laid out (see ``build``)."""

    mode: str = "RGB"  # RGB, L, CMYK (the source's encoding)
    height: int = 24
    width: int = 40
    orientation: int | None = None  # None: no EXIF
    order: str = "II"
    kind: int = 3
    where: str = "ifd0"
    exif_pad: int = 0
    adobe: int | None = None  # None: no APP14 (CMYK always has one unless dropped)
    drop_adobe: bool = False  # a CMYK file without its encoder's APP14
    jfif: bool = True
    icc: int = 0  # bytes of ICC profile (0: none)
    xmp: int = 0  # bytes of XMP (0: none)
    com: int = 0  # bytes of comment
    fills: tuple[int, ...] = ()  # fill bytes before each marker, by position (cycled)
    positions: tuple[int, ...] = ()  # where each metadata segment goes among the tables
    seed: int = 0


def source_jpeg(layout: Layout) -> bytes:
    """The encoded image the layout's segments are put around (Pillow's encoder)."""
    arr = natural_image(np.random.default_rng(layout.seed), layout.height, layout.width)
    im = Image.fromarray(arr)
    if layout.mode == "L":
        im = im.convert("L")
    elif layout.mode == "CMYK":
        im = im.convert("CMYK")
    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=90)
    return buf.getvalue()


def build(layout: Layout) -> bytes:
    """The JPEG of ``layout``: the source's tables and scan, metadata segments interleaved."""
    segs, scan = segments(source_jpeg(layout))
    tables = [(m, p) for m, p in segs if not (0xE0 <= m <= 0xEF)]
    kept_adobe = [(m, p) for m, p in segs if m == 0xEE and p.startswith(b"Adobe")]
    meta: list[tuple[int, bytes]] = []
    if layout.jfif:
        meta.append((0xE0, b"JFIF\0\x01\x01\0\0\x01\0\x01\0\0"))
    if layout.orientation is not None:
        meta.append((0xE1, exif_segment(layout.orientation, order=layout.order, kind=layout.kind,
                                        where=layout.where, pad=layout.exif_pad)))
    if layout.adobe is not None:
        meta.append((0xEE, adobe_segment(layout.adobe)))
    elif not layout.drop_adobe:
        meta += kept_adobe
    if layout.icc:
        meta += [(0xE2, p) for p in icc_segments(layout.icc)]
    if layout.xmp:
        meta.append((0xE1, b"http://ns.adobe.com/xap/1.0/\0" + b"<x/>" * (layout.xmp // 4)))
    if layout.com:
        meta.append((0xFE, b"c" * layout.com))
    # the metadata goes in among the tables (before the first SOF's successor at the latest)
    out = list(tables)
    for i, seg in enumerate(meta):
        at = layout.positions[i % len(layout.positions)] % (len(out) + 1) if layout.positions else i
        out.insert(at, seg)
    b = bytearray(b"\xff\xd8")
    for i, (marker, payload) in enumerate(out):
        fill = layout.fills[i % len(layout.fills)] if layout.fills else 0
        b += b"\xff" * fill + bytes([0xFF, marker]) + (len(payload) + 2).to_bytes(2, "big") + payload
    fill = layout.fills[len(out) % len(layout.fills)] if layout.fills else 0
    return bytes(b + b"\xff" * fill + scan)


@st.composite
def layouts(draw: st.DrawFn) -> Layout:
    """Any layout ``build`` makes (see the module doc)."""
    mode = draw(st.sampled_from(["RGB", "RGB", "RGB", "L", "CMYK"]))
    big = st.sampled_from([0, 0, 100, 70_000, 140_000])
    orientation = draw(st.sampled_from([None, 1, 2, 3, 4, 5, 6, 7, 8]))
    return Layout(
        mode=mode, height=draw(st.integers(8, 40)), width=draw(st.integers(8, 40)),
        orientation=orientation, order=draw(st.sampled_from(["II", "MM"])),
        kind=draw(st.sampled_from([3, 4, 3, 4, 8, 9, 1, 11])), where=draw(st.sampled_from(["ifd0", "ifd0", "ifd1", "exif"])),
        exif_pad=draw(st.sampled_from([0, 0, 6, 30_000])),
        adobe=draw(st.sampled_from([None, None, None, 0, 1, 2])), drop_adobe=draw(st.booleans()),
        jfif=draw(st.booleans()), icc=draw(big), xmp=draw(st.sampled_from([0, 0, 100, 65_000])),
        com=draw(st.sampled_from([0, 10, 60_000])),
        fills=tuple(draw(st.lists(st.integers(0, 3), max_size=6))),
        positions=tuple(draw(st.lists(st.integers(0, 20), max_size=6))),
        seed=draw(st.integers(0, 3)))

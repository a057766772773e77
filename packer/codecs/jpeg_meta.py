"""The one JPEG metadata parser of the decode paths: size, EXIF orientation, colour layout.

Every fast decode path (OpenCV, simplejpeg, TurboJPEG region decoding, DCT-scaled decodes) asks
``jpeg_meta`` what the reference decode (Pillow, then ``ImageOps.exif_transpose``: what a
torchvision ``ImageFolder`` pipeline gives) would do with a JPEG, decodes the stored pixels
itself and applies ``orientation`` with ``orient``. ``jpeg_meta`` returns None whenever it
cannot promise the reference's answer, and the caller then decodes with Pillow.

The walk follows the JPEG syntax as libjpeg and Pillow read it: fill bytes (any number of
``0xFF`` before a marker), APPn and COM segments of any size and in any order before the start
of scan, among or after the tables and the frame header, however far into the file. It gives:

* the frame header's size, precision and components (as stored, before EXIF rotation);
* the EXIF orientation as Pillow's ``exif_transpose`` applies it: IFD0 of the first
  ``Exif\\0\\0`` APP1 only (the thumbnail's IFD1 and the Exif sub-IFD are not read), either
  byte order, the tag types Pillow turns into a number (SHORT, LONG, SBYTE, SSHORT, SLONG,
  IFD, FLOAT; BYTE, ASCII and UNDEFINED values are present but never rotate), values other
  than 2-8 meaning upright; without an EXIF orientation tag, an XMP APP1's
  ``tiff:Orientation`` (Pillow's ``getexif`` reads it then);
* the Adobe APP14 transform, JFIF, and so the colour space libjpeg decodes (``L``,
  ``YCbCr``, ``RGB``, ``CMYK``, ``YCCK``); whether Pillow reads an ICC profile (its chunks
  before the frame header, all of them: neither Pillow nor OpenCV applies it to the pixels).

None (ask Pillow) for: junk bytes between segments, markers Pillow and libjpeg read
differently (RSTn, TEM, JPGn, a second SOI or SOF, EOI before the scan), a header cut short,
MPO files (an MPF APP2), more than one Exif APP1 (Pillow concatenates them), an EXIF block
Pillow would read partly or not at all (not a classic TIFF header, IFD0 past the block's end,
another tag's data outside it, the orientation tag more than once, with a count other than 1
or as a RATIONAL/DOUBLE read from elsewhere in the block).

``fast`` says whether the libjpeg-turbo decoders give Pillow's pixels: 8-bit Huffman-coded
(baseline, extended or progressive), grey or three components, no Adobe APP14 (CMYK, YCCK
and Adobe's RGB/YCbCr switch are Pillow's ``CMYK;I`` conversion and Pillow's reading of the
transform, the reference for them). Tested against Pillow over generated segment layouts in
``tests/faults/test_faults_metadata.py``.
"""
from __future__ import annotations

import re
import struct
from typing import NamedTuple, Optional

import numpy as np

__all__ = ["JpegMeta", "jpeg_meta", "orient", "exif_orientation", "xmp_orientation"]

# segments with a length field that carry nothing this parser needs (DHT, DAC, DNL, DRI, DHP, EXP, DQT)
_TABLES = {0xC4, 0xCC, 0xDC, 0xDD, 0xDE, 0xDF, 0xDB}
_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
_HUFFMAN_8BIT = {0xC0, 0xC1, 0xC2}  # baseline, extended, progressive: what every fast path decodes
_XMP = b"http://ns.adobe.com/xap/1.0/\x00"
_XMP_ORIENTATION = re.compile(rb'tiff:Orientation(="|>)([0-9])')  # Pillow's getexif pattern
# TIFF types Pillow reads (TiffImagePlugin's _load_dispatch) -> bytes per value
_TIFF_UNIT = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 1, 7: 1, 8: 2, 9: 4, 10: 8, 11: 4, 12: 8, 13: 4, 16: 8}
# inline count-1 values Pillow turns into a number: type -> struct code
_NUMERIC = {3: "H", 4: "I", 6: "b", 8: "h", 9: "i", 13: "I", 11: "f"}
_PRESENT_NOT_NUMBER = {1, 2, 7}  # BYTE, ASCII, UNDEFINED: a bytes/str value, never a rotation


class JpegMeta(NamedTuple):
    """What a JPEG's header says, as the reference decoder reads it (see the module doc)."""

    height: int  # as stored (before orientation)
    width: int
    components: int
    precision: int
    sof: int  # the frame header's marker (0xC0 baseline, 0xC2 progressive, ...)
    orientation: int  # 1-8: the transpose Pillow's exif_transpose applies (1: none)
    colour: str  # the colour space libjpeg decodes: L, YCbCr, RGB, CMYK or YCCK
    adobe: Optional[int]  # the APP14 transform (-1: an APP14 too short to carry one), None: no APP14
    jfif: bool
    icc: bool  # an ICC profile Pillow reads (``info["icc_profile"]``): complete, before the frame header

    @property
    def fast(self) -> bool:
        """Whether the libjpeg-turbo decoders (OpenCV, simplejpeg, TurboJPEG) give Pillow's pixels."""
        return (self.sof in _HUFFMAN_8BIT and self.precision == 8 and self.components in (1, 3)
                and self.adobe is None)

    @property
    def upright_size(self) -> tuple[int, int]:
        """(height, width) after the orientation is applied."""
        return (self.width, self.height) if self.orientation >= 5 else (self.height, self.width)


# The header of the last file walked: its bytes before the SOF's size, its bytes from after the
# size through the SOS marker, and its answer. Files of one encoder (a camera without EXIF,
# ``packer resize``, ``decode-frames``, a synthetic set) differ in the SOF's size only, so the
# next file's answer is two byte comparisons; any other difference walks in full.
_last: Optional[tuple[bytes, bytes, JpegMeta]] = None
_REPLAY_LIMIT = 4096  # longer headers (large EXIF, ICC, XMP) are walked each time


def jpeg_meta(data: bytes | memoryview) -> Optional[JpegMeta]:
    """The header facts of a JPEG as Pillow + ``exif_transpose`` read them, or None when this
    parser cannot promise them (not a JPEG, or see the module doc): decode with Pillow then."""
    last = _last
    if last is not None:
        before, after, meta = last
        size_at = len(before)
        head = data if type(data) is bytes else bytes(data[:size_at + 4 + len(after)])
        if head.startswith(before) and head.startswith(after, size_at + 4):
            height, width = (head[size_at] << 8) | head[size_at + 1], (head[size_at + 2] << 8) | head[size_at + 3]
            if height and width:
                return JpegMeta(height, width, *meta[2:])
    return _walk(data)


def _walk(data: bytes | memoryview) -> Optional[JpegMeta]:
    """``jpeg_meta`` by walking every marker; a short header becomes ``_last``."""
    global _last
    n = len(data)
    if n < 4 or data[0] != 0xFF or data[1] != 0xD8:
        return None
    pos = 2
    sof = None
    exif = None
    exifs = 0
    xmp = None
    adobe = None
    jfif = False
    icc = None  # the ICC profile Pillow assembles: chunks before the frame header, all there
    chunks: list[tuple[int, int]] = []
    while True:
        if pos + 2 > n or data[pos] != 0xFF:
            return None  # cut short, or junk between segments
        marker = data[pos + 1]
        while marker == 0xFF:  # fill bytes
            pos += 1
            if pos + 2 > n:
                return None
            marker = data[pos + 1]
        if marker == 0xDA:
            break
        if pos + 4 > n:
            return None
        length = (data[pos + 2] << 8) | data[pos + 3]
        body, end = pos + 4, pos + 2 + length
        if length < 2 or end > n:
            return None
        if marker in _TABLES:
            pass
        elif 0xE0 <= marker <= 0xEF:
            if marker == 0xE1:
                head = bytes(data[body:body + 29])
                if head.startswith(b"Exif\0\0"):
                    exifs += 1
                    if exifs == 1:
                        exif = bytes(data[body + 6:end])
                elif head.startswith(_XMP):
                    xmp = bytes(data[body + len(_XMP):end])  # the last one, as Pillow keeps it
            elif marker == 0xE2:
                head = bytes(data[body:body + 12])
                if head.startswith(b"ICC_PROFILE\0"):
                    if length - 2 < 14:
                        return None  # Pillow cannot read a chunk number from it
                    chunks.append((data[body + 12], data[body + 13]))
                elif head.startswith(b"MPF\0"):
                    return None  # MPO: Pillow opens it as a multi-picture file
            elif marker == 0xEE:
                if bytes(data[body:body + 5]) == b"Adobe":
                    adobe = data[body + 11] if length - 2 >= 12 else -1
            elif marker == 0xE0:
                jfif = jfif or (bytes(data[body:body + 5]) == b"JFIF\0" and length - 2 >= 14)
        elif marker == 0xFE:
            pass  # COM
        elif marker in _SOF:
            if sof is not None or length < 8:
                return None  # libjpeg refuses a second frame header; Pillow would keep the last
            components = data[body + 5]
            if length != 8 + 3 * components:
                return None
            ids = tuple(data[body + 6 + 3 * i] for i in range(components))
            if chunks:  # Pillow joins the chunks seen so far when it reads the frame header
                icc = min(chunks)[1] == len(chunks)
            sof = (marker, data[body], (data[body + 1] << 8) | data[body + 2],
                   (data[body + 3] << 8) | data[body + 4], components, ids, body + 1)
        else:
            return None  # RSTn, TEM, JPGn, SOI, EOI before the scan: leave them to Pillow
        pos = end
    if sof is None or sof[2] <= 0 or sof[3] <= 0:
        return None
    if exifs > 1:
        return None
    orientation = exif_orientation(exif) if exif is not None else 0
    if orientation is None:
        return None
    if orientation == 0:  # no EXIF orientation tag: Pillow's getexif then reads XMP's
        orientation = xmp_orientation(xmp) if xmp is not None else 1
    marker, precision, height, width, components, ids, size_at = sof
    meta = JpegMeta(height, width, components, precision, marker, orientation,
                    _colour(components, ids, jfif, adobe), adobe, jfif, bool(icc))
    if pos + 2 <= _REPLAY_LIMIT:
        _last = (bytes(data[:size_at]), bytes(data[size_at + 4:pos + 2]), meta)
    return meta


def _colour(components: int, ids: tuple[int, ...], jfif: bool, adobe: Optional[int]) -> str:
    """libjpeg's guess of the stored colour space (``default_decompress_parms``)."""
    if components == 1:
        return "L"
    if components == 3:
        if jfif:
            return "YCbCr"
        if adobe is not None and adobe >= 0:
            return "RGB" if adobe == 0 else "YCbCr"
        return "RGB" if ids == (82, 71, 66) else "YCbCr"
    if components == 4:
        if adobe is not None and adobe >= 0:
            return "CMYK" if adobe == 0 else "YCCK"
        return "CMYK"
    return "unknown"


def exif_orientation(tiff: bytes) -> Optional[int]:
    """The orientation Pillow's ``exif_transpose`` applies for an EXIF block (the APP1 payload
    after ``Exif\\0\\0``): 1-8, 0 when IFD0 has no orientation tag (XMP may then give one), or
    None when Pillow's reading of the block cannot be promised (see the module doc)."""
    if len(tiff) < 8:
        return None
    if tiff[:4] == b"II*\0":
        e = "<"
    elif tiff[:4] == b"MM\0*":
        e = ">"
    else:
        return None  # another TIFF prefix, BigTIFF, a second Exif header, junk
    (ifd,) = struct.unpack_from(e + "I", tiff, 4)
    if ifd + 2 > len(tiff):
        return None
    (count,) = struct.unpack_from(e + "H", tiff, ifd)
    if ifd + 2 + 12 * count + 4 > len(tiff):
        return None  # Pillow would read part of IFD0
    found = None
    for i in range(count):
        at = ifd + 2 + 12 * i
        tag, typ, n = struct.unpack_from(e + "HHI", tiff, at)
        unit = _TIFF_UNIT.get(typ)
        if unit is None or n == 0:
            continue  # a type Pillow skips, or no value: not stored
        if unit * n > 4:  # the value lies elsewhere in the block
            (offset,) = struct.unpack_from(e + "I", tiff, at + 8)
            if offset + unit * n > len(tiff):
                return None  # Pillow stops reading IFD0 there (or skips the tag): not promised
            if tag == 0x0112:
                return None  # an orientation read from elsewhere (RATIONAL, DOUBLE, a list)
            continue
        if tag != 0x0112:
            continue
        if found is not None or n != 1:
            return None
        if typ in _PRESENT_NOT_NUMBER:
            found = 1  # a bytes or str value: present (no XMP then), never rotates
        else:
            (value,) = struct.unpack_from(e + _NUMERIC[typ], tiff, at + 8)
            found = int(value) if value in (2, 3, 4, 5, 6, 7, 8) else 1
    return 0 if found is None else found


def xmp_orientation(xmp: bytes) -> int:
    """The orientation Pillow's ``getexif`` takes from XMP (``tiff:Orientation``), 1 when none."""
    match = _XMP_ORIENTATION.search(xmp)
    value = int(match[2]) if match else 1
    return value if 2 <= value <= 8 else 1


def orient(arr: np.ndarray, orientation: int) -> np.ndarray:
    """``arr`` (HxW or HxWxC, stored orientation) transposed as Pillow's ``exif_transpose``
    transposes for ``orientation`` (1-8), as a new contiguous array (``arr`` itself for 1)."""
    if orientation == 1:
        return arr
    swap = arr.swapaxes(0, 1)
    view = {2: arr[:, ::-1], 3: arr[::-1, ::-1], 4: arr[::-1], 5: swap, 6: swap[:, ::-1],
            7: swap[::-1, ::-1], 8: swap[::-1]}[orientation]
    return np.ascontiguousarray(view)

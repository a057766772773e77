"""The ``--check header`` verdict of a plain JPEG in a few microseconds, or None.

Pillow's header parse (``Image.open``) walks the JPEG markers in Python with a handler per
marker and costs ~100 µs per photo, more than everything else the single writer does for a
sample. ``jpeg_header`` walks the same markers with the same rules (Pillow 10-13's
``JpegImageFile._open``: SOI, then segments up to the start of scan, quantization tables
checked as Pillow checks them, the last SOF giving size and mode) but answers only when the
file is one Pillow opens without any judgement call: anything else (EXIF, ICC or Photoshop
blocks, MPO, padding or junk between markers, a truncated segment, a bit depth or layer
count Pillow refuses, a size past Pillow's decompression-bomb limit, no SOF before the scan)
returns None and the caller asks Pillow, so the verdict is Pillow's for every file. Tested
against Pillow on generated and mutated JPEGs (``tests/codecs/test_jpeg_header.py``).

The files of one encoder share their header bytes but for the size in the SOF, so the layout
of the last plain JPEG walked is remembered, and a file with that very layout is answered with
a few byte comparisons and the SOF's own checks instead of a walk (``_replay``); any byte that
differs sends the file through the full walk, so the verdict is the walk's either way.
"""
from __future__ import annotations

from PIL import Image

__all__ = ["jpeg_header"]

_SKIP = {0xC4, 0xCC, 0xDC, 0xDD, 0xDF, 0xFE}  # DHT, DAC, DNL, DRI, EXP, COM: length + payload
_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
_LAYERS = {1: 1, 3: 3, 4: 4}  # SOF components -> channels (Pillow's L, RGB, CMYK)


# The header layout of the last plain JPEG walked: its bytes up to its SOF, the SOF's marker and
# length, and its bytes from the SOF's end through the SOS marker and length, and that SOS's
# length. Files from one encoder (a camera, ``packer resize``, ``decode-frames``, a synthetic set)
# share them byte for byte but for the SOF's body (the size), so the next file's verdict is a few
# byte comparisons: identical bytes walk identically, and any difference walks in full.
_last: tuple[bytes, bytes, bytes, int] | None = None


def jpeg_header(data: bytes) -> tuple[int, int, int] | None:
    """``(height, width, channels)`` of a plain JPEG exactly as Pillow's header parse gives
    them, or None when Pillow must decide (not a plain JPEG, or anything unusual)."""
    last = _last
    if last is not None:
        hit = _replay(data, last)
        if hit is not None:
            return hit
    return _walk(data)


def _replay(data: bytes, last: tuple[bytes, bytes, bytes, int]) -> tuple[int, int, int] | None:
    """``_walk``'s answer when ``data`` has ``last``'s layout (the same bytes but for the SOF's
    body, which is checked as ``_walk`` checks it), else None (``_walk`` decides)."""
    prefix, sof, between, sos_length = last
    a = len(prefix)
    body = a + 4
    end = a + 2 + ((sof[2] << 8) | sof[3])
    stop = end + len(between)  # the SOS's length bytes end here
    if len(data) < stop - 2 + sos_length:
        return None
    head = data if type(data) is bytes else bytes(data[:stop])  # (bytes compare in place)
    if (not head.startswith(prefix) or not head.startswith(sof, a) or not head.startswith(between, end)
            or head[body] != 8 or head[body + 5] not in _LAYERS):
        return None
    height, width = (head[body + 1] << 8) | head[body + 2], (head[body + 3] << 8) | head[body + 4]
    if height <= 0 or width <= 0 or height * width > (Image.MAX_IMAGE_PIXELS or float("inf")):
        return None
    return height, width, _LAYERS[head[body + 5]]


def _walk(data: bytes) -> tuple[int, int, int] | None:
    """``jpeg_header`` by walking every marker; a plain JPEG's layout becomes ``_last``."""
    global _last
    n = len(data)
    if n < 4 or data[0] != 0xFF or data[1] != 0xD8 or data[2] != 0xFF:
        return None
    pos = 2
    size = None
    channels = 0
    sof_at = sof_end = -1
    while True:
        if pos + 4 > n or data[pos] != 0xFF:
            return None
        marker = data[pos + 1]
        length = (data[pos + 2] << 8) | data[pos + 3]
        body = pos + 4
        end = pos + 2 + length
        if length < 2 or end > n:
            return None
        if marker in _SKIP:  # the most frequent (four DHT in a typical photo): tested first
            pass
        elif 0xE0 <= marker <= 0xEF:  # APPn: only the ones Pillow reads without a risk of failing
            if marker == 0xE0 and data[body:body + 4] == b"JFIF" and length - 2 < 12:
                return None
            if marker in (0xE1, 0xE2, 0xED):  # EXIF/XMP, ICC/MPF/FlashPix, Photoshop: Pillow decides
                return None
            if marker == 0xEE and data[body:body + 5] == b"Adobe" and length - 2 < 7:
                return None
        elif marker == 0xDB:  # DQT, checked as Pillow checks it
            s = body
            while s < end:
                qt_length = 1 + (1 if data[s] < 16 else 2) * 64
                if end - s < qt_length:
                    return None
                s += qt_length
        elif marker in _SOF:
            if length - 2 < 6 or (length - 8) % 3 or data[body] != 8 or data[body + 5] not in _LAYERS:
                return None
            size = ((data[body + 1] << 8) | data[body + 2], (data[body + 3] << 8) | data[body + 4])
            channels = _LAYERS[data[body + 5]]
            sof_at, sof_end = (pos, end) if sof_at < 0 else (-2, end)  # -2: more than one SOF
        elif marker == 0xDA:  # start of scan: the header is complete
            if size is None or size[0] <= 0 or size[1] <= 0:
                return None
            if size[0] * size[1] > (Image.MAX_IMAGE_PIXELS or float("inf")):
                return None
            if sof_at >= 0:  # one SOF: the layout the next file is tried against
                _last = (bytes(data[:sof_at]), bytes(data[sof_at:sof_at + 4]), bytes(data[sof_end:pos + 4]), length)
            return size[0], size[1], channels
        else:
            return None
        pos = end

"""Decode only what a box needs: header size, DCT scale, region-of-interest decode, resample.

``decode_box(data, choose, out_h, out_w)`` is the engine of the fast training transforms:

1. the image size comes from the JPEG header; ``choose(height, width)`` picks the box (and
   a flip) in upright source pixels, so the box never depends on how the image is decoded
   (a JPEG with an EXIF orientation other than 1 is decoded whole and upright first, then
   the box is chosen on it: orientation always applies before the box);
2. the DCT scale ``k`` is the largest of 1, 2, 4, 8 that keeps the box at least the output
   size on both axes (``reduction_for``);
3. only the box's window is decoded at 1/k (``packer.codecs.jpeg_region``; without a
   TurboJPEG 3 library the whole image is decoded at 1/k through OpenCV/Pillow: same
   pixels, slower). When libjpeg reports any warning or error there (a truncated or damaged
   JPEG), the image goes the reference route, whose rules decide (a truncated JPEG is a
   ``ValueError``);
4. the box, mapped to 1/k coordinates exactly (a pixel of the 1/k image covers k source
   pixels), is resampled by ``packer.data.resample.resample_box``.

Anything else takes the reference route (the same geometry on a full decode under
``packer.codecs.image``'s rules): JPEGs with an EXIF orientation other than 1, CMYK/YCCK,
12-bit or lossless JPEGs, a JPEG libjpeg warns about, other formats, ``PACKER_DECODER=pillow``.
Raw HxWx3 arrays (raw packed samples) are resampled directly.
"""
from __future__ import annotations

import io
import warnings
from typing import Any, Callable

import numpy as np
from PIL import Image

from packer.codecs import image as imaging
from packer.codecs import jpeg_region
from packer.data.resample import resample_box, window

__all__ = ["decode_box", "reduction_for", "jpeg_size", "decode_scaled", "Box", "Chooser"]

Box = tuple[float, float, float, float]  # top, left, height, width (upright source pixels)
Chooser = Callable[[int, int], tuple[Box, bool]]  # (height, width) -> (box, flip)

# Start-of-frame markers carry the image size (C4 = DHT, C8 = JPG extension, CC = DAC are not SOF).
_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
_REDUCED_RGB = {}
_cv2 = imaging.cv2
if _cv2 is not None and hasattr(_cv2, "IMREAD_COLOR_RGB"):
    # IMREAD_REDUCED_GRAYSCALE_k is the bare "reduce by k" bit; OR-ing COLOR_RGB makes it colour.
    _REDUCED_RGB = {2: _cv2.IMREAD_REDUCED_GRAYSCALE_2 | _cv2.IMREAD_COLOR_RGB,
                    4: _cv2.IMREAD_REDUCED_GRAYSCALE_4 | _cv2.IMREAD_COLOR_RGB,
                    8: _cv2.IMREAD_REDUCED_GRAYSCALE_8 | _cv2.IMREAD_COLOR_RGB}


def jpeg_size(data: bytes | memoryview) -> tuple[int, int] | None:
    """(height, width) from a JPEG's start-of-frame header, as stored (before EXIF rotation).

    Returns None when the bytes are not a JPEG or the header is cut short.
    """
    mv = memoryview(data)
    n = len(mv)
    if n < 4 or mv[0] != 0xFF or mv[1] != 0xD8:
        return None
    i = 2
    while i + 4 <= n:
        if mv[i] != 0xFF:
            return None
        marker = mv[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in (0x01, *range(0xD0, 0xD8)):  # standalone markers
            i += 2
            continue
        seg = (mv[i + 2] << 8) | mv[i + 3]
        if marker in _SOF:
            if i + 9 > n:
                return None
            return (mv[i + 5] << 8) | mv[i + 6], (mv[i + 7] << 8) | mv[i + 8]
        if marker in (0xD9, 0xDA):  # end of image / start of scan before any SOF
            return None
        i += 2 + seg
    return None


DCT_GAP = 1.0


def reduction_for(box_h: float, box_w: float, out_h: int, out_w: int) -> int:
    """The largest DCT scale 1, 2, 4 or 8 that keeps the box at least ``out_h x out_w``."""
    for k in (8, 4, 2):
        if box_h >= k * DCT_GAP * out_h and box_w >= k * DCT_GAP * out_w:
            return k
    return 1


def decode_scaled(data: bytes | memoryview, k: int) -> np.ndarray:
    """The whole JPEG decoded at 1/k in the DCT domain (EXIF applied), HxWx3 RGB uint8."""
    if k > 1:
        if _REDUCED_RGB and imaging.cv2_safe(data) and imaging.DECODER != "pillow":
            arr = _cv2.imdecode(np.frombuffer(data, dtype=np.uint8), _REDUCED_RGB[k])
            if arr is not None:
                return arr
        try:  # Pillow's draft picks the same 1/k scaled IDCT (also for CMYK/Adobe JPEGs)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                im = Image.open(io.BytesIO(bytes(data)))
                # Pillow picks the 1/k IDCT for floor sizes and makes the image ceil(side / k)
                im.draft(im.mode if im.mode in ("CMYK", "L") else "RGB", (im.width // k, im.height // k))
                return np.ascontiguousarray(imaging.to_rgb_array(im))
        except Exception as e:
            raise ValueError(f"cannot decode image: {e}") from None
    return imaging.decode(data)


def _scaled_box(box: Box, k: int) -> Box:
    return tuple(v / k for v in box)


def decode_box(data: Any, choose: Chooser, out_h: int, out_w: int) -> np.ndarray:
    """Decode ``data`` (encoded image bytes or an HxWx3 uint8 array) and resample the box
    ``choose(height, width)`` returns to ``out_h x out_w`` (see the module doc).

    ``choose`` is called once (twice only if a decoder disagrees with the header about the
    size: then on the decoded size). Returns HxWx3 or HxWx4 (RGBX) uint8: use
    ``packer.data.resample.to_chw3``. Raises ValueError for undecodable bytes.
    """
    if isinstance(data, np.ndarray):
        box, flip = choose(*data.shape[:2])
        return resample_box(data, box, out_h, out_w, flip=flip)
    chosen, chosen_for = None, None
    if imaging.sniff_format(data) == "jpeg" and imaging.jpeg_orientation(data) == 1:
        size = jpeg_size(data)
        if size is not None and size[0] > 0 and size[1] > 0:
            height, width = size
            chosen, chosen_for = choose(height, width), (height, width)
            (box, flip), k = chosen, reduction_for(chosen[0][2], chosen[0][3], out_h, out_w)
            sbox = _scaled_box(box, k)
            sh, sw = jpeg_region.scaled(height, k), jpeg_region.scaled(width, k)
            if jpeg_region.available() and imaging.DECODER != "pillow":
                y0, x0, y1, x1 = window(sbox, sh, sw, out_h, out_w)
                roi = jpeg_region.decode_region(data, x0, y0, x1 - x0, y1 - y0, scale=k)
                if roi is not None:
                    return resample_box(roi, (sbox[0] - y0, sbox[1] - x0, sbox[2], sbox[3]),
                                        out_h, out_w, flip=flip)
            else:
                arr = decode_scaled(data, k)
                if arr.shape[:2] == (sh, sw):
                    return resample_box(arr, sbox, out_h, out_w, flip=flip)
    arr = imaging.decode(data)
    if chosen_for != arr.shape[:2]:  # not a JPEG we could read the size of (or it lied)
        chosen = choose(*arr.shape[:2])
    box, flip = chosen
    return resample_box(arr, box, out_h, out_w, flip=flip)

"""Resample a box of an image to an output size with exact sub-pixel geometry.

The one resampler behind ``DecodeResizeCrop`` and ``DecodeRandomResizedCrop``. A box is
``(top, left, height, width)`` in pixel-edge coordinates of the array (pixel ``i`` covers
``[i, i+1)``), fractional values allowed. Output pixel ``u`` (of ``out_w``) samples the source
at ``x = left + (u + 0.5) * width / out_w - 0.5`` (pixel-centre convention, as Pillow,
torchvision and OpenCV's ``resize`` use), so the result sits exactly where a resize of the
whole image followed by a crop puts it: no rounding of the box to whole pixels.

Semantics at the border follow torchvision. A box of whole pixels (RandomResizedCrop's) is
*cut, then resized*: samples that fall outside it repeat its edge. A fractional box
(Resize + CenterCrop's) is part of a *resized whole image*: samples near its edge read the
image's own pixels beyond it (``window`` adds that margin), and only the image's edge repeats.
With a bilinear downscale the two agree: its taps stay inside the box. The area reduction
(more than 2x left) reads up to ``factor + 1`` pixels beyond any box, as the Lanczos
reference does.

Quality settings (chosen by median PSNR against a full-decode Lanczos reference, measured
with ``packer.commands.fidelity`` on generated photo-like images):

* remaining scale <= 2 (the DCT-reduced decode, or the source, is at most 2x the output):
  bilinear interpolation (OpenCV, 1/32-pixel coordinate precision). A fractional box
  between 1.5x and 2x is pre-blurred with a 3x3 Gaussian of sigma ``0.35 * sqrt(s^2 - 1)``
  first (without it the centre crop's median falls 0.3 dB below torchvision's; with it it is
  0.6 dB above); for whole boxes bilinear alone is already above torchvision's median, and
  OpenCV's exact ``INTER_AREA`` (+0.4 dB more) costs ~1 ms an image;
* remaining scale > 2: a box-filter reduction of the window (with its margin) by the integer
  factor ``floor(scale)``, then bilinear for the rest (antialiasing: no pixel is skipped).

An integer box whose scale needs no reduction is resized with ``cv2.resize`` on the window
(the same mapping, faster); other boxes with ``cv2.warpAffine`` on 4-channel pixels (OpenCV
5's 3-channel warp is ~3x slower than its 4-channel one).
"""
from __future__ import annotations

import math

import cv2
import numpy as np

__all__ = ["resample_box", "window", "to_chw3"]

_RGB2RGBA = cv2.COLOR_RGB2RGBA
_LINEAR = cv2.INTER_LINEAR


def _is_int(v: float) -> bool:
    return abs(v - round(v)) < 1e-9


def _area_reduce(win: np.ndarray, fy: int, fx: int) -> np.ndarray:
    """Average ``fy x fx`` blocks (the window padded by edge repetition to whole blocks)."""
    h, w = win.shape[:2]
    ph, pw = (-h) % fy, (-w) % fx
    if ph or pw:
        win = cv2.copyMakeBorder(win, 0, ph, 0, pw, cv2.BORDER_REPLICATE)
    return cv2.resize(win, ((w + pw) // fx, (h + ph) // fy), interpolation=cv2.INTER_AREA)


def _factor(s: float) -> int:
    return math.floor(s) if s > 2 else 1


# the pre-blur of fractional boxes between 1.5x and 2x (see the module doc)
BLUR = 0.35
BLUR_FROM = 1.5


def _blur_sigma(s: float) -> float:
    return BLUR * math.sqrt(s * s - 1) if BLUR_FROM < s <= 2 else 0.0


def _factors(bh: float, bw: float, out_h: int, out_w: int) -> tuple[int, int]:
    return _factor(bh / out_h), _factor(bw / out_w)


def window(box: tuple[float, float, float, float], height: int, width: int, out_h: int,
           out_w: int) -> tuple[int, int, int, int]:
    """(y0, x0, y1, x1): the pixels of a ``height x width`` image that resampling ``box`` to
    ``out_h x out_w`` reads (the box's whole pixels, plus a margin for a fractional box)."""
    top, left, bh, bw = (float(v) for v in box)
    fy, fx = _factors(bh, bw, out_h, out_w)
    whole = all(_is_int(v) for v in (top, left, bh, bw))
    my, mx = (0, 0) if whole and fy == fx == 1 else (fy + 1, fx + 1)
    y0, x0 = max(0, math.floor(top + 1e-9) - my), max(0, math.floor(left + 1e-9) - mx)
    y1 = min(height, math.ceil(top + bh - 1e-9) + my)
    x1 = min(width, math.ceil(left + bw - 1e-9) + mx)
    return y0, x0, y1, x1


def resample_box(arr: np.ndarray, box: tuple[float, float, float, float], out_h: int, out_w: int,
                 *, flip: bool = False) -> np.ndarray:
    """Resample ``box`` of the HxWxC uint8 ``arr`` to ``out_h x out_w`` (see the module doc).

    ``arr`` may be a region of a larger image as long as it holds ``window(box, ...)``.
    ``flip`` mirrors the output left-right. Returns an ``out_h x out_w x C'`` uint8 array
    where C' is C, or 4 for a 3-channel input on the warp path (the 4th channel is padding:
    use ``to_chw3``).
    """
    top, left, bh, bw = (float(v) for v in box)
    if not (bh > 0 and bw > 0 and out_h > 0 and out_w > 0):
        raise ValueError(f"empty box {box} or output {out_h}x{out_w}")
    y0, x0, y1, x1 = window(box, arr.shape[0], arr.shape[1], out_h, out_w)
    if y1 <= y0 or x1 <= x0:
        raise ValueError(f"box {box} does not overlap the {arr.shape[0]}x{arr.shape[1]} image")
    win = arr[y0:y1, x0:x1]
    top, left = top - y0, left - x0
    fy, fx = _factors(bh, bw, out_h, out_w)
    if not all(_is_int(v) for v in (top, left, bh, bw)):
        by, bx = _blur_sigma(bh / out_h), _blur_sigma(bw / out_w)
        if by > 0 or bx > 0:
            win = cv2.GaussianBlur(np.ascontiguousarray(win), (3, 3), sigmaX=max(bx, 1e-3),
                                   sigmaY=max(by, 1e-3))
    if fy > 1 or fx > 1:
        win = _area_reduce(np.ascontiguousarray(win), fy, fx)
        top, left, bh, bw = top / fy, left / fx, bh / fy, bw / fx
    sy, sx = bh / out_h, bw / out_w
    if (_is_int(top) and _is_int(left) and _is_int(bh) and _is_int(bw)
            and round(top) == 0 and round(left) == 0 and win.shape[:2] == (round(bh), round(bw))):
        out = cv2.resize(win, (out_w, out_h), interpolation=_LINEAR)
    else:
        if win.shape[2] == 3:
            win = cv2.cvtColor(win, _RGB2RGBA)
        m = np.array([[sx, 0.0, left + 0.5 * sx - 0.5], [0.0, sy, top + 0.5 * sy - 0.5]])
        out = cv2.warpAffine(win, m, (out_w, out_h), flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP,
                             borderMode=cv2.BORDER_REPLICATE)
    if flip:
        out = cv2.flip(out, 1)
    return out


def to_chw3(arr: np.ndarray) -> np.ndarray:
    """HxWx3 or HxWx4 (RGBX) uint8 -> a new contiguous 3xHxW array (the padding dropped)."""
    h, w = arr.shape[:2]
    out = np.empty((3, h, w), np.uint8)
    planes = [out[0], out[1], out[2]]
    if arr.shape[2] == 4:
        planes.append(np.empty((h, w), np.uint8))
    cv2.split(np.ascontiguousarray(arr), planes)
    return out

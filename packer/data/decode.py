"""Decoding images for training: decode-time resize and crops, their box arithmetic and resampling.

Resample a box of an image to an output size with exact sub-pixel geometry.

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
with ``packer.benchmark.fidelity`` on generated photo-like images):

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

Decode only what a box needs: header size, DCT scale, region-of-interest decode, resample.

``decode_box(data, choose, out_h, out_w)`` is the engine of the fast training transforms:

1. the image size comes from the JPEG header (``packer.codecs.jpeg_meta``, the one parser of
   size, EXIF orientation and colour layout, which reads them as Pillow does);
   ``choose(height, width)`` picks the box (and a flip) in upright source pixels, so the box
   never depends on how the image is decoded (a JPEG with an EXIF orientation other than 1
   is decoded whole and upright first, then the box is chosen on it: orientation always
   applies before the box);
2. the DCT scale ``k`` is the largest of 1, 2, 4, 8 that keeps the box at least the output
   size on both axes (``reduction_for``);
3. only the box's window is decoded at 1/k (``packer.codecs.jpeg_region``; without a
   TurboJPEG 3 library the whole image is decoded at 1/k through OpenCV/Pillow: same
   pixels, slower). When libjpeg reports any warning or error there (a truncated or damaged
   JPEG), the image goes the reference route, whose rules decide (a truncated JPEG is a
   ``ValueError``);
4. the box, mapped to 1/k coordinates exactly (a pixel of the 1/k image covers k source
   pixels), is resampled by ``packer.data.decode.resample_box``.

Anything else takes the reference route (the same geometry on a full decode under
``packer.codecs.image``'s rules): JPEGs with an EXIF orientation other than 1, CMYK/YCCK,
an Adobe APP14, 12-bit or lossless JPEGs, any header ``jpeg_meta`` cannot promise Pillow's
reading of, a JPEG libjpeg warns about, other formats, ``PACKER_DECODER=pillow``.
Raw HxWx3 arrays (raw packed samples) are resampled directly.

The training crop: RandomResizedCrop + horizontal flip, chosen from the header, decoded in the box.

``DecodeRandomResizedCrop(224)`` gives what torchvision's ``RandomResizedCrop(224)`` followed by
``RandomHorizontalFlip(0.5)`` gives, as a 3x224x224 uint8 tensor, doing the work FFCV-style
inside the decode (``packer.data.decode``): the box is chosen from the JPEG header size,
the JPEG is decoded at the largest DCT scale (1/2, 1/4, 1/8) that keeps the box at least the
output size, only the box's window is decoded (region-of-interest decoding) and only it is
resampled, with exact geometry.

**The box** (``sample_box``; torchvision's rule, every draw in the same order):

1. up to 10 tries: ``area = H * W * U(scale)``, ``aspect = exp(U(log ratio[0], log ratio[1]))``,
   ``w = round(sqrt(area * aspect))``, ``h = round(sqrt(area / aspect))`` (Python's round,
   half to even); the first try with ``0 < w <= W`` and ``0 < h <= H`` wins, placed at
   ``top = randint(0, H - h)``, ``left = randint(0, W - w)`` (inclusive, drawn in that order);
2. if none fits, the centre crop: the whole image when its aspect is within ``ratio``, else
   the largest centred box of the nearest allowed aspect (``h = round(W / ratio[0])`` for
   too-tall images, ``w = round(H * ratio[1])`` for too-wide ones), at ``(H - h) // 2``,
   ``(W - w) // 2``.

``H x W`` is the *upright* size: EXIF orientation is applied before the box is chosen.

**Then** the box (whole source pixels) is resized to ``size`` with bilinear interpolation,
an area pre-reduction where it is more than 2x the output (torchvision: Pillow's bilinear,
which widens the filter instead), and mirrored left-right with probability ``flip`` (one
more draw, after the box).

**Randomness.** numpy's ``Generator`` (PCG64), not torch's: the rule is the same, the stream
is not torchvision's. ``seed=None`` draws fresh entropy per process. With ``seed=N`` the main
process draws from ``default_rng(N)``; a DataLoader worker from ``default_rng([N, worker_seed])``
where ``worker_seed`` is torch's per-worker seed (so different per worker and per epoch, and
reproducible under ``torch.manual_seed``). Calls from several threads share one generator
(numpy serializes them; which sample gets which draw then follows thread timing): pass
``rng=`` per call for order-independent determinism.

The evaluation image pipeline: decode + Resize(short side) + CenterCrop -> uint8 CHW.

``DecodeResizeCrop`` is the fast path with torchvision's exact geometry. torchvision's
``Resize(S) + CenterCrop(C)`` resizes the image to ``S x int(S * long / short)``, then cuts
the ``C x C`` square at ``round((h' - C) / 2), round((w' - C) / 2)``. That square is a box of
*fractional* source pixels; ``DecodeResizeCrop`` picks the same box from the JPEG header,
decodes at the largest DCT scale 1/2, 1/4, 1/8 that keeps it at least ``C`` (libjpeg-turbo's
scaled IDCT), decodes only the box's window where a TurboJPEG 3 library is available
(``packer.codecs.jpeg_region``) and resamples it with exact sub-pixel geometry (bilinear; an
area pre-reduction where more than 2x remains). See ``packer.data.decode`` and
``packer.data.decode``; ``docs/loading.md`` has the measured fidelity.

``PilResizeCrop`` is the reference: what a torchvision ``ImageFolder`` pipeline does
(Pillow full decode, ``Resize(256)`` bilinear with antialiasing, ``CenterCrop(224)``).
Both apply EXIF orientation and give 3-channel RGB, under the rule in ``packer.codecs.image``.

Use either as ``PackedDataset(path, decode=DecodeResizeCrop(256, 224))``.
"""
from __future__ import annotations

import io
import math
import os
import threading
import warnings
from typing import Any, Callable, Optional, Sequence

import cv2
import numpy as np
import torch
from PIL import Image

from packer.codecs import image as imaging, jpeg_region
from packer.codecs.jpeg_meta import jpeg_meta, orient
from packer.codecs.image import decode_pil, to_chw

__all__ = ["resample_box", "window", "to_chw3", "decode_box", "reduction_for", "jpeg_size", "decode_scaled",
           "Box", "Chooser", "sample_box", "DecodeRandomResizedCrop", "PilRandomResizedCrop",
           "DecodeResizeCrop", "PilResizeCrop", "reduction_factor", "center_box", "resized_size"]

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


_IDENTITY3 = np.array([0.0, 1.0, 0.0])


def _gauss3(sigma: float) -> np.ndarray:
    """The 3-tap Gaussian of ``sigma`` (the identity for 0), for ``cv2.sepFilter2D``: its float
    kernel runs ~20% faster than ``cv2.GaussianBlur``'s bit-exact fixed point on 8-bit pixels,
    and differs from it by at most one level."""
    if sigma <= 0:
        return _IDENTITY3
    w = math.exp(-0.5 / (sigma * sigma))
    return np.array([w, 1.0, w]) / (1.0 + 2.0 * w)


def _blur_sigma(s: float) -> float:
    return BLUR * math.sqrt(s * s - 1) if BLUR_FROM < s <= 2 else 0.0


def _factors(bh: float, bw: float, out_h: int, out_w: int) -> tuple[int, int]:
    return _factor(bh / out_h), _factor(bw / out_w)


def window(box: tuple[float, float, float, float], height: int, width: int, out_h: int,
           out_w: int) -> tuple[int, int, int, int]:
    """(y0, x0, y1, x1): the pixels of a ``height x width`` image that resampling ``box`` to
    ``out_h x out_w`` reads (the box's whole pixels, plus a margin for a fractional box)."""
    top, left, bh, bw = box
    top, left, bh, bw = float(top), float(left), float(bh), float(bw)
    fy, fx = _factors(bh, bw, out_h, out_w)
    whole = fy == fx == 1 and _is_int(top) and _is_int(left) and _is_int(bh) and _is_int(bw)
    my, mx = (0, 0) if whole else (fy + 1, fx + 1)
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
    return _resample_window(arr[y0:y1, x0:x1], top - y0, left - x0, bh, bw, out_h, out_w, flip)


def _resample_window(win: np.ndarray, top: float, left: float, bh: float, bw: float, out_h: int,
                     out_w: int, flip: bool) -> np.ndarray:
    """``resample_box`` on the box's ``window`` already cut out (the box in its coordinates)."""
    fy, fx = _factors(bh, bw, out_h, out_w)
    whole = _is_int(top) and _is_int(left) and _is_int(bh) and _is_int(bw)
    if not whole:
        by, bx = _blur_sigma(bh / out_h), _blur_sigma(bw / out_w)
        if by > 0 or bx > 0:
            win = cv2.sepFilter2D(win, -1, _gauss3(bx), _gauss3(by))
    if fy > 1 or fx > 1:
        win = _area_reduce(win, fy, fx)
        top, left, bh, bw = top / fy, left / fx, bh / fy, bw / fx
        whole = _is_int(top) and _is_int(left) and _is_int(bh) and _is_int(bw)
    if whole and round(top) == 0 and round(left) == 0 and win.shape[:2] == (round(bh), round(bw)):
        out = cv2.resize(win, (out_w, out_h), interpolation=_LINEAR)
    else:
        sy, sx = bh / out_h, bw / out_w
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

Box = tuple[float, float, float, float]  # top, left, height, width (upright source pixels)
Chooser = Callable[[int, int], tuple[Box, bool]]  # (height, width) -> (box, flip)

_REDUCED_RGB = {}
_cv2 = imaging.cv2
if _cv2 is not None and hasattr(_cv2, "IMREAD_COLOR_RGB"):
    # IMREAD_REDUCED_GRAYSCALE_k is the bare "reduce by k" bit; OR-ing COLOR_RGB makes it colour.
    # IMREAD_IGNORE_ORIENTATION: the stored pixels; the orientation is jpeg_meta's (Pillow's)
    _REDUCED_RGB = {k: flag | _cv2.IMREAD_COLOR_RGB | _cv2.IMREAD_IGNORE_ORIENTATION
                    for k, flag in ((2, _cv2.IMREAD_REDUCED_GRAYSCALE_2), (4, _cv2.IMREAD_REDUCED_GRAYSCALE_4),
                                    (8, _cv2.IMREAD_REDUCED_GRAYSCALE_8))}


def jpeg_size(data: bytes | memoryview) -> tuple[int, int] | None:
    """(height, width) from a JPEG's start-of-frame header, as stored (before EXIF rotation).

    Returns None when the bytes are not a JPEG whose header ``packer.codecs.jpeg_meta`` can
    read (cut short, junk between segments, ...).
    """
    meta = jpeg_meta(data)
    return None if meta is None else (meta.height, meta.width)


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
        meta = jpeg_meta(data) if _REDUCED_RGB and imaging.DECODER != "pillow" else None
        if meta is not None and meta.fast:
            arr = _cv2.imdecode(np.frombuffer(data, dtype=np.uint8), _REDUCED_RGB[k])
            if arr is not None:
                return orient(arr, meta.orientation)
        try:  # Pillow's draft picks the same 1/k scaled IDCT (also for CMYK/Adobe JPEGs)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                im = Image.open(io.BytesIO(bytes(data)))
                # Pillow picks the 1/k IDCT for floor sizes and makes the image ceil(side / k)
                im.draft(im.mode if im.mode in ("CMYK", "L") else "RGB", (im.width // k, im.height // k))
                return np.ascontiguousarray(imaging.to_rgb_array(im))
        except Exception as e:
            raise ValueError(f"cannot decode image: {e}") from e
    return imaging.decode(data)


def _scaled_box(box: Box, k: int) -> Box:
    return tuple(v / k for v in box)


def decode_box(data: Any, choose: Chooser, out_h: int, out_w: int) -> np.ndarray:
    """Decode ``data`` (encoded image bytes or an HxWx3 uint8 array) and resample the box
    ``choose(height, width)`` returns to ``out_h x out_w`` (see the module doc).

    ``choose`` is called once (twice only if a decoder disagrees with the header about the
    size: then on the decoded size). Returns HxWx3 or HxWx4 (RGBX) uint8: use
    ``packer.data.decode.to_chw3``. Raises ValueError for undecodable bytes.
    """
    if isinstance(data, np.ndarray):
        box, flip = choose(*data.shape[:2])
        return resample_box(data, box, out_h, out_w, flip=flip)
    chosen, chosen_for = None, None
    meta = jpeg_meta(data) if imaging.sniff_format(data) == "jpeg" else None
    # the fast route: a JPEG whose header promises Pillow's pixels and is upright as stored;
    # anything else is decoded whole (and upright) by imaging.decode's rules, then boxed
    if meta is not None and meta.fast and meta.orientation == 1:
        height, width = meta.height, meta.width
        chosen, chosen_for = choose(height, width), (height, width)
        (box, flip), k = chosen, reduction_for(chosen[0][2], chosen[0][3], out_h, out_w)
        sbox = _scaled_box(box, k)
        sh, sw = jpeg_region.scaled(height, k), jpeg_region.scaled(width, k)
        if jpeg_region.available() and imaging.DECODER != "pillow":
            y0, x0, y1, x1 = window(sbox, sh, sw, out_h, out_w)
            roi = jpeg_region.decode_region(data, x0, y0, x1 - x0, y1 - y0, scale=k)
            if roi is not None:  # the window itself: resample it as resample_box would
                return _resample_window(roi, sbox[0] - y0, sbox[1] - x0, sbox[2], sbox[3], out_h, out_w, flip)
        else:
            arr = decode_scaled(data, k)
            if arr.shape[:2] == (sh, sw):
                return resample_box(arr, sbox, out_h, out_w, flip=flip)
    arr = imaging.decode(data)
    if chosen_for != arr.shape[:2]:  # not a JPEG we could read the size of (or it lied)
        chosen = choose(*arr.shape[:2])
    box, flip = chosen
    return resample_box(arr, box, out_h, out_w, flip=flip)

def sample_box(height: int, width: int, rng: np.random.Generator, *,
               scale: Sequence[float] = (0.08, 1.0),
               ratio: Sequence[float] = (3 / 4, 4 / 3)) -> tuple[int, int, int, int]:
    """(top, left, height, width) of torchvision's RandomResizedCrop box (see the module doc)."""
    # Not clips.random_resized_crop_box on purpose: torchvision's draws and fallback differ from mmaction2's.
    area = height * width
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    for _ in range(10):
        target = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(log_lo, log_hi))
        w = int(round(math.sqrt(target * aspect)))
        h = int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = int(rng.integers(0, height - h + 1))
            left = int(rng.integers(0, width - w + 1))
            return top, left, h, w
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        w, h = int(round(height * max(ratio))), height
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def _pair(size: int | Sequence[int]) -> tuple[int, int]:
    if isinstance(size, (int, np.integer)):
        size = (int(size), int(size))
    if len(size) != 2 or not all(isinstance(v, (int, np.integer)) and v > 0 for v in size):
        raise ValueError(f"size must be a positive int or (height, width), not {size!r}")
    return int(size[0]), int(size[1])


class _RandomCrop:
    """Shared arguments, validation and the per-process random stream."""

    def __init__(self, size: int | Sequence[int], *, scale: Sequence[float] = (0.08, 1.0),
                 ratio: Sequence[float] = (3 / 4, 4 / 3), flip: float = 0.5,
                 seed: Optional[int] = None):
        self.size = _pair(size)
        if len(scale) != 2 or not 0 < scale[0] <= scale[1]:
            raise ValueError(f"scale must be (min, max) with 0 < min <= max, not {scale!r}")
        if len(ratio) != 2 or not 0 < ratio[0] <= ratio[1]:
            raise ValueError(f"ratio must be (min, max) with 0 < min <= max, not {ratio!r}")
        if not 0.0 <= flip <= 1.0:
            raise ValueError(f"flip must be a probability in [0, 1], not {flip!r}")
        if seed is not None and not (isinstance(seed, (int, np.integer)) and seed >= 0):
            raise ValueError(f"seed must be a non-negative int or None, not {seed!r}")
        self.scale = (float(scale[0]), float(scale[1]))
        self.ratio = (float(ratio[0]), float(ratio[1]))
        self.flip = float(flip)
        self.seed = None if seed is None else int(seed)
        self._rng: Optional[np.random.Generator] = None
        self._pid: Optional[int] = None
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(_rng=None, _pid=None, _lock=None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def generator(self) -> np.random.Generator:
        """This process's generator (created on first use; see the module doc)."""
        pid = os.getpid()
        if self._rng is None or self._pid != pid:
            with self._lock:
                if self._rng is None or self._pid != pid:
                    info = torch.utils.data.get_worker_info()
                    if self.seed is None:
                        rng = np.random.default_rng()
                    elif info is None:
                        rng = np.random.default_rng(self.seed)
                    else:
                        rng = np.random.default_rng([self.seed, int(info.seed) % 2**63])
                    self._rng, self._pid = rng, pid
        return self._rng

    def sample(self, height: int, width: int, rng: np.random.Generator) -> tuple[Box, bool]:
        """The box (top, left, height, width) and the flip for an upright HxW image."""
        box = sample_box(height, width, rng, scale=self.scale, ratio=self.ratio)
        return box, bool(self.flip > 0 and rng.random() < self.flip)

    @property
    def output_size(self) -> tuple[int, int]:
        """(height, width) of what the transform returns."""
        return self.size

    def chooser(self, rng: Optional[np.random.Generator] = None) -> Chooser:
        """The box-and-flip choice for one call, drawn from ``rng`` (None: this process's
        generator): what ``decode_box`` takes, and what the GPU decode (``packer.data.gpu``) draws."""
        rng = rng if rng is not None else self.generator()
        return lambda h, w: self.sample(h, w, rng)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.size}, scale={self.scale}, ratio={self.ratio}, "
                f"flip={self.flip}, seed={self.seed})")


class DecodeRandomResizedCrop(_RandomCrop):
    """Fast RandomResizedCrop + horizontal flip -> 3 x H x W uint8 tensor (see the module doc).

    Accepts encoded image bytes or an HxWx3 uint8 array (raw packed samples: the box is cut
    from the array). Picklable; raises ``ValueError`` for undecodable bytes.

    Args:
        size: output side, or (height, width).
        scale: range of the box's area as a fraction of the image's.
        ratio: range of the box's aspect (width / height), sampled log-uniformly.
        flip: probability of a left-right mirror.
        seed: makes the draws reproducible (see the module doc); None for fresh entropy.
    """

    def __call__(self, data: Any, rng: Optional[np.random.Generator] = None) -> torch.Tensor:
        return torch.from_numpy(to_chw3(decode_box(data, self.chooser(rng), *self.size)))


class PilRandomResizedCrop(_RandomCrop):
    """The reference: what torchvision's ``RandomResizedCrop`` + ``RandomHorizontalFlip`` do
    on a PIL image (full Pillow decode, crop, Pillow bilinear resize with its antialiasing),
    with the same box rule and draws as ``DecodeRandomResizedCrop``: one ``rng`` seeded alike
    gives both the same box."""

    def __call__(self, data: Any, rng: Optional[np.random.Generator] = None) -> torch.Tensor:
        rng = rng if rng is not None else self.generator()
        if isinstance(data, np.ndarray):
            im = Image.fromarray(data)
        else:
            im = Image.fromarray(decode_pil(data))  # the reference decode (ValueError if undecodable)
        (top, left, h, w), flip = self.sample(im.height, im.width, rng)
        im = im.crop((left, top, left + w, top + h)).resize((self.size[1], self.size[0]), Image.BILINEAR)
        if flip:
            im = im.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        return torch.from_numpy(to_chw(np.ascontiguousarray(np.asarray(im))))

def reduction_factor(height: int, width: int, short_side: int) -> int:
    """The largest DCT scale 1, 2, 4 or 8 that keeps the short side >= ``short_side``."""
    short = min(height, width)
    for k in (8, 4, 2):
        if short >= k * short_side:
            return k
    return 1


def _decode_scaled(data: bytes | memoryview, short_side: int) -> np.ndarray:
    """The whole image at the DCT scale that keeps its short side >= ``short_side``."""
    size = jpeg_size(data)
    return decode_scaled(data, reduction_factor(*size, short_side) if size else 1)


def resized_size(height: int, width: int, short_side: int) -> tuple[int, int]:
    """(height, width) after torchvision's ``Resize(short_side)``: the long side truncated."""
    if width <= height:
        return int(short_side * height / width), short_side
    return short_side, int(short_side * width / height)


def center_box(height: int, width: int, short_side: int, crop: int) -> Box:
    """The source box (top, left, height, width; fractional) that torchvision's
    ``Resize(short_side) + CenterCrop(crop)`` turns into its output."""
    rh, rw = resized_size(height, width, short_side)
    top, left = int(round((rh - crop) / 2.0)), int(round((rw - crop) / 2.0))
    sy, sx = height / rh, width / rw
    return top * sy, left * sx, crop * sy, crop * sx


def _as_chw(arr: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(to_chw(np.ascontiguousarray(arr)))


class _ResizeCrop:
    """Shared arguments: resize the short side to ``short_side``, keep the centre ``crop`` square."""

    def __init__(self, short_side: int = 256, crop: int = 224):
        if short_side < 1 or crop < 1:
            raise ValueError(f"short_side and crop must be positive, got {short_side} and {crop}")
        if crop > short_side:
            raise ValueError(f"crop ({crop}) cannot be larger than short_side ({short_side})")
        self.short_side = short_side
        self.crop = crop

    @property
    def output_size(self) -> tuple[int, int]:
        """(height, width) of what the transform returns."""
        return self.crop, self.crop

    def chooser(self, rng: Optional[np.random.Generator] = None) -> Chooser:
        """The centre box for any image (``rng`` is not used: nothing is drawn)."""
        return self._choose

    def _choose(self, height: int, width: int) -> tuple[Box, bool]:
        return center_box(height, width, self.short_side, self.crop), False

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.short_side}, {self.crop})"


class DecodeResizeCrop(_ResizeCrop):
    """Fast decode + resize(short side) + centre crop -> 3 x crop x crop uint8 tensor.

    Picklable (works in DataLoader workers). Accepts encoded image bytes or an HxWx3 uint8
    array (raw packed samples). Raises ``ValueError`` for undecodable bytes.

    Args:
        short_side: the short side the image is (notionally) resized to.
        crop: the side of the centre square that is kept.
    """

    def __call__(self, data: Any) -> torch.Tensor:
        out = decode_box(data, self._choose, self.crop, self.crop)
        return torch.from_numpy(to_chw3(out))


class PilResizeCrop(_ResizeCrop):
    """The reference pipeline: Pillow full decode, ``Resize(short_side)`` bilinear, centre crop.

    Matches torchvision's ``Resize(256) + CenterCrop(224) + PILToTensor`` on a PIL image
    (sizes rounded the way torchvision rounds them), without needing torchvision.
    """

    def __call__(self, data: Any) -> torch.Tensor:
        if isinstance(data, Image.Image):
            im = data.convert("RGB")
        elif isinstance(data, np.ndarray):
            im = Image.fromarray(data)
        else:
            im = Image.fromarray(decode_pil(data))  # the reference decode (ValueError if undecodable)
        w, h = im.size
        if w <= h:
            size = (self.short_side, int(self.short_side * h / w))
        else:
            size = (int(self.short_side * w / h), self.short_side)
        im = im.resize(size, Image.BILINEAR)
        w, h = im.size
        top, left = int(round((h - self.crop) / 2.0)), int(round((w - self.crop) / 2.0))
        im = im.crop((left, top, left + self.crop, top + self.crop))
        return _as_chw(np.asarray(im))

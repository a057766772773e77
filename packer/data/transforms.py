"""The training image pipeline: decode + resize(short side) + center crop -> uint8 CHW.

``DecodeResizeCrop`` is the fast path: a JPEG at least 2x larger than the target is decoded
at 1/2, 1/4 or 1/8 scale in the DCT domain (libjpeg-turbo's scaled IDCT through OpenCV's
``IMREAD_REDUCED_*``, or Pillow's ``draft``), only the centre square that survives the crop
is resized (bilinear, already below 2x so no aliasing to fight), and the result is a
3xHxW uint8 tensor ready for ``uint8_collate`` and GPU normalization.

``PilResizeCrop`` is the reference: what a torchvision ``ImageFolder`` pipeline does
(Pillow full decode, ``Resize(256)`` bilinear with antialiasing, ``CenterCrop(224)``).
Both apply EXIF orientation and give 3-channel RGB, under the rule in ``packer.codecs.image``.

Use either as ``PackedDataset(path, decode=DecodeResizeCrop(256, 224))``.
"""
from __future__ import annotations

import io
import warnings
from typing import Any

import numpy as np
import torch
from PIL import Image

from packer.codecs.image import _cv2_safe, _to_rgb_array, cv2, decode, sniff_format, to_chw

__all__ = ["DecodeResizeCrop", "PilResizeCrop", "jpeg_size", "reduction_factor"]

# Start-of-frame markers carry the image size (C4 = DHT, C8 = JPG extension, CC = DAC are not SOF).
_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
_REDUCED_RGB = {}
if cv2 is not None and hasattr(cv2, "IMREAD_COLOR_RGB"):
    # IMREAD_REDUCED_GRAYSCALE_k is the bare "reduce by k" bit; OR-ing COLOR_RGB makes it colour.
    _REDUCED_RGB = {1: cv2.IMREAD_COLOR_RGB, 2: cv2.IMREAD_REDUCED_GRAYSCALE_2 | cv2.IMREAD_COLOR_RGB,
                    4: cv2.IMREAD_REDUCED_GRAYSCALE_4 | cv2.IMREAD_COLOR_RGB,
                    8: cv2.IMREAD_REDUCED_GRAYSCALE_8 | cv2.IMREAD_COLOR_RGB}


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


def reduction_factor(height: int, width: int, short_side: int) -> int:
    """The largest DCT scale 1, 2, 4 or 8 that keeps the short side >= ``short_side``."""
    short = min(height, width)
    for k in (8, 4, 2):
        if short >= k * short_side:
            return k
    return 1


def _decode_scaled(data: bytes | memoryview, short_side: int) -> np.ndarray:
    """Decode to HxWx3 RGB uint8, at a DCT-reduced scale when the JPEG is >= 2x ``short_side``."""
    if sniff_format(data) == "jpeg":
        size = jpeg_size(data)
        k = reduction_factor(*size, short_side) if size else 1
        if k > 1:
            if _REDUCED_RGB and _cv2_safe(data):
                arr = cv2.imdecode(np.frombuffer(data, dtype=np.uint8), _REDUCED_RGB[k])
                if arr is not None:
                    return arr
            try:  # Pillow's draft picks the same 1/k scaled IDCT (also for CMYK/Adobe JPEGs)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    im = Image.open(io.BytesIO(bytes(data)))
                    im.draft(im.mode if im.mode in ("CMYK", "L") else "RGB",
                             (size[1] // k, size[0] // k))
                    return np.ascontiguousarray(_to_rgb_array(im))
            except Exception as e:
                raise ValueError(f"cannot decode image: {e}") from None
    return decode(data)


def _crop_box(height: int, width: int, short_side: int, crop: int) -> tuple[float, float, float]:
    """The centre square (top, left, side) in source pixels that ends up as the ``crop`` output."""
    scale = short_side / min(height, width)
    side = min(crop / scale, height, width)
    return (height - side) / 2, (width - side) / 2, side


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
        arr = data if isinstance(data, np.ndarray) else _decode_scaled(data, self.short_side)
        h, w = arr.shape[:2]
        top, left, side = _crop_box(h, w, self.short_side, self.crop)
        # Resize only the pixels that survive the crop (the centre square, rounded to whole
        # source pixels: at most half a source pixel off the resize-then-crop geometry).
        y0, x0, n = int(round(top)), int(round(left)), max(1, int(round(side)))
        roi = arr[y0:y0 + n, x0:x0 + n]
        if cv2 is not None:
            out = cv2.resize(roi, (self.crop, self.crop), interpolation=cv2.INTER_LINEAR)
        else:  # pragma: no cover - OpenCV is a dependency
            out = np.asarray(Image.fromarray(np.ascontiguousarray(roi)).resize(
                (self.crop, self.crop), Image.BILINEAR))
        return _as_chw(out)


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
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    im = Image.fromarray(_to_rgb_array(Image.open(io.BytesIO(bytes(data)))))
            except Exception as e:
                raise ValueError(f"cannot decode image: {e}") from None
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

"""The evaluation image pipeline: decode + Resize(short side) + CenterCrop -> uint8 CHW.

``DecodeResizeCrop`` is the fast path with torchvision's exact geometry. torchvision's
``Resize(S) + CenterCrop(C)`` resizes the image to ``S x int(S * long / short)``, then cuts
the ``C x C`` square at ``round((h' - C) / 2), round((w' - C) / 2)``. That square is a box of
*fractional* source pixels; ``DecodeResizeCrop`` picks the same box from the JPEG header,
decodes at the largest DCT scale 1/2, 1/4, 1/8 that keeps it at least ``C`` (libjpeg-turbo's
scaled IDCT), decodes only the box's window where a TurboJPEG 3 library is available
(``packer.codecs.jpeg_region``) and resamples it with exact sub-pixel geometry (bilinear; an
area pre-reduction where more than 2x remains). See ``packer.data.boxdecode`` and
``packer.data.resample``; ``docs/loading.md`` has the measured fidelity.

``PilResizeCrop`` is the reference: what a torchvision ``ImageFolder`` pipeline does
(Pillow full decode, ``Resize(256)`` bilinear with antialiasing, ``CenterCrop(224)``).
Both apply EXIF orientation and give 3-channel RGB, under the rule in ``packer.codecs.image``.

Use either as ``PackedDataset(path, decode=DecodeResizeCrop(256, 224))``.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
from PIL import Image

from packer.codecs.image import decode_pil, to_chw
from packer.data.boxdecode import Box, decode_box, decode_scaled, jpeg_size
from packer.data.resample import to_chw3

__all__ = ["DecodeResizeCrop", "PilResizeCrop", "jpeg_size", "reduction_factor", "center_box",
           "resized_size"]


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

    def _choose(self, height: int, width: int) -> tuple[Box, bool]:
        return center_box(height, width, self.short_side, self.crop), False

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

"""Per-channel normalization of uint8 image and clip batches, on whatever device they are.

``(x - mean * 255) / (std * 255)`` computed in float32 (exact for uint8 input: the same
IEEE subtraction and division on every device, so CPU and CUDA agree bit for bit), then
cast to the requested dtype. Batches are ``N x C x H x W`` images or ``N x T x C x H x W`` /
``N x C x T x H x W`` clips.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "LAYOUTS", "Normalize"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
LAYOUTS = ("NCHW", "NTCHW", "NCTHW")
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class Normalize:
    """Normalize uint8 batches: ``(x - mean*255) / (std*255)`` in float32, cast to ``dtype``.

    Args:
        mean: per-channel means on the 0..1 scale (ImageNet's by default).
        std: per-channel standard deviations on the 0..1 scale, all > 0.
        dtype: float32, float16 or bfloat16.
        channels_last: return images in ``channels_last`` (clips ``N C T H W`` in
            ``channels_last_3d``; ``N T C H W`` clips with the channel innermost).
        layout: ``"NTCHW"`` or ``"NCTHW"`` for clips; ``None`` tells them apart by which
            dimension has ``len(mean)`` entries (an error when both do).
    """

    def __init__(self, mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD,
                 *, dtype: torch.dtype = torch.float32, channels_last: bool = False,
                 layout: str | None = None):
        mean, std = tuple(float(m) for m in mean), tuple(float(s) for s in std)
        if not mean or len(mean) != len(std):
            raise ValueError(f"mean and std need one value per channel, got {len(mean)} and {len(std)}")
        if not all(math.isfinite(m) for m in mean) or not all(math.isfinite(s) and s > 0 for s in std):
            raise ValueError(f"mean must be finite and std finite and > 0, got mean={mean} std={std}")
        if dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of float32, float16, bfloat16, not {dtype}")
        if layout is not None and layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS} or None, not {layout!r}")
        self.mean, self.std, self.dtype = mean, std, dtype
        self.channels_last, self.layout = channels_last, layout
        # The constants are float32 products, as the reference formula computes them.
        self._mean255 = torch.tensor(mean, dtype=torch.float32) * 255
        self._std255 = torch.tensor(std, dtype=torch.float32) * 255
        self._on: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    @property
    def channels(self) -> int:
        return len(self.mean)

    def __repr__(self) -> str:
        return (f"Normalize(mean={self.mean}, std={self.std}, dtype={self.dtype}, "
                f"channels_last={self.channels_last}, layout={self.layout})")

    def constants(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """mean*255 and std*255 on ``device`` (copied there once)."""
        if device not in self._on:
            self._on[device] = (self._mean255.to(device), self._std255.to(device))
        return self._on[device]

    def channel_dim(self, shape: Sequence[int]) -> int:
        """Which dimension of a batch of ``shape`` holds the channels (ValueError if none fits)."""
        c = self.channels
        if len(shape) == 4:
            if shape[1] != c:
                raise ValueError(f"expected images N x {c} x H x W (channels first, as uint8_collate "
                                 f"makes them), got shape {tuple(shape)}")
            return 1
        if len(shape) != 5:
            raise ValueError(f"expected a batch of images (4 dims) or clips (5 dims), got shape {tuple(shape)}")
        layout = self.layout
        if layout is None:
            t_first, c_first = shape[2] == c, shape[1] == c
            if t_first and c_first:
                raise ValueError(f"clip batch {tuple(shape)} is ambiguous: pass layout='NTCHW' or 'NCTHW'")
            if not (t_first or c_first):
                raise ValueError(f"clip batch {tuple(shape)} has no dimension of {c} channels "
                                 f"(expected N x T x {c} x H x W or N x {c} x T x H x W)")
            layout = "NTCHW" if t_first else "NCTHW"
        cdim = 2 if layout == "NTCHW" else 1
        if shape[cdim] != c:
            raise ValueError(f"clip batch {tuple(shape)} does not match layout {layout} with {c} channels")
        return cdim

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """Normalize one uint8 batch on its own device."""
        if x.dtype != torch.uint8:
            raise ValueError(f"expected a uint8 batch, got {x.dtype} (collate with uint8_collate)")
        cdim = self.channel_dim(x.shape)
        view = [1] * x.dim()
        view[cdim] = self.channels
        mean, std = self.constants(x.device)
        y = x.to(torch.float32).sub_(mean.view(view)).div_(std.view(view))
        if self.dtype != torch.float32:
            y = y.to(self.dtype)
        if self.channels_last:
            y = _channels_last(y, cdim)
        return y


def _channels_last(y: torch.Tensor, cdim: int) -> torch.Tensor:
    if y.dim() == 4:
        return y.contiguous(memory_format=torch.channels_last)
    if cdim == 1:
        return y.contiguous(memory_format=torch.channels_last_3d)
    # N T C H W: same shape, channel stride 1 (the per-frame channels_last layout).
    return y.permute(0, 1, 3, 4, 2).contiguous().permute(0, 1, 4, 2, 3)

"""The normalization reference the prefetcher and device-cache tests compare against."""
from __future__ import annotations

import numpy as np
import torch

__all__ = ["MEAN", "STD", "reference"]

MEAN = (0.5, 0.25, 0.75)
STD = (0.2, 0.3, 0.125)


def reference(x: torch.Tensor, mean, std, cdim: int) -> torch.Tensor:
    """Independent float32 reference in numpy: (x - mean*255) / (std*255)."""
    shape = [1] * x.dim()
    shape[cdim] = len(mean)
    m = (np.asarray(mean, dtype=np.float32) * np.float32(255)).reshape(shape)
    s = (np.asarray(std, dtype=np.float32) * np.float32(255)).reshape(shape)
    return torch.from_numpy((x.numpy().astype(np.float32) - m) / s)

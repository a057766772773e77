"""Batch buffers for ``packer.Loader``: uint8 images copied into reused buffers without torch ops.

``as_image`` views an image or clip channels-first as numpy (no copy); ``copy_into`` writes it
into a batch slot (OpenCV's SIMD channel split for channels-last sources; both release the
GIL; torch's ``copy_`` is avoided: its intra-op threads fight the loader's and it is several
times slower for uint8 transposes). ``BufferPool`` hands out batch buffers and takes one back
only once nothing outside the pool references it (PyTorch's storage use count), which is what
lets a caller hold a yielded batch for as long as it likes.
"""
from __future__ import annotations

import threading
from typing import Any

import numpy as np
import torch
from PIL import Image

try:  # OpenCV is a core dependency; guarded only so that a broken install degrades to numpy
    import cv2
except ImportError:  # pragma: no cover
    cv2 = None

__all__ = ["as_image", "copy_into", "BufferPool"]


# -- images: channels-first numpy views, copied without torch ops ---------------------------------
def as_image(x: Any) -> np.ndarray | None:
    """A channels-first uint8 numpy view (no copy) of an image or clip, or None when ``x`` is not
    one; the same convention as ``uint8_collate``: tensors are channels-first already (C x H x W,
    T x C x H x W), arrays and PIL images channels-last (H x W x C, T x H x W x C)."""
    if isinstance(x, torch.Tensor):
        return x.numpy() if x.dtype == torch.uint8 and x.device.type == "cpu" and x.dim() >= 2 else None
    if isinstance(x, Image.Image):
        x = np.asarray(x)
        if x.ndim == 2:
            x = x[:, :, None]
    if isinstance(x, np.ndarray) and x.dtype == np.uint8 and x.ndim in (3, 4):
        return x.transpose(2, 0, 1) if x.ndim == 3 else x.transpose(0, 3, 1, 2)
    return None


def copy_into(dst: np.ndarray, src: np.ndarray) -> None:
    """``dst[...] = src`` for channels-first uint8, fast for channels-last sources: OpenCV's SIMD
    channel split (numpy's strided copy is ~8x slower; torch's ``copy_`` here is slower still and
    its intra-op threads fight the loader's). Both release the GIL."""
    if src.flags.c_contiguous or cv2 is None:
        np.copyto(dst, src)
        return
    frames = [(dst, src)] if src.ndim == 3 else list(zip(dst, src))
    for d, s in frames:
        hwc = s.transpose(1, 2, 0)
        if hwc.flags.c_contiguous and 1 < hwc.shape[2] <= 4:
            cv2.split(hwc, [d[c] for c in range(hwc.shape[2])])
        else:
            np.copyto(d, s)


# -- buffers --------------------------------------------------------------------------------------
def _storage_uses(t: torch.Tensor) -> int:
    return torch._C._storage_Use_Count(t.untyped_storage()._cdata)


_CAN_COUNT = hasattr(torch._C, "_storage_Use_Count")


class BufferPool:
    """uint8 batch buffers, reused once nothing outside the pool references them.

    ``acquire`` marks a buffer busy (being filled); ``release`` clears that when the batch is
    handed over as a view, whose references then keep the buffer from reuse. Pinned buffers are
    not pooled: PyTorch's pinned caching allocator recycles them safely (see the module doc).
    """

    def __init__(self, *, pin: bool, keep: int):
        self.pin = pin
        self.keep = keep
        self._lock = threading.Lock()
        self._free_uses: dict[int, int] = {}  # id(buffer) -> use count when only the pool holds it
        self._busy: set[int] = set()
        self._buffers: list[torch.Tensor] = []
        self.allocated = 0  # buffers created (tests and the bench read it)

    def acquire(self, shape: tuple[int, ...]) -> torch.Tensor:
        if self.pin or not _CAN_COUNT:
            self.allocated += 1
            return torch.empty(shape, dtype=torch.uint8, pin_memory=self.pin)
        with self._lock:
            for b in self._buffers:
                if (tuple(b.shape) == shape and id(b) not in self._busy
                        and _storage_uses(b) <= self._free_uses[id(b)]):
                    self._busy.add(id(b))
                    return b
            b = torch.empty(shape, dtype=torch.uint8)
            self._free_uses[id(b)] = _storage_uses(b)
            self._busy.add(id(b))
            self._buffers.append(b)
            self.allocated += 1
            if len(self._buffers) > self.keep:  # forget the oldest idle one (a user may still hold it)
                for j, old in enumerate(self._buffers):  # (by position: == on tensors is elementwise)
                    if id(old) not in self._busy:
                        del self._buffers[j]
                        del self._free_uses[id(old)]
                        break
            return b

    def release(self, b: torch.Tensor) -> None:
        with self._lock:
            self._busy.discard(id(b))

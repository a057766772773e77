"""The training crop: RandomResizedCrop + horizontal flip, chosen from the header, decoded in the box.

``DecodeRandomResizedCrop(224)`` gives what torchvision's ``RandomResizedCrop(224)`` followed by
``RandomHorizontalFlip(0.5)`` gives, as a 3x224x224 uint8 tensor, doing the work FFCV-style
inside the decode (``packer.data.boxdecode``): the box is chosen from the JPEG header size,
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
"""
from __future__ import annotations

import math
import os
import threading
from typing import Any, Optional, Sequence

import numpy as np
import torch
from PIL import Image

from packer.codecs.image import decode_pil, to_chw
from packer.data.boxdecode import Box, decode_box
from packer.data.resample import to_chw3

__all__ = ["sample_box", "DecodeRandomResizedCrop", "PilRandomResizedCrop"]


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
        rng = rng if rng is not None else self.generator()
        out = decode_box(data, lambda h, w: self.sample(h, w, rng), *self.size)
        return torch.from_numpy(to_chw3(out))


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

"""Small datasets held whole on the device: decode once, serve shuffled batches by indexing.

``DeviceCache.build(dataset, ...)`` (also ``DevicePrefetcher.cache``) decodes every sample
once into one ``N x ...`` uint8 tensor on the device (GPU memory with CUDA, host memory
without), and each epoch draws a permutation on that device and gathers + normalizes batches
there: no per-epoch CPU work, no DataLoader workers. For datasets whose decoded size fits,
``cache_bytes`` and ``free_memory`` tell (``packer bench`` reports both).
"""
from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any, Iterator, Sequence

import torch
from torch.utils.data import DataLoader
from tqdm import tqdm

from packer.errors import UsageError
from packer.data.normalize import IMAGENET_MEAN, IMAGENET_STD, Normalize
from packer.data.prefetch import resolve_device, uint8_collate

__all__ = ["DeviceCache", "CacheBatches", "cache_bytes", "free_memory"]

log = logging.getLogger(__name__)


def cache_bytes(count: int, sample_shape: Sequence[int]) -> int:
    """Bytes a cache of ``count`` uint8 samples of ``sample_shape`` takes (plus int64 labels)."""
    n = 1
    for d in sample_shape:
        n *= int(d)
    return count * (n + 8)


def free_memory(device: str | torch.device | None = None) -> int | None:
    """Free bytes on ``device``: CUDA's free memory, or the host's MemAvailable (None if unknown)."""
    device = resolve_device(device)
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


@dataclasses.dataclass(frozen=True)
class CacheBatches:
    """How a ``DeviceCache`` serves its samples: batch size and the per-epoch order."""

    batch_size: int = 256
    shuffle: bool = True
    drop_last: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")


class DeviceCache:
    """Every sample of a dataset as one uint8 tensor on a device, served in shuffled batches.

    Iterating yields ``(images, labels)`` with images normalized like ``DevicePrefetcher``
    does. Each iteration is one epoch; the permutation depends on ``seed`` and the epoch,
    which advances after every full pass (or is set with ``set_epoch``).
    Build it with ``DeviceCache.build`` (or ``DevicePrefetcher.cache``).
    """

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, normalize: Normalize, *,
                 batch_size: int = 256, shuffle: bool = True, drop_last: bool = False, seed: int = 0):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if images.dtype != torch.uint8 or images.shape[0] != labels.shape[0]:
            raise ValueError("images must be a uint8 tensor with one row per label")
        self.images, self.labels, self.normalize = images, labels, normalize
        self.batch_size, self.shuffle, self.drop_last, self.seed = batch_size, shuffle, drop_last, seed
        self.epoch = 0

    @classmethod
    def build(cls, dataset: Any, mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD,
              *, batches: CacheBatches | None = None, device: str | torch.device | None = None,
              dtype: torch.dtype = torch.float32, channels_last: bool = False, layout: str | None = None,
              num_workers: int = 0, progress: bool = True, **batch_fields: Any) -> "DeviceCache":
        """Decode ``dataset`` (``(image, label)`` samples of one shape) into a cache on ``device``.

        ``batches`` (a ``CacheBatches``: ``batch_size``, ``shuffle``, ``drop_last``, ``seed``)
        says how the cache is served; its fields may also be given as keywords. ``mean``,
        ``std``, ``dtype``, ``channels_last`` and ``layout`` are ``Normalize``'s. Decoding runs
        once through a DataLoader with ``num_workers`` workers. Raises ``UsageError`` when the
        cache would not fit in the device's free memory and ValueError when samples differ in shape.
        """
        normalize = Normalize(mean, std, dtype=dtype, channels_last=channels_last, layout=layout)
        batches = (dataclasses.replace(batches, **batch_fields) if batches is not None
                   else CacheBatches(**batch_fields))
        device = resolve_device(device)
        n = len(dataset)
        if n == 0:
            raise ValueError("cannot cache an empty dataset")
        loader = DataLoader(dataset, batch_size=256, shuffle=False, num_workers=num_workers,
                            collate_fn=uint8_collate)
        images = labels = None
        pos = 0
        with tqdm(total=n, desc="cache", unit="sample", disable=None if progress else True) as bar:
            for batch in loader:
                if not isinstance(batch, (tuple, list)) or len(batch) < 2:
                    raise ValueError("DeviceCache needs (image, label) samples")
                x, y = batch[0], torch.as_tensor(batch[1])
                if not isinstance(x, torch.Tensor) or x.dtype != torch.uint8:
                    raise ValueError("DeviceCache needs uint8 images (decode to tensor/numpy/PIL)")
                if images is None:
                    need, free = cache_bytes(n, x.shape[1:]), free_memory(device)
                    if free is not None and need > free:
                        raise UsageError(f"cache of {n} samples of {tuple(x.shape[1:])} needs "
                                         f"{need / 2**30:.2f} GiB, {device} has {free / 2**30:.2f} GiB free")
                    images = torch.empty((n, *x.shape[1:]), dtype=torch.uint8, device=device)
                    labels = torch.empty((n,), dtype=y.dtype, device=device)
                if x.shape[1:] != images.shape[1:]:
                    raise ValueError(f"samples differ in shape: {tuple(images.shape[1:])} and "
                                     f"{tuple(x.shape[1:])}; resize them to one size to cache")
                images[pos:pos + len(x)].copy_(x)
                labels[pos:pos + len(x)].copy_(y)
                pos += len(x)
                bar.update(len(x))
        log.info("cached %d samples (%.1f MB) on %s", n, images.numel() / 1e6, device)
        return cls(images, labels, normalize, **dataclasses.asdict(batches))

    @property
    def device(self) -> torch.device:
        return self.images.device

    @property
    def nbytes(self) -> int:
        """Bytes held on the device (images + labels)."""
        return self.images.numel() * self.images.element_size() + self.labels.numel() * self.labels.element_size()

    def set_epoch(self, epoch: int) -> None:
        """Use the permutation of ``epoch`` for the next pass."""
        self.epoch = epoch

    def __len__(self) -> int:
        n = self.images.shape[0]
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        n = self.images.shape[0]
        if self.shuffle:
            g = torch.Generator(device=self.device)
            g.manual_seed(self.seed * 1_000_003 + self.epoch)
            order = torch.randperm(n, generator=g, device=self.device)
        else:
            order = torch.arange(n, device=self.device)
        stop = n - n % self.batch_size if self.drop_last else n
        for start in range(0, stop, self.batch_size):
            idx = order[start:start + self.batch_size]
            yield self.normalize(self.images.index_select(0, idx)), self.labels.index_select(0, idx)
        self.epoch += 1

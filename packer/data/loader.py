"""``Loader``: a thread-based loader for any packer dataset, decoding straight into uint8 batches.

JPEG decode, resize and memory copies release the GIL, so a few threads in the training
process do what DataLoader worker processes do without pickling each batch and copying it
through shared memory. The order is the DataLoader's / ``DistributedSampler``'s contract:
a seeded permutation per epoch, split across ranks with the same number of batches on every
rank (``packer.data.streaming.split_by_rank``).

Buffer contract: image fields are written by the threads straight into a preallocated
``N x C x H x W`` (or ``N x T x C x H x W``) uint8 buffer. A buffer is refilled only when
nothing outside the loader references it any more: the yielded batch, any view or slice of
it, a numpy array over it. You may hold a batch as long as you like; it is never overwritten
under you, and buffers you have let go are reused (so steady-state training allocates
nothing). With CUDA the buffers are pinned and come from PyTorch's pinned-memory caching
allocator, which recycles a block only after the non_blocking copies that read it finished.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import os
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np
import torch

from packer.errors import UsageError
from packer.data.batchbuf import BufferPool
from packer.data.loader_epoch import Epoch, LoaderError
from packer.data.streaming import resolve_rank, split_by_rank

__all__ = ["Loader", "LoaderOptions", "LoaderError", "epoch_indices"]

log = logging.getLogger(__name__)


def epoch_indices(n: int, *, shuffle: bool, seed: int, epoch: int, rank: int, world_size: int,
                  drop_last: bool) -> np.ndarray:
    """This rank's sample indices for ``epoch``: a seeded permutation (or ``0..n-1``), split by rank."""
    order = (np.random.default_rng(np.random.SeedSequence([seed, epoch])).permutation(n) if shuffle
             else np.arange(n, dtype=np.int64))
    return split_by_rank(order, rank=rank, world_size=world_size, drop_last=drop_last)


@dataclass(frozen=True)
class LoaderOptions:
    """How a ``Loader`` orders and fetches (its keywords; see ``Loader``).

    Args:
        batch_size: samples per batch.
        shuffle: a seeded permutation per epoch.
        seed: the permutation's seed (the same on every rank).
        num_threads: loader threads (None: the CPUs this process may use, at most 8).
        drop_last: drop the uneven tail (across ranks, then the last partial batch).
        prefetch: batches loaded ahead of the one being consumed.
        chunk: samples per thread task (None: batch / (2 x threads)).
        pin_memory: pinned buffers (None: when CUDA is available).
        rank, world_size: override ``torch.distributed`` (or ``RANK``/``WORLD_SIZE``).
    """

    batch_size: int
    shuffle: bool = False
    seed: int = 0
    num_threads: int | None = None
    drop_last: bool = False
    prefetch: int = 2
    chunk: int | None = None
    pin_memory: bool | None = None
    rank: int | None = None
    world_size: int | None = None

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise UsageError(f"batch_size must be >= 1, not {self.batch_size}")
        if ((self.num_threads is not None and self.num_threads < 1) or self.prefetch < 0
                or (self.chunk is not None and self.chunk < 1)):
            raise UsageError("num_threads and chunk must be >= 1, prefetch >= 0")


class Loader:
    """Batches from any packer dataset, loaded by threads in this process.

    Args:
        dataset: any map-style dataset (``PackedDataset``, ``FrameDataset``,
            ``PackedVideoDataset``, your own); samples are tuples/lists/dicts or one image.
        options: a ``LoaderOptions``; its fields may also be given as keywords (below), which
            override its own.
        batch_size: samples per batch.
        shuffle: a seeded permutation per epoch (the epoch from ``set_epoch``; without it the
            epochs of successive passes are 0, 1, 2, ...).
        seed: the permutation's seed (the same on every rank).
        num_threads: loader threads (default: the CPUs this process may use, at most 8).
        drop_last: drop the uneven tail (across ranks, then the last partial batch).
        sampler: an iterable of indices instead (then no shuffle and no rank split here: a
            ``DistributedSampler`` does its own); ``set_epoch`` reaches it.
        collate: ``None`` (default): image fields (uint8 tensors/arrays, PIL images) go straight
            into reused uint8 batch buffers, other fields through ``default_collate`` (the
            output equals ``uint8_collate``'s). A callable: called with the list of samples.
        prefetch: batches loaded ahead of the one being consumed.
        chunk: samples per thread task (``__getitems__`` batch); default batch / (2 x threads).
        pin_memory: pinned buffers (default: when CUDA is available).
        rank, world_size: override ``torch.distributed`` (or ``RANK``/``WORLD_SIZE``).

    Every rank gets ``len(loader)`` batches per epoch. Threads help only where the per-sample
    work releases the GIL (packer's decoders, OpenCV, numpy/torch copies); a Python-heavy
    transform serializes them: ``packer bench`` measures this and says when to use the
    DataLoader instead.
    """

    def __init__(self, dataset: Any, options: LoaderOptions | None = None, *, sampler: Any = None,
                 collate: Callable[[list], Any] | None = None, **option_fields: Any):
        opts = dataclasses.replace(options, **option_fields) if options is not None else LoaderOptions(**option_fields)
        if sampler is not None and opts.shuffle:
            raise UsageError("give shuffle or a sampler, not both (the sampler decides the order)")
        num_threads = opts.num_threads
        if num_threads is None:
            num_threads = min(8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
        self.options = opts
        self.dataset = dataset
        self.batch_size = int(opts.batch_size)
        self.shuffle = opts.shuffle
        self.seed = int(opts.seed)
        self.num_threads = int(num_threads)
        self.drop_last = opts.drop_last
        self.sampler = sampler
        self.collate = collate
        self.prefetch = int(opts.prefetch)
        self.chunk = int(opts.chunk) if opts.chunk else max(1, math.ceil(self.batch_size / (2 * self.num_threads)))
        pin_memory = opts.pin_memory
        if pin_memory is None:
            pin_memory = torch.cuda.is_available()
        self.pool = BufferPool(pin=bool(pin_memory), keep=self.prefetch + 4)
        self.rank, self.world_size = (0, 1) if sampler is not None else resolve_rank(opts.rank, opts.world_size)
        self._epoch: int | None = None
        self._next_epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch``'s order for the next pass (reaches the sampler and the dataset too)."""
        self._epoch = int(epoch)
        for obj in (self.sampler, self.dataset):
            if hasattr(obj, "set_epoch"):
                obj.set_epoch(int(epoch))

    def _samples(self) -> int:
        if self.sampler is not None:
            return len(self.sampler)
        n = len(self.dataset)
        return n // self.world_size if self.drop_last else math.ceil(n / self.world_size)

    def __len__(self) -> int:
        n = self._samples()
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def indices(self, epoch: int | None = None) -> np.ndarray:
        """This rank's sample indices of ``epoch`` in order (default: the next pass's)."""
        if self.sampler is not None:
            return np.fromiter((int(i) for i in self.sampler), dtype=np.int64)
        if epoch is None:
            epoch = self._epoch if self._epoch is not None else self._next_epoch
        return epoch_indices(len(self.dataset), shuffle=self.shuffle, seed=self.seed, epoch=epoch,
                             rank=self.rank, world_size=self.world_size, drop_last=self.drop_last)

    def __iter__(self) -> Iterator[Any]:
        epoch = self._epoch if self._epoch is not None else self._next_epoch
        indices = self.indices(epoch)
        self._next_epoch, self._epoch = epoch + 1, None
        return Epoch(self, indices).run()

    def _where(self, index: int) -> str:
        keys = getattr(self.dataset, "keys", None)
        try:
            key = keys[index] if keys is not None else None
        except Exception:  # noqa: BLE001 - the key is only a hint for the message
            key = None
        where = f" ({key!r})" if key is not None else ""
        path = getattr(self.dataset, "path", None)
        return f"{where} of {path}" if path else where

    def __repr__(self) -> str:
        return (f"Loader({type(self.dataset).__name__}, batch_size={self.batch_size}, shuffle={self.shuffle}, "
                f"num_threads={self.num_threads}, rank={self.rank}/{self.world_size})")

"""``MultigridBatchSampler``: batches of ``ClipRequest`` shaped by a ``MultigridSchedule``."""
from __future__ import annotations

import math
import random
from typing import Any, Iterable, Iterator, Optional, Union

import torch
from torch.utils.data import Dataset, Sampler

from packer.data.multigrid.schedule import MultigridSchedule, count_batches
from packer.data.video import ClipRequest

__all__ = ["MultigridBatchSampler"]


def _dist_default(value: Optional[int], what: str) -> int:
    """``num_replicas`` / ``rank`` from torch.distributed when it is initialised, else 1 / 0."""
    if value is not None:
        return value
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size() if what == "num_replicas" else torch.distributed.get_rank()
    return 1 if what == "num_replicas" else 0


class MultigridBatchSampler(Sampler):
    """Batches of ``ClipRequest`` whose size, frame count and crop follow a ``MultigridSchedule``.

    Each batch is a list of ``ClipRequest(index, num_frames, frame_interval, crop_size, epoch)``;
    the stage of the current epoch gives ``num_frames`` and ``frame_interval``, and the short
    cycle gives batch size and crop, iteration by iteration (batch ``k`` uses short-cycle
    phase ``k % len(phases)``, counting from 0 every epoch, as SlowFast's
    ``ShortCycleBatchSampler`` does). Use it as ``DataLoader(dataset, batch_sampler=...)``
    over a dataset that honours ``ClipRequest`` keys, and call ``set_epoch`` before each epoch.

    Args:
        source: the dataset length, or a sampler of indices to batch (e.g. a
            ``DistributedSampler``, whose ``set_epoch`` is called along).
        schedule: the ``MultigridSchedule``.
        epoch: the first epoch (``set_epoch`` changes it).
        shuffle: shuffle the indices each epoch (only with a length; a sampler orders itself).
        seed: shuffle seed, the same on every process (and the seed of ``jitter_interval``).
        num_replicas: number of processes (default: the torch.distributed world size, or 1).
        rank: this process (default: the torch.distributed rank, or 0).
        drop_last: drop the last, incomplete batch of each epoch (recommended with
            ``SubBatchNorm3d``, whose batches must split evenly).
        jitter_interval: draw each clip's frame interval uniformly from
            ``[sampling_rate, stage sampling_rate]`` (SlowFast's ``get_random_sampling_rate``),
            instead of always using the stage's (the default: a clip spans the same time
            whatever its frame count).

    Rank splitting is ``DistributedSampler``'s (drop_last=False): the epoch's permutation
    (``torch.randperm`` seeded with ``seed + epoch``) is padded by repeating its start to a
    multiple of ``num_replicas`` and process ``rank`` takes every ``num_replicas``-th index
    from ``rank``, so every process yields the same number of batches of the same shapes.
    Batch sizes are per process.
    """

    def __init__(self, source: Union[int, Iterable[int]], schedule: MultigridSchedule, *,
                 epoch: int = 0, shuffle: Optional[bool] = None, seed: int = 0,
                 num_replicas: Optional[int] = None, rank: Optional[int] = None,
                 drop_last: bool = False, jitter_interval: bool = False):
        if not isinstance(schedule, MultigridSchedule):
            raise ValueError(f"schedule must be a MultigridSchedule, not {type(schedule).__name__}")
        if isinstance(source, bool) or isinstance(source, Dataset):
            raise ValueError("source must be the dataset length or a sampler of indices; "
                             "for a dataset pass len(dataset)")
        if isinstance(source, int):
            if source < 0:
                raise ValueError(f"dataset length must be >= 0, not {source}")
            self.sampler = None
            self.num_samples_total = source
            self.shuffle = True if shuffle is None else bool(shuffle)
            self.num_replicas = _dist_default(num_replicas, "num_replicas")
            self.rank = _dist_default(rank, "rank")
            if self.num_replicas < 1 or not 0 <= self.rank < self.num_replicas:
                raise ValueError(f"rank must be in [0, num_replicas), not rank={self.rank}, "
                                 f"num_replicas={self.num_replicas}")
        else:
            if not hasattr(source, "__iter__") or not hasattr(source, "__len__"):
                raise ValueError(f"source must be an int or a sampler with __iter__ and __len__, "
                                 f"not {type(source).__name__}")
            if shuffle is not None or num_replicas is not None or rank is not None:
                raise ValueError("shuffle, num_replicas and rank belong to the wrapped sampler "
                                 "(e.g. DistributedSampler(dataset, num_replicas=..., rank=..., shuffle=...))")
            self.sampler = source
            self.num_samples_total = len(source)
            self.shuffle = bool(getattr(source, "shuffle", False))
            self.num_replicas = int(getattr(source, "num_replicas", 1))
            self.rank = int(getattr(source, "rank", 0))
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"epoch must be an integer >= 0, not {epoch!r}")
        self.schedule = schedule
        self.seed = int(seed)
        self.drop_last = bool(drop_last)
        self.jitter_interval = bool(jitter_interval)
        self.epoch = 0
        self.set_epoch(epoch)

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch: its stage (shapes) and its shuffle."""
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, not {epoch}")
        self.epoch = int(epoch)
        if self.sampler is not None and hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(self.epoch)

    @property
    def stage(self) -> dict[str, Any]:
        """The schedule stage of the current epoch."""
        return self.schedule.at(self.epoch)

    def _indices(self) -> list[int]:
        """This process's indices for the current epoch, in order."""
        if self.sampler is not None:
            return [int(i) for i in self.sampler]
        n = self.num_samples_total
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            order = torch.randperm(n, generator=g).tolist()
        else:
            order = list(range(n))
        per_rank = math.ceil(n / self.num_replicas)
        padding = per_rank * self.num_replicas - n
        if padding and order:
            order += (order * math.ceil(padding / n))[:padding]
        return order[self.rank::self.num_replicas]

    def _per_rank(self) -> int:
        return self.num_samples_total if self.sampler is not None \
            else math.ceil(self.num_samples_total / self.num_replicas)

    def __iter__(self) -> Iterator[list[ClipRequest]]:
        stage = self.stage
        phases = stage["short_cycle"]
        frames, interval = stage["num_frames"], stage["sampling_rate"]
        low = self.schedule.sampling_rate
        rng = random.Random(f"{self.seed}:{self.epoch}:{self.rank}") if self.jitter_interval else None
        indices = self._indices()
        pos, k = 0, 0
        while pos < len(indices):
            size, crop = phases[k % len(phases)]
            chunk = indices[pos:pos + size]
            if len(chunk) < size and self.drop_last:
                break
            yield [ClipRequest(i, frames, rng.randint(low, interval) if rng else interval, crop, self.epoch)
                   for i in chunk]
            pos += size
            k += 1

    def __len__(self) -> int:
        return count_batches(self._per_rank(), [b for b, _ in self.stage["short_cycle"]], self.drop_last)

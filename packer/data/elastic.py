"""``DistributedSampler``: torch's ``DistributedSampler`` order for map-style datasets (the video
datasets, ``PackedDataset``, your own) with a ``state_dict`` that resumes mid-epoch on any
number of ranks.

The order is torch's, index for index: ``torch.randperm`` seeded with ``seed + epoch`` (or
``0..n-1``), padded to a multiple of the world size by repeating its start (or cut with
``drop_last``), rank ``r`` taking every ``num_replicas``-th index from ``r``. A resume on the
same world size continues each rank's own order; on another one (elastic) the indices no rank
has read are split again over the new ranks by ``packer.data.streaming.elastic_slots``, the
helper ``StreamingDataset`` and ``Loader`` resume through, and later epochs are a fresh run's.
``MultigridBatchSampler`` orders its indices with this class.
"""
from __future__ import annotations

import math
from typing import Any, Iterator, Optional, Sized, Union

import numpy as np
import torch
from torch.utils.data import Sampler

from packer.data.streaming import elastic_slots, resolve_rank, resume_point
from packer.errors import UsageError

__all__ = ["DistributedSampler", "SAMPLER_KIND"]

SAMPLER_KIND = "packer.data.DistributedSampler"  # the "sampler" entry of its state


def _count(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"{what} must be an integer >= 0, not {value!r}")
    return int(value)


class DistributedSampler(Sampler[int]):
    """This rank's indices of a map-style dataset, epoch by epoch, in torch's ``DistributedSampler``
    order; ``state_dict``/``load_state_dict`` resume mid-epoch, also on another world size.

    Use it as ``DataLoader(dataset, sampler=..., batch_size=B, num_workers=N)`` and call
    ``set_epoch`` before each epoch. The DataLoader draws indices ahead of what the training
    loop has consumed (``prefetch_factor x num_workers`` batches), so ``state_dict`` takes the
    count the loop consumed, e.g. ``(step + 1) * B``.

    Args:
        dataset: the dataset (its ``len``) or its length.
        num_replicas: ranks (default: ``torch.distributed``, else ``WORLD_SIZE``, else 1).
        rank: this rank (default: ``torch.distributed``, else ``RANK``, else 0).
        shuffle: a seeded permutation per epoch (``torch.randperm``, seed ``seed + epoch``).
        seed: the permutation's seed, the same on every rank.
        drop_last: cut the permutation to a multiple of ``num_replicas`` instead of padding it
            by repeating its start (with padding, up to ``num_replicas - 1`` indices are read twice).
    """

    def __init__(self, dataset: Union[Sized, int], *, num_replicas: Optional[int] = None,
                 rank: Optional[int] = None, shuffle: bool = True, seed: int = 0, drop_last: bool = False):
        if isinstance(dataset, (int, np.integer)) and not isinstance(dataset, bool):
            self.count = _count(dataset, "dataset length")
        elif hasattr(dataset, "__len__"):
            self.count = len(dataset)
        else:
            raise ValueError(f"dataset must be a dataset with a length, or the length, not {type(dataset).__name__}")
        self.rank, self.num_replicas = resolve_rank(rank, num_replicas)
        self.shuffle, self.seed, self.drop_last = bool(shuffle), int(seed), bool(drop_last)
        self.epoch = 0
        self._position = 0  # indices of the current epoch's order read before this pass (a resume)
        self._stages: list[tuple[int, int]] = []  # the epoch's earlier (world size, position)

    @property
    def num_samples(self) -> int:
        """Indices per rank of a whole epoch (torch's attribute of the same name)."""
        return self._per_rank(self.count, self.num_replicas)

    @property
    def position(self) -> int:
        """Indices of this rank's order of the epoch read before the next iteration (a resume)."""
        return self._position

    @property
    def resumes(self) -> list[tuple[int, int]]:
        """The epoch's earlier ``(world size, position)`` when it was resumed on other world sizes."""
        return list(self._stages)

    def _per_rank(self, n: int, world: int) -> int:
        return n // world if self.drop_last else math.ceil(n / world)

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch``'s order from the next iteration on (a pending resume of that epoch stays)."""
        epoch = _count(epoch, "epoch")
        if epoch != self.epoch:
            self._position, self._stages = 0, []
        self.epoch = epoch

    def _permutation(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.count, dtype=np.int64)
        g = torch.Generator()
        g.manual_seed(self.seed + epoch)
        return torch.randperm(self.count, generator=g).numpy().astype(np.int64)

    def _first(self, rank: int, world: int) -> np.ndarray:
        """Rank ``rank``'s slots (positions in the permutation) of a fresh epoch on ``world`` ranks."""
        total = self._per_rank(self.count, world) * world
        slots = np.arange(min(total, self.count), dtype=np.int64)
        if total > self.count:  # padding repeats the start, as often as needed
            slots = np.resize(slots, total)
        return slots[rank:total:world]

    def _order(self, epoch: int, stages: list[tuple[int, int]]) -> np.ndarray:
        """This rank's whole order of ``epoch`` after ``stages`` (position 0 of the current stage)."""
        slots = elastic_slots(self._first, self.count, stages, rank=self.rank, world_size=self.num_replicas,
                              drop_last=self.drop_last)
        return self._permutation(epoch)[slots]

    def indices(self) -> list[int]:
        """The indices the next iteration yields (after ``load_state_dict``: the rest of that epoch)."""
        return self._order(self.epoch, self._stages)[self._position:].tolist()

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices())

    def __len__(self) -> int:
        if not self._stages:
            return self.num_samples - self._position
        return len(self._order(self.epoch, self._stages)) - self._position

    def state_dict(self, num_samples: int) -> dict[str, Any]:
        """Where this rank is in the epoch (plain JSON): the epoch, ``position`` (indices of its
        order on ``world_size`` ranks consumed), the epoch's earlier world sizes (``resumes``) and
        what the order depends on. Every rank consumes the same count, so one rank's state
        describes them all: save any one (they differ only in ``rank``).

        Args:
            num_samples: indices the training loop consumed since this iteration began (or since
                ``load_state_dict``), e.g. ``(step + 1) * batch_size``; a count past the end of
                the pass (a short last batch) means the pass is done.
        """
        num_samples = min(_count(num_samples, "num_samples"), len(self))
        return {"sampler": SAMPLER_KIND, "epoch": self.epoch, "position": self._position + num_samples,
                "seed": self.seed, "shuffle": self.shuffle, "drop_last": self.drop_last,
                "world_size": self.num_replicas, "rank": self.rank, "count": self.count,
                "resumes": [list(s) for s in self._stages]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The next iteration yields the rest of ``state``'s epoch (``set_epoch`` with that epoch keeps it).

        On the world size the state was taken on, this rank continues its own order; on another,
        the indices no rank has read yet are split again evenly over the new ranks (each read
        once; padded by repeating the remainder's start, or cut with ``drop_last``); later epochs
        are a fresh run's on this world size. Refused with ``ValueError`` naming why when the
        state is not a ``DistributedSampler``'s or was taken with another seed, shuffle,
        drop_last or dataset length, or its position does not fit.
        """
        if not isinstance(state, dict) or state.get("sampler") != SAMPLER_KIND:
            theirs = state.get("sampler", "a Loader's or StreamingDataset's") if isinstance(state, dict) \
                else type(state).__name__
            raise ValueError(f"cannot resume: the state is {theirs}, not a {SAMPLER_KIND} state")
        missing = [k for k in ("epoch", "position", "world_size", "seed", "shuffle", "drop_last", "count")
                   if k not in state]
        if missing:
            raise ValueError(f"cannot resume: the state lacks {missing}")
        for k in ("seed", "shuffle", "drop_last", "count"):
            if state[k] != getattr(self, k):
                raise ValueError(f"cannot resume: state has {k}={state[k]!r}, this sampler {getattr(self, k)!r}")
        try:
            epoch, position, stages = resume_point(state, self.num_replicas, lambda e, st: len(self._order(e, st)),
                                                   kind=SAMPLER_KIND)
        except UsageError as e:
            raise ValueError(str(e)) from e
        self.epoch, self._position, self._stages = epoch, position, stages

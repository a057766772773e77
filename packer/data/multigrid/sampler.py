"""``MultigridBatchSampler``: batches of ``ClipRequest`` shaped by a ``MultigridSchedule``."""
from __future__ import annotations

import json
import random
from typing import Any, Iterable, Iterator, Optional, Union

import torch
from torch.utils.data import Dataset, Sampler

from packer.data.elastic import DistributedSampler
from packer.data.multigrid.schedule import MultigridSchedule, count_batches
from packer.data.video import ClipRequest

__all__ = ["MultigridBatchSampler", "MULTIGRID_KIND"]

MULTIGRID_KIND = "packer.data.multigrid.MultigridBatchSampler"  # the "sampler" entry of its state
STATE_SHAPES = ("num_frames", "sampling_rate", "short_cycle")  # the stage's shapes a state records


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
    Batch sizes are per process. With a length, the indices come from a
    ``packer.data.DistributedSampler`` (``index_sampler``), which makes ``state_dict`` /
    ``load_state_dict`` resume mid-epoch on any world size with the short cycle where it was;
    a wrapped sampler resumes only if it is one.
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
            self.index_sampler: Optional[DistributedSampler] = DistributedSampler(
                source, num_replicas=self.num_replicas, rank=self.rank, shuffle=self.shuffle, seed=seed)
        else:
            if not hasattr(source, "__iter__") or not hasattr(source, "__len__"):
                raise ValueError(f"source must be an int or a sampler with __iter__ and __len__, "
                                 f"not {type(source).__name__}")
            if shuffle is not None or num_replicas is not None or rank is not None:
                raise ValueError("shuffle, num_replicas and rank belong to the wrapped sampler "
                                 "(e.g. DistributedSampler(dataset, num_replicas=..., rank=..., shuffle=...))")
            self.sampler = source
            self.index_sampler = source if isinstance(source, DistributedSampler) else None
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
        self._batches = 0  # batches of the current epoch read before this pass (a resume)
        self.set_epoch(epoch)

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch: its stage (shapes) and its shuffle (a pending resume of it stays)."""
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, not {epoch}")
        if int(epoch) != self.epoch:
            self._batches = 0
        self.epoch = int(epoch)
        source = self.sampler if self.sampler is not None else self.index_sampler
        if hasattr(source, "set_epoch"):
            source.set_epoch(self.epoch)

    @property
    def stage(self) -> dict[str, Any]:
        """The schedule stage of the current epoch."""
        return self.schedule.at(self.epoch)

    def _indices(self) -> list[int]:
        """This process's indices for the current epoch (after a resume: the rest), in order."""
        if self.sampler is not None:
            return [int(i) for i in self.sampler]
        return self.index_sampler.indices()

    def _phases(self) -> list[tuple[int, int]]:
        """The short cycle's ``(batch size, crop)`` from this pass's first batch on."""
        phases = [tuple(p) for p in self.stage["short_cycle"]]
        k = self._batches % len(phases)
        return phases[k:] + phases[:k]

    def __iter__(self) -> Iterator[list[ClipRequest]]:
        stage = self.stage
        phases = self._phases()
        frames, interval = stage["num_frames"], stage["sampling_rate"]
        low = self.schedule.sampling_rate
        rng = self._jitter_rng() if self.jitter_interval else None
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

    def _jitter_rng(self) -> random.Random:
        """The frame-interval draws of this rank from this pass on: a fresh epoch's stream (one
        per elastic stage), advanced past the clips read before the resume."""
        source = self.index_sampler
        stages = len(source.resumes) if source is not None else 0
        rng = random.Random(f"{self.seed}:{self.epoch}:{self.rank}" + (f":{stages}" if stages else ""))
        low, high = self.schedule.sampling_rate, self.stage["sampling_rate"]
        for _ in range(source.position if source is not None else 0):
            rng.randint(low, high)
        return rng

    def __len__(self) -> int:
        return count_batches(len(self.sampler if self.sampler is not None else self.index_sampler),
                             [b for b, _ in self._phases()], self.drop_last)

    def state_dict(self, num_batches: int) -> dict[str, Any]:
        """Where this rank is in the epoch (plain JSON): batches read (the short-cycle phase to
        resume at), the index sampler's state (``packer.data.DistributedSampler.state_dict``)
        and the stage's shapes. Every rank reads the same batches, so one rank's state
        describes them all: save any one (they differ only in ``rank``).

        Args:
            num_batches: batches the training loop consumed since this iteration began (or
                since ``load_state_dict``); the DataLoader fetches ahead, so count them there. A
                count past the pass's batches means the pass is done, as with
                ``DistributedSampler.state_dict``; a negative or non-integer one is refused.
        """
        if self.index_sampler is None:
            raise ValueError(f"cannot save: the wrapped {type(self.sampler).__name__} has no resumable "
                             "order; wrap a packer.data.DistributedSampler, or give the dataset length")
        if isinstance(num_batches, bool) or not isinstance(num_batches, int) or num_batches < 0:
            raise ValueError(f"num_batches must be an integer >= 0 (batches consumed), not {num_batches!r}")
        num_batches = min(num_batches, len(self))
        samples = sum(size for size, _ in (self._phases() * (num_batches // len(self._phases()) + 1))[:num_batches])
        return {"sampler": MULTIGRID_KIND, "epoch": self.epoch, "batches": self._batches + num_batches,
                "indices": self.index_sampler.state_dict(samples), "drop_last": self.drop_last,
                "jitter_interval": self.jitter_interval,
                "stage": self._shapes(self.epoch)}

    def _shapes(self, epoch: int) -> dict[str, Any]:
        """The shapes of ``epoch``'s stage a state records, as plain JSON."""
        stage = self.schedule.at(epoch)
        return json.loads(json.dumps({k: stage[k] for k in STATE_SHAPES}))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The next iteration yields the rest of ``state``'s epoch, its short cycle continuing at
        the phase where it stopped (``set_epoch`` with that epoch keeps it). On another world
        size the indices nobody read are split again evenly (``DistributedSampler.load_state_dict``),
        so every rank still reads the same batches. Refused with ``ValueError`` naming why when
        the state is not a ``MultigridBatchSampler``'s or its epoch's shapes, ``drop_last``,
        ``jitter_interval`` or index order differ."""
        if self.index_sampler is None:
            raise ValueError(f"cannot resume: the wrapped {type(self.sampler).__name__} has no resumable "
                             "order; wrap a packer.data.DistributedSampler, or give the dataset length")
        if not isinstance(state, dict) or state.get("sampler") != MULTIGRID_KIND:
            theirs = state.get("sampler", "a Loader's or StreamingDataset's") if isinstance(state, dict) \
                else type(state).__name__
            raise ValueError(f"cannot resume: the state is {theirs}, not a {MULTIGRID_KIND} state")
        for k in ("drop_last", "jitter_interval"):
            if state.get(k) != getattr(self, k):
                raise ValueError(f"cannot resume: state has {k}={state.get(k)!r}, this sampler {getattr(self, k)!r}")
        indices, epoch, batches = state.get("indices"), state.get("epoch"), state.get("batches")
        if not isinstance(indices, dict) or indices.get("epoch") != epoch or not isinstance(batches, int) \
                or isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0 or batches < 0:
            raise ValueError(f"cannot resume: the state's epoch {epoch!r}, batches {batches!r} and index state "
                             "do not agree (a state edited or put together from several)")
        stage = self._shapes(epoch)
        if stage != json.loads(json.dumps(state.get("stage"))):
            raise ValueError(f"cannot resume: the state's epoch {epoch} has shapes {state.get('stage')}, "
                             f"this schedule's {stage}")
        self.index_sampler.load_state_dict(indices)
        self.epoch, self._batches = epoch, batches

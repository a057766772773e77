"""``StreamingDataset``: an iterable over record shards for DDP training, resumable mid-epoch.

An epoch's order is a pure function of (seed, epoch, rank, world size), built from small
pieces that each do one thing:

``epoch_shard_order``  seeded shard permutation for the epoch (identity when not shuffling)
``epoch_stream``       the shards' sample positions concatenated in that order
``split_by_rank``      this rank's contiguous slice of the stream, padded (by repeating the
                       stream's start) or cut so that every rank gets the same count
``block_shuffle``      the default sample shuffle: the rank's slice cut into blocks of a
                       random size in [0.75, 1.25) x ``block_size`` samples, each block
                       permuted (MosaicML Streaming's py1br idea): a block spans several
                       shards, so batches mix classes even when each shard holds few
``shuffle_buffer``     the older streaming buffer (``block_size=None``): only mixes within
                       a window of ``buffer_size`` samples, i.e. within one or two shards
``split_by_worker``    this DataLoader worker's batches of what remains

Both shuffle sample *positions*; records are then read through the shard indexes. The
locality cost of the block shuffle: inside a block, reads jump at random between the block's
shards (``block_size / samples per shard`` of them, all mapped at once) instead of walking
one shard front to back; on local disks with the data in the page cache this costs nothing
measurable (``scripts/bench_loader.py``), on cold storage it means random reads across that
many files: lower ``block_size`` there, or shuffle once at pack time (``--shuffle SEED``).
Because the order is computed, not replayed, ``state_dict()`` is just the epoch and how many
samples of this rank's order were consumed, and ``load_state_dict()`` continues with exactly
the remaining order, whatever the number of DataLoader workers.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import os
import random
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence, TypeVar

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from packer.errors import CorruptData, CorruptSample, UsageError
from packer.data.datasets import PackedDataset
from packer.data.fields import field_collate
from packer.data.sources import distinct_packs, mix_counts, mix_stream, mix_weights, source_picks

__all__ = ["StreamingDataset", "StreamOrder", "epoch_shard_order", "epoch_stream", "split_by_rank", "shuffle_buffer",
           "split_by_worker", "rank_order", "rank_slots", "elastic_slots", "resume_point", "resolve_rank", "block_shuffle",
           "consumed_count", "carried_skips",
           "DEFAULT_BUFFER_SIZE", "DEFAULT_BLOCK_SIZE", "MAX_RESUMES"]

log = logging.getLogger(__name__)

DEFAULT_BUFFER_SIZE = 4096
DEFAULT_BLOCK_SIZE = 1 << 18  # samples per shuffle block (MosaicML Streaming's default too)
MAX_RESUMES = 32  # world-size changes within one epoch (the state lives in a fixed shared tensor)
MAX_WORKERS = 64  # DataLoader workers a skip report has rows for
ON_CORRUPT = ("raise", "skip")
_DAMAGED = object()  # what a skipping read returns for a damaged sample
T = TypeVar("T")


def _rng(seed: int, *parts: int) -> random.Random:
    return random.Random(int(np.random.SeedSequence([seed, *parts]).generate_state(1, np.uint64)[0]))


def epoch_shard_order(num_shards: int, *, seed: int, epoch: int, shuffle: bool) -> list[int]:
    """The shard order of ``epoch``: a seeded permutation, or ``0..num_shards-1`` unshuffled."""
    order = list(range(num_shards))
    if shuffle:
        _rng(seed, epoch, 0).shuffle(order)
    return order


def epoch_stream(counts: Sequence[int], order: Sequence[int]) -> np.ndarray:
    """Global sample positions, shard after shard in ``order`` (``counts`` = samples per shard)."""
    starts = np.concatenate(([0], np.cumsum(counts)[:-1])).astype(np.int64)
    parts = [np.arange(starts[k], starts[k] + counts[k], dtype=np.int64) for k in order]
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def split_by_rank(stream: np.ndarray, *, rank: int, world_size: int, drop_last: bool) -> np.ndarray:
    """Rank ``rank``'s contiguous slice of ``stream``, every rank the same length.

    With ``drop_last`` the tail that does not divide evenly is dropped; otherwise the stream
    is padded by repeating its start, so each sample is seen at least once per epoch (exactly
    once, except the ``world_size - 1`` or fewer padded repeats).
    """
    n = len(stream)
    per_rank = n // world_size if drop_last else math.ceil(n / world_size)
    if not drop_last and per_rank * world_size > n:
        stream = np.concatenate([stream, np.resize(stream, per_rank * world_size - n)])
    return stream[rank * per_rank:(rank + 1) * per_rank]


def shuffle_buffer(items: Iterable[T], size: int, rng: random.Random) -> Iterator[T]:
    """A streaming shuffle: hold ``size`` items, emit a random one as each new item arrives."""
    buf: list[T] = []
    for item in items:
        if len(buf) < size:
            buf.append(item)
            continue
        j = rng.randrange(size)
        yield buf[j]
        buf[j] = item
    rng.shuffle(buf)
    yield from buf


def block_shuffle(items: np.ndarray, block_size: int, rng: np.random.Generator) -> np.ndarray:
    """``items`` cut into consecutive blocks of ``[0.75, 1.25) x block_size`` (random, so block
    edges move between epochs), each block permuted; a new array."""
    out = np.array(items, dtype=np.int64, copy=True)
    lo, hi = max(1, int(0.75 * block_size)), max(2, int(1.25 * block_size))
    start = 0
    while start < len(out):
        stop = min(len(out), start + int(rng.integers(lo, hi)))
        rng.shuffle(out[start:stop])
        start = stop
    return out


def split_by_worker(items: Iterable[T], worker: int, num_workers: int, batch_size: int = 1) -> Iterator[T]:
    """Worker ``worker``'s share: batches ``worker, worker + num_workers, ...`` of ``items``.

    A DataLoader collects batches from its workers round-robin, so with the DataLoader's
    ``batch_size`` the loader's output is ``items`` in their original order.
    """
    for p, item in enumerate(items):
        if (p // batch_size) % num_workers == worker:
            yield item


def rank_order(counts: Sequence[int], *, seed: int, epoch: int, shuffle: bool, buffer_size: int,
               rank: int, world_size: int, drop_last: bool, block_size: int | None = None) -> list[int]:
    """The whole order of sample positions rank ``rank`` reads in ``epoch``: shards in a seeded
    order, this rank's slice, then a block shuffle (``block_size``) or else a shuffle buffer."""
    return rank_order_array(counts, seed=seed, epoch=epoch, shuffle=shuffle, buffer_size=buffer_size,
                            rank=rank, world_size=world_size, drop_last=drop_last,
                            block_size=block_size).tolist()


def rank_order_array(counts: Sequence[int], *, seed: int, epoch: int, shuffle: bool, buffer_size: int,
                     rank: int, world_size: int, drop_last: bool, block_size: int | None = None) -> np.ndarray:
    """``rank_order`` as an int64 array (8 bytes a sample)."""
    order = epoch_shard_order(len(counts), seed=seed, epoch=epoch, shuffle=shuffle)
    stream = epoch_stream(counts, order)
    return stream[rank_slots(len(stream), seed=seed, epoch=epoch, shuffle=shuffle, buffer_size=buffer_size,
                             rank=rank, world_size=world_size, drop_last=drop_last, block_size=block_size)]


def rank_slots(n: int, *, seed: int, epoch: int, shuffle: bool, buffer_size: int, rank: int, world_size: int,
               drop_last: bool, block_size: int | None = None) -> np.ndarray:
    """The *slots* (positions in the epoch's stream of ``n``) rank ``rank`` reads, in order: its
    ``split_by_rank`` slice, then a block shuffle or a shuffle buffer. Both shuffles move items
    by position only, so ``stream[rank_slots(...)]`` is the rank's order of samples."""
    per_rank = n // world_size if drop_last else math.ceil(n / world_size)  # split_by_rank of arange(n)
    mine = np.arange(rank * per_rank, (rank + 1) * per_rank, dtype=np.int64)
    if n and not drop_last and len(mine) and mine[-1] >= n:  # padding repeats the stream's start
        mine %= n
    if shuffle and block_size is not None and block_size > 1:
        sq = np.random.SeedSequence([seed, epoch, 2, rank])
        return block_shuffle(mine, block_size, np.random.default_rng(sq))
    if shuffle and buffer_size > 1:
        return np.fromiter(shuffle_buffer(mine.tolist(), buffer_size, _rng(seed, epoch, 1, rank)),
                           dtype=np.int64, count=len(mine))
    return mine


def elastic_slots(first: Callable[[int, int], np.ndarray], n: int, stages: Sequence[Sequence[int]], *,
                  rank: int, world_size: int, drop_last: bool) -> np.ndarray:
    """Rank ``rank``'s slots of an epoch that was resumed on other world sizes.

    ``first(rank, world)`` gives the epoch's slots per rank as a fresh run would read them;
    ``stages`` is ``[(world, consumed per rank), ...]``: the epoch ran on ``world`` ranks until
    each had read ``consumed`` slots, then resumed on the next stage's world size (the last
    resume on ``world_size``; a count past a rank's share means that stage's pass was done).
    The slots nobody read yet (a slot that padding repeated counts
    once) are kept in the order the previous ranks would have read them, rank after rank, and
    split again with ``split_by_rank``: equal counts per rank, padded by repeating the
    remainder's start or cut with ``drop_last``. With no stages this is ``first(rank, world_size)``.
    """
    if not stages:
        return first(rank, world_size)
    seen = np.zeros(n, dtype=bool)
    remaining = np.zeros(0, np.int64)
    for k, (world, consumed) in enumerate(stages):
        world, consumed = int(world), int(consumed)
        orders = [first(r, world) if k == 0 else
                  split_by_rank(remaining, rank=r, world_size=world, drop_last=drop_last) for r in range(world)]
        if consumed < 0:
            raise UsageError(f"cannot resume: stage {k} consumed {consumed} samples per rank of {world} ranks")
        consumed = min(consumed, len(orders[0]))  # a count past the end of the pass: it is done
        for o in orders:
            seen[o[:consumed]] = True
        rest = np.concatenate([o[consumed:] for o in orders])
        _, first_at = np.unique(rest, return_index=True)
        rest = rest[np.sort(first_at)]
        remaining = rest[~seen[rest]]
    return split_by_rank(remaining, rank=rank, world_size=world_size, drop_last=drop_last)


def consumed_count(value: Any, what: str = "num_samples") -> int:
    """``value`` as a count of samples consumed: an integer >= 0 (not a bool, not a float such
    as ``10.7``, which would silently lose or invent samples), else ``UsageError``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise UsageError(f"{what} must be an integer >= 0 (samples consumed), not {value!r}")
    return int(value)


def resume_point(state: dict[str, Any], world_size: int,
                 remaining: Callable[[int, list[tuple[int, int]]], int],
                 kind: str | None = None) -> tuple[int, int, list[tuple[int, int]]]:
    """(epoch, position, resumes) to continue ``state`` on ``world_size`` ranks: on the state's
    own world size its position; on another (elastic) what every rank read becomes a finished
    stage ``(world, position)`` and the new ranks start at 0. ``remaining(epoch, resumes)``: the
    rank's samples left then. A position past them (``(step + 1) * B`` after a short last
    batch) means the pass is done, as torch's ``DistributedSampler`` reads such a count: the
    position becomes the end of the pass. ``kind``: the state's ``sampler`` entry this order
    needs (``None``: a ``Loader``'s or ``StreamingDataset``'s, which have none), so that a
    state of another order is refused instead of read in the wrong order."""
    if state.get("sampler") != kind:
        def name(k: str | None) -> str:
            return k or "a Loader's or StreamingDataset's"

        raise UsageError(f"cannot resume: the state is {name(state.get('sampler'))}, this order {name(kind)}")
    epoch = consumed_count(state["epoch"], "the state's epoch")
    position = consumed_count(state.get("position", 0), "the state's position")
    stages = [(int(w), consumed_count(p, "a resume's position")) for w, p in state.get("resumes", [])]
    world = int(state.get("world_size", world_size))
    if world < 1:
        raise UsageError(f"cannot resume: state has world_size={world}")
    if world != world_size:
        stages.append((world, position))
        position = 0
    if len(stages) > MAX_RESUMES:
        raise UsageError(f"cannot resume: more than {MAX_RESUMES} world-size changes within epoch {epoch}")
    return epoch, min(position, remaining(epoch, stages)), stages


def carried_skips(records: Iterable[tuple[int, int]], position: int) -> list[int]:
    """The skips a state at ``position`` carries: of ``records`` (``(sample, at)``: a skipped
    sample and the position in the pass of the slot it was skipped at, -1 for skips carried in
    from an earlier state), the samples skipped before ``position``, in pass order. Loader
    threads and DataLoader workers read ahead of what the training loop consumed; a skip they
    met there is met again by the resumed pass, so carrying it would count it twice."""
    return [s for s, at in sorted(records, key=lambda r: r[1]) if at < position]


def skip_cap(on_corrupt: str, max_skipped: int | float, samples: int) -> int:
    """Samples a rank may skip per epoch: ``max_skipped`` as a count, or a fraction of ``samples``."""
    if on_corrupt not in ON_CORRUPT:
        raise UsageError(f"on_corrupt must be one of {ON_CORRUPT}, not {on_corrupt!r}")
    if isinstance(max_skipped, bool) or not isinstance(max_skipped, (int, float)):
        raise UsageError(f"max_skipped must be a count (int) or a fraction (float), not {max_skipped!r}")
    if on_corrupt == "raise":
        if max_skipped:
            raise UsageError("max_skipped needs on_corrupt='skip'")
        return 0
    if isinstance(max_skipped, float):
        if not 0.0 <= max_skipped <= 1.0:
            raise UsageError(f"max_skipped as a fraction must be in [0, 1], not {max_skipped}")
        return int(max_skipped * samples)
    if max_skipped < 0:
        raise UsageError(f"max_skipped must be >= 0, not {max_skipped}")
    return int(max_skipped)


def resolve_rank(rank: int | None = None, world_size: int | None = None) -> tuple[int, int]:
    """(rank, world size): as given, else from ``torch.distributed``, else ``RANK``/``WORLD_SIZE``."""
    if rank is None or world_size is None:
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            r, w = dist.get_rank(), dist.get_world_size()
        else:
            r, w = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
        rank = r if rank is None else rank
        world_size = w if world_size is None else world_size
    if world_size < 1 or not 0 <= rank < world_size:
        raise UsageError(f"rank {rank} is not in [0, world_size={world_size})")
    return rank, world_size


@dataclasses.dataclass(frozen=True)
class StreamOrder:
    """How a ``StreamingDataset`` orders an epoch (see its Args for each field)."""

    shuffle: bool = True
    seed: int = 0
    buffer_size: int = DEFAULT_BUFFER_SIZE
    block_size: int | None = DEFAULT_BLOCK_SIZE
    drop_last: bool = False
    batch_size: int = 1

    def __post_init__(self) -> None:
        if self.buffer_size < 1 or self.batch_size < 1 or (self.block_size is not None and self.block_size < 1):
            raise UsageError("buffer_size, block_size and batch_size must be >= 1")


_DEFAULT_ORDER = StreamOrder()


class StreamingDataset(IterableDataset):
    """Iterate a records output (any packed output works) in a seeded, per-epoch order.

    Every rank yields the same number of samples per epoch (``len(dataset)``); DataLoader
    workers split the rank's share by batches. Call ``set_epoch(e)`` before each epoch (it
    reaches persistent workers too). For a mid-epoch resume save ``state_dict(num_samples)``
    and give it to ``load_state_dict`` of a fresh dataset built with the same arguments.

    Several packs read as one stream (weighted mixing): give ``path`` as a mapping of path (or
    URL) to weight, e.g. ``{"k400.records": 0.7, "mine.records": 0.3}``. Each epoch then holds
    ``epoch_size`` samples (default: the sources' total) split by those proportions exactly
    (a source smaller than its share is repeated, a larger one subsampled anew each epoch),
    interleaved at random across sources before the rank split and shuffle, so resume and
    elastic resume work as for one pack. Samples are ``(image, label, source)``: ``source``
    indexes ``sources``; labels are each source's own unless ``label_map`` is given.

    A field pack (docs/fields.md) yields a dict per sample, as ``PackedDataset`` does (``fields``,
    ``masks``, ``tv_tensors``); in a mix of field packs each dict also holds ``source``, and
    ``transform`` takes the dict with it. ``collate_fn()`` batches the dicts.

    Args:
        path: the packed output (or a list of TFRecord files with ``.idx`` indexes), or a
            mapping of such paths to weights (see above).
        epoch_size: samples an epoch of a mix (``mix_by="proportion"``).
        mix_by: ``"proportion"`` (weights normalized over ``epoch_size``) or ``"repeat"`` (each
            source gives ``round(weight x its size)`` samples an epoch, like MDS's ``repeat``).
        label_map: class name -> label for every class of every source of a mix: one label
            space across sources (``classes`` then follows it).
        on_corrupt: ``"raise"`` (default): a damaged sample (``CorruptData``/``CorruptSample``
            on read or decode) raises. ``"skip"``: it is replaced by the next valid sample of
            this worker's order (the count per rank stays equal), logged once with its key and
            reason, and listed in ``skipped`` (and ``state_dict``); each worker logs its skips
            again when its epoch ends.
        max_skipped: with ``on_corrupt="skip"``, the most samples skipped per rank and epoch:
            a count (int) or a fraction of ``len(dataset)`` (float in [0, 1]); the next one
            raises ``CorruptData`` naming it.
        order: a ``StreamOrder`` (its fields may also be given as keywords: one not left at its
            default wins over ``order``'s):
        shuffle: shuffle shard order per epoch, then samples (block shuffle or buffer).
        seed: the seed of every shuffle (the same on every rank).
        block_size: samples per shuffle block (sizes vary +-25% per block); a block spans
            ``block_size / samples per shard`` shards, read interleaved (see the module doc for
            the I/O locality cost). ``None``: the older shuffle buffer instead.
        buffer_size: the shuffle buffer's size when ``block_size=None`` (positions, 8 bytes each).
        drop_last: drop the uneven tail instead of padding each rank by repetition.
        batch_size: the DataLoader's batch size; with it the loader's output is exactly this
            rank's order (what makes a resume exact with several workers).
        decode, transform, target_transform, check_crc, fields, masks, tv_tensors: as
            ``PackedDataset``.
        rank, world_size: override what ``torch.distributed`` (or ``RANK``/``WORLD_SIZE``) says.
        cache_dir, cache_limit, remote: for a URL ``path`` (each path of a mix), as
            ``PackedDataset``; each worker prefetches the next shards of its own order
            (``remote.prefetch`` of them).
    """

    def __init__(self, path: Any, order: StreamOrder | None = None, *, decode: str = "pil",
                 transform: Callable[[Any], Any] | None = None,
                 target_transform: Callable[[int], Any] | None = None, check_crc: bool = True,
                 rank: int | None = None, world_size: int | None = None, epoch_size: int | None = None,
                 mix_by: str = "proportion", label_map: Mapping[str, int] | None = None,
                 on_corrupt: str = "raise", max_skipped: int | float = 0,
                 shuffle: bool = _DEFAULT_ORDER.shuffle, seed: int = _DEFAULT_ORDER.seed,
                 block_size: int | None = _DEFAULT_ORDER.block_size, buffer_size: int = _DEFAULT_ORDER.buffer_size,
                 drop_last: bool = _DEFAULT_ORDER.drop_last, batch_size: int = _DEFAULT_ORDER.batch_size,
                 cache_dir: str | os.PathLike | None = None, cache_limit: int | str | None = None,
                 remote: Any = None, fields: Sequence[str] | str | None = None, masks: str | None = None,
                 tv_tensors: bool = False):
        given = dict(shuffle=shuffle, seed=seed, block_size=block_size, buffer_size=buffer_size,
                     drop_last=drop_last, batch_size=batch_size)
        order_fields = {k: v for k, v in given.items() if v != getattr(_DEFAULT_ORDER, k)}
        self.options = dataclasses.replace(order or _DEFAULT_ORDER, **order_fields)
        # each source's URL and field options
        options = dict(cache_dir=cache_dir, cache_limit=cache_limit, remote=remote, fields=fields, masks=masks,
                       tv_tensors=tv_tensors)
        self.target_transform = target_transform
        self.sample_transform: Callable[[Any], Any] | None = None  # a mix of field packs: after ``source``
        self.fielded = False
        if isinstance(path, Mapping):
            self._open_mix(path, decode=decode, transform=transform, check_crc=check_crc, epoch_size=epoch_size,
                           mix_by=mix_by, label_map=label_map, options=options)
        else:
            if epoch_size is not None or mix_by != "proportion" or label_map is not None:
                raise UsageError("epoch_size, mix_by and label_map are for a mix: give path as {path: weight}")
            self.dataset = PackedDataset(path, decode=decode, transform=transform,
                                         target_transform=target_transform, check_crc=check_crc, **options)
            self.sources = [self.dataset]
            self.fielded = self.dataset.fields is not None
            reader = self.dataset.reader
            self.counts = list(getattr(reader, "shard_counts", None) or [len(reader)])
            self.mix: list[int] | None = None
        self._n = sum(self.mix) if self.mix is not None else sum(self.counts)
        o = self.options
        self.shuffle, self.seed, self.buffer_size = o.shuffle, int(o.seed), o.buffer_size
        self.block_size, self.drop_last, self.batch_size = o.block_size, o.drop_last, o.batch_size
        self.rank, self.world_size = resolve_rank(rank, world_size)
        # [epoch, samples to skip, resumes, (world, consumed) x MAX_RESUMES]: in shared memory so
        # that set_epoch/load_state_dict reach DataLoader workers that persist across epochs.
        self._shared = torch.zeros(3 + 2 * MAX_RESUMES, dtype=torch.int64).share_memory_()
        self._position = 0  # samples of this epoch's order yielded in this process
        self.on_corrupt, self.max_skipped = on_corrupt, max_skipped
        self._skip_cap = skip_cap(on_corrupt, max_skipped, len(self))
        # skips of the epoch as [epoch, count, (sample, position in the pass it was skipped at)...]:
        # row 0 those a loaded state carried (at -1), row 1 + w DataLoader worker w's (only it writes)
        self._skips = torch.zeros(MAX_WORKERS + 1 if on_corrupt == "skip" else 0, 2 * self._skip_cap + 2,
                                  dtype=torch.int64).share_memory_()
        self._pass_lengths: dict[tuple[int, tuple[tuple[int, int], ...]], int] = {}
        self._pack_ids: list[str] | None = None

    def _open_mix(self, paths: Mapping[Any, float], *, decode: Any, transform: Any, check_crc: bool,
                  epoch_size: int | None, mix_by: str, label_map: Mapping[str, int] | None,
                  options: dict[str, Any]) -> None:
        self.dataset = None  # several: ``sources``
        self.weights = mix_weights(paths.values())
        distinct_packs(paths)
        self.sources = [PackedDataset(p, decode=decode, transform=transform, check_crc=check_crc, **options)
                        for p in paths]
        self._mix_fields(transform, label_map)
        sizes = [len(d) for d in self.sources]
        self.mix = mix_counts(sizes, self.weights, by=mix_by, epoch_size=epoch_size)
        self.source_counts = [list(getattr(d.reader, "shard_counts", None) or [len(d)]) for d in self.sources]
        self.offsets = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64)
        self.counts = [c for sc in self.source_counts for c in sc]
        self.label_map = dict(label_map) if label_map is not None else None
        self._luts: list[np.ndarray] | None = None
        if self.label_map is not None:
            self._luts = []
            for d in self.sources:
                missing = [c for c in d.classes if c not in self.label_map]
                if missing:
                    raise UsageError(f"label_map lacks classes {missing[:5]} of {d.path}")
                self._luts.append(np.array([int(self.label_map[c]) for c in d.classes], dtype=np.int64))

    def _mix_fields(self, transform: Any, label_map: Any) -> None:
        """A mix of field packs: each sample's dict gains ``source``, then ``transform`` runs on it."""
        kinds = {d.fields is not None for d in self.sources}
        if kinds == {False}:
            return
        if len(kinds) > 1:
            raise UsageError("a mix takes field packs or image packs, not both: "
                             + ", ".join(f"{d.path} ({'fields' if d.fields is not None else 'images'})"
                                         for d in self.sources))
        if label_map is not None or self.target_transform is not None:
            raise UsageError("label_map and target_transform are for (image, label) packs; a field pack's samples "
                             "are dicts: use transform")
        clash = [d.path for d in self.sources if "source" in d.fields.names]
        if clash:
            raise UsageError(f"a mix adds the field 'source', which {', '.join(clash)} has: select the other "
                             "fields with fields=[...]")
        self.fielded = True
        self.sample_transform = transform
        for d in self.sources:
            d.transform = None

    @property
    def variable_fields(self) -> list[str]:
        """The field packs' variable-length fields (``PackedDataset.variable_fields``)."""
        return sorted({n for d in self.sources for n in d.variable_fields})

    def collate_fn(self, *, pad: bool = False) -> Callable[[Sequence[dict[str, Any]]], dict[str, Any]]:
        """A field pack's collate for the DataLoader (``PackedDataset.collate_fn``)."""
        if not self.fielded:
            raise UsageError(f"{self._where()}: collate_fn is for field packs; batch (image, label) with "
                             "packer.data.uint8_collate or the DataLoader's default")
        return field_collate(self.variable_fields, pad=pad)

    def __len__(self) -> int:
        n = self._n
        return n // self.world_size if self.drop_last else math.ceil(n / self.world_size)

    @property
    def epoch(self) -> int:
        return int(self._shared[0])

    @property
    def classes(self) -> list[str]:
        """Class names, index = label (a mix: those of ``label_map``; without one labels are per source)."""
        if self.dataset is not None:
            return self.dataset.classes
        if self.label_map is None:
            raise UsageError("a mix without label_map has labels per source: see sources[i].classes")
        names: dict[int, str] = {}
        for name, label in self.label_map.items():
            names.setdefault(int(label), name)
        return [names[k] for k in sorted(names)]

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch``'s order from the next iteration on (a pending resume of that epoch stays)."""
        if int(epoch) != self.epoch:
            self._shared[1:3] = 0
        self._shared[0] = int(epoch)

    def order(self, epoch: int | None = None) -> list[int]:
        """This rank's sample positions for ``epoch`` (default: the current one), in order; for
        the current epoch after an elastic resume, what is left of it on this world size."""
        return self._order(epoch).tolist()

    def _stages(self) -> list[tuple[int, int]]:
        k = int(self._shared[2])
        return [(int(self._shared[3 + 2 * i]), int(self._shared[4 + 2 * i])) for i in range(k)]

    def _stream(self, epoch: int) -> np.ndarray:
        if self.mix is not None:
            return self._mix_stream(epoch)
        return epoch_stream(self.counts, epoch_shard_order(len(self.counts), seed=self.seed, epoch=epoch,
                                                           shuffle=self.shuffle))

    def _mix_stream(self, epoch: int) -> np.ndarray:
        picks = []
        for i, counts in enumerate(self.source_counts):
            shard_seed = int(np.random.SeedSequence([self.seed, 3, i]).generate_state(1)[0])
            stream = epoch_stream(counts, epoch_shard_order(len(counts), seed=shard_seed, epoch=epoch,
                                                            shuffle=self.shuffle))
            rng = np.random.default_rng(np.random.SeedSequence([self.seed, epoch, 4, i])) if self.shuffle else None
            picks.append(source_picks(stream, self.mix[i], rng))
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, epoch, 5])) if self.shuffle else None
        return mix_stream(picks, self.offsets, rng)

    def _order(self, epoch: int | None = None, stages: Sequence[tuple[int, int]] | None = None) -> np.ndarray:
        epoch = self.epoch if epoch is None else epoch
        if stages is None:
            stages = self._stages() if epoch == self.epoch else []
        stream = self._stream(epoch)

        def first(rank: int, world: int) -> np.ndarray:
            return rank_slots(len(stream), seed=self.seed, epoch=epoch, shuffle=self.shuffle,
                              buffer_size=self.buffer_size, rank=rank, world_size=world,
                              drop_last=self.drop_last, block_size=self.block_size)

        return stream[elastic_slots(first, len(stream), stages, rank=self.rank, world_size=self.world_size,
                                    drop_last=self.drop_last)]

    def _pass_length(self) -> int:
        """Samples of this rank's order of the current epoch (after its resumes), cached."""
        epoch, stages = self.epoch, tuple(self._stages())
        if not stages:
            return len(self)
        key = (epoch, stages)
        if key not in self._pass_lengths:
            self._pass_lengths[key] = len(self._order(epoch, stages))
        return self._pass_lengths[key]

    def __iter__(self) -> Iterator[Any]:
        epoch, skip = int(self._shared[0]), int(self._shared[1])
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        todo = self._order(epoch)[skip:]
        self._position = skip
        slots = np.fromiter(split_by_worker(range(len(todo)), worker, workers, self.batch_size), dtype=np.int64)
        mine = todo[slots].tolist()
        if self.mix is not None:
            which = np.searchsorted(self.offsets, np.asarray(mine, dtype=np.int64), side="right") - 1
            for src, d in enumerate(self.sources):  # remote shards: prefetch in this order
                plan = getattr(d.reader, "plan", None)
                if plan is not None:
                    plan([int(i) - int(self.offsets[src]) for i, w in zip(mine, which) if w == src])
        else:
            plan = getattr(self.dataset.reader, "plan", None)
            if plan is not None:
                plan(mine)
        if self.on_corrupt == "skip":
            yield from self._iter_skipping(mine, (slots + skip).tolist(), epoch, worker)
            return
        read = self._read if self.mix is not None else self.dataset.__getitem__
        for i in mine:
            self._position += 1
            yield read(int(i))

    def _read(self, i: int) -> Any:
        if self.mix is None:
            return self.dataset[i]
        src = int(np.searchsorted(self.offsets, i, side="right")) - 1
        if self.fielded:
            sample = {**self.sources[src][i - int(self.offsets[src])], "source": src}
            return self.sample_transform(sample) if self.sample_transform is not None else sample
        image, label = self.sources[src][i - int(self.offsets[src])]
        if self._luts is not None:
            label = int(self._luts[src][label])
        if self.target_transform is not None:
            label = self.target_transform(label)
        return image, label, src

    def _key(self, i: int) -> str:
        if self.mix is None:
            return self.dataset.keys[i]
        src = int(np.searchsorted(self.offsets, i, side="right")) - 1
        return f"{self.sources[src].path}:{self.sources[src].keys[i - int(self.offsets[src])]}"

    def _where(self) -> str:
        return self.dataset.path if self.mix is None else ", ".join(d.path for d in self.sources)

    def _iter_skipping(self, mine: list[int], ats: list[int], epoch: int, worker: int) -> Iterator[Any]:
        """``mine`` (samples at pass positions ``ats``), a damaged one replaced by the next valid
        sample of ``mine``. A skip is recorded at its own slot's position, when the pass reaches
        it, never earlier while looking ahead for a replacement: ``state_dict`` carries exactly
        the skips before its position (``carried_skips``)."""
        if worker >= MAX_WORKERS:
            raise UsageError(f"on_corrupt='skip' reports for at most {MAX_WORKERS} DataLoader workers")
        row = self._skips[1 + worker]
        if int(row[0]) != epoch:
            row.zero_()
            row[0] = epoch
        restored = self._carried(epoch)  # counted already: the state's pass met them
        bad: dict[int, Exception] = {}  # samples found damaged in this pass (each read once)

        def read(i: int) -> Any:
            if i not in bad:
                try:
                    return self._read(i)
                except (CorruptData, CorruptSample) as e:
                    bad[i] = e
            return _DAMAGED

        last = None
        for k, (i, at) in enumerate(zip(mine, ats)):
            sample = read(i)
            if sample is _DAMAGED:
                if i in restored:
                    restored.remove(i)
                else:
                    self._record_skip(row, epoch, i, at, bad[i])
                for j in range(k + 1, len(mine)):  # the next valid sample of this worker's part
                    sample = read(mine[j])
                    if sample is not _DAMAGED:
                        break
                else:
                    if last is None:
                        raise CorruptData(self._where(), f"no valid sample left to replace position {i} "
                                          f"in this worker's part of epoch {epoch}", key=self._key(i))
                    sample = last
            last = sample
            self._position += 1
            yield sample
        n = int(row[1])
        if n:
            log.warning("epoch %d: skipped %d corrupt samples in this worker: %s", epoch, n,
                        ", ".join(self._key(int(p)) for p in row[2:2 + 2 * n:2].tolist()))

    def _record_skip(self, row: torch.Tensor, epoch: int, i: int, at: int, e: Exception) -> None:
        total = len(self._skip_records(epoch))
        key = self._key(i)
        if total + 1 > self._skip_cap:
            raise CorruptData(self._where(), f"corrupt sample {key!r} (position {i}) would be skipped sample "
                              f"{total + 1} of epoch {epoch} on this rank, more than max_skipped="
                              f"{self.max_skipped!r}: {e}", key=key, position=i) from e
        n = int(row[1])
        row[2 + 2 * n], row[3 + 2 * n] = i, at
        row[1] = n + 1
        log.warning("skipping corrupt sample %r (position %d, epoch %d; %d skipped so far): %s",
                    key, i, epoch, total + 1, e)

    def _skip_records(self, epoch: int) -> list[tuple[int, int]]:
        """``(sample, pass position skipped at)`` of ``epoch`` on this rank: those a loaded state
        carried (at -1), then each DataLoader worker's."""
        out = []
        for row in self._skips:
            if int(row[0]) == epoch:
                pairs = row[2:2 + 2 * int(row[1])].tolist()
                out += list(zip(pairs[::2], pairs[1::2]))
        return out

    def _carried(self, epoch: int) -> list[int]:
        row = self._skips[0] if len(self._skips) else None
        return row[2:2 + 2 * int(row[1]):2].tolist() if row is not None and int(row[0]) == epoch else []

    @property
    def skipped(self) -> list[dict[str, Any]]:
        """The current epoch's skipped samples on this rank (all workers): position, key and
        reason (read again: damage is deterministic), in the order each worker met them."""
        out = []
        for p in self._skipped_positions():
            try:
                self._read(p)
                reason = "read again without error"
            except (CorruptData, CorruptSample) as e:
                reason = str(e)
            out.append({"position": p, "key": self._key(p), "reason": reason})
        return out

    def _skipped_positions(self) -> list[int]:
        return [s for s, _ in self._skip_records(self.epoch)]

    def state_dict(self, num_samples: int | None = None) -> dict[str, Any]:
        """Where this rank is in the epoch, and what it ran on (plain JSON).

        ``position`` counts the samples this rank read of its order on ``world_size`` ranks;
        ``resumes`` lists the earlier ``[world size, position]`` of this epoch when it was
        resumed on other world sizes (``load_state_dict``). Every rank reads the same count, so
        any rank's state describes them all.

        Args:
            num_samples: samples this rank consumed since the current iteration began (e.g.
                ``(step + 1) * batch_size``). Needed when DataLoader workers do the reading;
                without it the count of what this process itself yielded is used
                (``num_workers=0``). A count past the end of the pass (after a short last
                batch) means the pass is done; a negative or non-integer one is refused.

        With ``on_corrupt="skip"``, ``skipped`` lists the samples skipped before ``position``
        (the workers' skips ahead of it are met again by the resumed pass).
        """
        if num_samples is None:
            position = self._position
        else:
            position = int(self._shared[1]) + consumed_count(num_samples)
        position = min(position, self._pass_length())
        return {"epoch": self.epoch, "position": position, "seed": self.seed, "shuffle": self.shuffle,
                "buffer_size": self.buffer_size, "block_size": self.block_size, "drop_last": self.drop_last,
                "world_size": self.world_size, "rank": self.rank, "count": sum(self.counts),
                "resumes": [list(s) for s in self._stages()], "packs": self._packs(), **self._mix_state(),
                **({"skipped": carried_skips(self._skip_records(self.epoch), position)}
                   if self.on_corrupt == "skip" else {})}

    def _packs(self) -> list[str]:
        """Each source's ``Manifest.identity()``: a state of another pack with the same sample
        count would otherwise resume in an order that means nothing for this one. (Computed
        once: ``state_dict`` may be called every step.)"""
        if self._pack_ids is None:
            self._pack_ids = [d.manifest.identity() for d in self.sources]
        return list(self._pack_ids)

    def _mix_state(self) -> dict[str, Any]:
        if self.mix is None:
            return {}
        return {"sources": [[d.path, len(d), w, n] for d, w, n in zip(self.sources, self.weights, self.mix)]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``: the next iteration yields the rest of that epoch's order.

        On the world size the state was taken on, this rank continues its own order. On another
        world size (elastic resume) the samples no rank has read yet are split again evenly
        over the new ranks (``elastic_slots``); later epochs are what a fresh run on this world
        size reads. Refused with ``UsageError`` naming the difference when the state was taken
        with another seed, shuffle, size or sample count, or cannot be placed exactly.
        """
        if "block_size" not in state and self.shuffle and self.block_size is not None:
            raise UsageError("cannot resume: the state predates the block shuffle (it has no block_size); "
                             "build the dataset with block_size=None to continue its buffer-shuffled order")
        for k in ("seed", "shuffle", "buffer_size", "block_size", "drop_last", "count"):
            mine = getattr(self, k) if k != "count" else sum(self.counts)
            if k in state and state[k] != mine:
                raise UsageError(f"cannot resume: state has {k}={state[k]!r}, this dataset {mine!r}")
        theirs, mine = state.get("sources"), self._mix_state().get("sources")
        if (theirs is None) != (mine is None) or (mine is not None and [s[1:] for s in theirs] != [s[1:] for s in mine]):
            raise UsageError(f"cannot resume: state has sources [path, size, weight, samples an epoch] "
                             f"{theirs}, this dataset {mine}")
        if "packs" in state and state["packs"] != self._packs():  # (a state written before packs: unchecked)
            raise UsageError(f"cannot resume: the state was taken on other packs (identity {state['packs']}), "
                             f"not {self._where()} (identity {self._packs()}); same sample counts, other data")
        self._load_position(state)

    def _load_position(self, state: dict[str, Any]) -> None:
        epoch, position, stages = resume_point(state, self.world_size,
                                               lambda e, st: len(self._order(e, st)))
        self._skips.zero_()
        if self.on_corrupt == "skip" and state.get("skipped"):
            skipped = [int(p) for p in state["skipped"]][:self._skip_cap]
            self._skips[0, 0], self._skips[0, 1] = epoch, len(skipped)
            self._skips[0, 2:2 + 2 * len(skipped)] = torch.tensor([[p, -1] for p in skipped]).flatten()
        self._shared[0] = epoch
        self._shared[1] = position
        self._shared[2] = len(stages)
        for i, (w, p) in enumerate(stages):
            self._shared[3 + 2 * i], self._shared[4 + 2 * i] = w, p
        self._position = position

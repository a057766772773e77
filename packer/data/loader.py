"""``Loader``: a thread-based loader for any packer dataset, its epochs and its reused batch buffers.

Batch buffers for ``packer.Loader``: uint8 images copied into reused buffers without torch ops.

``as_image`` views an image or clip channels-first as numpy (no copy); ``copy_into`` writes it
into a batch slot (OpenCV's SIMD channel split for channels-last sources; both release the
GIL; torch's ``copy_`` is avoided: its intra-op threads fight the loader's and it is several
times slower for uint8 transposes). ``BufferPool`` hands out batch buffers and takes one back
only once nothing outside the pool references it (PyTorch's storage use count), which is what
lets a caller hold a yielded batch for as long as it likes.

One pass of a ``packer.data.loader.Loader``: the loader threads, the batches in flight and
how each batch is assembled into reused uint8 buffers (the buffer contract: see ``loader``).

``Loader``: a thread-based loader for any packer dataset, decoding straight into uint8 batches.

JPEG decode, resize and memory copies release the GIL, so a few threads in the training
process do what DataLoader worker processes do without pickling each batch and copying it
through shared memory. The order is the DataLoader's / ``DistributedSampler``'s contract:
a seeded permutation per epoch, split across ranks with the same number of batches on every
rank (``packer.data.streaming.split_by_rank``).

Buffer contract: image fields are written by the threads straight into a preallocated
``N x C x H x W`` (or ``N x T x C x H x W``) uint8 buffer (a field pack's image fields, by
name, when the batch's images share one size: otherwise that field is a list of ``C x H x W``
uint8 tensors; its other fields are batched as ``packer.data.fields.collate_field`` says).
A buffer is refilled only when nothing outside the loader references it any more: the
yielded batch, any view or slice of it, a numpy array over it. You may hold a batch as long as you like; it is never overwritten
under you, and buffers you have let go are reused (so steady-state training allocates
nothing). With CUDA the buffers are pinned and come from PyTorch's pinned-memory caching
allocator, which recycles a block only after the non_blocking copies that read it finished.
"""
from __future__ import annotations

import atexit
import dataclasses
import logging
import math
import os
import queue
import threading
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import numpy as np
import torch
from PIL import Image
from torch.utils.data import default_collate

from packer.data.fields import FieldDecoder, collate_field
from packer.data.streaming import (carried_skips, elastic_slots, resolve_rank, resume_point, skip_cap,
                                   split_by_rank)
from packer.errors import CorruptData, CorruptSample, PackerError, UsageError

try:  # OpenCV is a core dependency; guarded only so that a broken install degrades to numpy
    import cv2
except ImportError:  # pragma: no cover
    cv2 = None

__all__ = ["as_image", "copy_into", "BufferPool", "Loader", "LoaderOptions", "LoaderError", "epoch_indices"]

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


_THREAD_PREFIX = "packer-loader"


class LoaderError(PackerError):
    """Loading one sample failed in a loader thread; names the sample (index and key)."""

    def __init__(self, index: int, where: str, cause: BaseException):
        self.index = index
        super().__init__(f"loading sample {index}{where} failed: {type(cause).__name__}: {cause}")


# -- sample structure ----------------------------------------------------------------------------
def _fields(sample: Any) -> list[tuple[Any, Any]]:
    """(key, value) of a sample's top-level fields: dict keys, tuple positions, or one field."""
    if isinstance(sample, Mapping):
        return list(sample.items())
    if isinstance(sample, (tuple, list)):
        return list(enumerate(sample))
    return [(None, sample)]


def _rebuild(like: Any, values: dict[Any, Any]) -> Any:
    if isinstance(like, Mapping):
        return {k: values[k] for k in like}
    if isinstance(like, tuple) and hasattr(like, "_fields"):
        return type(like)(*(values[i] for i in range(len(like))))
    if isinstance(like, (tuple, list)):
        out = [values[i] for i in range(len(like))]
        return tuple(out) if isinstance(like, tuple) else out
    return values[None]


# -- one batch in flight -----------------------------------------------------------------------
@dataclass
class _Batch:
    number: int
    indices: np.ndarray
    remaining: int
    done: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    like: Any = None  # the first sample (its structure)
    images: dict[Any, torch.Tensor] = field(default_factory=dict)  # field -> buffer
    arrays: dict[Any, np.ndarray] = field(default_factory=dict)  # field -> the buffer as numpy
    other: dict[Any, list] = field(default_factory=dict)  # field -> values by position
    # a field pack's image field -> {position: its image}, for images of another size than the buffer's
    spilled: dict[Any, dict[int, Any]] = field(default_factory=dict)
    samples: list | None = None  # user collate: the samples by position
    error: tuple[int, BaseException] | None = None
    result: Any = None


# The passes whose threads are running. A script that exits while a pass is suspended (it took a
# few batches and stopped) would leave its daemon threads decoding while the interpreter shuts
# down: a thread stopped inside a C++ decoder aborts the process ("FATAL: exception not
# rethrown", exit 134). ``_close_running`` stops them first, from atexit.
_RUNNING: "weakref.WeakSet[Epoch]" = weakref.WeakSet()


@atexit.register
def _close_running() -> None:
    for epoch in list(_RUNNING):
        epoch.close()


class Epoch:
    """The threads and in-flight batches of one ``Loader`` pass; closes cleanly from anywhere
    (``run()`` yields the batches in order)."""

    def __init__(self, loader: "Loader", indices: np.ndarray):
        self.loader = loader
        self.order = indices
        self.batches = [indices[i:i + loader.batch_size] for i in range(0, len(indices), loader.batch_size)]
        if loader.drop_last and self.batches and len(self.batches[-1]) < loader.batch_size:
            self.batches.pop()
        self.tasks: queue.Queue = queue.Queue()
        self.stop = threading.Event()
        self.inflight: dict[int, _Batch] = {}
        self.next_submit = 0
        self.threads: list[threading.Thread] = []
        self.closed = False

    def _start(self) -> None:  # in run(): a pass that is never iterated starts no thread
        for i in range(self.loader.num_threads):
            t = threading.Thread(target=self._work, name=f"{_THREAD_PREFIX}-{i}", daemon=True)
            self.threads.append(t)
            t.start()
        _RUNNING.add(self)

    # -- main thread ----------------------------------------------------------------------------
    def _submit(self, upto: int) -> None:
        chunk = self.loader.chunk
        while self.next_submit < min(upto, len(self.batches)):
            k = self.next_submit
            idx = self.batches[k]
            b = _Batch(k, idx, len(idx))
            if self.loader.collate is not None:
                b.samples = [None] * len(idx)
            self.inflight[k] = b
            for s in range(0, len(idx), chunk):
                self.tasks.put((b, s, min(s + chunk, len(idx))))
            self.next_submit += 1

    def run(self) -> Iterator[Any]:
        self._start()
        try:
            for k in range(len(self.batches)):
                self._submit(k + 1 + self.loader.prefetch)
                b = self.inflight[k]
                while not b.done.wait(0.05):
                    if not any(t.is_alive() for t in self.threads):
                        raise RuntimeError("packer.Loader: every loader thread died")
                del self.inflight[k]
                if b.error is not None:
                    index, exc = b.error
                    raise LoaderError(index, self.loader._where(index), exc) from exc
                out = b.result
                b.result = None
                self.loader._consumed += len(b.indices)  # handed out: what state_dict counts
                b.arrays.clear()  # (numpy views count as references to the buffer)
                for buf in b.images.values():
                    self.loader.pool.release(buf)
                b = None
                yield out
                del out
            skipped = self.loader._skipped
            if skipped:
                log.warning("epoch %d: skipped %d corrupt samples: %s", self.loader._pass[0], len(skipped),
                            ", ".join(str(r["key"] if r["key"] is not None else r["index"]) for r in skipped))
        finally:
            self.close()

    def close(self) -> None:
        """Stop the threads (they finish the chunk in hand) and wait for them; once (again: nothing,
        as when a pass closed at exit is garbage-collected while the interpreter tears down)."""
        if self.closed:
            return
        self.closed = True
        _RUNNING.discard(self)
        self.stop.set()
        while True:
            try:
                self.tasks.get_nowait()
            except queue.Empty:
                break
        for _ in self.threads:
            self.tasks.put(None)
        me = threading.current_thread()
        for t in self.threads:
            if t is not me:
                t.join()
        for b in self.inflight.values():
            b.arrays.clear()
            for buf in b.images.values():
                self.loader.pool.release(buf)
        self.inflight.clear()

    # -- loader threads -------------------------------------------------------------------------
    def _work(self) -> None:
        while True:
            task = self.tasks.get()
            if task is None or self.stop.is_set():
                return
            b, start, end = task
            if b.error is not None:
                self._finish(b, end - start)
                continue
            try:
                self._fill(b, start, end)
            except BaseException as e:  # noqa: BLE001 - handed to the consumer, which raises it
                with b.lock:
                    pos = getattr(e, "_packer_pos", start)
                    if b.error is None:
                        b.error = (int(b.indices[pos]), e)
            self._finish(b, end - start)

    def _finish(self, b: _Batch, n: int) -> None:
        with b.lock:
            b.remaining -= n
            last = b.remaining == 0
        if not last:
            return
        if b.error is None:
            try:
                b.result = self._assemble(b)
            except BaseException as e:  # noqa: BLE001
                b.error = (int(b.indices[0]), e)
        b.done.set()

    def _fetch(self, indices: list[int]) -> Iterator[Any]:
        """The samples of ``indices`` in order, lazily where the dataset allows it
        (``iter_items``, e.g. ``PackedDataset``: one batched read, each sample decoded right
        after its read), else ``__getitems__``, else one by one. An exception carries the
        position (within ``indices``) of the sample that raised it."""
        ds = self.loader.dataset
        lazy = getattr(ds, "iter_items", None)
        getitems = getattr(ds, "__getitems__", None)
        done = 0  # samples handed out: the next one is the one that failed
        try:
            if lazy is not None:
                for sample in lazy(indices):
                    yield sample
                    done += 1
                return
            if getitems is not None and len(indices) > 1:
                batch = None
                try:
                    batch = list(getitems(indices))
                except Exception:  # noqa: BLE001 - below, one by one, to name the failing sample
                    pass
                if batch is not None:
                    yield from batch
                    return
            for i in indices:
                yield ds[i]
                done += 1
        except GeneratorExit:
            raise
        except BaseException as e:
            e._packer_pos = done  # type: ignore[attr-defined]
            raise

    def _fetch_skipping(self, indices: list[int], flat: int) -> Iterator[Any]:
        """``_fetch``, a corrupt sample replaced by the next valid one of the pass (``on_corrupt="skip"``;
        ``flat``: the pass position of ``indices[0]``)."""
        pos = 0
        while pos < len(indices):
            try:
                for sample in self._fetch(indices[pos:]):
                    yield sample
                    pos += 1
                return
            except (CorruptData, CorruptSample) as e:
                self.loader._record_skip(indices[pos], e, at=flat + pos)
                yield self._substitute(flat + pos)
                pos += 1

    def _substitute(self, at: int) -> Any:
        """The first valid sample after pass position ``at`` (else before it). A damaged one met
        here is only noted: it is counted when the pass reaches its own position."""
        ds, loader = self.loader.dataset, self.loader
        for q in [*range(at + 1, len(self.order)), *range(at - 1, -1, -1)]:
            idx = int(self.order[q])
            if idx in loader._bad:
                continue
            try:
                return ds[idx]
            except (CorruptData, CorruptSample):
                with loader._skip_lock:
                    loader._bad.add(idx)
        raise CorruptData(str(getattr(ds, "path", "")), "no valid sample left in this pass to replace a corrupt one")

    def _fill(self, b: _Batch, start: int, end: int) -> None:
        indices = [int(i) for i in b.indices[start:end]]
        fetch = (self._fetch(indices) if self.loader.on_corrupt == "raise"
                 else self._fetch_skipping(indices, b.number * self.loader.batch_size + start))
        try:
            for j, sample in enumerate(fetch, start):
                if b.samples is not None:
                    b.samples[j] = sample
                    with b.lock:
                        if b.like is None:
                            b.like = sample
                    continue
                try:
                    self._place(b, j, sample)
                except BaseException as e:
                    e._packer_pos = j - start  # type: ignore[attr-defined]
                    raise
        except BaseException as e:
            e._packer_pos = start + getattr(e, "_packer_pos", 0)  # type: ignore[attr-defined]
            raise

    def _place(self, b: _Batch, pos: int, sample: Any) -> None:
        fields = _fields(sample)
        named = self.loader._image_fields  # a field pack: only its image fields (masks are uint8 arrays too)
        images = {k: as_image(v) if named is None or k in named else None for k, v in fields}
        with b.lock:
            if b.like is None:
                n = len(b.indices)
                for k, v in fields:
                    if images[k] is not None:
                        buf = self.loader.pool.acquire((n, *images[k].shape))
                        b.images[k] = buf
                        b.arrays[k] = buf.numpy()
                    else:
                        b.other[k] = [None] * n
                b.like = sample
        for k, v in fields:
            if k in b.images:
                img = images[k]
                dst = b.arrays[k]
                if img is not None and img.shape != dst.shape[1:] and named is not None:
                    with b.lock:  # a field pack's images of several sizes: this field is a list
                        b.spilled.setdefault(k, {})[pos] = v
                    continue
                if img is None or img.shape != dst.shape[1:]:
                    got = "not a uint8 image" if img is None else f"shape {tuple(img.shape)}"
                    raise ValueError(f"field {k!r} is {got}, the batch's first sample has "
                                     f"{tuple(dst.shape[1:])}; resize/crop images to one size "
                                     f"(e.g. decode=DecodeResizeCrop(256, 224))")
                copy_into(dst[pos], img)
            elif k in b.other:
                b.other[k][pos] = v
            else:
                raise ValueError(f"sample has field {k!r} that the batch's first sample lacks")

    def _assemble(self, b: _Batch) -> Any:
        if b.samples is not None:
            return self.loader.collate(b.samples)
        values: dict[Any, Any] = {}
        n = len(b.indices)
        for k, buf in b.images.items():
            values[k] = buf[:n]  # a view: its references keep the buffer from reuse
            spilled = b.spilled.get(k)
            if spilled:  # views of the buffer's slots, the images of other sizes as CHW tensors
                values[k] = [_chw_tensor(spilled[p]) if p in spilled else values[k][p] for p in range(n)]
        variable = self.loader._variable
        for k, vals in b.other.items():
            if variable is None:
                values[k] = default_collate(vals)
            else:  # a field pack: fixed fields stacked, variable-length ones lists
                values[k], _ = collate_field(vals, variable=k in variable)
        return _rebuild(b.like, values)


def _chw_tensor(image: Any) -> torch.Tensor:
    """An image of a list-batched field as a ``C x H x W`` uint8 tensor (a tensor as it is)."""
    if isinstance(image, torch.Tensor):
        return image
    return torch.from_numpy(np.array(as_image(image)))  # a copy: PIL's arrays are read-only

log = logging.getLogger(__name__)


def epoch_indices(n: int, *, shuffle: bool, seed: int, epoch: int, rank: int, world_size: int,
                  drop_last: bool, resumes: list[tuple[int, int]] | None = None) -> np.ndarray:
    """This rank's sample indices for ``epoch``: a seeded permutation (or ``0..n-1``), split by rank;
    after elastic ``resumes`` (``[(world, consumed per rank), ...]``) what is left of it, split
    over ``world_size`` ranks (``packer.data.streaming.elastic_slots``)."""
    order = (np.random.default_rng(np.random.SeedSequence([seed, epoch])).permutation(n) if shuffle
             else np.arange(n, dtype=np.int64))
    if not resumes:
        return split_by_rank(order, rank=rank, world_size=world_size, drop_last=drop_last)
    slots = np.arange(n, dtype=np.int64)

    def first(r: int, world: int) -> np.ndarray:
        return split_by_rank(slots, rank=r, world_size=world, drop_last=drop_last)

    return order[elastic_slots(first, n, resumes, rank=rank, world_size=world_size, drop_last=drop_last)]


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
        on_corrupt, max_skipped: ``"raise"`` (default) or ``"skip"`` damaged samples within a cap
            (see ``Loader``).
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
    on_corrupt: str = "raise"
    max_skipped: int | float = 0

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise UsageError(f"batch_size must be >= 1, not {self.batch_size}")
        if ((self.num_threads is not None and self.num_threads < 1) or self.prefetch < 0
                or (self.chunk is not None and self.chunk < 1)):
            raise UsageError("num_threads and chunk must be >= 1, prefetch >= 0")


_FIELD_DEFAULTS = {f.name: f.default for f in dataclasses.fields(LoaderOptions)}


class Loader:
    """Batches from any packer dataset, loaded by threads in this process.

    Args:
        dataset: any map-style dataset (``PackedDataset``, ``FrameDataset``,
            ``PackedVideoDataset``, your own); samples are tuples/lists/dicts or one image.
        options: a ``LoaderOptions``; its fields may also be given as keywords (below): one not
            left at its default overrides the object's.
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
            output equals ``uint8_collate``'s). A field pack's ``PackedDataset`` (dict samples):
            its image fields into buffers when the batch's images share one size, else a list
            of ``C x H x W`` uint8 tensors; its other fields as ``collate_fields`` batches them
            (fixed ones stacked, variable-length ones lists). A callable: called with the list
            of samples (e.g. ``dataset.collate_fn(pad=True)``).
        prefetch: batches loaded ahead of the one being consumed.
        chunk: samples per thread task (``__getitems__`` batch); default batch / (2 x threads).
        pin_memory: pinned buffers (default: when CUDA is available).
        rank, world_size: override ``torch.distributed`` (or ``RANK``/``WORLD_SIZE``).
        on_corrupt: ``"raise"`` (default): a damaged sample (``CorruptData``/``CorruptSample``)
            raises ``LoaderError``. ``"skip"``: it is replaced by the next valid sample of the
            pass (batch counts stay equal), logged once with its key and reason, listed in
            ``skipped`` and kept by ``state_dict``; the pass logs its skips when it ends.
        max_skipped: with ``"skip"``, the most samples skipped per pass: a count (int) or a
            fraction (float in [0, 1]) of this rank's samples; the next one raises, naming it.

    Every rank gets ``len(loader)`` batches per epoch. Threads help only where the per-sample
    work releases the GIL (packer's decoders, OpenCV, numpy/torch copies); a Python-heavy
    transform serializes them: ``packer bench`` measures this and says when to use the
    DataLoader instead.
    """

    def __init__(self, dataset: Any, options: LoaderOptions | None = None, *, sampler: Any = None,
                 collate: Callable[[list], Any] | None = None, batch_size: int | None = None,
                 shuffle: bool = False, seed: int = 0, num_threads: int | None = None, drop_last: bool = False,
                 prefetch: int = 2, chunk: int | None = None, pin_memory: bool | None = None,
                 rank: int | None = None, world_size: int | None = None, on_corrupt: str = "raise",
                 max_skipped: int | float = 0):
        given = dict(shuffle=shuffle, seed=seed, num_threads=num_threads, drop_last=drop_last, prefetch=prefetch,
                     chunk=chunk, pin_memory=pin_memory, rank=rank, world_size=world_size, on_corrupt=on_corrupt,
                     max_skipped=max_skipped)
        fields = {k: v for k, v in given.items() if v != _FIELD_DEFAULTS[k]}  # left at its default: options' own
        if batch_size is not None:
            fields["batch_size"] = batch_size
        if options is None and "batch_size" not in fields:
            raise UsageError("Loader needs batch_size (or a LoaderOptions)")
        opts = dataclasses.replace(options, **fields) if options is not None else LoaderOptions(**fields)
        if sampler is not None and opts.shuffle:
            raise UsageError("give shuffle or a sampler, not both (the sampler decides the order)")
        num_threads = opts.num_threads
        if num_threads is None:
            num_threads = min(8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
        self.options = opts
        self.dataset = dataset
        decoder = getattr(dataset, "fields", None)  # a field pack's PackedDataset: its image and variable fields
        self._image_fields: set[Any] | None = (set(decoder.schema.image_fields) if isinstance(decoder, FieldDecoder)
                                               else None)
        self._variable: set[Any] | None = set(decoder.variable) if isinstance(decoder, FieldDecoder) else None
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
        self._resume: tuple[int, int, list[tuple[int, int]]] | None = None  # (epoch, position, resumes)
        self._pass = (0, 0, [])  # the current pass: epoch, its first position, its resumes
        self._consumed = 0  # samples of the current pass's batches handed to the caller
        self.on_corrupt, self.max_skipped = opts.on_corrupt, opts.max_skipped
        self._skip_cap = skip_cap(opts.on_corrupt, opts.max_skipped, self._samples())
        self._skip_lock = threading.Lock()
        self._skipped: list[dict[str, Any]] = []  # this pass's skips: index, key, reason
        self._skipped_at: list[int] = []  # ... and the epoch position each was skipped at (-1: before a resume)
        self._restored_skips: tuple[int, list[int]] | None = None  # (epoch, indices) from load_state_dict
        self._restored: list[int] = []  # restored skips the pass has not met again (counted already)
        self._bad: set[int] = set()  # indices found damaged in this pass

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch``'s order for the next pass (reaches the sampler and the dataset too)."""
        self._epoch = int(epoch)
        if self._resume is not None and self._resume[0] != int(epoch):
            self._resume = None
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
        """This rank's sample indices of ``epoch`` in order (default: the next pass's; after
        ``load_state_dict``, the rest of the resumed epoch)."""
        if self.sampler is not None:
            return np.fromiter((int(i) for i in self.sampler), dtype=np.int64)
        if epoch is None:
            epoch = self._epoch if self._epoch is not None else self._next_epoch
        position, resumes = 0, []
        if self._resume is not None and self._resume[0] == epoch:
            _, position, resumes = self._resume
        return self._indices(epoch, resumes)[position:]

    def _indices(self, epoch: int, resumes: list[tuple[int, int]]) -> np.ndarray:
        return epoch_indices(len(self.dataset), shuffle=self.shuffle, seed=self.seed, epoch=epoch,
                             rank=self.rank, world_size=self.world_size, drop_last=self.drop_last,
                             resumes=resumes)

    def __iter__(self) -> Iterator[Any]:
        epoch = self._epoch if self._epoch is not None else self._next_epoch
        indices = self.indices(epoch)
        position, resumes = 0, []
        if self._resume is not None and self._resume[0] == epoch:
            _, position, resumes = self._resume
        self._resume = None
        self._pass, self._consumed = (epoch, position, resumes), 0
        restored = self._restored_skips[1] if self._restored_skips and self._restored_skips[0] == epoch else []
        self._skipped = [{"index": i, "key": self._key(i), "reason": "skipped before the resume"} for i in restored]
        self._skipped_at, self._restored, self._bad = [-1] * len(restored), list(restored), set(restored)
        self._restored_skips = None
        self._next_epoch, self._epoch = epoch + 1, None
        return Epoch(self, indices).run()

    def state_dict(self) -> dict[str, Any]:
        """Where this rank is: the current pass's epoch and the samples of it handed out so far
        (a batch counts once yielded), with what it ran on (plain JSON). With ``on_corrupt="skip"``
        its ``skipped`` are the skips before that position (``carried_skips``): the threads' skips
        ahead of it are met again by the resumed pass. See ``load_state_dict``."""
        if self.sampler is not None:
            raise UsageError("cannot save a Loader with a sampler: the sampler decides the order "
                             "(save the sampler's own state)")
        epoch, start, resumes = self._pass
        position = start + self._consumed
        with self._skip_lock:  # the skips before the position: the threads' ones ahead are met again
            skipped = carried_skips(zip([r["index"] for r in self._skipped], self._skipped_at), position)
        return {"epoch": epoch, "position": position, "seed": self.seed, "shuffle": self.shuffle,
                "drop_last": self.drop_last, "world_size": self.world_size, "rank": self.rank,
                "count": len(self.dataset), "resumes": [list(r) for r in resumes],
                **({"skipped": skipped} if self.on_corrupt == "skip" else {})}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The next pass yields the rest of ``state``'s epoch (``set_epoch`` with that epoch keeps it).

        On the world size the state was taken on, this rank continues its own order; on another
        (elastic resume) the samples no rank has read yet are split again evenly over the new
        ranks, each read once (``epoch_indices``); later epochs are a fresh run's on this world
        size. Refused with ``UsageError`` naming why when the seed, shuffle, drop_last or dataset
        size differ, or the position does not fit.
        """
        if self.sampler is not None:
            raise UsageError("cannot resume a Loader with a sampler: the sampler decides the order")
        for k in ("seed", "shuffle", "drop_last", "count"):
            mine = getattr(self, k) if k != "count" else len(self.dataset)
            if k in state and state[k] != mine:
                raise UsageError(f"cannot resume: state has {k}={state[k]!r}, this loader {mine!r}")
        epoch, position, resumes = resume_point(state, self.world_size,
                                                lambda e, r: len(self._indices(e, r)))
        self._resume = (epoch, position, resumes)
        self._epoch = epoch
        if self.on_corrupt == "skip":
            self._restored_skips = (epoch, [int(i) for i in state.get("skipped", [])])

    @property
    def skipped(self) -> list[dict[str, Any]]:
        """The current pass's skipped samples: ``{"index", "key", "reason"}`` each, in the order met."""
        with self._skip_lock:
            return list(self._skipped)

    def _key(self, index: int) -> Any:
        keys = getattr(self.dataset, "keys", None)
        try:
            return keys[index] if keys is not None else None
        except Exception:  # noqa: BLE001 - the key is only a hint
            return None

    def _record_skip(self, index: int, e: BaseException, *, at: int) -> None:
        """Count the corrupt sample at position ``at`` of this pass's order against
        ``max_skipped`` (one a loaded state carried is counted already); raise past it."""
        key = self._key(index)
        with self._skip_lock:
            self._bad.add(index)
            if index in self._restored:
                self._restored.remove(index)
                return
            if len(self._skipped) + 1 > self._skip_cap:
                raise CorruptData(str(getattr(self.dataset, "path", "")),
                                  f"corrupt sample {index} ({key!r}) would be skipped sample {len(self._skipped) + 1} "
                                  f"of this pass, more than max_skipped={self.max_skipped!r}: {e}",
                                  key=key, position=index) from e
            self._skipped.append({"index": index, "key": key, "reason": str(e)})
            self._skipped_at.append(self._pass[1] + at)
            n = len(self._skipped)
        log.warning("skipping corrupt sample %d (%r; %d skipped this pass): %s", index, key, n, e)

    def _where(self, index: int) -> str:
        key = self._key(index)
        where = f" ({key!r})" if key is not None else ""
        path = getattr(self.dataset, "path", None)
        return f"{where} of {path}" if path else where

    def __repr__(self) -> str:
        return (f"Loader({type(self.dataset).__name__}, batch_size={self.batch_size}, shuffle={self.shuffle}, "
                f"num_threads={self.num_threads}, rank={self.rank}/{self.world_size})")

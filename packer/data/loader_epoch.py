"""One pass of a ``packer.data.loader.Loader``: the loader threads, the batches in flight and
how each batch is assembled into reused uint8 buffers (the buffer contract: see ``loader``).
"""
from __future__ import annotations

import queue
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator

import numpy as np
import torch
from torch.utils.data import default_collate

from packer.errors import PackerError
from packer.data.batchbuf import as_image, copy_into

if TYPE_CHECKING:
    from packer.data.loader import Loader

__all__ = ["Epoch", "LoaderError"]

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
    samples: list | None = None  # user collate: the samples by position
    error: tuple[int, BaseException] | None = None
    result: Any = None


class Epoch:
    """The threads and in-flight batches of one ``Loader`` pass; closes cleanly from anywhere
    (``run()`` yields the batches in order)."""

    def __init__(self, loader: "Loader", indices: np.ndarray):
        self.loader = loader
        self.batches = [indices[i:i + loader.batch_size] for i in range(0, len(indices), loader.batch_size)]
        if loader.drop_last and self.batches and len(self.batches[-1]) < loader.batch_size:
            self.batches.pop()
        self.tasks: queue.Queue = queue.Queue()
        self.stop = threading.Event()
        self.inflight: dict[int, _Batch] = {}
        self.next_submit = 0
        self.threads: list[threading.Thread] = []

    def _start(self) -> None:  # in run(): a pass that is never iterated starts no thread
        for i in range(self.loader.num_threads):
            t = threading.Thread(target=self._work, name=f"{_THREAD_PREFIX}-{i}", daemon=True)
            self.threads.append(t)
            t.start()

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
                b.arrays.clear()  # (numpy views count as references to the buffer)
                for buf in b.images.values():
                    self.loader.pool.release(buf)
                b = None
                yield out
                del out
        finally:
            self.close()

    def close(self) -> None:
        """Stop the threads (they finish the chunk in hand) and wait for them."""
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

    def _fill(self, b: _Batch, start: int, end: int) -> None:
        indices = [int(i) for i in b.indices[start:end]]
        try:
            for j, sample in enumerate(self._fetch(indices), start):
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
        images = {k: as_image(v) for k, v in fields}
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
        for k, buf in b.images.items():
            values[k] = buf[:len(b.indices)]  # a view: its references keep the buffer from reuse
        for k, vals in b.other.items():
            values[k] = default_collate(vals)
        return _rebuild(b.like, values)

"""Batch memory of DataLoader workers: shared-memory buffers reused from batch to batch.

A worker's collate stacks each batch into a new shared-memory segment, which the kernel
allocates, zeroes and maps page by page, the main process maps again, and both free once the
batch is let go: a 3x224x224 uint8 image is about 37 page faults and, for a default
``DataLoader`` with 2 workers, system time of 10-23% of user time (docs/loading.md, "System time
of a DataLoader with workers"). Here a worker keeps a few buffers (``memfd`` segments) and
stacks batches into them again and again.

A buffer is written again only when nothing can still see what it carried:

* no tensor of the worker uses it (the worker holds a weak reference to its view), and
* every batch it sent has been let go in the main process. The main process builds the batch as
  an ordinary tensor over its own mapping of the buffer, kept by the tensor's storage (every view
  of the batch shares it); when that storage is freed a finalizer counts the batch back in the
  buffer's header. Only then may the worker reuse it.

So a training loop that keeps batches, or views of them, keeps their buffers: the worker makes
another (up to ``MAX_BUFFERS``) and then falls back to torch's new segment per batch. Batches
kept across a fork of the main process are never counted back (a forked child may still read
them). A batch in the main process is not torch shared memory: sending it to another process
copies it, as for any tensor. Only a tensor this module stacked, sent whole, travels this way;
anything else a worker returns (a view, a tensor made from it) goes torch's way.

Workers of a DataLoader reading a packer dataset use it with no call (the datasets call
``use_in_worker``, which routes ``default_collate``'s tensors and ``uint8_collate`` here); it
needs Linux's ``memfd_create``. ``PACKER_REUSE_BATCHES=0`` in the environment turns it off.
"""
from __future__ import annotations

import mmap
import os
import threading
import weakref
from multiprocessing.reduction import DupFd, ForkingPickler
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch.multiprocessing.reductions import reduce_tensor
from torch.utils.data import get_worker_info
from torch.utils.data._utils import collate as torch_collate

__all__ = ["enabled", "stack", "use_in_worker"]

MAX_BUFFERS = 8  # per worker: a worker's prefetched batches, the one the main process holds, spares
MIN_BYTES = 1 << 20  # smaller batches (labels, small crops) cost less torch's way
_HEADER = 64  # int64 [sent, released]: each written by one process only, so no lock across processes
_ALIGN = 1 << 16

# the dtypes a buffer carries (the main process views its bytes as the dtype again)
_DTYPES = frozenset({torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
                     torch.bfloat16, torch.float32, torch.float64, torch.bool})


def enabled() -> bool:
    """Whether workers reuse batch buffers here (Linux with memfd, not ``PACKER_REUSE_BATCHES=0``)."""
    return hasattr(os, "memfd_create") and os.environ.get("PACKER_REUSE_BATCHES", "1") != "0"


# -- the worker side ---------------------------------------------------------------------------
class _Buffer:
    """One memfd segment of a worker: a header and room for one batch."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.size = _HEADER + capacity
        self.fd = os.memfd_create("packer-batch", os.MFD_CLOEXEC)
        try:
            os.ftruncate(self.fd, self.size)
            self.map = mmap.mmap(self.fd, self.size)
        except OSError:
            os.close(self.fd)
            raise
        weakref.finalize(self, os.close, self.fd)  # the mapping goes with the arrays over it
        whole = np.frombuffer(self.map, dtype=np.uint8)
        self.header = whole[:_HEADER].view(np.int64)
        self.data = whole[_HEADER:]
        self.address = self.data.ctypes.data
        self.view: weakref.ref | None = None  # the worker's current view of it

    def free(self) -> bool:
        """Nothing in the worker uses it and every batch it sent was let go in the main process."""
        return (self.view is None or self.view() is None) and self.header[0] == self.header[1]

    def take(self, nbytes: int) -> np.ndarray:
        view = self.data[:nbytes]
        self.view = weakref.ref(view)
        return view

    def holds(self, t: torch.Tensor) -> bool:
        start = t.data_ptr()
        return self.address <= start and start + t.numel() * t.element_size() <= self.address + self.capacity


class _Pool:
    def __init__(self) -> None:
        self.buffers: list[_Buffer] = []

    def take(self, nbytes: int) -> tuple[_Buffer, np.ndarray] | None:
        free = [b for b in self.buffers if b.free()]
        fits = [b for b in free if b.capacity >= nbytes]
        if fits:
            buf = min(fits, key=lambda b: b.capacity)
            return buf, buf.take(nbytes)
        if len(self.buffers) >= MAX_BUFFERS:
            if not free:
                return None  # all kept: torch's new segment for this batch
            self.buffers.remove(free[0])  # too small and free: replace it
        try:
            buf = _Buffer(-(-nbytes // _ALIGN) * _ALIGN)
        except OSError:
            return None  # no memfd room (a full /dev/shm-like limit): torch's way
        self.buffers.append(buf)
        return buf, buf.take(nbytes)


_pool: _Pool | None = None  # this process's buffers (a forked child starts without any)


class _BatchTensor(torch.Tensor):
    """A batch this module stacked into a buffer. Operations on it give plain tensors, so only
    the batch itself is sent by buffer; its reducer falls back to torch's when it was moved."""

    __torch_function__ = torch._C._disabled_torch_function_impl

    def __reduce_ex__(self, protocol: int) -> Any:  # plain pickle (not a worker's queue): a tensor
        return self.as_subclass(torch.Tensor).__reduce_ex__(protocol)


def _reduce(t: _BatchTensor) -> Any:
    base = t.as_subclass(torch.Tensor)
    buf: _Buffer | None = t.__dict__.get("_packer_buffer")
    if buf is None or not base.is_contiguous() or not buf.holds(base):  # moved (share_memory_) or foreign
        return reduce_tensor(base)
    buf.header[0] += 1  # sent: only this worker writes it (its queue's one feeder thread)
    return _rebuild, (DupFd(buf.fd), buf.size, _HEADER + base.data_ptr() - buf.address,
                      base.numel() * base.element_size(), tuple(base.shape), str(base.dtype).removeprefix("torch."))


ForkingPickler.register(_BatchTensor, _reduce)


def stack(tensors: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """``torch.stack(tensors)`` into a reused buffer of this worker, or None where it does not
    apply (not in a DataLoader worker, turned off, small or unusual tensors, every buffer kept):
    then the caller stacks torch's way."""
    global _pool
    first = tensors[0]
    if first.dtype not in _DTYPES or first.device.type != "cpu" or first.layout != torch.strided or first.is_nested:
        return None
    nbytes = len(tensors) * first.numel() * first.element_size()
    if nbytes < MIN_BYTES or get_worker_info() is None or not enabled():
        return None
    if _pool is None:
        _pool = _Pool()
    got = _pool.take(nbytes)
    if got is None:
        return None
    buf, view = got
    out = torch.from_numpy(view).view(first.dtype).view(len(tensors), *first.shape)
    torch.stack(tuple(tensors), 0, out=out)
    batch = out.as_subclass(_BatchTensor)
    batch.__dict__["_packer_buffer"] = buf
    return batch


# -- the main process --------------------------------------------------------------------------
_forks = 0  # forks of this process since start: a batch kept across one is never counted back
_release_lock = threading.Lock()  # finalizers run in the training loop's and pin_memory's threads


def _after_fork_in_parent() -> None:
    global _forks
    _forks += 1


def _after_fork_in_child() -> None:  # a DataLoader worker forked from the training process
    global _pool, _wired
    _pool, _wired = None, False


os.register_at_fork(after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child)


def _released(header: np.ndarray, pid: int, forks: int) -> None:
    if os.getpid() == pid and _forks == forks:
        with _release_lock:
            header[1] += 1


def _rebuild(fd: Any, size: int, offset: int, nbytes: int, shape: tuple[int, ...], dtype: str) -> torch.Tensor:
    """In the receiving process: the batch as an ordinary tensor over a mapping of the buffer,
    counted back in the buffer's header when its storage is freed."""
    handle = fd.detach()
    try:
        mapping = mmap.mmap(handle, size)
    finally:
        os.close(handle)
    whole = np.frombuffer(mapping, dtype=np.uint8)
    view = whole[offset:offset + nbytes]
    weakref.finalize(view, _released, whole[:_HEADER].view(np.int64), os.getpid(), _forks)
    return torch.from_numpy(view).view(getattr(torch, dtype)).view(shape)


# -- wiring into a DataLoader worker ------------------------------------------------------------
_wired = False  # use_in_worker has looked at this process (reset in a forked child)
_torch_collate_tensor: Callable[..., torch.Tensor] = torch_collate.collate_tensor_fn


def _collate_tensor(batch: Sequence[torch.Tensor], *, collate_fn_map: Any = None) -> torch.Tensor:
    """``default_collate`` for tensors: into a reused buffer where ``stack`` applies."""
    out = stack(batch)
    return out if out is not None else _torch_collate_tensor(batch, collate_fn_map=collate_fn_map)


def use_in_worker() -> None:
    """Route this DataLoader worker's ``default_collate`` tensors through reused buffers (once
    per process; nothing outside a worker or when turned off). packer's datasets call it."""
    global _wired
    if _wired:  # the per-sample cost: one global read
        return
    _wired = True
    if get_worker_info() is None or not enabled():
        return
    fn_map = torch_collate.default_collate_fn_map
    if fn_map.get(torch.Tensor) is _torch_collate_tensor:
        fn_map[torch.Tensor] = _collate_tensor

"""Feed a training loop: uint8 batches, pinned, copied ahead on a side CUDA stream, normalized there.

Batches stay uint8 from decode to the device (4x fewer bytes over PCIe than float32 and no
float work on the host); ``uint8_collate`` stacks them without converting. ``DevicePrefetcher``
wraps any DataLoader that yields ``(images, labels, ...)`` tuples or dicts, and yields the same
structure with every image/clip batch normalized on the device and every other tensor moved
there. Without CUDA it does the same math on the CPU, so one training script runs anywhere::

    loader = DataLoader(PackedDataset(path, decode=DecodeResizeCrop(256, 224)), batch_size=256,
                        num_workers=8, pin_memory=True, collate_fn=uint8_collate, shuffle=True)
    for images, labels in DevicePrefetcher(loader, IMAGENET_MEAN, IMAGENET_STD,
                                           dtype=torch.bfloat16, channels_last=True):
        ...

``DevicePrefetcher.cache(dataset, ...)`` is the small-dataset path: decode once into one
uint8 tensor on the device, serve shuffled batches by indexing there (``packer.data.cache``).
"""
from __future__ import annotations

import collections
import logging
from collections.abc import Mapping
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np
import torch
from PIL import Image
from torch.utils.data import default_collate, get_worker_info

from packer.data.normalize import IMAGENET_MEAN, IMAGENET_STD, Normalize

__all__ = ["DevicePrefetcher", "uint8_collate", "IMAGENET_MEAN", "IMAGENET_STD"]

log = logging.getLogger(__name__)


# -- collate ---------------------------------------------------------------------------------
def _as_uint8_tensor(x: Any) -> torch.Tensor | None:
    """A channels-first uint8 tensor view of an image/clip, or None when ``x`` is not one.

    uint8 tensors are taken as they are (C x H x W, T x C x H x W, C x T x H x W); uint8
    arrays are channels-last as decoders return them (H x W x C, T x H x W x C) and are
    viewed channels-first; PIL images become C x H x W.
    """
    if isinstance(x, torch.Tensor):
        return x if x.dtype == torch.uint8 else None
    if isinstance(x, Image.Image):
        x = np.asarray(x)
        if x.ndim == 2:
            x = x[:, :, None]
    if isinstance(x, np.ndarray) and x.dtype == np.uint8 and x.ndim in (3, 4):
        t = torch.from_numpy(x if x.flags.writeable else x.copy())
        return t.permute(2, 0, 1) if x.ndim == 3 else t.permute(0, 3, 1, 2)
    return None


def _stack_uint8(items: list[torch.Tensor]) -> torch.Tensor:
    shape = items[0].shape
    for t in items:
        if t.shape != shape:
            raise ValueError(f"images in one batch differ in shape: {tuple(shape)} and {tuple(t.shape)}; "
                             f"resize/crop them to one size (e.g. decode=DecodeResizeCrop(256, 224))")
    out = None
    if get_worker_info() is not None:
        # In a worker: stack straight into shared memory, so the batch crosses to the main
        # process without another copy (what default_collate does for tensors).
        numel = len(items) * items[0].numel()
        storage = items[0]._typed_storage()._new_shared(numel, device=items[0].device)
        out = items[0].new(storage).resize_(len(items), *shape)
    return torch.stack(items, 0, out=out)


def uint8_collate(batch: Sequence[Any]) -> Any:
    """Collate samples keeping images uint8: stack them channels-first, never convert to float.

    Samples may be tuples, lists or dicts; image fields (uint8 tensors, uint8 arrays, PIL
    images) become one ``N x C x H x W`` (or ``N x T x C x H x W``) uint8 tensor, everything
    else goes through ``default_collate`` (ints become an int64 tensor). Raises ValueError when
    the images of one batch differ in shape.
    """
    if not batch:
        raise ValueError("cannot collate an empty batch")
    elem = batch[0]
    if isinstance(elem, Mapping):
        return {k: uint8_collate([b[k] for b in batch]) for k in elem}
    if isinstance(elem, tuple) and hasattr(elem, "_fields"):  # namedtuple
        return type(elem)(*(uint8_collate(list(f)) for f in zip(*batch)))
    if isinstance(elem, (tuple, list)) and not isinstance(elem, str):
        if any(len(b) != len(elem) for b in batch):
            raise ValueError("samples in one batch have different numbers of fields")
        fields = [uint8_collate(list(f)) for f in zip(*batch)]
        return tuple(fields) if isinstance(elem, tuple) else fields
    first = _as_uint8_tensor(elem)
    if first is not None:
        items = [first] + [_as_uint8_tensor(b) for b in batch[1:]]
        if any(t is None for t in items):
            raise ValueError("a batch mixes uint8 images with other types")
        return _stack_uint8(items)
    return default_collate(list(batch))


# -- batch structure ---------------------------------------------------------------------------
def _map_batch(batch: Any, fn: Callable[[torch.Tensor, bool], torch.Tensor],
               fields: frozenset | None, top: bool = True) -> Any:
    """Apply ``fn(tensor, is_image)`` to every tensor of a tuple/list/dict batch."""
    def pick(key: Any, value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            if fields is None:
                is_image = value.dtype == torch.uint8 and value.dim() in (4, 5)
            else:
                is_image = top and key in fields
            return fn(value, is_image)
        if isinstance(value, (Mapping, tuple, list)):
            return _map_batch(value, fn, fields, top=False)
        return value

    if isinstance(batch, torch.Tensor):
        return pick(0, batch)
    if isinstance(batch, Mapping):
        return {k: pick(k, v) for k, v in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(pick(i, v) for i, v in enumerate(batch)))
    if isinstance(batch, (tuple, list)):
        return type(batch)(pick(i, v) for i, v in enumerate(batch))
    return batch


def _tensors(batch: Any) -> Iterator[torch.Tensor]:
    if isinstance(batch, torch.Tensor):
        yield batch
    elif isinstance(batch, Mapping):
        for v in batch.values():
            yield from _tensors(v)
    elif isinstance(batch, (tuple, list)):
        for v in batch:
            yield from _tensors(v)


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``None`` -> the current CUDA device when CUDA is available, else the CPU."""
    if device is None:
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    device = torch.device(device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {device} requested but CUDA is not available")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
    return device


class _Slot:
    """One batch in flight: the host batch (kept alive until handed over), the device batch,
    and the event recorded on the side stream after its copy and normalization."""

    __slots__ = ("host", "out", "event")

    def __init__(self, host: Any, out: Any, event: Any):
        self.host, self.out, self.event = host, out, event


class DevicePrefetcher:
    """Iterate a loader with batches copied ahead to ``device`` and normalized there.

    Args:
        loader: any iterable of batches (usually a DataLoader with ``collate_fn=uint8_collate``
            and ``pin_memory=True``); ``len(prefetcher)`` is ``len(loader)``.
        mean, std: per-channel values on the 0..1 scale (ImageNet's by default).
        device: where batches go; ``None`` = the current CUDA device, else the CPU.
        channels_last: images in ``channels_last`` memory format (clips: ``channels_last_3d``).
        dtype: float32 (bit-exact with CPU math), float16 or bfloat16.
        layout: ``"NTCHW"`` / ``"NCTHW"`` for clip batches; ``None`` infers it from the channels.
        fields: which top-level tuple positions / dict keys hold images; ``None`` = every uint8
            tensor with 4 or 5 dimensions. Other tensors are moved to the device unchanged.
        batches_ahead: batches in flight on the device ahead of the one being consumed (CUDA).

    The same object can be iterated once per epoch; each iteration starts the loader afresh.
    """

    def __init__(self, loader: Iterable[Any], mean: Sequence[float] = IMAGENET_MEAN,
                 std: Sequence[float] = IMAGENET_STD, *, device: str | torch.device | None = None,
                 channels_last: bool = False, dtype: torch.dtype = torch.float32,
                 layout: str | None = None, fields: Iterable[Any] | None = None, batches_ahead: int = 1):
        if batches_ahead < 1:
            raise ValueError(f"batches_ahead must be >= 1, got {batches_ahead}")
        self.loader = loader
        self.normalize = Normalize(mean, std, dtype=dtype, channels_last=channels_last, layout=layout)
        self.device = resolve_device(device)
        self.fields = None if fields is None else frozenset(fields)
        self.batches_ahead = batches_ahead

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __repr__(self) -> str:
        return f"DevicePrefetcher({self.loader!r}, device={self.device}, {self.normalize!r})"

    def __iter__(self) -> Iterator[Any]:
        if self.device.type == "cuda":
            return self._iter_cuda()
        return self._iter_sync()

    # -- no CUDA: the same math, synchronously ------------------------------------------------
    def _iter_sync(self) -> Iterator[Any]:
        def move(t: torch.Tensor, is_image: bool) -> torch.Tensor:
            t = t.to(self.device)
            return self.normalize(t) if is_image else t

        for batch in self.loader:
            yield _map_batch(batch, move, self.fields)

    # -- CUDA: side stream, pinned memory, one event per slot --------------------------------
    def _iter_cuda(self) -> Iterator[Any]:
        device = self.device
        side = torch.cuda.Stream(device=device)
        # Every kernel the consumer queued before now (e.g. the model's last step, or the
        # copies of mean/std) comes before our first copy and normalization.
        side.wait_stream(torch.cuda.current_stream(device))
        events = collections.deque(torch.cuda.Event() for _ in range(self.batches_ahead))
        loader_it = iter(self.loader)
        slots: collections.deque[_Slot] = collections.deque()
        failed: list[Exception] = []  # raised once the batches before it are handed over

        def stage(event: Any) -> bool:
            if failed:
                return False
            try:
                host = next(loader_it)
            except StopIteration:
                return False
            except Exception as e:  # noqa: BLE001 - re-raised below, in the loader's order
                failed.append(e)
                return False
            # Pageable memory makes a non_blocking copy synchronous: pin it first (a no-op
            # when the DataLoader already pinned it with pin_memory=True).
            host = _map_batch(host, lambda t, _: t.pin_memory() if t.device.type == "cpu" and not t.is_pinned()
                              else t, None)

            def to_device(t: torch.Tensor, is_image: bool) -> torch.Tensor:
                d = t.to(device, non_blocking=True)
                return self.normalize(d) if is_image else d

            with torch.cuda.stream(side):
                out = _map_batch(host, to_device, self.fields)
                event.record(side)
            slots.append(_Slot(host, out, event))
            return True

        for _ in range(self.batches_ahead):
            if not stage(events.popleft()):
                break
        while slots:
            slot = slots.popleft()
            consumer = torch.cuda.current_stream(device)
            consumer.wait_event(slot.event)
            # Why the memory of a handed-over batch stays valid: its tensors were allocated
            # on the side stream, so the caching allocator ties their blocks to that stream.
            # When the consumer drops them, the allocator would hand the blocks to the next
            # allocation on the side stream at once, and our next copy could overwrite them
            # while the consumer's kernels queued on its own stream still read them.
            # record_stream(consumer) makes the allocator wait, on free, for the consumer's
            # work queued up to that point. The uint8 device copies that normalization reads
            # are allocated, used and freed on the side stream only, so stream order already
            # protects them. The pinned host batch is kept in the slot until it is handed over;
            # after that, PyTorch's pinned-memory allocator itself keeps the block until the
            # non_blocking copy that read it (an event on the side stream) has completed.
            for t in _tensors(slot.out):
                if t.device.type == "cuda":
                    t.record_stream(consumer)
            # Queue the next batch before handing this one over, so its copy overlaps the
            # consumer's step; it reuses this slot's event (the consumer's wait on it is
            # already enqueued, and CUDA waits bind to the record made before the wait).
            stage(slot.event)
            out = slot.out
            slot.host = slot.out = None
            yield out
        if failed:  # as without CUDA: every batch the loader gave before its error comes first
            raise failed[0]

    # -- small datasets: one uint8 tensor on the device -------------------------------------
    @staticmethod
    def cache(dataset: Any, mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD,
              **kwargs: Any):
        """Decode ``dataset`` once into one uint8 tensor on the device; iterate shuffled batches.

        Returns a ``packer.data.cache.DeviceCache`` (see it for the keyword arguments:
        ``batch_size``, ``shuffle``, ``drop_last``, ``seed``, ``device``, ``dtype``,
        ``channels_last``, ``layout``, ``num_workers``, ``progress``).
        """
        from packer.data.cache import DeviceCache

        return DeviceCache.build(dataset, mean, std, **kwargs)

"""Batches on the device: normalization, the prefetcher that copies them ahead, and the device cache.

Per-channel normalization of uint8 image and clip batches, on whatever device they are.

``(x - mean * 255) / (std * 255)`` computed in float32 (exact for uint8 input: the same
IEEE subtraction and division on every device, so CPU and CUDA agree bit for bit), then
cast to the requested dtype. Batches are ``N x C x H x W`` images or ``N x T x C x H x W`` /
``N x C x T x H x W`` clips.

Feed a training loop: uint8 batches, pinned, copied ahead on a side CUDA stream, normalized there.

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
uint8 tensor on the device, serve shuffled batches by indexing there (``packer.data.device``).

Small datasets held whole on the device: decode once, serve shuffled batches by indexing.

``DeviceCache.build(dataset, ...)`` (also ``DevicePrefetcher.cache``) decodes every sample
once into one ``N x ...`` uint8 tensor on the device (GPU memory with CUDA, host memory
without), and each epoch draws a permutation on that device and gathers + normalizes batches
there: no per-epoch CPU work, no DataLoader workers. For datasets whose decoded size fits,
``cache_bytes`` and ``free_memory`` tell (``packer bench`` reports both).
"""
from __future__ import annotations

import collections
import dataclasses
import logging
import math
import os
from collections.abc import Mapping
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, default_collate, get_worker_info
from tqdm import tqdm

from packer.data import batch_memory
from packer.errors import UsageError

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "LAYOUTS", "Normalize", "DevicePrefetcher", "uint8_collate",
           "DeviceCache", "CacheBatches", "cache_bytes", "free_memory"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
LAYOUTS = ("NCHW", "NTCHW", "NCTHW")
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class Normalize:
    """Normalize uint8 batches: ``(x - mean*255) / (std*255)`` in float32, cast to ``dtype``.

    Args:
        mean: per-channel means on the 0..1 scale (ImageNet's by default).
        std: per-channel standard deviations on the 0..1 scale, all > 0.
        dtype: float32, float16 or bfloat16.
        channels_last: return images in ``channels_last`` (clips ``N C T H W`` in
            ``channels_last_3d``; ``N T C H W`` clips with the channel innermost).
        layout: ``"NTCHW"`` or ``"NCTHW"`` for clips; ``None`` tells them apart by which
            dimension has ``len(mean)`` entries (an error when both do).
    """

    def __init__(self, mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD,
                 *, dtype: torch.dtype = torch.float32, channels_last: bool = False,
                 layout: str | None = None):
        mean, std = tuple(float(m) for m in mean), tuple(float(s) for s in std)
        if not mean or len(mean) != len(std):
            raise ValueError(f"mean and std need one value per channel, got {len(mean)} and {len(std)}")
        if not all(math.isfinite(m) for m in mean) or not all(math.isfinite(s) and s > 0 for s in std):
            raise ValueError(f"mean must be finite and std finite and > 0, got mean={mean} std={std}")
        if dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of float32, float16, bfloat16, not {dtype}")
        if layout is not None and layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS} or None, not {layout!r}")
        self.mean, self.std, self.dtype = mean, std, dtype
        self.channels_last, self.layout = channels_last, layout
        # The constants are float32 products, as the reference formula computes them.
        self._mean255 = torch.tensor(mean, dtype=torch.float32) * 255
        self._std255 = torch.tensor(std, dtype=torch.float32) * 255
        self._on: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    @property
    def channels(self) -> int:
        return len(self.mean)

    def __repr__(self) -> str:
        return (f"Normalize(mean={self.mean}, std={self.std}, dtype={self.dtype}, "
                f"channels_last={self.channels_last}, layout={self.layout})")

    def constants(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """mean*255 and std*255 on ``device`` (copied there once)."""
        if device not in self._on:
            self._on[device] = (self._mean255.to(device), self._std255.to(device))
        return self._on[device]

    def channel_dim(self, shape: Sequence[int]) -> int:
        """Which dimension of a batch of ``shape`` holds the channels (ValueError if none fits)."""
        c = self.channels
        if len(shape) == 4:
            if shape[1] != c:
                raise ValueError(f"expected images N x {c} x H x W (channels first, as uint8_collate "
                                 f"makes them), got shape {tuple(shape)}")
            return 1
        if len(shape) != 5:
            raise ValueError(f"expected a batch of images (4 dims) or clips (5 dims), got shape {tuple(shape)}")
        layout = self.layout
        if layout is None:
            t_first, c_first = shape[2] == c, shape[1] == c
            if t_first and c_first:
                raise ValueError(f"clip batch {tuple(shape)} is ambiguous: pass layout='NTCHW' or 'NCTHW'")
            if not (t_first or c_first):
                raise ValueError(f"clip batch {tuple(shape)} has no dimension of {c} channels "
                                 f"(expected N x T x {c} x H x W or N x {c} x T x H x W)")
            layout = "NTCHW" if t_first else "NCTHW"
        cdim = 2 if layout == "NTCHW" else 1
        if shape[cdim] != c:
            raise ValueError(f"clip batch {tuple(shape)} does not match layout {layout} with {c} channels")
        return cdim

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """Normalize one uint8 batch on its own device."""
        if x.dtype != torch.uint8:
            raise ValueError(f"expected a uint8 batch, got {x.dtype} (collate with uint8_collate)")
        cdim = self.channel_dim(x.shape)
        view = [1] * x.dim()
        view[cdim] = self.channels
        mean, std = self.constants(x.device)
        y = x.to(torch.float32).sub_(mean.view(view)).div_(std.view(view))
        if self.dtype != torch.float32:
            y = y.to(self.dtype)
        if self.channels_last:
            y = _channels_last(y, cdim)
        return y


def _channels_last(y: torch.Tensor, cdim: int) -> torch.Tensor:
    if y.dim() == 4:
        return y.contiguous(memory_format=torch.channels_last)
    if cdim == 1:
        return y.contiguous(memory_format=torch.channels_last_3d)
    # N T C H W: same shape, channel stride 1 (the per-frame channels_last layout).
    return y.permute(0, 1, 3, 4, 2).contiguous().permute(0, 1, 4, 2, 3)

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
    pooled = batch_memory.stack(items)  # in a worker: a reused shared-memory buffer (batch_memory)
    if pooled is not None:
        return pooled
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
    # ``DevicePrefetcher.cache(dataset, ...)`` is ``DeviceCache.build`` (assigned below it).
    cache: Callable[..., "DeviceCache"]

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


_BATCHES = CacheBatches()


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
              num_workers: int = 0, progress: bool = True, batch_size: int = _BATCHES.batch_size,
              shuffle: bool = _BATCHES.shuffle, drop_last: bool = _BATCHES.drop_last,
              seed: int = _BATCHES.seed) -> "DeviceCache":
        """Decode ``dataset`` (``(image, label)`` samples of one shape) into a cache on ``device``.

        ``batches`` (a ``CacheBatches``: ``batch_size``, ``shuffle``, ``drop_last``, ``seed``)
        says how the cache is served; its fields may also be given as keywords (one not left at
        its default overrides the object's). ``mean``,
        ``std``, ``dtype``, ``channels_last`` and ``layout`` are ``Normalize``'s. Decoding runs
        once through a DataLoader with ``num_workers`` workers. Raises ``UsageError`` when the
        cache would not fit in the device's free memory and ValueError when samples differ in shape.
        """
        normalize = Normalize(mean, std, dtype=dtype, channels_last=channels_last, layout=layout)
        given = dict(batch_size=batch_size, shuffle=shuffle, drop_last=drop_last, seed=seed)
        batches = dataclasses.replace(batches or _BATCHES, **{k: v for k, v in given.items()
                                                              if v != getattr(_BATCHES, k)})
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


# Decode a dataset once into one uint8 tensor on the device and iterate shuffled batches, where
# users of the prefetcher look for it: the same call as ``DeviceCache.build``.
DevicePrefetcher.cache = staticmethod(DeviceCache.build)  # type: ignore[assignment]

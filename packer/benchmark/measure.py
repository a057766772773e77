"""``packer bench``'s measuring loop: what it reads (the decode pipeline, the original files for
``--against``) and how one setting is timed (``measure``), the ceiling's replayed batches included.
"""
from __future__ import annotations

import os
import resource
import statistics
import time
from typing import Any, Callable, Iterable, Sequence

from packer.errors import UsageError

__all__ = ["DECODES", "make_decode", "FolderDataset", "measure", "Replay", "timed_loader", "sample_bytes", "clip_rate"]

DECODES = ("fast", "pil", "tensor")


def make_decode(decode: str, resize: int, crop: int) -> Any:
    """The decode pipeline behind ``--decode``: a PackedDataset ``decode=`` value."""
    from packer.data.decode import DecodeResizeCrop, PilResizeCrop

    if decode == "fast":
        return DecodeResizeCrop(resize, crop)
    if decode == "pil":
        return PilResizeCrop(resize, crop)
    if decode == "tensor":
        return "tensor"
    raise UsageError(f"--decode must be one of {', '.join(DECODES)}, not {decode!r}")


class FolderDataset:
    """The original files of an ImageFolder tree, read and decoded like a packed dataset."""
    # Reads files as FrameDataset does (read, decode, wrap the error) for a different input: kept apart.

    def __init__(self, root: str | os.PathLike, decode: Any):
        from packer.data.datasets import decode_record
        from packer.conversion.inputs import image_folder

        self.items, self.classes = image_folder(root)
        if not self.items:
            raise UsageError(f"{root}: no images found")
        self.decode = decode
        self._decode_record = decode_record

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        item = self.items[index]
        with open(item.path, "rb") as f:
            data = f.read()
        if callable(self.decode):
            return self.decode(data), item.label
        return self._decode_record(data, self.decode, where=item.path), item.label


def _device_sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(batches: Iterable[Any], *, device: Any, steps: int, batch_size: int, model_ms: float,
            tick: Callable[[], None], normalize: bool = True) -> dict[str, Any]:
    """Time one epoch of ``batches`` through a simulated model step of ``model_ms``, each batch
    first normalized by a ``DevicePrefetcher`` on ``device`` where ``normalize`` (a loader row on
    the CPU is not: it times what a script iterating the loader gets, see ``child``)."""
    from packer.data.device import DevicePrefetcher

    step_s = model_ms / 1000.0
    t0 = time.perf_counter()
    it = iter(DevicePrefetcher(batches, device=device) if normalize else batches)
    first = next(it)
    _device_sync(device)
    first_s = time.perf_counter() - t0
    del first
    tick()
    if step_s:
        time.sleep(step_s)
    waits: list[float] = []
    start = time.perf_counter()
    for _ in range(steps):
        t = time.perf_counter()
        batch = next(it, None)
        if batch is None:
            break
        waits.append(time.perf_counter() - t)
        del batch
        tick()
        if step_s:
            time.sleep(step_s)
    _device_sync(device)
    elapsed = max(time.perf_counter() - start, 1e-9)
    del it
    samples = len(waits) * batch_size
    median = statistics.median(waits) if waits else 0.0
    waits.sort()
    p95 = waits[min(len(waits) - 1, int(0.95 * len(waits)))] if waits else 0.0
    return {"samples_per_s": samples / elapsed, "first_batch_s": first_s,
            "worker_startup_s": max(0.0, first_s - elapsed / max(len(waits), 1)),
            "wait_ms_median": 1000 * median, "wait_ms_p95": 1000 * p95}


class Replay:
    """``count`` batches replayed from a few held in memory (the ceiling's input)."""

    def __init__(self, batches: Sequence[Any], count: int):
        self.batches, self.count = batches, count

    def __len__(self) -> int:
        return self.count

    def __iter__(self):
        for i in range(self.count):
            yield self.batches[i % len(self.batches)]


def timed_loader(dataset: Any, *, num_workers: int, batch_size: int, batches: int, seed: int, pin: bool):
    """The DataLoader a setting times: ``batches`` seeded random batches through ``uint8_collate``."""
    import torch
    from torch.utils.data import DataLoader, RandomSampler

    from packer.data.device import uint8_collate

    sampler = RandomSampler(dataset, num_samples=batches * batch_size,
                            generator=torch.Generator().manual_seed(seed))
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=num_workers,
                      collate_fn=uint8_collate, pin_memory=pin)


def sample_bytes(reader: Any, limit: int = 64) -> float:
    """Mean stored bytes of up to ``limit`` samples spread over ``reader``."""
    n = len(reader)
    idx = range(0, n, max(1, n // limit))
    sizes = [len(reader.read(i).data) for i in idx]
    return sum(sizes) / max(len(sizes), 1)


def _cpu_s() -> float:
    """CPU seconds of this process (user + system)."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    return me.ru_utime + me.ru_stime


def clip_rate(spec: dict[str, Any]) -> dict[str, Any]:
    """Time ``spec["clips"]`` clips of ``spec["path"]`` with ``spec["sampling"]`` in this process on
    one thread (a fresh process's side of ``packer.benchmark.video``): clips/s, CPU ms per clip."""
    import cv2
    import numpy as np
    import torch

    from packer.data.video import ClipSampling, PackedVideoDataset

    torch.set_num_threads(1)  # as in a DataLoader worker
    cv2.setNumThreads(1)
    ds = PackedVideoDataset(spec["path"], sampling=ClipSampling(**spec["sampling"]), seed=spec["seed"])
    order = np.random.RandomState(spec["seed"]).randint(len(ds), size=spec["clips"] + 1)
    ds[int(order[0])]  # opens the storage, warms the page cache like a second epoch
    t, c = time.perf_counter(), _cpu_s()
    for i in order[1:]:
        ds[int(i)]
    wall, cpu = time.perf_counter() - t, _cpu_s() - c
    return {"clips_per_s": spec["clips"] / max(wall, 1e-9), "cpu_ms_per_clip": 1000 * cpu / spec["clips"]}

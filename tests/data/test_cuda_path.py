"""The GPU path on the device: DevicePrefetcher, DeviceCache, Loader and the video datasets.

Every test whose logic also holds on the CPU fallback runs over ``device`` in ("cpu", "cuda"):
the CPU half runs everywhere (CI), the CUDA half where a GPU is present. ``scripts/device_check.sh``
runs this file first whenever a GPU is lent. The CUDA branches covered (packer/data):

* prefetch.py ``resolve_device``: None -> the current CUDA device, "cuda" -> its index;
  ``__iter__`` -> ``_iter_cuda``: side stream waiting on the consumer's, pinning of pageable host
  batches, ``non_blocking`` copies, normalization on the side stream, one event per slot,
  ``consumer.wait_event``, ``record_stream`` of handed-over tensors, the next batch staged before
  the hand-over (overlap), ``batches_ahead``, loader errors raised in the loader's order.
* normalize.py ``Normalize.constants`` per device, float32 math bit-exact with the CPU,
  float16/bfloat16 casts and channels-last formats on the device.
* cache.py ``free_memory`` (``mem_get_info``), ``DeviceCache.build`` into device memory, the
  per-epoch ``randperm`` with a device generator and ``index_select`` there.
* loader.py / batchbuf.py: ``pin_memory=None`` pins when CUDA is present (``BufferPool(pin=True)``
  hands out pinned buffers from PyTorch's caching host allocator).
* bench/run.py: ``packer bench`` on the device (pinned timed loaders, the device's name).
"""
from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from packer.benchmark.run import run_bench
from packer.commands.decode_frames import decode_frames
from packer.commands.pack_images import pack_images
from packer.data import (IMAGENET_MEAN, IMAGENET_STD, DeviceCache, DevicePrefetcher, FrameDataset, Loader,
                         LoaderError, PackedDataset, PackedVideoDataset, uint8_collate)
from packer.data.device import free_memory
from packer.data.device import resolve_device
from packer.data.decode import DecodeResizeCrop
from packer.errors import UsageError
from packer.conversion.options import RunOptions

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs CUDA")
DEVICES = ["cpu", pytest.param("cuda", marks=needs_cuda)]
MEAN = (0.5, 0.25, 0.75)
STD = (0.2, 0.3, 0.125)
HALF_ATOL = {torch.float16: 4e-3, torch.bfloat16: 2.5e-2}


def reference(x: torch.Tensor, mean=MEAN, std=STD, cdim: int = 1) -> torch.Tensor:
    """(x - mean*255) / (std*255) in float32, computed in numpy (independent of packer)."""
    shape = [1] * x.dim()
    shape[cdim] = len(mean)
    m = (np.asarray(mean, dtype=np.float32) * np.float32(255)).reshape(shape)
    s = (np.asarray(std, dtype=np.float32) * np.float32(255)).reshape(shape)
    return torch.from_numpy((x.cpu().numpy().astype(np.float32) - m) / s)


def check_values(got: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    """float32 bit for bit; half precision within its rounding."""
    assert got.dtype == dtype
    if dtype == torch.float32:
        assert torch.equal(got.cpu(), expected)
    else:
        torch.testing.assert_close(got.float().cpu(), expected, atol=HALF_ATOL[dtype], rtol=0)


def lag(device: str, cycles: int) -> None:
    """Queue ``cycles`` of GPU busy-wait on the current stream (the consumer's step); no-op on CPU."""
    if device == "cuda":
        torch.cuda._sleep(cycles)


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


class Filled(Dataset):
    """Sample i: a uint8 image filled with ``i % 251`` and the label i (a batch overwritten by
    another would show in its values)."""

    def __init__(self, n: int, shape=(3, 32, 32), *, fail_at: int | None = None):
        self.n, self.shape, self.fail_at = n, shape, fail_at

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if i == self.fail_at:
            raise KeyError(f"sample {i} is broken")
        return torch.full(self.shape, i % 251, dtype=torch.uint8), i


class Indexed(Dataset):
    """``(image, index)`` of another dataset: lets a shuffled batch name its samples."""

    def __init__(self, ds):
        self.ds = ds

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i: int):
        return self.ds[i][0], i


def random_samples(n: int, shape, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        x = torch.randint(0, 256, shape, generator=g, dtype=torch.uint8)
        x.view(-1)[0], x.view(-1)[-1] = 0, 255
        out.append((x, i))
    return out


def assert_filled(images: torch.Tensor, labels: torch.Tensor) -> None:
    """Every image of a ``Filled`` batch holds its own label's value, nothing else."""
    want = (labels.cpu() % 251).to(torch.float32)
    flat = images.float().cpu().flatten(1)
    assert torch.equal(flat.amax(1), want) and torch.equal(flat.amin(1), want)


@pytest.fixture(scope="module")
def packed_lmdb(image_folder, tmp_path_factory):
    out = tmp_path_factory.mktemp("cuda_lmdb") / "lmdb"
    pack_images(image_folder, out, format="lmdb", run_options=RunOptions(workers=0))
    return out


# -- DevicePrefetcher -------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape,cdim,fmt", [
    ((3, 17, 23), 1, torch.channels_last),      # images N x C x H x W
    ((3, 5, 9, 11), 1, torch.channels_last_3d),  # clips N x C x T x H x W
    ((5, 3, 9, 11), 2, None),                    # clips N x T x C x H x W: channel stride 1
])
def test_normalization_matches_the_cpu_reference(device, dtype, shape, cdim, fmt):
    samples = random_samples(10, shape)
    expected = reference(torch.stack([s[0] for s in samples]), cdim=cdim)
    for channels_last in (False, True):
        loader = DataLoader(samples, batch_size=4, collate_fn=uint8_collate, pin_memory=device == "cuda")
        batches = list(DevicePrefetcher(loader, MEAN, STD, device=device, dtype=dtype, channels_last=channels_last))
        assert [len(b[0]) for b in batches] == [4, 4, 2]
        for images, labels in batches:
            assert images.device.type == device and labels.device.type == device
            if channels_last and fmt is not None:
                assert images.is_contiguous(memory_format=fmt)
            elif channels_last:
                assert images.stride(2) == 1
            else:
                assert images.is_contiguous()
        check_values(torch.cat([b[0] for b in batches]), expected, dtype)
        assert torch.cat([b[1] for b in batches]).tolist() == list(range(10))


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_cuda_output_equals_the_cpu_paths(dtype):
    """The one training script that runs anywhere gets the same numbers on either device."""
    samples = random_samples(7, (3, 24, 20), seed=5)
    out = {}
    for device in ("cpu", "cuda"):
        loader = DataLoader(samples, batch_size=3, collate_fn=uint8_collate)
        out[device] = torch.cat([b[0].cpu() for b in DevicePrefetcher(
            loader, IMAGENET_MEAN, IMAGENET_STD, device=device, dtype=dtype, channels_last=True)])
    if dtype == torch.float32:
        assert torch.equal(out["cuda"], out["cpu"])
    else:
        torch.testing.assert_close(out["cuda"], out["cpu"])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("source", ["dataloader", "loader"])
@pytest.mark.parametrize("normalized", [True, False])
def test_held_batches_are_never_overwritten(device, source, normalized):
    """Hold every batch of an epoch while the consumer's queued work lags behind the copies."""
    ds = Filled(96)
    if source == "dataloader":
        loader = DataLoader(ds, batch_size=8, collate_fn=uint8_collate, pin_memory=device == "cuda")
    else:
        loader = Loader(ds, batch_size=8, num_threads=2, pin_memory=device == "cuda")
    pf = DevicePrefetcher(loader, (0.0,) * 3, (1 / 255,) * 3, device=device, batches_ahead=3,
                          fields=None if normalized else ())
    held = []
    for images, labels in pf:
        lag(device, 1_000_000)
        held.append((images, labels, images.sum()))  # a read queued behind the lag
    sync(device)
    assert len(held) == 12
    for images, labels, total in held:
        assert images.dtype == (torch.float32 if normalized else torch.uint8)
        assert_filled(images, labels)
        assert int(total) == int((labels.cpu() % 251).sum()) * 3 * 32 * 32
    assert torch.cat([h[1].cpu() for h in held]).tolist() == list(range(96))


@needs_cuda
@pytest.mark.parametrize("source", ["dataloader", "loader"])
def test_cuda_pinned_host_batches_outlive_lagging_copies(source):
    """The host runs through a whole epoch while every side-stream copy still waits behind the
    consumer's work; each pinned host batch is let go at its hand-over and its memory must not
    carry a later batch before its copy ran (the caching host allocator's events)."""
    ds = Filled(64, (3, 48, 48))
    if source == "dataloader":
        loader = DataLoader(ds, batch_size=8, collate_fn=uint8_collate, pin_memory=True)
    else:
        loader = Loader(ds, batch_size=8, num_threads=2)  # pins by default with CUDA
    pf = DevicePrefetcher(loader, (0.0,) * 3, (1 / 255,) * 3, device="cuda", batches_ahead=2)
    pf.normalize.constants(pf.device)  # copied now: that pageable copy would wait for the lag
    # Cached pinned blocks of both sizes, so that no cudaHostAlloc runs in the epoch (it may
    # synchronize); which of them the allocator hands out while copies are pending is the test.
    warm = [torch.empty(n, dtype=torch.uint8, pin_memory=True) for n in (8 * 3 * 48 * 48, 64) for _ in range(40)]
    del warm
    lag("cuda", 4_000_000_000)  # ~2 s: the side stream waits for it at the start of the epoch
    lag_done = torch.cuda.Event()
    lag_done.record()
    out = list(pf)
    ran_ahead = not lag_done.query()
    torch.cuda.synchronize()
    assert len(out) == 8
    if not ran_ahead:  # a call in the epoch waited for the GPU (a device allocation, say)
        pytest.skip("the host did not finish the epoch before the copies ran: the lag was not tested")
    for images, labels in out:
        assert_filled(images, labels)


@needs_cuda
def test_cuda_copies_overlap_the_consumers_work():
    """Batches are copied and normalized on a side stream while the consumer computes: with a
    step as long as one batch's copy (calibrated on this GPU), an epoch takes far less than the
    copies and the steps one after the other."""
    batches = [(torch.full((16, 3, 1024, 1024), i, dtype=torch.uint8).pin_memory(), torch.tensor([i]))
               for i in range(12)]  # 50 MB each: the copy, not the host's loop, takes the time
    pf = DevicePrefetcher(batches, (0.0,) * 3, (1.0,) * 3, device="cuda", batches_ahead=2)

    def epoch(cycles: int) -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for images, _ in pf:
            if cycles:
                torch.cuda._sleep(cycles)
            del images
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    epoch(0)  # warm up: allocator, constants
    copy_s = min(epoch(0) for _ in range(3))
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(100_000_000)
    end.record()
    torch.cuda.synchronize()
    cycles = int(100_000_000 * (copy_s / len(batches)) / (start.elapsed_time(end) / 1000))
    both_s = min(epoch(cycles) for _ in range(3))  # steps alone would take copy_s too
    assert both_s < 0.8 * (2 * copy_s), (both_s, copy_s)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("batches_ahead", [1, 3])
@pytest.mark.parametrize("source", ["dataloader", "loader"])
def test_loader_errors_surface_after_the_batches_before_them(device, batches_ahead, source):
    """A failing sample raises the loader's error, after every batch before it, as without CUDA."""
    ds = Filled(40, (3, 8, 8), fail_at=21)  # batch 5 of 4-sample batches
    if source == "dataloader":
        loader, error = DataLoader(ds, batch_size=4, collate_fn=uint8_collate), KeyError
    else:
        loader, error = Loader(ds, batch_size=4, num_threads=2, prefetch=4), LoaderError
    got = []
    with pytest.raises(error, match="sample 21"):
        for images, labels in DevicePrefetcher(loader, MEAN, STD, device=device, batches_ahead=batches_ahead):
            got.append(labels.cpu())
    assert torch.cat(got).tolist() == list(range(20))


@pytest.mark.parametrize("device", DEVICES)
def test_bad_batches_raise_on_either_device(device):
    loader = DataLoader(random_samples(4, (4, 8, 8)), batch_size=2, collate_fn=uint8_collate)
    with pytest.raises(ValueError, match=r"got shape \(2, 4, 8, 8\)"):
        list(DevicePrefetcher(loader, MEAN, STD, device=device))


def test_default_device_is_the_current_cuda_device():
    want = torch.device("cuda", torch.cuda.current_device()) if CUDA else torch.device("cpu")
    assert resolve_device(None) == want
    assert DevicePrefetcher([]).device == want
    if CUDA:
        assert resolve_device("cuda") == want


# -- DataLoader workers, Loader -----------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
def test_worker_dataloader_with_pin_memory(device, packed_lmdb):
    ds = Indexed(PackedDataset(packed_lmdb, decode=DecodeResizeCrop(40, 32)))
    loader = DataLoader(ds, batch_size=5, shuffle=True, num_workers=2, persistent_workers=True,
                        collate_fn=uint8_collate, pin_memory=device == "cuda")
    first, _ = next(iter(loader))
    assert first.is_pinned() == (device == "cuda")
    pf = DevicePrefetcher(loader, MEAN, STD, device=device, dtype=torch.bfloat16, channels_last=True)
    for _ in range(2):
        seen = []
        for images, idx in pf:
            assert images.device.type == device and images.is_contiguous(memory_format=torch.channels_last)
            check_values(images, reference(torch.stack([ds[i][0] for i in idx.tolist()])), torch.bfloat16)
            seen += idx.tolist()
        assert sorted(seen) == list(range(len(ds)))


@pytest.mark.parametrize("device", DEVICES)
def test_loader_feeds_the_prefetcher(device, packed_lmdb):
    ds = Indexed(PackedDataset(packed_lmdb, decode=DecodeResizeCrop(40, 32)))
    loader = Loader(ds, batch_size=5, shuffle=True, seed=3, num_threads=2,
                           pin_memory=None if device == "cuda" else False)
    assert loader.pool.pin == (device == "cuda")  # None pins where CUDA is present
    raw, _ = next(iter(loader))
    assert raw.is_pinned() == (device == "cuda")
    pf = DevicePrefetcher(loader, MEAN, STD, device=device)
    for epoch in range(2):
        order = loader.indices(epoch).tolist()
        loader.set_epoch(epoch)
        images, idx = zip(*list(pf))
        assert torch.cat(idx).tolist() == order
        assert torch.cat(images).device.type == device
        check_values(torch.cat(images), reference(torch.stack([ds[i][0] for i in order])), torch.float32)


# -- DeviceCache ---------------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
def test_device_cache_serves_every_sample_on_the_device(device, packed_lmdb):
    ds = Indexed(PackedDataset(packed_lmdb, decode=DecodeResizeCrop(40, 32)))
    expected = reference(torch.stack([ds[i][0] for i in range(len(ds))]))
    cache = DevicePrefetcher.cache(ds, MEAN, STD, device=device, batch_size=5, seed=7, dtype=torch.float16,
                                   channels_last=True, progress=False)
    assert isinstance(cache, DeviceCache)
    assert cache.device.type == device and cache.images.device.type == device
    assert cache.nbytes == len(ds) * (3 * 32 * 32 + 8)
    orders = []
    for _ in range(2):
        batches = list(cache)
        assert len(batches) == len(cache) == 5
        for images, idx in batches:
            assert images.device.type == device and idx.device.type == device
            assert images.is_contiguous(memory_format=torch.channels_last)
            check_values(images, expected[idx.cpu()], torch.float16)
        orders.append(torch.cat([b[1] for b in batches]).tolist())
        assert sorted(orders[-1]) == list(range(len(ds)))
    assert orders[0] != orders[1]
    cache.set_epoch(0)
    assert torch.cat([b[1] for b in cache]).tolist() == orders[0]  # (seed, epoch) fixes the order


@pytest.mark.parametrize("device", DEVICES)
def test_device_cache_refuses_more_than_the_device_holds(device):
    free = free_memory(device)
    assert free is not None and free > 0
    if device == "cuda":
        assert abs(free - torch.cuda.mem_get_info()[0]) < 2**30
    n = free // (3 * 64 * 64) + 1  # one more sample than fits
    with pytest.raises(UsageError, match="GiB free"):
        DeviceCache.build(Filled(n, (3, 64, 64)), device=device, progress=False)


# -- video datasets -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def video_outputs(video_folder, tmp_path_factory):
    base = tmp_path_factory.mktemp("cuda_video")
    decode_frames(video_folder, base / "frames", run_options=RunOptions(workers=0, timeout=600.0))
    decode_frames(video_folder, base / "lmdb", to="lmdb", run_options=RunOptions(workers=0, timeout=600.0))
    return base


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["frames", "packed"])
@pytest.mark.parametrize("layout", ["TCHW", "CTHW"])
def test_video_datasets_through_the_prefetcher(device, kind, layout, video_outputs):
    common = dict(clip_len=4, frame_interval=2, layout=layout, crop_size=32, seed=11)
    ds = (FrameDataset(video_outputs / "frames", **common) if kind == "frames"
          else PackedVideoDataset(video_outputs / "lmdb", **common))
    cdim = 2 if layout == "TCHW" else 1
    expected = reference(torch.stack([ds[i][0] for i in range(len(ds))]), cdim=cdim)
    loader = DataLoader(ds, batch_size=2, num_workers=2, collate_fn=uint8_collate, pin_memory=device == "cuda")
    batches = list(DevicePrefetcher(loader, MEAN, STD, device=device, dtype=torch.bfloat16, channels_last=True))
    clips = torch.cat([b[0] for b in batches])
    assert clips.device.type == device and clips.shape == (len(ds), *ds[0][0].shape)
    check_values(clips, expected, torch.bfloat16)
    assert torch.cat([b[1].cpu() for b in batches]).tolist() == [ds[i][1] for i in range(len(ds))]
    cache = DevicePrefetcher.cache(ds, MEAN, STD, device=device, batch_size=3, shuffle=False, progress=False)
    cached = torch.cat([b[0] for b in cache])
    assert cached.device.type == device
    check_values(cached, expected, torch.float32)


# -- packer bench ---------------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
def test_bench_runs_on_the_device(device, packed_lmdb):
    r = run_bench(packed_lmdb, batch_size=8, workers=[0], resize=32, crop=32, steps=2, device=device,
                  progress=False)
    assert r["device"].startswith("cuda:" if device == "cuda" else "cpu")
    if device == "cuda":
        assert torch.cuda.get_device_name() in r["device"]

"""DevicePrefetcher.cache / DeviceCache: decode once, serve shuffled normalized batches."""
from __future__ import annotations

import pytest
import torch

import packer.data.device as cache_mod
from packer import PackedDataset
from packer.data.device import DeviceCache, cache_bytes, free_memory
from packer.data.device import DevicePrefetcher
from packer.data.decode import DecodeResizeCrop
from packer.errors import UsageError
from packer.commands.pack_images import pack_images
from packer.conversion.options import RunOptions
from tests.support.normalize import MEAN, STD, reference



class Tagged(torch.utils.data.Dataset):
    """Sample i is a random uint8 image whose label is i (so batches can be checked)."""

    def __init__(self, n: int, shape=(3, 6, 5), numpy: bool = False):
        self.n, self.shape, self.numpy = n, shape, numpy

    def __len__(self):
        return self.n

    def image(self, i: int) -> torch.Tensor:
        return torch.randint(0, 256, self.shape, generator=torch.Generator().manual_seed(i), dtype=torch.uint8)

    def __getitem__(self, i):
        x = self.image(i)
        return (x.permute(1, 2, 0).numpy() if self.numpy else x), i


def check_epoch(cache, ds, *, batch_size):
    seen = []
    for images, labels in cache:
        assert images.dtype == torch.float32 and len(labels) <= batch_size
        expected = reference(torch.stack([ds.image(int(i)) for i in labels]), MEAN, STD, 1)
        assert torch.equal(images, expected)
        seen += labels.tolist()
    return seen


def test_every_epoch_serves_every_sample_once_shuffled():
    ds = Tagged(23)
    cache = DevicePrefetcher.cache(ds, MEAN, STD, batch_size=5, progress=False, device="cpu")
    assert isinstance(cache, DeviceCache)
    assert len(cache) == 5 and cache.device.type == "cpu"
    first, second = check_epoch(cache, ds, batch_size=5), check_epoch(cache, ds, batch_size=5)
    assert sorted(first) == sorted(second) == list(range(23))
    assert first != second  # a new permutation each epoch
    again = DevicePrefetcher.cache(ds, MEAN, STD, batch_size=5, progress=False, device="cpu")
    assert check_epoch(again, ds, batch_size=5) == first  # seeded: reproducible
    cache.set_epoch(0)
    assert check_epoch(cache, ds, batch_size=5) == first


def test_drop_last_no_shuffle_and_numpy_samples():
    ds = Tagged(11, numpy=True)
    cache = DevicePrefetcher.cache(ds, MEAN, STD, batch_size=4, shuffle=False, drop_last=True,
                                   num_workers=2, progress=False, device="cpu")
    assert len(cache) == 2
    assert check_epoch(cache, Tagged(11), batch_size=4) == list(range(8))
    assert cache.images.shape == (11, 3, 6, 5)  # H x W x C arrays cached channels-first
    assert cache.nbytes == cache_bytes(11, (3, 6, 5))


def test_half_precision_channels_last():
    ds = Tagged(6, shape=(3, 8, 8))
    cache = DevicePrefetcher.cache(ds, MEAN, STD, batch_size=6, dtype=torch.bfloat16, channels_last=True,
                                   shuffle=False, progress=False, device="cpu")
    (images, labels), = list(cache)
    assert images.dtype == torch.bfloat16 and images.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(images.float(), reference(torch.stack([ds.image(i) for i in range(6)]),
                                                         MEAN, STD, 1), atol=2.5e-2, rtol=0)


def test_packed_dataset_cache(image_folder, tmp_path):
    pack_images(image_folder, tmp_path / "p.lmdb", format="lmdb", run_options=RunOptions(workers=0))
    ds = PackedDataset(tmp_path / "p.lmdb", decode=DecodeResizeCrop(24, 16))
    cache = DevicePrefetcher.cache(ds, batch_size=8, progress=False, device="cpu")
    images, labels = next(iter(cache))
    assert images.shape == (8, 3, 16, 16)
    assert cache.nbytes == cache_bytes(len(ds), (3, 16, 16))
    assert sorted(torch.cat([b[1] for b in cache]).tolist()) == sorted(ds[i][1] for i in range(len(ds)))


def test_refuses_mixed_shapes_and_empty():
    class Mixed(Tagged):
        def image(self, i):
            return torch.zeros((3, 4 + i // 3, 4), dtype=torch.uint8)

    with pytest.raises(ValueError, match="differ in shape"):
        DevicePrefetcher.cache(Mixed(6), batch_size=2, progress=False, device="cpu")
    with pytest.raises(ValueError, match="empty"):
        DevicePrefetcher.cache(Tagged(0), progress=False, device="cpu")
    with pytest.raises(ValueError, match="batch_size"):
        DevicePrefetcher.cache(Tagged(2), batch_size=0, progress=False, device="cpu")


def test_refuses_what_does_not_fit(monkeypatch):
    monkeypatch.setattr(cache_mod, "free_memory", lambda device=None: 100)
    with pytest.raises(UsageError, match=r"needs .* GiB, cpu has .* GiB free"):
        DevicePrefetcher.cache(Tagged(10), device="cpu", progress=False)


def test_memory_helpers():
    assert cache_bytes(10, (3, 4, 5)) == 10 * (60 + 8)
    free = free_memory("cpu")
    assert free is None or free > 0

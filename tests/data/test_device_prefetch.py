"""DevicePrefetcher and uint8_collate: bit-exact normalization, batch structures, epochs."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

import packer
from packer.data.device import IMAGENET_MEAN, IMAGENET_STD, Normalize
from packer.data.device import DevicePrefetcher, uint8_collate
from packer.data.decode import DecodeResizeCrop
from packer.formats import FORMATS
from packer.commands.pack_images import pack_images
from packer.conversion.options import RunOptions
from tests.support.normalize import MEAN, STD, reference

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def random_samples(n: int, shape, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        x = torch.randint(0, 256, shape, generator=g, dtype=torch.uint8)
        x.view(-1)[0], x.view(-1)[-1] = 0, 255  # both ends of the range
        out.append((x, i))
    return out


def collect(prefetcher):
    images, labels = zip(*list(prefetcher))
    return torch.cat(images), torch.cat(labels)


@pytest.mark.parametrize("shape,cdim,layout", [
    ((3, 17, 23), 1, None),          # images N x C x H x W
    ((5, 3, 9, 11), 2, None),        # clips N x T x C x H x W
    ((3, 5, 9, 11), 1, None),        # clips N x C x T x H x W
    ((3, 3, 8, 8), 2, "NTCHW"),      # T == C: layout must be given
    ((3, 3, 8, 8), 1, "NCTHW"),
])
def test_float32_is_bit_exact_with_reference(shape, cdim, layout):
    samples = random_samples(10, shape)
    loader = DataLoader(samples, batch_size=4, collate_fn=uint8_collate)
    images, labels = collect(DevicePrefetcher(loader, MEAN, STD, layout=layout, device="cpu"))
    expected = reference(torch.stack([s[0] for s in samples]), MEAN, STD, cdim)
    assert images.dtype == torch.float32
    assert torch.equal(images, expected)
    assert labels.tolist() == list(range(10))


@pytest.mark.parametrize("dtype,atol", [(torch.float16, 4e-3), (torch.bfloat16, 2.5e-2)])
@pytest.mark.parametrize("shape,cdim", [((3, 16, 16), 1), ((4, 3, 8, 8), 2)])
def test_half_precision_within_tolerance(dtype, atol, shape, cdim):
    samples = random_samples(6, shape)
    loader = DataLoader(samples, batch_size=3, collate_fn=uint8_collate)
    images, _ = collect(DevicePrefetcher(loader, IMAGENET_MEAN, IMAGENET_STD, dtype=dtype, device="cpu"))
    expected = reference(torch.stack([s[0] for s in samples]), IMAGENET_MEAN, IMAGENET_STD, cdim)
    assert images.dtype == dtype
    torch.testing.assert_close(images.float(), expected, atol=atol, rtol=0)


def test_channels_last_layouts_keep_values():
    for shape, cdim, fmt in [((3, 12, 10), 1, torch.channels_last), ((3, 4, 6, 5), 1, torch.channels_last_3d)]:
        samples = random_samples(4, shape)
        loader = DataLoader(samples, batch_size=4, collate_fn=uint8_collate)
        (images, _), = list(DevicePrefetcher(loader, MEAN, STD, channels_last=True, device="cpu"))
        assert images.is_contiguous(memory_format=fmt)
        assert torch.equal(images, reference(torch.stack([s[0] for s in samples]), MEAN, STD, cdim))
    samples = random_samples(4, (4, 3, 6, 5))  # N T C H W: channel innermost, same values
    (clips, _), = list(DevicePrefetcher(DataLoader(samples, batch_size=4, collate_fn=uint8_collate),
                                        MEAN, STD, channels_last=True, device="cpu"))
    assert clips.stride(2) == 1
    assert torch.equal(clips, reference(torch.stack([s[0] for s in samples]), MEAN, STD, 2))


class DictData(torch.utils.data.Dataset):
    def __len__(self):
        return 7

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return {"image": torch.randint(0, 256, (3, 8, 6), generator=g, dtype=torch.uint8),
                "clip": np.random.default_rng(i).integers(0, 256, (4, 8, 6, 3), dtype=np.uint8),  # T H W C
                "label": i, "weight": torch.full((2,), float(i)), "key": f"k{i}"}


def test_dict_batches_normalize_every_image_field():
    ds = DictData()
    batches = list(DevicePrefetcher(DataLoader(ds, batch_size=3, collate_fn=uint8_collate), MEAN, STD, device="cpu"))
    assert len(batches) == 3
    b = batches[0]
    assert set(b) == {"image", "clip", "label", "weight", "key"}
    assert torch.equal(b["image"], reference(torch.stack([ds[i]["image"] for i in range(3)]), MEAN, STD, 1))
    clips = torch.stack([torch.from_numpy(ds[i]["clip"]).permute(0, 3, 1, 2) for i in range(3)])
    assert torch.equal(b["clip"], reference(clips, MEAN, STD, 2))
    assert b["label"].tolist() == [0, 1, 2] and b["label"].dtype == torch.int64
    assert torch.equal(b["weight"], torch.tensor([[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]]))
    assert b["key"] == ["k0", "k1", "k2"]


def test_fields_choose_what_is_normalized():
    ds = DictData()
    (b, *_) = list(DevicePrefetcher(DataLoader(ds, batch_size=3, collate_fn=uint8_collate), MEAN, STD,
                                    fields=["image"], device="cpu"))
    assert b["image"].dtype == torch.float32
    assert b["clip"].dtype == torch.uint8  # left as it is, only moved
    with pytest.raises(ValueError, match="uint8"):
        list(DevicePrefetcher(DataLoader(ds, batch_size=3, collate_fn=uint8_collate), MEAN, STD, fields=["weight"], device="cpu"))


def test_tuple_batches_with_extra_fields():
    samples = [(s[0], s[1], float(s[1]) / 2) for s in random_samples(5, (3, 4, 4))]
    batches = list(DevicePrefetcher(DataLoader(samples, batch_size=5, collate_fn=uint8_collate), MEAN, STD, device="cpu"))
    images, labels, extra = batches[0]
    assert isinstance(batches[0], tuple)
    assert torch.equal(images, reference(torch.stack([s[0] for s in samples]), MEAN, STD, 1))
    assert labels.tolist() == [0, 1, 2, 3, 4]
    assert extra.tolist() == [0.0, 0.5, 1.0, 1.5, 2.0]


def test_epochs_restart_with_worker_processes():
    samples = random_samples(22, (3, 6, 6))
    loader = DataLoader(samples, batch_size=5, shuffle=True, num_workers=2, persistent_workers=True,
                        collate_fn=uint8_collate)
    pf = DevicePrefetcher(loader, MEAN, STD, device="cpu")
    assert len(pf) == len(loader) == 5
    orders = []
    for _ in range(2):
        batches = list(pf)
        assert len(batches) == 5
        labels = torch.cat([b[1] for b in batches])
        assert sorted(labels.tolist()) == list(range(22))
        for images, lab in batches:
            assert torch.equal(images, reference(torch.stack([samples[i][0] for i in lab]), MEAN, STD, 1))
        orders.append(labels.tolist())
    assert orders[0] != orders[1]  # the sampler reshuffled: each epoch is a fresh pass
    it = iter(pf)
    next(it)  # stop early, then start a new epoch
    del it
    assert len(list(pf)) == 5


def test_iteration_ends_cleanly():
    it = iter(DevicePrefetcher(DataLoader(random_samples(3, (3, 2, 2)), batch_size=2,
                                          collate_fn=uint8_collate), MEAN, STD, device="cpu"))
    assert len(list(it)) == 2
    with pytest.raises(StopIteration):
        next(it)


def test_uint8_collate_layouts():
    arr = np.arange(4 * 5 * 3, dtype=np.uint8).reshape(4, 5, 3)
    batch = uint8_collate([(arr, 1), (Image.fromarray(arr), 2), (torch.from_numpy(arr).permute(2, 0, 1), 3)])
    images, labels = batch
    assert images.dtype == torch.uint8 and images.shape == (3, 3, 4, 5)
    for i in range(3):
        assert torch.equal(images[i], torch.from_numpy(arr).permute(2, 0, 1))
    assert labels.tolist() == [1, 2, 3]
    grey = uint8_collate([Image.fromarray(arr[:, :, 0])] * 2)
    assert grey.shape == (2, 1, 4, 5)
    clips = uint8_collate([np.zeros((6, 4, 5, 3), np.uint8)] * 2)  # T H W C -> T C H W
    assert clips.shape == (2, 6, 3, 4, 5)
    floats = uint8_collate([np.zeros((2, 2), np.float32)] * 2)  # not images: default_collate
    assert floats.dtype == torch.float32


def test_uint8_collate_refuses_mixed_shapes():
    with pytest.raises(ValueError, match=r"differ in shape: \(3, 4, 4\) and \(3, 5, 4\)"):
        uint8_collate([(torch.zeros(3, 4, 4, dtype=torch.uint8), 0), (torch.zeros(3, 5, 4, dtype=torch.uint8), 1)])


def test_uint8_collate_in_workers_gives_uint8():
    samples = [(np.full((4, 4, 3), i, np.uint8), i) for i in range(8)]
    for images, labels in DataLoader(samples, batch_size=4, num_workers=1, collate_fn=uint8_collate):
        assert images.dtype == torch.uint8 and images.shape == (4, 3, 4, 4)
        assert torch.equal(images[:, 0, 0, 0], labels.to(torch.uint8))


@pytest.mark.parametrize("kwargs,match", [
    ({"mean": (0.5, 0.5), "std": (0.5, 0.5, 0.5)}, "one value per channel"),
    ({"mean": (0.5,) * 3, "std": (0.5, 0.0, 0.5)}, "std"),
    ({"mean": (float("nan"),) * 3, "std": (0.5,) * 3}, "finite"),
    ({"dtype": torch.int32}, "dtype"),
    ({"layout": "NHWC"}, "layout"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DevicePrefetcher([], **kwargs, device="cpu")


def test_bad_batches_name_the_shape():
    norm = Normalize(MEAN, STD)
    with pytest.raises(ValueError, match=r"got shape \(2, 4, 5, 5\)"):
        norm(torch.zeros(2, 4, 5, 5, dtype=torch.uint8))
    with pytest.raises(ValueError, match="ambiguous"):
        norm(torch.zeros(2, 3, 3, 5, 5, dtype=torch.uint8))
    with pytest.raises(ValueError, match="no dimension of 3 channels"):
        norm(torch.zeros(2, 4, 4, 5, 5, dtype=torch.uint8))
    with pytest.raises(ValueError, match="4 dims"):
        norm(torch.zeros(3, 5, 5, dtype=torch.uint8))
    with pytest.raises(ValueError, match="batches_ahead"):
        DevicePrefetcher([], batches_ahead=0, device="cpu")


def test_cuda_requested_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    with pytest.raises(ValueError, match="CUDA is not available"):
        DevicePrefetcher([], device="cuda")


def test_public_name():
    assert packer.DevicePrefetcher is DevicePrefetcher
    assert "DevicePrefetcher" in packer.__all__


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_packed_dataset_end_to_end(fmt, image_folder, tmp_path):
    """Every format -> PackedDataset(fast decode) -> worker DataLoader -> prefetcher."""
    out = tmp_path / ("data." + fmt if FORMATS[fmt][0].single_file else fmt)
    pack_images(image_folder, out, format=fmt, run_options=RunOptions(workers=0))
    ds = packer.PackedDataset(out, decode=DecodeResizeCrop(40, 32))
    loader = DataLoader(ds, batch_size=5, num_workers=2, collate_fn=uint8_collate)
    images, labels = collect(DevicePrefetcher(loader, MEAN, STD, device="cpu"))
    assert images.shape == (len(ds), 3, 32, 32)
    expected = reference(torch.stack([ds[i][0] for i in range(len(ds))]), MEAN, STD, 1)
    assert torch.equal(images, expected)
    assert labels.tolist() == [ds[i][1] for i in range(len(ds))]


# -- CUDA (run where a GPU is present; skipped on CPU-only machines) -----------------------
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_matches_cpu_reference(dtype):
    samples = random_samples(9, (3, 16, 12))
    loader = DataLoader(samples, batch_size=4, collate_fn=uint8_collate, pin_memory=True)
    pf = DevicePrefetcher(loader, MEAN, STD, device="cuda", dtype=dtype, channels_last=True)
    images, labels = collect(pf)
    assert images.device.type == "cuda" and labels.device.type == "cuda"
    expected = reference(torch.stack([s[0] for s in samples]), MEAN, STD, 1)
    if dtype == torch.float32:
        assert torch.equal(images.cpu(), expected)
    else:
        torch.testing.assert_close(images.float().cpu(), expected, atol=2.5e-2, rtol=0)


@needs_cuda
def test_cuda_handed_over_batches_stay_valid_while_consumer_is_slow():
    """Each image is filled with its label: a batch overwritten by a later copy would show."""
    samples = [(torch.full((3, 64, 64), i % 251, dtype=torch.uint8), i % 251) for i in range(256)]
    loader = DataLoader(samples, batch_size=16, collate_fn=uint8_collate)  # pageable: prefetcher pins
    pf = DevicePrefetcher(loader, (0.0,) * 3, (1 / 255,) * 3, device="cuda", batches_ahead=2)
    side = torch.cuda.Stream()
    checks = []
    with torch.cuda.stream(side):  # consume on a non-default stream, never synchronizing
        for images, labels in pf:
            torch.cuda._sleep(2_000_000)  # the consumer's queued work lags behind the copies
            checks.append((images.amax(dim=(1, 2, 3)), images.amin(dim=(1, 2, 3)), labels))
            del images  # freed while the reads above are still queued: record_stream must hold it
    torch.cuda.synchronize()
    for hi, lo, labels in checks:
        assert torch.equal(hi, labels.float()) and torch.equal(lo, labels.float())

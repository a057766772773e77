"""PackedDataset over every format: decode modes, fixtures, fork and spawn DataLoader workers."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps
from torch.utils.data import ConcatDataset, DataLoader

from packer import PackedDataset
from packer.errors import CorruptData, UsageError
from packer.formats import FORMATS
from packer.codecs.resize import ResizeSpec
from packer.commands.pack_images import pack_images
from packer.conversion.options import RunOptions
from tests.support import FIXTURE_IMAGES
from tests.support.inputs import write_image_folder


@pytest.fixture(scope="module", params=sorted(FORMATS))
def packed(request, image_folder, tmp_path_factory):
    fmt = request.param
    out = tmp_path_factory.mktemp(fmt) / ("ds.h5" if FORMATS[fmt][0].single_file else "ds")
    pack_images(image_folder, out, format=fmt, run_options=RunOptions(workers=0))
    return out


def test_decode_modes_agree(packed):
    arrays = {}
    for mode in ("pil", "numpy", "tensor", "bytes"):
        img, label = PackedDataset(packed, decode=mode)[10]
        arrays[mode] = img
        assert label == 1
    assert isinstance(arrays["pil"], Image.Image) and arrays["pil"].mode == "RGB"
    np.testing.assert_array_equal(np.asarray(arrays["pil"]), arrays["numpy"])
    assert arrays["tensor"].dtype == torch.uint8 and arrays["tensor"].shape[0] == 3
    np.testing.assert_array_equal(arrays["tensor"].permute(1, 2, 0).numpy(), arrays["numpy"])
    assert isinstance(arrays["bytes"], bytes) and arrays["bytes"][:2] == b"\xff\xd8"


def test_len_classes_keys_transform(packed):
    ds = PackedDataset(packed, decode="numpy", transform=lambda a: a.shape, target_transform=str)
    assert len(ds) == 24 and ds.classes == ["class_0", "class_1", "class_2"]
    assert ds.keys[0] == "class_0/img_0000.jpg"
    shape, label = ds[0]
    assert len(shape) == 3 and label == "0"
    with pytest.raises(IndexError):
        ds[24]
    with pytest.raises(UsageError):
        PackedDataset(packed, decode="cv2")


def _collate(batch):
    return [(t.shape, l) for t, l in batch]


def test_a_batch_releases_each_record_before_the_next_read(packed):
    """``__getitems__`` (what a DataLoader calls) holds no record once its sample is made, so the
    next read can reuse its memory (a zip over the reads kept each one alive through the next:
    ~8 µs more of ~45 a 150 KB raw sample). Watched from the reader's side, as each read is
    handed over."""
    import sys

    ds = PackedDataset(packed, decode="bytes")
    read_many, held = ds.reader.read_many, []

    def watched(indices):
        previous = None
        for rec in read_many(indices):
            if previous is not None:  # referenced here and by getrefcount's argument only
                held.append(sys.getrefcount(previous) - 2)
            previous = rec
            yield rec

    ds.reader.read_many = watched
    got = ds.__getitems__(list(range(8)))
    assert len(got) == 8 and held == [0] * 7


def test_an_undecodable_stored_image_names_the_pack_and_sample(tmp_path):
    """A JPEG whose header passes ``--check header`` but whose body is cut short is stored (its
    CRC32C is the stored bytes'); decoding it is a CorruptData naming the pack and the sample,
    one by one and in a DataLoader's batch."""
    src = write_image_folder(tmp_path / "src", count=4, classes=1)
    victim = sorted((src / "class_0").iterdir())[2]
    data = victim.read_bytes()
    victim.write_bytes(data[:data.index(b"\xff\xda") + 60])  # the header whole, the scan cut
    out = tmp_path / "cut.lmdb"
    pack_images(src, out, format="lmdb", check="header", run_options=RunOptions(workers=0))
    ds = PackedDataset(out, decode="tensor")
    at = ds.keys.index(f"class_0/{victim.name}")
    assert ds[at - 1][0].shape[0] == 3
    for read in (lambda: ds[at], lambda: ds.__getitems__([0, at])):
        with pytest.raises(CorruptData, match=rf"cut\.lmdb sample {at}: "):
            read()


def test_dataloader_workers(packed):
    ds = PackedDataset(packed, decode="tensor")
    _ = ds[0]  # the parent has opened its handle before the workers start
    dl = DataLoader(ds, batch_size=5, num_workers=2, multiprocessing_context="fork", collate_fn=_collate)
    got = [x for b in dl for x in b]
    want = [(ds[i][0].shape, ds[i][1]) for i in range(len(ds))]
    assert got == want
    _ = ds[1]  # and the parent still reads after its children used the same path


@pytest.mark.slow
def test_spawn_workers_reopen_every_format(image_folder, tmp_path):
    """Spawned workers unpickle every reader (each format, HDF5's raw layout too) and read what
    the parent reads; one loader, so spawn's interpreter start-ups are paid once."""
    parts = []
    for fmt in sorted(FORMATS):
        out = tmp_path / ("ds.h5" if FORMATS[fmt][0].single_file else f"ds-{fmt}")
        pack_images(image_folder, out, format=fmt, run_options=RunOptions(workers=0))
        parts.append(PackedDataset(out, decode="tensor"))
    pack_images(image_folder, tmp_path / "raw.h5", format="hdf5", raw=True, resize=ResizeSpec(size=(40, 32)),
                run_options=RunOptions(workers=0))
    parts.append(PackedDataset(tmp_path / "raw.h5", decode="tensor"))
    first = [d[0] for d in parts]  # the parent opens every file before the workers start
    ds = ConcatDataset(parts)
    dl = DataLoader(ds, batch_size=5, num_workers=2, multiprocessing_context="spawn", collate_fn=_collate)
    got = [x for b in dl for x in b]
    assert got == [(ds[i][0].shape, ds[i][1]) for i in range(len(ds))]
    assert len(got) == 24 * len(parts) and got[-1][0] == (3, 32, 40)
    assert [d[0][1] for d in parts] == [f[1] for f in first]


def test_every_fixture_image(tmp_path):
    src = tmp_path / "src" / "fixtures"
    src.mkdir(parents=True)
    for p in FIXTURE_IMAGES.iterdir():
        (src / p.name).write_bytes(p.read_bytes())
    out = tmp_path / "fx.lmdb"
    report = pack_images(tmp_path / "src", out, format="lmdb", run_options=RunOptions(workers=2))
    assert [f["key"] for f in report.failures] == ["fixtures/pillow_truncated_jpeg.jpg"]
    assert "truncated" in report.failures[0]["reason"]
    ds = PackedDataset(out, decode="numpy")
    assert len(ds) == len(list(FIXTURE_IMAGES.iterdir())) - 1
    for i, key in enumerate(ds.keys):
        arr, label = ds[i]
        assert arr.dtype == np.uint8 and arr.ndim == 3 and arr.shape[2] == 3 and label == 0
        assert 5 < arr.mean() < 250, key  # not black, not blank
        ref = np.asarray(ImageOps.exif_transpose(Image.open(FIXTURE_IMAGES / key.split("/")[1])).convert("RGB"))
        if "16bit" not in key:
            assert arr.shape == ref.shape, key
            assert np.abs(arr.astype(int) - ref).mean() < 2, key
    # the EXIF-rotated one comes out upright: it equals Pillow's exif_transpose, not the raw pixels
    k = ds.keys.index("fixtures/pillow_hopper_orientation_6.jpg")
    raw = np.asarray(Image.open(FIXTURE_IMAGES / "pillow_hopper_orientation_6.jpg").convert("RGB"))
    assert np.abs(ds[k][0].astype(int) - raw).mean() > 10
    # grey, CMYK and palette sources became 3-channel RGB; the grey one has equal channels
    g = ds[ds.keys.index("fixtures/pillow_hopper_gray.jpg")][0]
    assert (g[..., 0] == g[..., 1]).all() and (g[..., 1] == g[..., 2]).all()
    m = {k: r for k, r in zip(ds.keys, (ds.reader.read(i) for i in range(len(ds))))}
    assert m["fixtures/pillow_pil_sample_cmyk.jpg"].channels == 4
    assert m["fixtures/pillow_hopper_gray.jpg"].channels == 1

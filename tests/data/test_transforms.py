"""The training image pipeline: JPEG header parse, DCT-scaled decode, resize + centre crop."""
from __future__ import annotations

import io
import pickle

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from packer import PackedDataset
from packer.data.decode import (DecodeResizeCrop, PilResizeCrop, _decode_scaled, jpeg_size,
                                    reduction_factor)
from packer.errors import CorruptData
from packer.formats import FORMATS
from packer.commands.pack_images import pack_images
from packer.synth import jpeg_bytes, natural_image
from packer.conversion.options import RunOptions
from tests.support import FIXTURE_IMAGES


def jpeg(h: int, w: int, seed: int = 0, **save) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(natural_image(np.random.default_rng(seed), h, w)).save(buf, "JPEG", quality=90, **save)
    return buf.getvalue()


def oriented(value: int) -> Image.Exif:
    exif = Image.Exif()
    exif[0x0112] = value
    return exif


def mean_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.int() - b.int()).abs().float().mean().item()


@settings(max_examples=25, deadline=None)
@given(h=st.integers(1, 300), w=st.integers(1, 300), progressive=st.booleans(), exif=st.booleans())
def test_jpeg_size_matches_pillow(h, w, progressive, exif):
    rng = np.random.default_rng(h * 1000 + w)
    im = Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
    buf = io.BytesIO()
    kw = {"exif": oriented(6)} if exif else {}
    im.save(buf, "JPEG", progressive=progressive, **kw)
    assert jpeg_size(buf.getvalue()) == (h, w)


def test_jpeg_size_of_other_bytes():
    buf = io.BytesIO()
    Image.new("RGB", (5, 4)).save(buf, "PNG")
    assert jpeg_size(buf.getvalue()) is None
    assert jpeg_size(b"") is None
    assert jpeg_size(b"\xff\xd8\xff\xe0\x00") is None  # header cut short
    assert jpeg_size(jpeg(20, 30)[:40]) is None


def test_jpeg_size_of_real_files():
    for p in sorted(FIXTURE_IMAGES.glob("*.jpg")):
        data = p.read_bytes()
        w, h = Image.open(io.BytesIO(data)).size
        assert jpeg_size(data) == (h, w), p.name


def test_reduction_factor():
    assert reduction_factor(432, 576, 256) == 1
    assert reduction_factor(512, 700, 256) == 2
    assert reduction_factor(1080, 1920, 256) == 4
    assert reduction_factor(4000, 3000, 256) == 8
    assert reduction_factor(100, 100, 256) == 1


def test_scaled_decode_is_used_when_source_is_large():
    data = jpeg(1040, 1200)
    assert _decode_scaled(data, 256).shape == (260, 300, 3)  # 1/4 scale in the DCT domain
    assert _decode_scaled(data, 600).shape == (1040, 1200, 3)


@pytest.mark.parametrize("h,w,short,crop", [
    (432, 576, 256, 224),     # the benchmark size: no DCT scaling, crop-then-resize
    (600, 1000, 256, 224),    # 1/2 scale
    (1100, 1500, 256, 224),   # 1/4 scale
    (2100, 2100, 256, 224),   # 1/8 scale
    (120, 90, 256, 224),      # smaller than the target: upscaled
    (300, 200, 64, 48),
])
def test_fast_pipeline_is_close_to_reference(h, w, short, crop):
    data = jpeg(h, w, seed=h + w)
    fast, ref = DecodeResizeCrop(short, crop)(data), PilResizeCrop(short, crop)(data)
    assert fast.dtype == ref.dtype == torch.uint8
    assert fast.shape == ref.shape == (3, crop, crop)
    assert mean_abs_diff(fast, ref) < 3.0


def test_exif_orientation_is_applied_on_the_scaled_path():
    arr = np.zeros((600, 1200, 3), np.uint8)  # stored landscape: left half red, right half blue
    arr[:, :600, 0] = 255
    arr[:, 600:, 2] = 255
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "JPEG", quality=95, exif=oriented(6))
    data = buf.getvalue()
    fast, ref = DecodeResizeCrop(128, 128)(data), PilResizeCrop(128, 128)(data)  # 1/4 scale
    assert mean_abs_diff(fast, ref) < 3.0
    # orientation 6 = rotate 90 degrees clockwise: red ends on top, blue at the bottom
    assert fast[0, :40].float().mean() > 200 and fast[2, -40:].float().mean() > 200


@pytest.mark.parametrize("name,short", [
    ("pillow_hopper_orientation_6.jpg", 64), ("pillow_pil_sample_cmyk.jpg", 25),
    ("pillow_hopper_gray.jpg", 32), ("pillow_mode_palette_alpha.png", 32), ("pillow_flower.jpg", 160),
    ("pillow_mode_16bit.png", 32),
])
def test_real_images(name, short):
    data = (FIXTURE_IMAGES / name).read_bytes()
    fast, ref = DecodeResizeCrop(short, short)(data), PilResizeCrop(short, short)(data)
    assert fast.shape == ref.shape == (3, short, short)
    # DCT-domain 1/2..1/8 scaling filters differently from Pillow's antialiased bilinear: a few
    # levels apart on detailed real images; a wrong orientation or colour would be tens apart.
    assert mean_abs_diff(fast, ref) < 6.0
    if "orientation" in name:
        assert mean_abs_diff(fast, torch.rot90(ref, 1, (1, 2))) > 4 * mean_abs_diff(fast, ref)


def test_truncated_jpeg_is_an_error():
    with pytest.raises(ValueError, match="cannot decode"):
        PilResizeCrop()((FIXTURE_IMAGES / "pillow_truncated_jpeg.jpg").read_bytes())


def test_arrays_and_bad_input():
    arr = natural_image(np.random.default_rng(3), 90, 120)
    out = DecodeResizeCrop(64, 64)(arr)
    assert out.shape == (3, 64, 64)
    assert mean_abs_diff(out, DecodeResizeCrop(64, 64)(jpeg_bytes(arr, 100))) < 3.0
    assert PilResizeCrop(64, 64)(Image.fromarray(arr)).shape == (3, 64, 64)
    with pytest.raises(ValueError, match="cannot decode"):
        DecodeResizeCrop()(b"not an image")
    with pytest.raises(ValueError, match="larger than short_side"):
        DecodeResizeCrop(100, 200)
    with pytest.raises(ValueError, match="positive"):
        PilResizeCrop(0, 0)


def test_picklable_for_workers():
    t = pickle.loads(pickle.dumps(DecodeResizeCrop(128, 112)))
    assert (t.short_side, t.crop) == (128, 112) and "128" in repr(t)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_packed_dataset_takes_the_pipeline(fmt, image_folder, tmp_path):
    out = tmp_path / ("data." + fmt if FORMATS[fmt][0].single_file else fmt)
    pack_images(image_folder, out, format=fmt, run_options=RunOptions(workers=0))
    ds = PackedDataset(out, decode=DecodeResizeCrop(40, 32))
    plain = PackedDataset(out, decode="numpy")
    for i in range(len(ds)):
        image, label = ds[i]
        assert image.shape == (3, 32, 32) and image.dtype == torch.uint8
        assert label == plain[i][1]
        assert torch.equal(image, DecodeResizeCrop(40, 32)(plain[i][0]))  # bytes path == array path


def test_packed_dataset_names_bad_samples(image_folder, tmp_path):
    pack_images(image_folder, tmp_path / "p.lmdb", format="lmdb", run_options=RunOptions(workers=0))

    def broken(data):
        raise ValueError("cannot decode image: boom")

    with pytest.raises(CorruptData, match=r"p\.lmdb sample 3.*boom"):
        PackedDataset(tmp_path / "p.lmdb", decode=broken)[3]

"""DecodeRandomResizedCrop: the box rule, its fallback, EXIF before the box, seeds, flip, fidelity."""
from __future__ import annotations

import io
import math
import pickle

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from packer.codecs import jpeg_region
from packer.codecs.image import decode_pil
from packer.benchmark.fidelity import fidelity_rows
from packer.data import DecodeRandomResizedCrop, PilRandomResizedCrop
from packer.data.decode import sample_box
from packer.synth import jpeg_bytes, natural_image
from packer.conversion.options import RunOptions


def jpeg(h: int, w: int, seed: int = 0, **save) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(natural_image(np.random.default_rng(seed), h, w)).save(buf, "JPEG", quality=90, **save)
    return buf.getvalue()


def test_box_distribution_follows_the_rule():
    """With areas up to half a large square image every first try fits (sqrt(0.5 * 4/3) < 1):
    area fraction ~ U(0.08, 0.5), log aspect ~ U(log 3/4, log 4/3), position uniform."""
    rng = np.random.default_rng(0)
    n, side = 20000, 2000
    boxes = np.array([sample_box(side, side, rng, scale=(0.08, 0.5)) for _ in range(n)], dtype=np.float64)
    top, left, h, w = boxes.T
    frac = h * w / side ** 2
    assert abs(frac.mean() - 0.29) < 0.005 and abs(np.median(frac) - 0.29) < 0.01
    assert frac.min() > 0.079 and frac.max() < 0.501
    assert abs(np.quantile(frac, 0.1) - 0.122) < 0.005  # uniform: the 10% quantile
    log_aspect = np.log(w / h)
    assert abs(log_aspect.mean()) < 0.01
    assert log_aspect.min() > math.log(3 / 4) - 0.01 and log_aspect.max() < math.log(4 / 3) + 0.01
    assert abs(np.std(log_aspect) - (2 * math.log(4 / 3)) / math.sqrt(12)) < 0.005  # uniform spread
    rel_top, rel_left = top / (side - h).clip(1), left / (side - w).clip(1)
    assert abs(rel_top.mean() - 0.5) < 0.01 and abs(rel_left.mean() - 0.5) < 0.01
    assert (top + h <= side).all() and (left + w <= side).all()


def test_default_scale_rejects_what_does_not_fit():
    """With the default scale, tries whose box overflows are redrawn: accepted boxes are the
    rule's conditional distribution (large areas with a far-from-square aspect are rare)."""
    rng = np.random.default_rng(2)
    boxes = np.array([sample_box(1000, 1000, rng) for _ in range(20000)], dtype=np.float64)
    frac = boxes[:, 2] * boxes[:, 3] / 1e6
    # first-try acceptance of U(0.08, 1) x logU(3/4, 4/3): P(frac > 0.75) among accepted
    f = np.random.default_rng(3).uniform(0.08, 1, 400000)
    a = np.exp(np.random.default_rng(4).uniform(np.log(3 / 4), np.log(4 / 3), 400000))
    ok = (f * a <= 1) & (f / a <= 1)
    assert abs((frac > 0.75).mean() - (f[ok] > 0.75).mean()) < 0.01
    assert frac.max() <= 1.0


def test_boxes_keep_inside_small_images():
    rng = np.random.default_rng(1)
    for _ in range(3000):
        hh, ww = int(rng.integers(1, 60)), int(rng.integers(1, 60))
        top, left, h, w = sample_box(hh, ww, rng)
        assert 0 < h <= hh and 0 < w <= ww and 0 <= top <= hh - h and 0 <= left <= ww - w


@pytest.mark.parametrize("h,w,expected", [
    (10, 1000, (0, 493, 10, 13)),     # too wide: height kept, w = round(10 * 4/3)
    (1000, 10, (493, 0, 13, 10)),     # too tall: width kept, h = round(10 / (3/4))
])
def test_fallback_when_no_try_fits(h, w, expected):
    # every try needs h >= sqrt(0.08 * area / (4/3)) > 10: none fits a 10-pixel side
    assert sample_box(h, w, np.random.default_rng(3)) == expected


def test_fallback_is_the_whole_image_when_its_aspect_is_allowed():
    # scale > 1 never fits: the fallback, and 400x500 (aspect 1.25) is within the ratio range
    assert sample_box(400, 500, np.random.default_rng(0), scale=(1.5, 2.0)) == (0, 0, 400, 500)
    assert sample_box(400, 800, np.random.default_rng(0), scale=(1.5, 2.0)) == (0, 133, 400, 533)


def test_same_seed_same_crops_and_flip_is_a_mirror():
    data = [jpeg(120, 160, seed=s) for s in range(6)]
    a, b = DecodeRandomResizedCrop(64, seed=7), DecodeRandomResizedCrop(64, seed=7)
    outs_a, outs_b = [a(d) for d in data], [b(d) for d in data]
    assert all(torch.equal(x, y) for x, y in zip(outs_a, outs_b))
    c = DecodeRandomResizedCrop(64, seed=8)
    assert not all(torch.equal(x, c(d)) for x, d in zip(outs_a, data))
    plain, mirrored = DecodeRandomResizedCrop(64, flip=0.0), DecodeRandomResizedCrop(64, flip=1.0)
    for i, d in enumerate(data):  # the flip draw comes after the box: same box either way
        p, m = plain(d, rng=np.random.default_rng(i)), mirrored(d, rng=np.random.default_rng(i))
        assert torch.equal(p.flip(-1), m)


def test_flip_probability():
    t = DecodeRandomResizedCrop(8, flip=0.5)
    rng = np.random.default_rng(0)
    flips = [t.sample(100, 100, rng)[1] for _ in range(4000)]
    assert 0.47 < np.mean(flips) < 0.53


def test_exif_orientation_is_applied_before_the_box():
    """Stored 300 wide x 100 high with orientation 6 is 100 wide x 300 high upright: the box
    (here the fallback, which depends on the shape) is chosen in the upright image."""
    arr = natural_image(np.random.default_rng(5), 100, 300)
    exif = Image.Exif()
    exif[0x0112] = 6
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "JPEG", quality=95, exif=exif)
    data = buf.getvalue()
    upright = decode_pil(data)
    assert upright.shape[:2] == (300, 100)
    t = DecodeRandomResizedCrop(32, scale=(1.5, 2.0), flip=0.0)  # always the fallback
    assert t.sample(300, 100, np.random.default_rng(0))[0] == (83, 0, 133, 100)
    got = t(data, rng=np.random.default_rng(0))
    assert torch.equal(got, t(upright, rng=np.random.default_rng(0)))
    ref = PilRandomResizedCrop(32, scale=(1.5, 2.0), flip=0.0)(data, rng=np.random.default_rng(0))
    assert (got.int() - ref.int()).abs().float().mean() < 3


def test_bytes_path_equals_array_path_with_and_without_region_decoding(monkeypatch):
    data = [jpeg(150, 200, seed=s) for s in range(5)] + [jpeg(97, 131, seed=9, subsampling=0)]
    t = DecodeRandomResizedCrop(80, seed=1)  # boxes < 160: no DCT scaling, the same pixels
    for i, d in enumerate(data):
        from_bytes = t(d, rng=np.random.default_rng(i))
        assert torch.equal(from_bytes, t(decode_pil(d), rng=np.random.default_rng(i)))
    monkeypatch.setattr(jpeg_region, "_LIB", None)  # no TurboJPEG 3: whole-image decode
    for i, d in enumerate(data):
        assert torch.equal(t(d, rng=np.random.default_rng(i)), t(decode_pil(d), rng=np.random.default_rng(i)))


def test_large_images_use_the_dct_scale_and_stay_close():
    data = jpeg(1200, 1600, seed=2)
    fast, ref = DecodeRandomResizedCrop(112, flip=0.0), PilRandomResizedCrop(112, flip=0.0)
    for i in range(6):
        a, b = fast(data, rng=np.random.default_rng(i)), ref(data, rng=np.random.default_rng(i))
        assert a.shape == b.shape == (3, 112, 112)
        assert (a.int() - b.int()).abs().float().mean() < 3


def test_other_inputs_and_validation():
    png = io.BytesIO()
    Image.fromarray(natural_image(np.random.default_rng(0), 50, 70)).save(png, "PNG")
    t = DecodeRandomResizedCrop((24, 32), seed=0)
    assert t(png.getvalue()).shape == (3, 24, 32)
    with pytest.raises(ValueError, match="cannot decode"):
        t(b"not an image")
    for bad in (dict(scale=(0.5, 0.1)), dict(ratio=(0, 1)), dict(flip=1.5), dict(seed=-1)):
        with pytest.raises(ValueError):
            DecodeRandomResizedCrop(32, **bad)
    with pytest.raises(ValueError, match="size"):
        DecodeRandomResizedCrop(0)
    assert "scale=(0.08, 1.0)" in repr(DecodeRandomResizedCrop(224))


class _Bytes(Dataset):
    def __init__(self, data):
        self.data = data

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        return self.t(self.data[i])


def _epoch(data, seed, torch_seed):
    ds = _Bytes(data)
    ds.t = DecodeRandomResizedCrop(32, seed=seed)
    torch.manual_seed(torch_seed)
    return torch.cat(list(DataLoader(ds, batch_size=4, num_workers=2)))


@pytest.mark.slow
def test_workers_draw_different_reproducible_streams():
    data = [jpeg(64, 80, seed=0)] * 8  # the same image everywhere: only the draws differ
    t = pickle.loads(pickle.dumps(DecodeRandomResizedCrop(32, seed=3)))
    assert t.seed == 3
    a, b = _epoch(data, 3, 0), _epoch(data, 3, 0)
    assert torch.equal(a, b)  # reproducible under torch.manual_seed
    assert not torch.equal(a[:4], a[4:])  # worker 0 and worker 1 draw differently
    assert not torch.equal(a, _epoch(data, 3, 1))  # a new epoch seed, new crops


def test_fidelity_floor():
    """Median PSNR against the Lanczos reference at least torchvision's, shift <= 0.15 px."""
    rng = np.random.default_rng(4)
    samples = [jpeg_bytes(natural_image(rng, int(rng.integers(300, 700)), int(rng.integers(300, 700))), 90)
               for _ in range(10)]
    rows = {r["pipeline"]: r for r in fidelity_rows(samples)}
    fast_c, tv_c = rows["DecodeResizeCrop(256, 224)"], rows["torchvision Resize(256)+CenterCrop(224) (PIL)"]
    fast_r, tv_r = rows["DecodeRandomResizedCrop(224)"], rows["torchvision RandomResizedCrop(224) (PIL)"]
    assert fast_c["psnr_median"] >= tv_c["psnr_median"] - 0.1
    assert fast_r["psnr_median"] >= tv_r["psnr_median"] - 0.1
    assert fast_c["shift_median"] <= 0.15 and fast_r["shift_median"] <= 0.15


def test_raw_hdf5_samples_are_cut_from_the_array(image_folder, tmp_path):
    from packer import PackedDataset
    from packer.codecs.resize import ResizeSpec
    from packer.commands.pack_images import pack_images

    out = tmp_path / "raw.h5"
    pack_images(image_folder, out, format="hdf5", resize=ResizeSpec(size=(40, 30)), raw=True,
                run_options=RunOptions(workers=0))
    t = DecodeRandomResizedCrop(24, seed=0)
    ds, plain = PackedDataset(out, decode=t), PackedDataset(out, decode="numpy")
    image, _ = ds[0]
    assert image.shape == (3, 24, 24) and image.dtype == torch.uint8
    arr = plain[1][0]
    ref = PilRandomResizedCrop(24, flip=0.0)(arr, rng=np.random.default_rng(5))
    got = DecodeRandomResizedCrop(24, flip=0.0)(arr, rng=np.random.default_rng(5))
    assert (got.int() - ref.int()).abs().float().mean() < 3  # the same box, bilinear both


def test_damaged_jpegs_are_errors_not_grey_pixels(monkeypatch):
    data = jpeg(600, 800, seed=3)
    data = data[: len(data) // 5]  # ~120 rows left; every box is >= 170 rows tall
    for i in range(8):
        with pytest.raises(ValueError, match="cannot decode"):
            DecodeRandomResizedCrop(64)(data, rng=np.random.default_rng(i))
    monkeypatch.setattr(jpeg_region, "_LIB", None)  # the whole-image route says the same
    with pytest.raises(ValueError, match="cannot decode"):
        DecodeRandomResizedCrop(64)(data, rng=np.random.default_rng(0))

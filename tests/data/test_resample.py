"""Exact box geometry, pinned analytically on linear ramps (the resampled ramp is known exactly)."""
from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from packer.data.decode import resample_box, to_chw3
from packer.data.decode import DecodeResizeCrop, center_box

SX, SY, C0, C1 = 1.7321, 1.4142, 10.0, 250.0  # ramp slopes (levels per source pixel; irrational-ish, so
# rounding errors do not line up) and offsets


def ramp(h: int, w: int, sx: float = SX, sy: float = SY, channels: int = 4, exact: bool = False) -> np.ndarray:
    """Planes rising and falling along x and y: R = C0 + sx x, G = C1 - sx x, B = C0 + sy y,
    A = C1 - sy y (x, y: pixel indices). Opposite slopes separate a shift (moves both planes
    of a pair the same way in pixels) from a level bias of the arithmetic (moves both up)."""
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    planes = [C0 + sx * x, C1 - sx * x, C0 + sy * y, C1 - sy * y][:channels]
    if exact:  # float32, not rounded: the geometry alone
        return np.stack(planes, axis=2).astype(np.float32)
    return np.clip(np.round(np.stack(planes, axis=2)), 0, 255).astype(np.uint8)


def errors(out: np.ndarray, box, sx: float = SX, sy: float = SY) -> tuple[float, float, float]:
    """(shift along x, shift along y, in source pixels; level bias) of a resampled ``ramp``
    against the exact answer: the ramp at each output pixel's source position."""
    top, left, bh, bw = box
    oh, ow = out.shape[:2]
    u = left + (np.arange(ow) + 0.5) * bw / ow - 0.5
    v = top + (np.arange(oh) + 0.5) * bh / oh - 0.5
    o = out.astype(np.float64)
    e_rise_x = (o[..., 0] - (C0 + sx * u)[None, :]).mean()
    e_fall_x = (o[..., 1] - (C1 - sx * u)[None, :]).mean()
    shift_x = (e_rise_x - e_fall_x) / (2 * sx)
    bias = (e_rise_x + e_fall_x) / 2
    if out.shape[2] >= 4:
        e_rise_y = (o[..., 2] - (C0 + sy * v)[:, None]).mean()
        e_fall_y = (o[..., 3] - (C1 - sy * v)[:, None]).mean()
        shift_y = (e_rise_y - e_fall_y) / (2 * sy)
    else:  # three planes: the y ramp only rises; take the bias the x pair measured
        shift_y = ((o[..., 2] - (C0 + sy * v)[:, None]).mean() - bias) / sy
    return shift_x, shift_y, bias


@pytest.mark.parametrize("box,out", [
    ((10.3, 7.6, 61.7, 80.2), (40, 50)),    # fractional box, downscale 1.5: the warp path
    ((10, 7, 60, 80), (40, 50)),            # whole-pixel box: the resize path
    ((3.25, 5.75, 30.5, 20.25), (61, 41)),  # upscale
    ((2.4, 1.2, 95.0, 110.0), (20, 22)),    # more than 2x: area reduction first
    ((6.0, 4.0, 90.0, 100.0), (31, 17)),    # whole pixels, more than 2x, odd output
])
def test_ramp_lands_where_it_should(box, out):
    exact = resample_box(ramp(100, 130, exact=True), box, *out)  # geometry alone
    mx, my, bias = errors(exact, box)
    assert abs(mx) < 1e-3 and abs(my) < 1e-3 and abs(bias) < 1e-3
    res = resample_box(ramp(100, 130), box, *out)  # uint8: 8-bit rounding of input and output
    mx, my, bias = errors(res, box)
    assert abs(mx) < 0.1 and abs(my) < 0.1  # source pixels
    assert abs(bias) < 0.3  # OpenCV's 8-bit arithmetic: a fraction of a level


def test_rounding_the_box_would_be_caught():
    img = ramp(100, 130)
    box = (10.5, 7.5, 60.0, 80.0)
    rounded = resample_box(img, (10, 8, 60, 80), 40, 50)  # the old behaviour: box rounded
    mx, my, _ = errors(rounded, box)
    assert abs(mx) > 0.45 and abs(my) > 0.45


def test_flip_mirrors_the_output():
    img = ramp(60, 70, channels=3)
    box = (5.5, 4.25, 40.0, 50.5)
    a, b = resample_box(img, box, 32, 30), resample_box(img, box, 32, 30, flip=True)
    assert np.array_equal(a[:, ::-1], b)


def test_to_chw3_drops_the_padding_channel():
    rgbx = np.random.default_rng(0).integers(0, 256, (5, 6, 4), dtype=np.uint8)
    assert np.array_equal(to_chw3(rgbx), rgbx[..., :3].transpose(2, 0, 1))
    assert np.array_equal(to_chw3(rgbx[..., :3].copy()), rgbx[..., :3].transpose(2, 0, 1))


def test_bad_boxes():
    img = ramp(10, 10, channels=3)
    with pytest.raises(ValueError, match="empty"):
        resample_box(img, (0, 0, 0, 5), 4, 4)
    with pytest.raises(ValueError, match="overlap"):
        resample_box(img, (20, 20, 5, 5), 4, 4)


def test_center_box_is_torchvision_geometry():
    # Resize(256) of 500x375 (WxH) -> 341x256; CenterCrop(224) at round(16.0), round(58.5)=58
    top, left, h, w = center_box(375, 500, 256, 224)
    assert (top, left) == pytest.approx((16 * 375 / 256, 58 * 500 / 341))
    assert (h, w) == pytest.approx((224 * 375 / 256, 224 * 500 / 341))


def sine_phase(out: np.ndarray, pos: np.ndarray, period: float) -> float:
    """The shift (source pixels) of a resampled ``128 + 100 sin(2 pi x / period)`` profile
    whose output samples sit at source positions ``pos``: least-squares phase at the known
    frequency, blind to the filter's amplitude loss and to level bias."""
    theta = 2 * np.pi * pos / period
    basis = np.stack([np.ones_like(theta), np.sin(theta), np.cos(theta)], axis=1)
    (_, a, b), *_ = np.linalg.lstsq(basis, out, rcond=None)
    return float(np.arctan2(-b, a) * period / (2 * np.pi))


@pytest.mark.parametrize("h,w", [(375, 500), (1000, 800), (1700, 2300), (150, 200)])  # no DCT
# scaling, 1/2, 1/4, upscaling
def test_decode_resize_crop_puts_a_sine_grid_in_place(h, w):
    """End to end through the JPEG (header, DCT scale, region decode, mapping, resample): a
    sine grid along x (red) and y (green) comes out at the phase torchvision's geometry says."""
    period = 8 * min(h, w) / 256  # source pixels: 8 output pixels per period
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    img = np.stack([128 + 100 * np.sin(2 * np.pi * x / period), 128 + 100 * np.sin(2 * np.pi * y / period),
                    np.full_like(x, 128)], axis=2)
    buf = io.BytesIO()
    Image.fromarray(np.round(img).astype(np.uint8)).save(buf, "JPEG", quality=100, subsampling=0)
    out = DecodeResizeCrop(256, 224)(buf.getvalue()).numpy().astype(np.float64)
    top, left, bh, bw = center_box(h, w, 256, 224)
    u = left + (np.arange(224) + 0.5) * bw / 224 - 0.5
    v = top + (np.arange(224) + 0.5) * bh / 224 - 0.5
    shift_x = sine_phase(out[0].mean(axis=0), u, period) / (bw / 224)  # output pixels
    shift_y = sine_phase(out[1].mean(axis=1), v, period) / (bh / 224)
    assert abs(shift_x) < 0.05 and abs(shift_y) < 0.05

"""packer.codecs.resize: size/aspect rules, modes, EXIF, keep-as-is, and the JPEG fast path's quality."""
from __future__ import annotations

import io

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from PIL import Image, ImageDraw

from packer.errors import CorruptSample, UsageError
from packer.codecs.image import decode_pil
from packer.codecs.resize import ResizeSpec, parse_size, plan_resize, resize_image, resize_pixels
from packer.synth import jpeg_bytes, natural_image
from tests.support import FIXTURE_IMAGES

SPECS = [ResizeSpec(short_side=48), ResizeSpec(max_side=80), ResizeSpec(size=(60, 40)),
         ResizeSpec(size=(60, 40), fit="pad"), ResizeSpec(size=(60, 40), fit="stretch"),
         ResizeSpec(size=(300, 500), fit="crop", upscale=True), ResizeSpec(short_side=2000)]
FORMATS = ["keep", "jpeg", "png", "webp"]


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float("inf") if mse == 0 else 10 * np.log10(255.0 ** 2 / mse)


def encode(im: Image.Image, fmt: str = "JPEG", **kw) -> bytes:
    buf = io.BytesIO()
    im.save(buf, fmt, **kw)
    return buf.getvalue()


def opened(data: bytes) -> Image.Image:
    im = Image.open(io.BytesIO(data))
    im.load()
    return im


def oriented_jpeg(width: int, height: int, orientation: int, seed: int = 0) -> bytes:
    """A JPEG stored width x height whose EXIF says to display it with ``orientation``."""
    exif = Image.Exif()
    exif[0x0112] = orientation
    arr = natural_image(np.random.default_rng(seed), height, width)
    arr[: height // 4, : width // 4] = (255, 0, 0)  # a marker in the stored top-left corner
    return encode(Image.fromarray(arr), quality=95, exif=exif.tobytes())


def hard_jpeg(width: int, height: int, seed: int = 1) -> bytes:
    """A photo-like image with text, thin lines and noise: the worst case for DCT scaling."""
    rng = np.random.default_rng(seed)
    im = Image.fromarray(natural_image(rng, height, width))
    draw = ImageDraw.Draw(im)
    for i in range(150):
        x, y = int(rng.integers(0, width)), int(rng.integers(0, height))
        draw.line([(x, y), (x + int(rng.integers(-300, 300)), y + int(rng.integers(-300, 300)))],
                  fill=tuple(int(c) for c in rng.integers(0, 255, 3)), width=int(rng.integers(1, 5)))
        draw.text((x, y), f"packer {i}", fill=(0, 0, 0))
    arr = np.asarray(im).astype(np.int16) + rng.normal(0, 12, size=(height, width, 3)).astype(np.int16)
    return jpeg_bytes(np.clip(arr, 0, 255).astype(np.uint8), quality=92)


# -- arguments --------------------------------------------------------------------------------
@given(st.integers(1, 65500), st.integers(1, 65500), st.sampled_from(["x", "X", " x "]))
def test_parse_size_round_trips(w, h, sep):
    assert parse_size(f"{w}{sep}{h}") == (w, h)
    assert parse_size(str(w)) == (w, w)


@pytest.mark.parametrize("text", ["", "x", "224x", "x224", "0x10", "10x0", "-5x5", "2.5x3", "axb", "70000x10", "1x2x3"])
def test_parse_size_rejects(text):
    with pytest.raises(UsageError, match="--size"):
        parse_size(text)


@pytest.mark.parametrize("kwargs, match", [
    ({}, "exactly one"),
    ({"short_side": 10, "max_side": 10}, "exactly one"),
    ({"short_side": 0}, "--short-side"),
    ({"max_side": 10 ** 6}, "--max-side"),
    ({"short_side": 10, "fit": "pad"}, "--fit applies to --size"),
    ({"size": (10, 10), "fit": "zoom"}, "--fit"),
    ({"short_side": 10, "format": "gif"}, "--format"),
    ({"short_side": 10, "quality": 0}, "--quality"),
    ({"short_side": 10, "quality": 101}, "--quality"),
])
def test_spec_validates(kwargs, match):
    with pytest.raises(UsageError, match=match):
        ResizeSpec(**kwargs)


def test_from_options():
    assert ResizeSpec.from_options() is None
    spec = ResizeSpec.from_options(size="224x160", fit="pad", quality=80, format="webp")
    assert spec == ResizeSpec(size=(224, 160), fit="pad", quality=80, format="webp")
    assert spec.to_dict() == {"size": [224, 160], "fit": "pad", "upscale": False, "format": "webp", "quality": 80}
    with pytest.raises(UsageError, match="--quality need"):
        ResizeSpec.from_options(quality=80)
    with pytest.raises(UsageError, match="--upscale need"):
        ResizeSpec.from_options(upscale=True)


# -- geometry (hypothesis over random dimensions) -----------------------------------------------
dims = st.integers(1, 6000)


@settings(max_examples=300, deadline=None)
@given(dims, dims, st.integers(1, 3000), st.booleans(), st.sampled_from(["short_side", "max_side"]))
@example(w=42, h=91, side=225, upscale=True, which="short_side")  # 91 * (225 / 42) is 487.4999... in floats
def test_side_rules(w, h, side, upscale, which):
    spec = ResizeSpec(**{which: side}, upscale=upscale)
    p = plan_resize(w, h, spec)
    ref = min(w, h) if which == "short_side" else max(w, h)
    assert p.scaled == p.out and p.crop == (0, 0) + p.out
    if side >= ref and not upscale:
        assert p.identity and p.out == (w, h)
        return
    ow, oh = p.out
    assert min(ow, oh) >= 1
    # the reference side is exactly ``side``; the other is the aspect-true length rounded half up
    if (which == "short_side") == (w <= h):
        assert ow == side and oh == max(1, int(h * side / w + 0.5))
    else:
        assert oh == side and ow == max(1, int(w * side / h + 0.5))
    assert (min(ow, oh) if which == "short_side" else max(ow, oh)) == side
    if not upscale:
        assert ow <= w and oh <= h


@settings(max_examples=300, deadline=None)
@given(dims, dims, st.integers(1, 2000), st.integers(1, 2000), st.sampled_from(["crop", "pad", "stretch"]),
       st.booleans())
def test_size_rules(w, h, bw, bh, fit, upscale):
    p = plan_resize(w, h, ResizeSpec(size=(bw, bh), fit=fit, upscale=upscale))
    assert p.out == (bw, bh)  # --size always yields exactly WxH
    sw, sh = p.scaled
    l, t, r, b = p.crop
    assert 0 <= l <= r <= sw and 0 <= t <= b <= sh
    cw, ch = r - l, b - t
    assert (cw, ch) == (min(sw, bw), min(sh, bh))  # centre crop of what overflows
    px, py = p.paste_at
    assert 0 <= px and px + cw <= bw and 0 <= py and py + ch <= bh
    if not upscale:  # the content is never enlarged
        assert sw <= w and sh <= h
    if fit == "stretch":
        assert p.scaled == ((bw, bh) if upscale else (min(bw, w), min(bh, h)))
        return
    # crop and pad keep the aspect ratio up to one pixel of rounding in one axis
    assert abs(sw * h - sh * w) <= max(w, h)
    if fit == "crop" and (upscale or (sw < w or sh < h)):
        assert sw >= bw and sh >= bh  # it covers the box when the scale is not capped
    if fit == "pad":
        assert sw <= bw and sh <= bh
        if upscale or sw < w or sh < h:
            assert sw == bw or sh == bh  # it touches the box on one axis


def test_identity_plan():
    assert plan_resize(60, 40, ResizeSpec(size=(60, 40))).identity
    assert not plan_resize(60, 40, ResizeSpec(size=(60, 41))).identity
    assert plan_resize(30, 20, ResizeSpec(short_side=20)).identity


# -- every fixture image through every mode ------------------------------------------------------
@pytest.mark.parametrize("path", sorted(FIXTURE_IMAGES.glob("*")), ids=lambda p: p.name)
def test_fixture_images_every_mode(path):
    data = path.read_bytes()
    if "truncated" in path.name:
        for spec in SPECS:
            with pytest.raises(CorruptSample, match="truncated"):
                resize_image(data, spec, key=path.name, source=str(path))
            with pytest.raises(CorruptSample):
                resize_pixels(data, spec)
        return
    upright = decode_pil(data)
    for spec in SPECS:
        plan = plan_resize(upright.shape[1], upright.shape[0], spec)
        for fmt in FORMATS:
            s = ResizeSpec(**{**spec.__dict__, "format": fmt})
            r = resize_image(data, s, key=path.name, source=str(path))
            im = opened(r.data)
            assert (im.width, im.height) == (r.width, r.height) == plan.out, (spec, fmt)
            assert r.fmt == (Image.open(io.BytesIO(data)).format.lower().replace("mpo", "jpeg")
                             if fmt == "keep" else fmt)
            assert r.fmt == {"JPEG": "jpeg", "PNG": "png", "WEBP": "webp"}[im.format]
            if r.kept:
                assert r.data == data and plan.identity
            else:
                assert im.getexif().get(0x0112) in (None, 1)  # no orientation tag left
                assert im.mode in ("L", "LA", "RGB", "RGBA")
        pixels = resize_pixels(data, spec)
        assert pixels.shape == (plan.out[1], plan.out[0], 3) and pixels.dtype == np.uint8


def test_fixture_exif_rotated_comes_out_upright():
    data = (FIXTURE_IMAGES / "pillow_hopper_orientation_6.jpg").read_bytes()
    r = resize_image(data, ResizeSpec(max_side=1000, format="png"))
    assert not r.kept  # within bounds but not upright: transposed and re-encoded
    out = opened(r.data)
    assert out.getexif().get(0x0112) is None
    assert np.array_equal(np.asarray(out.convert("RGB")), decode_pil(data))  # lossless: exactly upright
    stored = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    assert psnr(np.asarray(out.convert("RGB")), stored) < 20  # and not the stored orientation


@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientations_with_fast_path(orientation):
    data = oriented_jpeg(400, 200, orientation)
    upright = decode_pil(data)  # Pillow's exif_transpose is the reference
    for spec in (ResizeSpec(short_side=50), ResizeSpec(size=(40, 30))):
        got = resize_pixels(data, spec)
        ref = np.asarray(Image.fromarray(upright).resize(
            plan_resize(upright.shape[1], upright.shape[0], spec).scaled, Image.LANCZOS))
        plan = plan_resize(upright.shape[1], upright.shape[0], spec)
        l, t, r, b = plan.crop
        assert got.shape == (plan.out[1], plan.out[0], 3)
        assert psnr(got, ref[t:b, l:r]) > 30, (orientation, spec)


def test_upright_within_bounds_is_kept_byte_for_byte():
    data = jpeg_bytes(natural_image(np.random.default_rng(0), 40, 60))
    for spec in (ResizeSpec(short_side=40), ResizeSpec(max_side=60), ResizeSpec(size=(60, 40)),
                 ResizeSpec(short_side=100), ResizeSpec(short_side=40, format="jpeg")):
        r = resize_image(data, spec)
        assert r.kept and r.data == data and (r.width, r.height, r.channels, r.fmt) == (60, 40, 3, "jpeg")
    assert not resize_image(data, ResizeSpec(short_side=100, upscale=True)).kept
    assert not resize_image(data, ResizeSpec(short_side=40, format="png")).kept


def test_never_upscales_unless_asked():
    data = jpeg_bytes(natural_image(np.random.default_rng(0), 40, 60))
    assert resize_pixels(data, ResizeSpec(short_side=80)).shape == (40, 60, 3)
    assert resize_pixels(data, ResizeSpec(short_side=80, upscale=True)).shape == (80, 120, 3)
    padded = resize_pixels(data, ResizeSpec(size=(100, 50), fit="pad"))
    assert padded.shape == (50, 100, 3)
    assert padded[:, :20].max() == 0 and padded[:, 80:].max() == 0  # zero border around the 60x40 content
    assert padded[5:45, 20:80].mean() > 10


# -- modes ---------------------------------------------------------------------------------------
def test_mode_rules():
    rng = np.random.default_rng(3)
    rgb = natural_image(rng, 64, 96)
    la = Image.fromarray(np.dstack([rgb[:, :, 0], np.full((64, 96), 128, np.uint8)]), "LA")
    rgba = Image.fromarray(np.dstack([rgb, np.full((64, 96), 7, np.uint8)]), "RGBA")
    pal = Image.fromarray(rgb).convert("P", palette=Image.ADAPTIVE)
    pal.info["transparency"] = 0
    cases = [  # (source, format, expected mode of the output)
        (encode(la, "PNG"), "jpeg", "L"), (encode(la, "PNG"), "png", "LA"), (encode(la, "PNG"), "webp", "RGBA"),
        (encode(rgba, "PNG"), "jpeg", "RGB"), (encode(rgba, "PNG"), "png", "RGBA"),
        (encode(pal, "PNG", transparency=0), "png", "RGBA"), (encode(pal, "PNG", transparency=0), "jpeg", "RGB"),
        (encode(Image.fromarray(rgb).convert("CMYK")), "jpeg", "RGB"),
        (encode(Image.fromarray(rgb).convert("CMYK")), "keep", "RGB"),
        (encode(Image.fromarray(rgb).convert("1"), "PNG"), "png", "L"),
    ]
    for data, fmt, mode in cases:
        r = resize_image(data, ResizeSpec(short_side=32, format=fmt))
        assert opened(r.data).mode == mode, (fmt, mode)
        assert r.channels == len(mode)
    # alpha is dropped for JPEG keeping the colour under it, as the training decode does
    r = resize_image(encode(rgba, "PNG"), ResizeSpec(max_side=96, format="jpeg"))
    assert psnr(np.asarray(opened(r.data)), rgb) > 30  # (composited on black it would be < 10)


def test_16bit_grey_takes_the_high_byte():
    arr = (np.arange(64 * 32, dtype=np.uint32).reshape(32, 64) * 31).astype(np.uint16)
    data = encode(Image.fromarray(arr), "PNG")
    assert Image.open(io.BytesIO(data)).mode.startswith("I")
    assert resize_image(data, ResizeSpec(max_side=64, format="png")).kept  # within bounds: as it is
    r = resize_image(data, ResizeSpec(max_side=32, format="png"))
    high = Image.fromarray((arr >> 8).astype(np.uint8), "L")
    assert opened(r.data).mode == "L"
    assert np.array_equal(np.asarray(opened(r.data)), np.asarray(high.resize((32, 16), Image.LANCZOS)))
    assert np.array_equal(resize_pixels(data, ResizeSpec(size=(64, 32)))[:, :, 1], (arr >> 8).astype(np.uint8))


def test_icc_profile_kept_only_in_the_same_colour_family():
    icc = b"\0" * 128 + b"fake-profile"
    data = encode(Image.fromarray(natural_image(np.random.default_rng(0), 64, 64)), icc_profile=icc)
    assert opened(resize_image(data, ResizeSpec(short_side=32)).data).info.get("icc_profile") == icc
    grey = encode(Image.fromarray(natural_image(np.random.default_rng(0), 64, 64)).convert("L"), icc_profile=icc)
    assert opened(resize_image(grey, ResizeSpec(short_side=32, format="webp")).data).info.get("icc_profile") in (None, b"")


@pytest.mark.parametrize("data", [b"", b"not an image at all", b"\xff\xd8\xff\xe0" + b"\0" * 40])
def test_bad_input_fails_cleanly(data):
    with pytest.raises(CorruptSample):
        resize_image(data, ResizeSpec(short_side=10), key="k", source="s.jpg")


# -- the JPEG fast path ---------------------------------------------------------------------------
PSNR_BOUND = 34.0  # dB against a full decode + Lanczos; measured >= 35.4 on this image


@pytest.fixture(scope="module")
def hard_photo() -> bytes:
    return hard_jpeg(1200, 800)


@pytest.mark.parametrize("spec", [ResizeSpec(short_side=128), ResizeSpec(short_side=160),
                                  ResizeSpec(short_side=200), ResizeSpec(short_side=256),
                                  ResizeSpec(short_side=224), ResizeSpec(max_side=300),
                                  ResizeSpec(size=(224, 224)), ResizeSpec(size=(224, 224), fit="pad")],
                         ids=lambda s: s.describe())
def test_fast_path_psnr_bound(hard_photo, spec):
    fast = resize_pixels(hard_photo, spec)
    slow = resize_pixels(hard_photo, ResizeSpec(**{**spec.__dict__, "draft": False}))
    assert fast.shape == slow.shape
    assert not np.array_equal(fast, slow)  # the DCT-scaled decode really was used
    assert psnr(fast, slow) >= PSNR_BOUND

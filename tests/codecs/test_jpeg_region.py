"""Region-of-interest JPEG decoding (TurboJPEG 3 through ctypes): bit-exact against full decodes."""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from packer.codecs import jpeg_region
from packer.synth import natural_image

# CI (.ci/run) sets PACKER_REQUIRE_TURBO (and no $PACKER_TURBOJPEG: region decoding as a plain
# install gets it): there these tests never skip (test_library_found says why they fail instead)
pytestmark = pytest.mark.skipif(not jpeg_region.available() and not os.environ.get("PACKER_REQUIRE_TURBO"),
                                reason="no libturbojpeg >= 3.0 (docs/loading.md: region decoding)")


def test_library_found():
    assert jpeg_region.available(), "PACKER_REQUIRE_TURBO is set but no libturbojpeg >= 3.0 was found"
    assert jpeg_region.library_path()


def test_a_plain_install_decodes_regions():
    """``pip install`` builds ``packer.codecs._jpegroi``; with a Pillow wheel that bundles
    libjpeg-turbo (Linux, macOS) region decoding is then on in a fresh interpreter, with no
    ``$PACKER_TURBOJPEG`` and no system library: through Pillow's copy."""
    if not jpeg_region._pillow_libjpeg():
        pytest.skip("this Pillow ships no libjpeg-turbo shared library (a source build, Windows)")
    try:
        from packer.codecs import _jpegroi  # noqa: F401
    except ImportError:
        pytest.skip("packer.codecs._jpegroi is not built here (pip install -e . builds it)")
    env = {k: v for k, v in os.environ.items() if k != "PACKER_TURBOJPEG"}
    code = ("import json; from packer.codecs import jpeg_region as j; "
            "print(json.dumps([j.backend(), j.library_path(), j.describe()]))")
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    r = subprocess.run([sys.executable, "-c", code], cwd=repo, env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    backend, path, line = json.loads(r.stdout.strip().splitlines()[-1])
    assert backend == "libjpeg" and path in jpeg_region._pillow_libjpeg(), line
    assert line.startswith("on (libjpeg: ")


def jpeg(h: int, w: int, *, subsampling: int = 2, mode: str = "RGB", seed: int = 0, **save) -> bytes:
    im = Image.fromarray(natural_image(np.random.default_rng(seed), h, w))
    if mode != "RGB":
        im = im.convert(mode)
    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=90, subsampling=subsampling if mode == "RGB" else 0, **save)
    return buf.getvalue()


def full(data: bytes, scale: int) -> np.ndarray:
    head = jpeg_region.read_header(data)
    return jpeg_region.decode_region(data, 0, 0, jpeg_region.scaled(head.width, scale),
                                     jpeg_region.scaled(head.height, scale), scale=scale)


def test_whole_image_equals_pillow():
    for subsampling in (0, 1, 2):
        data = jpeg(75, 93, subsampling=subsampling)
        ref = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
        assert np.array_equal(full(data, 1), ref)
    grey = jpeg(40, 50, mode="L")
    ref = np.asarray(Image.open(io.BytesIO(grey)).convert("RGB"))
    assert np.array_equal(full(grey, 1), ref)  # grey becomes RGB by repetition, as Pillow does


def test_scaled_whole_image_equals_pillow_draft():
    data = jpeg(301, 403)
    for k in (2, 4, 8):
        im = Image.open(io.BytesIO(data))
        im.draft("RGB", (403 // k, 301 // k))  # Pillow picks the 1/k IDCT for floor sizes
        assert np.array_equal(full(data, k), np.asarray(im.convert("RGB"))), k


@settings(max_examples=150, deadline=None)
@given(st.sampled_from([0, 1, 2, -1]), st.sampled_from([1, 2, 4, 8]), st.floats(0, 1), st.floats(0, 1),
       st.floats(0, 1), st.floats(0, 1), st.sampled_from([3, 4]), st.booleans())
def test_region_is_bit_exact(subsampling, k, fx, fy, fw, fh, channels, progressive):
    data = jpeg(187, 251, subsampling=max(subsampling, 0), mode="L" if subsampling < 0 else "RGB",
                progressive=progressive)
    ref = full(data, k)
    sh, sw = ref.shape[:2]
    w, h = max(1, round(fw * sw)), max(1, round(fh * sh))
    x, y = round(fx * (sw - w)), round(fy * (sh - h))
    out = jpeg_region.decode_region(data, x, y, w, h, scale=k, channels=channels)
    assert out.shape == (h, w, channels)
    assert np.array_equal(out[..., :3], ref[y:y + h, x:x + w])


def test_threads_get_their_own_decoder():
    data = [jpeg(120, 160, seed=s) for s in range(4)]
    refs = [full(d, 1)[10:90, 20:140] for d in data]
    bad = []

    def work(i: int) -> None:
        for _ in range(30):
            out = jpeg_region.decode_region(data[i], 20, 10, 120, 80)
            if not np.array_equal(out, refs[i]):
                bad.append(i)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not bad


def test_what_it_leaves_to_the_full_decoders():
    good = jpeg(64, 80)
    cmyk = io.BytesIO()
    Image.new("CMYK", (32, 32), (10, 20, 30, 40)).save(cmyk, "JPEG")
    png = io.BytesIO()
    Image.new("RGB", (8, 8)).save(png, "PNG")
    assert jpeg_region.read_header(cmyk.getvalue()) is None
    assert jpeg_region.decode_region(cmyk.getvalue(), 0, 0, 8, 8) is None
    assert jpeg_region.decode_region(png.getvalue(), 0, 0, 8, 8) is None
    assert jpeg_region.decode_region(good[: len(good) // 2], 0, 0, 80, 64) is None  # warning: truncated
    assert jpeg_region.decode_region(good, 0, 0, 8, 8, scale=3) is None
    assert jpeg_region.read_header(good) == (80, 64, 2)
    with pytest.raises(ValueError, match="outside"):
        jpeg_region.decode_region(good, 70, 0, 20, 10)


@pytest.mark.parametrize("subsampling", [1, 2])
def test_every_thin_region_is_bit_exact(subsampling):
    """Cropped edges next to every column: fancy chroma upsampling needs the margin."""
    data = jpeg(45, 61, subsampling=subsampling)
    for k in (1, 2):
        ref = full(data, k)
        h, w = ref.shape[:2]
        for x in range(w):
            for width in (1, 2, 3):
                if x + width <= w:
                    out = jpeg_region.decode_region(data, x, 3, width, h - 5, scale=k)
                    assert np.array_equal(out, ref[3:h - 2, x:x + width]), (k, x, width)


def test_rows_below_the_region_are_never_decoded():
    """A JPEG cut short below the region still gives the region (bit-exact); one cut inside it
    gives None (the full decoders decide)."""
    data = jpeg(160, 120, seed=4)
    ref = full(data, 1)
    cut = data[: len(data) * 3 // 5]  # about the first 90 rows left
    assert np.array_equal(jpeg_region.decode_region(cut, 10, 4, 100, 40), ref[4:44, 10:110])
    assert jpeg_region.decode_region(cut, 10, 100, 100, 40) is None

"""Probe/check and decode: every decoder gives the same pixels under the one decoding rule."""
from __future__ import annotations

import io
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image, ImageOps

from packer.codecs import image as imaging
from packer.errors import CorruptSample
from packer.synth import jpeg_bytes, natural_image
from tests.support import FIXTURE_IMAGES


@pytest.mark.parametrize("name", sorted(p.name for p in FIXTURE_IMAGES.iterdir()))
def test_fixture_decoders_agree(name):
    data = (FIXTURE_IMAGES / name).read_bytes()
    if name == "pillow_truncated_jpeg.jpg":
        with pytest.raises(CorruptSample, match="truncated"):
            imaging.probe(data, key=name, source=name)
        assert imaging.probe(data, check="header").fmt == "jpeg"  # the header is fine
        return
    info = imaging.probe(data, key=name, source=name)
    fast, ref = imaging.decode(data), imaging.decode_pil(data)
    assert fast.dtype == np.uint8 and fast.shape[2] == 3
    np.testing.assert_array_equal(fast, ref)
    upright = ImageOps.exif_transpose(Image.open(io.BytesIO(data)))
    assert fast.shape[:2] == (upright.height, upright.width)
    assert (info.height, info.width) == (Image.open(io.BytesIO(data)).height, Image.open(io.BytesIO(data)).width)


def test_exif_orientation_parsed():
    assert imaging.jpeg_orientation((FIXTURE_IMAGES / "pillow_hopper_orientation_6.jpg").read_bytes()) == 6
    assert imaging.jpeg_orientation((FIXTURE_IMAGES / "pillow_hopper.jpg").read_bytes()) == 1


@pytest.mark.parametrize("orientation", range(1, 9))
def test_orientation_applied_on_every_path(orientation):
    arr = natural_image(np.random.default_rng(orientation), 24, 40)
    exif = Image.Exif()
    exif[0x0112] = orientation
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "JPEG", quality=95, exif=exif)
    data = buf.getvalue()
    assert imaging.jpeg_orientation(data) == orientation
    np.testing.assert_array_equal(imaging.decode(data), imaging.decode_pil(data))
    expect = (24, 40) if orientation <= 4 else (40, 24)
    assert imaging.decode(data).shape[:2] == expect


@pytest.mark.parametrize("forced", ["pillow", "opencv", "simplejpeg"])
def test_every_decoder_choice_gives_identical_pixels(forced, tmp_path):
    data = jpeg_bytes(natural_image(np.random.default_rng(3), 60, 80))
    (tmp_path / "x.jpg").write_bytes(data)
    code = ("import sys, numpy as np; from packer.codecs import image as imaging; "
            f"a = imaging.decode(open(r'{tmp_path / 'x.jpg'}','rb').read()); "
            f"np.save(r'{tmp_path / 'out.npy'}', a); print(imaging.DECODER)")
    out = subprocess.run([sys.executable, "-c", code], env={"PACKER_DECODER": forced, "PATH": "",
                                                        "PYTHONPATH": os.environ.get("PYTHONPATH", "")},
                         capture_output=True, text=True, check=True).stdout.strip()
    if forced == "simplejpeg" and out != "simplejpeg":
        # CI installs the turbo extra (.ci/run) and sets PACKER_REQUIRE_TURBO, so there this
        # test cannot skip.
        if os.environ.get("PACKER_REQUIRE_TURBO"):
            pytest.fail("PACKER_REQUIRE_TURBO is set but simplejpeg is not usable")
        pytest.skip("simplejpeg not installed (the turbo extra)")
    assert out == forced
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), imaging.decode_pil(data))


@pytest.mark.parametrize("data,reason", [(b"", "empty"), (b"hello", "not a readable image"),
                                         (b"\xff\xd8\xff\xe0" + b"\0" * 40, "not a readable image")])
def test_bad_bytes(data, reason):
    with pytest.raises(CorruptSample, match=reason):
        imaging.probe(data, key="k", source="/src/k.jpg")


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=2000))
def test_orientation_parser_never_crashes(blob):
    assert 1 <= imaging.jpeg_orientation(b"\xff\xd8" + blob) <= 8
    try:
        imaging.decode(b"\xff\xd8\xff" + blob)
    except ValueError:
        pass

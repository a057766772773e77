"""``jpeg_header`` gives Pillow's header verdict for every file: the same size and channels
where it answers, None (Pillow decides) wherever Pillow would fail or judge."""
from __future__ import annotations

import io

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from PIL import Image

from packer.codecs.image import probe, stored_channels as _channels
from packer.codecs.jpeg_header import jpeg_header
from packer.errors import CorruptSample


def pil_header(data: bytes):
    """What Pillow's header parse says: (height, width, channels), or the exception type."""
    try:
        im = Image.open(io.BytesIO(data))
        return (im.height, im.width, _channels(im)) if im.format == "JPEG" else "not-jpeg"
    except Exception as e:  # noqa: BLE001 - any failure counts as a failure
        return type(e).__name__


def jpeg(mode: str, h: int, w: int, **save) -> bytes:
    rng = np.random.default_rng(h * 1000 + w)
    channels = {"L": 1, "RGB": 3, "CMYK": 4}[mode]
    arr = rng.integers(0, 255, size=(h, w, channels), dtype=np.uint8)
    im = Image.fromarray(arr[:, :, 0] if mode == "L" else arr, mode if mode != "CMYK" else None)
    if mode == "CMYK":
        im = Image.fromarray(arr[:, :, :3], "RGB").convert("CMYK")
    buf = io.BytesIO()
    im.save(buf, "JPEG", **save)
    return buf.getvalue()


BASES = [jpeg("RGB", 40, 56), jpeg("L", 17, 9), jpeg("CMYK", 12, 30), jpeg("RGB", 33, 20, progressive=True),
         jpeg("RGB", 8, 8, quality=100, subsampling=0), jpeg("RGB", 24, 24, comment=b"hello"),
         jpeg("RGB", 30, 31, exif=Image.Exif().tobytes()), jpeg("RGB", 16, 48, optimize=True),
         jpeg("RGB", 20, 20, icc_profile=b"\0" * 300), jpeg("RGB", 64, 64, restart_marker_blocks=1)]


@pytest.mark.parametrize("data", BASES)
def test_answers_like_pillow_on_real_jpegs(data):
    fast = jpeg_header(data)
    assert fast is None or fast == pil_header(data)


def test_plain_jpegs_take_the_fast_path():
    assert jpeg_header(BASES[0]) == (40, 56, 3)
    assert jpeg_header(BASES[1]) == (17, 9, 1)
    assert jpeg_header(BASES[3]) == (33, 20, 3)  # progressive
    assert jpeg_header(BASES[6]) is None  # EXIF: Pillow decides


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(base=st.sampled_from(BASES), cut=st.integers(0, 700),
       flips=st.lists(st.tuples(st.integers(0, 700), st.integers(0, 255)), max_size=4))
def test_never_disagrees_with_pillow_on_damaged_headers(base, cut, flips):
    data = bytearray(base[:max(cut, 0)] if cut < 650 else base)
    for at, value in flips:
        if at < len(data):
            data[at] = value
    data = bytes(data)
    fast = jpeg_header(data)
    if fast is not None:
        assert fast == pil_header(data)


def test_probe_header_gives_the_same_info_either_way():
    for data in BASES:
        info = probe(data, check="header")
        assert (info.height, info.width, info.channels) == pil_header(data) and info.fmt == "jpeg"
    with pytest.raises(CorruptSample):
        probe(BASES[0][:2] + b"\x00" * 40, check="header")

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


def _cold(data: bytes):
    """``jpeg_header``'s verdict with no remembered layout (a full walk)."""
    from packer.codecs import jpeg_header as module

    module._last = None
    return module.jpeg_header(data)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(base=st.sampled_from(BASES), size=st.tuples(st.integers(0, 70000), st.integers(0, 70000)),
       precision=st.sampled_from([8, 8, 12, 0]), layers=st.sampled_from([None, None, 1, 2, 3, 4, 0]),
       cut=st.integers(0, 700), flips=st.lists(st.tuples(st.integers(0, 700), st.integers(0, 255)), max_size=3))
def test_a_remembered_layout_gives_the_walks_verdict(base, size, precision, layers, cut, flips):
    """A file that shares the last plain JPEG's layout is answered from it; whatever differs
    (the size, a cut, a flipped byte anywhere in the header) still gets the full walk's verdict."""
    from packer.codecs import jpeg_header as module

    data = bytearray(base)
    sof = next((i for i in range(2, len(data) - 1) if data[i] == 0xFF and data[i + 1] in (0xC0, 0xC1, 0xC2)), None)
    if sof is not None:  # a new size in the SOF: the common case of one encoder's files
        data[sof + 5:sof + 9] = bytes((size[0] >> 8 & 0xFF, size[0] & 0xFF, size[1] >> 8 & 0xFF, size[1] & 0xFF))
        data[sof + 4] = precision
        if layers is not None:
            data[sof + 9] = layers
    data = data[:cut] if cut < 650 else data
    for at, value in flips:
        if at < len(data):
            data[at] = value
    data = bytes(data)
    expected = _cold(data)
    module._last = None
    module.jpeg_header(base)  # primes the layout when base is plain
    assert module.jpeg_header(data) == expected
    assert module.jpeg_header(memoryview(bytearray(data))) == expected  # a view too
    if expected is not None:
        assert expected == pil_header(data)


def test_one_encoders_files_are_answered_from_the_layout():
    from packer.codecs import jpeg_header as module

    module._last = None
    assert module.jpeg_header(BASES[0]) == (40, 56, 3) and module._last is not None
    other = jpeg("RGB", 41, 57)  # the same encoder settings, another size
    assert module._replay(other, module._last) == (41, 57, 3) == pil_header(other)
    assert module._replay(BASES[1], module._last) is None  # another layout: walked in full


def test_a_file_cut_inside_its_scan_header_is_walked_not_remembered():
    from packer.codecs import jpeg_header as module

    base = BASES[0]
    sos = base.index(b"\xff\xda")
    for cut in range(sos + 2, sos + 14):  # the SOS marker, its length and part of its body
        module._last = None
        module.jpeg_header(base)
        assert module.jpeg_header(base[:cut]) == _cold(base[:cut]) == jpeg_header(base[:cut])

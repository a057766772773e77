"""``--check full`` decodes a colour JPEG to luma only (``packer.codecs.image.decode_all``): its
verdict, and the reason it records, must be those of Pillow's decode into the image's own mode,
on every file: intact, cut, flipped or with any chroma sampling."""
from __future__ import annotations

import io

import cv2
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st
from PIL import Image

from packer.codecs.image import ImageInfo, decode_all, format_name, probe, reading_image, stored_channels
from packer.errors import CorruptSample
from tests.support import FIXTURE_IMAGES

FIXTURES = FIXTURE_IMAGES


def reference(data: bytes) -> ImageInfo | str:
    """Pillow's full decode in the image's own mode: the info (of the decoded image, as the check
    gave it before it decoded luma), or the reason a check records."""
    try:
        with reading_image("k", "s"):
            im = Image.open(io.BytesIO(data))
            im.load()
            return ImageInfo(format_name(im), im.height, im.width, stored_channels(im))
    except CorruptSample as e:
        return e.reason


def checked(data: bytes) -> ImageInfo | str:
    try:
        return probe(data, check="full", key="k", source="s")
    except CorruptSample as e:
        return e.reason


def _smooth(h: int, w: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return cv2.GaussianBlur(rng.integers(0, 256, (h, w, 3), dtype=np.uint8), (5, 5), 2)


def _pillow(arr: np.ndarray, **save) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "JPEG", quality=85, **save)
    return buf.getvalue()


def _opencv(arr: np.ndarray, sampling: int, restart: int = 0) -> bytes:
    ok, buf = cv2.imencode(".jpg", arr, [cv2.IMWRITE_JPEG_SAMPLING_FACTOR, sampling,
                                         cv2.IMWRITE_JPEG_RST_INTERVAL, restart])
    assert ok
    return buf.tobytes()


_ARR = _smooth(45, 61, 0)
# components stored as R, G, B (Adobe transform 0: no YCbCr), decoded to luma too
RGB_STORED = _pillow(_ARR, keep_rgb=True, subsampling=0)
BASES = ([_pillow(_ARR, subsampling=s, progressive=p) for s in (0, 1, 2) for p in (False, True)]
         + [_opencv(_ARR, s, r) for s in (cv2.IMWRITE_JPEG_SAMPLING_FACTOR_411, cv2.IMWRITE_JPEG_SAMPLING_FACTOR_440,
                                          cv2.IMWRITE_JPEG_SAMPLING_FACTOR_422) for r in (0, 2)]
         + [RGB_STORED]
         + [(FIXTURES / name).read_bytes() for name in ("pillow_flower.jpg", "pillow_hopper_gray.jpg",
                                                         "pillow_pil_sample_cmyk.jpg", "pillow_truncated_jpeg.jpg",
                                                         "pillow_hopper_orientation_6.jpg")])


def _sof(data: bytes) -> int:
    """Where the frame header (SOF0/1/2) of a JPEG starts."""
    at = 2
    while data[at + 1] not in (0xC0, 0xC1, 0xC2):
        at += 2 + int.from_bytes(data[at + 2:at + 4], "big")
    return at


@pytest.mark.parametrize("data", BASES + [path.read_bytes() for path in sorted(FIXTURES.iterdir())
                                            if path.suffix != ".jpg"])
def test_the_verdict_is_the_reference_decodes_on_real_files(data):
    assert checked(data) == reference(data)


def _gif(transparent: bool) -> bytes:
    buf = io.BytesIO()
    im = Image.fromarray(_ARR[:, :, 0] // 64).convert("P")
    im.save(buf, "GIF", **({"transparency": 0} if transparent else {}))
    return buf.getvalue()


@pytest.mark.parametrize("data", [_gif(False), _gif(True)])
def test_other_formats_are_described_as_before(data):
    assert checked(data) == reference(data)


def test_a_plain_colour_jpeg_is_decoded_to_luma_and_the_rest_as_stored():
    assert Image.open(io.BytesIO(RGB_STORED)).info.get("adobe_transform") == 0  # really R, G, B
    for data, luma in ((BASES[0], True), (BASES[5], True), (BASES[6], True), (RGB_STORED, True),
                       (BASES[-4], False), (BASES[-3], False)):  # 4:4:4, 4:2:0, 4:1:1, RGB; grey; CMYK
        im = Image.open(io.BytesIO(data))
        stored = im.mode
        decode_all(im, data)
        assert im.mode == ("L" if luma else stored)


def test_a_truncated_jpeg_is_still_a_failure():
    assert reference(BASES[-2]) == checked(BASES[-2])
    assert isinstance(checked(BASES[-2]), str)
    whole = BASES[2]
    for cut in (len(whole) // 2, len(whole) - 10):
        assert isinstance(checked(whole[:cut]), str)


@pytest.mark.parametrize("base", [0, 2, 6, 8, 10])
def test_every_chroma_sampling_gets_the_reference_verdict(base):
    """Sampling factors that are no whole fraction of the largest fail only in the chroma
    upsampling a luma decode skips: they must take the reference decode."""
    data = BASES[base]
    at = _sof(data)
    failed = 0
    for component in range(3):
        for factors in range(256):
            changed = bytearray(data)
            changed[at + 10 + 3 * component + 1] = factors
            changed = bytes(changed)
            want = reference(changed)
            assert checked(changed) == want, (component, hex(factors))
            failed += isinstance(want, str)
    assert failed  # the sweep includes files the reference rejects


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(base=st.sampled_from(BASES), cut=st.integers(2, 20000),
       flips=st.lists(st.tuples(st.integers(0, 20000), st.integers(0, 255)), max_size=4),
       insert=st.tuples(st.integers(0, 20000), st.binary(max_size=6)))
@example(base=BASES[2], cut=20000, flips=[(600, 0x00)], insert=(0, b""))
def test_damaged_files_get_the_reference_verdict_and_reason(base, cut, flips, insert):
    data = bytearray(base[:cut])
    for at, value in flips:
        if at < len(data):
            data[at] = value
    at, extra = insert
    data[at:at] = extra
    data = bytes(data)
    assert checked(data) == reference(data)

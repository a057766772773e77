"""Metadata faults (issue 31, case 5): every decode path gives the reference's orientation and
colours, wherever the JPEG syntax puts the metadata.

The reference is Pillow's decode + ``ImageOps.exif_transpose`` (``decode_pil``: what a
torchvision pipeline gives). The files are generated (``tests/jpeg_layouts.py``): fill bytes
before markers, metadata segments in any order among the tables, ICC profiles and XMP past
64 KB, EXIF orientation 1-8 in either byte order as SHORT, LONG, SSHORT, SLONG, BYTE or FLOAT
(in IFD0, or in IFD1 or the Exif sub-IFD where Pillow does not look), Adobe APP14 transforms
0/1/2, JFIF or not, grey, YCbCr and CMYK sources; and files whose metadata the parser leaves to
Pillow (junk between segments, two Exif blocks, a RATIONAL orientation, ...). Each decoder is chosen by ``packer.codecs.image.DECODER`` (what
``PACKER_DECODER`` sets), so each real decoder runs.
"""
from __future__ import annotations

import contextlib
import io
import warnings

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from PIL import Image

from tests.support.jpeg_layouts import Layout, build, exif_segment, layouts
from packer.codecs import image as imaging, jpeg_region
from packer.codecs import jpeg_meta as jpeg_meta_module
from packer.codecs.jpeg_meta import jpeg_meta, orient
from packer.data.decode import DecodeRandomResizedCrop, DecodeResizeCrop, decode_scaled

DECODERS = ["pillow", "opencv"] + (["simplejpeg"] if imaging._simplejpeg is not None else [])

# the issue's files: the APP1 after a fill byte (FF FF E1), the Exif APP1 after 64 KB of ICC
# or of XMP, and the Adobe layouts OpenCV and Pillow decoded differently
ISSUE_CASES = {
    "fill-byte-before-app1": Layout(orientation=6, fills=(1,), height=30, width=40),
    "exif-after-70kb-icc": Layout(orientation=8, icc=70_000, positions=(0, 0), height=30, width=40),
    "exif-after-64kb-xmp": Layout(orientation=3, xmp=65_000, com=60_000, positions=(0, 2, 1), height=30, width=40),
    "big-endian-long": Layout(orientation=5, order="MM", kind=4, fills=(2, 0, 1), height=30, width=40),
    "adobe-transform-0-with-jfif": Layout(adobe=0, orientation=4, height=30, width=40),
    "adobe-transform-0-no-jfif": Layout(adobe=0, jfif=False, height=30, width=40),
    "cmyk-without-adobe": Layout(mode="CMYK", drop_adobe=True, orientation=7, height=30, width=40),
    "ycck": Layout(mode="CMYK", adobe=2, orientation=2, icc=70_000, height=30, width=40),
    "adobe-rgb-after-70kb-icc": Layout(adobe=0, jfif=False, icc=70_000, positions=(0,), height=30, width=40),
    "ycck-after-70kb-icc": Layout(mode="CMYK", adobe=2, jfif=False, icc=70_000, positions=(0,), height=30, width=40),
}


@contextlib.contextmanager
def decoder(name: str):
    """Run with ``packer.codecs.image.DECODER`` set to ``name`` (as ``PACKER_DECODER`` would)."""
    before = imaging.DECODER
    imaging.DECODER = name
    try:
        yield
    finally:
        imaging.DECODER = before


def pillow_view(data: bytes) -> tuple[Image.Image, int]:
    """Pillow's opened image and the orientation ``exif_transpose`` applies to it (1 when none)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        im = Image.open(io.BytesIO(data))
        value = im.getexif().get(0x0112, 1)
    return im, value if value in (2, 3, 4, 5, 6, 7, 8) else 1


def check_parser(data: bytes) -> None:
    """``jpeg_meta`` reads what Pillow reads, and never defers on a legal layout."""
    meta = jpeg_meta(data)
    assert meta is not None, "a legal layout must be parsed, not left to Pillow"
    im, orientation = pillow_view(data)
    assert meta.orientation == orientation
    assert (meta.width, meta.height) == im.size
    assert meta.components == len(im.getbands())
    assert meta.icc == bool(im.info.get("icc_profile"))
    assert meta.adobe == im.info.get("adobe_transform")
    ref = imaging.decode_pil(data)
    assert meta.upright_size == ref.shape[:2]
    assert np.array_equal(orient(np.asarray(im.convert("RGB")), meta.orientation), ref)


def check_decoders(data: bytes) -> None:
    """Every decode entry point under every decoder gives the reference's pixels."""
    ref = imaging.decode_pil(data)
    h, w = ref.shape[:2]
    crop = DecodeResizeCrop(min(h, w), min(h, w) - 2)  # DCT scale 1: exact against the array path
    small = DecodeResizeCrop(min(h, w), max(2, min(h, w) // 4))  # DCT scale 1/2 or 1/4, region decode
    rrc = DecodeRandomResizedCrop((h - 1, w - 1), scale=(1.0, 1.0), ratio=(w / h, w / h), flip=0.5)
    want_crop, want_rrc = crop(ref), rrc(ref, rng=np.random.default_rng(7))
    with decoder("pillow"):
        want_small = small(data)  # Pillow's own 1/k decode (draft) + exif_transpose
        want_scaled = decode_scaled(data, 2)
    for name in DECODERS:
        with decoder(name):
            got = imaging.decode(data)
            assert got.shape == ref.shape and np.array_equal(got, ref), name
            assert torch.equal(crop(data), want_crop), name
            assert torch.equal(rrc(data, rng=np.random.default_rng(7)), want_rrc), name
            assert torch.equal(small(data), want_small), name
            assert np.array_equal(decode_scaled(data, 2), want_scaled), name
            assert imaging.jpeg_orientation(data) == pillow_view(data)[1]


@pytest.mark.parametrize("case", sorted(ISSUE_CASES))
def test_issue_layouts_decode_as_the_reference(case):
    """The reported files: each decoder and crop upright and in Pillow's colours."""
    data = build(ISSUE_CASES[case])
    check_parser(data)
    check_decoders(data)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow],
          derandomize=True)
@given(layouts())
@example(ISSUE_CASES["fill-byte-before-app1"])
@example(ISSUE_CASES["exif-after-70kb-icc"])
def test_generated_layouts_parse_as_pillow_reads_them(layout):
    check_parser(build(layout))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow],
          derandomize=True)
@given(layouts())
def test_generated_layouts_decode_as_the_reference(layout):
    check_decoders(build(layout))


def with_segments(data: bytes, *segs: tuple[int, bytes], junk: bytes = b"") -> bytes:
    """``data`` with marker segments right after its SOI (and ``junk`` bytes after them)."""
    raw = b"".join(bytes([0xFF, m]) + (len(p) + 2).to_bytes(2, "big") + p for m, p in segs)
    return data[:2] + raw + junk + data[2:]


_XMP = b"http://ns.adobe.com/xap/1.0/\0<x:xmpmeta><tiff:Orientation>6</tiff:Orientation></x:xmpmeta>"
_BASE = Layout(height=30, width=40)
# parsed: Pillow's reading is promised (orientation as Pillow applies it)
PARSED = {
    "xmp-orientation-only": (with_segments(build(_BASE), (0xE1, _XMP)), 6),
    "exif-wins-over-xmp": (with_segments(build(Layout(orientation=3, height=30, width=40)), (0xE1, _XMP)), 3),
    "byte-orientation-is-present-not-applied": (
        with_segments(build(_BASE), (0xE1, exif_segment(6, kind=1)), (0xE1, _XMP)), 1),
    "float-orientation": (with_segments(build(_BASE), (0xE1, exif_segment(8, kind=11, order="MM"))), 8),
    "sshort-orientation-9": (with_segments(build(_BASE), (0xE1, exif_segment(9, kind=8))), 1),
}
# left to Pillow: the parser returns None and every path decodes with Pillow
DEFERRED = {
    "junk-before-a-marker": with_segments(build(Layout(orientation=6, height=30, width=40)), (0xFE, b"c"),
                                          junk=b"\x00"),
    "two-exif-blocks": with_segments(build(_BASE), (0xE1, exif_segment(1)), (0xE1, exif_segment(6))),
    "rational-orientation": with_segments(build(_BASE), (0xE1, exif_segment(6, kind=5))),
    "orientation-twice": with_segments(build(_BASE), (0xE1, exif_segment(6, twice=True))),
    "mpf-app2": with_segments(build(Layout(orientation=6, height=30, width=40)), (0xE2, b"MPF\0" + b"\0" * 16)),
    "bigtiff-exif": with_segments(build(_BASE), (0xE1, b"Exif\0\0II+\0" + b"\0" * 16)),
}


@pytest.mark.parametrize("case", sorted(PARSED))
def test_other_orientation_sources_as_pillow_reads_them(case):
    data, orientation = PARSED[case]
    check_parser(data)
    assert jpeg_meta(data).orientation == orientation
    check_decoders(data)


@pytest.mark.parametrize("case", sorted(DEFERRED))
def test_metadata_the_parser_cannot_promise_is_decoded_by_pillow(case):
    data = DEFERRED[case]
    assert jpeg_meta(data) is None
    check_decoders(data)


@pytest.mark.parametrize("fmt", ["PNG", "WEBP"])
def test_exif_in_png_and_webp_is_applied_as_pillow_applies_it(fmt):
    """OpenCV no longer reads EXIF: a PNG eXIf chunk or a WebP EXIF chunk sends the file to
    Pillow, whose exif_transpose is the reference."""
    from packer.synth import natural_image

    exif = Image.Exif()
    exif[0x0112] = 6
    buf = io.BytesIO()
    Image.fromarray(natural_image(np.random.default_rng(0), 20, 36)).save(buf, fmt, exif=exif, lossless=True)
    data = buf.getvalue()
    ref = imaging.decode_pil(data)
    assert ref.shape[:2] == (36, 20)
    for name in DECODERS:
        with decoder(name):
            assert np.array_equal(imaging.decode(data), ref), name
            assert torch.equal(DecodeResizeCrop(20, 18)(data), DecodeResizeCrop(20, 18)(ref)), name


def test_a_remembered_header_answers_for_the_same_bytes_only():
    """The next file of one encoder is answered from the last walk (its size read anew); a file
    whose header differs anywhere else (here its EXIF orientation) is walked."""
    first = build(Layout(orientation=6, height=30, width=40))
    same_but_size = build(Layout(orientation=6, height=33, width=20))
    other = build(Layout(orientation=3, height=30, width=40))
    assert jpeg_meta(first).orientation == 6
    remembered = jpeg_meta_module._last
    meta = jpeg_meta(same_but_size)
    assert jpeg_meta_module._last is remembered  # answered without a walk
    assert meta == jpeg_meta_module._walk(same_but_size) and (meta.height, meta.width) == (33, 20)
    assert jpeg_meta(other).orientation == 3
    assert jpeg_meta_module._last is not remembered
    check_decoders(same_but_size)


def test_turbo_region_decode_is_told_the_orientation():
    """With the turbo extra, the region decode (stored orientation) serves upright files only:
    an oriented file behind a fill byte and 64 KB of ICC is still cropped upright."""
    pytest.importorskip("simplejpeg")
    if not jpeg_region.available():
        pytest.skip("no TurboJPEG 3 library")
    data = build(Layout(orientation=6, fills=(1, 2), icc=70_000, height=64, width=96))
    ref = imaging.decode_pil(data)
    assert ref.shape[:2] == (96, 64)
    with decoder("simplejpeg"):
        got = DecodeResizeCrop(64, 16)(data)
    with decoder("pillow"):
        want = DecodeResizeCrop(64, 16)(data)
    assert torch.equal(got, want)


def test_packed_dataset_decode_modes(tmp_path):
    """``PackedDataset``'s decode modes and a crop as its ``decode=`` give the reference."""
    from packer.api import pack
    from packer.data.datasets import PackedDataset

    src = tmp_path / "src" / "a"
    src.mkdir(parents=True)
    files = {f"{name}.jpg": build(layout) for name, layout in ISSUE_CASES.items()}
    for name, data in files.items():
        (src / name).write_bytes(data)
    pack(tmp_path / "src", tmp_path / "out.lmdb", format="lmdb")
    crop = DecodeResizeCrop(28, 26)
    for name in DECODERS:
        with decoder(name):
            for mode in ("numpy", "tensor", "pil", crop):
                ds = PackedDataset(tmp_path / "out.lmdb", decode=mode)
                for i, key in enumerate(ds.keys):
                    ref = imaging.decode_pil(files[key.split("/")[-1]])
                    got, _ = ds[i]
                    if mode == "tensor":
                        got = got.permute(1, 2, 0).numpy()
                    elif mode == "pil":
                        got = np.asarray(got)
                    elif mode is crop:
                        ref = crop(ref)
                        assert torch.equal(got, ref), (name, key)
                        continue
                    assert np.array_equal(got, ref), (name, mode, key)

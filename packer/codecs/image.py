"""Check, probe and decode one image.

Decoding rule (the same for every decoder, so ``decode="pil"|"numpy"|"tensor"`` agree):
EXIF orientation is applied; grey, CMYK, palette and 16-bit sources become 3-channel uint8
RGB; an alpha channel is dropped (the colour under it is kept, as OpenCV and Pillow's
``convert("RGB")`` both do); 16-bit samples are scaled to 8 bits by taking the high byte.
The fastest decoder available at run time is used for JPEG: simplejpeg (the optional ``turbo``
extra; its wheels bundle libjpeg-turbo 3, nothing to install with apt) when it imports, else
OpenCV's ``imdecode``, else Pillow; all three give identical pixels (tested). The reference is
Pillow + ``ImageOps.exif_transpose`` (what torchvision's pipeline gives): the fast decoders
decode the stored pixels only (OpenCV with ``IMREAD_IGNORE_ORIENTATION``), the orientation is
the one ``packer.codecs.jpeg_meta`` reads as Pillow does, and any JPEG that parser cannot
promise (odd EXIF, CMYK/YCCK, an Adobe APP14, 12-bit, ...) is decoded by Pillow. CPU per
475x500 JPEG, one thread, each decoder in a fresh process (``python -m
scripts.bench.jpeg_decoders decoders``, two runs): Pillow 2.5-3.2 ms, OpenCV 1.6-1.8 ms,
simplejpeg 0.77-0.83 ms, jpeg4py 0.81-0.82 ms, all with Pillow's pixels.
``PACKER_DECODER=simplejpeg|opencv|pillow`` forces one.
"""
from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import warnings
from dataclasses import dataclass
from typing import Iterator

import numpy as np
from PIL import Image, ImageOps

from packer.codecs.jpeg_header import jpeg_header
from packer.codecs.jpeg_meta import jpeg_meta, orient
from packer.codecs.video_pack import MAGIC as VIDEO_MAGIC, VIDEO_FMT
from packer.errors import CorruptSample

try:  # OpenCV is a dependency, but keep the Pillow path working without it.
    import cv2

    cv2.setNumThreads(1)
    _CV_FLAG = getattr(cv2, "IMREAD_COLOR_RGB", None)
    _CV_FLAG = None if _CV_FLAG is None else _CV_FLAG | cv2.IMREAD_IGNORE_ORIENTATION
except ImportError:  # pragma: no cover - exercised only where OpenCV is absent
    cv2 = None
    _CV_FLAG = None


def _load_simplejpeg():
    """simplejpeg when it imports and really decodes (a tiny probe image)."""
    try:
        import simplejpeg

        from packer.synth import jpeg_bytes

        simplejpeg.decode_jpeg(jpeg_bytes(np.zeros((8, 8, 3), np.uint8)), colorspace="RGB")
        return simplejpeg
    except Exception:  # ImportError, or a broken build
        return None


_FORCED = os.environ.get("PACKER_DECODER", "").lower()
_simplejpeg = _load_simplejpeg() if _FORCED in ("", "simplejpeg") else None

__all__ = ["ImageInfo", "CHECK_MODES", "probe", "sniff_format", "decode", "decode_pil", "DECODER",
           "format_name", "reading_image", "grey_to_8bit", "to_chw", "to_rgb_array", "stored_channels",
           "cv2_safe", "EXT_FORMATS", "decode_all"]

log = logging.getLogger(__name__)

CHECK_MODES = ("full", "header", "none")
# An image file extension -> the format name its bytes should carry (what a header check expects).
EXT_FORMATS = {"jpg": "jpeg", "jpeg": "jpeg", "png": "png", "webp": "webp", "bmp": "bmp"}

_PIL_FORMATS = {"JPEG": "jpeg", "MPO": "jpeg", "PNG": "png", "WEBP": "webp", "BMP": "bmp",
                "GIF": "gif", "TIFF": "tiff"}
_MODE_CHANNELS = {"1": 1, "L": 1, "I": 1, "F": 1, "I;16": 1, "I;16B": 1, "I;16L": 1, "I;16N": 1,
                  "LA": 2, "La": 2, "RGB": 3, "YCbCr": 3, "LAB": 3, "HSV": 3, "RGBA": 4,
                  "RGBa": 4, "RGBX": 4, "CMYK": 4}


@dataclass(frozen=True)
class ImageInfo:
    """What the stored bytes are: format name and size as stored (before EXIF rotation)."""

    fmt: str
    height: int
    width: int
    channels: int


def sniff_format(data: bytes | memoryview) -> str:
    """The format of encoded bytes from their magic number (``"unknown"`` when not recognised)."""
    head = bytes(data[:12])
    if head[:3] == b"\xff\xd8\xff":
        return "jpeg"
    if head[:8] == b"\x89PNG\r\n\x1a\n":
        return "png"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "webp"
    if head[:2] == b"BM":
        return "bmp"
    if head[:6] in (b"GIF87a", b"GIF89a"):
        return "gif"
    if head[:8] == VIDEO_MAGIC:
        return VIDEO_FMT
    return "unknown"


def stored_channels(im: Image.Image) -> int:
    """Channels the image stores (a palette image: 3, or 4 with transparency)."""
    if im.mode == "P":
        return 4 if "transparency" in im.info else 3
    return _MODE_CHANNELS.get(im.mode, len(im.getbands()))


def probe(data: bytes, *, check: str = "full", key: str = "", source: str = "",
          ext_fmt: str | None = None) -> ImageInfo:
    """Check ``data`` as ``check`` says and return its stored format and size.

    ``full`` decodes every pixel with Pillow (truncated images are failures), ``header``
    parses the header only, ``none`` trusts the file (size recorded as 0, format from
    ``ext_fmt``). Raises ``CorruptSample`` for a bad image. Decoder warnings are not failures.
    """
    if check not in CHECK_MODES:
        raise ValueError(f"check must be one of {CHECK_MODES}, not {check!r}")
    if not data:
        raise CorruptSample(key, source, "empty file (0 bytes)")
    if check == "none":
        return ImageInfo(ext_fmt or sniff_format(data), 0, 0, 0)
    if check == "header":  # a plain JPEG: Pillow's verdict without Pillow's Python marker walk
        hwc = jpeg_header(data)
        if hwc is not None:
            return ImageInfo("jpeg", *hwc)
    with reading_image(key, source):
        im = Image.open(io.BytesIO(data))
        info = ImageInfo(format_name(im), im.height, im.width, stored_channels(im))
        if check == "full":
            decode_all(im, data)
    return info


def decode_all(im: Image.Image, data: bytes) -> None:
    """Decode every pixel of ``im`` (opened from ``data``) for the full check's verdict: raises
    what Pillow's decode into its own mode raises, and returns nothing.

    A colour JPEG of whole-number chroma sampling (every one a camera or encoder writes) is
    decoded to luma only: libjpeg still entropy-decodes every block of every component, the
    only place bad data shows, and skips the chroma IDCT, upsampling and colour conversion,
    which cannot fail (~25% less CPU per image). Chroma sampling that is not a whole fraction of
    the largest is the one thing the skipped steps reject, so such a file takes the reference
    decode; and a luma decode that fails is decoded again the reference way, whose exception
    (and so the recorded reason) is then the verdict. ``tests/codecs/test_full_check.py`` holds the
    two decodes to the same verdict over mutated JPEGs of every sampling.
    """
    if _luma_suffices(im):
        im.draft("L", im.size)
        try:
            im.load()
            return
        except Exception:
            im = Image.open(io.BytesIO(data))
    im.load()


def _luma_suffices(im: Image.Image) -> bool:
    """Whether ``decode_all`` may decode ``im`` to luma only (see there)."""
    if im.format != "JPEG" or im.mode != "RGB" or len(im.tile) != 1:
        return False
    layers = getattr(im, "layer", None)
    if not layers:
        return False
    most_h = max(h for _, h, _, _ in layers)
    most_v = max(v for _, _, v, _ in layers)
    return all(h and v and most_h % h == 0 and most_v % v == 0 for _, h, v, _ in layers)


def format_name(im: Image.Image) -> str:
    """packer's lower-case format name of an opened Pillow image (``jpeg`` for JPEG and MPO)."""
    return _PIL_FORMATS.get(im.format or "", (im.format or "unknown").lower())


@contextlib.contextmanager
def reading_image(key: str, source: str) -> Iterator[None]:
    """Turn whatever Pillow raises for bad data into one ``CorruptSample``; silence its warnings.

    Decoder warnings (corrupt-data warnings that still decode, odd EXIF) are not failures.
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    except CorruptSample:
        raise
    except Image.DecompressionBombError as e:
        raise CorruptSample(key, source, f"decompression bomb refused ({e})") from e
    except Image.UnidentifiedImageError:
        raise CorruptSample(key, source, "not a readable image: unknown or damaged header") from None
    except Exception as e:  # Pillow raises many types for bad data
        # no object reprs (memory addresses) in reasons: failures.jsonl must be deterministic
        reason = re.sub(r"<[^<>]* at 0x[0-9a-fA-F]+>", "data", str(e)) or type(e).__name__
        raise CorruptSample(key, source, f"not a readable image: {reason}") from e


def grey_to_8bit(im: Image.Image) -> Image.Image:
    """A 16/32-bit grey image (``I;16*``, ``I``) as ``L`` by the decoding rule: the high byte,
    except that an ``I`` image whose values all fit in 0..255 is taken as it is."""
    arr = np.asarray(im, dtype=np.uint32)
    if im.mode == "I" and arr.max(initial=0) <= 255:
        return Image.fromarray(arr.astype(np.uint8), "L")
    return Image.fromarray((arr >> 8).astype(np.uint8), "L")


def to_chw(arr: np.ndarray) -> np.ndarray:
    """HxWxC uint8 -> a new contiguous CxHxW array (OpenCV's SIMD channel split when it can:
    ~5x faster than numpy's strided transpose copy)."""
    out = np.empty((arr.shape[2], arr.shape[0], arr.shape[1]), dtype=arr.dtype)
    if cv2 is not None and arr.flags.c_contiguous and arr.dtype == np.uint8 and 1 < arr.shape[2] <= 4:
        cv2.split(arr, [out[c] for c in range(arr.shape[2])])
    else:
        out[...] = arr.transpose(2, 0, 1)
    return out


def to_rgb_array(im: Image.Image) -> np.ndarray:
    """Pillow image -> HxWx3 uint8 RGB under the module's decoding rule."""
    im = ImageOps.exif_transpose(im)
    if im.mode.startswith("I;16") or im.mode == "I":
        return np.repeat(np.asarray(grey_to_8bit(im))[:, :, None], 3, axis=2)
    if im.mode != "RGB":
        im = im.convert("RGB")
    return np.asarray(im)


def decode_pil(data: bytes | memoryview) -> np.ndarray:
    """Decode with Pillow only (the reference path). Raises ValueError on undecodable bytes."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            im = Image.open(io.BytesIO(bytes(data)))
            return np.ascontiguousarray(to_rgb_array(im))
    except Exception as e:
        raise ValueError(f"cannot decode image: {e}") from e


def _decode_cv2(data: bytes | memoryview) -> np.ndarray | None:
    buf = np.frombuffer(data, dtype=np.uint8)
    if _CV_FLAG is not None:
        return cv2.imdecode(buf, _CV_FLAG)
    arr = cv2.imdecode(buf, cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION)
    return None if arr is None else cv2.cvtColor(arr, cv2.COLOR_BGR2RGB)


def cv2_safe(data: bytes | memoryview) -> bool:
    """True when OpenCV, told to ignore EXIF, decodes ``data`` to the stored pixels Pillow gives
    (a JPEG ``packer.codecs.jpeg_meta`` calls ``fast``: the caller applies its orientation;
    plain 8-bit PNG, BMP, WebP without EXIF)."""
    fmt = sniff_format(data)
    if fmt == "jpeg":
        meta = jpeg_meta(data)
        return meta is not None and meta.fast
    if fmt == "png":
        # colour type byte of IHDR: 3 = palette (transparency via tRNS), bit depth 16; an eXIf
        # chunk anywhere (Pillow's exif_transpose rotates by it) is Pillow's
        head = bytes(data[:33])
        return (len(head) >= 26 and head[24] == 8 and head[25] in (0, 2) and b"tRNS" not in bytes(data[:4096])
                and bytes(data).find(b"eXIf") < 0)
    if fmt == "webp":
        return bytes(data).find(b"EXIF") < 0
    return fmt == "bmp"


def jpeg_orientation(data: bytes | memoryview) -> int:
    """The EXIF orientation (1-8) Pillow's ``exif_transpose`` applies to a JPEG; 1 when absent
    or unreadable (``packer.codecs.jpeg_meta``, or Pillow's own reading where that defers)."""
    meta = jpeg_meta(data)
    if meta is not None:
        return meta.orientation
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            value = Image.open(io.BytesIO(bytes(data))).getexif().get(0x0112, 1)
        return int(value) if value in (2, 3, 4, 5, 6, 7, 8) else 1
    except Exception:
        return 1


if _FORCED == "pillow":
    DECODER = "pillow"
elif _simplejpeg is not None:
    DECODER = "simplejpeg"
else:
    DECODER = "opencv" if cv2 is not None else "pillow"


def decode(data: bytes | memoryview) -> np.ndarray:
    """Decode encoded image bytes to an HxWx3 uint8 RGB array (EXIF orientation applied).

    Raises ValueError when the bytes are not a decodable image.
    """
    if DECODER == "pillow":
        return decode_pil(data)
    if sniff_format(data) == "jpeg":
        meta = jpeg_meta(data)
        if meta is None or not meta.fast:
            return decode_pil(data)  # what the parser cannot promise, Pillow decodes
        if DECODER == "simplejpeg":
            try:  # strict: a libjpeg warning raises, and Pillow's rules decide
                arr = _simplejpeg.decode_jpeg(data, colorspace="RGB", strict=True)
            except Exception:
                return decode_pil(data)  # the reference path gives the one error message
        else:
            arr = _decode_cv2(data) if cv2 is not None else None
            if arr is None:
                return decode_pil(data)
        return orient(arr, meta.orientation)
    if cv2 is not None and cv2_safe(data):
        arr = _decode_cv2(data)
        if arr is not None:
            return arr
    return decode_pil(data)

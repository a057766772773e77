"""Region-of-interest JPEG decoding: libjpeg-turbo's TurboJPEG 3 API through ctypes.

``decode_region`` decodes one rectangle of a JPEG, optionally at a reduced DCT scale
(1/2, 1/4, 1/8), and nothing else: libjpeg-turbo skips the IDCT, upsampling and colour
conversion of the rows above the rectangle (``jpeg_skip_scanlines``) and of the columns
beside it (``jpeg_crop_scanline``), and stops after its last row. The rows above are still
entropy-decoded (a sequential JPEG cannot find a row otherwise), so the cost grows with the
rectangle's bottom edge (measured on 800x600: a 100-row band costs 0.18x a full decode at the
top, 0.62x at the bottom).

No maintained Python binding exposes this (checked: PyTurboJPEG 2.6 offers DCT scaling and
lossless *transform* crops only; simplejpeg 1.9, jpeg4py, Pillow's ``draft`` and OpenCV's
``IMREAD_REDUCED_*`` scale but never crop; DALI's ``decoders.image_random_crop`` does it
inside a DALI pipeline only). The TurboJPEG 3 C API is handle-based and reports errors by
return code, so ctypes can call it safely; calls release the GIL. packer installs no Python
module for it, so nothing here can shadow PyTurboJPEG's ``turbojpeg`` module.

The library (``libturbojpeg`` >= 3.0, which exports ``tj3SetCroppingRegion``; PyTurboJPEG 2.x
needs the same one) is looked for in this order: ``$PACKER_TURBOJPEG`` (a path; empty turns
region decoding off), the system's ``libturbojpeg`` when it is 3.x (Fedora 40+, Arch,
Homebrew, conda-forge; Debian 12/13 and Ubuntu 24.04 ship 2.1, which lacks the API), then
libjpeg-turbo's own packages under ``/opt/libjpeg-turbo``. Without one, ``available()`` is
False and callers decode the whole image at the same DCT scale instead (same pixels, slower).

Pixels: inside the requested rectangle the output equals a full decode of the image at the
same scale, bit for bit (tested: random regions, every column of thin ones, 4:4:4, 4:2:2,
4:2:0, grey, progressive, every scale). A region is decoded two columns wider on each side
than asked where the image allows it and trimmed, because fancy chroma upsampling at a
cropped edge repeats the edge chroma sample (one extra column is not always enough). Rows below the
rectangle are never read, so a JPEG damaged only there decodes without complaint (the
rectangle is intact); damage the rectangle needs is a libjpeg warning, and callers then take
the full decoders' route, whose rules decide.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import glob
import logging
import os
import sys
import threading
from typing import NamedTuple, Optional

import numpy as np

__all__ = ["JpegHeader", "available", "library_path", "read_header", "decode_region", "scaled"]

log = logging.getLogger(__name__)

_TJINIT_DECOMPRESS = 1
_TJPARAM_SUBSAMP, _TJPARAM_JPEGWIDTH, _TJPARAM_JPEGHEIGHT, _TJPARAM_COLORSPACE = 4, 5, 6, 8
_TJPARAM_PRECISION, _TJPARAM_LOSSLESS = 7, 15
_TJPF_RGB, _TJPF_RGBX = 0, 2
_MCU_WIDTH = (8, 16, 16, 8, 8, 32, 8)  # by TJSAMP_444, 422, 420, GRAY, 440, 411, 441
_TJCS_RGB, _TJCS_YCBCR, _TJCS_GRAY = 0, 1, 2


class _Region(ctypes.Structure):
    _fields_ = [("x", ctypes.c_int), ("y", ctypes.c_int), ("w", ctypes.c_int), ("h", ctypes.c_int)]


class _Scale(ctypes.Structure):
    _fields_ = [("num", ctypes.c_int), ("denom", ctypes.c_int)]


class JpegHeader(NamedTuple):
    """What the JPEG header says (stored orientation, before EXIF)."""

    width: int
    height: int
    subsampling: int  # TJSAMP_*; -1 when unusual (then no cropping, whole-width decode)


def _candidates() -> list[str]:
    paths = []
    env = os.environ.get("PACKER_TURBOJPEG")
    if env:
        paths.append(env)
    found = ctypes.util.find_library("turbojpeg")
    paths += [p for p in (found, "libturbojpeg.so.0") if p]
    # libjpeg-turbo's official packages (not on the loader's path)
    paths += sorted(glob.glob("/opt/libjpeg-turbo/lib*/libturbojpeg.so*"))
    paths += ["/opt/libjpeg-turbo/lib/libturbojpeg.dylib"] if sys.platform == "darwin" else []
    return paths


def _load() -> tuple[Optional[ctypes.CDLL], Optional[str]]:
    for path in _candidates():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        if not hasattr(lib, "tj3SetCroppingRegion"):
            continue
        lib.tj3Init.restype = ctypes.c_void_p
        lib.tj3Init.argtypes = [ctypes.c_int]
        lib.tj3Destroy.argtypes = [ctypes.c_void_p]
        lib.tj3DecompressHeader.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
        lib.tj3Get.argtypes = [ctypes.c_void_p, ctypes.c_int]
        lib.tj3SetScalingFactor.argtypes = [ctypes.c_void_p, _Scale]
        lib.tj3SetCroppingRegion.argtypes = [ctypes.c_void_p, _Region]
        lib.tj3Decompress8.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                       ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
        lib.tj3GetErrorStr.restype = ctypes.c_char_p
        lib.tj3GetErrorStr.argtypes = [ctypes.c_void_p]
        return lib, path
    return None, None


_LIB, _PATH = (None, None) if os.environ.get("PACKER_TURBOJPEG", "x") == "" else _load()
_local = threading.local()


def available() -> bool:
    """True when a TurboJPEG 3 library was found (region decoding works)."""
    return _LIB is not None


def library_path() -> Optional[str]:
    """The path of the TurboJPEG 3 library in use, or None."""
    return _PATH


def _handle() -> int:
    """One decompressor per thread (a TurboJPEG handle is not thread-safe) and per process."""
    pid = os.getpid()
    h = getattr(_local, "handle", None)
    if h is None or getattr(_local, "pid", None) != pid:
        h = _LIB.tj3Init(_TJINIT_DECOMPRESS)
        if not h:
            raise MemoryError("tj3Init failed")
        _local.handle, _local.pid = h, pid
    return h


def scaled(side: int, scale: int) -> int:
    """A side's length after libjpeg's 1/``scale`` DCT scaling (rounded up)."""
    return -(-side // scale)


def _header(h: int, buf: np.ndarray) -> Optional[JpegHeader]:
    if _LIB.tj3DecompressHeader(h, buf.ctypes.data, buf.size) != 0:
        return None
    if _LIB.tj3Get(h, _TJPARAM_PRECISION) != 8 or _LIB.tj3Get(h, _TJPARAM_LOSSLESS) == 1:
        return None  # 12/16-bit or lossless JPEGs: leave them to the full decoders
    if _LIB.tj3Get(h, _TJPARAM_COLORSPACE) not in (_TJCS_RGB, _TJCS_YCBCR, _TJCS_GRAY):
        return None  # CMYK/YCCK: Pillow's conversion is the reference
    return JpegHeader(_LIB.tj3Get(h, _TJPARAM_JPEGWIDTH), _LIB.tj3Get(h, _TJPARAM_JPEGHEIGHT),
                      _LIB.tj3Get(h, _TJPARAM_SUBSAMP))


def read_header(data: bytes | memoryview) -> Optional[JpegHeader]:
    """The header of a JPEG this module can decode, or None (not a JPEG, CMYK, 12-bit, ...)."""
    if _LIB is None:
        return None
    return _header(_handle(), np.frombuffer(data, np.uint8))


def decode_region(data: bytes | memoryview, left: int, top: int, width: int, height: int, *,
                  scale: int = 1, channels: int = 3) -> Optional[np.ndarray]:
    """Decode the rectangle ``[left, left+width) x [top, top+height)`` of the 1/``scale`` image.

    Coordinates are in pixels of the DCT-scaled image (``scaled(side, scale)`` wide), stored
    orientation (EXIF is not applied). Returns an ``height x width x channels`` uint8 RGB
    (``channels=4``: RGBX) array, or None when the library is missing, the JPEG is one this
    path leaves to the full decoders (see ``read_header``) or libjpeg reports any error or
    warning: callers then decode the whole image, whose rules decide what a damaged JPEG is.
    """
    if _LIB is None or scale not in (1, 2, 4, 8) or channels not in (3, 4):
        return None
    h = _handle()
    buf = np.frombuffer(data, np.uint8)
    head = _header(h, buf)
    if head is None:
        return None
    sw, sh = scaled(head.width, scale), scaled(head.height, scale)
    if not (0 <= left and 0 <= top and width > 0 and height > 0 and left + width <= sw
            and top + height <= sh):
        raise ValueError(f"region {left},{top} {width}x{height} outside the {sw}x{sh} image")
    if _LIB.tj3SetScalingFactor(h, _Scale(1, scale)) != 0:
        return None
    # two more columns each side where the image has them (four for 4:1:1; see the module
    # doc), the left edge aligned to the scaled iMCU width, as TurboJPEG requires
    if 0 <= head.subsampling < len(_MCU_WIDTH):
        mcu = scaled(_MCU_WIDTH[head.subsampling], scale)
        margin = max(2, _MCU_WIDTH[head.subsampling] // 8)
        x0, x1 = max(0, left - margin), min(sw, left + width + margin)
        x0 -= x0 % mcu
    else:
        x0, x1 = 0, sw
    region = _Region(x0, top, x1 - x0, height) if (x0, x1 - x0, top, height) != (0, sw, 0, sh) \
        else _Region(0, 0, 0, 0)
    if _LIB.tj3SetCroppingRegion(h, region) != 0:
        log.debug("tj3SetCroppingRegion: %s", _LIB.tj3GetErrorStr(h))
        return None
    out = np.empty((height, x1 - x0, channels), np.uint8)
    fmt = _TJPF_RGB if channels == 3 else _TJPF_RGBX
    if _LIB.tj3Decompress8(h, buf.ctypes.data, buf.size, out.ctypes.data, out.strides[0], fmt) != 0:
        log.debug("tj3Decompress8: %s", _LIB.tj3GetErrorStr(h))
        return None
    return out[:, left - x0:left - x0 + width]

"""Region-of-interest JPEG decoding: libjpeg-turbo's ``jpeg_crop_scanline``/``jpeg_skip_scanlines``.

``decode_region`` decodes one rectangle of a JPEG, optionally at a reduced DCT scale
(1/2, 1/4, 1/8), and nothing else: libjpeg-turbo skips the IDCT, upsampling and colour
conversion of the rows above the rectangle (``jpeg_skip_scanlines``) and of the columns
beside it (``jpeg_crop_scanline``). The rows above are still entropy-decoded (a sequential
JPEG cannot find a row otherwise), so the cost grows with the rectangle's bottom edge.

No maintained Python binding exposes this (checked: PyTurboJPEG 2.6 offers DCT scaling and
lossless *transform* crops only; simplejpeg 1.9, jpeg4py, Pillow's ``draft`` and OpenCV's
``IMREAD_REDUCED_*`` scale but never crop; DALI's ``decoders.image_random_crop`` does it
inside a DALI pipeline only). Two backends, tried in this order:

* ``$PACKER_TURBOJPEG`` (a path to a libturbojpeg >= 3.0; empty turns region decoding off):
  the ``turbojpeg`` backend on it, the override;
* ``libjpeg``: packer's own small extension ``packer.codecs._jpegroi`` (``csrc/jpegroi.c``,
  built by ``pip install``; it needs a C compiler and Python's headers, nothing else) on the
  libjpeg-turbo that Pillow's wheels bundle (``pillow.libs/libjpeg-*.so.62.4.0``; Pillow 13
  ships libjpeg-turbo 3.2.0), found beside the ``PIL`` package without importing it. It
  parses the header once and writes rows straight into the result, and is the faster of
  the two (on ~500x375 JPEGs: a whole image 0.72 ms against TurboJPEG's 0.77 ms per image).
  JPEGs with a sampling TurboJPEG has no name for are left to the full decoders;
* ``turbojpeg``: the TurboJPEG 3 API (``tj3SetCroppingRegion``) through ctypes, on the
  system's ``libturbojpeg`` when it is 3.x (Fedora 40+, Arch, Homebrew, conda-forge; Debian
  12/13 and Ubuntu 24.04 ship 2.1, which lacks the API), then on libjpeg-turbo's own packages
  under ``/opt/libjpeg-turbo``.

Without one, ``available()`` is False and callers decode the whole image at the same DCT
scale instead (same pixels, slower). packer installs no module named ``turbojpeg``, so
nothing here can shadow PyTurboJPEG's. ``describe()`` says which backend runs (``packer
bench`` prints it).

Pixels: inside the requested rectangle the output equals a full decode of the image at the
same scale, bit for bit (tested: random regions, every column of thin ones, 4:4:4, 4:2:2,
4:2:0, grey, progressive, every scale). A region is decoded two columns wider on each side
than asked where the image allows it and trimmed, because fancy chroma upsampling at a
cropped edge repeats the edge chroma sample (one extra column is not always enough). Rows
below the rectangle are never decoded, so a JPEG damaged only there decodes without
complaint (the rectangle is intact; tested); damage the rectangle needs is a libjpeg warning,
and callers then take the full decoders' route, whose rules decide.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import glob
import importlib.util
import logging
import os
import sys
import threading
from typing import NamedTuple, Optional, Union

import numpy as np

__all__ = ["JpegHeader", "available", "backend", "describe", "library_path", "read_header",
           "decode_region", "scaled"]

log = logging.getLogger(__name__)

_TJINIT_DECOMPRESS = 1
_TJPARAM_SUBSAMP, _TJPARAM_JPEGWIDTH, _TJPARAM_JPEGHEIGHT, _TJPARAM_COLORSPACE = 4, 5, 6, 8
_TJPARAM_PRECISION, _TJPARAM_LOSSLESS = 7, 15
_TJPF_RGB, _TJPF_RGBX = 0, 2
_MCU_WIDTH = (8, 16, 16, 8, 8, 32, 8)  # by TJSAMP_444, 422, 420, GRAY, 440, 411, 441
_TJCS_RGB, _TJCS_YCBCR, _TJCS_GRAY = 0, 1, 2
_SLACK = 40  # columns a libjpeg-backend region may be decoded wider than asked (see _Libjpeg)


class _Region(ctypes.Structure):
    _fields_ = [("x", ctypes.c_int), ("y", ctypes.c_int), ("w", ctypes.c_int), ("h", ctypes.c_int)]


class _Scale(ctypes.Structure):
    _fields_ = [("num", ctypes.c_int), ("denom", ctypes.c_int)]


class JpegHeader(NamedTuple):
    """What the JPEG header says (stored orientation, before EXIF)."""

    width: int
    height: int
    subsampling: int  # TJSAMP_*; -1 when unusual (then no cropping, whole-width decode)


def scaled(side: int, scale: int) -> int:
    """A side's length after libjpeg's 1/``scale`` DCT scaling (rounded up)."""
    return -(-side // scale)


class _Libjpeg:
    """packer's extension ``_jpegroi`` on a libjpeg-turbo's libjpeg API (see the module doc)."""

    name = "libjpeg"

    def __init__(self, module: object, path: str):
        self._mod, self.path = module, path

    def header(self, data: bytes | memoryview) -> Optional[JpegHeader]:
        head = self._mod.header(data)
        return None if head is None else JpegHeader(*head)

    def decode(self, data: bytes | memoryview, left: int, top: int, width: int, height: int,
               scale: int, channels: int) -> Optional[np.ndarray]:
        # room for the columns decoded left of the rectangle (the margin, then back to the
        # iMCU's start: < 4 + 32) and right of it (the margin, <= 4): rows go straight in
        out = np.empty((height, width + _SLACK, channels), np.uint8)
        status, a, b = self._mod.decode(data, out, width + _SLACK, left, top, width, height, scale,
                                        channels)
        if status == 2:
            raise ValueError(f"region {left},{top} {width}x{height} outside the {a}x{b} image")
        return out[:, a:a + width] if status == 0 else None


class _TurboJPEG:
    """The TurboJPEG 3 API of a libturbojpeg >= 3.0 through ctypes."""

    name = "turbojpeg"

    def __init__(self, lib: ctypes.CDLL, path: str):
        self._lib, self.path = lib, path
        self._local = threading.local()
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

    def _handle(self) -> int:
        """One decompressor per thread (a TurboJPEG handle is not thread-safe) and per process."""
        pid = os.getpid()
        h = getattr(self._local, "handle", None)
        if h is None or getattr(self._local, "pid", None) != pid:
            h = self._lib.tj3Init(_TJINIT_DECOMPRESS)
            if not h:
                raise MemoryError("tj3Init failed")
            self._local.handle, self._local.pid = h, pid
        return h

    def _header(self, h: int, buf: np.ndarray) -> Optional[JpegHeader]:
        lib = self._lib
        if lib.tj3DecompressHeader(h, buf.ctypes.data, buf.size) != 0:
            return None
        if lib.tj3Get(h, _TJPARAM_PRECISION) != 8 or lib.tj3Get(h, _TJPARAM_LOSSLESS) == 1:
            return None  # 12/16-bit or lossless JPEGs: leave them to the full decoders
        if lib.tj3Get(h, _TJPARAM_COLORSPACE) not in (_TJCS_RGB, _TJCS_YCBCR, _TJCS_GRAY):
            return None  # CMYK/YCCK: Pillow's conversion is the reference
        return JpegHeader(lib.tj3Get(h, _TJPARAM_JPEGWIDTH), lib.tj3Get(h, _TJPARAM_JPEGHEIGHT),
                          lib.tj3Get(h, _TJPARAM_SUBSAMP))

    def header(self, data: bytes | memoryview) -> Optional[JpegHeader]:
        return self._header(self._handle(), np.frombuffer(data, np.uint8))

    def decode(self, data: bytes | memoryview, left: int, top: int, width: int, height: int,
               scale: int, channels: int) -> Optional[np.ndarray]:
        lib, h = self._lib, self._handle()
        buf = np.frombuffer(data, np.uint8)
        head = self._header(h, buf)
        if head is None:
            return None
        sw, sh = scaled(head.width, scale), scaled(head.height, scale)
        if not (0 <= left and 0 <= top and width > 0 and height > 0 and left + width <= sw
                and top + height <= sh):
            raise ValueError(f"region {left},{top} {width}x{height} outside the {sw}x{sh} image")
        if lib.tj3SetScalingFactor(h, _Scale(1, scale)) != 0:
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
        if lib.tj3SetCroppingRegion(h, region) != 0:
            log.debug("tj3SetCroppingRegion: %s", lib.tj3GetErrorStr(h))
            return None
        out = np.empty((height, x1 - x0, channels), np.uint8)
        fmt = _TJPF_RGB if channels == 3 else _TJPF_RGBX
        if lib.tj3Decompress8(h, buf.ctypes.data, buf.size, out.ctypes.data, out.strides[0], fmt) != 0:
            log.debug("tj3Decompress8: %s", lib.tj3GetErrorStr(h))
            return None
        return out[:, left - x0:left - x0 + width]


_Backend = Union[_Libjpeg, _TurboJPEG]


def _turbojpeg(path: str) -> Optional[_TurboJPEG]:
    try:
        lib = ctypes.CDLL(path)
    except OSError:
        return None
    return _TurboJPEG(lib, path) if hasattr(lib, "tj3SetCroppingRegion") else None


def _pillow_libjpeg() -> list[str]:
    """The libjpeg-turbo shared libraries the installed Pillow wheel ships beside ``PIL``
    (auditwheel's ``pillow.libs``, delocate's ``PIL/.dylibs``), found without importing PIL
    (~10 ms; reading the distribution's RECORD took ~75 ms)."""
    try:
        spec = importlib.util.find_spec("PIL")
    except (ImportError, ValueError):
        return []
    if spec is None or not spec.origin:
        return []
    pkg = os.path.dirname(spec.origin)
    return sorted(glob.glob(os.path.join(os.path.dirname(pkg), "pillow.libs", "libjpeg*.so*"))
                  + glob.glob(os.path.join(pkg, ".dylibs", "libjpeg*.dylib")))


def _libjpeg() -> Optional[_Libjpeg]:
    try:
        from packer.codecs import _jpegroi  # built by pip install (setup.py); optional
    except ImportError as e:
        log.debug("packer.codecs._jpegroi is not built: %s", e)
        return None
    for path in _pillow_libjpeg():
        if os.path.isfile(path) and _jpegroi.load(path):
            return _Libjpeg(_jpegroi, path)
    return None


def _system_turbojpeg() -> list[str]:
    found = ctypes.util.find_library("turbojpeg")
    paths = [p for p in (found, "libturbojpeg.so.0") if p]
    # libjpeg-turbo's official packages (not on the loader's path)
    paths += sorted(glob.glob("/opt/libjpeg-turbo/lib*/libturbojpeg.so*"))
    paths += ["/opt/libjpeg-turbo/lib/libturbojpeg.dylib"] if sys.platform == "darwin" else []
    return paths


def _load() -> Optional[_Backend]:
    env = os.environ.get("PACKER_TURBOJPEG")
    if env == "":
        return None
    if env and (found := _turbojpeg(env)) is not None:
        return found
    if (found := _libjpeg()) is not None:
        return found
    for path in _system_turbojpeg():
        if (found := _turbojpeg(path)) is not None:
            return found
    return None


_LIB: Optional[_Backend] = _load()


def available() -> bool:
    """True when region decoding works (a backend loaded)."""
    return _LIB is not None


def backend() -> Optional[str]:
    """``"libjpeg"`` (packer's extension on Pillow's libjpeg-turbo), ``"turbojpeg"`` (a
    libturbojpeg 3 through ctypes) or None (region decoding off)."""
    return None if _LIB is None else _LIB.name


def library_path() -> Optional[str]:
    """The path of the JPEG library region decoding uses, or None."""
    return None if _LIB is None else _LIB.path


def describe() -> str:
    """One line for reports: whether region decoding is on, and through what."""
    if _LIB is None:
        why = "PACKER_TURBOJPEG is empty" if os.environ.get("PACKER_TURBOJPEG") == "" else \
            "no packer.codecs._jpegroi with Pillow's libjpeg-turbo, no libturbojpeg >= 3.0"
        return f"off ({why}: whole images are decoded; docs/loading.md)"
    return f"on ({_LIB.name}: {_LIB.path})"


def read_header(data: bytes | memoryview) -> Optional[JpegHeader]:
    """The header of a JPEG this module can decode, or None (not a JPEG, CMYK, 12-bit, ...)."""
    if _LIB is None:
        return None
    return _LIB.header(data)


def decode_region(data: bytes | memoryview, left: int, top: int, width: int, height: int, *,
                  scale: int = 1, channels: int = 3) -> Optional[np.ndarray]:
    """Decode the rectangle ``[left, left+width) x [top, top+height)`` of the 1/``scale`` image.

    Coordinates are in pixels of the DCT-scaled image (``scaled(side, scale)`` wide), stored
    orientation (EXIF is not applied). Returns an ``height x width x channels`` uint8 RGB
    (``channels=4``: RGBX) array, or None when no backend loaded, the JPEG is one this path
    leaves to the full decoders (see ``read_header``) or libjpeg reports any error or
    warning: callers then decode the whole image, whose rules decide what a damaged JPEG is.
    Raises ValueError for a rectangle outside the image.
    """
    if _LIB is None or scale not in (1, 2, 4, 8) or channels not in (3, 4):
        return None
    if width <= 0 or height <= 0:
        raise ValueError(f"region {left},{top} {width}x{height} is empty")
    return _LIB.decode(data, left, top, width, height, scale, channels)

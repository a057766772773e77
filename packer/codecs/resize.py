"""Resize one image: the size/aspect rules, the JPEG DCT-domain fast path, modes and encoding.

One code path serves ``packer resize`` and the resize options of every pack command.

**Geometry** (``ResizeSpec``; sizes are width x height of the upright image):

* ``short_side=N``: the short side becomes N, the long side keeps the aspect ratio
  (rounded half up, at least 1 pixel).
* ``max_side=N``: the long side becomes N, likewise.
* ``size=(W, H)``: the output is exactly W x H. ``fit="crop"`` scales to cover the box and
  centre-crops; ``fit="pad"`` scales to fit inside and centres on a zero border;
  ``fit="stretch"`` scales each axis on its own.
* Never upscale unless ``upscale=True``: the content scale is capped at 1. With
  ``short_side``/``max_side`` a small image keeps its size; with ``size`` the output is still
  exactly W x H, and whatever the capped content does not cover is zero padding.

**Keep as it is.** An image already within bounds (the plan changes nothing), upright (no
EXIF orientation other than 1) and whose output format is its own format is kept byte for
byte: no re-encode, no mode conversion. Everything else is decoded, transposed upright by its
EXIF orientation, converted, resampled with Lanczos and re-encoded without EXIF (so no
orientation tag); the ICC profile is kept when the colour space family is unchanged.

**Fast path.** A JPEG that shrinks is decoded with Pillow's ``draft`` (libjpeg-turbo DCT
scaling by 1/2, 1/4 or 1/8) to the smallest scale still at least ``DRAFT_GAP`` (1.5) times
the target size, then resampled with Lanczos to the exact size. Against a full decode +
Lanczos resize it measures >= 35 dB PSNR on a hard synthetic photo (text, thin lines, noise;
>= 43 dB at 3000x2000) and > 50 dB on smooth ones; tests/codecs/test_resize.py holds it at 34 dB.

**Modes** (the output's mode is the closest one its format stores):

* palette -> RGBA when it has transparency, else RGB; 1-bit -> L; 16/32-bit grey -> L by the
  high byte (as ``packer.codecs.image`` decodes it); CMYK/YCbCr/LAB/HSV -> RGB (Pillow's
  conversion, which undoes Adobe-inverted CMYK).
* JPEG stores L or RGB: alpha is dropped, keeping the colour under it (as the training
  decode does). PNG stores L, LA, RGB, RGBA. WebP stores RGB, RGBA (grey becomes RGB).
  BMP stores L, RGB, RGBA (LA becomes RGBA).
* Raw pixels (``to-hdf5 --raw``) are HxWx3 RGB uint8 by the training decode rule.

``format="keep"`` writes JPEG, PNG, WebP and BMP sources in their own format and anything
else (GIF, TIFF) as PNG.
"""
from __future__ import annotations

import io
import logging
import math
import re
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from PIL import Image

from packer.errors import CorruptSample, UsageError
from packer.codecs.image import stored_channels
from packer.codecs.image import format_name, grey_to_8bit, reading_image

__all__ = ["FITS", "OUTPUT_FORMATS", "ResizeSpec", "Plan", "Resized", "parse_size", "plan_resize",
           "resize_image", "resize_pixels", "output_format", "FORMAT_EXT"]

log = logging.getLogger(__name__)

FITS = ("crop", "pad", "stretch")
OUTPUT_FORMATS = ("keep", "jpeg", "png", "webp")
FORMAT_EXT = {"jpeg": "jpg", "png": "png", "webp": "webp", "bmp": "bmp"}
# The DCT-scaled decode stays at least this much larger than the target, so the final Lanczos
# always does real anti-aliasing (1.0 is ~25% faster but drops to ~31 dB on hard images).
DRAFT_GAP = 1.5
MAX_SIDE = 65500  # JPEG's limit, with a margin; WebP's is 16383 and is checked when encoding
_PIL_SAVE = {"jpeg": "JPEG", "png": "PNG", "webp": "WEBP", "bmp": "BMP"}
_ORIENTATION = 0x0112
_TRANSPOSE = {2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180,
              4: Image.Transpose.FLIP_TOP_BOTTOM, 5: Image.Transpose.TRANSPOSE,
              6: Image.Transpose.ROTATE_270, 7: Image.Transpose.TRANSVERSE,
              8: Image.Transpose.ROTATE_90}
_SWAPS_AXES = (5, 6, 7, 8)
# The modes each output format stores, and where every other working mode goes.
_STORE = {"jpeg": {"LA": "L", "RGBA": "RGB"}, "png": {}, "webp": {"L": "RGB", "LA": "RGBA"},
          "bmp": {"LA": "RGBA"}}
_FAMILY = {"L": "grey", "LA": "grey", "RGB": "rgb", "RGBA": "rgb"}


def _scaled(length: int, num: int, den: int) -> int:
    """``length * num / den`` rounded half up, at least 1, in integers: a float product can land
    just below an exact half (91 * (225 / 42) = 487.4999... where 91 * 225 / 42 is 487.5)."""
    return max(1, (2 * length * num + den) // (2 * den))


def parse_size(text: str, *, zero_side: bool = False) -> tuple[int, int]:
    """``"WxH"`` (or ``"N"`` for N x N) -> ``(width, height)``; UsageError when malformed.

    ``zero_side`` (``decode-frames --size``): the ``WxH`` form only, and one side may be 0,
    meaning "from the aspect ratio".
    """
    m = re.fullmatch(r"\s*(\d+)\s*(?:[xX×]\s*(\d+))?\s*", str(text))
    if not m or (zero_side and m.group(2) is None):
        raise UsageError(f"--size {text!r}: expected WIDTHxHEIGHT, e.g. 224x224")
    w = int(m.group(1))
    h = int(m.group(2)) if m.group(2) is not None else w
    low = 0 if zero_side else 1
    if not (low <= w <= MAX_SIDE and low <= h <= MAX_SIDE) or w == h == 0:
        raise UsageError(f"--size {text!r}: each side must be between {low} and {MAX_SIDE}"
                         + (" and not both 0" if zero_side else ""))
    return w, h


@dataclass(frozen=True)
class ResizeSpec:
    """What to resize to; exactly one of ``short_side``, ``max_side``, ``size`` is given.

    Args:
        short_side: target short side in pixels.
        max_side: target long side in pixels.
        size: ``(width, height)`` of the output.
        fit: with ``size``: ``crop`` | ``pad`` | ``stretch``.
        upscale: allow enlarging (never by default).
        format: ``keep`` | ``jpeg`` | ``png`` | ``webp``.
        quality: JPEG/WebP quality, 1..100.
        draft: use the JPEG DCT-scaling fast path (off only to measure it).
    """

    short_side: int | None = None
    max_side: int | None = None
    size: tuple[int, int] | None = None
    fit: str = "crop"
    upscale: bool = False
    format: str = "keep"
    quality: int = 90
    draft: bool = True

    def __post_init__(self) -> None:
        given = [n for n in ("short_side", "max_side", "size") if getattr(self, n) is not None]
        if len(given) != 1:
            raise UsageError("give exactly one of --short-side, --max-side, --size"
                             + (f" (got {', '.join(given)})" if given else ""))
        for name in ("short_side", "max_side"):
            v = getattr(self, name)
            if v is not None and not (isinstance(v, int) and 1 <= v <= MAX_SIDE):
                raise UsageError(f"--{name.replace('_', '-')} must be between 1 and {MAX_SIDE}, not {v!r}")
        if self.size is not None:
            if (len(self.size) != 2 or not all(isinstance(v, int) and 1 <= v <= MAX_SIDE for v in self.size)):
                raise UsageError(f"--size must be two sides between 1 and {MAX_SIDE}, not {self.size!r}")
            object.__setattr__(self, "size", tuple(self.size))
        if self.fit not in FITS:
            raise UsageError(f"--fit must be one of {', '.join(FITS)}, not {self.fit!r}")
        if self.fit != "crop" and self.size is None:
            raise UsageError("--fit applies to --size only")
        if self.format not in OUTPUT_FORMATS:
            raise UsageError(f"--format must be one of {', '.join(OUTPUT_FORMATS)}, not {self.format!r}")
        if not (isinstance(self.quality, int) and 1 <= self.quality <= 100):
            raise UsageError(f"--quality must be between 1 and 100, not {self.quality!r}")

    @classmethod
    def from_options(cls, *, short_side: int | None = None, max_side: int | None = None,
                     size: str | tuple[int, int] | None = None, fit: str | None = None,
                     upscale: bool = False, format: str | None = None,
                     quality: int | None = None) -> "ResizeSpec | None":
        """The spec of command-line options, or None when no resize option is given."""
        if short_side is None and max_side is None and size is None:
            extra = [n for n, v in (("--fit", fit), ("--format", format), ("--quality", quality),
                                    ("--upscale", upscale or None)) if v is not None]
            if extra:
                raise UsageError(f"{', '.join(extra)} need --short-side, --max-side or --size")
            return None
        if isinstance(size, str):
            size = parse_size(size)
        return cls(short_side=short_side, max_side=max_side, size=size, fit=fit or "crop",
                   upscale=upscale, format=format or "keep", quality=90 if quality is None else quality)

    def to_dict(self) -> dict[str, Any]:
        """The spec as JSON-able options (for the manifest's ``created_by``)."""
        d = asdict(self)
        d["size"] = list(self.size) if self.size else None
        d.pop("draft")
        return {k: v for k, v in d.items() if v is not None}

    def describe(self) -> str:
        """A short human description, e.g. ``short side 256``."""
        if self.short_side is not None:
            what = f"short side {self.short_side}"
        elif self.max_side is not None:
            what = f"max side {self.max_side}"
        else:
            what = f"{self.size[0]}x{self.size[1]} ({self.fit})"
        return what + (", upscale" if self.upscale else "")


@dataclass(frozen=True)
class Plan:
    """The geometry for one upright image: resample to ``scaled``, then cut ``crop`` (a box in
    the scaled image) and centre the result on a zero canvas of ``out`` size."""

    source: tuple[int, int]
    scaled: tuple[int, int]
    crop: tuple[int, int, int, int]
    out: tuple[int, int]

    @property
    def identity(self) -> bool:
        """True when the plan changes nothing."""
        return self.scaled == self.source == self.out

    @property
    def paste_at(self) -> tuple[int, int]:
        """Where the cropped content sits on the output canvas."""
        cw, ch = self.crop[2] - self.crop[0], self.crop[3] - self.crop[1]
        return (self.out[0] - cw) // 2, (self.out[1] - ch) // 2


def _centre_crop(scaled: tuple[int, int], box: tuple[int, int]) -> tuple[int, int, int, int]:
    cw, ch = min(scaled[0], box[0]), min(scaled[1], box[1])
    left, top = (scaled[0] - cw) // 2, (scaled[1] - ch) // 2
    return left, top, left + cw, top + ch


def plan_resize(width: int, height: int, spec: ResizeSpec) -> Plan:
    """The geometry of ``spec`` for an upright ``width`` x ``height`` image (see module doc)."""
    if width < 1 or height < 1:
        raise ValueError(f"image size must be positive, not {width}x{height}")
    src = (width, height)
    if spec.size is None:
        side = spec.short_side if spec.short_side is not None else spec.max_side
        ref = min(width, height) if spec.short_side is not None else max(width, height)
        if side >= ref and not spec.upscale:
            return Plan(src, src, (0, 0, width, height), src)
        # the reference side becomes exactly ``side``; the other keeps the aspect ratio
        if (spec.short_side is not None) == (width <= height):
            scaled = (side, _scaled(height, side, ref))
        else:
            scaled = (_scaled(width, side, ref), side)
        return Plan(src, scaled, (0, 0) + scaled, scaled)
    bw, bh = spec.size
    if spec.fit == "stretch":
        scaled = (bw, bh) if spec.upscale else (min(bw, width), min(bh, height))
    else:
        sx, sy = bw / width, bh / height
        s = max(sx, sy) if spec.fit == "crop" else min(sx, sy)
        if not spec.upscale:
            s = min(s, 1.0)
        if s == 1.0:
            scaled = src
        elif spec.fit == "crop" and s == sx:  # the covering axis lands exactly on the box
            scaled = (bw, max(bh, _scaled(height, bw, width)))
        elif spec.fit == "crop":
            scaled = (max(bw, _scaled(width, bh, height)), bh)
        elif s == sx:  # pad: the limiting axis lands exactly on the box
            scaled = (bw, min(bh, _scaled(height, bw, width)))
        else:
            scaled = (min(bw, _scaled(width, bh, height)), bh)
    return Plan(src, scaled, _centre_crop(scaled, (bw, bh)), (bw, bh))


def output_format(source_fmt: str, spec: ResizeSpec) -> str:
    """The format an output is written in (``keep``: the source's, or PNG for GIF/TIFF/...)."""
    if spec.format != "keep":
        return spec.format
    return source_fmt if source_fmt in _PIL_SAVE else "png"


@dataclass(frozen=True)
class Resized:
    """A resized (or kept) encoded image; ``kept`` when the source bytes are returned as they are."""

    data: bytes
    fmt: str
    width: int
    height: int
    channels: int
    kept: bool


def _orientation(im: Image.Image) -> int:
    try:
        value = im.getexif().get(_ORIENTATION, 1)
    except Exception:  # odd EXIF is not a failure; treat as upright
        return 1
    return value if value in _TRANSPOSE else 1


def _working_mode(im: Image.Image) -> Image.Image:
    """Bring any source mode to L, LA, RGB or RGBA (see the module doc)."""
    mode = im.mode
    if mode in ("L", "LA", "RGB", "RGBA"):
        return im
    if mode == "P" or mode == "PA":
        return im.convert("RGBA" if mode == "PA" or "transparency" in im.info else "RGB")
    if mode == "1":
        return im.convert("L")
    if mode.startswith("I;16") or mode == "I":
        return grey_to_8bit(im)
    if mode in ("La", "RGBa"):
        return im.convert(mode.upper())
    if mode == "F":
        return im.convert("L")
    return im.convert("RGBA" if "A" in im.getbands() else "RGB")


def _load(data: bytes, spec: ResizeSpec, key: str, source: str) -> tuple[Image.Image, str, bool]:
    """Open, plan, decode (through the DCT fast path when it helps), resample and make upright.

    Returns the processed image (working mode, output size), the source format, and whether the
    source bytes can be kept as they are (then the image is only decoded, to check it).
    """
    if not data:
        raise CorruptSample(key, source, "empty file (0 bytes)")
    with reading_image(key, source):
        im = Image.open(io.BytesIO(data))
        fmt = format_name(im)
        orient = _orientation(im)
        swap = orient in _SWAPS_AXES
        upright = (im.height, im.width) if swap else (im.width, im.height)
        plan = plan_resize(upright[0], upright[1], spec)
        keepable = plan.identity and orient == 1 and output_format(fmt, spec) == fmt
        target = (plan.scaled[1], plan.scaled[0]) if swap else plan.scaled  # in stored orientation
        box = None
        if (spec.draft and fmt == "jpeg" and not keepable
                and target[0] < im.width and target[1] < im.height):
            drafted = im.draft(None, (math.ceil(target[0] * DRAFT_GAP), math.ceil(target[1] * DRAFT_GAP)))
            if drafted is not None:
                box = drafted[1]
        im.load()
        if keepable:
            return im, fmt, True
        icc = im.info.get("icc_profile")
        family = _FAMILY.get(im.mode) if im.mode not in ("P", "PA") else "rgb"
        im = _working_mode(im)
        if im.size != target or box is not None:
            im = im.resize(target, Image.Resampling.LANCZOS, box=box)
        if orient != 1:
            im = im.transpose(_TRANSPOSE[orient])
        if plan.crop != (0, 0) + plan.scaled:
            im = im.crop(plan.crop)
        if im.size != plan.out:
            canvas = Image.new(im.mode, plan.out, 0)
            canvas.paste(im, plan.paste_at)
            im = canvas
        im.info = {"icc_profile": icc} if icc and family == _FAMILY[im.mode] else {}
    return im, fmt, False


def resize_image(data: bytes, spec: ResizeSpec, *, key: str = "", source: str = "") -> Resized:
    """Resize encoded image bytes by ``spec`` and encode them (or keep them as they are).

    The whole image is always decoded, so a truncated or unreadable image raises
    ``CorruptSample`` (decoder warnings are not failures).
    """
    im, fmt, keepable = _load(data, spec, key, source)
    if keepable:
        return Resized(data, fmt, im.width, im.height, stored_channels(im), True)
    out_fmt = output_format(fmt, spec)
    target_mode = _STORE[out_fmt].get(im.mode, im.mode)
    icc = im.info.get("icc_profile") if _FAMILY[target_mode] == _FAMILY[im.mode] else None
    if out_fmt == "webp" and target_mode == "RGBA" and im.getchannel("A").getextrema() == (255, 255):
        target_mode = "RGB"  # libwebp drops a fully opaque alpha channel anyway
    if target_mode != im.mode:
        im = im.convert(target_mode)
    im.info = {}  # nothing of the source's metadata is written unless passed below
    options: dict[str, Any] = {}
    if out_fmt in ("jpeg", "webp"):
        options["quality"] = spec.quality
    if icc and out_fmt != "bmp":
        options["icc_profile"] = icc
    buf = io.BytesIO()
    try:
        im.save(buf, _PIL_SAVE[out_fmt], **options)
    except (OSError, ValueError) as e:  # e.g. a side beyond WebP's 16383
        raise CorruptSample(key, source, f"cannot encode {out_fmt} {im.width}x{im.height}: {e}",
                            stage="encode") from e
    return Resized(buf.getvalue(), out_fmt, im.width, im.height, len(im.getbands()), False)


def resize_pixels(data: bytes, spec: ResizeSpec, *, key: str = "", source: str = "") -> np.ndarray:
    """Resize encoded image bytes by ``spec`` to an upright HxWx3 uint8 RGB array."""
    im, _, keepable = _load(data, spec, key, source)
    if keepable:  # nothing to resample, but still the training decode's mode rule
        im = _working_mode(im)
    if im.mode != "RGB":
        im = im.convert("RGB")
    return np.asarray(im)

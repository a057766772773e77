"""Typed sample fields: one small class per type, one name -> class table, one sample blob.

A field pack's schema is a list of named, typed fields (``image``, ``int``, ``float``, ``str``,
``bytes``, ``json``, ``labels``, ``ndarray`` of a dtype with fixed or variable leading dimension,
``rle`` masks, ``segmentation`` (COCO polygons or RLE per object), ``video``), stored in the manifest so a reader needs only the path (as mosaicml streaming's
``format/mds/encodings.py`` table and index do). Each type turns a value into its canonical bytes
(``encode``) and back (``decode``), and into one ``tf.train.Example`` feature and back
(``feature`` / ``from_feature``). Nothing is pickled.

A sample is stored as one **blob** (``encode_blob``): ``u32 n | u32 size[n] | field bytes in
schema order`` (little-endian); its CRC32C covers every field. LMDB and HDF5 store the blob as
it is, records stores one Example feature per field and rebuilds the same blob on read.

Canonical bytes per type (little-endian throughout):

=========  ===================================================================================
image      the encoded image file (JPEG, PNG, ...)
int        int64
float      float64
str        UTF-8
bytes      the bytes
json       compact UTF-8 JSON (``separators=(",", ":")``, ``ensure_ascii=False``)
labels     int64 per label (a list of class indices)
ndarray    the array's C-order bytes in the declared dtype; ``shape`` fixes every dimension but
           a leading ``None`` (variable length: ``(None, 4)`` is N boxes)
rle        COCO run-length masks: compact JSON ``[{"size": [h, w], "counts": "..."}, ...]``
           (compressed counts, as ``pycocotools.mask.encode`` gives them)
segmentation
           COCO instance masks as given, one per object (``Segmentation``): ``u32 height, u32
           width, u32 n``, then per object ``u8 kind``: 0 no mask; 1 polygons: ``u32 parts,
           u32 lengths[parts]`` (coordinates each) and float64 ``x, y`` coordinates; 2 a
           compressed RLE: ``u32 length`` and its ASCII counts
video      a packed video (``packer.codecs.video_pack.pack_stream``: frame index + MP4 bytes)
=========  ===================================================================================
"""
from __future__ import annotations

import json
import re
import struct
from typing import Any, ClassVar, Iterable, Mapping, Sequence

import numpy as np

from packer.errors import UsageError

__all__ = ["Field", "ImageField", "IntField", "FloatField", "StrField", "BytesField", "JsonField",
           "LabelsField", "NdarrayField", "RleField", "Segmentation", "SegmentationField", "VideoField", "ENCODINGS",
           "Schema", "parse_field", "encode_blob", "split_blob", "pycocotools_mask", "BLOB_FMT", "BOXES",
           "SEGMENTATION_HEAD"]

BLOB_FMT = "fields"  # the ``fmt`` of a Sample/Record whose data is a field blob
BOXES = "boxes"  # the field name that makes a detection pack (``Schema.boxes``)
KEYPOINTS = "keypoints"  # the field name that makes a keypoints pack (``Schema.keypoints``)

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_./-]*")
_COMPRESSED = re.compile(r"[!-~]*")  # a compressed RLE's characters: printable ASCII, no space
_U32 = struct.Struct("<I")
SEGMENTATION_HEAD = struct.Struct("<III")  # a segmentation's height, width and object count


class Field:
    """One named field of a schema; subclasses say how a value becomes bytes and back."""

    type_name: ClassVar[str] = ""

    def __init__(self, *, name: str):
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ValueError(f"field name {name!r}: use letters, digits, '_', '.', '/', '-' (not first)")
        self.name = name

    def encode(self, value: Any) -> bytes:
        """The canonical bytes of ``value``; ValueError naming the field when it does not fit."""
        raise NotImplementedError

    def decode(self, data: bytes | memoryview) -> Any:
        """The value of canonical bytes; ValueError when they are malformed."""
        raise NotImplementedError

    def feature(self, data: bytes | memoryview) -> Any:
        """The ``tf.train.Example`` feature value (bytes, int64 list, ...) of canonical bytes."""
        return bytes(data)

    def from_feature(self, values: list) -> bytes:
        """Canonical bytes back from a parsed feature's value list."""
        if len(values) != 1 or not isinstance(values[0], bytes):
            raise ValueError(f"field {self.name!r}: expected one bytes value")
        return values[0]

    def to_json(self) -> dict[str, Any]:
        """The field as the manifest's ``schema`` stores it."""
        return {"name": self.name, "type": self.type_name}

    def spec(self) -> str:
        """The short type string (``ndarray:float32:*,4``) that ``parse_field`` reads back."""
        return self.type_name

    def _bad(self, value: Any, why: str) -> ValueError:
        text = repr(value)
        return ValueError(f"field {self.name!r}: {why} (got {text[:60] + '...' if len(text) > 60 else text})")

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.to_json() == self.to_json()

    def __hash__(self) -> int:
        return hash(json.dumps(self.to_json(), sort_keys=True))

    def __repr__(self) -> str:
        return f"{self.name}:{self.spec()}"


class ImageField(Field):
    """An encoded image (the file's bytes, or its resized re-encoding); decoded by the reader."""

    type_name = "image"

    def encode(self, value: Any) -> bytes:
        if not isinstance(value, (bytes, bytearray, memoryview)) or not len(value):
            raise self._bad(value, "an image field holds the encoded image bytes")
        return bytes(value)

    def decode(self, data: bytes | memoryview) -> bytes:
        return bytes(data)


class VideoField(Field):
    """A video, re-encoded as ``pack-videos`` stores it (an H.264 stream with its frame index,
    ``packer.codecs.video_pack.pack_stream``); read back as a ``PackedVideo`` that decodes only
    the frames asked for."""

    type_name = "video"

    def encode(self, value: Any) -> bytes:
        from packer.codecs.video_pack import unpack_stream

        if not isinstance(value, (bytes, bytearray, memoryview)) or not len(value):
            raise self._bad(value, "a video field holds a packed video's bytes")
        try:
            unpack_stream(value)
        except ValueError as e:
            raise self._bad(value, f"not a packed video ({e})") from None
        return bytes(value)

    def decode(self, data: bytes | memoryview) -> Any:
        from packer.codecs.video_pack import PackedVideo

        return PackedVideo(data)


class IntField(Field):
    """A signed 64-bit integer."""

    type_name = "int"

    def encode(self, value: Any) -> bytes:
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            raise self._bad(value, "not an integer")
        if not -(1 << 63) <= int(value) < (1 << 63):
            raise self._bad(value, "out of the int64 range")
        return struct.pack("<q", int(value))

    def decode(self, data: bytes | memoryview) -> int:
        if len(data) != 8:
            raise ValueError(f"field {self.name!r}: {len(data)} bytes, an int takes 8")
        return struct.unpack("<q", data)[0]

    def feature(self, data: bytes | memoryview) -> list[int]:
        return [self.decode(data)]

    def from_feature(self, values: list) -> bytes:
        if len(values) != 1 or not isinstance(values[0], int):
            raise ValueError(f"field {self.name!r}: expected one int64 value")
        return struct.pack("<q", values[0])


class FloatField(Field):
    """A float64 (stored exactly; in records as its 8 bytes, ``tf.io.decode_raw(.., tf.float64)``)."""

    type_name = "float"

    def encode(self, value: Any) -> bytes:
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
            raise self._bad(value, "not a number")
        return struct.pack("<d", float(value))

    def decode(self, data: bytes | memoryview) -> float:
        if len(data) != 8:
            raise ValueError(f"field {self.name!r}: {len(data)} bytes, a float takes 8")
        return struct.unpack("<d", data)[0]


class StrField(Field):
    """A UTF-8 string."""

    type_name = "str"

    def encode(self, value: Any) -> bytes:
        if not isinstance(value, str):
            raise self._bad(value, "not a string")
        return value.encode("utf-8", "surrogatepass")

    def decode(self, data: bytes | memoryview) -> str:
        try:
            return bytes(data).decode("utf-8", "surrogatepass")
        except UnicodeDecodeError as e:
            raise ValueError(f"field {self.name!r}: not UTF-8 ({e})") from e


class BytesField(Field):
    """Opaque bytes."""

    type_name = "bytes"

    def encode(self, value: Any) -> bytes:
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise self._bad(value, "not bytes")
        return bytes(value)

    def decode(self, data: bytes | memoryview) -> bytes:
        return bytes(data)


class JsonField(Field):
    """Any JSON value (compact UTF-8 JSON; NaN and infinities refused)."""

    type_name = "json"

    def encode(self, value: Any) -> bytes:
        try:
            return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")
        except (TypeError, ValueError) as e:
            raise self._bad(value, f"not JSON-serializable ({e})") from e

    def decode(self, data: bytes | memoryview) -> Any:
        try:
            return json.loads(bytes(data).decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            raise ValueError(f"field {self.name!r}: malformed JSON ({e})") from e


class LabelsField(Field):
    """A list of class indices (multi-label); int64 each; in records an int64 list."""

    type_name = "labels"

    def encode(self, value: Any) -> bytes:
        if isinstance(value, (str, bytes)) or not isinstance(value, (Sequence, np.ndarray)):
            raise self._bad(value, "not a list of integers")
        for v in value:
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) \
                    or not -(1 << 63) <= int(v) < (1 << 63):
                raise self._bad(value, "not a list of int64 integers")
        return np.asarray([int(v) for v in value], dtype="<i8").tobytes()

    def decode(self, data: bytes | memoryview) -> list[int]:
        if len(data) % 8:
            raise ValueError(f"field {self.name!r}: {len(data)} bytes is not a whole number of int64 labels")
        return np.frombuffer(data, dtype="<i8").tolist()

    def feature(self, data: bytes | memoryview) -> list[int]:
        return self.decode(data)

    def from_feature(self, values: list) -> bytes:
        if not all(isinstance(v, int) for v in values):
            raise ValueError(f"field {self.name!r}: expected int64 values")
        return np.asarray(values, dtype="<i8").tobytes()


_DTYPES = ("bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
           "float16", "float32", "float64")


class NdarrayField(Field):
    """A numpy array of ``dtype``; ``shape`` fixes every dimension but a leading ``None``
    (variable length; ``(None,)``, the default, is a 1-D array of any length)."""

    type_name = "ndarray"

    def __init__(self, *, name: str, dtype: str = "float32", shape: Sequence[int | None] = (None,)):
        super().__init__(name=name)
        if str(dtype) not in _DTYPES:
            raise ValueError(f"field {name!r}: dtype must be one of {', '.join(_DTYPES)}, not {dtype!r}")
        shape = tuple(None if d is None or d == -1 else d for d in shape)
        if not shape or any(d is None for d in shape[1:]) or \
                any(d is not None and (not isinstance(d, int) or d < 0) for d in shape):
            raise ValueError(f"field {name!r}: shape {shape!r}: non-negative sizes, only the first may be None")
        self.dtype = np.dtype(dtype).newbyteorder("<")
        self.dtype_name = str(dtype)
        self.shape = shape
        self._row = int(np.prod([d for d in shape[1:]], dtype=np.int64)) * self.dtype.itemsize

    def encode(self, value: Any) -> bytes:
        if type(value) is np.ndarray and value.dtype == self.dtype and value.ndim == len(self.shape) and all(
                want is None or got == want for got, want in zip(value.shape, self.shape)):
            return value.tobytes()  # already what the schema says (what the checks below end with)
        try:
            arr = np.asarray(value)
        except (TypeError, ValueError) as e:
            raise self._bad(value, f"not an array ({e})") from e
        if arr.dtype == object or arr.dtype.kind in "USV":
            raise self._bad(value, "not a numeric array")
        if arr.ndim != len(self.shape) and not (arr.size == 0 and self.shape[0] is None):
            raise self._bad(value, f"has {arr.ndim} dimensions, the schema says {self._shape_text()}")
        if arr.size == 0 and self.shape[0] is None:
            arr = arr.reshape((0,) + self.shape[1:])
        if any(want is not None and got != want for got, want in zip(arr.shape, self.shape)):
            raise self._bad(value, f"shape {arr.shape} is not {self._shape_text()}")
        cast = arr.astype(self.dtype)
        if arr.dtype.kind in "iub" and self.dtype.kind in "iub" and not np.array_equal(cast, arr):
            raise self._bad(value, f"values do not fit {self.dtype_name}")
        if arr.dtype.kind == "f" and self.dtype.kind in "iub":
            raise self._bad(value, f"float values in an {self.dtype_name} array")
        return np.ascontiguousarray(cast).tobytes()

    def decode(self, data: bytes | memoryview) -> np.ndarray:
        if self.shape[0] is None:
            if self._row == 0 or len(data) % self._row:
                if self._row == 0 and len(data) == 0:
                    return np.zeros((0,) + self.shape[1:], self.dtype).astype(self.dtype_name)
                raise ValueError(f"field {self.name!r}: {len(data)} bytes is not a whole number of "
                                 f"{self._shape_text()} rows")
            shape = (len(data) // self._row,) + self.shape[1:]
        else:
            shape = self.shape
            if len(data) != self._row * shape[0]:
                raise ValueError(f"field {self.name!r}: {len(data)} bytes do not make {self._shape_text()}")
        # a writable native-order copy, not a view of the read buffer
        return np.frombuffer(data, dtype=self.dtype).reshape(shape).astype(self.dtype_name)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "type": "ndarray", "dtype": self.dtype_name, "shape": list(self.shape)}

    def spec(self) -> str:
        return f"ndarray:{self.dtype_name}:{','.join('*' if d is None else str(d) for d in self.shape)}"

    def _shape_text(self) -> str:
        return "(" + ", ".join("N" if d is None else str(d) for d in self.shape) + ")"


class RleField(Field):
    """COCO run-length masks, one per object: ``[{"size": [h, w], "counts": str}, ...]``
    (compressed counts; ``pycocotools.mask.decode`` takes the list as it is)."""

    type_name = "rle"

    def encode(self, value: Any) -> bytes:
        if isinstance(value, Mapping) or not isinstance(value, (Sequence, np.ndarray)):
            raise self._bad(value, "a list of COCO RLE dicts")
        out = []
        for m in value:
            if type(m) is dict and len(m) == 2 and type(m.get("size")) is list and type(m.get("counts")) is str \
                    and len(m["size"]) == 2 and type(m["size"][0]) is int and type(m["size"][1]) is int \
                    and m["size"][0] >= 0 and m["size"][1] >= 0 and _COMPRESSED.fullmatch(m["counts"]):
                out.append({"size": m["size"], "counts": m["counts"]})  # (what the checks below end with)
                continue
            if not isinstance(m, Mapping) or set(m) - {"size", "counts"} or len(m) != 2:
                raise self._bad(m, "an RLE is {'size': [h, w], 'counts': ...}")
            size, counts = m["size"], m["counts"]
            if isinstance(counts, (bytes, bytearray)):
                counts = bytes(counts).decode("ascii", "replace")
            if not (isinstance(size, (list, tuple)) and len(size) == 2
                    and all(isinstance(v, (int, np.integer)) and v >= 0 for v in size)):
                raise self._bad(m, "RLE size is [height, width]")
            if not isinstance(counts, str) or not _COMPRESSED.fullmatch(counts):
                raise self._bad(m, "RLE counts must be compressed (pycocotools.mask.encode / frPyObjects)")
            out.append({"size": [int(size[0]), int(size[1])], "counts": counts})
        return json.dumps(out, separators=(",", ":")).encode("ascii")

    def decode(self, data: bytes | memoryview) -> list[dict[str, Any]]:
        try:
            value = json.loads(bytes(data).decode("ascii"))
        except (UnicodeDecodeError, ValueError) as e:
            raise ValueError(f"field {self.name!r}: malformed RLE list ({e})") from e
        if not isinstance(value, list) or not all(isinstance(m, dict) and "size" in m and "counts" in m
                                                  for m in value):
            raise ValueError(f"field {self.name!r}: malformed RLE list")
        return value


def pycocotools_mask() -> Any:
    """``pycocotools.mask``, or a UsageError naming the extra that installs it."""
    try:
        from pycocotools import mask
    except ImportError as e:
        raise UsageError("COCO masks need pycocotools: pip install 'packer[coco]'") from e
    return mask


class Segmentation:
    """One image's COCO instance masks as the annotation file gave them, at ``height`` x
    ``width`` (the stored image's pixels): per object its polygons (float64 arrays of ``x, y``
    pairs, at least 3 points each), a compressed RLE string, or None (no mask). Kept as given so
    that a training pipeline that transforms polygons (Detectron2, MMDetection) gets them exact;
    ``rle()`` draws them as ``pycocotools`` does (bit for bit what drawing them at pack time gave).

    Args:
        height, width: the image size the coordinates and RLEs are in.
        objects: one entry per object: a list of polygons (each a flat sequence of numbers), a
            compressed RLE (a ``{"size", "counts"}`` dict of this size, or its counts string),
            or None.
    """

    __slots__ = ("height", "width", "_objects", "_encoded")

    def __init__(self, *, height: int, width: int, objects: Sequence[Any]):
        if not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) and 0 <= v < 1 << 32
                   for v in (height, width)):
            raise ValueError(f"segmentation size {height!r} x {width!r}: non-negative integers")
        self.height, self.width = int(height), int(width)
        self._encoded: bytes | None = None
        self._objects = [self._object(obj) for obj in objects]

    @property
    def objects(self) -> list[list[np.ndarray] | str | None]:
        """Per object: its polygons (float64 arrays), its compressed RLE string, or None."""
        if self._objects is None:
            self._objects = Segmentation.decode(self._encoded)._objects
        return self._objects

    def _object(self, obj: Any) -> list[np.ndarray] | str | None:
        if obj is None or (isinstance(obj, list) and not obj):
            return None
        if isinstance(obj, Mapping):
            size, obj = obj.get("size"), obj.get("counts")
            if not isinstance(size, (list, tuple)) or list(size) != [self.height, self.width]:
                raise ValueError(f"an RLE of size {size!r} in a {self.height}x{self.width} segmentation")
            if not isinstance(obj, (str, bytes, bytearray)):
                raise ValueError("RLE counts must be compressed (pycocotools.mask.encode / frPyObjects)")
        if isinstance(obj, (bytes, bytearray)):
            obj = bytes(obj).decode("ascii", "replace")
        if isinstance(obj, str):
            if not _COMPRESSED.fullmatch(obj):
                raise ValueError("RLE counts must be compressed (pycocotools.mask.encode / frPyObjects)")
            return obj
        if not isinstance(obj, (list, tuple)):
            raise ValueError(f"an object's mask is polygons, an RLE or None, not {type(obj).__name__}")
        polys = []
        for p in obj:
            try:
                arr = np.array(p, dtype=np.float64).reshape(-1)
            except (TypeError, ValueError) as e:
                raise ValueError(f"a polygon is a list of numbers ({e})") from e
            if len(arr) % 2 or len(arr) < 6 or not np.isfinite(arr).all():
                raise ValueError(f"a polygon is at least 3 finite x, y points (got {len(arr)} numbers)")
            polys.append(arr)
        return polys

    @classmethod
    def trusted(cls, height: int, width: int, objects: list[list[np.ndarray] | str | None]) -> "Segmentation":
        """A Segmentation of objects already in its form and checked (float64 polygon arrays,
        compressed counts, None): a packer source's, without checking them again."""
        seg = cls.__new__(cls)
        seg.height, seg.width, seg._objects, seg._encoded = height, width, objects, None
        return seg

    @classmethod
    def from_encoded(cls, data: bytes) -> "Segmentation":
        """A Segmentation of canonical bytes a packer source built from values it checked
        (``packer.conversion.coco``: the annotation file's polygons are already in this
        layout); its objects are decoded only when asked for, its bytes stored as they are."""
        seg = cls.__new__(cls)
        seg.height, seg.width, _ = SEGMENTATION_HEAD.unpack_from(data, 0)
        seg._objects, seg._encoded = None, data
        return seg

    def __len__(self) -> int:
        return len(self.objects)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Segmentation) or (self.height, self.width, len(self)) != \
                (other.height, other.width, len(other)):
            return False
        for a, b in zip(self.objects, other.objects):
            if isinstance(a, list) and isinstance(b, list):
                if len(a) != len(b) or not all(np.array_equal(x, y) for x, y in zip(a, b)):
                    return False
            elif a != b:
                return False
        return True

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        kinds = ["polygons" if isinstance(o, list) else "rle" if o is not None else "none" for o in self.objects]
        return f"Segmentation({self.height}x{self.width}, {kinds})"

    def rle(self) -> list[dict[str, Any]]:
        """One COCO RLE dict (compressed counts) per object, drawn by pycocotools: every polygon
        by one ``frPyObjects`` call, an object of several parts their ``merge``; no mask is an
        empty one."""
        h, w = self.height, self.width
        polys: list[np.ndarray] = []
        for obj in self.objects:
            if isinstance(obj, list):
                polys += obj
        mask = pycocotools_mask()
        drawn = mask.frPyObjects(polys, h, w) if polys else []
        out, at = [], 0
        for obj in self.objects:
            if isinstance(obj, list):
                counts = drawn[at]["counts"] if len(obj) == 1 else mask.merge(drawn[at:at + len(obj)])["counts"]
                at += len(obj)
            elif obj is None:
                counts = mask.frPyObjects({"size": [h, w], "counts": [h * w]}, h, w)["counts"]
            else:
                counts = obj
            out.append({"size": [h, w], "counts": counts.decode("ascii") if isinstance(counts, bytes) else counts})
        return out

    def to_coco(self) -> list[Any]:
        """Each object's COCO ``segmentation`` value, as JSON takes it: polygons as lists of
        numbers, an RLE as ``{"size", "counts"}``, no mask as ``[]``."""
        return [[p.tolist() for p in obj] if isinstance(obj, list) else [] if obj is None
                else {"size": [self.height, self.width], "counts": obj} for obj in self.objects]

    def encode(self) -> bytes:
        """The field's canonical bytes (module doc)."""
        if self._encoded is not None:
            return self._encoded
        parts = [SEGMENTATION_HEAD.pack(self.height, self.width, len(self.objects))]
        for obj in self.objects:
            if obj is None:
                parts.append(b"\0")
            elif isinstance(obj, str):
                text = obj.encode("ascii")
                parts.append(struct.pack("<BI", 2, len(text)))
                parts.append(text)
            else:
                parts.append(struct.pack(f"<BI{len(obj)}I", 1, len(obj), *(len(p) for p in obj)))
                parts += [p.tobytes() if p.dtype == np.float64 else p.astype(np.float64).tobytes() for p in obj]
        return b"".join(parts)

    @classmethod
    def decode(cls, data: bytes | memoryview) -> "Segmentation":
        """A Segmentation from its canonical bytes (the polygons copied out of ``data``);
        ValueError when they are malformed."""
        data = bytes(data)
        end = len(data)
        if end < SEGMENTATION_HEAD.size:
            raise ValueError(f"{end} bytes are shorter than a segmentation's header")
        h, w, n = SEGMENTATION_HEAD.unpack_from(data, 0)
        pos, objects = SEGMENTATION_HEAD.size, []
        try:
            for _ in range(n):
                kind = data[pos]
                pos += 1
                if kind == 0:
                    objects.append(None)
                elif kind == 2:
                    length = _U32.unpack_from(data, pos)[0]
                    text = data[pos + 4:pos + 4 + length]
                    pos += 4 + length
                    if len(text) != length or not _COMPRESSED.fullmatch(text.decode("ascii")):
                        raise ValueError("a malformed RLE")
                    objects.append(text.decode("ascii"))
                elif kind == 1:
                    parts = _U32.unpack_from(data, pos)[0]
                    lengths = struct.unpack_from(f"<{parts}I", data, pos + 4)
                    pos += 4 + 4 * parts
                    total = sum(lengths)
                    if not parts or pos + 8 * total > end or any(k % 2 or k < 6 for k in lengths):
                        raise ValueError("malformed polygons")
                    coords = np.frombuffer(data, "<f8", total, pos).astype(np.float64)
                    pos += 8 * total
                    cuts = np.cumsum(lengths)[:-1]
                    objects.append(np.split(coords, cuts) if parts > 1 else [coords])
                else:
                    raise ValueError(f"an object of kind {kind}")
        except (IndexError, struct.error, UnicodeDecodeError) as e:
            raise ValueError(f"a segmentation cut short ({e})") from e
        if pos != end:
            raise ValueError(f"a segmentation of {n} objects ends at byte {pos} of {end}")
        return cls.trusted(h, w, objects)


class SegmentationField(Field):
    """COCO instance masks as the annotation file gave them (polygons or RLE per object, at the
    stored image's size): a ``Segmentation``. ``PackedDataset`` returns them drawn as COCO RLE
    dicts (``masks="rle"``), decoded arrays (``masks="decode"``) or as stored
    (``masks="segmentation"``)."""

    type_name = "segmentation"

    def encode(self, value: Any) -> bytes:
        if not isinstance(value, Segmentation):
            if not isinstance(value, Mapping) or set(value) != {"size", "objects"}:
                raise self._bad(value, "a Segmentation or {'size': [h, w], 'objects': [...]}")
            size = value["size"]
            if not isinstance(size, (list, tuple)) or len(size) != 2:
                raise self._bad(value, "size is [height, width]")
            try:
                value = Segmentation(height=size[0], width=size[1], objects=value["objects"])
            except ValueError as e:
                raise self._bad(value, str(e)) from e
        return value.encode()

    def decode(self, data: bytes | memoryview) -> Segmentation:
        try:
            return Segmentation.decode(data)
        except ValueError as e:
            raise ValueError(f"field {self.name!r}: {e}") from e


ENCODINGS: dict[str, type[Field]] = {cls.type_name: cls for cls in (
    ImageField, VideoField, IntField, FloatField, StrField, BytesField, JsonField, LabelsField, NdarrayField,
    RleField, SegmentationField)}


def parse_field(name: str, spec: str | Mapping[str, Any]) -> Field:
    """A Field from a type string (``"int"``, ``"ndarray:float32:*,4"``) or its manifest dict."""
    if isinstance(spec, Mapping):
        spec = dict(spec)
        type_name = spec.pop("type", None)
        spec.pop("name", None)
    else:
        type_name, _, rest = str(spec).partition(":")
        spec = {}
        if type_name == "ndarray" and rest:
            dtype, _, shape = rest.partition(":")
            spec["dtype"] = dtype
            if shape:
                try:
                    spec["shape"] = [None if d.strip() in ("*", "N", "-1") else int(d) for d in shape.split(",")]
                except ValueError:
                    raise ValueError(f"field {name!r}: bad shape {shape!r} (e.g. '*,4')") from None
        elif rest:
            raise ValueError(f"field {name!r}: type {type_name!r} takes no arguments ({spec!r})")
    cls = ENCODINGS.get(type_name)  # type: ignore[arg-type]
    if cls is None:
        raise ValueError(f"field {name!r}: unknown type {type_name!r} (known: {', '.join(ENCODINGS)})")
    try:
        return cls(name=name, **spec)
    except TypeError as e:
        raise ValueError(f"field {name!r}: bad arguments for {type_name} ({e})") from e


def encode_blob(parts: Sequence[bytes | memoryview]) -> bytes:
    """``u32 n | u32 size[n] | the parts`` (little-endian): one sample's fields in schema order."""
    head = struct.pack(f"<{len(parts) + 1}I", len(parts), *(len(p) for p in parts))
    return b"".join((head, *parts))


def split_blob(blob: bytes | memoryview, n: int) -> list[memoryview]:
    """The ``n`` field byte strings of a blob (views); ValueError when it is malformed."""
    mv = memoryview(blob)
    if len(mv) < 4 * (n + 1):
        raise ValueError(f"field blob of {len(mv)} bytes is shorter than its header")
    count = _U32.unpack_from(mv, 0)[0]
    if count != n:
        raise ValueError(f"field blob holds {count} fields, the schema has {n}")
    sizes = struct.unpack_from(f"<{n}I", mv, 4)
    pos = 4 * (n + 1)
    if pos + sum(sizes) != len(mv):
        raise ValueError(f"field blob sizes add up to {pos + sum(sizes)} bytes, it has {len(mv)}")
    out = []
    for size in sizes:
        out.append(mv[pos:pos + size])
        pos += size
    return out


class Schema:
    """The ordered, named, typed fields of a field pack.

    Args:
        fields: ``Field`` objects, or ``{name: type string or dict}`` (``parse_field``).
    """

    def __init__(self, fields: Iterable[Field] | Mapping[str, Any]):
        if isinstance(fields, Mapping):
            fields = [f if isinstance(f, Field) else parse_field(n, f) for n, f in fields.items()]
        self.fields: tuple[Field, ...] = tuple(fields)
        if not self.fields:
            raise ValueError("a schema needs at least one field")
        names = [f.name for f in self.fields]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"field names repeat: {', '.join(dup)}")
        self.by_name = {f.name: f for f in self.fields}

    @property
    def names(self) -> list[str]:
        """The field names in order."""
        return [f.name for f in self.fields]

    @property
    def image_fields(self) -> list[str]:
        """The names of the image fields, in order."""
        return [f.name for f in self.fields if f.type_name == "image"]

    @property
    def video_fields(self) -> list[str]:
        """The names of the video fields, in order."""
        return [f.name for f in self.fields if f.type_name == "video"]

    @property
    def boxes(self) -> "NdarrayField | None":
        """The detection boxes of a detection pack: its ``boxes`` field when that is an ndarray of
        shape ``(N, 4)``, xyxy in the stored (first) image's pixels; None in other packs."""
        f = self.by_name.get(BOXES)
        return f if isinstance(f, NdarrayField) and f.shape == (None, 4) else None

    @property
    def keypoints(self) -> "NdarrayField | None":
        """The keypoints of a keypoints pack: its ``keypoints`` field when that is an ndarray of
        shape ``(N, K, 3)`` (per object K points: x, y in the stored (first) image's pixels, and
        COCO's visibility v); None in other packs."""
        f = self.by_name.get(KEYPOINTS)
        return f if isinstance(f, NdarrayField) and len(f.shape) == 3 and f.shape[0] is None and f.shape[2] == 3 \
            else None

    def to_json(self) -> list[dict[str, Any]]:
        """The manifest's ``schema``: one dict per field."""
        return [f.to_json() for f in self.fields]

    @classmethod
    def from_json(cls, items: Sequence[Mapping[str, Any]]) -> "Schema":
        """The schema a manifest stores (ValueError when malformed)."""
        if not isinstance(items, list) or not all(isinstance(d, Mapping) and "name" in d for d in items):
            raise ValueError("schema must be a list of {name, type, ...} objects")
        return cls([parse_field(d["name"], d) for d in items])

    def encode(self, values: Mapping[str, Any]) -> bytes:
        """The blob of one sample; ValueError naming the field that is missing or does not fit."""
        missing = [n for n in self.by_name if n not in values]
        if missing:
            raise ValueError(f"missing field(s): {', '.join(missing)}")
        return encode_blob([f.encode(values[f.name]) for f in self.fields])

    def split(self, blob: bytes | memoryview) -> dict[str, memoryview]:
        """``{name: canonical bytes}`` of a blob (views, nothing decoded)."""
        return dict(zip(self.by_name, split_blob(blob, len(self.fields))))

    def decode(self, blob: bytes | memoryview, names: Iterable[str] | None = None) -> dict[str, Any]:
        """``{name: value}`` of a blob: every field, or only ``names``."""
        parts = self.split(blob)
        wanted = self.by_name if names is None else names
        return {n: self.by_name[n].decode(parts[n]) for n in wanted}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Schema) and other.to_json() == self.to_json()

    def __repr__(self) -> str:
        return f"Schema({', '.join(map(repr, self.fields))})"

"""COCO annotation files as field items: one item per image with its annotations, checked.

``coco_items(annotations, root)`` reads an ``instances_*.json`` (boxes, categories, crowd flags,
areas, polygon or RLE masks; with keypoints where its categories name them, as
``person_keypoints_*.json`` does) or a ``captions_*.json``; every image becomes a ``FieldItem``.
Category ids map to contiguous labels ``0..K-1`` in ascending id (``categories``, stored in the
manifest with their keypoint names and skeleton). A bad annotation (an unknown image id or
category, a negative box size, a box outside its image, a polygon of fewer than 3 points, a
malformed RLE, keypoints that are not 3 numbers per named point, a visibility not 0, 1 or 2, a
labelled point outside the image, a ``num_keypoints`` that does not count the labelled points)
is an ``InputFailure`` naming the image and the annotation ids; its image is not packed (a
missing annotation would train as background), every other image is. The per-image work
(``packer.commands.pack_fields``) turns the values into the stored fields with ``sample_fields``
(an instances pack: straight into the sample's blob with ``instances_blob``, the same bytes).

**Memory.** The file is never parsed whole (``json.load`` of a COCO-sized file holds over 2 GB
of dicts, lists and floats, as ``pycocotools.coco.COCO(file)`` does): ``object_members``
(``packer.codecs.json_stream``) decodes one image or annotation at a time, and each
annotation is checked and appended at once to one buffer, as a fixed-size binary record
(``ANNOTATION``) followed by its mask (polygons as float64 coordinates, RLE counts as int64
runs or the compressed string) and its keypoints (float64 ``x, y, v``, none when it gave
none); each image keeps where its annotations' records are. The
file's members may come in any order (COCO's own files list the categories last), so the
checks that need the image's size or the categories run once the file is read, on the
records, in the order ``json.load``-based checking ran them (the same failure, with the same
reason, for every annotation). An item's ``values`` are then ``image_id``, ``orig_size`` and
``annotations``: an ``AnnotationRecords``, where its records are in that buffer (nothing is
copied; forked workers share the buffer's pages; pickled for another executor, an item
carries its own records).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
from math import isfinite
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from packer.codecs.fields import SEGMENTATION_HEAD, Schema, Segmentation, pycocotools_mask
from packer.codecs.json_stream import Elements, object_members
from packer.conversion.input_failures import InputFailure, bad_line
from packer.conversion.inputs import FieldItem, safe_key
from packer.errors import UsageError

__all__ = ["CocoSource", "coco_items", "grow_categories", "instances_schema", "keypoints_schema", "captions_schema", "sample_fields",
           "instances_blob", "rle_counts", "Annotations", "AnnotationRecords", "decode_annotations", "ANNOTATION", "CAPTION"]

log = logging.getLogger(__name__)

# A box may reach past its image's edge by this much (pixels) before it is "outside": COCO's own
# boxes end exactly on the edge, written as rounded decimals.
BOX_SLACK = 0.01

# One instance annotation as stored (little-endian, no padding), then its mask's ``seg_len``
# bytes, then its ``kp_len`` keypoint values (float64 ``x, y, v`` per point): ``file_index`` is
# its position in the file's list, ``flags`` bits 0-3 say which bbox values were JSON integers
# (for the reasons, which show the bbox as written), bit 4 that a check failed while it was
# read, bit 5 that its RLE size or bbox did not fit int64/float64 exactly (kept aside), bit 6
# that it gave ``keypoints`` (``[]`` too). ``kind``: 0 no mask, 1 polygons (u32 count, u32
# lengths, float64 coordinates), 2 RLE runs (int64 each), 3 a compressed RLE string (ASCII).
ANNOTATION = np.dtype([("file_index", "<i8"), ("id", "<i8"), ("category_id", "<i8"), ("label", "<i8"),
                       ("bbox", "<f8", (4,)), ("area", "<f8"), ("iscrowd", "u1"), ("flags", "u1"), ("kind", "u1"),
                       ("rle_height", "<i8"), ("rle_width", "<i8"), ("seg_len", "<u4"), ("kp_len", "<u4")])
# One caption: its file index, id and UTF-8 length (the text follows).
CAPTION = np.dtype([("file_index", "<i8"), ("id", "<i8"), ("text_len", "<u4")])
_ANN = struct.Struct("<qqqq4ddBBBqqII")  # the same records for struct (tests/conversion/test_coco.py checks)
_CAP = struct.Struct("<qqI")
_RLE_HEAD = struct.Struct("<BI")  # a stored segmentation's RLE object: kind 2, its length
_I64_2 = struct.Struct("<qq")  # an int64 (2,) array: orig_size
_INSTANCES_HEAD = struct.Struct("<11I")  # a field blob's head (encode_blob) of the 10 instances fields
_LABEL_AT = ANNOTATION.fields["label"][1]
_NONE, _POLY, _RLE_RUNS, _RLE_STRING = range(4)
# positions in an unpacked record
_F_CATEGORY, _F_BOX, _F_FLAGS, _F_KIND, _F_RLE, _F_SEG_LEN, _F_KP_LEN = 2, 4, 10, 11, 12, 14, 15
_FAILED, _ASIDE, _KP_GIVEN = 0x10, 0x20, 0x40
_NUMBER = {int, float}  # the types json gives numbers (a bool is not one)
_VISIBILITIES = {0, 1, 2}  # a keypoint's v: not labelled, labelled but hidden, visible (1.0 is 1)
_I64 = (-(1 << 63), 1 << 63)

# The order of the checks of an instance annotation: the first that fails is its reason.
# Those marked (later) need the image's size or the categories, so they run once the file is read.
# The keypoint checks (_KEYPOINTS on) apply only in a file whose categories name keypoints.
(_CATEGORY, _BBOX, _FINITE, _NEGATIVE, _OUTSIDE, _CROWD, _AREA, _SEGMENTATION, _RLE_SIZE_IS_IMAGE, _RLE_COUNTS,
 _RLE_COVER, _KEYPOINTS, _VISIBILITY, _NUM_KEYPOINTS, _KP_COUNT, _KP_OUTSIDE,
 _PASSED) = range(17)  # _CATEGORY, _OUTSIDE, _RLE_SIZE_IS_IMAGE, _KP_COUNT, _KP_OUTSIDE: (later)


def instances_schema() -> Schema:
    """The fields of an instances pack."""
    return Schema({"image": "image", "image_id": "int", "boxes": "ndarray:float32:*,4",
                   "labels": "ndarray:int64:*", "category_ids": "ndarray:int64:*", "iscrowd": "ndarray:uint8:*",
                   "area": "ndarray:float32:*", "annotation_ids": "ndarray:int64:*", "masks": "segmentation",
                   "orig_size": "ndarray:int64:2"})


def keypoints_schema(k: int) -> Schema:
    """The fields of an instances pack whose categories name ``k`` keypoints (COCO person
    keypoints): ``instances_schema``'s, then ``keypoints`` (x, y, v of each point) and
    ``num_keypoints`` (the labelled points, v > 0) per object."""
    return Schema({**instances_schema().by_name, "keypoints": f"ndarray:float32:*,{k},3",
                   "num_keypoints": "ndarray:int64:*"})


def captions_schema() -> Schema:
    """The fields of a captions pack."""
    return Schema({"image": "image", "image_id": "int", "captions": "json", "annotation_ids": "ndarray:int64:*",
                   "orig_size": "ndarray:int64:2"})


@dataclass
class CocoSource:
    """What ``coco_items`` read: the items, their schema, the categories ``[{id, name}]`` by
    label (empty for captions) and the kind (``instances`` or ``captions``)."""

    items: list[FieldItem]
    schema: Schema
    categories: list[dict[str, Any]]
    kind: str


def _int_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int64(value: Any) -> bool:
    return _int_id(value) and _I64[0] <= value < _I64[1]


def rle_counts(counts: str) -> list[int]:
    """The run lengths of a compressed COCO RLE string (pycocotools' ``rleFrString``);
    ValueError when a character is outside the code's alphabet or the string ends mid-number."""
    out: list[int] = []
    p, n = 0, len(counts)
    while p < n:
        x, k, more = 0, 0, True
        while more:
            if p >= n:
                raise ValueError("RLE counts string ends inside a number")
            c = ord(counts[p]) - 48
            if not 0 <= c < 64:
                raise ValueError(f"character {counts[p]!r} is not an RLE code")
            x |= (c & 0x1F) << (5 * k)
            more = bool(c & 0x20)
            p += 1
            k += 1
            if not more and (c & 0x10):
                x |= -1 << (5 * k)
        if len(out) > 2:
            x += out[-2]
        out.append(x)
    return out


class _Failed(Exception):
    """A check of an annotation failed while it was read: at ``stage``, for ``reason``; ``rle``:
    the RLE size read before it failed ``(height, width, aside)`` (its check against the image
    comes first, once the image is known)."""

    def __init__(self, stage: int, reason: str, rle: tuple[int, int, Any] | None = None):
        super().__init__(reason)
        self.stage, self.reason, self.rle = stage, reason, rle


def _segmentation(seg: Any) -> tuple[int, int, int, bytes, Any]:
    """``(kind, rle height, rle width, mask bytes, aside)`` of a segmentation (``aside``: an RLE
    size that does not fit int64, else None); ``_Failed`` for what is wrong without knowing the
    image (its size is checked later)."""
    if seg is None or seg == []:
        return _NONE, 0, 0, b"", None
    if isinstance(seg, list):
        parts = [struct.pack(f"<I{len(seg)}I", len(seg), *(len(p) if type(p) is list else 0 for p in seg))]
        for poly in seg:
            if type(poly) is not list or not set(map(type, poly)) <= _NUMBER:
                raise _Failed(_SEGMENTATION, "a polygon is a list of numbers")
            if len(poly) % 2:
                raise _Failed(_SEGMENTATION, f"a polygon has an odd number ({len(poly)}) of coordinates")
            if len(poly) < 6:
                raise _Failed(_SEGMENTATION, f"a polygon has {len(poly) // 2} points, fewer than 3")
            try:
                parts.append(struct.pack(f"<{len(poly)}d", *poly))
            except OverflowError:
                raise _Failed(_SEGMENTATION, "a polygon is a list of numbers") from None
        return _POLY, 0, 0, b"".join(parts), None
    if isinstance(seg, dict):
        size, counts = seg.get("size"), seg.get("counts")
        if not (isinstance(size, list) and len(size) == 2 and all(_int_id(v) for v in size)):
            raise _Failed(_SEGMENTATION, f"malformed RLE: size {size!r} is not [height, width]")
        aside = None if _int64(size[0]) and _int64(size[1]) else list(size)
        rh, rw = (0, 0) if aside else size
        rle = (rh, rw, aside)
        if isinstance(counts, list):
            if not all(_int_id(v) and v >= 0 for v in counts):
                raise _Failed(_RLE_COUNTS, "malformed RLE: counts are not non-negative integers", rle)
            runs = counts
            kind = _RLE_RUNS
        elif isinstance(counts, str):
            try:
                runs = rle_counts(counts)
            except ValueError as e:
                raise _Failed(_RLE_COUNTS, str(e), rle) from None
            if any(v < 0 for v in runs):
                raise _Failed(_RLE_COUNTS, "malformed RLE: a negative run length", rle)
            kind = _RLE_STRING
        else:
            raise _Failed(_RLE_COUNTS, f"malformed RLE: counts is a {type(counts).__name__}", rle)
        # (checked after the size is found to be the image's, which makes its area the image's)
        if sum(runs) != size[0] * size[1]:
            raise _Failed(_RLE_COVER, f"malformed RLE: runs cover {sum(runs)} pixels, the image has "
                                      f"{size[0] * size[1]}", rle)
        try:
            data = array("q", counts).tobytes() if kind == _RLE_RUNS else counts.encode("ascii")
        except OverflowError:
            raise _Failed(_RLE_COUNTS, "malformed RLE: a run length does not fit 64 bits", rle) from None
        return kind, rh, rw, data, aside
    raise _Failed(_SEGMENTATION, f"segmentation is a {type(seg).__name__}, neither polygons nor an RLE")


def _instance_record(j: int, a: dict, aside: dict[int, Any], failed: dict[int, tuple[int, str]]) -> tuple[bytes, bytes]:
    """The record of instance annotation ``a`` (``file_index`` ``j``) and its mask bytes, with
    every check that needs neither the image nor the categories done; a failed one is kept in
    ``failed[j]`` (its stage and reason), values that do not fit a record in ``aside[j]``.
    (Values from ``json`` are exactly ``int``, ``float``, ...: ``type(v) is int`` is "an
    integer, not a bool".)"""
    cid = a.get("category_id")
    flags, box, area, crowd = 0, (0.0, 0.0, 0.0, 0.0), 0.0, 0
    kind, rh, rw, seg, points = _NONE, 0, 0, b"", b""
    try:
        if type(cid) is not int or not _I64[0] <= cid < _I64[1]:  # no category has it (their ids are int64)
            raise _Failed(_CATEGORY, f"unknown category id {cid!r}")
        raw = a.get("bbox")
        types = set(map(type, raw)) if type(raw) is list else None
        if types is None or len(raw) != 4 or not types <= _NUMBER:
            raise _Failed(_BBOX, f"bbox {raw!r} is not [x, y, width, height]")
        try:
            box = x, y, w, h = tuple(map(float, raw))
        except OverflowError:
            raise _Failed(_FINITE, f"bbox {raw!r} is not finite") from None
        if not (isfinite(x) and isfinite(y) and isfinite(w) and isfinite(h)):
            raise _Failed(_FINITE, f"bbox {raw!r} is not finite")
        if w < 0 or h < 0:
            raise _Failed(_NEGATIVE, f"bbox {raw!r} has a negative size")
        if int in types:  # the reason shows the bbox as written
            for k, v in enumerate(raw):
                if type(v) is int:
                    flags |= 1 << k
                    if float(v) != v:
                        aside[j] = {"bbox": repr(raw)}
                        flags |= _ASIDE
        given = a.get("iscrowd", 0)
        if given not in (0, 1) or type(given) is bool:
            raise _Failed(_CROWD, f"iscrowd {given!r} is not 0 or 1")
        crowd = int(given)
        given = a.get("area", w * h)
        if type(given) not in _NUMBER or given < 0:
            raise _Failed(_AREA, f"area {given!r} is not a non-negative number")
        try:
            area = float(given)
        except OverflowError:
            raise _Failed(_AREA, f"area {given!r} is not a non-negative number") from None
        kind, rh, rw, seg, size = _segmentation(a.get("segmentation"))
        if size is not None:
            aside.setdefault(j, {})["size"] = size
            flags |= _ASIDE
    except _Failed as e:
        failed[j] = (e.stage, e.reason)
        flags |= _FAILED
        kind, seg = _NONE, b""
        if e.rle is not None:  # its size is still checked against the image first
            kind, (rh, rw, size) = _RLE_RUNS, e.rle
            if size is not None:
                aside.setdefault(j, {})["size"] = size
                flags |= _ASIDE
    else:  # (apart: in a file without keypoint categories a failure here is no failure, the mask stays)
        try:
            given, points = _keypoint_values(a)
            flags |= given
        except _Failed as e:
            failed[j] = (e.stage, e.reason)
            flags |= _FAILED
    return _ANN.pack(j, a["id"], cid if type(cid) is int and _I64[0] <= cid < _I64[1] else 0, -1, *box, area,
                     crowd, flags, kind, rh, rw, len(seg), len(points) // 8), seg + points


def _keypoint_values(a: dict) -> tuple[int, bytes]:
    """``(flags, values)`` of annotation ``a``'s keypoints: ``_KP_GIVEN`` when it has a
    ``keypoints`` list (``[]`` too) and its numbers as float64, with the checks that need neither
    the image nor the categories (``_Failed`` for the first that fails): a list of finite
    ``x, y, v`` numbers, v in {0, 1, 2}, ``num_keypoints`` (when given) the count of v > 0."""
    kp, flags, labelled, data = a.get("keypoints"), 0, 0, b""
    if kp is not None:
        types = set(map(type, kp)) if type(kp) is list else None
        if types is None or not types <= _NUMBER:
            raise _Failed(_KEYPOINTS, "keypoints is not a list of numbers [x1, y1, v1, ...]")
        if len(kp) % 3:
            raise _Failed(_KEYPOINTS, f"keypoints has {len(kp)} numbers, not 3 (x, y, v) per point")
        try:
            values = array("d", kp)
        except OverflowError:  # an integer past float64's range
            values = None
        if values is None or float in types and not all(map(isfinite, values)):
            raise _Failed(_KEYPOINTS, "keypoints are not finite numbers")
        visibility = kp[2::3]
        if not set(visibility) <= _VISIBILITIES:
            i, v = next((i, v) for i, v in enumerate(visibility) if v not in _VISIBILITIES)
            raise _Failed(_VISIBILITY, f"keypoint {i} has visibility {v!r}, not 0, 1 or 2")
        labelled = len(visibility) - visibility.count(0)
        flags, data = _KP_GIVEN, values.tobytes()
    given = a.get("num_keypoints")
    if given is not None and (type(given) is not int or given != labelled):
        raise _Failed(_NUM_KEYPOINTS, f"num_keypoints {given!r} is not the number of labelled (v > 0) "
                                      f"keypoints, {labelled}")
    return flags, data


def _caption_record(j: int, a: dict, failed: dict[int, tuple[int, str]]) -> tuple[bytes, bytes]:
    text = a.get("caption")
    if not isinstance(text, str):
        failed[j] = (0, "caption is not a string")
        return _CAP.pack(j, a["id"], 0), b""
    data = text.encode("utf-8", "surrogatepass")
    return _CAP.pack(j, a["id"], len(data)), data


def _box_text(rec: tuple, aside: dict[str, Any] | None) -> str:
    """The bbox as the file wrote it (for a reason)."""
    if aside and "bbox" in aside:
        return aside["bbox"]
    flags = rec[_F_FLAGS]
    return "[" + ", ".join(repr(int(rec[_F_BOX + k])) if flags & (1 << k) else repr(rec[_F_BOX + k])
                           for k in range(4)) + "]"


def _first_failure(rec: tuple, failed: tuple[int, str] | None, aside: dict[str, Any] | None,
                   label_of: dict[int, int], height: int, width: int, points: "_Points | None" = None,
                   pos: int = 0) -> str | None:
    """The reason of the first check annotation ``rec`` (an unpacked record, at ``pos`` of the
    store) fails, in the checks' order, or None: the one found while it was read (``failed``)
    unless a check made now, of an earlier stage, fails. ``points``: the file's keypoint checks
    (None: its categories name no keypoints, and they do not apply)."""
    stage = failed[0] if failed is not None else _PASSED
    if stage >= _KEYPOINTS and points is None:
        failed, stage = None, _PASSED
    if rec[_F_CATEGORY] not in label_of and stage > _CATEGORY:
        return f"unknown category id {rec[_F_CATEGORY]!r}"
    if stage > _OUTSIDE:
        x, y, w, h = rec[_F_BOX:_F_BOX + 4]
        if x < -BOX_SLACK or y < -BOX_SLACK or x + w > width + BOX_SLACK or y + h > height + BOX_SLACK:
            return f"bbox {_box_text(rec, aside)} is outside the {width}x{height} image"
    if stage > _RLE_SIZE_IS_IMAGE and rec[_F_KIND] in (_RLE_RUNS, _RLE_STRING):
        size = aside["size"] if aside and "size" in aside else [rec[_F_RLE], rec[_F_RLE + 1]]
        if size != [height, width]:
            return f"malformed RLE: size {size} is not the image's [{height}, {width}]"
    if failed is not None:
        return failed[1]
    return points.why(rec, pos, height, width) if points is not None else None


class _Points:
    """The keypoint checks that need the categories or the image, in a file whose categories
    name ``k`` keypoints (``names``: by category id, those that name them): an annotation of such
    a category that gives keypoints gives ``3 k`` numbers, one of another category none, and a
    labelled point (v > 0) is inside the image (``BOX_SLACK``)."""

    def __init__(self, k: int, names: dict[int, list[str]], store: bytearray):
        self.k, self.names, self.store = k, names, store

    def why(self, rec: tuple, pos: int, height: int, width: int) -> str | None:
        """The reason annotation ``rec`` (at ``pos``) fails these checks, or None."""
        n, names = rec[_F_KP_LEN], self.names.get(rec[_F_CATEGORY])
        if names is None:
            return f"keypoints given, but category {rec[_F_CATEGORY]} names no keypoints" if n else None
        if not rec[_F_FLAGS] & _KP_GIVEN:
            return None  # none given: k points of zeros (not labelled)
        if n != 3 * self.k:
            return f"keypoints has {n} numbers, not 3 x {self.k} (its category's {self.k} keypoints)"
        values = struct.unpack_from(f"<{n}d", self.store, pos + _ANN.size + rec[_F_SEG_LEN])
        xs, ys, lo, right, bottom = values[0::3], values[1::3], -BOX_SLACK, width + BOX_SLACK, height + BOX_SLACK
        if min(xs) >= lo and min(ys) >= lo and max(xs) <= right and max(ys) <= bottom:
            return None  # (the common case: every point inside, those not labelled too)
        for i, (x, y, v) in enumerate(zip(xs, ys, values[2::3])):
            if v and (x < lo or y < lo or x > right or y > bottom):
                return f"keypoint {i} ({names[i]}) at ({x!r}, {y!r}) is outside the {width}x{height} image"
        return None


class _Reader:
    """The state of one annotation file as it is read (see the module doc)."""

    def __init__(self, path: str, failures: list[InputFailure] | None):
        self.path, self.failures = path, failures
        self.kind: str | None = None  # from the first annotation
        self.images: list[tuple[int, str, int, int]] = []  # (id, key, height, width), file order
        self.image_failures: list[tuple[str, str]] = []  # (reason, key), file order
        self.seen_ids: set[int] = set()
        self.store = bytearray()  # every annotation's record and payload, in file order
        self.groups: dict[Any, array] = {}  # image id -> where its annotations' records are, file order
        self.failed: dict[int, tuple[int, str]] = {}  # file index -> (stage, reason) found while read
        self.aside: dict[int, Any] = {}  # file index -> values that do not fit a record
        self.malformed: list[tuple[int, str]] = []  # (file index, reason): annotations of no image id
        self.categories: Any = None
        self.have_images = False
        self.with_keypoints = 0  # annotations that have a "keypoints" member
        self.points: _Points | None = None  # the keypoint checks, once the categories are known

    def read(self) -> None:
        path = self.path
        try:
            # text mode and a bounded buffer: one image or annotation decoded at a time
            with open(path, encoding="utf-8") as f:
                for key, value in object_members(f, stream=("images", "annotations")):
                    if key == "images":
                        self.have_images = isinstance(value, Elements)
                        if self.have_images:
                            for j, im in enumerate(value):
                                self._image(j, im)
                    elif key == "annotations" and isinstance(value, Elements):
                        for j, a in enumerate(value):
                            self._annotation(j, a)
                    elif key == "annotations" and value:  # null or [] mean none
                        raise UsageError(f"{path}: 'annotations' is a {type(value).__name__}, not a list")
                    elif key == "categories":
                        self.categories = value
        except OSError as e:
            raise UsageError(f"{path}: cannot read the annotation file ({e.strerror or e})") from e
        except ValueError as e:  # UnicodeDecodeError too
            if "(the file is not a JSON object)" in str(e):
                raise UsageError(f"{path}: not a COCO annotation file (no 'images' list)") from e
            raise UsageError(f"{path}: not a JSON annotation file ({e})") from e
        if not self.have_images:
            raise UsageError(f"{path}: not a COCO annotation file (no 'images' list)")

    def _image(self, j: int, im: Any) -> None:
        if not isinstance(im, dict) or not _int_id(im.get("id")) or not isinstance(im.get("file_name"), str) \
                or not _int_id(im.get("height")) or not _int_id(im.get("width")):
            self.image_failures.append((f"images[{j}]: needs an integer id, file_name, height and width",
                                        str(im.get("file_name", "")) if isinstance(im, dict) else ""))
            return
        if im["id"] in self.seen_ids:
            self.image_failures.append((f"image id {im['id']} is repeated", im["file_name"]))
            return
        try:
            key = safe_key(im["file_name"], self.path)
        except UsageError as e:
            self.image_failures.append((f"image id {im['id']}: {e}", im["file_name"]))
            return
        self.seen_ids.add(im["id"])
        self.images.append((im["id"], key, im["height"], im["width"]))

    def _annotation(self, j: int, a: Any) -> None:
        if self.kind is None:
            self.kind = "captions" if isinstance(a, dict) and "caption" in a and "bbox" not in a else "instances"
        aid = a.get("id") if type(a) is dict else None
        if type(aid) is not int or not _I64[0] <= aid < _I64[1] or type(a.get("image_id")) is not int:
            self.malformed.append((j, f"annotations[{j}]: needs an integer id and image_id"))
            return
        head, payload = _caption_record(j, a, self.failed) if self.kind == "captions" else \
            _instance_record(j, a, self.aside, self.failed)
        self.with_keypoints += "keypoints" in a
        store = self.store
        group = self.groups.get(a["image_id"])
        if group is None:
            group = self.groups[a["image_id"]] = array("q")
        group.append(len(store))
        store += head
        store += payload


def _category(c: dict, path: str, kind: str) -> dict[str, Any]:
    """A category as the manifest keeps it: ``{id, name}``, and in an instances file whose
    category names keypoints (COCO person keypoints) its ``keypoints`` names and ``skeleton``
    (pairs of 1-based keypoint numbers, as COCO writes them); UsageError when they are malformed."""
    out = {"id": c["id"], "name": str(c.get("name", c["id"]))}
    names = c.get("keypoints")
    if kind != "instances" or names is None or names == []:
        return out
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise UsageError(f"{path}: category {c['id']}: 'keypoints' is not a list of keypoint names")
    skeleton = c.get("skeleton")
    skeleton = [] if skeleton is None else skeleton
    if not isinstance(skeleton, list) or not all(
            isinstance(e, list) and len(e) == 2 and all(_int_id(k) and 1 <= k <= len(names) for k in e)
            for e in skeleton):
        raise UsageError(f"{path}: category {c['id']}: 'skeleton' is not a list of [a, b] pairs of keypoint "
                         f"numbers 1..{len(names)}")
    out.update(keypoints=list(names), skeleton=[list(e) for e in skeleton])
    return out


def _keypoint_checks(categories: list[dict[str, Any]], path: str, store: bytearray) -> _Points | None:
    """The keypoint checks of a file whose categories name keypoints (None: none does);
    UsageError when they name different numbers (a pack stores K points per object)."""
    named = [c for c in categories if "keypoints" in c]
    if not named:
        return None
    if len({len(c["keypoints"]) for c in named}) > 1:
        shown = ", ".join(f"id {c['id']} {c['name']!r} ({len(c['keypoints'])})" for c in named)
        raise UsageError(f"{path}: categories name different numbers of keypoints ({shown}); a pack stores the "
                         "same number of keypoints for every object")
    return _Points(len(named[0]["keypoints"]), {c["id"]: c["keypoints"] for c in named}, store)


def coco_items(annotations: str | os.PathLike, root: str | os.PathLike, *, drop_empty: bool = False,
               failures: list[InputFailure] | None = None,
               labelled: list[dict[str, Any]] | None = None) -> CocoSource:
    """The images of a COCO annotation file as items (see the module doc). Each item's ``label``
    is its identity (``AnnotationRecords.identity``: its id, size and annotations), which the
    resume and ``--append`` compare with the image file's size and mtime.

    Args:
        annotations: an ``instances_*.json`` or ``captions_*.json``.
        root: the folder the images' ``file_name`` paths are relative to.
        drop_empty: leave out images without annotations (kept by default: zero boxes).
        failures: where unusable images and annotations are recorded (None: raise UsageError).
        labelled: an existing pack's categories by label (``--append``): they keep their labels,
            the file's other categories get the next ones in ascending id (``grow_categories``).
    """
    ann_path = str(annotations)
    r = _Reader(ann_path, failures)
    r.read()
    kind = r.kind or "instances"
    cats = r.categories or []
    if kind == "instances" and not (isinstance(cats, list) and all(isinstance(c, dict) and _int64(c.get("id"))
                                                                   for c in cats)):
        raise UsageError(f"{ann_path}: malformed 'categories' (each needs an integer id)")
    if not isinstance(cats, list):
        cats = []
    categories = sorted((_category(c, ann_path, kind) for c in cats if isinstance(c, dict) and _int_id(c.get("id"))),
                        key=lambda c: c["id"])
    if labelled is not None and kind == "instances":
        categories = grow_categories(labelled, categories, ann_path)
    label_of = {c["id"]: i for i, c in enumerate(categories)}
    if len(label_of) != len(categories):
        raise UsageError(f"{ann_path}: repeated category ids")
    r.points = _keypoint_checks(categories, ann_path, r.store)
    if r.points is None and r.with_keypoints:
        log.warning("%s: %d annotations have keypoints, but no category names them (a category's 'keypoints'): "
                    "they are not packed", ann_path, r.with_keypoints)

    for reason, key in r.image_failures:
        bad_line(failures, ann_path, 0, reason, key=key)
    known = {iid: (key, h, w) for iid, key, h, w in r.images}
    record = _ANN if kind == "instances" else _CAP
    # annotations of no image: malformed ones and those of an unknown image id, in file order
    orphans = list(r.malformed)
    for iid in [iid for iid in r.groups if iid not in known]:
        for offset in r.groups.pop(iid):
            j, aid = record.unpack_from(r.store, offset)[:2]
            r.failed.pop(j, None)
            r.aside.pop(j, None)
            orphans.append((j, f"annotation {aid}: unknown image id {iid}"))
    for j, reason in sorted(orphans):
        key = "" if reason.startswith("annotations[") else reason.split(":", 1)[0]
        bad_line(failures, ann_path, 0, reason, key=key)

    check = _check_instances if kind == "instances" else _check_captions
    root = Path(root)
    items: list[FieldItem] = []
    for iid, key, height, width in r.images:
        offsets = r.groups.pop(iid, None)
        if offsets is None:
            if drop_empty:
                continue
            offsets = array("q")
        else:
            reasons = check(r, offsets, label_of, height, width)
            if reasons:
                more = f" (and {len(reasons) - 1} more)" if len(reasons) > 1 else ""
                bad_line(failures, ann_path, 0, f"image id {iid}: {reasons[0]}{more}", key=key)
                continue
        records = AnnotationRecords(r.store, offsets, kind)
        items.append(FieldItem(key, str(root / key), records.identity(iid, height, width),
                               {"image_id": iid, "orig_size": (height, width), "annotations": records}))
    schema = captions_schema() if kind == "captions" else \
        instances_schema() if r.points is None else keypoints_schema(r.points.k)
    return CocoSource(items, schema, categories if kind == "instances" else [], kind)


def grow_categories(old: list[dict[str, Any]], new: list[dict[str, Any]], path: str) -> list[dict[str, Any]]:
    """The categories of a pack grown by an annotation file's (``--append``): ``old`` (the
    pack's, by label) keep their labels, the ones of ``new`` the pack lacks follow in ascending
    id; a category of both must be the same (name, keypoint names, skeleton), else UsageError
    naming each difference. A category the file no longer has stays (its label is taken)."""
    given = {c["id"]: c for c in new}
    diff = [f"category id {c['id']}: {json.dumps(c, ensure_ascii=False)} in the pack, "
            f"{json.dumps(given[c['id']], ensure_ascii=False)} in {path}"
            for c in old if c["id"] in given and given[c["id"]] != c]
    if diff:
        raise UsageError("cannot append, categories of the pack differ in the annotation file (a category "
                         "id keeps its name and keypoints):\n  " + "\n  ".join(diff))
    known = {c["id"] for c in old}
    return [dict(c) for c in old] + [c for c in new if c["id"] not in known]


def _check_instances(r: _Reader, offsets: array, label_of: dict[int, int], height: int,
                     width: int) -> list[str]:
    """The reasons an image's annotations fail (file order); none: each one's label filled in."""
    reasons = []
    store, unpack, failed, aside, points = r.store, _ANN.unpack_from, r.failed, r.aside, r.points
    for pos in offsets:
        rec = unpack(store, pos)
        if rec[_F_FLAGS] & (_FAILED | _ASIDE) or rec[_F_CATEGORY] not in label_of:
            j = rec[0]
            why = _first_failure(rec, failed.pop(j, None), aside.pop(j, None), label_of, height, width, points, pos)
        else:  # (the common case inline: only the checks made now)
            x, y, w, h = rec[_F_BOX:_F_BOX + 4]
            why = None
            if x < -BOX_SLACK or y < -BOX_SLACK or x + w > width + BOX_SLACK or y + h > height + BOX_SLACK or \
                    (rec[_F_KIND] >= _RLE_RUNS and (rec[_F_RLE] != height or rec[_F_RLE + 1] != width)):
                why = _first_failure(rec, None, None, label_of, height, width, points, pos)
            elif points is not None:
                why = points.why(rec, pos, height, width)
        if why is not None:
            reasons.append(f"annotation {rec[1]}: {why}")
        elif not reasons:
            struct.pack_into("<q", store, pos + _LABEL_AT, label_of[rec[_F_CATEGORY]])
    return reasons


def _check_captions(r: _Reader, offsets: array, label_of: dict[int, int], height: int, width: int) -> list[str]:
    reasons = []
    for pos in offsets:
        j, aid, _n = _CAP.unpack_from(r.store, pos)
        failed = r.failed.pop(j, None)
        if failed is not None:
            reasons.append(f"annotation {aid}: {failed[1]}")
    return reasons


class Annotations:
    """One image's annotations as an item holds them: ``records`` (``ANNOTATION`` or
    ``CAPTION``) and where each one's payload (a mask's bytes, a caption's UTF-8) is in
    ``blob``."""

    def __init__(self, data: "AnnotationRecords"):
        kind = data.kind
        dtype, length = (ANNOTATION, "seg_len") if kind == "instances" else (CAPTION, "text_len")
        blob, size = data.store, dtype.itemsize
        self.blob = blob
        self.records = np.frombuffer(b"".join([blob[o:o + size] for o in data.offsets]), dtype)
        self.spans = [(o + size, o + size + n) for o, n in zip(data.offsets, self.records[length].tolist())]
        self.kinds = self.records["kind"].tolist() if kind == "instances" else []

    def __len__(self) -> int:
        return len(self.spans)

    def segmentation(self, i: int) -> tuple[str, Any]:
        """``("poly", [float64 arrays])``, ``("rle", int64 runs or the compressed string)`` or
        ``("none", None)`` of annotation ``i``."""
        kind, (start, end) = self.kinds[i], self.spans[i]
        blob = self.blob
        if kind == _POLY:
            n = struct.unpack_from("<I", blob, start)[0]
            if n == 1:
                return "poly", [np.frombuffer(blob, "<f8", (end - start - 8) // 8, start + 8)]
            at, polys = start + 4 * (n + 1), []
            for length in struct.unpack_from(f"<{n}I", blob, start + 4):
                polys.append(np.frombuffer(blob, "<f8", length, at))
                at += 8 * length
            return "poly", polys
        if kind == _RLE_RUNS:
            return "rle", np.frombuffer(blob, "<i8", (end - start) // 8, start)
        if kind == _RLE_STRING:
            return "rle", bytes(blob[start:end]).decode("ascii")
        return "none", None

    def keypoints(self, k: int) -> np.ndarray:
        """``(N, k, 3)`` float64: each annotation's keypoints (x, y, v), zeros where it gave none."""
        out = np.zeros((len(self), k, 3))
        for i in np.flatnonzero(self.records["kp_len"]).tolist():
            out[i] = np.frombuffer(self.blob, "<f8", 3 * k, self.spans[i][1]).reshape(k, 3)
        return out

    def captions(self) -> list[str]:
        """The captions' texts."""
        return [bytes(self.blob[a:b]).decode("utf-8", "surrogatepass") for a, b in self.spans]


def decode_annotations(data: "AnnotationRecords") -> Annotations:
    """An item's ``annotations`` (see the module doc) as records and payloads."""
    return Annotations(data)


def _keypoints(ann: Annotations, k: int, sx: float, sy: float) -> dict[str, np.ndarray]:
    """A keypoints pack's ``keypoints`` (``(N, k, 3)`` float32 x, y, v: x and y scaled by ``sx``,
    ``sy`` as ``sample_fields`` scales the boxes, in float64 then stored as float32, so a point
    (0, 0, 0) stays one; v as given) and ``num_keypoints`` (each object's labelled points, v > 0)."""
    points = ann.keypoints(k)
    if (sx, sy) != (1.0, 1.0):
        points[..., :2] *= (sx, sy)
    return {"keypoints": points.astype(np.float32),
            "num_keypoints": np.count_nonzero(points[..., 2], axis=1).astype(np.int64)}


class AnnotationRecords:
    """An item's annotations: the records (``kind`` ``instances``: ``ANNOTATION``, ``captions``:
    ``CAPTION``) at ``offsets`` of ``store``, each followed by its payload. ``store`` is the
    buffer the annotation file was read into, which holds every image's: forked workers share
    its pages (reading them writes nothing, where an object per image would have its page
    copied by the first reference count taken on it). Pickled (to a spawned or remote worker),
    an item carries its own records and payloads."""

    __slots__ = ("store", "offsets", "kind")

    def __init__(self, store: bytes | bytearray, offsets: array, kind: str = "instances"):
        self.store, self.offsets, self.kind = store, offsets, kind

    def __len__(self) -> int:
        return len(self.offsets)

    def _spans(self) -> list[tuple[int, int]]:
        """Where each record with its payload is in ``store``: ``(offset, length)``, in order."""
        instances = self.kind == "instances"
        dtype, length = (ANNOTATION, "seg_len") if instances else (CAPTION, "text_len")
        size, at = dtype.itemsize, dtype.fields[length][1]
        store, unpack, spans = self.store, struct.unpack_from, []
        for o in self.offsets:
            if instances:  # then the keypoints' float64 values
                seg, kp = unpack("<II", store, o + at)
                spans.append((o, size + seg + 8 * kp))
            else:
                spans.append((o, size + unpack("<I", store, o + at)[0]))
        return spans

    def __reduce__(self) -> tuple:
        store, parts, offsets, pos = self.store, [], array("q"), 0
        for o, n in self._spans():
            parts.append(bytes(store[o:o + n]))
            offsets.append(pos)
            pos += n
        return AnnotationRecords, (b"".join(parts), offsets, self.kind)

    def identity(self, image_id: int, height: int, width: int) -> int:
        """A 63-bit digest of what decides the image's stored fields besides its image file: its
        id, size and kind and every annotation record and payload as checked and labelled, but
        not where the annotation stood in the file (``file_index``: a grown export moves it)."""
        h = hashlib.blake2b(struct.pack("<qqq", image_id, height, width) + self.kind.encode(), digest_size=8)
        view = memoryview(self.store)
        for o, n in self._spans():
            h.update(view[o + 8:o + n])  # (file_index is every record's first field)
        return int.from_bytes(h.digest(), "little") >> 1


def sample_fields(values: dict[str, Any], *, height: int, width: int, schema: Schema) -> dict[str, Any]:
    """The stored fields of one COCO image (without ``image``) for an image stored at
    ``height`` x ``width``: boxes as xyxy float32 and the masks as a ``Segmentation``, both
    scaled by the stored size over ``orig_size`` (polygon coordinates multiplied, RLE masks
    resized nearest-neighbour), the area scaled by both factors."""
    oh, ow = (int(v) for v in values["orig_size"])
    captions = "captions" in schema.by_name
    ann = decode_annotations(values["annotations"])
    rec = ann.records
    # (the records' int64 and uint8 columns are the fields' dtypes: views, copied once by the encode)
    out: dict[str, Any] = {"image_id": values["image_id"], "annotation_ids": rec["id"],
                           "orig_size": np.array((oh, ow), dtype=np.int64)}
    if captions:
        out["captions"] = ann.captions()
        return out
    sx, sy = width / ow, height / oh
    boxes, area = _scaled_boxes(rec, sx, sy)
    if "keypoints" in schema.by_name:  # a keypoints pack: scaled as the boxes are
        out.update(_keypoints(ann, schema.by_name["keypoints"].shape[1], sx, sy))
    out.update(boxes=boxes, labels=rec["label"], category_ids=rec["category_id"], iscrowd=rec["iscrowd"],
               area=area, masks=Segmentation.from_encoded(_mask_bytes(ann.blob, ann.kinds, ann.spans, oh, ow, height,
                                                                              width)))
    return out


def instances_blob(values: dict[str, Any], image: bytes, *, height: int, width: int) -> bytes | None:
    """The field blob of an instances pack's sample (``instances_schema``, no keypoints) whose
    image's encoded bytes are ``image``, stored at ``height`` x ``width``: the very bytes
    ``instances_schema().encode({"image": image, **sample_fields(values, ...)})`` gives, built
    straight from the records with ``struct`` (no per-field checks: every value is one the
    listing checked). The same IEEE float64 arithmetic as ``sample_fields`` in Python floats,
    then the same cast to float32 (``struct``'s ``f``); ``struct`` rather than numpy because
    right after an image's decode has evicted the CPU caches, each numpy call costs several
    microseconds. None when a value is not one this path takes (an id or size past int64, no
    image bytes, a float past float32's range): ``sample_fields`` and ``Schema.encode`` then do it."""
    iid, (oh, ow) = values["image_id"], values["orig_size"]
    if not (image and _int64(iid) and _int64(oh) and _int64(ow)):
        return None
    records = values["annotations"]
    store, offsets, unpack, size = records.store, records.offsets, _ANN.unpack_from, _ANN.size
    rows = [unpack(store, o) for o in offsets]
    sx, sy = width / ow, height / oh
    sxy = sx * sy
    scaled = (sx, sy) != (1.0, 1.0)
    boxes, areas = [], []
    for r in rows:
        x, y, w, h, area = r[_F_BOX:_F_BOX + 5]
        if scaled:  # (numpy's order in sample_fields: x + w first, then times the scale)
            boxes += (x * sx, y * sy, (x + w) * sx, (y + h) * sy)
            areas.append(area * sxy)
        else:
            boxes += (x, y, x + w, y + h)
            areas.append(area)
    n = len(rows)
    # image_id, boxes, labels, category_ids, iscrowd, area, annotation_ids: one pack, in the schema's order
    try:
        numbers = struct.pack(f"<q{4 * n}f{n}q{n}q{n}B{n}f{n}q", iid, *boxes, *[r[3] for r in rows],
                              *[r[_F_CATEGORY] for r in rows], *[r[9] for r in rows], *areas, *[r[1] for r in rows])
    except OverflowError:  # a float past float32's range (numpy makes it inf)
        return None
    masks = _mask_bytes(store, [r[_F_KIND] for r in rows], [(o + size, o + size + r[_F_SEG_LEN])
                                                             for o, r in zip(offsets, rows)], oh, ow, height, width)
    # the blob's head (encode_blob's) with the sizes of instances_schema's fields
    # (tests/conversion/test_coco.py holds the bytes to Schema.encode's)
    head = _INSTANCES_HEAD.pack(10, len(image), 8, 16 * n, 8 * n, 8 * n, n, 4 * n, 8 * n, len(masks), 16)
    return b"".join((head, image, numbers, masks, _I64_2.pack(oh, ow)))


def _scaled_boxes(rec: np.ndarray, sx: float, sy: float) -> tuple[np.ndarray, np.ndarray]:
    """The records' boxes as xyxy and their areas, scaled by ``sx``, ``sy``, as float32."""
    xyxy = rec["bbox"].copy()
    xyxy[:, 2:] += xyxy[:, :2]
    area = rec["area"]
    if (sx, sy) != (1.0, 1.0):  # (times 1.0 is the same number)
        xyxy *= (sx, sy, sx, sy)
        area = area * (sx * sy)
    return xyxy.astype(np.float32), area.astype(np.float32)


def _mask_bytes(blob: Any, kinds: list[int], spans: list[tuple[int, int]], oh: int, ow: int, height: int,
                width: int) -> bytes:
    """The ``segmentation`` field's canonical bytes (``Segmentation.encode``'s) of the objects'
    masks at ``height`` x ``width`` as the file gave them: polygons (their coordinates scaled),
    compressed RLE strings (an uncompressed one compressed, a scaled one
    resized nearest-neighbour) or None. Nothing is drawn: ``Segmentation.rle`` draws them.
    A polygon payload of the records is already the field's layout (``u32 parts, u32
    lengths, float64 coordinates``): it is copied as it is (its coordinates scaled in place of
    the originals), so the canonical bytes are made without an array per polygon."""
    scaled = (height, width) != (oh, ow)
    sx, sy = width / ow, height / oh
    unpack = struct.unpack_from
    parts: list[Any] = [SEGMENTATION_HEAD.pack(height, width, len(kinds))]
    for kind, (start, end) in zip(kinds, spans):
        if kind == _POLY:
            if scaled:
                at = start + 4 * (unpack("<I", blob, start)[0] + 1)
                coords = np.frombuffer(blob, "<f8", (end - at) // 8, at).reshape(-1, 2) * (sx, sy)
                parts += (b"\x01", blob[start:at], coords.tobytes())
            else:
                parts += (b"\x01", blob[start:end])
        elif kind == _RLE_STRING and not scaled:
            parts += (_RLE_HEAD.pack(2, end - start), blob[start:end])
        elif kind in (_RLE_STRING, _RLE_RUNS):
            mask = pycocotools_mask()
            rle = {"size": [oh, ow], "counts": bytes(blob[start:end])} if kind == _RLE_STRING else \
                mask.frPyObjects({"size": [oh, ow], "counts": np.frombuffer(blob, "<i8", (end - start) // 8, start)
                                  .tolist()}, oh, ow)
            if scaled:
                import cv2

                m = cv2.resize(mask.decode(rle), (width, height), interpolation=cv2.INTER_NEAREST)
                rle = mask.encode(np.asfortranarray(m))
            parts += (_RLE_HEAD.pack(2, len(rle["counts"])), rle["counts"])
        else:
            parts.append(b"\0")
    return b"".join(parts)

"""REFERENCE ONLY (tests): ``packer.conversion.coco``'s reading as it was before it read files
streaming, kept verbatim (``json.load`` of the whole file, the annotations grouped from the
parsed lists, ``sample_fields`` over those groups) so that ``tests/conversion/test_coco.py`` can
check the streaming reader gives exactly what it gave: the same items, stored fields and
failures. The parts that did not change (schemas, ``rle_counts``, ``CocoSource``) are the
module's own.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from packer.codecs.fields import Schema, pycocotools_mask
from packer.conversion.coco import BOX_SLACK, CocoSource, captions_schema, instances_schema, rle_counts
from packer.conversion.input_failures import InputFailure, bad_line
from packer.conversion.inputs import FieldItem, safe_key
from packer.errors import UsageError

__all__ = ["coco_items", "sample_fields"]


def _int_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_segmentation(seg: Any, height: int, width: int, iscrowd: int) -> tuple[str, Any]:
    """``("poly", [float arrays])``, ``("rle", {size, counts})`` or ``("none", None)``;
    ValueError saying what is wrong."""
    if seg is None or seg == []:
        return "none", None
    if isinstance(seg, list):
        polys = []
        for poly in seg:
            if not isinstance(poly, list) or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                     for v in poly):
                raise ValueError("a polygon is a list of numbers")
            if len(poly) % 2:
                raise ValueError(f"a polygon has an odd number ({len(poly)}) of coordinates")
            if len(poly) < 6:
                raise ValueError(f"a polygon has {len(poly) // 2} points, fewer than 3")
            polys.append(poly)  # the parsed list itself: no copy while the parsed file is alive
        return "poly", polys
    if isinstance(seg, dict):
        size, counts = seg.get("size"), seg.get("counts")
        if not (isinstance(size, list) and len(size) == 2 and all(_int_id(v) for v in size)):
            raise ValueError(f"malformed RLE: size {size!r} is not [height, width]")
        if size != [height, width]:
            raise ValueError(f"malformed RLE: size {size} is not the image's [{height}, {width}]")
        if isinstance(counts, list):
            if not all(_int_id(v) and v >= 0 for v in counts):
                raise ValueError("malformed RLE: counts are not non-negative integers")
            runs = counts
        elif isinstance(counts, str):
            runs = rle_counts(counts)
            if any(v < 0 for v in runs):
                raise ValueError("malformed RLE: a negative run length")
        else:
            raise ValueError(f"malformed RLE: counts is a {type(counts).__name__}")
        if sum(runs) != height * width:
            raise ValueError(f"malformed RLE: runs cover {sum(runs)} pixels, the image has {height * width}")
        return "rle", {"size": size, "counts": counts}
    raise ValueError(f"segmentation is a {type(seg).__name__}, neither polygons nor an RLE")


def coco_items(annotations: str | os.PathLike, root: str | os.PathLike, *, drop_empty: bool = False,
               failures: list[InputFailure] | None = None) -> CocoSource:
    """``packer.conversion.coco.coco_items`` as it was: ``json.load``, then grouping."""
    ann_path = str(annotations)
    try:
        # text mode: the file's str alone, not its bytes and their decoded copy at once
        with open(ann_path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as e:
        raise UsageError(f"{ann_path}: cannot read the annotation file ({e.strerror or e})") from e
    except ValueError as e:  # UnicodeDecodeError too
        raise UsageError(f"{ann_path}: not a JSON annotation file ({e})") from e
    if not isinstance(data, dict) or not isinstance(data.get("images"), list):
        raise UsageError(f"{ann_path}: not a COCO annotation file (no 'images' list)")
    images, anns = data["images"], data.get("annotations") or []
    cats = data.get("categories") or []
    del data  # the parsed file goes once the images and annotations are grouped below
    kind = "captions" if anns and isinstance(anns[0], dict) and "caption" in anns[0] and "bbox" not in anns[0] \
        else "instances"
    if kind == "instances" and not all(isinstance(c, dict) and _int_id(c.get("id")) for c in cats):
        raise UsageError(f"{ann_path}: malformed 'categories' (each needs an integer id)")
    categories = sorted(({"id": c["id"], "name": str(c.get("name", c["id"]))} for c in cats), key=lambda c: c["id"])
    label_of = {c["id"]: i for i, c in enumerate(categories)}
    if len(label_of) != len(categories):
        raise UsageError(f"{ann_path}: repeated category ids")

    root = Path(root)
    info: dict[int, tuple[str, int, int]] = {}
    order: list[int] = []
    for j, im in enumerate(images):
        if not isinstance(im, dict) or not _int_id(im.get("id")) or not isinstance(im.get("file_name"), str) \
                or not _int_id(im.get("height")) or not _int_id(im.get("width")):
            bad_line(failures, ann_path, 0, f"images[{j}]: needs an integer id, file_name, height and width",
                     key=str(im.get("file_name", "")) if isinstance(im, dict) else "")
            continue
        if im["id"] in info:
            bad_line(failures, ann_path, 0, f"image id {im['id']} is repeated", key=im["file_name"])
            continue
        try:
            key = safe_key(im["file_name"], ann_path)
        except UsageError as e:
            bad_line(failures, ann_path, 0, f"image id {im['id']}: {e}", key=im["file_name"])
            continue
        info[im["id"]] = (key, im["height"], im["width"])
        order.append(im["id"])
    del images

    per_image: dict[int, list] = {}
    bad: dict[int, list[str]] = {}
    # Taken off the end of the parsed list one by one, so each annotation's dicts and polygon
    # lists are freed as its compact form is made: the peak stays the parsed file's (below
    # pycocotools' COCO(file), which indexes the parsed file as it is). Groups are reversed after.
    j = len(anns)
    orphans: list[tuple[str, str]] = []  # (reason, key) of annotations of no image, last first
    while anns:
        a = anns.pop()
        j -= 1
        if not isinstance(a, dict) or not _int_id(a.get("id")) or not _int_id(a.get("image_id")):
            orphans.append((f"annotations[{j}]: needs an integer id and image_id", ""))
            continue
        aid, iid = a["id"], a["image_id"]
        if iid not in info:
            orphans.append((f"annotation {aid}: unknown image id {iid}", f"annotation {aid}"))
            continue
        _, height, width = info[iid]
        try:
            per_image.setdefault(iid, []).append(
                _caption(a) if kind == "captions" else _instance(a, label_of, height, width))
        except ValueError as e:
            bad.setdefault(iid, []).append(f"annotation {aid}: {e}")
    del anns
    for reason, key in reversed(orphans):
        bad_line(failures, ann_path, 0, reason, key=key)

    items: list[FieldItem] = []
    for iid in order:
        key, height, width = info[iid]
        if iid in bad:
            reasons = bad[iid][::-1]  # file order
            more = f" (and {len(reasons) - 1} more)" if len(reasons) > 1 else ""
            bad_line(failures, ann_path, 0, f"image id {iid}: {reasons[0]}{more}", key=key)
            continue
        group = per_image.pop(iid, [])[::-1]  # file order
        if not group and drop_empty:
            continue
        values = _captions_values(group) if kind == "captions" else _instances_values(group)
        values.update(image_id=iid, orig_size=(height, width))
        items.append(FieldItem(key, str(root / key), iid, values))
    schema = captions_schema() if kind == "captions" else instances_schema()
    return CocoSource(items, schema, categories if kind == "instances" else [], kind)


def _caption(a: dict) -> tuple:
    if not isinstance(a.get("caption"), str):
        raise ValueError("caption is not a string")
    return a["id"], a["caption"]


def _instance(a: dict, label_of: dict[int, int], height: int, width: int) -> tuple:
    cid = a.get("category_id")
    if cid not in label_of or not _int_id(cid):
        raise ValueError(f"unknown category id {cid!r}")
    box = a.get("bbox")
    if not (isinstance(box, list) and len(box) == 4 and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                            for v in box)):
        raise ValueError(f"bbox {box!r} is not [x, y, width, height]")
    x, y, w, h = (float(v) for v in box)
    if not all(np.isfinite((x, y, w, h))):
        raise ValueError(f"bbox {box!r} is not finite")
    if w < 0 or h < 0:
        raise ValueError(f"bbox {box!r} has a negative size")
    if x < -BOX_SLACK or y < -BOX_SLACK or x + w > width + BOX_SLACK or y + h > height + BOX_SLACK:
        raise ValueError(f"bbox {box!r} is outside the {width}x{height} image")
    crowd = a.get("iscrowd", 0)
    if crowd not in (0, 1) or isinstance(crowd, bool):
        raise ValueError(f"iscrowd {crowd!r} is not 0 or 1")
    area = a.get("area", w * h)
    if not isinstance(area, (int, float)) or isinstance(area, bool) or area < 0:
        raise ValueError(f"area {area!r} is not a non-negative number")
    seg = _check_segmentation(a.get("segmentation"), height, width, crowd)
    return a["id"], label_of[cid], cid, (x, y, w, h), crowd, float(area), seg


def _captions_values(group: Sequence[tuple]) -> dict[str, Any]:
    return {"annotation_ids": np.array([g[0] for g in group], dtype=np.int64),
            "captions": [g[1] for g in group]}


def _instances_values(group: Sequence[tuple]) -> dict[str, Any]:
    n = len(group)
    return {"annotation_ids": np.array([g[0] for g in group], dtype=np.int64),
            "labels": np.array([g[1] for g in group], dtype=np.int64),
            "category_ids": np.array([g[2] for g in group], dtype=np.int64),
            "xywh": np.array([g[3] for g in group], dtype=np.float64).reshape(n, 4),
            "iscrowd": np.array([g[4] for g in group], dtype=np.uint8),
            "area": np.array([g[5] for g in group], dtype=np.float64),
            "segmentation": [g[6] for g in group]}


def sample_fields(values: dict[str, Any], *, height: int, width: int, schema: Schema) -> dict[str, Any]:
    """The stored fields of one COCO image (without ``image``) for an image stored at
    ``height`` x ``width``: boxes as xyxy float32 and masks as compressed RLE, both scaled by
    the stored size over ``orig_size`` (the polygons scaled then drawn at the stored size, RLE
    masks resized nearest-neighbour), the area scaled by both factors."""
    oh, ow = (int(v) for v in values["orig_size"])
    out = {k: values[k] for k in ("image_id", "annotation_ids", "orig_size")}
    out["orig_size"] = np.asarray(out["orig_size"], dtype=np.int64)
    if "captions" in schema.by_name:
        out["captions"] = values["captions"]
        return out
    sx, sy = width / ow, height / oh
    xywh = values["xywh"]
    xyxy = np.concatenate([xywh[:, :2], xywh[:, :2] + xywh[:, 2:]], axis=1) * (sx, sy, sx, sy)
    out.update(boxes=xyxy.astype(np.float32), labels=values["labels"], category_ids=values["category_ids"],
               iscrowd=values["iscrowd"], area=(values["area"] * (sx * sy)).astype(np.float32),
               masks=_masks(values["segmentation"], oh, ow, height, width))
    return out


def _masks(segs: Sequence[tuple[str, Any]], oh: int, ow: int, height: int, width: int) -> list[dict[str, Any]]:
    """One compressed RLE per object at ``height`` x ``width``."""
    if not segs:
        return []
    mask = pycocotools_mask()
    scaled = (height, width) != (oh, ow)
    sx, sy = width / ow, height / oh
    out = []
    for kind, seg in segs:
        if kind == "poly":
            polys = [(np.asarray(p, dtype=np.float64).reshape(-1, 2) * (sx, sy)).ravel().tolist() if scaled
                     else [float(v) for v in p] for p in seg]
            rle = mask.merge(mask.frPyObjects(polys, height, width))
        elif kind == "rle":
            counts = seg["counts"]
            rle = mask.frPyObjects({"size": seg["size"], "counts": counts}, oh, ow) if isinstance(counts, list) \
                else {"size": seg["size"], "counts": counts.encode("ascii")}
            if scaled:
                import cv2

                m = cv2.resize(mask.decode(rle), (width, height), interpolation=cv2.INTER_NEAREST)
                rle = mask.encode(np.asfortranarray(m))
        else:  # an object without a mask: an empty one
            rle = mask.encode(np.zeros((height, width), dtype=np.uint8, order="F"))
        counts = rle["counts"]
        out.append({"size": [int(v) for v in rle["size"]],
                    "counts": counts.decode("ascii") if isinstance(counts, bytes) else counts})
    return out

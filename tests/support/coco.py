"""A small real-format COCO dataset: JPEGs and an instances (and captions) file over them.

Polygons (one and two parts), uncompressed RLE crowd regions, a compressed RLE, images without
annotations, categories with gaps in their ids; the files pycocotools reads as they are.

``make_box_coco``: PNG images, black but for a white rectangle per annotation exactly where its
box and polygon are, so that what a transform or a drawing does to boxes can be checked
against the pixels; with ``keypoints=True`` each object of a category that names them
(``BOX_KEYPOINTS``: every category but 18) has its box's corners as keypoints and one point
not labelled.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

__all__ = ["make_coco", "make_box_coco", "pack_box_coco", "box_keypoints", "BOX_IMAGES", "BOX_KEYPOINTS",
           "BOX_KEYPOINT_CATEGORIES", "CATEGORY_IDS"]

CATEGORY_IDS = (1, 3, 7, 18)  # gaps, as COCO's own ids have: labels 0..3 in this order


def _jpeg(path: Path, width: int, height: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    arr = np.stack([(x * 255 // max(width - 1, 1)), (y * 255 // max(height - 1, 1)),
                    np.full_like(x, 40 * seed % 256)], axis=-1).astype(np.uint8)
    arr[rng.integers(0, height, 20), rng.integers(0, width, 20)] = 255
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(arr).save(path, quality=90)


def _uncompressed_rle(mask: np.ndarray) -> dict[str, Any]:
    """COCO's iscrowd RLE: column-major run lengths starting with a run of zeros."""
    flat = mask.T.ravel()
    counts, prev, run = [], 0, 0
    for v in flat:
        if v != prev:
            counts.append(run)
            run, prev = 0, v
        run += 1
    counts.append(run)
    return {"size": [int(mask.shape[0]), int(mask.shape[1])], "counts": counts}


def make_coco(root: Path, *, n_images: int = 6, captions: bool = False) -> dict[str, Path]:
    """Write ``root/images/...`` and ``root/instances.json`` (+ ``captions.json``); return the paths."""
    from pycocotools import mask as mask_util

    sizes = [(64, 48), (80, 60), (50, 70), (96, 64), (40, 40), (72, 56), (60, 90), (88, 50)]
    images, anns, caps = [], [], []
    aid = 100
    for i in range(n_images):
        w, h = sizes[i % len(sizes)]
        iid = 1000 + 7 * i
        name = f"images/{'sub/' if i % 3 == 2 else ''}img_{i:03d}.jpg"
        _jpeg(root / name, w, h, i + 1)
        images.append({"id": iid, "file_name": name, "width": w, "height": h})
        caps.append({"id": 5000 + i, "image_id": iid, "caption": f"a picture number {i} ünïcode"})
        caps.append({"id": 6000 + i, "image_id": iid, "caption": f"second caption {i}"})
        if i % 4 == 3:  # an image without annotations
            continue
        # a triangle and a two-part polygon object
        poly = [2.0, 3.0, w * 0.6, 4.5, w * 0.3, h * 0.7]
        xs, ys = poly[0::2], poly[1::2]
        anns.append({"id": aid, "image_id": iid, "category_id": CATEGORY_IDS[i % 4], "iscrowd": 0,
                     "segmentation": [poly], "area": 0.5 * w * h * 0.2,
                     "bbox": [min(xs), min(ys), max(xs) - min(xs), max(ys) - min(ys)]})
        aid += 1
        p1 = [w * 0.5, h * 0.5, w * 0.9, h * 0.5, w * 0.9, h * 0.9, w * 0.5, h * 0.9]
        p2 = [w * 0.1, h * 0.8, w * 0.2, h * 0.8, w * 0.15, h * 0.95]
        anns.append({"id": aid, "image_id": iid, "category_id": CATEGORY_IDS[(i + 1) % 4], "iscrowd": 0,
                     "segmentation": [p1, p2], "area": 123.25,
                     "bbox": [w * 0.1, h * 0.5, w * 0.8, h * 0.45]})
        aid += 1
        if i % 2 == 0:  # a crowd region as uncompressed RLE
            m = np.zeros((h, w), dtype=np.uint8)
            m[h // 4:h // 2, w // 3:w - 2] = 1
            anns.append({"id": aid, "image_id": iid, "category_id": CATEGORY_IDS[3], "iscrowd": 1,
                         "segmentation": _uncompressed_rle(m), "area": float(m.sum()),
                         "bbox": [w // 3, h // 4, w - 2 - w // 3, h // 2 - h // 4]})
            aid += 1
        if i % 3 == 1:  # a compressed RLE
            m = np.zeros((h, w), dtype=np.uint8, order="F")
            m[1:6, 1:9] = 1
            rle = mask_util.encode(m)
            anns.append({"id": aid, "image_id": iid, "category_id": CATEGORY_IDS[2], "iscrowd": 0,
                         "segmentation": {"size": [h, w], "counts": rle["counts"].decode("ascii")},
                         "area": 40.0, "bbox": [1, 1, 8, 5]})
            aid += 1
    categories = [{"id": c, "name": f"cat{c}", "supercategory": "thing"} for c in reversed(CATEGORY_IDS)]
    out = {"instances": root / "instances.json"}
    out["instances"].write_text(json.dumps({"info": {}, "licenses": [], "images": images, "annotations": anns,
                                            "categories": categories}))
    if captions:
        out["captions"] = root / "captions.json"
        out["captions"].write_text(json.dumps({"images": images, "annotations": caps}))
    return out


# (width, height, [(x0, y0, x1, y1, category id), ...]) per image: integer boxes, apart; one
# image without annotations; one larger than a 160-pixel contact-sheet tile (scaled by 1/2)
BOX_IMAGES = (
    (64, 48, [(4, 6, 20, 30, 1), (30, 10, 60, 22, 7), (40, 30, 52, 44, 3)]),
    (50, 70, [(10, 40, 40, 64, 18)]),
    (40, 40, []),
    (320, 200, [(40, 20, 120, 100, 3), (200, 60, 300, 180, 1)]),
    (72, 56, [(2, 2, 12, 12, 7), (20, 30, 70, 54, 1)]),
)


# keypoints=True: the names, and the categories that name them (18 does not: its objects get zeros)
BOX_KEYPOINTS = ("top_left", "top_right", "bottom_right", "bottom_left", "unlabelled")
BOX_KEYPOINT_CATEGORIES = (1, 3, 7)


def box_keypoints(x0: float, y0: float, x1: float, y1: float) -> list[float]:
    """A box's ``BOX_KEYPOINTS`` as COCO's flat ``[x, y, v, ...]``: its corners, visible, then
    one point not labelled."""
    return [x0, y0, 2, x1, y0, 2, x1, y1, 2, x0, y1, 2, 0, 0, 0]


def make_box_coco(root: Path, *, keypoints: bool = False) -> Path:
    """``root/boxes/*.png`` and ``root/boxes.json`` (``BOX_IMAGES``); returns the JSON's path.
    ``keypoints``: a keypoints file (``box_keypoints`` of each object whose category names them)."""
    images, anns = [], []
    for i, (w, h, boxes) in enumerate(BOX_IMAGES):
        arr = np.zeros((h, w, 3), dtype=np.uint8)
        name = f"boxes/img_{i}.png"
        images.append({"id": 10 + i, "file_name": name, "width": w, "height": h})
        for k, (x0, y0, x1, y1, cat) in enumerate(boxes):
            arr[y0:y1, x0:x1] = 255
            anns.append({"id": 100 * (i + 1) + k, "image_id": 10 + i, "category_id": cat, "iscrowd": 0,
                         "segmentation": [[x0, y0, x1, y0, x1, y1, x0, y1]], "area": float((x1 - x0) * (y1 - y0)),
                         "bbox": [x0, y0, x1 - x0, y1 - y0]})
            if keypoints and cat in BOX_KEYPOINT_CATEGORIES:
                anns[-1].update(keypoints=box_keypoints(x0, y0, x1, y1), num_keypoints=4)
        (root / "boxes").mkdir(parents=True, exist_ok=True)
        Image.fromarray(arr).save(root / name)
    categories = [{"id": c, "name": f"cat{c}", "supercategory": "thing"} for c in CATEGORY_IDS]
    if keypoints:
        for c in categories:
            if c["id"] in BOX_KEYPOINT_CATEGORIES:
                c.update(keypoints=list(BOX_KEYPOINTS), skeleton=[[1, 2], [2, 3], [3, 4], [4, 1]])
    path = root / "boxes.json"
    path.write_text(json.dumps({"images": images, "annotations": anns, "categories": categories}))
    return path


def pack_box_coco(root: Path, *, keypoints: bool = False) -> Path:
    """``make_box_coco`` in ``root``, packed into ``root/out.lmdb``; returns the pack's path."""
    import packer

    out = root / "out.lmdb"
    packer.pack(root, out, coco=make_box_coco(root, keypoints=keypoints), workers=0)
    return out

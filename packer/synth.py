"""Natural-looking synthetic images: smooth gradients, soft shapes and sensor noise.

Used by ``packer demo``, the tests and the benchmarks, so none of them needs a download.
Their JPEG size and decode cost are close to real photos of the same resolution (flat
random noise or flat colours would make JPEG decode unrealistically slow or fast).
``write_coco`` writes a COCO-shaped instances (or person keypoints) file of any size (and images
for it).
"""
from __future__ import annotations

import io
import json
import os
from pathlib import Path

import cv2
import numpy as np
from PIL import Image

__all__ = ["natural_image", "jpeg_bytes", "make_image_folder", "write_video", "write_video_folder", "write_coco",
           "rle_string", "COCO_KEYPOINTS", "COCO_SKELETON"]


def natural_image(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """An HxWx3 uint8 image with the statistics of a photo (low-frequency structure + noise).

    The smooth content is built at a quarter of the resolution and upsampled (bicubic),
    then fine texture and sensor noise are added at full resolution.
    """
    sh, sw = max(2, height // 4), max(2, width // 4)
    yy, xx = np.mgrid[0:sh, 0:sw].astype(np.float32)
    base = rng.uniform(30, 220, size=3).astype(np.float32)
    grad = rng.uniform(-0.4, 0.4, size=(3, 2)).astype(np.float32)
    img = base + grad[:, 0] * yy[..., None] * (200 / sh) + grad[:, 1] * xx[..., None] * (200 / sw)
    for _ in range(int(rng.integers(3, 8))):
        cy, cx = rng.uniform(0, sh), rng.uniform(0, sw)
        ry, rx = rng.uniform(0.05, 0.35) * sh, rng.uniform(0.05, 0.35) * sw
        mask = np.exp(-(((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2) * 2.0)
        img += mask[..., None] * rng.uniform(-90, 90, size=3).astype(np.float32)
    small = rng.normal(0, 12, size=(sh // 8 + 2, sw // 8 + 2, 3)).astype(np.float32)
    img += cv2.resize(small, (sw, sh), interpolation=cv2.INTER_LINEAR)
    img = cv2.resize(img, (width, height), interpolation=cv2.INTER_CUBIC)
    fine = rng.normal(0, 10, size=(height // 4 + 1, width // 4 + 1, 3)).astype(np.float32)
    img += cv2.resize(fine, (width, height), interpolation=cv2.INTER_LINEAR)
    img += rng.standard_normal(size=img.shape, dtype=np.float32) * 4
    return np.clip(img, 0, 255).astype(np.uint8)


def jpeg_bytes(arr: np.ndarray, quality: int = 90) -> bytes:
    """Encode an RGB array as a baseline JPEG."""
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "JPEG", quality=quality)
    return buf.getvalue()


def make_image_folder(root: str | os.PathLike, *, count: int = 200, classes: int = 4,
                      size: tuple[int, int] = (432, 576), seed: int = 0, quality: int = 90) -> Path:
    """Write ``count`` JPEGs into ``root/class_{k}/img_{i}.jpg`` (an ImageFolder tree)."""
    root = Path(root)
    rng = np.random.default_rng(seed)
    h, w = size
    for i in range(count):
        d = root / f"class_{i % classes}"
        d.mkdir(parents=True, exist_ok=True)
        jitter_h = int(rng.integers(-h // 8, h // 8 + 1))
        jitter_w = int(rng.integers(-w // 8, w // 8 + 1))
        arr = natural_image(rng, h + jitter_h, w + jitter_w)
        (d / f"img_{i:05d}.jpg").write_bytes(jpeg_bytes(arr, quality))
    return root


def write_video(path: str | os.PathLike, *, frames: int = 24, size=(48, 64), fps: float = 25.0, seed: int = 0,
                fourcc: str | None = None) -> Path:
    """A small synthetic video (OpenCV's mp4v for .mp4, MJPG for .avi): a moving gradient
    whose frame i carries i in its mean brightness, so tests can tell frames apart."""
    import cv2

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fourcc = fourcc or ("MJPG" if path.suffix.lower() == ".avi" else "mp4v")
    h, w = size
    out = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*fourcc), fps, (w, h))
    if not out.isOpened():
        raise RuntimeError(f"OpenCV cannot write {path} with {fourcc}")
    rng = np.random.default_rng(seed)
    base = natural_image(rng, h, w)
    for i in range(frames):
        frame = np.roll(base, 2 * i, axis=1).astype(np.int16) + (i * 97) % 120 - 60
        out.write(np.clip(frame, 0, 255).astype(np.uint8)[:, :, ::-1])
    out.release()
    return path


def write_video_folder(root: str | os.PathLike, *, per_class: int = 2, classes: int = 2, frames: int = 24,
                       size=(48, 64)) -> Path:
    """``root/<class>/<video>`` with mp4 and avi videos of ``frames`` frames each."""
    root = Path(root)
    for c in range(classes):
        for k in range(per_class):
            ext = "mp4" if k % 2 == 0 else "avi"
            write_video(root / f"class_{c}" / f"clip_{c}_{k}.{ext}", frames=frames + k, size=size,
                        seed=10 * c + k)
    return root


# COCO's 80 category ids (1..90 with gaps), as instances_*.json lists them
COCO_CATEGORY_IDS = tuple(i for i in range(1, 91) if i not in (12, 26, 29, 30, 45, 66, 68, 69, 71, 83))


# COCO's person keypoints (person_keypoints_*.json): names, and the skeleton's 1-based pairs
COCO_KEYPOINTS = ("nose", "left_eye", "right_eye", "left_ear", "right_ear", "left_shoulder", "right_shoulder",
                  "left_elbow", "right_elbow", "left_wrist", "right_wrist", "left_hip", "right_hip", "left_knee",
                  "right_knee", "left_ankle", "right_ankle")
COCO_SKELETON = ((16, 14), (14, 12), (17, 15), (15, 13), (12, 13), (6, 12), (7, 13), (6, 7), (6, 8), (7, 9), (8, 10),
                 (9, 11), (2, 3), (1, 2), (1, 3), (2, 4), (3, 5), (4, 6), (5, 7))


def rle_string(counts: list[int]) -> str:
    """COCO's compressed RLE string of run lengths (pycocotools' ``rleToString``)."""
    out = []
    for i, c in enumerate(counts):
        x = c - counts[i - 2] if i > 2 else c
        more = True
        while more:
            ch = x & 0x1F
            x >>= 5
            more = not ((ch & 0x10) == 0 and x == 0 or (ch & 0x10) != 0 and x == -1)
            if more:
                ch |= 0x20
            out.append(chr(ch + 48))
    return "".join(out)


def _runs(mask: np.ndarray) -> list[int]:
    """Column-major run lengths of a 0/1 mask, starting with a run of zeros (COCO's RLE)."""
    flat = mask.T.ravel()
    edges = np.flatnonzero(np.diff(flat)) + 1
    bounds = np.concatenate([[0], edges, [flat.size]])
    runs = np.diff(bounds).tolist()
    return ([0] + runs) if flat[0] else runs


def _polygon(rng: np.random.Generator, height: int, width: int, points: int) -> list[float]:
    """A star-shaped polygon of ``points`` vertices inside the image, in hundredths of a pixel."""
    cx, cy = rng.uniform(0.15, 0.85) * width, rng.uniform(0.15, 0.85) * height
    r = rng.uniform(0.05, 0.35) * min(height, width)
    angles = np.sort(rng.uniform(0, 2 * np.pi, points))
    radii = r * rng.uniform(0.5, 1.0, points)
    xs = np.clip(np.rint((cx + radii * np.cos(angles)) * 100), 0, width * 100)
    ys = np.clip(np.rint((cy + radii * np.sin(angles)) * 100), 0, height * 100)
    return (np.stack([xs, ys], axis=1).ravel() / 100).tolist()


def _annotation(rng: np.random.Generator, aid: int, iid: int, height: int, width: int, crowd: float,
                compressed: float, points: tuple[int, int]) -> dict:
    cid = int(COCO_CATEGORY_IDS[int(rng.integers(len(COCO_CATEGORY_IDS)))])
    u = rng.random()
    if u < crowd + compressed:  # a crowd region (uncompressed RLE) or an object as compressed RLE
        y0, x0 = int(rng.integers(0, height - 2)), int(rng.integers(0, width - 2))
        y1, x1 = int(rng.integers(y0 + 1, height)), int(rng.integers(x0 + 1, width))
        m = np.zeros((height, width), dtype=np.uint8)
        m[y0:y1, x0:x1] = 1
        counts = _runs(m)
        is_crowd = u < crowd
        seg = {"size": [height, width], "counts": counts if is_crowd else rle_string(counts)}
        return {"id": aid, "image_id": iid, "category_id": cid, "iscrowd": int(is_crowd), "segmentation": seg,
                "area": float(m.sum()), "bbox": [float(x0), float(y0), float(x1 - x0), float(y1 - y0)]}
    parts = [_polygon(rng, height, width, int(rng.integers(*points)))]
    if rng.random() < 0.1:  # an occluded object: two parts
        parts.append(_polygon(rng, height, width, int(rng.integers(*points))))
    xs = np.concatenate([p[0::2] for p in parts])
    ys = np.concatenate([p[1::2] for p in parts])
    area = sum(0.5 * abs(float(np.dot(x, np.roll(y, 1)) - np.dot(y, np.roll(x, 1))))
               for x, y in ((np.asarray(p[0::2]), np.asarray(p[1::2])) for p in parts))
    x0, y0 = float(xs.min()), float(ys.min())
    return {"id": aid, "image_id": iid, "category_id": cid, "iscrowd": 0, "segmentation": parts,
            "area": round(area, 2), "bbox": [x0, y0, round(float(xs.max()) - x0, 2), round(float(ys.max()) - y0, 2)]}


def _person(rng: np.random.Generator, ann: dict, k: int) -> dict:
    """``ann`` as a person with ``k`` keypoints, as COCO writes them: integer pixels inside its
    box, v 0 (not labelled: 0, 0, 0), 1 (labelled, hidden) or 2 (visible); a crowd region's all
    zero."""
    x0, y0, w, h = ann["bbox"]
    v = np.zeros(k, dtype=np.int64) if ann["iscrowd"] else rng.choice(3, size=k, p=(0.3, 0.2, 0.5))
    xs = rng.integers(int(np.floor(x0)), int(np.floor(x0 + w)) + 1, k) * (v > 0)
    ys = rng.integers(int(np.floor(y0)), int(np.floor(y0 + h)) + 1, k) * (v > 0)
    return {**ann, "category_id": 1, "keypoints": np.stack([xs, ys, v], axis=1).ravel().tolist(),
            "num_keypoints": int(np.count_nonzero(v))}


def write_coco(root: str | os.PathLike, *, images: int = 100, annotations: int = 700, size: tuple[int, int] = (64, 64),
               seed: int = 0, empty: float = 0.05, crowd: float = 0.01, compressed: float = 0.005,
               points: tuple[int, int] = (8, 40), distinct: int = 256, write_images: bool = True,
               name: str = "instances.json", keypoints: int = 0) -> Path:
    """A COCO-shaped instances file ``root/name`` (and, with ``write_images``, its JPEGs under
    ``root/images/``); returns the file's path.

    ``images`` images of ``size`` (height, width), ids from 1,000,001 in steps of 3; ``empty``
    of them have no annotation; the ``annotations`` are spread over the others at random and
    listed in random order: star-shaped polygons of ``points`` vertices (a tenth of them in two
    parts, coordinates in hundredths of a pixel, as COCO writes them), ``crowd`` crowd regions as
    uncompressed RLE, ``compressed`` objects as compressed RLE, the 80 COCO category ids (listed
    after the annotations, as COCO's own files do). The images are ``distinct`` photo-like JPEGs
    repeated. Written a batch at a time: the whole file is never held.

    ``keypoints=K`` writes a person keypoints file instead (``person_keypoints_*.json``'s
    layout): one category, ``person`` (id 1), naming K keypoints (COCO's 17 names and skeleton for
    17) and every annotation a person with ``keypoints`` (some not labelled, v 0; some v 1 or 2)
    and ``num_keypoints``.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    height, width = size
    ids = [1_000_001 + 3 * i for i in range(images)]
    names = [f"images/{i // 1000:03d}/{i:07d}.jpg" for i in range(images)]
    if write_images:
        pool = [jpeg_bytes(natural_image(rng, height, width)) for _ in range(min(distinct, images))]
        for i, name_i in enumerate(names):
            path = root / name_i
            if i % 1000 == 0:
                path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(pool[i % len(pool)])
    annotated = np.flatnonzero(rng.random(images) >= empty) if images else np.zeros(0, dtype=np.int64)
    if annotations and not len(annotated):
        annotated = np.arange(images)
    owner = annotated[rng.integers(0, len(annotated), annotations)] if annotations else np.zeros(0, dtype=np.int64)
    path = root / name
    with open(path, "w", encoding="utf-8") as f:
        f.write('{"info":{"description":"packer.synth.write_coco","version":"1.0"},"licenses":[],"images":[')
        f.write(",".join(json.dumps({"license": 1, "file_name": n, "height": height, "width": width, "id": i},
                                    separators=(",", ":")) for n, i in zip(names, ids)))
        f.write('],"annotations":[')
        for start in range(0, annotations, 10_000):
            batch = [_annotation(rng, 1 + k, ids[int(owner[k])], height, width, crowd, compressed, points)
                     for k in range(start, min(start + 10_000, annotations))]
            if keypoints:
                batch = [_person(rng, a, keypoints) for a in batch]
            f.write(("," if start else "") + json.dumps(batch, separators=(",", ":"))[1:-1])
        f.write('],"categories":')
        if keypoints:
            names = list(COCO_KEYPOINTS) if keypoints == len(COCO_KEYPOINTS) else [f"point {i}" for i in range(keypoints)]
            skeleton = COCO_SKELETON if keypoints == len(COCO_KEYPOINTS) else [(i, i + 1) for i in range(1, keypoints)]
            cats = [{"supercategory": "person", "id": 1, "name": "person", "keypoints": names,
                     "skeleton": [list(e) for e in skeleton]}]
        else:
            cats = [{"supercategory": "thing", "id": c, "name": f"category {c}"} for c in COCO_CATEGORY_IDS]
        f.write(json.dumps(cats, separators=(",", ":")))
        f.write("}")
    return path

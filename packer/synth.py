"""Natural-looking synthetic images: smooth gradients, soft shapes and sensor noise.

Used by ``packer demo``, the tests and the benchmarks, so none of them needs a download.
Their JPEG size and decode cost are close to real photos of the same resolution (flat
random noise or flat colours would make JPEG decode unrealistically slow or fast).
"""
from __future__ import annotations

import io
import os
from pathlib import Path

import cv2
import numpy as np
from PIL import Image

__all__ = ["natural_image", "jpeg_bytes", "make_image_folder", "write_video", "write_video_folder"]


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

"""Small generated inputs for the tests: image folders, videos, a folder past PATH_MAX."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from PIL import Image

from packer.synth import write_video, write_video_folder  # noqa: F401 (the tests' generators)
from packer.synth import jpeg_bytes, natural_image

__all__ = ["write_image_folder", "write_video", "write_video_folder", "folder_past_path_max", "bomb_png"]


def write_image_folder(root: Path, *, count: int = 24, classes: int = 3, size=(48, 64), seed: int = 0) -> Path:
    """A small ImageFolder of natural-looking JPEGs (fast to make)."""
    rng = np.random.default_rng(seed)
    for i in range(count):
        d = root / f"class_{i % classes}"
        d.mkdir(parents=True, exist_ok=True)
        h = size[0] + int(rng.integers(0, 8))
        w = size[1] + int(rng.integers(0, 8))
        (d / f"img_{i:04d}.jpg").write_bytes(jpeg_bytes(natural_image(rng, h, w)))
    return root


def folder_past_path_max(base, image: bytes) -> str:
    """Nested folders under ``base`` whose path ends past PATH_MAX, an image at the bottom; made
    through folder descriptors (no path that long can be opened). Returns the top folder's name."""
    top = "deep"
    fd = os.open(base, os.O_RDONLY)
    try:
        os.mkdir(top, dir_fd=fd)
        nxt = os.open(top, os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = nxt
        for _ in range(20):  # 20 x 251 bytes: past Linux's 4,096 (and macOS's 1,024)
            os.mkdir("d" * 250, dir_fd=fd)
            nxt = os.open("d" * 250, os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = nxt
        img = os.open("lost.jpg", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
        os.write(img, image)
        os.close(img)
    finally:
        os.close(fd)
    return top


def bomb_png(path: Path) -> None:
    """A 1-bit PNG of 15000x13000 pixels (195 Mpx > 2 x Pillow's MAX_IMAGE_PIXELS), ~30 KB."""
    Image.new("1", (15000, 13000)).save(path, optimize=False)

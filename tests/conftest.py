"""Shared fixtures: small generated datasets and the real-world files in ``tests/fixtures``
(inside the repository, see its README.md for provenance and licences)."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from packer.synth import jpeg_bytes, natural_image

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"
FIXTURE_IMAGES = FIXTURES / "images"
FIXTURE_VIDEOS = FIXTURES / "videos"


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


@pytest.fixture(scope="session")
def image_folder(tmp_path_factory) -> Path:
    """24 JPEGs in 3 classes; read-only for tests (copy before changing)."""
    return write_image_folder(tmp_path_factory.mktemp("imgs") / "src")


@pytest.fixture
def mixed_folder(tmp_path) -> Path:
    """Good JPEG/PNG images plus the bad inputs of the error policy."""
    root = write_image_folder(tmp_path / "mixed", count=6, classes=2)
    rng = np.random.default_rng(1)
    Image.fromarray(natural_image(rng, 40, 50)).save(root / "class_0" / "png_one.png")
    good = (root / "class_0" / "img_0000.jpg").read_bytes()
    (root / "class_1" / "truncated.jpg").write_bytes(good[: len(good) // 2])
    (root / "class_1" / "zero.jpg").write_bytes(b"")
    (root / "class_1" / "text.jpg").write_text("this is not an image\n")
    (root / "class_0" / ".hidden.jpg").write_bytes(good)
    (root / "class_0" / "notes.txt").write_text("skipped by the extension filter")
    return root


def packed_snapshot(out) -> dict:
    """What a reader sees of a packed output of any format, plus its failures file: two outputs
    hold the same dataset when their snapshots are equal (``created_by`` may differ)."""
    import dataclasses

    from packer.formats import open_reader
    from packer.commands.merge import read_failures, writer_of

    r = open_reader(out)
    m = r.manifest
    return {"keys": list(r.keys), "records": [dataclasses.astuple(r.read(i)) for i in range(len(r))],
            "classes": m.classes, "kind": m.kind, "count": m.count, "failures": m.failures,
            "videos": m.videos, "extra": m.extra, "failure_records": read_failures(r),
            "failures_file": writer_of(r).failures_path(Path(out)).read_bytes()}


def write_video(path: Path, *, frames: int = 24, size=(48, 64), fps: float = 25.0, seed: int = 0,
                fourcc: str | None = None) -> Path:
    """A small synthetic video (OpenCV's mp4v for .mp4, MJPG for .avi): a moving gradient
    whose frame i carries i in its mean brightness, so tests can tell frames apart."""
    import cv2

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


def write_video_folder(root: Path, *, per_class: int = 2, classes: int = 2, frames: int = 24,
                       size=(48, 64)) -> Path:
    """``root/<class>/<video>`` with mp4 and avi videos of ``frames`` frames each."""
    for c in range(classes):
        for k in range(per_class):
            ext = "mp4" if k % 2 == 0 else "avi"
            write_video(root / f"class_{c}" / f"clip_{c}_{k}.{ext}", frames=frames + k, size=size,
                        seed=10 * c + k)
    return root


@pytest.fixture(scope="session")
def video_folder(tmp_path_factory) -> Path:
    """Two classes of two synthetic videos (24/25 frames, 48x64); read-only for tests."""
    return write_video_folder(tmp_path_factory.mktemp("videos") / "src")


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

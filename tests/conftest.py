"""Shared fixtures: small generated datasets (always) and the real fixtures (when ../shared exists)."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from packer.synth import jpeg_bytes, natural_image

REPO = Path(__file__).resolve().parent.parent
SHARED_FIXTURES = Path(os.environ.get("PACKER_FIXTURES", REPO.parent / "shared" / "fixtures"))
FIXTURE_IMAGES = SHARED_FIXTURES / "images"
FIXTURE_VIDEOS = SHARED_FIXTURES / "videos"

needs_fixture_images = pytest.mark.skipif(not FIXTURE_IMAGES.is_dir(),
                                          reason="../shared/fixtures/images not present")
needs_fixture_videos = pytest.mark.skipif(not FIXTURE_VIDEOS.is_dir(),
                                          reason="../shared/fixtures/videos not present")


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
    from packer.merge import read_failures, writer_of

    r = open_reader(out)
    m = r.manifest
    return {"keys": list(r.keys), "records": [dataclasses.astuple(r.read(i)) for i in range(len(r))],
            "classes": m.classes, "kind": m.kind, "count": m.count, "failures": m.failures,
            "videos": m.videos, "extra": m.extra, "failure_records": read_failures(r),
            "failures_file": writer_of(r).failures_path(Path(out)).read_bytes()}

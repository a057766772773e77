"""Staleness by identity, not by age (issue 31, case 7): ``packer resize`` redoes an output
whenever its source is not the very file it was made from (size, mtime or ctime differ from
the recorded ones), also when the replacement is OLDER (``cp -p``) or was written in place
with its size and mtime set back. Each rerun must end equal to a fresh mirror of the tree."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.support.inputs import write_image_folder
from packer.synth import jpeg_bytes, natural_image
from tests.support.killing import run_packer

ARGS = ("--short-side", "16", "--workers", "0")


def mirror(src: Path, out: Path) -> str:
    r = run_packer("resize", src, out, *ARGS)
    assert r.returncode == 0, r.stderr
    return r.stdout + r.stderr


def pixels(path: Path) -> np.ndarray:
    return np.asarray(Image.open(path).convert("RGB"))


@pytest.fixture()
def src(tmp_path) -> Path:
    root = write_image_folder(tmp_path / "src", count=4, classes=1, size=(40, 56))
    old = root / "class_0" / "old.jpg"  # a different image, made long ago
    old.write_bytes(jpeg_bytes(natural_image(np.random.default_rng(42), 40, 56)))
    os.utime(old, ns=(10 ** 18, 10 ** 18))  # 2001
    return root


def test_source_replaced_by_an_older_file_is_redone(src, tmp_path):
    out = tmp_path / "out"
    mirror(src, out)
    target = src / "class_0" / "img_0000.jpg"
    before = pixels(out / "class_0" / "img_0000.jpg")
    subprocess.run(["cp", "-p", str(src / "class_0" / "old.jpg"), str(target)], check=True)
    assert target.stat().st_mtime_ns < (out / "class_0" / "img_0000.jpg").stat().st_mtime_ns
    log = mirror(src, out)
    assert "1 resized" in log and "4 up to date" in log, log
    after = pixels(out / "class_0" / "img_0000.jpg")
    assert not np.array_equal(after, before)
    assert np.array_equal(after, pixels(out / "class_0" / "old.jpg"))  # the very same source now
    fresh = tmp_path / "fresh"
    mirror(src, fresh)
    assert (out / "class_0" / "img_0000.jpg").read_bytes() == (fresh / "class_0" / "img_0000.jpg").read_bytes()


def test_rewrite_in_place_with_size_and_mtime_set_back_is_redone(src, tmp_path):
    """Same size, same mtime, other pixels: only the ctime tells (the kernel sets it on every
    change, nobody can set it back)."""
    out = tmp_path / "out"
    mirror(src, out)
    target = src / "class_0" / "img_0001.jpg"
    st = target.stat()
    # another image no bigger than the source, padded to its size (bytes after the JPEG's end
    # are ignored by every decoder)
    other = next(data for seed in range(100)
                 if len(data := jpeg_bytes(natural_image(np.random.default_rng(seed), 36, 50))) <= st.st_size)
    other += b"\0" * (st.st_size - len(other))
    with open(target, "r+b") as f:  # in place: same inode
        f.write(other)
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert target.stat().st_size == st.st_size and target.stat().st_mtime_ns == st.st_mtime_ns
    log = mirror(src, out)
    assert "1 resized" in log, log
    assert np.array_equal(pixels(out / "class_0" / "img_0001.jpg"),
                          pixels(_fresh(src, tmp_path) / "class_0" / "img_0001.jpg"))


def _fresh(src: Path, tmp_path: Path) -> Path:
    fresh = tmp_path / "fresh"
    shutil.rmtree(fresh, ignore_errors=True)
    mirror(src, fresh)
    return fresh


def test_unchanged_sources_stay_up_to_date(src, tmp_path):
    out = tmp_path / "out"
    mirror(src, out)
    stamps = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
    log = mirror(src, out)
    assert "0 resized" in log and "5 up to date" in log, log
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()} == stamps

"""``packer resize``: mirrors a tree, incremental and idempotent, atomic, failures recorded."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from packer.cli import main
from packer.codecs.image import decode_pil
from packer.commands.resize_tree import STATE_NAME
from packer.synth import jpeg_bytes, natural_image
from tests.support import FIXTURE_IMAGES
from tests.support.inputs import write_image_folder


def make_tree(root: Path) -> Path:
    """Images at several depths (not an ImageFolder), a non-image file, a hidden file, and the
    real fixtures (when present) including the truncated JPEG."""
    write_image_folder(root / "a" / "b", count=4, classes=2, size=(120, 160))
    rng = np.random.default_rng(5)
    (root / "top.jpg").write_bytes(jpeg_bytes(natural_image(rng, 90, 70)))
    Image.fromarray(natural_image(rng, 50, 200)).save(root / "a" / "wide.png")
    (root / "a" / "small.jpg").write_bytes(jpeg_bytes(natural_image(rng, 20, 30)))
    (root / "notes.txt").write_text("not an image")
    (root / "a" / ".hidden.jpg").write_bytes(jpeg_bytes(natural_image(rng, 90, 70)))
    (root / "bad.jpg").write_bytes(b"\xff\xd8\xff\xe0 this is not really a jpeg")
    shutil.copytree(FIXTURE_IMAGES, root / "fixtures")
    return root


def snapshot(root: Path) -> dict[str, tuple[bytes, int]]:
    return {str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*")) if p.is_file()}


def resize(*args: str):
    return CliRunner().invoke(main, ["resize", *args])


@pytest.fixture
def tree(tmp_path) -> Path:
    return make_tree(tmp_path / "src")


def test_mirrors_the_tree_and_records_failures(tree, tmp_path):
    out = tmp_path / "out"
    r = resize(str(tree), str(out), "--short-side", "40", "--workers", "2")
    assert r.exit_code == 1, r.output  # bad inputs fail the run
    sources = sorted(str(p.relative_to(tree)) for p in tree.rglob("*")
                     if p.suffix in (".jpg", ".png") and not p.name.startswith("."))
    bad = {"bad.jpg", "fixtures/pillow_truncated_jpeg.jpg"}
    outputs = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert outputs == sorted(set(sources) - bad | {"failures.jsonl", STATE_NAME})
    failures = [json.loads(line) for line in (out / "failures.jsonl").read_text().splitlines()]
    assert sorted(f["key"] for f in failures) == sorted(bad)
    assert all(f["stage"] == "decode" and f["source"].endswith(f["key"]) for f in failures)
    assert not list(out.rglob("*.tmp-*"))  # every file was renamed into place
    for rel in set(sources) - bad:
        with Image.open(out / rel) as im:
            src = Image.open(tree / rel)
            upright = (src.height, src.width) if rel.endswith("orientation_6.jpg") else src.size
            assert min(im.size) == min(40, min(upright))
    assert (out / "a" / "small.jpg").read_bytes() == (tree / "a" / "small.jpg").read_bytes()  # kept
    assert "18 resized, 1 kept as they were" in r.output


def test_rerun_does_no_work_and_changes_no_byte(tree, tmp_path):
    out = tmp_path / "out"
    resize(str(tree), str(out), "--max-side", "64", "--workers", "0")
    before = snapshot(out)
    r = resize(str(tree), str(out), "--max-side", "64", "--workers", "0")
    n_bad = 2
    assert f"0 resized, 0 kept as they were, {len(before) - 2} up to date, {n_bad} failed" in r.output
    assert snapshot(out) == before  # same bytes, same mtimes: nothing was rewritten


def test_incremental_redo_of_changed_sources_and_options(tree, tmp_path):
    out = tmp_path / "out"
    resize(str(tree), str(out), "--short-side", "32", "--workers", "0", "--max-failures", "9")
    before = snapshot(out)
    src = tree / "a" / "b" / "class_0" / "img_0000.jpg"
    src.write_bytes(jpeg_bytes(natural_image(np.random.default_rng(9), 100, 300)))
    future = before["top.jpg"][1] + 10 ** 9
    os.utime(src, ns=(future, future))
    r = resize(str(tree), str(out), "--short-side", "32", "--workers", "0", "--max-failures", "9")
    assert r.exit_code == 0 and "1 resized" in r.output
    after = snapshot(out)
    changed = {k for k in after if after[k] != before[k]}
    # (the state records each source's identity: the changed source's entry changes with it)
    assert changed == {"a/b/class_0/img_0000.jpg", STATE_NAME}
    assert Image.open(out / "a/b/class_0/img_0000.jpg").size == (96, 32)
    # other options: every image is redone
    r = resize(str(tree), str(out), "--short-side", "24", "--workers", "0", "--max-failures", "9")
    assert "0 up to date" in r.output
    assert Image.open(out / "top.jpg").size == (24, 31)


def test_failing_source_removes_its_stale_output(tree, tmp_path):
    out = tmp_path / "out"
    resize(str(tree), str(out), "--short-side", "32", "--workers", "0", "--max-failures", "9")
    assert (out / "top.jpg").exists()
    (tree / "top.jpg").write_bytes(b"garbage")
    t = (out / "top.jpg").stat().st_mtime_ns + 10 ** 9
    os.utime(tree / "top.jpg", ns=(t, t))
    r = resize(str(tree), str(out), "--short-side", "32", "--workers", "0", "--max-failures", "9")
    assert not (out / "top.jpg").exists()
    assert "top.jpg" in (out / "failures.jsonl").read_text() and r.exit_code == 0


def test_format_change_renames_and_refuses_collisions(tmp_path):
    src = write_image_folder(tmp_path / "src", count=3, classes=1, size=(60, 80))
    Image.open(src / "class_0" / "img_0001.jpg").save(src / "class_0" / "extra.png")
    out = tmp_path / "out"
    r = resize(str(src), str(out), "--size", "32x32", "--format", "webp", "--workers", "0")
    assert r.exit_code == 0, r.output
    names = sorted(p.name for p in (out / "class_0").iterdir())
    assert names == ["extra.webp", "img_0000.webp", "img_0001.webp", "img_0002.webp"]
    assert Image.open(out / "class_0" / "extra.webp").size == (32, 32)
    Image.open(src / "class_0" / "img_0001.jpg").save(src / "class_0" / "img_0001.png")
    r = resize(str(src), str(tmp_path / "out2"), "--size", "32x32", "--format", "webp")
    assert r.exit_code != 0 and "also the output of" in r.output
    assert not (tmp_path / "out2").exists()  # refused before any work


def test_list_file_and_bad_arguments(tree, tmp_path):
    lst = tmp_path / "list.txt"
    lst.write_text("top.jpg 0\na/wide.png 1\n")
    out = tmp_path / "out"
    r = resize(str(tree), str(out), "--max-side", "50", "--list", str(lst))
    assert r.exit_code == 0, r.output
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*.*") if not p.name.startswith(".")) == \
        ["a/wide.png", "failures.jsonl", "top.jpg"]
    assert Image.open(out / "a" / "wide.png").size == (50, 13)  # 12.5 rounds half up
    for args, msg in [((str(tree), str(out)), "--short-side N"),
                      ((str(tree), str(tree / "inside"), "--short-side", "8"), "inside the input"),
                      ((str(tree), str(out), "--short-side", "8", "--max-side", "9"), "exactly one"),
                      ((str(tree), str(out), "--size", "12xx"), "WIDTHxHEIGHT"),
                      ((str(tmp_path / "missing"), str(out), "--short-side", "8"), "does not exist"),
                      ((str(tree), str(out), "--short-side", "8", "--ext", "gif"), "no input images")]:
        r = resize(*args)
        assert r.exit_code != 0 and msg in r.output, (args, r.output)
    assert not (tree / "inside").exists()


def test_resized_tree_reads_back_upright(tmp_path):
    """The EXIF-rotated input comes out upright with no orientation tag."""
    exif = Image.Exif()
    exif[0x0112] = 6
    src = tmp_path / "src" / "c"
    src.mkdir(parents=True)
    arr = natural_image(np.random.default_rng(0), 100, 300)  # stored 300 wide, 100 high
    Image.fromarray(arr).save(src / "rot.jpg", quality=95, exif=exif.tobytes())
    r = resize(str(tmp_path / "src"), str(tmp_path / "out"), "--short-side", "50", "--workers", "0")
    assert r.exit_code == 0, r.output
    im = Image.open(tmp_path / "out" / "c" / "rot.jpg")
    assert im.size == (50, 150) and im.getexif().get(0x0112) is None
    upright = decode_pil((src / "rot.jpg").read_bytes())  # Pillow's exif_transpose: the reference
    assert upright.shape == (300, 100, 3)
    expected = np.asarray(Image.fromarray(upright).resize((50, 150), Image.LANCZOS)).astype(int)
    got = np.asarray(im).astype(int)
    assert np.abs(got - expected).mean() < 4
    assert np.abs(got - expected[::-1, ::-1]).mean() > 2 * np.abs(got - expected).mean()  # not upside down

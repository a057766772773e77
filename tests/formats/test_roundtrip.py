"""Every registered format round-trips the same inputs (bytes, labels, keys) and verifies."""
from __future__ import annotations

import pytest

from packer.formats import FORMATS, open_reader
from packer.commands.inspection import verify_dataset
from packer.commands.pack_images import pack_images
from packer.conversion.inputs import image_folder
from packer.conversion.options import RunOptions

ALL = sorted(FORMATS)


def out_path(tmp_path, fmt):
    return tmp_path / ("out.h5" if FORMATS[fmt][0].single_file else "out")


@pytest.mark.parametrize("fmt", ALL)
def test_round_trip_bytes_labels_keys(image_folder, tmp_path, fmt):
    out = out_path(tmp_path, fmt)
    report = pack_images(image_folder, out, format=fmt, run_options=RunOptions(workers=0))
    items, classes = image_folder_items = image_folder_listing(image_folder)
    assert report.count == len(items) and report.failed == 0
    r = open_reader(out)
    assert len(r) == len(items)
    assert r.classes == classes
    assert r.keys == [it.key for it in items]
    for i, it in enumerate(items):
        rec = r.read(i)
        with open(it.path, "rb") as f:
            assert rec.data == f.read()
        assert rec.label == it.label
    assert verify_dataset(out).ok


def image_folder_listing(root):
    return image_folder(root)


@pytest.mark.parametrize("fmt", ALL)
def test_output_identical_whatever_workers(image_folder, tmp_path, fmt):
    a, b = out_path(tmp_path / "a", fmt), out_path(tmp_path / "b", fmt)
    pack_images(image_folder, a, format=fmt, run_options=RunOptions(workers=0))
    pack_images(image_folder, b, format=fmt, run_options=RunOptions(workers=2))
    ra, rb = open_reader(a), open_reader(b)
    assert ra.keys == rb.keys
    assert all(ra.read(i).data == rb.read(i).data for i in range(len(ra)))


@pytest.mark.parametrize("fmt", ALL)
def test_bad_inputs_recorded_not_fatal(mixed_folder, tmp_path, fmt):
    out = out_path(tmp_path, fmt)
    report = pack_images(mixed_folder, out, format=fmt, run_options=RunOptions(workers=2))
    failed = sorted(f["key"] for f in report.failures)
    assert failed == ["class_1/text.jpg", "class_1/truncated.jpg", "class_1/zero.jpg"]
    assert report.count == 7  # 6 generated JPEGs + 1 PNG; hidden and .txt files skipped
    fpath = FORMATS[fmt][0].failures_path(out)
    lines = fpath.read_text().splitlines()
    assert len(lines) == 3 and all('"reason"' in l and '"stage"' in l for l in lines)
    assert open_reader(out).manifest.failures == 3

"""Resizing while packing: the same code path for every format, recorded in the manifest."""
from __future__ import annotations

import shutil

import numpy as np
import pytest
from click.testing import CliRunner

from packer import PackedDataset
from packer.cli import main
from packer.formats import FORMATS, open_reader
from packer.commands.pack_images import pack_images
from packer.codecs.resize import ResizeSpec, resize_image
from packer.conversion.options import RunOptions
from tests.support import FIXTURE_IMAGES

CLI_COMMAND = {"lmdb": "to-lmdb", "hdf5": "to-hdf5", "records": "to-records"}


def out_path(tmp_path, name):
    return tmp_path / (f"out.h5" if FORMATS[name][0].single_file else f"out.{name}")


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_pack_with_resize_round_trips_every_format(name, image_folder, tmp_path):
    spec = ResizeSpec(short_side=20, format="png")
    out = out_path(tmp_path, name)
    report = pack_images(image_folder, out, format=name, resize=spec, run_options=RunOptions(workers=0))
    assert report.count == 24 and not report.failures
    ds = PackedDataset(out, decode="numpy")
    files = sorted(image_folder.rglob("*.jpg"), key=lambda p: (p.parent.name, p.name))
    for i in (0, 11, 23):
        arr, label = ds[i]
        assert min(arr.shape[:2]) == 20 and label == int(files[i].parent.name[-1])
        expected = resize_image(files[i].read_bytes(), spec)
        assert ds.reader.read(i).data == expected.data  # the same bytes as packer resize makes
        rec = ds.reader.read(i)
        assert (rec.fmt, rec.width, rec.height) == ("png", expected.width, expected.height)
    options = open_reader(out).manifest.created_by["options"]
    assert options["resize"] == {"short_side": 20, "fit": "crop", "upscale": False, "format": "png", "quality": 90}


@pytest.mark.parametrize("name", sorted(n for n in FORMATS if n in CLI_COMMAND))
def test_cli_resize_options(name, image_folder, tmp_path):
    out = out_path(tmp_path, name)
    r = CliRunner().invoke(main, [CLI_COMMAND[name], str(image_folder), str(out), "--workers", "0",
                                  "--size", "24x16", "--fit", "pad", "--quality", "70"])
    assert r.exit_code == 0, r.output
    ds = PackedDataset(out, decode="numpy")
    assert all(ds[i][0].shape == (16, 24, 3) for i in range(len(ds)))
    m = open_reader(out).manifest
    assert m.created_by["options"]["resize"] == {"size": [24, 16], "fit": "pad", "upscale": False,
                                                 "format": "keep", "quality": 70}
    for args, msg in [(["--fit", "pad"], "need --short-side"), (["--short-side", "0"], "--short-side must be"),
                      (["--size", "big"], "WIDTHxHEIGHT")]:
        r = CliRunner().invoke(main, [CLI_COMMAND[name], str(image_folder), str(tmp_path / "x"), *args])
        assert r.exit_code == 2 and msg in r.output, r.output  # refused before any work
        assert not (tmp_path / "x").exists()


def test_without_resize_the_manifest_is_unchanged(image_folder, tmp_path):
    pack_images(image_folder, tmp_path / "o", format="lmdb", run_options=RunOptions(workers=0))
    assert "resize" not in open_reader(tmp_path / "o").manifest.created_by["options"]


def test_small_images_are_packed_as_they_are(image_folder, tmp_path):
    out = tmp_path / "o"
    pack_images(image_folder, out, format="lmdb", resize=ResizeSpec(short_side=4000),
                run_options=RunOptions(workers=0))
    ds = PackedDataset(out, decode="bytes")
    files = sorted(image_folder.rglob("*.jpg"), key=lambda p: (p.parent.name, p.name))
    assert [ds[i][0] for i in range(len(ds))] == [p.read_bytes() for p in files]


def test_fixture_images_pack_upright_with_failures(tmp_path):
    shutil.copytree(FIXTURE_IMAGES, tmp_path / "src" / "only")
    out = tmp_path / "fx.h5"
    report = pack_images(tmp_path / "src", out, format="hdf5", raw=True, resize=ResizeSpec(size=(32, 32)),
                         run_options=RunOptions(workers=0, max_failures=5))
    assert [f["key"] for f in report.failures] == ["only/pillow_truncated_jpeg.jpg"]
    ds = PackedDataset(out, decode="numpy")
    key = "only/pillow_hopper_orientation_6.jpg"
    rot, _ = ds[ds.keys.index(key)]
    ref, _ = ds[ds.keys.index("only/pillow_hopper.jpg")]
    assert np.abs(rot.astype(int) - ref.astype(int)).mean() < 12  # upright: looks like the upright hopper
    assert np.abs(np.rot90(rot).astype(int) - ref.astype(int)).mean() > 20

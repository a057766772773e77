"""``to-lmdb|to-hdf5|to-records --coco/--manifest``: each the same as one ``packer.pack`` call."""
from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image
from click.testing import CliRunner

import packer
from packer.cli import main
from packer.formats import FORMATS
from tests.support.coco import BOX_IMAGES, make_coco, pack_box_coco
from tests.support.outputs import packed_snapshot

pytest.importorskip("pycocotools")

COMMANDS = {"lmdb": "to-lmdb", "hdf5": "to-hdf5", "records": "to-records"}


def _out(tmp_path, fmt, name):
    return tmp_path / (f"{name}.h5" if FORMATS[fmt][0].single_file else name)


@pytest.fixture(scope="module")
def coco_src(tmp_path_factory):
    root = tmp_path_factory.mktemp("coco")
    return {"root": root, **make_coco(root, n_images=4)}


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_coco_flag_is_the_library_call(coco_src, tmp_path, fmt):
    cli_out, lib_out = _out(tmp_path, fmt, "cli"), _out(tmp_path, fmt, "lib")
    r = CliRunner().invoke(main, [COMMANDS[fmt], "--coco", str(coco_src["instances"]), "--root",
                                  str(coco_src["root"]), "--workers", "0", str(cli_out)])
    assert r.exit_code == 0, r.output
    packer.pack(coco_src["root"], lib_out, format=fmt, coco=coco_src["instances"], workers=0)
    assert packed_snapshot(cli_out) == packed_snapshot(lib_out)


def test_drop_empty_and_short_side_flags(coco_src, tmp_path):
    r = CliRunner().invoke(main, ["to-lmdb", "--coco", str(coco_src["instances"]), "--root", str(coco_src["root"]),
                                  "--drop-empty", "--short-side", "24", "--workers", "0", str(tmp_path / "o")])
    assert r.exit_code == 0, r.output
    ds = packer.PackedDataset(tmp_path / "o", decode="numpy", fields=["image", "boxes"])
    assert len(ds) == 3 and all(min(s["image"].shape[:2]) == 24 and len(s["boxes"]) for s in ds)


def test_manifest_and_schema_flags(tmp_path):
    from PIL import Image

    for i in range(3):
        Image.new("RGB", (8, 6), (i, 0, 0)).save(tmp_path / f"p{i}.png")
    rows = [{"image": f"p{i}.png", "y": str(i), "v": json.dumps([0.5] * i)} for i in range(3)]
    (tmp_path / "s.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = CliRunner().invoke(main, ["to-records", "--manifest", str(tmp_path / "s.jsonl"), "--root", str(tmp_path),
                                  "--schema", "y=str", "--schema", "v=json", "--workers", "0", str(tmp_path / "o")])
    assert r.exit_code == 0, r.output
    ds = packer.PackedDataset(tmp_path / "o", decode="bytes", fields=["y", "v"])
    assert [s["y"] for s in ds] == ["0", "1", "2"] and ds[2]["v"] == json.dumps([0.5, 0.5])


@pytest.mark.parametrize("args, message", [
    (["--schema", "y"], "NAME=TYPE"),
    (["--schema", "y=tensor"], "unknown type"),
])
def test_bad_flags_are_one_line_errors(tmp_path, args, message):
    (tmp_path / "s.jsonl").write_text('{"y": 1}\n')
    r = CliRunner().invoke(main, ["to-lmdb", "--manifest", str(tmp_path / "s.jsonl"), "--root", str(tmp_path),
                                  *args, str(tmp_path / "o")])
    assert r.exit_code != 0 and message in r.output


def test_inspect_grid_box_flags_are_the_library_call(tmp_path):
    out = pack_box_coco(tmp_path)
    for flags, kw in ((["--grid-labels"], {"grid_labels": True}), (["--no-grid-boxes"], {"grid_boxes": False})):
        r = CliRunner().invoke(main, ["inspect", str(out), "--grid", str(tmp_path / "cli.png"), *flags])
        assert r.exit_code == 0, r.output
        info = packer.inspect(out, grid=tmp_path / "lib.png", **kw)
        assert info["grid"]["positions"] == list(range(len(BOX_IMAGES)))
        assert np.array_equal(np.asarray(Image.open(tmp_path / "lib.png")), np.asarray(Image.open(tmp_path / "cli.png")))


def test_coco_flag_packs_keypoints_as_the_library_call_and_inspect_shows_their_names(tmp_path):
    from packer.synth import COCO_KEYPOINTS, write_coco

    path = write_coco(tmp_path, images=5, annotations=12, size=(32, 40), keypoints=17, seed=3)
    r = CliRunner().invoke(main, ["to-lmdb", "--coco", str(path), "--root", str(tmp_path), "--short-side", "20",
                                  "--workers", "0", str(tmp_path / "cli")])
    assert r.exit_code == 0, r.output
    packer.pack(tmp_path, tmp_path / "lib", coco=path, resize=packer.ResizeSpec(short_side=20), workers=0)
    assert packed_snapshot(tmp_path / "cli") == packed_snapshot(tmp_path / "lib")
    r = CliRunner().invoke(main, ["inspect", str(tmp_path / "cli"), "--show", "1"])
    assert r.exit_code == 0, r.output
    assert "keypoints:ndarray:float32:*,17,3, num_keypoints:ndarray:int64:*" in r.output
    assert "COCO instances categories (label=id name): 0=1 person" in r.output
    assert f"keypoints of label 0 (17, skeleton of 19 edges): {', '.join(COCO_KEYPOINTS)}" in r.output
    info = json.loads(CliRunner().invoke(main, ["inspect", str(tmp_path / "cli"), "--json"]).output)
    assert info["categories"][0]["keypoints"] == list(COCO_KEYPOINTS) and len(info["categories"][0]["skeleton"]) == 19

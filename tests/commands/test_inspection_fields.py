"""``packer inspect`` and ``packer verify`` on field packs, in every format: inspect shows the
schema, a COCO pack's category map and each shown sample's fields; verify decodes every field of
every sample and names the sample whose field does not decode, though its checksum holds."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import packer
from packer.cli import main
from packer.codecs.fields import BLOB_FMT, Schema, encode_blob
from packer.formats import FORMATS, writer_class
from packer.formats.sample import Sample
from packer.synth import jpeg_bytes

import numpy as np

ALL = sorted(FORMATS)


def _out(tmp_path, fmt, name):
    return tmp_path / (f"{name}.h5" if FORMATS[fmt][0].single_file else name)


@pytest.fixture(scope="module")
def coco_packs(tmp_path_factory):
    pytest.importorskip("pycocotools")
    from tests.support.coco import make_coco

    root = tmp_path_factory.mktemp("coco")
    src = make_coco(root, n_images=4, captions=True)
    outs = {fmt: _out(root, fmt, f"packed-{fmt}") for fmt in ALL}
    for fmt, out in outs.items():
        packer.pack(root, out, format=fmt, coco=src["instances"], workers=0)
    captions = root / "captions"
    packer.pack(root, captions, coco=src["captions"], workers=0)
    return {**outs, "captions": captions}


@pytest.mark.parametrize("fmt", ALL)
def test_inspect_shows_the_schema_the_category_map_and_the_fields(coco_packs, fmt):
    r = CliRunner().invoke(main, ["inspect", str(coco_packs[fmt]), "--show", "2"])
    assert r.exit_code == 0, r.output
    assert ("fields: image:image, image_id:int, boxes:ndarray:float32:*,4, labels:ndarray:int64:*, "
            "category_ids:ndarray:int64:*, iscrowd:ndarray:uint8:*, area:ndarray:float32:*, "
            "annotation_ids:ndarray:int64:*, masks:segmentation, orig_size:ndarray:int64:2") in r.output
    assert "COCO instances categories (label=id name): 0=1 cat1, 1=3 cat3, 2=7 cat7, 3=18 cat18" in r.output
    assert "  [0] images/img_000.jpg" in r.output
    assert "image=jpeg, " in r.output and "image_id=1000  boxes=float32[3, 4]" in r.output and "masks=3 masks" in r.output
    info = json.loads(CliRunner().invoke(main, ["inspect", str(coco_packs[fmt]), "--json"]).output)
    assert info["fields"]["boxes"] == "ndarray:float32:*,4" and info["coco_kind"] == "instances"
    assert info["categories"][2] == {"label": 2, "id": 7, "name": "cat7"}
    assert info["samples"][1]["fields"]["orig_size"] == "int64[2]"


def test_inspect_of_a_captions_pack_shows_the_captions(coco_packs):
    r = CliRunner().invoke(main, ["inspect", str(coco_packs["captions"]), "--show", "1"])
    assert r.exit_code == 0, r.output
    assert "fields: image:image, image_id:int, captions:json" in r.output and "categories" not in r.output
    assert "captions=['a picture number 0 ünïcode', 'secon..." in r.output


@pytest.mark.parametrize("fmt", ALL)
def test_verify_checks_every_sample_of_a_field_pack(coco_packs, fmt):
    r = CliRunner().invoke(main, ["verify", str(coco_packs[fmt])])
    assert r.exit_code == 0 and "OK (4 samples checked)" in r.output, r.output


SCHEMA = Schema({"image": "image", "masks": "rle", "n": "int"})
GOOD = {"image": jpeg_bytes(np.full((6, 8, 3), 90, np.uint8)), "masks": [], "n": 1}


def _pack_with_bad_field(out, fmt, bad: str):
    """Three samples; the middle one's field ``bad`` is stored under a good checksum but does not
    decode (an image field of other bytes, an RLE field that is not a list)."""
    parts = {"image": b"not an image at all", "masks": b'{"size": [1, 1]}'}
    w = writer_class(fmt)(out, classes=[])
    w.schema = SCHEMA
    with w:
        for i in range(3):
            blob = SCHEMA.encode(GOOD)
            if i == 1:
                pieces = SCHEMA.split(blob)
                blob = encode_blob([parts[n] if n == bad else bytes(p) for n, p in pieces.items()])
            w.add(Sample(f"s{i}", blob, BLOB_FMT, -1, 6, 8, 3))
        w.close()


@pytest.mark.parametrize("bad", ["image", "masks"])
@pytest.mark.parametrize("fmt", ALL)
def test_verify_names_a_sample_whose_field_does_not_decode(tmp_path, fmt, bad):
    out = _out(tmp_path, fmt, "bad")
    _pack_with_bad_field(out, fmt, bad)
    r = CliRunner().invoke(main, ["verify", str(out)])
    assert r.exit_code == 1, r.output
    assert "sample 1" in r.output and "s1" in r.output and "s0" not in r.output and "s2" not in r.output
    assert ("undecodable" if bad == "image" else "malformed RLE") in r.output
    no_decode = CliRunner().invoke(main, ["verify", "--no-decode", str(out)])
    assert (no_decode.exit_code == 0) == (bad == "image"), no_decode.output  # fields decode, images not

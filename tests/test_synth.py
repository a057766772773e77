"""``packer.synth.write_coco``: a COCO-shaped instances file pycocotools reads as COCO's own."""
from __future__ import annotations

import json

import numpy as np
import pytest

from packer.synth import rle_string, write_coco

COCO = pytest.importorskip("pycocotools.coco").COCO
mask_util = pytest.importorskip("pycocotools.mask")


def test_write_coco_is_read_by_pycocotools(tmp_path):
    path = write_coco(tmp_path, images=30, annotations=200, size=(24, 32), crowd=0.1, compressed=0.1, seed=1)
    data = json.loads(path.read_text())
    assert list(data) == ["info", "licenses", "images", "annotations", "categories"]  # COCO's order
    assert len(data["images"]) == 30 and len(data["annotations"]) == 200 and len(data["categories"]) == 80
    coco = COCO(str(path))
    kinds = set()
    for a in data["annotations"]:
        m = coco.annToMask(a)
        x, y, w, h = a["bbox"]
        assert m.shape == (24, 32) and 0 <= x and 0 <= y and x + w <= 32 and y + h <= 24
        seg = a["segmentation"]
        kinds.add("poly" if isinstance(seg, list) else type(seg["counts"]).__name__)
        if isinstance(seg, dict) and isinstance(seg["counts"], str):  # compressed as pycocotools does
            assert mask_util.encode(np.asfortranarray(m))["counts"].decode() == seg["counts"]
    assert kinds == {"poly", "list", "str"}
    for im in data["images"]:
        assert (tmp_path / im["file_name"]).is_file()
    assert len({a["image_id"] for a in data["annotations"]}) < 30  # some images have none


@pytest.mark.parametrize("counts", [[0, 5], [3, 4, 5, 6, 1000, 2, 70000], [12]])
def test_rle_string_is_pycocotools_compression(counts):
    h, w = 1, sum(counts)
    assert mask_util.frPyObjects({"size": [h, w], "counts": counts}, h, w)["counts"].decode() == rle_string(counts)

"""``packer.synth.write_coco``: a COCO-shaped instances file pycocotools reads as COCO's own."""
from __future__ import annotations

import json

import numpy as np
import pytest

from packer.synth import COCO_KEYPOINTS, COCO_SKELETON, rle_string, write_coco

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


def test_write_coco_keypoints_is_a_person_keypoints_file(tmp_path):
    path = write_coco(tmp_path, images=12, annotations=60, size=(24, 32), crowd=0.1, seed=2, write_images=False,
                      keypoints=17)
    coco = COCO(str(path))
    (person,) = coco.loadCats(coco.getCatIds())
    assert person["name"] == "person" and person["keypoints"] == list(COCO_KEYPOINTS)
    assert person["skeleton"] == [list(e) for e in COCO_SKELETON]
    seen = set()
    for a in coco.loadAnns(coco.getAnnIds()):
        kp = np.array(a["keypoints"]).reshape(17, 3)
        seen |= set(kp[:, 2].tolist())
        assert a["category_id"] == 1 and a["num_keypoints"] == np.count_nonzero(kp[:, 2])
        assert (kp[kp[:, 2] == 0] == 0).all()  # not labelled: (0, 0, 0), as COCO writes it
        x, y, w, h = a["bbox"]
        labelled = kp[kp[:, 2] > 0]
        assert ((labelled[:, 0] >= np.floor(x)) & (labelled[:, 0] <= x + w + 1) & (labelled[:, 1] >= np.floor(y))
                & (labelled[:, 1] <= y + h + 1)).all()
    assert seen == {0, 1, 2}
    other = json.loads(write_coco(tmp_path, images=3, annotations=5, write_images=False, keypoints=4,
                                  name="k4.json").read_text())["categories"]
    assert other[0]["keypoints"] == ["point 0", "point 1", "point 2", "point 3"]
    assert other[0]["skeleton"] == [[1, 2], [2, 3], [3, 4]]

"""COCO person keypoints packs end to end, in every format: each image's keypoints read back
equal to what pycocotools reads from the source (exactly; after ``--short-side``, the source
scaled with the image to float32 rounding), the keypoint names and skeleton kept with the
categories, workers and split runs giving the same pack, collate padding them."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import packer
from packer.formats import FORMATS
from packer.synth import COCO_KEYPOINTS, COCO_SKELETON, write_coco
from tests.support.outputs import packed_snapshot

COCO = pytest.importorskip("pycocotools.coco").COCO

ALL = sorted(FORMATS)
K = len(COCO_KEYPOINTS)


def out_path(tmp_path: Path, fmt: str, name: str = "out") -> Path:
    return tmp_path / (f"{name}.h5" if FORMATS[fmt][0].single_file else name)


@pytest.fixture(scope="module")
def kp_src(tmp_path_factory) -> dict[str, Path]:
    """A person keypoints file over real JPEGs (crowd regions with all-zero keypoints, images
    without annotations), plus a category that names no keypoints (its objects: K zeros) and a
    person without a ``keypoints`` member."""
    root = tmp_path_factory.mktemp("keypoints")
    path = write_coco(root, images=10, annotations=36, size=(40, 56), crowd=0.1, empty=0.2, keypoints=K, seed=5,
                      name="person_keypoints.json")
    data = json.loads(path.read_text())
    data["categories"].append({"supercategory": "thing", "id": 9, "name": "ball"})
    for a in data["annotations"][2::7]:
        a["category_id"] = 9
        del a["keypoints"], a["num_keypoints"]
    del data["annotations"][3]["keypoints"], data["annotations"][3]["num_keypoints"]
    path.write_text(json.dumps(data))
    return {"root": root, "file": path}


def _source(coco, img_id: int) -> tuple[np.ndarray, list[int]]:
    """The source keypoints ``(N, K, 3)`` float64 of an image's annotations as pycocotools reads
    them (zeros where an annotation has none) and their ids."""
    anns = coco.loadAnns(coco.getAnnIds(imgIds=img_id))
    kp = np.array([a.get("keypoints") or [0] * (3 * K) for a in anns], dtype=np.float64).reshape(-1, K, 3)
    return kp, [a["id"] for a in anns]


@pytest.mark.parametrize("fmt", ALL)
def test_keypoints_read_back_as_pycocotools_reads_the_source(kp_src, tmp_path, fmt):
    out = out_path(tmp_path, fmt)
    report = packer.pack(kp_src["root"], out, format=fmt, coco=kp_src["file"], workers=0)
    coco = COCO(str(kp_src["file"]))
    assert report.count == len(coco.imgs) and report.failed == 0
    ds = packer.PackedDataset(out, decode="bytes")
    assert ds.schema.by_name["keypoints"].spec() == f"ndarray:float32:*,{K},3"
    assert ds.classes == ["person", "ball"]
    assert ds.categories == [{"id": 1, "name": "person", "keypoints": list(COCO_KEYPOINTS),
                              "skeleton": [list(e) for e in COCO_SKELETON]}, {"id": 9, "name": "ball"}]
    assert ds.categories[0]["keypoints"] == coco.loadCats(1)[0]["keypoints"]
    labelled = unlabelled = 0
    for i, img in enumerate(json.loads(kp_src["file"].read_text())["images"]):
        s = ds[i]
        src, ids = _source(coco, img["id"])
        assert s["annotation_ids"].tolist() == ids
        assert s["keypoints"].dtype == np.float32 and s["keypoints"].shape == (len(ids), K, 3)
        np.testing.assert_array_equal(s["keypoints"], src)  # exactly (COCO's integer pixels)
        assert s["num_keypoints"].dtype == np.int64
        assert s["num_keypoints"].tolist() == np.count_nonzero(src[..., 2], axis=1).tolist()
        for a, n in zip(coco.loadAnns(ids), s["num_keypoints"].tolist()):
            assert n == a.get("num_keypoints", 0)
        labelled += int((src[..., 2] > 0).sum())
        unlabelled += int((src[..., 2] == 0).sum())
    assert labelled > 100 and unlabelled > 100
    if fmt == "hdf5":  # a dataset of its own: every sample's rows back to back
        import h5py

        with h5py.File(out, "r") as f:
            assert f["fields/keypoints"].shape == (sum(len(ds[i]["keypoints"]) for i in range(len(ds))), K, 3)


@pytest.mark.parametrize("fmt", ALL)
def test_short_side_scales_keypoints_as_it_scales_boxes(kp_src, tmp_path, fmt):
    out = out_path(tmp_path, fmt)
    packer.pack(kp_src["root"], out, format=fmt, coco=kp_src["file"], workers=0,
                resize=packer.ResizeSpec(short_side=24))
    coco = COCO(str(kp_src["file"]))
    ds = packer.PackedDataset(out, decode="numpy")
    for i, img in enumerate(json.loads(kp_src["file"].read_text())["images"]):
        s = ds[i]
        h, w = s["image"].shape[:2]
        assert min(h, w) == 24
        sx, sy = w / img["width"], h / img["height"]
        src, _ = _source(coco, img["id"])
        # docs/fields.md: the source times the scale, to float32 rounding; here exactly that float32
        np.testing.assert_allclose(s["keypoints"][..., :2], src[..., :2] * (sx, sy), rtol=1e-6, atol=1e-4)
        np.testing.assert_array_equal(s["keypoints"], (src * (sx, sy, 1.0)).astype(np.float32))
        np.testing.assert_array_equal(s["keypoints"][..., 2], src[..., 2])  # v unchanged
        assert not s["keypoints"][src[..., 2] == 0].any()  # a point not labelled stays (0, 0, 0)
        np.testing.assert_array_equal(s["num_keypoints"], np.count_nonzero(src[..., 2], axis=1))


@pytest.mark.parametrize("fmt", ALL)
def test_workers_and_split_runs_give_the_same_keypoints_pack(kp_src, tmp_path, fmt):
    whole = out_path(tmp_path, fmt, "whole")
    packer.pack(kp_src["root"], whole, format=fmt, coco=kp_src["file"], workers=0)
    workers = out_path(tmp_path, fmt, "workers")
    packer.pack(kp_src["root"], workers, format=fmt, coco=kp_src["file"], workers=2)
    parts = [out_path(tmp_path, fmt, f"part{k}") for k in range(2)]
    for k, part in enumerate(parts):
        packer.pack(kp_src["root"], part, format=fmt, coco=kp_src["file"], workers=0, num_shards=2, shard_index=k)
    merged = out_path(tmp_path, fmt, "merged")
    packer.merge(parts, merged)
    assert packed_snapshot(whole) == packed_snapshot(workers) == packed_snapshot(merged)
    assert packer.PackedDataset(merged).categories == packer.PackedDataset(whole).categories


def test_collate_pads_keypoints_with_their_count(kp_src, tmp_path):
    out = out_path(tmp_path, "lmdb")
    packer.pack(kp_src["root"], out, coco=kp_src["file"], workers=0)
    ds = packer.PackedDataset(out, decode="tensor", fields=["keypoints", "num_keypoints"])
    assert set(ds.variable_fields) == {"keypoints", "num_keypoints"}
    samples = [ds[i] for i in range(len(ds))]
    n = [len(s["keypoints"]) for s in samples]
    batch = ds.collate_fn(pad=True)(samples)
    assert batch["keypoints"].shape == (len(ds), max(n), K, 3) and batch["keypoints_count"].tolist() == n
    assert batch["num_keypoints"].shape == (len(ds), max(n))
    for i, s in enumerate(samples):
        np.testing.assert_array_equal(batch["keypoints"][i, :n[i]].numpy(), s["keypoints"])
        assert not batch["keypoints"][i, n[i]:].any()
    listed = ds.collate_fn()(samples)
    assert all(np.array_equal(a, s["keypoints"]) for a, s in zip(listed["keypoints"], samples))

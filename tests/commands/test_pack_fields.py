"""Field packs end to end, in every format: a COCO file read back equal to pycocotools over
the source images, captions and manifests round-tripping exactly, resize geometry, verify,
resume after a kill, split runs and merge."""
from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import packer
from packer.commands.inspection import verify_dataset
from packer.errors import ResumeRefused, UsageError
from packer.formats import FORMATS, open_reader
from tests.support.coco import make_coco
from tests.support.killing import run_packer
from tests.support.outputs import packed_snapshot

COCO = pytest.importorskip("pycocotools.coco").COCO
mask_util = pytest.importorskip("pycocotools.mask")

ALL = sorted(FORMATS)


def out_path(tmp_path: Path, fmt: str, name: str = "out") -> Path:
    return tmp_path / (f"{name}.h5" if FORMATS[fmt][0].single_file else name)


@pytest.fixture(scope="module")
def coco_src(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("coco")
    return {"root": root, **make_coco(root, n_images=8, captions=True)}


def _expected(coco, img_id: int):
    anns = coco.loadAnns(coco.getAnnIds(imgIds=img_id))
    cat_ids = sorted(coco.getCatIds())
    xywh = np.array([a["bbox"] for a in anns], dtype=np.float64).reshape(-1, 4)
    info = coco.loadImgs(img_id)[0]
    masks = (np.stack([coco.annToMask(a) for a in anns]) if anns
             else np.zeros((0, info["height"], info["width"]), np.uint8))
    return {"xywh": xywh, "xyxy": np.concatenate([xywh[:, :2], xywh[:, :2] + xywh[:, 2:]], axis=1),
            "labels": [cat_ids.index(a["category_id"]) for a in anns], "iscrowd": [a["iscrowd"] for a in anns],
            "ids": [a["id"] for a in anns], "masks": masks, "info": info}


@pytest.mark.parametrize("fmt", ALL)
def test_a_coco_pack_reads_back_as_pycocotools_reads_the_source(coco_src, tmp_path, fmt):
    out = out_path(tmp_path, fmt)
    report = packer.pack(coco_src["root"], out, format=fmt, coco=coco_src["instances"], workers=0)
    coco = COCO(str(coco_src["instances"]))
    assert report.count == len(coco.imgs) and report.failed == 0  # images without annotations kept
    ds = packer.PackedDataset(out, decode="numpy", masks="decode")
    assert ds.classes == [c["name"] for c in coco.loadCats(sorted(coco.getCatIds()))]
    assert ds.manifest.extra["coco"]["categories"] == [{"id": c, "name": f"cat{c}"} for c in sorted(coco.getCatIds())]
    rle = packer.PackedDataset(out, decode="bytes", fields=["masks", "image_id"])
    empty = 0
    for i, img_id in enumerate(json.loads(coco_src["instances"].read_text())["images"]):
        img_id = img_id["id"]
        s, want = ds[i], _expected(coco, img_id)
        assert ds.keys[i] == want["info"]["file_name"] and s["image_id"] == img_id
        src = np.asarray(Image.open(coco_src["root"] / want["info"]["file_name"]).convert("RGB"))
        np.testing.assert_array_equal(s["image"], src)
        assert s["boxes"].dtype == np.float32 and s["boxes"].shape == want["xyxy"].shape
        np.testing.assert_allclose(s["boxes"], want["xyxy"], rtol=1e-6, atol=1e-4)  # float32 of the source
        xywh = np.concatenate([s["boxes"][:, :2], s["boxes"][:, 2:] - s["boxes"][:, :2]], axis=1)
        np.testing.assert_allclose(xywh, want["xywh"], rtol=1e-6, atol=1e-4)
        assert s["labels"].dtype == np.int64 and s["labels"].tolist() == want["labels"]
        assert s["iscrowd"].tolist() == want["iscrowd"] and s["annotation_ids"].tolist() == want["ids"]
        assert s["masks"].dtype == np.uint8 and s["masks"].shape == want["masks"].shape
        np.testing.assert_array_equal(s["masks"], want["masks"])
        rles = rle[i]["masks"]
        assert all(isinstance(r["counts"], str) for r in rles)
        if rles:
            np.testing.assert_array_equal(np.transpose(mask_util.decode(rles), (2, 0, 1)), want["masks"])
        empty += not want["ids"]
    assert empty == 2
    assert verify_dataset(out).ok


def test_drop_empty_leaves_out_images_without_annotations(coco_src, tmp_path):
    out = out_path(tmp_path, "lmdb")
    report = packer.pack(coco_src["root"], out, coco=coco_src["instances"], drop_empty=True, workers=0)
    assert report.count == 6 and report.failed == 0
    assert all(len(s["boxes"]) for s in packer.PackedDataset(out, decode="bytes", fields=["boxes"]))


@pytest.mark.parametrize("fmt", ALL)
def test_short_side_scales_boxes_and_masks_with_the_image(coco_src, tmp_path, fmt):
    import cv2

    out = out_path(tmp_path, fmt)
    packer.pack(coco_src["root"], out, format=fmt, coco=coco_src["instances"], workers=0,
                resize=packer.ResizeSpec(short_side=32))
    coco = COCO(str(coco_src["instances"]))
    ds = packer.PackedDataset(out, decode="numpy", masks="decode")
    for i, img in enumerate(json.loads(coco_src["instances"].read_text())["images"]):
        s, want = ds[i], _expected(coco, img["id"])
        h, w = s["image"].shape[:2]
        assert min(h, w) == 32 and s["orig_size"].tolist() == [img["height"], img["width"]]
        sx, sy = w / img["width"], h / img["height"]
        np.testing.assert_allclose(s["boxes"], want["xyxy"] * (sx, sy, sx, sy), rtol=1e-6, atol=1e-4)
        assert s["masks"].shape == (len(want["ids"]), h, w)
        for got, src in zip(s["masks"], want["masks"]):  # docs/fields.md: IoU >= 0.75 against a nearest resize
            ref = cv2.resize(src, (w, h), interpolation=cv2.INTER_NEAREST)
            inter, union = np.logical_and(got, ref).sum(), np.logical_or(got, ref).sum()
            assert union == 0 or inter / union >= 0.75


@pytest.mark.parametrize("fmt", ALL)
@pytest.mark.parametrize("short_side", [None, 32])
def test_masks_as_stored_are_the_source_polygons_scaled(coco_src, tmp_path, fmt, short_side):
    """``masks="segmentation"``: each object's polygons as the file gave them, every coordinate
    times the stored size over the source size (float64), a compressed RLE as given where the
    image is not resized; ``rle()`` of them is what ``masks="rle"`` returns."""
    out = out_path(tmp_path, fmt)
    packer.pack(coco_src["root"], out, format=fmt, coco=coco_src["instances"], workers=0,
                resize=packer.ResizeSpec(short_side=short_side) if short_side else None)
    data = json.loads(coco_src["instances"].read_text())
    ds = packer.PackedDataset(out, decode="numpy", masks="segmentation")
    drawn = packer.PackedDataset(out, decode="bytes", fields=["masks"])
    polygons = 0
    for i, img in enumerate(data["images"]):
        s = ds[i]
        h, w = s["image"].shape[:2]
        sx, sy = w / img["width"], h / img["height"]
        seg = s["masks"]
        assert (seg.height, seg.width) == (h, w)
        anns = [a for a in data["annotations"] if a["image_id"] == img["id"]]
        assert len(seg) == len(anns)
        for obj, a in zip(seg.objects, anns):
            src = a["segmentation"]
            if isinstance(src, list) and src:
                polygons += 1
                want = [(np.asarray(p, dtype=np.float64).reshape(-1, 2) * (sx, sy)).ravel() for p in src]
                assert len(obj) == len(want) and all(np.array_equal(g, x) for g, x in zip(obj, want))
            elif isinstance(src, dict) and isinstance(src["counts"], str) and not short_side:
                assert obj == src["counts"]
        assert seg.rle() == drawn[i]["masks"]
    assert polygons > 5


@pytest.mark.parametrize("fmt", ALL)
def test_captions_round_trip(coco_src, tmp_path, fmt):
    out = out_path(tmp_path, fmt)
    packer.pack(coco_src["root"], out, format=fmt, coco=coco_src["captions"], workers=0)
    caps = json.loads(coco_src["captions"].read_text())
    ds = packer.PackedDataset(out, decode="bytes")
    for i, img in enumerate(caps["images"]):
        want = [a["caption"] for a in caps["annotations"] if a["image_id"] == img["id"]]
        assert ds[i]["captions"] == want and ds[i]["image_id"] == img["id"]
        assert ds[i]["image"] == (coco_src["root"] / img["file_name"]).read_bytes()


def _rows(root: Path, n: int = 7) -> list[dict]:
    rng = np.random.default_rng(5)
    rows = []
    for i in range(n):
        name = f"pics/p{i}.png"
        (root / "pics").mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 255, (9 + i, 11, 3), dtype=np.uint8)).save(root / name)
        rows.append({"image": name, "caption": f"caption {i} – ✓", "score": float(rng.normal()) / 3,
                     "count": int(rng.integers(-10**12, 10**12)),
                     "embedding": [float(v) for v in rng.normal(size=i)], "tags": list(range(i % 3))})
    return rows


@pytest.fixture(scope="module")
def manifests(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("manifest")
    rows = _rows(root)
    (root / "samples.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    with open(root / "samples.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        for r in rows:
            w.writerow({**r, "score": repr(r["score"]), "embedding": json.dumps(r["embedding"]),
                        "tags": json.dumps(r["tags"])})
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), root / "samples.parquet", row_group_size=3)
    return {"root": root, "rows": rows, "jsonl": root / "samples.jsonl", "csv": root / "samples.csv",
            "parquet": root / "samples.parquet"}


SCHEMA = {"image": "image", "caption": "str", "score": "float", "count": "int",
          "embedding": "ndarray:float64:*", "tags": "labels"}


@pytest.mark.parametrize("fmt", ALL)
@pytest.mark.parametrize("kind", ["jsonl", "csv", "parquet"])
def test_a_manifest_round_trips_exactly(manifests, tmp_path, fmt, kind):
    out = out_path(tmp_path, fmt)
    schema = SCHEMA if kind == "csv" else None  # inferred from JSON and Parquet; CSV given (tags stay labels)
    report = packer.pack(manifests["root"], out, format=fmt, manifest=manifests[kind], schema=schema, workers=0)
    assert report.count == len(manifests["rows"]) and report.failed == 0
    ds = packer.PackedDataset(out, decode="bytes")
    assert [f["name"] for f in ds.manifest.schema] == list(SCHEMA)
    for i, row in enumerate(manifests["rows"]):
        s = ds[i]
        assert s["image"] == (manifests["root"] / row["image"]).read_bytes()
        assert s["caption"] == row["caption"] and s["score"] == row["score"] and s["count"] == row["count"]
        assert s["tags"] == row["tags"]
        assert s["embedding"].dtype == np.float64 and s["embedding"].tolist() == row["embedding"]
    assert verify_dataset(out).ok


def test_an_inferred_schema_is_stored_in_the_manifest(manifests, tmp_path):
    out = out_path(tmp_path, "lmdb")
    packer.pack(manifests["root"], out, manifest=manifests["jsonl"], workers=0)
    m = open_reader(out).manifest
    assert m.schema == [{"name": "image", "type": "image"}, {"name": "caption", "type": "str"},
                        {"name": "score", "type": "float"}, {"name": "count", "type": "int"},
                        {"name": "embedding", "type": "ndarray", "dtype": "float64", "shape": [None]},
                        {"name": "tags", "type": "labels"}]  # typed by the first non-empty list
    assert m.fields == list(SCHEMA) + ["key"]


@pytest.mark.parametrize("fmt", ALL)
def test_kill_and_resume_equals_an_uninterrupted_run(coco_src, tmp_path, fmt):
    flag = {"lmdb": "to-lmdb", "hdf5": "to-hdf5", "records": "to-records"}[fmt]
    args = [flag, "--coco", str(coco_src["instances"]), "--root", str(coco_src["root"]), "--workers", "0"]
    size = ["--samples-per-shard", "2"] if fmt == "records" else ["--commit-every", "2"]
    ref, out = out_path(tmp_path, fmt, "ref"), out_path(tmp_path, fmt, "resumed")
    assert run_packer(*args, *size, str(ref)).returncode == 0
    killed = run_packer(*args, *size, str(out), kill_at="add:5")
    assert killed.returncode != 0 and not out.exists()
    resumed = run_packer(*args, *size, "--resume", str(out))
    assert resumed.returncode == 0, resumed.stderr
    assert packed_snapshot(out) == packed_snapshot(ref)
    again = run_packer(*args, *size, "--resume", str(out))
    assert again.returncode == 0 and "complete and verified" in again.stdout


def test_a_resume_refuses_a_changed_annotation_file(coco_src, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(coco_src["root"], src)
    out = out_path(tmp_path, "lmdb")
    packer.pack(src, out, coco=src / "instances.json", workers=0)
    data = json.loads((src / "instances.json").read_text())
    data["annotations"][0]["bbox"][0] += 1
    (src / "instances.json").write_text(json.dumps(data))
    with pytest.raises(ResumeRefused, match="source.sha256"):
        packer.pack(src, out, coco=src / "instances.json", workers=0, resume=True)


@pytest.mark.parametrize("fmt", ALL)
def test_split_runs_merge_into_the_single_run(coco_src, tmp_path, fmt):
    whole = out_path(tmp_path, fmt, "whole")
    packer.pack(coco_src["root"], whole, format=fmt, coco=coco_src["instances"], workers=0)
    parts = [out_path(tmp_path, fmt, f"part{k}") for k in range(2)]
    for k, part in enumerate(parts):
        packer.pack(coco_src["root"], part, format=fmt, coco=coco_src["instances"], workers=0,
                    num_shards=2, shard_index=k)
    merged = out_path(tmp_path, fmt, "merged")
    packer.merge(parts, merged)
    a, b = packed_snapshot(whole), packed_snapshot(merged)
    assert a == b
    assert open_reader(merged).manifest.schema == open_reader(whole).manifest.schema


@pytest.mark.parametrize("fmt", ALL)
def test_workers_and_commits_give_the_same_output(coco_src, tmp_path, fmt):
    a, b = out_path(tmp_path, fmt, "a"), out_path(tmp_path, fmt, "b")
    packer.pack(coco_src["root"], a, format=fmt, coco=coco_src["instances"], workers=0)
    packer.pack(coco_src["root"], b, format=fmt, coco=coco_src["instances"], workers=2, commit_every=3)
    assert packed_snapshot(a) == packed_snapshot(b)


@pytest.mark.parametrize("fmt, plan", [("lmdb", "shm"), ("records", "sharded"), ("hdf5", "pool")])
def test_workers_give_the_same_output_on_the_image_packs_plans(coco_src, tmp_path, caplog, fmt, plan):
    a, b = out_path(tmp_path, fmt, "a"), out_path(tmp_path, fmt, "b")
    packer.pack(coco_src["root"], a, format=fmt, coco=coco_src["instances"], workers=0)
    with caplog.at_level("INFO", logger="packer.commands.pack_fields"):
        packer.pack(coco_src["root"], b, format=fmt, coco=coco_src["instances"], workers=2, check="header")
    assert f"to-{fmt}: {plan} (" in caplog.text
    assert packed_snapshot(a) == packed_snapshot(b)


def test_sources_exclude_each_other_and_image_options(coco_src, manifests, tmp_path):
    with pytest.raises(UsageError, match="exactly one"):
        packer.pack(coco_src["root"], tmp_path / "o", coco=coco_src["instances"], manifest=manifests["jsonl"])
    with pytest.raises(UsageError, match="do not apply"):
        packer.pack(coco_src["root"], tmp_path / "o", coco=coco_src["instances"], shuffle=1)
    with pytest.raises(UsageError, match="crop or pad"):
        packer.pack(coco_src["root"], tmp_path / "o", coco=coco_src["instances"],
                    resize=packer.ResizeSpec(size=(32, 32)))
    with pytest.raises(UsageError, match="coco= or manifest="):
        packer.pack(coco_src["root"], tmp_path / "o", drop_empty=True)

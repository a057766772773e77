"""TensorFlow reads a field pack's records: ``tf.io.parse_single_example`` with the feature spec
docs/fields.md gives returns every field exactly, and the Object Detection API's features."""
from __future__ import annotations

import json

import numpy as np
import pytest

import packer
from packer.codecs.fields import Segmentation
from tests.support.coco import make_coco

tf = pytest.importorskip("tensorflow")  # not in the test extra (its wheel is ~270 MB); skips without it
pytest.importorskip("pycocotools")


def test_tensorflow_parses_every_field_exactly(tmp_path):
    src = make_coco(tmp_path, n_images=4)
    out = tmp_path / "out"
    packer.pack(tmp_path, out, format="records", coco=src["instances"], workers=0)
    spec = {"image/encoded": tf.io.FixedLenFeature([], tf.string),
            "image/height": tf.io.FixedLenFeature([], tf.int64),
            "image/width": tf.io.FixedLenFeature([], tf.int64),
            "image_id": tf.io.FixedLenFeature([], tf.int64),
            "boxes": tf.io.FixedLenFeature([], tf.string), "labels": tf.io.FixedLenFeature([], tf.string),
            "iscrowd": tf.io.FixedLenFeature([], tf.string), "masks": tf.io.FixedLenFeature([], tf.string),
            "image/object/bbox/xmin": tf.io.VarLenFeature(tf.float32),
            "image/object/bbox/ymax": tf.io.VarLenFeature(tf.float32),
            "image/object/class/label": tf.io.VarLenFeature(tf.int64),
            "image/object/is_crowd": tf.io.VarLenFeature(tf.int64),
            "image/source_id": tf.io.FixedLenFeature([], tf.string)}
    ds = packer.PackedDataset(out, decode="bytes")
    files = sorted(str(p) for p in out.glob("*.tfrecord"))
    n = 0
    for i, raw in enumerate(tf.data.TFRecordDataset(files)):
        got = tf.io.parse_single_example(raw, spec)
        want = ds[i]
        assert got["image/encoded"].numpy() == want["image"] and int(got["image_id"]) == want["image_id"]
        boxes = tf.reshape(tf.io.decode_raw(got["boxes"], tf.float32), (-1, 4)).numpy()
        np.testing.assert_array_equal(boxes, want["boxes"])
        np.testing.assert_array_equal(tf.io.decode_raw(got["labels"], tf.int64).numpy(), want["labels"])
        np.testing.assert_array_equal(tf.io.decode_raw(got["iscrowd"], tf.uint8).numpy(), want["iscrowd"])
        assert Segmentation.decode(got["masks"].numpy()).rle() == want["masks"]  # the documented layout
        w, h = int(got["image/width"]), int(got["image/height"])
        np.testing.assert_allclose(tf.sparse.to_dense(got["image/object/bbox/xmin"]).numpy() * w,
                                   want["boxes"][:, 0], rtol=1e-5)
        np.testing.assert_allclose(tf.sparse.to_dense(got["image/object/bbox/ymax"]).numpy() * h,
                                   want["boxes"][:, 3], rtol=1e-5)
        assert tf.sparse.to_dense(got["image/object/class/label"]).numpy().tolist() == want["category_ids"].tolist()
        assert tf.sparse.to_dense(got["image/object/is_crowd"]).numpy().tolist() == want["iscrowd"].tolist()
        assert got["image/source_id"].numpy() == str(want["image_id"]).encode()
        n += 1
    assert n == len(ds)


def test_tensorflow_parses_a_caption_manifest_with_a_variable_float_array(tmp_path):
    from packer.synth import jpeg_bytes, natural_image

    rng = np.random.default_rng(0)
    rows = []
    for i in range(5):
        (tmp_path / f"im{i}.jpg").write_bytes(jpeg_bytes(natural_image(rng, 24, 32)))
        rows.append({"image": f"im{i}.jpg", "caption": f"a caption, number {i} \u00e9",
                     "scores": [float(x) for x in rng.normal(size=i)], "label": i})
    manifest = tmp_path / "rows.jsonl"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    packer.pack(tmp_path, out, format="records", manifest=manifest,
                schema={"image": "image", "caption": "str", "scores": "ndarray:float64:*", "label": "int"}, workers=0)
    spec = {"image/encoded": tf.io.FixedLenFeature([], tf.string), "caption": tf.io.FixedLenFeature([], tf.string),
            "scores": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64)}
    files = sorted(str(p) for p in out.glob("*.tfrecord"))
    got = [tf.io.parse_single_example(raw, spec) for raw in tf.data.TFRecordDataset(files)]
    assert len(got) == len(rows)
    for g, row in zip(got, rows):
        assert g["image/encoded"].numpy() == (tmp_path / row["image"]).read_bytes()
        assert g["caption"].numpy().decode("utf-8") == row["caption"]
        assert tf.io.decode_raw(g["scores"], tf.float64).numpy().tolist() == row["scores"]
        assert int(g["label"]) == row["label"]


def test_tensorflow_parses_keypoints_as_the_object_detection_api_does(tmp_path):
    """The exact ``keypoints`` field, and the Object Detection API's keypoint features
    (``TfExampleDecoder(num_keypoints=K)`` reads x, y and visibility and reshapes them to
    ``(N, K)``): normalized by the stored size, each object's K points in turn."""
    from packer.synth import write_coco

    path = write_coco(tmp_path, images=6, annotations=20, size=(40, 56), crowd=0.1, keypoints=17, seed=4)
    out = tmp_path / "out"
    packer.pack(tmp_path, out, format="records", coco=path, workers=0)
    spec = {"keypoints": tf.io.FixedLenFeature([], tf.string),
            "num_keypoints": tf.io.FixedLenFeature([], tf.string),
            "image/width": tf.io.FixedLenFeature([], tf.int64), "image/height": tf.io.FixedLenFeature([], tf.int64),
            "image/object/keypoint/x": tf.io.VarLenFeature(tf.float32),
            "image/object/keypoint/y": tf.io.VarLenFeature(tf.float32),
            "image/object/keypoint/visibility": tf.io.VarLenFeature(tf.int64),
            "image/object/keypoint/num": tf.io.VarLenFeature(tf.int64)}
    ds = packer.PackedDataset(out, decode="bytes", fields=["keypoints", "num_keypoints"])
    files = sorted(str(p) for p in out.glob("*.tfrecord"))
    n = labelled = 0
    for i, raw in enumerate(tf.data.TFRecordDataset(files)):
        got, want = tf.io.parse_single_example(raw, spec), ds[i]
        kp = tf.reshape(tf.io.decode_raw(got["keypoints"], tf.float32), (-1, 17, 3)).numpy()
        np.testing.assert_array_equal(kp, want["keypoints"])
        np.testing.assert_array_equal(tf.io.decode_raw(got["num_keypoints"], tf.int64).numpy(), want["num_keypoints"])
        w, h = int(got["image/width"]), int(got["image/height"])
        x = tf.reshape(tf.sparse.to_dense(got["image/object/keypoint/x"]), (-1, 17)).numpy()
        y = tf.reshape(tf.sparse.to_dense(got["image/object/keypoint/y"]), (-1, 17)).numpy()
        v = tf.reshape(tf.sparse.to_dense(got["image/object/keypoint/visibility"]), (-1, 17)).numpy()
        np.testing.assert_allclose(x * w, want["keypoints"][..., 0], rtol=1e-6, atol=1e-5)
        np.testing.assert_allclose(y * h, want["keypoints"][..., 1], rtol=1e-6, atol=1e-5)
        assert v.tolist() == want["keypoints"][..., 2].astype(np.int64).tolist()
        assert tf.sparse.to_dense(got["image/object/keypoint/num"]).numpy().tolist() == want["num_keypoints"].tolist()
        labelled += int(want["num_keypoints"].sum())
        n += 1
    assert n == len(ds) and labelled > 0

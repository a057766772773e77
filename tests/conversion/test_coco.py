"""``coco_items`` reads an annotation file streaming (one image or annotation decoded at a time,
its annotations kept as compact records) and gives exactly what ``json.load`` and grouping the
parsed lists gave: the same items in the same order, the same stored fields for each (at the
source size and resized), the same failures with the same reasons in the same order, whatever
the order of the file's members, its whitespace and the reading buffer's size.

The reference is the ``json.load``-based implementation as it was (``tests/support/coco_reference.py``).
"""
from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from packer.codecs import json_stream
from packer.codecs.fields import Segmentation
from packer.conversion import coco
from packer.conversion.inputs import FieldItem
from packer.errors import UsageError
from packer.synth import COCO_KEYPOINTS, COCO_SKELETON, rle_string, write_coco
from tests.support import coco_reference

mask_util = pytest.importorskip("pycocotools.mask")


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> dict:
    """A generated instances file (polygons, crowd and compressed RLE, empty images) as parsed."""
    path = write_coco(tmp_path_factory.mktemp("synth"), images=40, annotations=260, size=(30, 40), crowd=0.05,
                      compressed=0.05, empty=0.15, write_images=False, seed=3)
    return json.loads(path.read_text())


def _anns_of(data: dict, image_index: int) -> list[dict]:
    iid = data["images"][image_index]["id"]
    return [a for a in data["annotations"] if isinstance(a, dict) and a.get("image_id") == iid]


def _bad(data: dict) -> None:
    """Every kind of bad image and annotation, alone and several on one image."""
    images, anns = data["images"], data["annotations"]
    annotated = [k for k in range(len(images)) if len(_anns_of(data, k)) >= 2]
    a = lambda k, j=0: _anns_of(data, annotated[k])[j]  # noqa: E731
    images.append({"id": 77, "file_name": "no-size.jpg"})  # malformed image
    images.append({**images[0]})  # a repeated image id (its annotations go to the first)
    images.append({"id": 78, "file_name": "../outside.jpg", "height": 30, "width": 40})  # unsafe path
    images.append({"id": 79, "file_name": "fine/empty.jpg", "height": 30, "width": 40})  # no annotations
    anns.append({"id": 9001, "image_id": 424242, "category_id": 1, "bbox": [1, 1, 2, 2]})  # unknown image
    anns.append({"id": 9002, "image_id": 77, "category_id": 1, "bbox": [1, 1, 2, 2]})  # its image was malformed
    anns.append("not an annotation")
    anns.append({"id": "9003", "image_id": images[1]["id"]})  # a string id
    anns.insert(5, {"id": 9004, "image_id": images[2]["id"], "category_id": 1, "bbox": [1, 1, 2, 2], "iscrowd": 0,
                    "segmentation": [[1, 1, 5, 1, 3, 4]], "area": 3})  # ints everywhere: fine
    a(1)["category_id"] = 999
    a(2, 0)["bbox"] = [35, 2.5, 10, 3]  # outside (ints in the reason as written)
    a(3)["bbox"] = [1.0, 2.0, -1.0, 3.0]
    a(4)["bbox"] = [1.0, 2.0, True, 3.0]
    a(5)["bbox"] = "1 2 3 4"
    a(6)["iscrowd"] = 2
    a(7)["area"] = -1.5
    a(8)["area"] = "12"
    a(9)["segmentation"] = [[1.0, 1.0, 5.0, 5.0]]
    a(10)["segmentation"] = [[1.0, 1.0, 5.0, 5.0, 3.0]]
    a(11)["segmentation"] = [[1.0, "1", 5.0, 5.0, 3.0, 4.0]]
    a(12)["segmentation"] = 7
    a(13)["segmentation"] = {"size": [30, 40], "counts": [5, 10]}  # runs do not cover the image
    a(14)["segmentation"] = {"size": [4, 4], "counts": [16]}  # another size
    a(15)["segmentation"] = {"size": [30, 40], "counts": rle_string([600, 600]) + "\x7f"}
    a(16)["segmentation"] = {"size": [30, 40], "counts": {"a": 1}}
    a(17)["segmentation"] = {"size": "30x40", "counts": []}
    a(18)["segmentation"] = {"size": [30, 40], "counts": [600, -5, 605]}
    # several on one image: each check's order decides the first reason
    a(19, 0)["category_id"], a(19, 0)["bbox"] = 999, [39.0, 0.0, 30.0, 1.0]  # category before outside
    a(20, 0)["bbox"], a(20, 0)["segmentation"] = [39.0, 0.0, 30.0, 1.0], [[1.0]]  # outside before polygon
    a(21, 0)["iscrowd"], a(21, 0)["segmentation"] = 5, {"size": [3, 3], "counts": [9]}  # crowd before size
    a(22, 0)["segmentation"] = {"size": [3, 3], "counts": "\x01"}  # size before its characters
    a(22, 1)["category_id"] = 12345  # a second reason on the same image: "(and 1 more)"
    a(23, 0)["segmentation"] = {"size": [30, 40], "counts": rle_string([1200])}  # compressed, fine
    a(23, 0)["iscrowd"] = 1.0  # a number equal to 1 is 1


def _write(data: dict, path: Path, order: list[str], indent: int | None) -> Path:
    path.write_text(json.dumps({k: data[k] for k in order if k in data}, indent=indent))
    return path


def _same(path: Path, root: Path, **options) -> tuple[list, list]:
    got_failures, want_failures = [], []
    got = coco.coco_items(path, root, failures=got_failures, **options)
    want = coco_reference.coco_items(path, root, failures=want_failures, **options)
    assert got_failures == want_failures
    assert (got.kind, got.categories, got.schema) == (want.kind, want.categories, want.schema)
    assert [(i.key, i.path, i.values["image_id"]) for i in got.items] == \
        [(i.key, i.path, i.label) for i in want.items]  # (the reference labels an item by its image id)
    assert [i.label for i in got.items] == [i.values["annotations"].identity(i.values["image_id"], *i.values["orig_size"])
                                            for i in got.items]
    for a, b in zip(got.items, want.items):
        assert isinstance(a, FieldItem)
        h, w = b.values["orig_size"]
        for size in ((h, w), (2 * h, 3 * w), (max(1, h // 3), max(1, w // 2))):
            x = coco.sample_fields(a.values, height=size[0], width=size[1], schema=got.schema)
            y = coco_reference.sample_fields(b.values, height=size[0], width=size[1], schema=want.schema)
            assert x.keys() == y.keys()
            for k in x:
                if isinstance(x[k], np.ndarray):
                    assert x[k].dtype == y[k].dtype and np.array_equal(x[k], y[k]), (a.key, k)
                elif isinstance(x[k], Segmentation):  # kept as given, drawn on read: what drawing at pack time gave
                    assert x[k].rle() == y[k], (a.key, k)
                    assert Segmentation.decode(x[k].encode()) == x[k]
                else:
                    assert x[k] == y[k], (a.key, k)
    return got.items, got_failures


ORDERS = {"COCO's (categories last)": ["info", "licenses", "images", "annotations", "categories"],
          "annotations first": ["annotations", "categories", "info", "images"],
          "categories first": ["categories", "images", "annotations"]}


@pytest.mark.parametrize("order", list(ORDERS))
@pytest.mark.parametrize("chunk", [5, 4096])
def test_streaming_gives_what_json_load_and_grouping_gave(source, tmp_path, monkeypatch, order, chunk):
    monkeypatch.setattr(json_stream, "CHUNK", chunk)
    data = json.loads(json.dumps(source))
    _bad(data)
    path = _write(data, tmp_path / "instances.json", ORDERS[order], indent=1 if chunk == 5 else None)
    items, failures = _same(path, tmp_path)
    assert len(failures) > 25 and len(items) > 10
    assert any("(and 1 more)" in f.reason for f in failures)
    reasons = " | ".join(f.reason for f in failures)
    for text in ("unknown image id 424242", "unknown category id 999", "bbox [35, 2.5, 10, 3] is outside",
                 "needs an integer id and image_id", "is repeated", "is not an RLE code", "counts is a dict"):
        assert text in reasons
    items, _ = _same(path, tmp_path, drop_empty=True)
    assert all(len(coco.decode_annotations(i.values["annotations"])) for i in items)


def test_without_failures_a_bad_annotation_is_a_usage_error(source, tmp_path):
    data = json.loads(json.dumps(source))
    data["annotations"][3]["bbox"] = [1.0, 1.0, -2.0, 1.0]
    path = _write(data, tmp_path / "i.json", ORDERS["COCO's (categories last)"], None)
    with pytest.raises(UsageError, match="negative size"):
        coco.coco_items(path, tmp_path)


def test_captions_stream_as_json_load_gave(source, tmp_path):
    data = {"images": source["images"][:12], "annotations": []}
    for k, im in enumerate(data["images"]):
        for j in range(k % 3):
            data["annotations"].append({"id": 100 * k + j, "image_id": im["id"], "caption": f"ü {k} \ud800 {j}"})
    data["annotations"].append({"id": 5, "image_id": data["images"][4]["id"], "caption": 17})
    data["annotations"].insert(0, {"id": 6, "image_id": 1, "caption": "of no image"})
    path = _write(data, tmp_path / "captions.json", ["annotations", "images"], None)
    items, failures = _same(path, tmp_path)
    assert [f.reason for f in failures] == ["annotation 6: unknown image id 1",
                                            f"image id {data['images'][4]['id']}: annotation 5: caption is not a string"]


@pytest.mark.parametrize("text, message", [
    ("[]", "no 'images' list"),
    ('{"annotations": []}', "no 'images' list"),
    ('{"images": {}}', "no 'images' list"),
    ('{"images": [], "annotations": {"a": 1}}', "'annotations' is a dict"),
    ('{"images": [], "images": []}', "appears twice"),
    ('{"images": [{"id": 1,}]}', "not a JSON annotation file"),
    ('{"images": []} trailing', "not a JSON annotation file"),
    ('{"images": [], "annotations": [], "categories": [{"id": "1"}]}', "malformed 'categories'"),
    ('{"images": [], "categories": [{"id": 1}, {"id": 1}]}', "repeated category ids"),
])
def test_a_file_that_is_not_a_coco_file_is_a_usage_error(tmp_path, text, message):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(UsageError, match=message):
        coco.coco_items(path, tmp_path, failures=[])


@pytest.fixture(scope="module")
def instance_items(source, tmp_path_factory) -> list:
    """The generated file's items (polygons, RLE of both kinds, images without annotations)."""
    folder = tmp_path_factory.mktemp("blob")
    path = _write(source, folder / "i.json", ORDERS["COCO's (categories last)"], None)
    items = coco.coco_items(path, folder).items
    assert any(not len(i.values["annotations"]) for i in items)
    return items


def _checked_blob(item: FieldItem, height: int, width: int) -> bytes:
    schema = coco.instances_schema()
    return schema.encode({"image": b"jpeg", **coco.sample_fields(item.values, height=height, width=width,
                                                                   schema=schema)})


def test_instances_blob_is_the_schema_encode_of_the_fields(instance_items):
    """The field job's shortcut (``instances_blob``: the blob straight from the records) stores the
    very bytes ``Schema.encode`` makes of ``sample_fields``, for every image at its own size and
    scaled; a value the listing does not guarantee (an id past int64, no image bytes) goes the
    checked way (None)."""
    for item in instance_items:
        for h, w in [item.values["orig_size"], (7, 9), (61, 79)]:
            assert coco.instances_blob(item.values, b"jpeg", height=h, width=w) == _checked_blob(item, h, w)
    values = instance_items[0].values
    assert coco.instances_blob(values, b"", height=30, width=40) is None
    assert coco.instances_blob({**values, "image_id": 1 << 63}, b"jpeg", height=30, width=40) is None
    with pytest.raises(ValueError, match="image_id"):
        coco.instances_schema().encode({"image": b"jpeg", **coco.sample_fields(
            {**values, "image_id": 1 << 63}, height=30, width=40, schema=coco.instances_schema())})


@given(k=st.integers(0, 39), height=st.integers(1, 4000), width=st.integers(1, 4000))
def test_instances_blob_scales_as_numpy_does(instance_items, k, height, width):
    """Any stored size: Python's float64 arithmetic and ``struct``'s float32 cast give numpy's bytes."""
    item = instance_items[k % len(instance_items)]
    assert coco.instances_blob(item.values, b"jpeg", height=height, width=width) == \
        _checked_blob(item, height, width)


def test_an_item_holds_its_annotations_compactly(source, tmp_path):
    """The parsed dicts, lists and floats are gone: an item's values are its id, its size and where
    its records are in one buffer (a few bytes more than the values themselves)."""
    path = _write(source, tmp_path / "i.json", ORDERS["COCO's (categories last)"], None)
    items = coco.coco_items(path, tmp_path).items
    stores = set()
    for item in items:
        assert set(item.values) == {"image_id", "orig_size", "annotations"}
        records = item.values["annotations"]
        assert isinstance(records, coco.AnnotationRecords)
        stores.add(id(records.store))
        again = pickle.loads(pickle.dumps(item))  # a spawned or remote worker's item: its own records
        assert type(again.values["annotations"].store) is bytes
        for k in ((h, w) for h, w in [item.values["orig_size"], (7, 9)]):
            x = coco.sample_fields(item.values, height=k[0], width=k[1], schema=coco.instances_schema())
            y = coco.sample_fields(again.values, height=k[0], width=k[1], schema=coco.instances_schema())
            assert all(np.array_equal(x[f], y[f]) if isinstance(x[f], np.ndarray) else x[f] == y[f] for f in x)
    assert len(stores) == 1  # one buffer, the file's records: forked workers share its pages
    total = len(next(iter(items)).values["annotations"].store)
    coords = sum(len(p) for a in source["annotations"] if isinstance(a["segmentation"], list)
                 for p in a["segmentation"])
    assert total < len(source["annotations"]) * (coco.ANNOTATION.itemsize + 32) + 8 * coords


def test_the_struct_and_numpy_forms_of_a_record_agree():
    assert coco._ANN.size == coco.ANNOTATION.itemsize and coco._CAP.size == coco.CAPTION.itemsize
    values = (3, 77, 18, 5, 1.5, 2.5, 3.5, 4.5, 9.25, 1, 0x61, 2, 480, 640, 96, 51)
    rec = np.frombuffer(coco._ANN.pack(*values), coco.ANNOTATION)[0]
    assert (rec["file_index"], rec["id"], rec["category_id"], rec["label"], *rec["bbox"], rec["area"], rec["iscrowd"],
            rec["flags"], rec["kind"], rec["rle_height"], rec["rle_width"], rec["seg_len"], rec["kp_len"]) == values
    unpacked = coco._ANN.unpack(coco._ANN.pack(*values))
    assert (unpacked[coco._F_FLAGS], unpacked[coco._F_SEG_LEN], unpacked[coco._F_KP_LEN]) == (0x61, 96, 51)


# -- keypoints (person_keypoints_*.json) ------------------------------------------------------

def _keypoint_file(tmp_path: Path, change=None) -> Path:
    """A person keypoints file (``write_coco(keypoints=17)``), changed by ``change(data)``."""
    data = json.loads(write_coco(tmp_path / "w", images=12, annotations=50, size=(30, 40), crowd=0.1, empty=0.2,
                                 keypoints=17, write_images=False, seed=7).read_text())
    if change is not None:
        change(data)
    path = tmp_path / "person_keypoints.json"
    path.write_text(json.dumps(data))
    return path


def test_keypoint_categories_add_keypoint_fields_and_keep_their_names(tmp_path):
    path = _keypoint_file(tmp_path)
    got = coco.coco_items(path, tmp_path, failures=[])
    assert got.schema == coco.keypoints_schema(17)
    assert got.schema.names == coco.instances_schema().names + ["keypoints", "num_keypoints"]
    assert got.schema.by_name["keypoints"].spec() == "ndarray:float32:*,17,3"
    assert got.categories == [{"id": 1, "name": "person", "keypoints": list(COCO_KEYPOINTS),
                               "skeleton": [list(e) for e in COCO_SKELETON]}]
    anns = json.loads(path.read_text())["annotations"]
    for item in got.items:
        x = coco.sample_fields(item.values, height=30, width=40, schema=got.schema)
        want = [a for a in anns if a["image_id"] == item.values["image_id"]]
        src = np.array([a["keypoints"] for a in want], dtype=np.float64).reshape(-1, 17, 3)
        assert np.array_equal(x["keypoints"], src.astype(np.float32))
        assert x["num_keypoints"].tolist() == [a["num_keypoints"] for a in want]
        again = pickle.loads(pickle.dumps(item))  # a spawned worker's item carries its keypoints too
        y = coco.sample_fields(again.values, height=15, width=60, schema=got.schema)
        assert np.array_equal(y["keypoints"], (src * (1.5, 0.5, 1)).astype(np.float32))


def test_a_file_without_keypoint_categories_keeps_its_schema_and_ignores_keypoints(source, tmp_path, caplog):
    data = json.loads(json.dumps(source))
    data["annotations"][0]["keypoints"] = [1, 2, 7]  # malformed too: not checked where no category names them
    data["annotations"][1].update(keypoints=[1, 2, 2], num_keypoints=5)
    path = _write(data, tmp_path / "instances.json", ORDERS["COCO's (categories last)"], None)
    with caplog.at_level("WARNING"):
        _same(path, tmp_path)  # what the reference (which knows no keypoints) gives
    assert "2 annotations have keypoints, but no category names them" in caplog.text


def _names(k: int) -> list[str]:
    return [f"p{i}" for i in range(k)]


@pytest.mark.parametrize("categories, message", [
    ([{"id": 1, "name": "person", "keypoints": _names(17)}, {"id": 2, "name": "hand", "keypoints": _names(21)}],
     r"categories name different numbers of keypoints \(id 1 'person' \(17\), id 2 'hand' \(21\)\)"),
    ([{"id": 1, "name": "person", "keypoints": "nose"}], "category 1: 'keypoints' is not a list of keypoint names"),
    ([{"id": 1, "name": "person", "keypoints": _names(3), "skeleton": [[1, 4]]}],
     r"category 1: 'skeleton' is not a list of \[a, b\] pairs of keypoint numbers 1..3"),
])
def test_malformed_keypoint_categories_are_a_usage_error_naming_them(tmp_path, categories, message):
    def change(data):
        data["categories"] = categories
    with pytest.raises(UsageError, match=message):
        coco.coco_items(_keypoint_file(tmp_path, change), tmp_path, failures=[])


def test_an_object_of_a_category_without_keypoint_names_has_k_points_of_zeros(tmp_path):
    def change(data):
        data["categories"].append({"id": 2, "name": "ball"})
        for a in data["annotations"][::3]:
            a["category_id"] = 2
            del a["keypoints"], a["num_keypoints"]
        del data["annotations"][1]["keypoints"]  # a person without keypoints: zeros too
        data["annotations"][1]["num_keypoints"] = 0
    path = _keypoint_file(tmp_path, change)
    failures: list = []
    got = coco.coco_items(path, tmp_path, failures=failures)
    assert not failures and got.categories[1] == {"id": 2, "name": "ball"}
    anns = {a["id"]: a for a in json.loads(path.read_text())["annotations"]}
    zeros = 0
    for item in got.items:
        x = coco.sample_fields(item.values, height=30, width=40, schema=got.schema)
        for aid, kp, n in zip(x["annotation_ids"].tolist(), x["keypoints"], x["num_keypoints"].tolist()):
            src = anns[aid].get("keypoints")
            assert np.array_equal(kp, np.zeros((17, 3)) if src is None else np.reshape(src, (17, 3)))
            assert n == anns[aid]["num_keypoints"] if src is not None else n == 0
            zeros += src is None
    assert zeros > 10


_V = st.sampled_from([0, 1, 2, 1.0, 3, -1, 0.5, True, None, "2"])
_XY = st.one_of(st.integers(-10, 100), st.floats(-10, 100), st.just(float("nan")), st.just(float("inf")),
                st.just(10 ** 400), st.booleans(), st.text(max_size=1))


@given(st.lists(st.tuples(_XY, _XY, _V), max_size=6), st.integers(0, 2), st.one_of(st.none(), st.integers(-1, 7)))
def test_keypoint_values_keep_good_lists_exactly_and_name_the_first_fault(points, cut, num):
    """``_keypoint_values`` against a plain reading of the rules: a list of numbers, 3 per point,
    finite, v 0, 1 or 2, ``num_keypoints`` (when given) the labelled count; a good list is kept
    exactly as float64."""
    kp = [v for p in points for v in p][:max(0, 3 * len(points) - cut)] if points else []
    a = {"keypoints": kp} if num is None else {"keypoints": kp, "num_keypoints": num}
    numbers = all(type(v) in (int, float) for v in kp)
    finite = numbers and all(isinstance(v, int) and abs(v) < 1e300 or isinstance(v, float) and np.isfinite(v)
                             for v in kp)
    good_v = all(v in (0, 1, 2) for v in kp[2::3])
    labelled = sum(v != 0 for v in kp[2::3])
    if not numbers or len(kp) % 3 or not finite:
        want = coco._KEYPOINTS
    elif not good_v:
        want = coco._VISIBILITY
    elif num is not None and num != labelled:
        want = coco._NUM_KEYPOINTS
    else:
        want = None
    try:
        flags, data = coco._keypoint_values(a)
    except coco._Failed as e:
        assert e.stage == want, (kp, e.reason)
        assert "keypoint" in e.reason
        return
    assert want is None and flags == coco._KP_GIVEN
    assert np.frombuffer(data, "<f8").tolist() == [float(v) for v in kp]


def test_an_items_identity_is_its_annotations_not_where_they_stand_in_the_file(source, tmp_path):
    """``label``: a digest of the image's id, size and annotations as stored; the same when other
    images' annotations come before them (a grown export), not when one of its own changes."""
    def labels(data: dict) -> dict[str, int]:
        return {i.key: i.label for i in coco.coco_items(_write(data, tmp_path / "a.json", list(data), None),
                                                        tmp_path).items}

    base = labels(source)
    moved = json.loads(json.dumps(source))
    iid = moved["images"][-1]["id"]
    mine = [a for a in moved["annotations"] if isinstance(a, dict) and a.get("image_id") == iid]
    moved["annotations"] = [{"id": 99999, "image_id": iid, "category_id": moved["categories"][0]["id"],
                             "bbox": [1, 1, 2, 2], "iscrowd": 0, "area": 4}] + mine + \
        [a for a in moved["annotations"] if not (isinstance(a, dict) and a.get("image_id") == iid)]  # others later
    last = moved["images"][-1]["file_name"]
    got = labels(moved)
    assert {k: v for k, v in got.items() if k != last} == {k: v for k, v in base.items() if k != last}
    assert got[last] != base[last]  # (it gained an annotation)
    own = source["annotations"][0]
    changed = json.loads(json.dumps(source))
    changed["annotations"][0]["area"] += 1
    name = next(im["file_name"] for im in source["images"] if im["id"] == own["image_id"])
    assert [k for k, v in labels(changed).items() if v != base[k]] == [name]


def test_grown_categories_keep_the_packs_labels_and_refuse_a_changed_one():
    old = [{"id": 5, "name": "b"}, {"id": 9, "name": "c"}]
    new = [{"id": 2, "name": "a"}, {"id": 5, "name": "b"}, {"id": 11, "name": "d"}]
    assert coco.grow_categories(old, new, "f.json") == old + [{"id": 2, "name": "a"}, {"id": 11, "name": "d"}]
    with pytest.raises(UsageError, match=r'category id 5: \{"id": 5, "name": "b"\} in the pack, '
                                         r'\{"id": 5, "name": "B"\} in f.json'):
        coco.grow_categories(old, [{"id": 5, "name": "B"}], "f.json")

"""The typed field codecs: every type round-trips, bad values and bytes are ValueErrors."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

from packer.codecs.fields import (ENCODINGS, NdarrayField, Schema, Segmentation, encode_blob, parse_field,
                                  split_blob)

json_values = st.recursive(st.none() | st.booleans() | st.integers(-2**53, 2**53) | st.text()
                           | st.floats(allow_nan=False, allow_infinity=False),
                           lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=5), kids, max_size=4),
                           max_leaves=12)


@settings(max_examples=60, deadline=None)
@given(i=st.integers(-2**63, 2**63 - 1), f=st.floats(allow_nan=False), s=st.text(), b=st.binary(),
       j=json_values, labels=st.lists(st.integers(-2**63, 2**63 - 1), max_size=8),
       boxes=hnp.arrays(np.float32, st.tuples(st.integers(0, 6), st.just(4)),
                        elements=st.floats(-1e6, 1e6, width=32)))
def test_every_type_round_trips_through_a_blob(i, f, s, b, j, labels, boxes):
    schema = Schema({"i": "int", "f": "float", "s": "str", "b": "bytes", "j": "json", "l": "labels",
                     "boxes": "ndarray:float32:*,4", "image": "image"})
    values = {"i": i, "f": f, "s": s, "b": b, "j": j, "l": labels, "boxes": boxes, "image": b"\xff\xd8jpeg"}
    back = schema.decode(schema.encode(values))
    assert back["i"] == i and back["s"] == s and back["b"] == b and back["j"] == j and back["l"] == labels
    assert back["f"] == f or (np.isnan(f) and np.isnan(back["f"]))
    assert back["boxes"].dtype == np.float32 and back["boxes"].shape == boxes.shape
    np.testing.assert_array_equal(back["boxes"], boxes)
    assert schema.decode(schema.encode(values), ["s"]) == {"s": s}


@settings(max_examples=40, deadline=None)
@given(dtype=st.sampled_from(["uint8", "int16", "int64", "float16", "float64", "bool"]),
       shape=st.tuples(st.integers(0, 5), st.integers(1, 3), st.integers(1, 2)), data=st.data())
def test_ndarray_keeps_dtype_and_shape(dtype, shape, data):
    arr = data.draw(hnp.arrays(dtype, shape))
    f = NdarrayField(name="a", dtype=dtype, shape=(None,) + shape[1:])
    back = f.decode(f.encode(arr))
    assert back.dtype == np.dtype(dtype) and back.shape == arr.shape
    np.testing.assert_array_equal(back, arr)
    assert parse_field("a", f.spec()) == f and parse_field("a", f.to_json()) == f


@settings(max_examples=40, deadline=None)
@given(parts=st.lists(st.binary(max_size=40), max_size=6), cut=st.integers(1, 8))
def test_a_truncated_or_padded_blob_is_refused(parts, cut):
    blob = encode_blob(parts)
    assert [bytes(p) for p in split_blob(blob, len(parts))] == parts
    with pytest.raises(ValueError):
        split_blob(blob[:-cut] if len(blob) > cut else b"", len(parts))
    with pytest.raises(ValueError):
        split_blob(blob + b"\0", len(parts))


@pytest.mark.parametrize("spec, value", [
    ("int", 1.5), ("int", True), ("int", 2**63), ("float", "x"), ("str", b"x"), ("bytes", "x"),
    ("json", float("nan")), ("labels", [1, 2.5]), ("labels", "12"), ("ndarray:float32:*,4", [[1, 2, 3]]),
    ("ndarray:float32:2", [1, 2, 3]), ("ndarray:uint8:*", [300]), ("ndarray:int64:*", [1.5]),
    ("ndarray:float32:*", ["a"]), ("image", b""), ("rle", [{"size": [2, 2], "counts": [1, 3]}]),
    ("rle", {"size": [2, 2], "counts": "04"})])
def test_a_value_of_the_wrong_type_is_a_value_error_naming_the_field(spec, value):
    with pytest.raises(ValueError, match="'x'"):
        parse_field("x", spec).encode(value)


@pytest.mark.parametrize("spec, data", [("int", b"1234"), ("float", b"1"), ("labels", b"123"),
                                        ("ndarray:float32:*,4", b"\0" * 12), ("ndarray:int64:2", b"\0" * 8),
                                        ("json", b"{"), ("str", b"\xff"), ("rle", b"[1]")])
def test_malformed_bytes_are_a_value_error(spec, data):
    with pytest.raises(ValueError):
        parse_field("x", spec).decode(data)


def test_schema_refuses_repeats_unknown_types_and_bad_names():
    with pytest.raises(ValueError, match="unknown type"):
        parse_field("a", "tensor")
    with pytest.raises(ValueError, match="name"):
        parse_field("9a", "int")
    with pytest.raises(ValueError, match="repeat"):
        Schema([parse_field("a", "int"), parse_field("a", "str")])
    with pytest.raises(ValueError, match="missing"):
        Schema({"a": "int", "b": "str"}).encode({"a": 1})
    assert set(ENCODINGS) == {"image", "int", "float", "str", "bytes", "json", "labels", "ndarray", "rle", "segmentation", "video"}


def test_masks_are_compressed_coco_rle_that_pycocotools_decodes():
    mask_util = pytest.importorskip("pycocotools.mask")
    m = np.zeros((7, 9), dtype=np.uint8, order="F")
    m[2:5, 3:8] = 1
    rle = mask_util.encode(m)
    f = parse_field("masks", "rle")
    back = f.decode(f.encode([rle, {"size": rle["size"], "counts": rle["counts"].decode()}]))
    assert all(isinstance(r["counts"], str) for r in back)
    np.testing.assert_array_equal(mask_util.decode(back), np.stack([m, m], axis=-1))


_polygon = st.lists(st.floats(-1e4, 1e4), min_size=3, max_size=12).map(lambda v: v * 2)  # even, >= 6
_object = st.none() | st.lists(_polygon, min_size=1, max_size=3) | st.text("0123456789:;<=>?@ABCDEFGH", max_size=20)


@given(h=st.integers(0, 2000), w=st.integers(0, 2000), objects=st.lists(_object, max_size=6))
def test_a_segmentation_round_trips_exactly(h, w, objects):
    """Polygons keep every float64 coordinate, RLE strings and missing masks stay what they were."""
    seg = Segmentation(height=h, width=w, objects=objects)
    f = parse_field("masks", "segmentation")
    back = f.decode(f.encode(seg))
    assert back == seg and (back.height, back.width) == (h, w)
    for got, given_ in zip(back.objects, objects):
        if given_ is None or given_ == []:
            assert got is None
        elif isinstance(given_, list):
            assert [p.tolist() for p in got] == [[float(v) for v in p] for p in given_]
        else:
            assert got == given_
    assert f.decode(f.encode({"size": [h, w], "objects": back.to_coco()})) == seg


@given(h=st.integers(0, 50), w=st.integers(0, 50), objects=st.lists(_object, min_size=1, max_size=4),
       data=st.data())
def test_a_cut_or_padded_segmentation_is_a_value_error(h, w, objects, data):
    f = parse_field("masks", "segmentation")
    raw = f.encode(Segmentation(height=h, width=w, objects=objects))
    cut = data.draw(st.integers(1, len(raw)))
    with pytest.raises(ValueError, match="'masks'"):
        f.decode(raw[:-cut])
    with pytest.raises(ValueError, match="'masks'"):
        f.decode(raw + b"\0")


@pytest.mark.parametrize("objects, why", [
    ([[[1.0, 2.0, 3.0, 4.0]]], "at least 3"),
    ([[[1.0, 2.0, 3.0, 4.0, 5.0]]], "at least 3"),
    ([[[1.0, 2.0, 3.0, 4.0, 5.0, float("nan")]]], "finite"),
    ([[["a", 2.0, 3.0, 4.0, 5.0, 6.0]]], "numbers"),
    ([{"size": [4, 4], "counts": "0"}], "size"),
    ([{"size": [3, 3], "counts": [9]}], "compressed"),
    (["a b"], "compressed"),
    ([7], "polygons, an RLE or None"),
])
def test_a_malformed_segmentation_is_a_value_error(objects, why):
    with pytest.raises(ValueError, match=why):
        Segmentation(height=3, width=3, objects=objects)
    with pytest.raises(ValueError, match="'masks'"):
        parse_field("masks", "segmentation").encode({"size": [3, 3], "objects": objects})


def test_a_segmentation_draws_what_pycocotools_draws():
    """``rle()``: each object's polygons drawn and merged, an RLE as given, no mask an empty one;
    the same masks pycocotools gives for the COCO ``segmentation`` values."""
    mask_util = pytest.importorskip("pycocotools.mask")
    h, w = 20, 30
    square = [2.0, 2.0, 12.0, 2.0, 12.0, 9.5, 2.0, 9.5]
    tri = [20.0, 1.0, 28.5, 15.0, 15.0, 18.0]
    m = np.zeros((h, w), dtype=np.uint8, order="F")
    m[5:15, 3:7] = 1
    rle = mask_util.encode(m)
    seg = Segmentation(height=h, width=w, objects=[[square], [square, tri], rle, None])
    got = seg.rle()
    assert all(r["size"] == [h, w] and isinstance(r["counts"], str) for r in got)
    want = [mask_util.merge(mask_util.frPyObjects([square], h, w)), mask_util.merge(mask_util.frPyObjects([square, tri], h, w)),
            rle, mask_util.encode(np.zeros((h, w), dtype=np.uint8, order="F"))]
    for g, x in zip(got, want):
        np.testing.assert_array_equal(mask_util.decode(g), mask_util.decode(x))
        assert g["counts"] == x["counts"].decode()
    assert seg.to_coco()[2] == {"size": [h, w], "counts": rle["counts"].decode()} and seg.to_coco()[3] == []

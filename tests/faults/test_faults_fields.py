"""Field packs under bad inputs and damage: every bad annotation or manifest row is a recorded
failure naming the image and annotation ids (every other sample packed), and one flipped bit in
any field of a stored sample is ``CorruptData`` naming the sample, and ``packer verify`` fails
naming it, in every format, also read through ``StreamingDataset`` (DataLoader workers too) and
``Loader``, which with ``on_corrupt="skip"`` replace it by a valid sample and list it."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

import packer
from packer.codecs.protowire import decode_varint
from packer.commands.inspection import verify_dataset
from packer.data.loader import LoaderError
from packer.errors import CorruptData, UsageError
from packer.formats import FORMATS, open_reader
from packer.formats.lmdb.env import close_env
from packer.formats.records.example import feature_name
from tests.support.coco import make_box_coco, make_coco

pytest.importorskip("pycocotools")

ALL = sorted(FORMATS)
FIELDS = ["image", "image_id", "boxes", "labels", "category_ids", "iscrowd", "area", "annotation_ids", "masks",
          "orig_size"]
SAMPLE = 1  # an image with annotations (every field non-empty)


def out_path(root: Path, fmt: str, name: str = "out") -> Path:
    return root / (f"{name}.h5" if FORMATS[fmt][0].single_file else name)


@pytest.fixture(scope="module")
def coco_src(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("coco")
    return {"root": root, **make_coco(root, n_images=5)}


@pytest.fixture(scope="module")
def packed(coco_src, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("packed")
    outs = {}
    for fmt in ALL:
        outs[fmt] = out_path(root, fmt, fmt)
        packer.pack(coco_src["root"], outs[fmt], format=fmt, coco=coco_src["instances"], workers=0)
    return outs


def _flip_field(out: Path, fmt: str, field: str) -> None:
    """Flip one bit inside field ``field`` of sample ``SAMPLE`` where the format stores it."""
    r = open_reader(out, check_crc=False)
    schema = r.schema
    if fmt == "records":
        shard = out / r.manifest.shards[0]["file"]
        raw = bytearray(shard.read_bytes())
        offset, size = (int(v) for v in (out / r.manifest.shards[0]["index"]).read_text().splitlines()[SAMPLE].split())
        name = feature_name(schema, field).encode()
        name = bytes([0x0A, len(name)]) + name  # the map entry's key, whole ("keypoints" is in "num_keypoints")
        at = raw.index(name, offset, offset + size) + len(name)
        assert raw[at] == 0x12  # the map entry's Feature value follows its key
        length, pos = decode_varint(bytes(raw[at + 1:at + 11]), 0)
        raw[at + 1 + pos + length - 1] ^= 0x04  # the Feature's last byte
        shard.write_bytes(bytes(raw))
        return
    if fmt == "hdf5":  # a dataset per field (docs/fields.md): flip a byte of the sample's rows
        _flip_h5(out, f"fields/{field}", f"field_offsets/{field}")
        return
    blob = r.read(SAMPLE).data
    parts = schema.split(blob)
    start = blob.index(bytes(parts[field]), 4 * (len(schema.fields) + 1)) if field != FIELDS[0] else \
        4 * (len(schema.fields) + 1)
    inside = start + len(parts[field]) // 2
    path = out / "data.mdb" if fmt == "lmdb" else out
    if fmt == "lmdb":
        close_env(out)
    raw = bytearray(path.read_bytes())
    at = raw.index(blob)
    assert raw.find(blob, at + 1) == -1
    raw[at + inside] ^= 0x10
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize("fmt", ALL)
def test_a_flipped_bit_in_any_field_is_corrupt_data_naming_the_sample(packed, tmp_path, fmt, field):
    _a_flipped_bit_is_corrupt_data(packed[fmt], tmp_path, fmt, field)


@pytest.fixture(scope="module")
def keypoints_packed(tmp_path_factory) -> dict[str, Path]:
    """A person keypoints pack (``write_coco(keypoints=17)``) in each format; sample ``SAMPLE``
    has labelled keypoints."""
    from packer.synth import write_coco

    root = tmp_path_factory.mktemp("kp")
    path = write_coco(root / "src", images=4, annotations=12, size=(32, 40), empty=0.0, keypoints=17, seed=1)
    outs = {}
    for fmt in ALL:
        outs[fmt] = out_path(root, fmt, fmt)
        packer.pack(root / "src", outs[fmt], format=fmt, coco=path, workers=0)
    assert packer.PackedDataset(outs["lmdb"], decode="bytes")[SAMPLE]["num_keypoints"].sum() > 0
    return outs


@pytest.mark.parametrize("field", ["keypoints", "num_keypoints"])
@pytest.mark.parametrize("fmt", ALL)
def test_a_flipped_bit_in_a_keypoint_field_is_corrupt_data_naming_the_sample(keypoints_packed, tmp_path, fmt,
                                                                             field):
    _a_flipped_bit_is_corrupt_data(keypoints_packed[fmt], tmp_path, fmt, field)


def _a_flipped_bit_is_corrupt_data(packed: Path, tmp_path: Path, fmt: str, field: str) -> None:
    out = out_path(tmp_path, fmt)
    (shutil.copy if packed.is_file() else shutil.copytree)(packed, out)
    key = open_reader(out).keys[SAMPLE]
    _flip_field(out, fmt, field)
    ds = packer.PackedDataset(out, decode="numpy")
    ds[0]  # the other samples read as before
    with pytest.raises(CorruptData) as e:
        ds[SAMPLE]
    assert f"sample {SAMPLE}" in str(e.value) or f"record {SAMPLE}" in str(e.value)
    assert key in str(e.value)
    result = verify_dataset(out)
    assert not result.ok and any(key in p for p in result.problems), result.problems


def _damaged(packed, tmp_path: Path, fmt: str, field: str = "boxes") -> tuple[Path, str]:
    out = out_path(tmp_path, fmt)
    (shutil.copy if packed[fmt].is_file() else shutil.copytree)(packed[fmt], out)
    key = open_reader(out).keys[SAMPLE]
    _flip_field(out, fmt, field)
    return out, key


def _read_all(out: Path, how: str, **kw) -> list:
    """Every sample of ``out`` in order, read as ``how`` says (dicts of image_id and boxes)."""
    fields = ["image_id", "boxes"]
    if how == "loader":
        ds = packer.PackedDataset(out, decode="bytes", fields=fields)
        loader = packer.Loader(ds, batch_size=2, num_threads=2, collate=list, **kw)
        return [s for batch in loader for s in batch]
    ds = packer.StreamingDataset(out, decode="bytes", fields=fields, shuffle=False, batch_size=2, **kw)
    if how == "stream":
        return list(ds)
    batches = iter(torch.utils.data.DataLoader(ds, batch_size=2, num_workers=2, collate_fn=list))
    try:
        return [s for b in batches for s in b]
    finally:  # the raised exception's traceback keeps the iterator, and so its workers, alive
        batches._shutdown_workers()


READS = ["stream", "stream-workers", "loader"]


@pytest.mark.parametrize("how", READS)
@pytest.mark.parametrize("fmt", ALL)
def test_a_flipped_bit_read_through_streaming_or_the_loader_names_the_sample(packed, tmp_path, fmt, how):
    out, key = _damaged(packed, tmp_path, fmt)
    with pytest.raises(Exception) as e:
        _read_all(out, how)
    if how == "stream":
        assert isinstance(e.value, CorruptData)
    elif how == "loader":  # the Loader names the sample it was loading, from the CorruptData
        assert isinstance(e.value, LoaderError) and isinstance(e.value.__cause__, CorruptData)
        assert f"loading sample {SAMPLE} " in str(e.value)
    else:  # a worker's exception comes back as the DataLoader re-raises it, with its text
        assert "CorruptData" in str(e.value)
    assert key in str(e.value) and (f"sample {SAMPLE}" in str(e.value) or f"record {SAMPLE}" in str(e.value))


@pytest.mark.parametrize("how", READS)
def test_skipping_a_damaged_field_sample_replaces_it_and_lists_it(packed, tmp_path, how):
    out, key = _damaged(packed, tmp_path, "records")
    good = packer.PackedDataset(packed["records"], decode="bytes", fields=["image_id"])
    got = _read_all(out, how, on_corrupt="skip", max_skipped=1)
    ids = [s["image_id"] for s in got]
    assert len(ids) == len(good) and good[SAMPLE]["image_id"] not in ids
    assert set(ids) == {good[i]["image_id"] for i in range(len(good)) if i != SAMPLE}


def _variant(coco_src, tmp_path: Path, change) -> Path:
    src = tmp_path / "src"
    shutil.copytree(coco_src["root"], src)
    data = json.loads((src / "instances.json").read_text())
    change(data, src)
    (src / "instances.json").write_text(json.dumps(data))
    return src


def _ann(data: dict, image_index: int, k: int = 0) -> dict:
    iid = data["images"][image_index]["id"]
    return [a for a in data["annotations"] if a["image_id"] == iid][k]


def _set(image_index, key, value, k=0):
    def change(data, src):
        _ann(data, image_index, k)[key] = value
    return change


def _missing_file(data, src):
    (src / data["images"][1]["file_name"]).unlink()


def _garbage_file(data, src):
    (src / data["images"][1]["file_name"]).write_bytes(b"not an image at all")


def _wrong_size(data, src):
    data["images"][3]["width"] += 3  # an image without annotations (no mask of the old size)


def _unknown_image(data, src):
    data["annotations"].append({**data["annotations"][0], "id": 999, "image_id": 424242})


def _bad_rle_char(data, src):
    ann = _ann(data, 1, 2)  # image 1's compressed RLE
    ann["segmentation"] = {**ann["segmentation"], "counts": ann["segmentation"]["counts"] + "\x7f"}


CASES = {
    "missing image file": (_missing_file, 1, "read", "cannot read file"),
    "unreadable image": (_garbage_file, 1, "decode", ""),
    "image size differs from the file": (_wrong_size, 3, "decode", "the annotation file says"),
    "annotation of an unknown image id": (_unknown_image, None, "input", "annotation 999: unknown image id 424242"),
    "unknown category": (_set(1, "category_id", 77), 1, "input", "unknown category id 77"),
    "box outside the image": (_set(1, "bbox", [60.0, 2.0, 30.0, 5.0]), 1, "input", "outside the 80x60 image"),
    "negative box size": (_set(1, "bbox", [5.0, 2.0, -3.0, 5.0]), 1, "input", "negative size"),
    "polygon of two points": (_set(1, "segmentation", [[1.0, 1.0, 5.0, 5.0]]), 1, "input", "fewer than 3"),
    "RLE runs do not cover the image": (_set(0, "segmentation", {"size": [48, 64], "counts": [5, 10]}, k=2), 0,
                                        "input", "malformed RLE: runs cover 15 pixels"),
    "RLE of another size": (_set(0, "segmentation", {"size": [4, 4], "counts": [16]}, k=2), 0, "input",
                            "malformed RLE: size [4, 4]"),
    "RLE string with a bad character": (_bad_rle_char, 1, "input", "is not an RLE code"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_bad_annotation_is_a_recorded_failure_naming_its_ids(coco_src, tmp_path, case):
    change, image, stage, reason = CASES[case]
    src = _variant(coco_src, tmp_path, change)
    data = json.loads((src / "instances.json").read_text())
    out = tmp_path / "out"
    report = packer.pack(src, out, coco=src / "instances.json", workers=0, max_failures=5)
    assert report.failed == 1, report.failures
    (failure,) = report.failures
    assert failure["stage"] == stage and reason in failure["reason"], failure
    n = len(data["images"])
    if image is None:
        assert report.count == n and failure["key"] == "annotation 999"
    else:
        bad = data["images"][image]
        assert report.count == n - 1 and failure["key"] == bad["file_name"]
        if stage == "input":
            assert f"image id {bad['id']}: annotation " in failure["reason"]
        assert bad["file_name"] not in open_reader(out).keys
    lines = (out / "failures.jsonl").read_text().splitlines()
    assert [json.loads(line)["reason"] for line in lines] == [failure["reason"]]


@pytest.fixture(scope="module")
def keypoints_src(tmp_path_factory) -> Path:
    """A keypoints file (``make_box_coco(keypoints=True)``): every object's keypoints its box's
    corners and a point not labelled, but those of category 18, which names none."""
    root = tmp_path_factory.mktemp("keypoints")
    make_box_coco(root, keypoints=True)
    return root


def _keypoints_of(image_index, k, change):
    def edit(data, src):
        iid = data["images"][image_index]["id"]
        change([a for a in data["annotations"] if a["image_id"] == iid][k])
    return edit


def _set_point(i, x, y, v):
    def change(ann):
        ann["keypoints"][3 * i:3 * i + 3] = [x, y, v]
    return change


KEYPOINT_CASES = {  # image 0 is 64x48 (its object 1, category 7, names 5 keypoints); image 1's object is of 18
    "keypoints not a list of numbers": (0, 1, lambda a: a.update(keypoints="1 2 2"),
                                        "keypoints is not a list of numbers [x1, y1, v1, ...]"),
    "keypoints not 3 numbers a point": (0, 1, lambda a: a.update(keypoints=a["keypoints"][:14]),
                                        "keypoints has 14 numbers, not 3 (x, y, v) per point"),
    "keypoints of fewer points than named": (0, 1, lambda a: a.update(keypoints=a["keypoints"][:12]),
                                             "keypoints has 12 numbers, not 3 x 5 (its category's 5 keypoints)"),
    "keypoints not finite": (0, 1, _set_point(1, float("nan"), 10, 2), "keypoints are not finite numbers"),
    "visibility not 0, 1 or 2": (0, 1, _set_point(1, 60, 10, 3), "keypoint 1 has visibility 3, not 0, 1 or 2"),
    "labelled keypoint outside the image": (0, 1, _set_point(1, 70, 10, 1),
                                            "keypoint 1 (top_right) at (70.0, 10.0) is outside the 64x48 image"),
    "num_keypoints not the labelled count": (0, 1, lambda a: a.update(num_keypoints=3),
                                             "num_keypoints 3 is not the number of labelled (v > 0) keypoints, 4"),
    "keypoints of a category naming none": (1, 0, lambda a: a.update(keypoints=[1, 1, 2] * 5),
                                            "keypoints given, but category 18 names no keypoints"),
}


@pytest.mark.parametrize("case", list(KEYPOINT_CASES))
def test_a_bad_keypoint_annotation_is_a_recorded_failure_naming_its_ids(keypoints_src, tmp_path, case):
    image, k, change, reason = KEYPOINT_CASES[case]
    src = tmp_path / "src"
    shutil.copytree(keypoints_src, src)
    data = json.loads((src / "boxes.json").read_text())
    _keypoints_of(image, k, change)(data, src)
    (src / "boxes.json").write_text(json.dumps(data))
    out = tmp_path / "out"
    report = packer.pack(src, out, coco=src / "boxes.json", workers=0, max_failures=5)
    assert report.failed == 1, report.failures
    (failure,) = report.failures
    bad = data["images"][image]
    aid = [a for a in data["annotations"] if a["image_id"] == bad["id"]][k]["id"]
    assert failure["stage"] == "input" and failure["key"] == bad["file_name"]
    assert failure["reason"] == f"image id {bad['id']}: annotation {aid}: {reason}", failure
    assert report.count == len(data["images"]) - 1  # every other image packed, with its keypoints
    ds = packer.PackedDataset(out, decode="bytes", fields=["image_id", "keypoints"])
    assert bad["file_name"] not in ds.keys and len(ds) == report.count
    assert all(s["keypoints"].shape[1:] == (5, 3) for s in ds)


def test_keypoint_categories_of_different_counts_are_a_clear_error_and_write_nothing(keypoints_src, tmp_path):
    data = json.loads((keypoints_src / "boxes.json").read_text())
    data["categories"][0].update(keypoints=data["categories"][0]["keypoints"][:3], skeleton=[[1, 2]])
    path = tmp_path / "boxes.json"
    path.write_text(json.dumps(data))
    with pytest.raises(UsageError, match=r"categories name different numbers of keypoints \(id 1 'cat1' \(3\), "
                                         r"id 3 'cat3' \(5\), id 7 'cat7' \(5\)\)") as e:
        packer.pack(keypoints_src, tmp_path / "out", coco=path, workers=0)
    assert str(path) in str(e.value)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("change, message", [
    (lambda text: text[:len(text) * 2 // 3], "not a JSON annotation file"),  # cut mid-way
    (lambda text: text[:-1] + ', "images": []}', "the key 'images' appears twice"),  # json.load keeps the last
    (lambda text: text[:-1] + ', "extra": 1} {}', "Extra data"),
    (lambda text: text.replace('"annotations": [', '"annotations": {"x": [', 1).replace(
        '], "categories"', ']}, "categories"', 1), "'annotations' is a dict, not a list"),
])
def test_a_malformed_annotation_file_is_a_clear_error_and_writes_nothing(coco_src, tmp_path, change, message):
    """The file is read streaming: whatever is wrong with it, wherever, the run stops before
    packing anything, naming the file (never a pack of the part before the damage)."""
    path = tmp_path / "instances.json"
    path.write_text(change((coco_src["instances"]).read_text()))
    with pytest.raises(UsageError, match=message) as e:
        packer.pack(coco_src["root"], tmp_path / "out", coco=path, workers=0)
    assert str(path) in str(e.value)
    assert not (tmp_path / "out").exists()


def _manifest(tmp_path: Path, lines: list[str], suffix: str = ".jsonl") -> Path:
    from PIL import Image

    for i in range(3):
        Image.new("RGB", (8, 6), (i * 40, 0, 0)).save(tmp_path / f"p{i}.png")
    path = tmp_path / f"samples{suffix}"
    path.write_text("".join(line + "\n" for line in lines))
    return path


@pytest.mark.parametrize("suffix, lines, reason", [
    (".jsonl", ['{"image": "p0.png", "n": 1}', '{"image": "p1.png"}', '{"image": "p2.png", "n": 3}'],
     "missing column 'n'"),
    (".jsonl", ['{"image": "p0.png", "n": 1}', '{"image": "p1.png", "n": "two"}', '{"image": "p2.png", "n": 3}'],
     "column 'n': field 'n': not an integer"),
    (".jsonl", ['{"image": "p0.png", "n": 1}', '{"image": "p1.png", "n": 2', '{"image": "p2.png", "n": 3}'],
     "not JSON"),
    (".csv", ["image,n", "p0.png,1", "p1.png,x2", "p2.png,3"], "column 'n': 'x2' is not a int value"),
    (".csv", ["image,n", "p0.png,1", "p1.png,", "p2.png,3"], "column 'n': is empty"),
])
def test_a_bad_manifest_row_is_a_recorded_failure_naming_its_line(tmp_path, suffix, lines, reason):
    path = _manifest(tmp_path, lines, suffix)
    report = packer.pack(tmp_path, tmp_path / "out", manifest=path, workers=0, max_failures=5)
    (failure,) = report.failures
    assert failure["stage"] == "input" and failure["line"] == (3 if suffix == ".csv" else 2)
    assert reason in failure["reason"], failure
    assert report.count == 2 and list(open_reader(tmp_path / "out").keys) == ["p0.png", "p2.png"]


def test_a_manifest_image_that_is_missing_fails_that_row_only(tmp_path):
    path = _manifest(tmp_path, ['{"image": "p0.png", "n": 1}', '{"image": "gone.png", "n": 2}',
                                '{"image": "p2.png", "n": 3}'])
    report = packer.pack(tmp_path, tmp_path / "out", manifest=path, workers=0, max_failures=5)
    (failure,) = report.failures
    assert failure["stage"] == "read" and failure["key"] == "gone.png" and report.count == 2


# -- HDF5: a dataset per field (docs/fields.md); a flip in a field's offsets is caught too --
def _file_offset(dset, row: int, inside: int) -> int:
    """Where byte ``inside`` of row ``row`` of a dataset chunked along its first axis is in the file."""
    rows = dset.chunks[0]
    info = dset.id.get_chunk_info_by_coord((row // rows * rows,) + (0,) * (dset.ndim - 1))
    return info.byte_offset + (row % rows) * dset.dtype.itemsize * int(np.prod(dset.shape[1:])) + inside


def _flip_h5(out: Path, path: str, offsets: str, *, in_offsets: bool = False) -> None:
    """Flip one bit of sample ``SAMPLE``'s rows of dataset ``path`` (of its end offset when
    ``in_offsets``), found through h5py as a user reading the file would."""
    with h5py.File(out, "r") as f:
        data = f[path]
        row_bytes = data.dtype.itemsize * int(np.prod(data.shape[1:]))
        if in_offsets:
            at = _file_offset(f[offsets], SAMPLE + 1, 0)  # the low byte of the end of the sample's rows
        elif offsets in f:
            a, b = (int(v) for v in f[offsets][SAMPLE:SAMPLE + 2])
            assert b > a
            middle = (b - a) * row_bytes // 2
            at = _file_offset(data, a + middle // row_bytes, middle % row_bytes)
        else:
            at = _file_offset(data, SAMPLE, row_bytes // 2)
    raw = bytearray(out.read_bytes())
    raw[at] ^= 0x01
    out.write_bytes(bytes(raw))


VARIABLE = [f for f in FIELDS if f not in ("image_id", "orig_size")]


@pytest.mark.parametrize("field", VARIABLE)
def test_a_flipped_bit_in_a_field_offsets_dataset_of_hdf5_is_corrupt_data(packed, tmp_path, field):
    """HDF5 keeps a variable-length field's offsets outside the sample's bytes: the CRC32C of the
    blob rebuilt from them still covers them."""
    out = out_path(tmp_path, "hdf5")
    shutil.copy(packed["hdf5"], out)
    key = open_reader(out).keys[SAMPLE]
    _flip_h5(out, f"fields/{field}", f"field_offsets/{field}", in_offsets=True)
    ds = packer.PackedDataset(out, decode="bytes")
    ds[0]  # sample 0's rows are where they were
    with pytest.raises(CorruptData, match=rf"sample {SAMPLE} \(key '{re.escape(key)}'\)"):
        ds[SAMPLE]
    problems = verify_dataset(out).problems
    assert any(key in p for p in problems), problems

"""HDF5 field packs, a dataset per field: every field type stored in its documented dataset and
read back exactly by packer and by plain h5py; resume cuts every field back; direct reads equal
reads through HDF5; image-only packs keep their layout; the field blob layout of a development
version is refused."""
from __future__ import annotations

import re
from pathlib import Path

import h5py
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import packer
from packer.codecs.fields import BLOB_FMT, Schema
from packer.errors import FormatError
from packer.formats import open_reader
from packer.formats.hdf5 import MANIFEST_ATTR, HDF5Writer
from packer.formats.hdf5.columns import columns_of
from packer.formats.sample import Sample
from packer.manifest import Manifest
from packer.synth import jpeg_bytes
from tests.support import REPO
from tests.support.inputs import write_image_folder

SCHEMA = Schema({"image": "image", "id": "int", "score": "float", "caption": "str", "raw": "bytes",
                 "meta": "json", "tags": "labels", "boxes": "ndarray:float32:*,4", "size": "ndarray:int64:2",
                 "flags": "ndarray:bool:*", "half": "ndarray:float16:3", "empty": "ndarray:uint8:*,0",
                 "nothing": "ndarray:int32:0", "sub/dir.name": "ndarray:uint16:*", "masks": "rle"})
JPEG = jpeg_bytes(np.full((6, 8, 3), 90, np.uint8))


def _values(rng: np.random.Generator, i: int) -> dict:
    n = int(rng.integers(0, 4))
    return {"image": JPEG, "id": int(rng.integers(-2**62, 2**62)), "score": float(rng.normal()),
            "caption": f"caption {i} ✓" * (i % 3), "raw": bytes(rng.integers(0, 256, i % 5, dtype=np.uint8)),
            "meta": {"i": i, "list": [1, None]}, "tags": list(range(i % 4)),
            "boxes": rng.random((n, 4), dtype=np.float32), "size": [6, 8], "flags": rng.random(n) > 0.5,
            "half": np.array([1.5, -2, i], np.float16), "empty": np.zeros((n, 0), np.uint8),
            "nothing": np.zeros(0, np.int32), "sub/dir.name": np.arange(i % 3, dtype=np.uint16),
            "masks": [{"size": [6, 8], "counts": "0`0"}] * n}


def _write(out: Path, rows: list[dict], *, commit_every: int = 3, chunk_bytes: int = 1 << 20,
           schema: Schema = SCHEMA) -> None:
    w = HDF5Writer(out, classes=[], commit_every=commit_every, chunk_bytes=chunk_bytes)
    w.schema = schema
    with w:
        for i, row in enumerate(rows):
            w.add(Sample(f"k{i}", schema.encode(row), BLOB_FMT, -1, 6, 8, 3))
        w.close()


def _equal(a, b) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()
    return a == b


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    rng = np.random.default_rng(7)
    return [_values(rng, i) for i in range(23)]


def test_every_field_type_has_its_dataset_and_reads_back(tmp_path, rows):
    out = tmp_path / "f.h5"
    _write(out, rows)
    ds = packer.PackedDataset(out, decode="bytes")
    for i, row in enumerate(rows):
        got = ds[i]
        want = {k: SCHEMA.by_name[k].decode(SCHEMA.by_name[k].encode(v)) for k, v in row.items()}
        assert list(got) == SCHEMA.names and all(_equal(got[k], want[k]) for k in want), i
    with h5py.File(out, "r") as f:
        assert f["fields/id"].shape == (23,) and f["fields/id"].dtype == np.int64
        assert f["fields/score"].dtype == np.float64 and f["fields/size"].shape == (23, 2)
        assert f["fields/half"].dtype == np.float16 and f["fields/half"].shape == (23, 3)
        assert f["fields/boxes"].dtype == np.float32 and f["fields/boxes"].shape[1:] == (4,)
        assert f["fields/flags"].dtype == np.bool_ and f["fields/tags"].dtype == np.int64
        assert f["fields/sub%2Fdir.name"].dtype == np.uint16  # a '/' in a name is escaped
        for name in ("image", "caption", "raw", "meta", "masks", "empty", "nothing"):  # bytes
            assert f[f"fields/{name}"].dtype == np.uint8 and f[f"fields/{name}"].ndim == 1
        assert {n for n in f["fields"]} == {c.path.split("/", 1)[1] for c in columns_of(SCHEMA)}
        assert {n for n in f["field_offsets"]} == {c.path.split("/", 1)[1] for c in columns_of(SCHEMA) if c.offsets}
        assert f["fields/boxes"].attrs["type"] == "ndarray:float32:*,4"
        assert f["fields/boxes"].attrs["offsets"] == "field_offsets/boxes"
        o = f["field_offsets/boxes"][:]
        for i, row in enumerate(rows):  # plain h5py, no packer
            np.testing.assert_array_equal(f["fields/boxes"][o[i]:o[i + 1]], row["boxes"])
            assert f["fields/id"][i] == row["id"] and f["fields/score"][i] == row["score"]
        assert f["fields/image"].attrs["type"] == "image"
    assert packer.verify(out).ok


@settings(max_examples=25)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(-2**63, 2**63 - 1), st.text(max_size=8)),
                min_size=1, max_size=12),
       st.integers(1, 5), st.sampled_from([16, 100, 1 << 20]))
def test_any_rows_round_trip_through_any_commits_and_chunks(tmp_path_factory, rows, commit_every, chunk_bytes):
    schema = Schema({"n": "int", "s": "str", "v": "ndarray:float64:*,2", "t": "labels"})
    values = [{"n": n, "s": s, "v": np.arange(2 * k, dtype=np.float64).reshape(k, 2) - n % 7, "t": [n] * k}
              for k, n, s in rows]
    out = tmp_path_factory.mktemp("h") / "f.h5"
    _write(out, values, commit_every=commit_every, chunk_bytes=chunk_bytes, schema=schema)
    r = open_reader(out)
    for i, want in enumerate(values):
        got = schema.decode(r.read(i).data)
        assert (got["n"], got["s"], got["t"]) == (want["n"], want["s"], want["t"])
        np.testing.assert_array_equal(got["v"], want["v"])
    assert list(r.verify()) == []


def test_direct_reads_equal_reads_through_hdf5(tmp_path, rows):
    """Positioned reads from each field's chunk table (rows crossing chunk boundaries included:
    64-byte chunks) return what HDF5 itself returns."""
    out = tmp_path / "f.h5"
    _write(out, rows, chunk_bytes=64)
    direct, through = open_reader(out), open_reader(out)
    assert all(o.table is not None for o in direct._open().parts[0].columns.opened if o.rows)
    for o in through._open().parts[0].columns.opened:  # (a field pack is one part: never appended to)
        o.table = None
    for i in range(len(rows)):
        assert direct.read(i).data == through.read(i).data


def test_resume_cuts_every_field_back_to_the_journal(tmp_path, rows):
    ref, out = tmp_path / "ref.h5", tmp_path / "out.h5"
    _write(ref, rows)
    w = HDF5Writer(out, classes=[], commit_every=4)
    w.schema = SCHEMA
    w.open()
    for i, row in enumerate(rows[:14]):  # durable at 12, two samples more stored past it
        w.add(Sample(f"k{i}", SCHEMA.encode(row), BLOB_FMT, -1, 6, 8, 3))
    w._commit()
    w.abort()
    w = HDF5Writer(out, classes=[], commit_every=4)
    w.schema = SCHEMA
    w.open(resume_samples=12)
    for i, row in enumerate(rows[12:], 12):
        w.add(Sample(f"k{i}", SCHEMA.encode(row), BLOB_FMT, -1, 6, 8, 3))
    w.close()
    a, b = open_reader(ref), open_reader(out)
    assert [a.read(i) for i in range(len(a))] == [b.read(i) for i in range(len(b))]
    with h5py.File(ref, "r") as f, h5py.File(out, "r") as g:
        for name in ("fields", "field_offsets"):
            for k in f[name]:
                np.testing.assert_array_equal(f[name][k][()], g[name][k][()])


def test_a_sample_that_does_not_fit_its_schema_is_refused_before_anything_is_stored(tmp_path):
    w = HDF5Writer(tmp_path / "f.h5", classes=[])
    w.schema = Schema({"n": "int"})
    w.open()
    with pytest.raises(ValueError, match="field 'n': 4 bytes"):
        w.add(Sample("k", b"\x01\x00\x00\x00\x04\x00\x00\x00abcd", BLOB_FMT, -1, 0, 0, 0))
    with pytest.raises(ValueError, match="field sample"):
        w.add(Sample("j", JPEG, "jpeg", 0, 6, 8, 3))
    w.abort()


def test_image_packs_keep_their_layout(tmp_path):
    """An image-only pack has the datasets it had before field packs had datasets of their own
    (and ``sources``, the input table ``--append`` compares inputs with)."""
    src = write_image_folder(tmp_path / "src", count=6)
    out = tmp_path / "i.h5"
    packer.pack(src, out, format="hdf5", workers=0)
    with h5py.File(out, "r") as f:
        assert set(f) == {"blobs", "offsets", "shapes", "labels", "keys", "crc32c", "sources"}
        assert f["blobs"].chunks == (1 << 20,) and f["offsets"].chunks == (1 << 13,)


def test_a_field_pack_in_one_blob_per_sample_is_refused(tmp_path):
    """A development version stored a field pack's blobs in ``blobs``: refused with advice."""
    src = write_image_folder(tmp_path / "src", count=3)
    out = tmp_path / "i.h5"
    packer.pack(src, out, format="hdf5", workers=0)
    with h5py.File(out, "r+") as f:
        manifest = Manifest.from_json(f.attrs[MANIFEST_ATTR], "test")
        manifest.schema = [{"name": "image", "type": "image"}]
        f.attrs[MANIFEST_ATTR] = manifest.to_json()  # (its checksum recomputed)
    with pytest.raises(FormatError, match="pack it again"):
        open_reader(out).read(0)


def test_the_h5py_snippet_in_docs_reads_a_field(tmp_path, rows):
    """docs/fields.md's h5py example, run as written on a COCO-shaped pack."""
    from tests.support.coco import make_coco

    pytest.importorskip("pycocotools")
    src = make_coco(tmp_path, n_images=4)
    out = tmp_path / "val.h5"
    packer.pack(tmp_path, out, format="hdf5", coco=src["instances"], workers=0)
    text = (REPO / "docs" / "fields.md").read_text()
    code = re.search(r"```python\n(import h5py\n.*?)```", text, re.S).group(1)
    scope: dict = {}
    exec(compile(code.replace('"val.h5"', repr(str(out))), "docs/fields.md", "exec"), scope)
    ds = packer.PackedDataset(out, decode="bytes")
    np.testing.assert_array_equal(scope["boxes"], ds[1]["boxes"])
    assert scope["image_ids"].tolist() == [ds[i]["image_id"] for i in range(len(ds))]
    np.testing.assert_array_equal(scope["labels"], ds[1]["labels"])

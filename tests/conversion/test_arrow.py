"""Hugging Face datasets and Parquet as rows: every feature type becomes the field the docs
say, a dataset saved in several Arrow files or Parquet row groups lists its rows in order, each
row's values are what ``datasets`` itself returns, and no item holds a value."""
from __future__ import annotations

import numpy as np
import pytest

import packer
from packer.conversion.arrow import column_types, table_source
from packer.errors import UsageError
from tests.support.inputs import write_image_folder
from tests.support.sources import folder_files

datasets = pytest.importorskip("datasets")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

FEATURES = {
    "image": ("Image", "image"),
    "label": ("ClassLabel", "int"),
    "caption": ("string", "str"),
    "score": ("float32", "float"),
    "count": ("int16", "int"),
    "flag": ("bool", "int"),
    "raw": ("binary", "bytes"),
    "tags": ("Sequence(ClassLabel)", "labels"),
    "ids": ("Sequence(int64)", "labels"),
    "embedding": ("Sequence(float32)", "ndarray:float32:*"),
    "grid": ("Array2D(2, 3)", "ndarray:float32:*,3"),
    "meta": ("struct", "json"),
}


def _features():
    names = ["cat", "dog"]
    return datasets.Features({
        "image": datasets.Image(), "label": datasets.ClassLabel(names=names), "caption": datasets.Value("string"),
        "score": datasets.Value("float32"), "count": datasets.Value("int16"), "flag": datasets.Value("bool"),
        "raw": datasets.Value("binary"), "tags": datasets.Sequence(datasets.ClassLabel(names=names)),
        "ids": datasets.Sequence(datasets.Value("int64")), "embedding": datasets.Sequence(datasets.Value("float32")),
        "grid": datasets.Array2D(shape=(2, 3), dtype="float32"),
        "meta": {"a": datasets.Value("int32"), "b": datasets.Value("string")}})


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("arrow")
    files = folder_files(write_image_folder(root / "tree", count=9, classes=2))
    rng = np.random.default_rng(0)
    rows = {"image": [{"bytes": d, "path": f"{s}.jpg"} for _, s, d in files],
            "label": [i % 2 for i in range(len(files))], "caption": [f"caption {i}" for i in range(len(files))],
            "score": [float(np.float32(i / 3)) for i in range(len(files))], "count": list(range(len(files))),
            "flag": [i % 3 == 0 for i in range(len(files))], "raw": [bytes([i]) * i for i in range(len(files))],
            "tags": [[j % 2 for j in range(i % 3)] for i in range(len(files))],
            "ids": [list(range(i)) for i in range(len(files))],
            "embedding": [rng.random(i % 4).astype(np.float32).tolist() for i in range(len(files))],
            "grid": [rng.random((2, 3)).astype(np.float32).tolist() for _ in files],
            "meta": [{"a": i, "b": str(i)} for i in range(len(files))]}
    ds = datasets.Dataset.from_dict(rows, features=_features())
    ds.save_to_disk(str(root / "saved"), num_shards=3)
    return root


def test_every_feature_type_becomes_its_field(dataset):
    listing = table_source(dataset / "saved", "hf", failures=[])
    assert {name: t for name, t in zip(listing.schema.names, (f.spec() for f in listing.schema.fields))} == {
        name: kind for name, (_, kind) in FEATURES.items()}
    assert listing.classes == ["cat", "dog"]
    assert all(it.values is None for it in listing.items)
    assert [it.key for it in listing.items] == [f"{i:08d}" for i in range(9)]
    assert len({it.path for it in listing.items}) == 3  # three Arrow files, rows in the dataset's order


def test_rows_read_back_as_datasets_returns_them(dataset, tmp_path):
    theirs = datasets.load_from_disk(str(dataset / "saved")).cast_column("image", datasets.Image(decode=False))
    for src, kind in ((dataset / "saved", "hf"), (_as_parquet(theirs, tmp_path / "t.parquet"), "parquet")):
        out = tmp_path / f"{kind}.lmdb"
        packer.pack(src, out, workers=0)
        ds = packer.PackedDataset(out, decode="bytes")
        for i, row in enumerate(theirs):
            s = ds[i]
            assert s["image"] == row["image"]["bytes"]
            for name in ("label", "caption", "count", "raw", "tags", "ids", "meta"):
                assert s[name] == row[name], name
            assert s["flag"] == int(row["flag"]) and s["score"] == pytest.approx(row["score"], rel=0, abs=0)
            assert np.array_equal(s["embedding"], np.asarray(row["embedding"], np.float32))
            assert np.array_equal(s["grid"], np.asarray(row["grid"], np.float32))


def _as_parquet(ds, path):
    """The dataset as one Parquet file of row groups of 2 rows (several units, HF metadata kept)."""
    ds.to_parquet(str(path))
    pq.write_table(pq.read_table(path), path, row_group_size=2)
    return path


def test_without_metadata_types_come_from_arrow(tmp_path):
    table = pa.table({"jpg": pa.array([b"\xff\xd8"], pa.binary()), "n": [1], "x": [0.5], "s": ["a"],
                      "v": pa.array([[1.0, 2.0]], pa.list_(pa.float64()))})
    types, classes = column_types(table.schema, None)
    assert types == {"jpg": "image", "n": "int", "x": "float", "s": "str", "v": "ndarray:float64:*"}
    assert classes == {}


def test_audio_features_are_refused_naming_the_column(tmp_path):
    schema = pa.schema([("sound", pa.struct([("bytes", pa.binary()), ("path", pa.string())]))])
    with pytest.raises(UsageError, match="column 'sound': Audio"):
        column_types(schema, {"sound": {"_type": "Audio"}})

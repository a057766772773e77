"""Interop with the real peer: the ``tfrecord`` PyPI package reads our shards through our .idx
files, and files its writer made load in packer once ``packer index`` gave them indexes."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from packer.cli import main
from packer.data.datasets import PackedDataset
from packer.errors import CorruptData, FormatError
from packer.formats import detect_format, open_reader
from packer.formats.records import index_path, read_index
from packer.commands.inspection import verify_dataset
from packer.conversion.inputs import image_folder as walk_folder
from packer.synth import jpeg_bytes, natural_image

tfrecord = pytest.importorskip("tfrecord")
from tfrecord.reader import tfrecord_loader  # noqa: E402
from tfrecord.tools.tfrecord2idx import create_index  # noqa: E402

DESCRIPTION = {"image/encoded": "byte", "image/class/label": "int", "image/filename": "byte",
               "image/format": "byte", "image/height": "int"}


def cli(*args, ok=True):
    result = CliRunner().invoke(main, [str(a) for a in args])
    if ok:
        assert result.exit_code == 0, result.output
    return result


def test_tfrecord_package_reads_our_shards_through_our_idx(image_folder, tmp_path):
    out = tmp_path / "out"
    cli("to-records", image_folder, out, "--samples-per-shard", 5, "--workers", 0)
    items, _ = walk_folder(image_folder)
    manifest = json.loads((out / "packer.json").read_text())
    position = 0
    for s in manifest["shards"]:
        shard, idx = str(out / s["file"]), str(out / s["index"])
        assert s["count"] > 1  # the package's index loader needs >= 2 lines (see below)
        for k in range(s["count"]):
            # shard=(k, count) makes the package seek to our idx entry k and stop at entry k+1
            got = list(tfrecord_loader(shard, idx, DESCRIPTION, shard=(k, s["count"])))
            assert len(got) == 1
            item = items[position]
            assert got[0]["image/encoded"] == Path(item.path).read_bytes()
            assert int(got[0]["image/class/label"][0]) == item.label
            assert got[0]["image/filename"].decode() == item.key
            assert got[0]["image/format"] == b"jpeg"
            position += 1
        # the package's own indexer agrees with our .idx byte for byte
        theirs = tmp_path / "theirs.idx"
        create_index(shard, str(theirs))
        assert theirs.read_bytes() == Path(idx).read_bytes()
    assert position == len(items)


def _write_foreign(path: Path, records: list[dict]) -> None:
    writer = tfrecord.TFRecordWriter(str(path))
    for r in records:
        writer.write(r)
    writer.close()


@pytest.fixture
def foreign_dir(tmp_path) -> tuple[Path, list[tuple[bytes, int, str]]]:
    """Two files written by the tfrecord package (one with a single record), ImageNet-like features."""
    rng = np.random.default_rng(5)
    root = tmp_path / "foreign"
    root.mkdir()
    expected = []
    for name, n in (("part-a", 4), ("part-b", 1)):
        records = []
        for i in range(n):
            data = jpeg_bytes(natural_image(rng, 30, 40))
            label = int(rng.integers(1, 1001))  # ImageNet TF records use 1-based labels
            key = f"{name}/img{i}.JPEG"
            records.append({"image/encoded": (data, "byte"), "image/class/label": (label, "int"),
                            "image/filename": (key.encode(), "byte"),
                            "image/object/bbox/xmin": ([0.1, 0.5], "float"),
                            "image/class/text": (b"tench", "byte")})
            expected.append((data, label, key))
        _write_foreign(root / name, records)
    return root, expected


def test_packer_index_then_packed_dataset_reads_foreign_files(foreign_dir):
    root, expected = foreign_dir
    with pytest.raises(FormatError, match="packer index"):
        PackedDataset(root / "part-a")
    result = cli("index", root)
    assert "part-a.idx: 4 records" in result.output and "part-b.idx: 1 records" in result.output
    for name in ("part-a", "part-b"):
        theirs = root / f"{name}.theirs"
        create_index(str(root / name), str(theirs))
        assert theirs.read_bytes() == index_path(root / name).read_bytes()
        theirs.unlink()
    assert detect_format(root) == "records"
    ds = PackedDataset(root, decode="bytes")
    assert len(ds) == 5
    assert [ds[i] for i in range(5)] == [(d, lab) for d, lab, _ in expected]
    assert list(ds.keys) == [k for _, _, k in expected]
    # read the same files with the package itself; the one-record file without its index loader,
    # which cannot load a one-line index (np.loadtxt returns a 1-D array there)
    mine = {"image/encoded": "byte", "image/class/label": "int"}
    theirs = list(tfrecord_loader(str(root / "part-a"), str(index_path(root / "part-a")), mine))
    assert sorted(r["image/encoded"] for r in theirs) == sorted(d for d, _, _ in expected[:4])
    with pytest.raises(IndexError):
        list(tfrecord_loader(str(root / "part-b"), str(index_path(root / "part-b")), mine))
    single = list(tfrecord_loader(str(root / "part-b"), None, mine))
    assert [r["image/encoded"] for r in single] == [expected[4][0]]
    one = PackedDataset(root / "part-b", decode="bytes")  # a one-record file on its own
    assert len(one) == 1 and one[0] == (expected[4][0], expected[4][1])
    listed = PackedDataset([root / "part-b", root / "part-a"], decode="numpy")
    assert len(listed) == 5 and listed[0][0].shape == (30, 40, 3) and listed[0][1] == expected[4][1]


def test_inspect_and_verify_foreign_shards(foreign_dir):
    root, expected = foreign_dir
    cli("index", root / "part-a", root / "part-b")
    info = json.loads(cli("inspect", root, "--json").output)
    assert info["format"] == "records" and info["count"] == 5 and info["shards"] == 2
    assert info["samples"][0]["key"] == expected[0][2] and info["samples"][0]["format"] == "jpeg"
    assert "OK (5 samples checked)" in cli("verify", root).output
    offsets, sizes = read_index(index_path(root / "part-a"))
    with open(root / "part-a", "r+b") as f:
        f.seek(int(offsets[2] + sizes[2] - 10))
        f.write(b"\x00\x01\x02")
    result = cli("verify", root, ok=False)
    assert result.exit_code == 1 and "part-a at record 2" in result.output
    with pytest.raises(CorruptData, match="part-a at record 2"):
        open_reader(root).read(2)


def test_foreign_records_without_label_or_filename(tmp_path):
    data = jpeg_bytes(natural_image(np.random.default_rng(0), 20, 20))
    path = tmp_path / "bare.tfrecord"
    _write_foreign(path, [{"image/encoded": (data, "byte")}, {"image/encoded": (data, "byte")}])
    cli("index", path)
    reader = open_reader(path)
    assert reader.read(1).label == -1 and reader.keys[1] == "bare.tfrecord:1"
    assert reader.read(0).fmt == "jpeg"


def test_packer_index_refuses_what_is_not_a_tfrecord(tmp_path):
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"certainly not a tfrecord file")
    result = cli("index", junk, ok=False)
    assert result.exit_code == 1 and "junk.bin" in result.output and "record 0" in result.output
    good = tmp_path / "cut.tfrecord"
    _write_foreign(good, [{"image/encoded": (b"x" * 100, "byte")}] * 2)
    good.write_bytes(good.read_bytes()[:-30])
    result = cli("index", good, ok=False)
    assert "cut.tfrecord at record 1" in result.output and "truncated" in result.output
    assert verify_dataset(tmp_path / "nothing").problems

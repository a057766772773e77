"""Dataset sources end to end, in every format, against the peers' own libraries: a Hugging Face
``save_to_disk`` dataset (``ClassLabel`` and a caption) packs into a field pack that returns the
dataset's pixels, labels and captions; WebDataset shards written by ``webdataset.TarWriter`` pack
into exactly what packing the same files from a folder gives; Parquet files as the dataset;
resume after a kill, split runs and merge, resizing, the CLI."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import packer
from packer.cli import main
from packer.conversion.sources import detect_source
from packer.errors import ResumeRefused, UsageError
from packer.formats import FORMATS, open_reader
from tests.support.inputs import write_image_folder
from tests.support.killing import run_packer
from tests.support.outputs import packed_snapshot
from tests.support.sources import CAPTIONS, folder_files, write_hf, write_shards

datasets = pytest.importorskip("datasets")
pytest.importorskip("webdataset")
pytest.importorskip("pyarrow")

ALL = sorted(FORMATS)


def out_path(root: Path, fmt: str, name: str = "out") -> Path:
    return root / (f"{name}.h5" if FORMATS[fmt][0].single_file else name)


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    return write_image_folder(tmp_path_factory.mktemp("tree") / "train", count=23, classes=3)


@pytest.fixture(scope="module")
def hf(tree, tmp_path_factory) -> Path:
    return write_hf(tree, tmp_path_factory.mktemp("hf") / "saved")


def _same_as_folder(out: Path, ref: Path) -> None:
    """The output equals the folder's pack: every key, stored byte, label, class and the order
    (``created_by`` differs: the source)."""
    a, b = packed_snapshot(out), packed_snapshot(ref)
    assert a == b


@pytest.mark.parametrize("fmt", ALL)
def test_a_saved_hf_dataset_reads_back_its_pixels_labels_and_captions(hf, tmp_path, fmt):
    out = out_path(tmp_path, fmt)
    report = packer.pack(hf, out, format=fmt, workers=0)
    theirs = datasets.load_from_disk(str(hf))
    assert report.count == len(theirs) and report.failed == 0
    ds = packer.PackedDataset(out, decode="numpy")
    assert ds.classes == theirs.features["label"].names and len(ds) == len(theirs)
    raw = packer.PackedDataset(out, decode="bytes")
    for i, row in enumerate(theirs):
        s = ds[i]
        assert np.array_equal(s["image"], np.asarray(row["image"].convert("RGB")))
        assert s["label"] == row["label"] and s["caption"] == row["caption"]
    stored = theirs.cast_column("image", datasets.Image(decode=False))
    assert [raw[i]["image"] for i in range(len(stored))] == [r["image"]["bytes"] for r in stored]
    assert open_reader(out).keys[:2] == ["00000000", "00000001"]


@pytest.mark.parametrize("fmt", ALL)
def test_a_tar_of_the_folder_packs_as_the_folder(tree, tmp_path, fmt):
    ref = out_path(tmp_path, fmt, "ref")
    packer.pack(tree, ref, format=fmt, workers=0)
    write_shards(tree, tmp_path / "wds", per_shard=7, shuffle=3)  # members in another order than the folder's
    out = out_path(tmp_path, fmt)
    report = packer.pack(tmp_path / "wds", out, format=fmt, workers=0)
    assert report.failed == 0 and "sorted order" in report.labels
    _same_as_folder(out, ref)


@pytest.mark.parametrize("fmt", ALL)
def test_cls_labelled_shards_pack_as_the_folder(tree, tmp_path, fmt):
    ref = out_path(tmp_path, fmt, "ref")
    packer.pack(tree, ref, format=fmt, workers=0)
    write_shards(tree, tmp_path / "wds", per_shard=10, cls=True)  # folder order, labels in .cls
    pattern = str(tmp_path / "wds" / "shard-{000000..000002}.tar")
    out = out_path(tmp_path, fmt)
    packer.pack(pattern, out, format=fmt, workers=0, class_index=tree)  # the class names: the training tree's
    _same_as_folder(out, ref)
    plain = out_path(tmp_path, fmt, "numbered")
    packer.pack(pattern, plain, format=fmt, workers=0)
    assert open_reader(plain).manifest.classes == ["0", "1", "2"]


def test_workers_and_plans_give_the_same_output(tree, hf, tmp_path):
    write_shards(tree, tmp_path / "wds", per_shard=5, cls=True)
    for src in (tmp_path / "wds", hf):
        outs = []
        for k, (fmt, workers, check) in enumerate([("lmdb", 0, "full"), ("lmdb", 2, "full"), ("lmdb", 2, "header"),
                                                   ("hdf5", 2, "full"), ("records", 2, "full")]):
            out = out_path(tmp_path, fmt, f"{Path(src).name}-{k}")
            packer.pack(src, out, format=fmt, workers=workers, check=check)
            outs.append(out)
        first = packed_snapshot(outs[0])
        assert packed_snapshot(outs[1]) == first and packed_snapshot(outs[2]) == first
        for out in outs[3:]:
            snap = packed_snapshot(out)
            assert snap["keys"] == first["keys"] and snap["classes"] == first["classes"]
        # --samples-per-shard: one writer keeps the layout, verdict workers (the staged plan: the
        # writer's threads read each sample again) against this process alone
        staged = [out_path(tmp_path, "records", f"{Path(src).name}-staged-{w}") for w in (0, 2)]
        for out, w in zip(staged, (0, 2)):
            packer.pack(src, out, format="records", workers=w, samples_per_shard=5)
        assert packed_snapshot(staged[0]) == packed_snapshot(staged[1])


def test_shards_with_captions_and_arrays_are_field_packs(tree, tmp_path):
    write_shards(tree, tmp_path / "wds", per_shard=9, cls=True, extra=True)
    for fmt in ALL:
        out = out_path(tmp_path, fmt, fmt)
        packer.pack(tmp_path / "wds", out, format=fmt, workers=0)
        ds = packer.PackedDataset(out, decode="bytes")
        files = folder_files(tree)
        assert len(ds) == len(files)
        for i, (cls, stem, data) in enumerate(files):
            s = ds[i]
            assert s["image"] == data and s["label"] == sorted({c for c, _, _ in files}).index(cls)
            assert s["txt"] == CAPTIONS[i % len(CAPTIONS)] and s["json"] == {"i": i, "tags": [cls, stem]}
            assert np.array_equal(s["npy"], np.arange(i % 4 * 3, dtype=np.float32).reshape(-1, 3))
        assert open_reader(out).manifest.schema == packer.PackedDataset(out).manifest.schema


def test_parquet_files_pack_as_the_dataset(tree, hf, tmp_path):
    ref = out_path(tmp_path, "lmdb", "ref")
    packer.pack(hf, ref, workers=0)
    whole = write_hf(tree, tmp_path / "train.parquet", parquet=True)
    out = out_path(tmp_path, "lmdb", "one")
    packer.pack(whole, out, workers=0)
    assert packed_snapshot(out)["records"] == packed_snapshot(ref)["records"]
    # the same rows in three files with small row groups: a folder of them, and a glob
    import pyarrow.parquet as pq

    table = pq.read_table(whole)
    (tmp_path / "parts").mkdir()
    for k, start in enumerate(range(0, len(table), 10)):
        pq.write_table(table.slice(start, 10), tmp_path / "parts" / f"train-{k:05d}.parquet", row_group_size=3)
    for src in (tmp_path / "parts", str(tmp_path / "parts" / "train-*.parquet")):
        again = out_path(tmp_path, "lmdb", f"parts-{isinstance(src, str)}")
        packer.pack(src, again, workers=2)
        assert packed_snapshot(again)["records"] == packed_snapshot(ref)["records"]


def test_image_paths_and_a_plain_image_table(tree, tmp_path):
    ref = out_path(tmp_path, "lmdb", "ref")
    packer.pack(tree, ref, workers=0)
    src = write_hf(tree, tmp_path / "paths.parquet", parquet=True, caption=False, paths=True)
    out = out_path(tmp_path, "lmdb")
    report = packer.pack(src, out, workers=0)  # image + ClassLabel only: today's image pack
    assert "ClassLabel" in report.labels
    a, b = packed_snapshot(out), packed_snapshot(ref)
    assert a["records"] == b["records"] and a["classes"] == b["classes"] and a["kind"] == "images"
    assert packer.PackedDataset(out)[0][1] == 0


def test_a_class_index_renumbers_a_classlabel(tree, tmp_path):
    src = write_hf(tree, tmp_path / "plain", caption=False)
    names = datasets.load_from_disk(str(src)).features["label"].names
    (tmp_path / "map.txt").write_text("\n".join(["extra", *reversed(names)]) + "\n")  # another numbering
    out = out_path(tmp_path, "lmdb")
    packer.pack(src, out, workers=0, class_index=tmp_path / "map.txt")
    ds, theirs = packer.PackedDataset(out, decode="bytes"), datasets.load_from_disk(str(src))
    assert ds.classes == ["extra", *reversed(names)]
    assert [ds[i][1] for i in range(len(ds))] == [ds.classes.index(names[r["label"]]) for r in theirs]
    (tmp_path / "short.txt").write_text(names[0] + "\n")
    with pytest.raises(UsageError, match="classes not in"):
        packer.pack(src, out_path(tmp_path, "lmdb", "short"), workers=0, class_index=tmp_path / "short.txt")


def test_short_side_resizes_source_images(hf, tmp_path):
    out = out_path(tmp_path, "lmdb")
    packer.pack(hf, out, resize=packer.ResizeSpec(short_side=16), workers=0)
    ds = packer.PackedDataset(out, decode="numpy")
    assert min(ds[0]["image"].shape[:2]) == 16 and ds[0]["caption"] == CAPTIONS[0]
    assert open_reader(out).manifest.created_by["options"]["resize"]["short_side"] == 16


@pytest.mark.parametrize("fmt", ALL)
def test_kill_and_resume_equals_an_uninterrupted_run(tree, tmp_path, fmt):
    write_shards(tree, tmp_path / "wds", per_shard=6, cls=True, extra=True)
    cmd = {"lmdb": "to-lmdb", "hdf5": "to-hdf5", "records": "to-records"}[fmt]
    size = ["--samples-per-shard", "3"] if fmt == "records" else ["--commit-every", "3"]
    args = [cmd, str(tmp_path / "wds"), "--workers", "0", *size]
    ref, out = out_path(tmp_path, fmt, "ref"), out_path(tmp_path, fmt, "resumed")
    assert run_packer(*args, str(ref)).returncode == 0
    killed = run_packer(*args, str(out), kill_at="add:8")
    assert killed.returncode != 0 and not out.exists()
    resumed = run_packer(*args, "--resume", str(out))
    assert resumed.returncode == 0, resumed.stderr
    assert packed_snapshot(out) == packed_snapshot(ref)
    again = run_packer(*args, "--resume", str(out))
    assert again.returncode == 0 and "complete and verified" in again.stdout


def test_a_resume_refuses_a_changed_shard(tree, tmp_path):
    write_shards(tree, tmp_path / "wds", per_shard=30)
    out = out_path(tmp_path, "lmdb")
    packer.pack(tmp_path / "wds", out, workers=0)
    shard = tmp_path / "wds" / "shard-000000.tar"
    shard.write_bytes(shard.read_bytes() + bytes(10240))  # more padding: same samples, another file
    with pytest.raises(ResumeRefused, match="made differently"):
        packer.pack(tmp_path / "wds", out, workers=0, resume=True)


@pytest.mark.parametrize("source", ["wds fields", "wds images", "hf"])
def test_split_runs_merge_into_the_single_run(tree, hf, tmp_path, source):
    src = hf
    if source.startswith("wds"):
        src = tmp_path / "wds"
        write_shards(tree, src, per_shard=8, cls=True, extra=source == "wds fields")
    whole = out_path(tmp_path, "lmdb", "whole")
    packer.pack(src, whole, workers=0)
    parts = [out_path(tmp_path, "lmdb", f"part{k}") for k in range(3)]
    for k, part in enumerate(parts):
        packer.pack(src, part, workers=0, num_shards=3, shard_index=k)
    merged = out_path(tmp_path, "lmdb", "merged")
    packer.merge(parts, merged)
    assert packed_snapshot(merged) == packed_snapshot(whole)


def test_detection_and_forcing(tree, hf, tmp_path):
    write_shards(tree, tmp_path / "wds", per_shard=30)
    write_hf(tree, tmp_path / "t.parquet", parquet=True)
    assert detect_source(tree) == "folder"
    assert detect_source(tmp_path / "wds") == "wds"
    assert detect_source(tmp_path / "wds" / "shard-000000.tar") == "wds"
    assert detect_source(str(tmp_path / "wds" / "shard-{000000..000001}.tar")) == "wds"
    assert detect_source("https://example.org/shard-{000..009}.tar") == "wds"
    assert detect_source(hf) == "hf"
    assert detect_source(tmp_path / "t.parquet") == "parquet"
    assert detect_source(tree, "wds") == "wds"
    # a folder of shards forced to be a class-folder tree has no class folders
    with pytest.raises(UsageError, match="no class folders"):
        packer.pack(tmp_path / "wds", tmp_path / "x.lmdb", source_format="folder")
    with pytest.raises(UsageError, match="source_format"):
        packer.pack(tree, tmp_path / "y.lmdb", source_format="tar")


def test_a_dataset_dict_names_its_splits(tree, tmp_path):
    ds = datasets.load_from_disk(str(write_hf(tree, tmp_path / "one")))
    datasets.DatasetDict({"train": ds, "test": ds}).save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(UsageError, match=r"give one split's folder .*dd/train"):
        packer.pack(tmp_path / "dd", tmp_path / "out.lmdb")


def test_the_cli_packs_shards_and_datasets(tree, hf, tmp_path):
    write_shards(tree, tmp_path / "wds", per_shard=10, cls=True)
    pattern = str(tmp_path / "wds" / "shard-{000000..000002}.tar")
    r = CliRunner().invoke(main, ["to-records", pattern, str(tmp_path / "a"), "--workers", "0",
                                  "--class-index", str(tree)])
    assert r.exit_code == 0, r.output
    assert "23 samples from 23 inputs, 0 failed" in r.output
    ref = tmp_path / "ref"
    assert CliRunner().invoke(main, ["to-records", str(tree), str(ref), "--workers", "0"]).exit_code == 0
    assert packed_snapshot(tmp_path / "a")["records"] == packed_snapshot(ref)["records"]
    r = CliRunner().invoke(main, ["to-hdf5", str(hf), str(tmp_path / "b.h5"), "--workers", "0",
                                  "--short-side", "20"])
    assert r.exit_code == 0, r.output
    assert packer.PackedDataset(tmp_path / "b.h5")[3]["caption"] == CAPTIONS[3]
    r = CliRunner().invoke(main, ["to-lmdb", str(tree), str(tmp_path / "c"), "--source-format", "hf"])
    assert r.exit_code == 1 and "save_to_disk" in r.output
    r = CliRunner().invoke(main, ["to-lmdb", str(hf), str(tmp_path / "d"), "--shuffle", "1"])
    assert r.exit_code == 1 and "shuffle apply to plain image packs" in r.output


def test_shards_over_http_are_fetched_and_packed(tree, tmp_path, monkeypatch):
    pytest.importorskip("aiohttp")
    pytest.importorskip("fsspec")
    import functools
    import http.server
    import threading

    write_shards(tree, tmp_path / "www", per_shard=10, cls=True)
    monkeypatch.setenv("PACKER_CACHE_DIR", str(tmp_path / "cache"))
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path / "www"))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/shard-{{000000..000002}}.tar"
        out = out_path(tmp_path, "lmdb")
        report = packer.pack(url, out, workers=0, class_index=tree)
        local = out_path(tmp_path, "lmdb", "local")
        packer.pack(tmp_path / "www", local, workers=0, class_index=tree)
        assert report.failed == 0
        assert packed_snapshot(out)["records"] == packed_snapshot(local)["records"]
        assert json.dumps(open_reader(out).manifest.created_by).count("127.0.0.1") >= 1
        missing = f"http://127.0.0.1:{server.server_address[1]}/shard-{{000002..000003}}.tar"
        report = packer.pack(missing, out_path(tmp_path, "lmdb", "missing"), workers=0, max_failures=1)
        assert report.count == 3 and report.failures[0]["source"].endswith("shard-000003.tar")
    finally:
        server.shutdown()
        server.server_close()
    shutil.rmtree(tmp_path / "cache")


@pytest.mark.parametrize("module, extra", [("pyarrow", "hf"), ("braceexpand", "wds")])
def test_a_missing_extra_is_one_error_naming_it(tree, hf, tmp_path, monkeypatch, module, extra):
    write_shards(tree, tmp_path / "wds", per_shard=30)
    src = hf if extra == "hf" else str(tmp_path / "wds" / "shard-{000000..000000}.tar")
    monkeypatch.setitem(__import__("sys").modules, module, None)  # as if it were not installed
    with pytest.raises(UsageError, match=rf"pip install 'packer\[{extra}\]'"):
        packer.pack(src, tmp_path / "out.lmdb", workers=0)

"""``--append`` for field packs (``--coco``, ``--manifest``): a grown annotation file or sample
manifest adds the samples the pack lacks, and the result reads like one pack of the grown file,
every field of every sample, in every format; the stored samples stay byte for byte; a sample
whose image or annotations (row values) changed is reported, and replaced with ``--prune``;
new COCO categories get the labels after the pack's; what may not change is refused naming it."""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

import packer
from packer.cli import main
from packer.errors import UsageError
from packer.formats import FORMATS, open_reader
from tests.conversion.test_append import out_path, stored_hashes
from tests.support.coco import CATEGORY_IDS, make_coco

pytest.importorskip("pycocotools")

ALL = sorted(FORMATS)
OLD = 6  # images of the first file; the grown one has 8
NEW_CATEGORY = CATEGORY_IDS[-1]  # 18: the largest id, so it sorts after the pack's categories


def layout(fmt: str) -> dict:
    """Small commits (several shards, several LMDB transactions) so appends cross them."""
    return {"samples_per_shard": 2} if fmt == "records" else {"commit_every": 2}


def write_json(path: Path, doc: dict) -> Path:
    path.write_text(json.dumps(doc))
    return path


@pytest.fixture(scope="module")
def coco(tmp_path_factory) -> dict[str, Path]:
    """``full``: 8 images in 4 categories; ``old``: its first 6 images without category 18,
    whose annotations ``full`` gives only its 2 last images (a grown export with a new category)."""
    root = tmp_path_factory.mktemp("coco-append")
    full = json.loads(make_coco(root, n_images=8)["instances"].read_text())
    old_ids = {im["id"] for im in full["images"][:OLD]}
    full["annotations"] = [a for a in full["annotations"]
                           if a["image_id"] not in old_ids or a["category_id"] != NEW_CATEGORY]
    old = {**full, "images": full["images"][:OLD],
           "annotations": [a for a in full["annotations"] if a["image_id"] in old_ids],
           "categories": [c for c in full["categories"] if c["id"] != NEW_CATEGORY]}
    assert any(a["category_id"] == NEW_CATEGORY for a in full["annotations"])
    return {"root": root, "old": write_json(root / "old.json", old), "full": write_json(root / "full.json", full)}


def value(v):
    """A field's value as compared: arrays by dtype, shape and bytes; masks by their JSON."""
    if isinstance(v, np.ndarray):
        return (v.dtype.str, v.shape, v.tobytes())
    if isinstance(v, (list, tuple)):
        return [value(x) for x in v]
    if isinstance(v, dict):
        return {k: value(x) for k, x in v.items()}
    if hasattr(v, "to_json"):
        return v.to_json()
    return v


def dicts(path: Path, **kw) -> list[dict]:
    """Every sample's every field (the image as stored), as the dataset reads it."""
    ds = packer.PackedDataset(path, decode="bytes", **kw)
    return [{k: value(v) for k, v in ds[i].items()} for i in range(len(ds))]


def kept_bytes(out: Path, fmt: str, before: dict[str, str]) -> bool:
    if fmt == "hdf5":  # the first version's file is the first part, untouched
        parts = out.with_name(out.name + ".parts")
        return {"file": hashlib.sha256((parts / "v1.h5").read_bytes()).hexdigest()} == before
    after = stored_hashes(out, fmt)
    return {k: after[k] for k in before} == before


def pack(root: Path, out: Path, fmt: str, **kw):
    return packer.pack(root, out, format=fmt, workers=0, **layout(fmt), **kw)


@pytest.mark.parametrize("fmt", ALL)
def test_a_coco_append_reads_like_one_run_of_the_grown_file(fmt, coco, tmp_path):
    out, ref = out_path(tmp_path, fmt), out_path(tmp_path, fmt, "ref")
    pack(coco["root"], out, fmt, coco=coco["old"])
    before, first = stored_hashes(out, fmt), dicts(out)
    report = pack(coco["root"], out, fmt, coco=coco["full"], append=True)
    assert report.status == "appended" and report.version == 2 and (report.added, report.count) == (2, 8)
    assert f"1 new classes (cat{NEW_CATEGORY}) labelled from 3" in report.summary()
    pack(coco["root"], ref, fmt, coco=coco["full"])
    assert dicts(out) == dicts(ref)  # every field of every sample, position for position
    got, want = packer.PackedDataset(out), packer.PackedDataset(ref)
    assert got.classes == want.classes and got.categories == want.categories
    assert got.manifest.extra["coco"] == want.manifest.extra["coco"]
    assert kept_bytes(out, fmt, before)
    assert dicts(out, version=1) == first
    assert packer.PackedDataset(out, version=1).categories == [c for c in want.categories if c["id"] != NEW_CATEGORY]
    assert packer.verify(out).ok
    assert pack(coco["root"], out, fmt, coco=coco["full"], append=True).status == "current"


def test_a_new_category_that_sorts_first_is_labelled_after_the_packs(coco, tmp_path):
    """The documented rule: an existing category id keeps its label; a new one gets the next
    label even where a one-run pack (labels in ascending id) would give it an earlier one."""
    full = json.loads(coco["full"].read_text())
    for a in full["annotations"]:
        if a["category_id"] == NEW_CATEGORY:
            a["category_id"] = 0
    for c in full["categories"]:
        if c["id"] == NEW_CATEGORY:
            c.update(id=0, name="cat0")
    grown = write_json(tmp_path / "grown.json", full)
    out, ref = tmp_path / "out.lmdb", tmp_path / "ref.lmdb"
    pack(coco["root"], out, "lmdb", coco=coco["old"])
    pack(coco["root"], out, "lmdb", coco=grown, append=True)
    pack(coco["root"], ref, "lmdb", coco=grown)
    ds = packer.PackedDataset(out)
    assert [c["id"] for c in ds.categories] == [1, 3, 7, 0]
    assert ds.classes == ["cat1", "cat3", "cat7", "cat0"]
    assert [c["id"] for c in packer.PackedDataset(ref).categories] == [0, 1, 3, 7]
    got, want = dicts(out), dicts(ref)
    ids = [c["id"] for c in ds.categories]
    for g, w in zip(got, want):  # the same samples; labels are each object's category's label
        assert g["labels"] == value(np.array([ids.index(c) for c in np.frombuffer(g["category_ids"][2], "<i8")],
                                             dtype=np.int64))
        assert {k: v for k, v in g.items() if k != "labels"} == {k: v for k, v in w.items() if k != "labels"}


def test_a_changed_annotation_is_reported_and_replaced_with_prune(coco, tmp_path):
    full = json.loads(coco["full"].read_text())
    first = full["images"][0]
    changed = next(a for a in full["annotations"] if a["image_id"] == first["id"])
    changed["bbox"] = [changed["bbox"][0] + 1, *changed["bbox"][1:]]
    grown = write_json(tmp_path / "grown.json", full)
    out = tmp_path / "out.lmdb"
    pack(coco["root"], out, "lmdb", coco=coco["old"])
    old = dicts(out)
    report = pack(coco["root"], out, "lmdb", coco=grown, append=True)
    assert report.added == 2 and "1 stored inputs changed since they were packed, kept" in report.summary()
    assert f"e.g. {first['file_name']}" in report.summary()
    assert dicts(out)[:OLD] == old  # kept as packed
    report = pack(coco["root"], out, "lmdb", coco=grown, append=True, prune=True)
    assert report.version == 3 and report.added == 1 and "left out of this version" in report.summary()
    ref = tmp_path / "ref.lmdb"
    pack(coco["root"], ref, "lmdb", coco=grown)
    want = dicts(ref)
    got = dicts(out)
    assert got[:OLD - 1] == want[1:OLD] and got[OLD - 1:OLD + 1] == want[OLD:] and got[-1] == want[0]
    assert packer.verify(out).ok


def test_a_changed_image_file_is_reported(coco, tmp_path):
    root = tmp_path / "root"
    shutil.copytree(coco["root"], root, copy_function=shutil.copy2)
    out = tmp_path / "out.records"
    pack(root, out, "records", coco=coco["old"])
    name = json.loads(coco["old"].read_text())["images"][1]["file_name"]
    img = Image.open(root / name)
    img.save(root / name, quality=50)
    report = pack(root, out, "records", coco=coco["full"], append=True)
    assert f"1 stored inputs changed since they were packed, kept (--prune leaves them out), e.g. {name}" \
        in report.summary()


def _rows(root: Path, n: int) -> list[dict]:
    rng = np.random.default_rng(3)
    rows = []
    for i in range(n):
        name = f"pics/p{i}.png"
        if not (root / name).exists():
            (root / "pics").mkdir(parents=True, exist_ok=True)
            Image.fromarray(rng.integers(0, 255, (9 + i, 11, 3), dtype=np.uint8)).save(root / name)
        rows.append({"image": name, "caption": f"caption {i} ✓", "score": i / 3, "count": i * 10**9,
                     "embedding": [float(v) for v in range(i)], "meta": {"i": i}})
    return rows


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("fmt", ALL)
def test_a_manifest_append_reads_like_one_run_of_the_grown_manifest(fmt, tmp_path):
    root = tmp_path / "root"
    rows = _rows(root, 7)
    out, ref = out_path(tmp_path, fmt), out_path(tmp_path, fmt, "ref")
    pack(root, out, fmt, manifest=write_rows(tmp_path / "rows.jsonl", rows[:5]))
    before, first = stored_hashes(out, fmt), dicts(out)
    grown = write_rows(tmp_path / "rows.jsonl", rows)  # the same file, grown
    report = pack(root, out, fmt, manifest=grown, append=True)
    assert (report.status, report.added, report.count) == ("appended", 2, 7), report.summary()
    pack(root, ref, fmt, manifest=grown)
    assert dicts(out) == dicts(ref)
    assert kept_bytes(out, fmt, before) and dicts(out, version=1) == first
    assert packer.verify(out).ok
    rows[2]["score"] = 42.0  # a stored row's value changed
    report = pack(root, out, fmt, manifest=write_rows(grown, rows), append=True)
    assert report.status == "current" and "1 stored inputs changed since they were packed" in report.summary()
    report = pack(root, out, fmt, manifest=grown, append=True, prune=True)
    assert report.version == 3 and report.added == 1 and dicts(out)[-1]["score"] == 42.0
    assert sorted(d["image"] for d in dicts(out)) == sorted(d["image"] for d in dicts(ref))


def test_rows_without_images_are_matched_by_their_values(tmp_path):
    """Rows keyed by their line: the manifest file itself changes with every append, which
    does not make its stored rows changed; a row's values do."""
    rows = [{"text": f"row {i}", "n": i} for i in range(6)]
    out, ref = tmp_path / "out.lmdb", tmp_path / "ref.lmdb"
    path = tmp_path / "rows.jsonl"
    pack(tmp_path, out, "lmdb", manifest=write_rows(path, rows[:4]))
    report = pack(tmp_path, out, "lmdb", manifest=write_rows(path, rows), append=True)
    assert (report.added, report.count) == (2, 6) and "changed" not in report.summary()
    pack(tmp_path, ref, "lmdb", manifest=path)
    assert dicts(out) == dicts(ref)
    rows[1]["n"] = 100
    report = pack(tmp_path, out, "lmdb", manifest=write_rows(path, rows), append=True)
    assert "1 stored inputs changed since they were packed" in report.summary() and "row-00000002" in report.summary()


def test_what_a_field_append_may_not_change_is_refused(coco, tmp_path):
    out = tmp_path / "out.lmdb"
    pack(coco["root"], out, "lmdb", coco=coco["old"])
    version = open_reader(out).manifest.version

    def refused(match: str, **kw):
        with pytest.raises(UsageError, match=match):
            pack(coco["root"], out, "lmdb", append=True, **kw)

    doc = json.loads(coco["full"].read_text())
    renamed = {**doc, "categories": [{**c, "name": "dog"} if c["id"] == 3 else c for c in doc["categories"]]}
    refused(r"categories of the pack differ .*\n  category id 3: \{\"id\": 3, \"name\": \"cat3\"\} in the pack, "
            r"\{\"id\": 3, \"name\": \"dog\"\}", coco=write_json(tmp_path / "renamed.json", renamed))
    captions = make_coco(tmp_path / "caps", n_images=2, captions=True)["captions"]
    refused("holds COCO instances samples, the annotation file captions", coco=captions)
    rows = write_rows(tmp_path / "rows.jsonl", _rows(tmp_path / "r", 2))
    refused("is a COCO pack; append to it with --coco", manifest=rows)
    refused("is a field pack; append to it with --coco or --manifest")
    refused("--check", coco=coco["full"], check="header")
    keypoints = {**doc, "categories": [{**c, "keypoints": ["a", "b"], "skeleton": []} for c in doc["categories"]]}
    refused("categories of the pack differ", coco=write_json(tmp_path / "kp.json", keypoints))
    images = tmp_path / "images.lmdb"
    packer.pack(coco["root"], images, format="lmdb", workers=0)
    with pytest.raises(UsageError, match="not the samples of --coco or --manifest"):
        packer.pack(coco["root"], images, format="lmdb", workers=0, coco=coco["full"], append=True)
    with pytest.raises(UsageError, match="to a URL is not supported yet for lmdb outputs"):
        packer.pack(coco["root"], "s3://bucket/train", format="lmdb", coco=coco["full"], append=True)
    assert open_reader(out).manifest.version == version


def test_manifest_fields_that_differ_are_refused(tmp_path):
    root = tmp_path / "root"
    rows = _rows(root, 4)
    out = tmp_path / "out.records"
    pack(root, out, "records", manifest=write_rows(tmp_path / "rows.jsonl", rows))
    more = [{**r, "count": float(r["count"])} for r in rows]
    with pytest.raises(UsageError, match=r"fields differ from the pack's:\n  count: \{\"name\": \"count\", "
                                         r"\"type\": \"int\"\} in the pack, \{\"name\": \"count\", \"type\": \"float\"\}"):
        pack(root, out, "records", manifest=write_rows(tmp_path / "more.jsonl", more), append=True)


@pytest.mark.parametrize("fmt", ["records", "hdf5"])
def test_a_reader_opened_before_keeps_its_version(fmt, coco, tmp_path):
    out = out_path(tmp_path, fmt)
    pack(coco["root"], out, fmt, coco=coco["old"])
    ds = packer.PackedDataset(out, decode="bytes")
    first = [{k: value(v) for k, v in ds[i].items()} for i in range(len(ds))]
    pack(coco["root"], out, fmt, coco=coco["full"], append=True)
    assert len(ds) == OLD and [{k: value(v) for k, v in ds[i].items()} for i in range(len(ds))] == first
    assert len(packer.PackedDataset(out)) == 8


def test_the_cli_appends_a_coco_file(coco, tmp_path):
    out = tmp_path / "out.records"
    args = ["to-records", str(coco["root"]), str(out), "--workers", "0", "--samples-per-shard", "2"]
    r = CliRunner().invoke(main, [*args, "--coco", str(coco["old"])])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, [*args, "--coco", str(coco["full"]), "--append"])
    assert r.exit_code == 0 and "version 2: 2 samples added" in r.output, r.output
    r = CliRunner().invoke(main, ["inspect", str(out)])
    assert r.exit_code == 0 and "cat18" in r.output, r.output


@pytest.mark.parametrize("fmt", ALL)
def test_a_split_coco_append_reads_like_one_append(fmt, coco, tmp_path):
    """A grown COCO file appended by 2 jobs (``append_to``; part 0 through the CLI), merged with
    ``merge --append``: every field of every sample, the categories, as one ``--append``."""
    out, ref = out_path(tmp_path, fmt), out_path(tmp_path, fmt, "ref")
    pack(coco["root"], out, fmt, coco=coco["old"])
    pack(coco["root"], ref, fmt, coco=coco["old"])
    first = dicts(out)
    pack(coco["root"], ref, fmt, coco=coco["full"], append=True)
    parts = [out_path(tmp_path, fmt, f"part{i}") for i in range(2)]
    more = ["--samples-per-shard", "2"] if fmt == "records" else ["--commit-every", "2"]
    r = CliRunner().invoke(main, [f"to-{fmt}", str(coco["root"]), str(parts[0]), "--coco", str(coco["full"]),
                                  "--workers", "0", "--append-to", str(out), "--num-shards", "2",
                                  "--shard-index", "0", *more])
    assert r.exit_code == 0, r.output
    pack(coco["root"], parts[1], fmt, coco=coco["full"], append_to=out, num_shards=2, shard_index=1)
    assert [len(open_reader(p)) for p in parts] == [1, 1]  # each job packed its share of the new images
    report = packer.merge(parts, out, append=True)
    assert report.version == 2 and dicts(out) == dicts(ref) and dicts(out, version=1) == first
    got, want = packer.PackedDataset(out), packer.PackedDataset(ref)
    assert got.classes == want.classes and got.categories == want.categories
    assert packer.verify(out).ok
    assert pack(coco["root"], out, fmt, coco=coco["full"], append=True).status == "current"


def test_a_split_manifest_append_and_parts_of_other_fields(tmp_path):
    """A grown manifest's split append merges as one ``--append``; parts whose fields are not the
    pack's are refused by the job, before any work."""
    root = tmp_path / "root"
    rows = _rows(root, 7)
    out, ref = out_path(tmp_path, "lmdb"), out_path(tmp_path, "lmdb", "ref")
    pack(root, out, "lmdb", manifest=write_rows(tmp_path / "rows.jsonl", rows[:5]))
    pack(root, ref, "lmdb", manifest=write_rows(tmp_path / "rows.jsonl", rows[:5]))
    grown = write_rows(tmp_path / "rows.jsonl", rows)
    pack(root, ref, "lmdb", manifest=grown, append=True)
    parts = [out_path(tmp_path, "lmdb", f"part{i}") for i in range(3)]
    for i, part in enumerate(parts):
        pack(root, part, "lmdb", manifest=grown, append_to=out, num_shards=3, shard_index=i)
    assert packer.merge(parts, out, append=True).version == 2 and dicts(out) == dicts(ref)
    other = write_rows(tmp_path / "other.jsonl", [{**r, "score": str(r["score"])} for r in rows])
    with pytest.raises(UsageError, match="differ from the pack's"):
        pack(root, out_path(tmp_path, "lmdb", "bad"), "lmdb", manifest=other, append_to=out, num_shards=2,
             shard_index=0)
    assert not out_path(tmp_path, "lmdb", "bad").exists()

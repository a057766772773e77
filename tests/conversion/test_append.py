"""``--append``: an output grows by the inputs it lacks and reads exactly like one packed in one
run, sample for sample, in every format; the samples there stay byte for byte; each append is
a new version that readers can pin; what an append may not change is refused naming it."""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

import packer
from packer.cli import main
from packer.errors import FormatError, UsageError
from packer.formats import FORMATS, open_reader
from tests.support.inputs import write_image_folder

FORMATS_ = sorted(FORMATS)


def out_path(root: Path, fmt: str, name: str = "out") -> Path:
    return root / (f"{name}.h5" if fmt == "hdf5" else f"{name}.{fmt}")


def layout(fmt: str) -> dict:
    """Small commits (several shards, several LMDB transactions) so appends cross them."""
    return {"samples_per_shard": 16} if fmt == "records" else {"commit_every": 16}


@pytest.fixture(scope="module")
def trees(tmp_path_factory) -> dict[str, Path]:
    """``old``: 60 images in 3 classes; ``late``: 10 more of a fourth class (sorts last); kept
    apart so each test copies what it needs (mtimes kept)."""
    root = tmp_path_factory.mktemp("append")
    old = write_image_folder(root / "old", count=60, classes=3, size=(24, 32))
    late = write_image_folder(root / "late_src", count=10, classes=1, size=(24, 32), seed=7)
    (root / "late").mkdir()
    for i, path in enumerate(sorted((late / "class_0").iterdir())):
        path.rename(root / "late" / f"late_{i:04d}.jpg")
    return {"old": old, "late": root / "late"}


def grow(src: Path, trees: dict[str, Path], cls: str = "class_3") -> None:
    """Add the 10 late images to ``src`` as class ``cls`` (mtimes kept: copy2)."""
    shutil.copytree(trees["late"], src / cls, copy_function=shutil.copy2, dirs_exist_ok=True)


def fresh(tmp_path: Path, trees: dict[str, Path]) -> Path:
    src = tmp_path / "src"
    shutil.copytree(trees["old"], src, copy_function=shutil.copy2)
    return src


def samples(path: Path, **kw) -> list[tuple]:
    r = open_reader(path, **kw)
    try:
        return [(k, bytes(rec.data), rec.label, rec.fmt, rec.height, rec.width, rec.channels)
                for k, rec in zip(r.keys, (r.read(i) for i in range(len(r))))]
    finally:
        r.close()


def stored_hashes(out: Path, fmt: str) -> dict[str, str]:
    """sha256 of the stored bytes of every sample (LMDB values), or of the data files holding them."""
    if fmt == "lmdb":
        r = open_reader(out)
        try:
            return {str(i): hashlib.sha256(r.read_value(i)).hexdigest() for i in range(len(r))}
        finally:
            r.close()
    if fmt == "records":
        return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(out.glob("*.tfrecord*"))}
    return {"file": hashlib.sha256(out.read_bytes()).hexdigest()}


@pytest.mark.parametrize("fmt", FORMATS_)
def test_append_reads_like_one_run_and_keeps_the_stored_bytes(fmt, trees, tmp_path):
    src = fresh(tmp_path, trees)
    out, ref = out_path(tmp_path, fmt), out_path(tmp_path, fmt, "ref")
    packer.pack(src, out, format=fmt, workers=0, **layout(fmt))
    before, first = stored_hashes(out, fmt), samples(out)
    grow(src, trees)
    report = packer.pack(src, out, format=fmt, workers=0, append=True, **layout(fmt))
    assert report.status == "appended" and report.version == 2 and report.added == 10 and report.count == 70
    assert "1 new classes (class_3) labelled from 3" in report.summary()
    packer.pack(src, ref, format=fmt, workers=0, **layout(fmt))
    assert samples(out) == samples(ref)  # position for position: keys, bytes, labels, shapes
    assert open_reader(out).classes == open_reader(ref).classes == ["class_0", "class_1", "class_2", "class_3"]
    if fmt == "hdf5":  # the first version's file is the first part, untouched
        parts = out.with_name(out.name + ".parts")
        assert {"file": hashlib.sha256((parts / "v1.h5").read_bytes()).hexdigest()} == before
    else:
        after = stored_hashes(out, fmt)
        assert {k: after[k] for k in before} == before
    assert samples(out, version=1) == first
    assert packer.verify(out).ok
    assert packer.pack(src, out, format=fmt, workers=0, append=True, **layout(fmt)).status == "current"


@pytest.mark.parametrize("fmt", FORMATS_)
def test_new_inputs_in_old_classes_come_after_with_their_labels(fmt, trees, tmp_path):
    src = fresh(tmp_path, trees)
    out, ref = out_path(tmp_path, fmt), out_path(tmp_path, fmt, "ref")
    packer.pack(src, out, format=fmt, workers=0, **layout(fmt))
    grow(src, trees, cls="class_1")  # interleaved with the stored keys in a fresh pack's order
    packer.pack(src, out, format=fmt, workers=0, append=True, **layout(fmt))
    packer.pack(src, ref, format=fmt, workers=0, **layout(fmt))
    got, want = samples(out), samples(ref)
    assert sorted(got) == sorted(want)  # the same samples (key, bytes, label), ...
    assert [s[0] for s in got[60:]] == [f"class_1/late_{i:04d}.jpg" for i in range(10)]  # new ones last
    assert packer.verify(out).ok


@pytest.mark.parametrize("fmt", FORMATS_)
def test_versions_stay_readable_and_listed(fmt, trees, tmp_path):
    src = fresh(tmp_path, trees)
    out = out_path(tmp_path, fmt)
    packer.pack(src, out, format=fmt, workers=0, **layout(fmt))
    old = open_reader(out)
    grow(src, trees)
    packer.pack(src, out, format=fmt, workers=0, append=True, **layout(fmt))
    shutil.copy2(src / "class_0" / "img_0000.jpg", src / "class_0" / "zz.jpg")
    packer.pack(src, out, format=fmt, workers=0, append=True, **layout(fmt))
    assert [len(open_reader(out, version=v)) for v in (1, 2, 3)] == [60, 70, 71] and len(open_reader(out)) == 71
    assert len(old) == 60 and old.read(59).data == open_reader(out).read(59).data  # opened before: version 1
    m = open_reader(out).manifest
    assert (m.version, m.parent, m.added["samples"], [h["version"] for h in m.history]) == (3, 2, [70, 71], [1, 2])
    with pytest.raises(FormatError, match="has no version 4"):
        open_reader(out, version=4)
    ds = packer.PackedDataset(out, version=2, decode="bytes")
    assert len(ds) == 70 and ds.manifest.version == 2
    info = packer.inspect(out)
    assert [(v["version"], v["count"]) for v in info["versions"]] == [(1, 60), (2, 70), (3, 71)]
    result = packer.verify(out)
    assert result.ok and any("3 versions" in n for n in result.notes), result.notes


@pytest.mark.parametrize("fmt", FORMATS_)
def test_gone_and_changed_inputs_are_reported_or_pruned(fmt, trees, tmp_path):
    src = fresh(tmp_path, trees)
    out, ref = out_path(tmp_path, fmt), out_path(tmp_path, fmt, "ref")
    packer.pack(src, out, format=fmt, workers=0, **layout(fmt))
    (src / "class_2" / "img_0005.jpg").unlink()
    changed = src / "class_0" / "img_0003.jpg"
    changed.write_bytes((src / "class_0" / "img_0006.jpg").read_bytes())
    report = packer.pack(src, out, format=fmt, workers=0, append=True, **layout(fmt))
    assert report.status == "current" and len(open_reader(out)) == 60
    assert "1 stored inputs gone, kept (--prune leaves them out), e.g. class_2/img_0005.jpg" in report.summary()
    assert "1 stored inputs changed since they were packed" in report.summary()
    grow(src, trees)
    report = packer.pack(src, out, format=fmt, workers=0, append=True, prune=True, **layout(fmt))
    assert report.version == 2 and report.added == 11 and report.count == 69  # 60 - 2 + 10 + the changed one
    assert report.summary().count("left out of this version") == 2
    packer.pack(src, ref, format=fmt, workers=0, **layout(fmt))
    assert sorted(samples(out)) == sorted(samples(ref))
    assert len(open_reader(out, version=1)) == 60 and packer.verify(out).ok
    m = open_reader(out).manifest
    assert m.removed["samples"] == 2 and m.select and m.stored == 71


@pytest.mark.parametrize("option,value,line", [
    ("resize", packer.ResizeSpec(short_side=16), "--short-side: (unset) -> 16"),
    ("check", "header", '--check: "full" -> "header"'),
    ("exts", "jpg", "--ext: "),
])
def test_an_option_that_changes_the_bytes_must_match(option, value, line, trees, tmp_path):
    src = fresh(tmp_path, trees)
    out = out_path(tmp_path, "lmdb")
    packer.pack(src, out, format="lmdb", workers=0)
    grow(src, trees)
    before = (out / "packer.json").read_bytes()
    with pytest.raises(UsageError, match="cannot append, this run's options differ") as e:
        packer.pack(src, out, format="lmdb", workers=0, append=True, **{option: value})
    assert line in str(e.value)
    assert (out / "packer.json").read_bytes() == before and not (out / "versions").exists()


@pytest.mark.parametrize("fmt", FORMATS_)
def test_a_shuffled_pack_grows_in_its_seeds_order(fmt, trees, tmp_path):
    """A ``--shuffle SEED`` pack takes ``--append --shuffle SEED``: the stored samples stay where
    they are and the new ones follow in the order SEED's permutation of all the inputs gives
    them; another seed, or none, is refused naming it."""
    from packer.conversion.inputs import image_items, shuffle_items

    src = fresh(tmp_path, trees)
    out = out_path(tmp_path, fmt)
    packer.pack(src, out, format=fmt, workers=0, shuffle=5, **layout(fmt))
    first, before = samples(out), stored_hashes(out, fmt)
    grow(src, trees, cls="class_1")
    for seed, shown in ((None, r"\(unset\)"), (6, "6")):
        with pytest.raises(UsageError, match=f"--shuffle: 5 -> {shown}"):
            packer.pack(src, out, format=fmt, workers=0, append=True, shuffle=seed, **layout(fmt))
    report = packer.pack(src, out, format=fmt, workers=0, append=True, shuffle=5, **layout(fmt))
    assert (report.status, report.added, report.count) == ("appended", 10, 70)
    got = samples(out)
    new = {f"class_1/late_{i:04d}.jpg" for i in range(10)}
    every = [it.key for it in shuffle_items(image_items(src)[0], 5)]
    assert got[:60] == first and [s[0] for s in got[60:]] == [k for k in every if k in new]
    if fmt != "hdf5":
        after = stored_hashes(out, fmt)
        assert {k: after[k] for k in before} == before
    assert packer.verify(out).ok
    assert packer.pack(src, out, format=fmt, workers=0, append=True, shuffle=5, **layout(fmt)).status == "current"


def test_what_cannot_be_appended_to_is_refused(trees, tmp_path):
    src = fresh(tmp_path, trees)
    out = out_path(tmp_path, "lmdb")
    packer.pack(src, out, format="lmdb", workers=0)
    with pytest.raises(UsageError, match="is a lmdb output; append to it with to-lmdb"):
        packer.pack(src, out, format="records", workers=0, append=True)
    with pytest.raises(UsageError, match="--append and --overwrite exclude each other"):
        packer.pack(src, out, format="lmdb", append=True, overwrite=True)
    with pytest.raises(UsageError, match="--prune goes with --append"):
        packer.pack(src, out, format="lmdb", prune=True)
    with pytest.raises(UsageError, match="not with --num-shards"):
        packer.pack(src, out, format="lmdb", append=True, num_shards=2, shard_index=0)
    with pytest.raises(UsageError, match=r"--shuffle: \(unset\) -> 3"):
        packer.pack(src, out, format="lmdb", append=True, shuffle=3)
    part = out_path(tmp_path, "lmdb", "part")
    packer.pack(src, part, format="lmdb", workers=0, num_shards=2, shard_index=1)
    with pytest.raises(UsageError, match="merge the parts, then append to the merged output"):
        packer.pack(src, part, format="lmdb", workers=0, append=True)
    with pytest.raises(UsageError, match="to a URL is not supported yet"):
        packer.pack(src, "https://example.invalid/x.lmdb", append=True)


def _source_parts(kind: str, trees: dict[str, Path], root: Path) -> list[Path]:
    """The 60 old images as dataset-source files (a fresh pack's order), cut in 4 parts: tar shards
    (``.cls`` labels, class folders in the member names, or fields: a caption, a JSON, an array)
    or Parquet files of a ClassLabel (and a caption: a field pack)."""
    from tests.support.sources import write_hf, write_shards

    if kind.startswith("wds"):
        return write_shards(trees["old"], root / "all", per_shard=15, cls=kind == "wds-cls",
                            extra=kind == "wds-fields")
    import pyarrow.parquet as pq

    table = pq.read_table(write_hf(trees["old"], root / "whole.parquet", parquet=True,
                                   caption=kind == "parquet-captions"))
    (root / "all").mkdir()
    for k in range(4):
        pq.write_table(table.slice(15 * k, 15), root / "all" / f"train-{k:05d}.parquet", row_group_size=4)
    return sorted((root / "all").iterdir())


def _source(kind: str, trees: dict[str, Path], root: Path, copied: int) -> tuple[Path, list[Path]]:
    """``root/src``: a source of the first ``copied`` of ``_source_parts``' files (mtimes kept);
    and all the parts, to grow it by."""
    parts = _source_parts(kind, trees, root)
    src = root / "src"
    src.mkdir()
    for p in parts[:copied]:
        shutil.copy2(p, src / p.name)
    return src, parts


@pytest.mark.parametrize("fmt", FORMATS_)
@pytest.mark.parametrize("kind", ["wds-cls", "wds-folders", "wds-fields", "parquet", "parquet-captions"])
def test_a_source_grown_by_files_appends_like_one_run(kind, fmt, trees, tmp_path):
    """A dataset source grows by new files (tar shards, Parquet files): an append packs their
    samples, tells the stored ones by their container's size and mtime (the resume's identity),
    and reads exactly like packing the grown source in one run; the stored bytes stay. Image
    packs and field packs (captions, JSON, arrays) alike."""
    pytest.importorskip("webdataset")
    pytest.importorskip("datasets")
    src, parts = _source(kind, trees, tmp_path, 3)
    out, ref = out_path(tmp_path, fmt), out_path(tmp_path, fmt, "ref")
    packer.pack(src, out, format=fmt, workers=0, **layout(fmt))
    before, first = stored_hashes(out, fmt), samples(out)
    shutil.copy2(parts[3], src / parts[3].name)
    report = packer.pack(src, out, format=fmt, workers=0, append=True, **layout(fmt))
    assert (report.status, report.version, report.added, report.count) == ("appended", 2, 15, 60)
    packer.pack(src, ref, format=fmt, workers=0, **layout(fmt))
    if kind == "wds-folders":  # a fresh pack orders class-folder members by class: new ones come last here
        assert sorted(samples(out)) == sorted(samples(ref)) and samples(out)[:45] == first
    else:
        assert samples(out) == samples(ref)
    assert open_reader(out).classes == open_reader(ref).classes
    if fmt != "hdf5":
        after = stored_hashes(out, fmt)
        assert {k: after[k] for k in before} == before
    assert samples(out, version=1) == first and packer.verify(out).ok
    assert packer.pack(src, out, format=fmt, workers=0, append=True, **layout(fmt)).status == "current"


def test_a_rewritten_shard_is_reported_changed_and_prune_packs_it_anew(trees, tmp_path):
    pytest.importorskip("webdataset")
    src, parts = _source("wds-cls", trees, tmp_path, 4)
    out = out_path(tmp_path, "lmdb")
    packer.pack(src, out, format="lmdb", workers=0)
    first = samples(out)
    (src / parts[1].name).write_bytes(parts[1].read_bytes())  # the same members, a new mtime
    report = packer.pack(src, out, format="lmdb", workers=0, append=True)
    assert report.status == "current" and "15 stored inputs changed since they were packed, kept" in report.summary()
    assert samples(out) == first
    report = packer.pack(src, out, format="lmdb", workers=0, append=True, prune=True)
    assert report.status == "appended" and report.added == 15 and report.count == 60
    got = samples(out)
    assert sorted(got) == sorted(first) and got[:15] == first[:15] and got[-15:] == first[15:30]
    assert packer.verify(out).ok


@pytest.mark.parametrize("kind", ["wds-fields", "parquet-captions"])
def test_a_split_append_of_a_field_source_reads_like_one_append(kind, trees, tmp_path):
    """A source with fields grown by a file, appended by 2 jobs (``append_to``) and merged."""
    pytest.importorskip("webdataset")
    pytest.importorskip("datasets")
    src, parts = _source(kind, trees, tmp_path, 3)
    out, ref = out_path(tmp_path, "records"), out_path(tmp_path, "records", "ref")
    packer.pack(src, out, format="records", workers=0)
    packer.pack(src, ref, format="records", workers=0)
    shutil.copy2(parts[3], src / parts[3].name)
    packer.pack(src, ref, format="records", workers=0, append=True)
    jobs = [out_path(tmp_path, "records", f"part{i}") for i in range(2)]
    for i, job in enumerate(jobs):
        packer.pack(src, job, format="records", workers=0, append_to=out, num_shards=2, shard_index=i)
    assert packer.merge(jobs, out, append=True).version == 2
    assert samples(out) == samples(ref) and packer.verify(out).ok


def test_the_cli_appends_new_shards(trees, tmp_path):
    pytest.importorskip("webdataset")
    src, parts = _source("wds-cls", trees, tmp_path, 1)
    out = out_path(tmp_path, "records")
    assert CliRunner().invoke(main, ["to-records", str(src), str(out), "--workers", "0"]).exit_code == 0
    shutil.copy2(parts[1], src / parts[1].name)
    r = CliRunner().invoke(main, ["to-records", str(src), str(out), "--workers", "0", "--append"])
    assert r.exit_code == 0 and "version 2: 15 samples added" in r.output, r.output
    assert len(open_reader(out)) == 30 and packer.verify(out).ok


def test_an_export_is_not_appended_to(trees, tmp_path):
    src = fresh(tmp_path, trees)
    pack = out_path(tmp_path, "lmdb")
    packer.pack(src, pack, format="lmdb", workers=0)
    exported = tmp_path / "exported"
    packer.export(pack, exported, to="wds")
    files = sorted(p.name for p in exported.iterdir())
    with pytest.raises(UsageError, match="is a `packer export` output"):
        packer.pack(src, exported, format="lmdb", workers=0, append=True)
    assert sorted(p.name for p in exported.iterdir()) == files


def test_a_label_map_must_keep_the_labels(trees, tmp_path):
    src = fresh(tmp_path, trees)
    out = out_path(tmp_path, "lmdb")
    packer.pack(src, out, format="lmdb", workers=0)
    grow(src, trees)
    swapped = tmp_path / "swapped.txt"
    swapped.write_text("class_1\nclass_0\nclass_2\nclass_3\n")
    with pytest.raises(UsageError, match="gives label 0 to 'class_1', the pack to 'class_0'"):
        packer.pack(src, out, format="lmdb", workers=0, append=True, class_index=swapped)
    extended = tmp_path / "map.txt"
    extended.write_text("class_0\nclass_1\nclass_2\nother\nclass_3\n")
    report = packer.pack(src, out, format="lmdb", workers=0, append=True, class_index=extended)
    r = open_reader(out)
    assert report.added == 10 and r.classes == ["class_0", "class_1", "class_2", "other", "class_3"]
    assert {r.read(i).label for i in range(60, 70)} == {4}


def test_a_list_file_grows_too(trees, tmp_path):
    src = fresh(tmp_path, trees)
    grow(src, trees)
    lines = [f"class_{i % 3}/img_{i:04d}.jpg {i % 3}" for i in range(60)]
    listing = tmp_path / "train.txt"
    listing.write_text("\n".join(lines) + "\n")
    out, ref = out_path(tmp_path, "records"), out_path(tmp_path, "records", "ref")
    packer.pack(src, out, format="records", list_path=listing, workers=0)
    lines += [f"class_3/late_{i:04d}.jpg 7" for i in range(10)]
    listing.write_text("\n".join(lines) + "\n")
    packer.pack(src, out, format="records", list_path=listing, workers=0, append=True)
    packer.pack(src, ref, format="records", list_path=listing, workers=0)
    assert samples(out) == samples(ref) and open_reader(out).classes == [str(i) for i in range(8)]


def test_cli_appends_and_inspect_lists_versions(trees, tmp_path):
    src = fresh(tmp_path, trees)
    out = out_path(tmp_path, "records")
    runner = CliRunner()
    assert runner.invoke(main, ["to-records", str(src), str(out), "--workers", "0"]).exit_code == 0
    grow(src, trees)
    r = runner.invoke(main, ["to-records", str(src), str(out), "--workers", "0", "--append"])
    assert r.exit_code == 0, r.output
    assert "version 2: 10 samples added from 10 new inputs (70 in all)" in r.output
    r = runner.invoke(main, ["inspect", str(out), "--json"])
    assert r.exit_code == 0, r.output
    assert [v["version"] for v in json.loads(r.output)["versions"]] == [1, 2]
    r = runner.invoke(main, ["to-records", str(src), str(out), "--workers", "0", "--append", "--short-side", "8"])
    assert r.exit_code != 0 and "--short-side: (unset) -> 8" in r.output


def test_a_missing_output_is_packed_by_append(trees, tmp_path):
    src = fresh(tmp_path, trees)
    out = out_path(tmp_path, "lmdb")
    report = packer.pack(src, out, format="lmdb", workers=0, append=True)
    assert report.status == "done" and len(open_reader(out)) == 60


@pytest.mark.parametrize("fmt", FORMATS_)
def test_split_parts_merged_then_appended_and_appended_packs_merged(fmt, trees, tmp_path):
    src = fresh(tmp_path, trees)
    parts = [out_path(tmp_path, fmt, f"part{i}") for i in range(2)]
    for i, part in enumerate(parts):
        packer.pack(src, part, format=fmt, workers=0, num_shards=2, shard_index=i, **layout(fmt))
    merged, ref = out_path(tmp_path, fmt, "merged"), out_path(tmp_path, fmt, "ref")
    packer.merge(parts, merged)
    grow(src, trees)
    report = packer.pack(src, merged, format=fmt, workers=0, append=True, **layout(fmt))
    assert report.added == 10
    packer.pack(src, ref, format=fmt, workers=0, **layout(fmt))
    assert samples(merged) == samples(ref)
    # an appended pack merges like any complete output (its latest version)
    other_src, other = tmp_path / "other", out_path(tmp_path, fmt, "other")
    for k in range(4):  # the same four classes, other keys
        (other_src / f"class_{k}").mkdir(parents=True)
        shutil.copy2(src / "class_3" / f"late_{k:04d}.jpg", other_src / f"class_{k}" / f"extra_{k}.jpg")
    packer.pack(other_src, other, format=fmt, workers=0)
    both = out_path(tmp_path, fmt, "both")
    packer.merge([merged, other], both, any_parts=True)
    assert samples(both) == samples(merged) + samples(other)
    assert packer.verify(both).ok


def test_a_pruned_records_version_streams_its_own_samples(trees, tmp_path):
    src = fresh(tmp_path, trees)
    out = out_path(tmp_path, "records")
    packer.pack(src, out, format="records", workers=0, samples_per_shard=16)
    for name in ("img_0000.jpg", "img_0021.jpg"):
        (src / "class_0" / name).unlink()
    grow(src, trees)
    packer.pack(src, out, format="records", workers=0, samples_per_shard=16, append=True, prune=True)
    reader = open_reader(out)
    assert len(reader) == 68 and sum(reader.shard_counts) == 68
    ds = packer.StreamingDataset(out, decode="bytes", shuffle=True, seed=1)
    got = sorted(image for image, _ in ds)
    assert got == sorted(bytes(reader.read(i).data) for i in range(len(reader)))


def test_resume_of_an_appended_output_checks_its_options(trees, tmp_path):
    src = fresh(tmp_path, trees)
    out = out_path(tmp_path, "lmdb")
    packer.pack(src, out, format="lmdb", workers=0)
    grow(src, trees, cls="class_1")
    packer.pack(src, out, format="lmdb", workers=0, append=True)
    report = packer.pack(src, out, format="lmdb", workers=0, resume=True)
    assert report.status == "complete" and "rerun --append" in report.summary()
    with pytest.raises(packer.PackerError, match="--short-side: \\(unset\\) -> 16"):
        packer.pack(src, out, format="lmdb", workers=0, resume=True, resize=packer.ResizeSpec(short_side=16))
    r = CliRunner().invoke(main, ["inspect", str(out)])
    assert r.exit_code == 0 and "versions: 2 (reading 2" in r.output and "added stored 60..69" in r.output, r.output


def test_an_lmdb_appended_to_in_this_process_is_read_after_the_append(trees, tmp_path):
    """py-lmdb opens a file once per process: while this process's writer holds the output, a
    reader of it says so (OutputChanged), never CorruptData; after, it reads its version."""
    import lmdb

    from packer.errors import OutputChanged
    from packer.formats.lmdb import close_env

    src = fresh(tmp_path, trees)
    out = out_path(tmp_path, "lmdb")
    packer.pack(src, out, format="lmdb", workers=0)
    reader = open_reader(out)
    first = bytes(reader.read(0).data)
    close_env(out)  # what the append's writer does before it opens the environment
    env = lmdb.open(str(out), subdir=True, readahead=False)
    try:
        with pytest.raises(OutputChanged, match="being appended to by this process"):
            reader.read(0)
    finally:
        env.close()
    assert bytes(reader.read(0).data) == first
    hdf5 = out_path(tmp_path, "hdf5")
    packer.pack(src, hdf5, format="hdf5", workers=0)
    grow(src, trees)
    packer.pack(src, hdf5, format="hdf5", workers=0, append=True)
    part = packer.PackedDataset(hdf5.with_name(hdf5.name + ".parts") / "v2.h5", decode="bytes")
    assert len(part) == 10 and part.keys == [f"class_3/late_{i:04d}.jpg" for i in range(10)]


def test_overwrite_of_an_appended_hdf5_output_takes_its_parts_along(trees, tmp_path):
    src = fresh(tmp_path, trees)
    out = out_path(tmp_path, "hdf5")
    packer.pack(src, out, format="hdf5", workers=0)
    grow(src, trees)
    packer.pack(src, out, format="hdf5", workers=0, append=True)
    parts = out.with_name(out.name + ".parts")
    assert sorted(p.name for p in parts.iterdir()) == ["v1.h5", "v2.h5"]
    packer.pack(src, out, format="hdf5", workers=0, overwrite=True)
    assert not parts.exists() and len(open_reader(out)) == 70 and open_reader(out).version == 1

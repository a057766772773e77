"""A split append (``--append-to PACK --num-shards N --shard-index i``, then ``packer merge PARTS...
PACK --append``) reads exactly like one ``--append`` of the same inputs, in every format: the same
samples, keys, labels and classes; version 1's stored bytes untouched; and it is refused, naming
why, when the parts do not belong together or were planned against another version of PACK."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

import packer
from packer.cli import main
from packer.errors import UsageError
from packer.formats import FORMATS, open_reader
from tests.conversion.test_append import layout, out_path, samples, stored_hashes
from tests.support.inputs import write_image_folder

FORMATS_ = sorted(FORMATS)
N = 3


@pytest.fixture(scope="module")
def trees(tmp_path_factory) -> dict[str, Path]:
    """``old``: 30 images in 3 classes; ``late``: 8 images of 2 classes, added as a new class
    (``class_9``, sorts last) and as late files of ``class_1`` (sort inside the tree)."""
    root = tmp_path_factory.mktemp("split-append")
    old = write_image_folder(root / "old", count=30, classes=3, size=(24, 32))
    late = write_image_folder(root / "late", count=8, classes=2, size=(24, 32), seed=11)
    return {"old": old, "late": late}


def grow(src: Path, trees: dict[str, Path]) -> None:
    shutil.copytree(trees["late"] / "class_0", src / "class_9", copy_function=shutil.copy2)
    for p in sorted((trees["late"] / "class_1").iterdir()):
        shutil.copy2(p, src / "class_1" / f"z_{p.name}")


@pytest.fixture
def setup(trees, tmp_path):
    """``setup(fmt) -> (src, out, ref)``: version 1 of the old tree at ``out``, the tree grown,
    and ``ref``: a copy of version 1 appended to in one run (``--append``)."""
    def make(fmt: str) -> tuple[Path, Path, Path]:
        src = tmp_path / "src"
        shutil.copytree(trees["old"], src, copy_function=shutil.copy2)
        out, ref = out_path(tmp_path, fmt), out_path(tmp_path, fmt, "ref")
        packer.pack(src, out, format=fmt, workers=0, **layout(fmt))
        packer.pack(src, ref, format=fmt, workers=0, **layout(fmt))
        grow(src, trees)
        packer.pack(src, ref, format=fmt, workers=0, append=True, **layout(fmt))
        return src, out, ref

    return make


def split(src: Path, out: Path, fmt: str, root: Path, n: int = N, **kw) -> list[Path]:
    """The ``n`` parts of a split append of ``src`` to ``out`` (part 0 through the CLI)."""
    parts = [out_path(root, fmt, f"part{i}") for i in range(n)]
    more = ["--samples-per-shard", "16"] if fmt == "records" else ["--commit-every", "16"]
    r = CliRunner().invoke(main, [f"to-{fmt}", str(src), str(parts[0]), "--workers", "0", "--append-to", str(out),
                                  "--num-shards", str(n), "--shard-index", "0", *more])
    assert r.exit_code == 0, r.output
    for i in range(1, n):
        packer.pack(src, parts[i], format=fmt, workers=0, append_to=out, num_shards=n, shard_index=i,
                    **{**layout(fmt), **kw})
    return parts


@pytest.mark.parametrize("fmt", FORMATS_)
def test_a_split_append_reads_like_one_append(fmt, setup, tmp_path):
    src, out, ref = setup(fmt)
    before, first = stored_hashes(out, fmt), samples(out)
    parts = split(src, out, fmt, tmp_path)
    assert sum(len(open_reader(p)) for p in parts) == 8  # each job packed its share of the new inputs only
    r = CliRunner().invoke(main, ["merge", *map(str, reversed(parts)), str(out), "--append"])
    assert r.exit_code == 0, r.output
    assert "version 2: 8 samples added from 3 parts (38 in all)" in r.output
    assert samples(out) == samples(ref)  # keys, bytes, labels, shapes, position for position
    got, want = open_reader(out), open_reader(ref)
    assert got.classes == want.classes == ["class_0", "class_1", "class_2", "class_9"]
    added = {k: v for k, v in want.manifest.added.items() if k != "parts"}  # (HDF5: named after the output)
    assert got.manifest.version == 2 and {k: v for k, v in got.manifest.added.items() if k != "parts"} == added
    assert len(got.manifest.added.get("parts", ())) == len(want.manifest.added.get("parts", ()))
    assert samples(out, version=1) == first
    if fmt == "hdf5":  # version 1's file is the first part now
        import hashlib

        assert {"file": hashlib.sha256((out.with_name(out.name + ".parts") / "v1.h5").read_bytes())
                .hexdigest()} == before
    else:
        after = stored_hashes(out, fmt)
        assert {k: after[k] for k in before} == before
    assert CliRunner().invoke(main, ["verify", str(out)]).exit_code == 0
    # the merged version is a pack like any appended one: a later append finds nothing new
    assert packer.pack(src, out, format=fmt, workers=0, append=True, **layout(fmt)).status == "current"
    again = packer.merge(parts, out, append=True)  # a rerun after the publish: nothing to do
    assert again.version == 2 and "already" in again.summary() and open_reader(out).manifest.version == 2


def test_parts_planned_against_another_version_are_refused(setup, trees, tmp_path):
    src, out, _ = setup("lmdb")
    parts = split(src, out, "lmdb", tmp_path, n=2)
    (src / "class_9" / "extra.jpg").write_bytes((trees["old"] / "class_0" / sorted(
        p.name for p in (trees["old"] / "class_0").iterdir())[0]).read_bytes())
    packer.pack(src, out, format="lmdb", workers=0, append=True, **layout("lmdb"))  # version 2 meanwhile
    with pytest.raises(UsageError, match=r"holds version 2 .* planned against version 1 of"):
        packer.merge(parts, out, append=True)
    assert open_reader(out).manifest.version == 2


def test_what_a_split_append_merge_refuses(setup, tmp_path):
    src, out, _ = setup("lmdb")
    parts = split(src, out, "lmdb", tmp_path)
    with pytest.raises(UsageError, match="part 1 of 3 is missing"):
        packer.merge([parts[0], parts[2]], out, append=True)
    with pytest.raises(UsageError, match="given twice"):
        packer.merge([parts[0], parts[1], parts[2], parts[1]], out, append=True)
    with pytest.raises(UsageError, match="split append to .*merge --append"):
        packer.merge(parts, tmp_path / "new.lmdb")
    with pytest.raises(UsageError, match="not with --overwrite or --any-parts"):
        packer.merge(parts, out, append=True, any_parts=True)
    other = out_path(tmp_path, "lmdb", "other")
    shutil.copy2(sorted((src / "class_9").iterdir())[0], src / "class_9" / "zz.jpg")  # the tree changed meanwhile
    packer.pack(src, other, format="lmdb", workers=0, append_to=out, num_shards=3, shard_index=1, **layout("lmdb"))
    with pytest.raises(UsageError, match="different listings of the inputs"):
        packer.merge([parts[0], other, parts[2]], out, append=True)
    plain = [out_path(tmp_path, "lmdb", f"plain{i}") for i in range(2)]
    for i, p in enumerate(plain):
        packer.pack(src, p, format="lmdb", workers=0, num_shards=2, shard_index=i)
    with pytest.raises(UsageError, match="not a part of a split append"):
        packer.merge(plain, out, append=True)
    assert open_reader(out).manifest.version == 1 and len(open_reader(out)) == 30


def test_what_a_split_append_job_refuses(setup, tmp_path):
    src, out, _ = setup("records")
    part = out_path(tmp_path, "records", "part")
    for kw, match in (({"append": True}, "not with --append"), ({"shuffle": 1}, "not with --shuffle"),
                      ({"check": "header"}, "options differ from the pack's")):
        with pytest.raises(UsageError, match=match):
            packer.pack(src, part, format="records", workers=0, append_to=out, num_shards=2, **kw)
    with pytest.raises(UsageError, match="does not exist"):
        packer.pack(src, part, format="records", workers=0, append_to=tmp_path / "none.records", num_shards=2)
    with pytest.raises(UsageError, match="refusing an output that is the input"):
        packer.pack(src, out, format="records", workers=0, append_to=out, num_shards=2, resume=True)
    assert not part.exists()


def test_parts_of_an_output_that_holds_every_input_add_no_version(trees, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(trees["old"], src, copy_function=shutil.copy2)
    out = out_path(tmp_path, "records")
    packer.pack(src, out, format="records", workers=0, **layout("records"))
    parts = split(src, out, "records", tmp_path, n=2)
    report = packer.merge(parts, out, append=True)
    assert report.version == 1 and "nothing to append" in report.summary()
    assert open_reader(out).manifest.version == 1 and len(open_reader(out)) == 30


@pytest.mark.parametrize("fmt", FORMATS_)
def test_a_split_append_of_new_tar_shards_reads_like_one_append(fmt, trees, tmp_path):
    """A WebDataset source grown by shards, appended by 3 jobs and merged: as one ``--append``."""
    pytest.importorskip("webdataset")
    from tests.support.sources import write_shards

    shards = write_shards(trees["old"], tmp_path / "all", per_shard=6, cls=True)
    src = tmp_path / "wds"
    src.mkdir()
    for s in shards[:-2]:
        shutil.copy2(s, src / s.name)
    out, ref = out_path(tmp_path, fmt), out_path(tmp_path, fmt, "ref")
    packer.pack(src, out, format=fmt, workers=0, **layout(fmt))
    packer.pack(src, ref, format=fmt, workers=0, **layout(fmt))
    first = samples(out)
    for s in shards[-2:]:
        shutil.copy2(s, src / s.name)
    packer.pack(src, ref, format=fmt, workers=0, append=True, **layout(fmt))
    parts = split(src, out, fmt, tmp_path)
    assert sum(len(open_reader(p)) for p in parts) == len(samples(ref)) - len(first)
    report = packer.merge(parts, out, append=True)
    assert report.version == 2 and samples(out) == samples(ref) and samples(out, version=1) == first
    assert CliRunner().invoke(main, ["verify", str(out)]).exit_code == 0
    assert packer.pack(src, out, format=fmt, workers=0, append=True, **layout(fmt)).status == "current"

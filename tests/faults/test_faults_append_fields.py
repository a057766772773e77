"""An append to a field pack (``--coco``, ``--manifest``) never costs the version before it, and
no reader sees a mix of two versions (the field-pack side of tests/faults/test_faults_append.py).

* A SIGKILL at points of a ``--coco ... --append`` of a grown annotation file (mid-batch, during
  a commit, before each rename of its publish) leaves the output readable and verified as the
  previous version (or, past the manifest's replace, as the whole new one, its categories
  grown); rerunning the ``--append`` (or ``--append --resume``) completes it to what an
  uninterrupted append gives, nothing left behind. The same for a grown JSONL manifest.
* A dataset opened before an append, reading during and after it (the append in another
  process), returns only its own version's samples or ``OutputChanged``.
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

import packer
from packer.errors import OutputChanged
from packer.formats import FORMATS, open_reader
from tests.faults.test_faults_append import _copy
from tests.faults.test_faults_append import _killed_then_completed as killed_then_completed
from tests.support.coco import CATEGORY_IDS, make_coco
from tests.support.killing import packer_cmd, packer_env, run_packer

pytest.importorskip("pycocotools")

FMTS = sorted(FORMATS)
OLD, ALL_IMAGES = 8, 14  # the grown file: 6 more images, and category 18 new on them


def _out(root: Path, fmt: str, name: str = "out") -> Path:
    return root / (f"{name}.h5" if fmt == "hdf5" else f"{name}.{fmt}")


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """``old.json`` (8 images, no category 18) and ``full.json`` (14), over the same images; and a
    manifest ``rows.jsonl`` of the 14 images with ``rows_old.jsonl`` its first 8 rows."""
    root = tmp_path_factory.mktemp("append-fields")
    full = json.loads(make_coco(root, n_images=ALL_IMAGES)["instances"].read_text())
    old_ids = {im["id"] for im in full["images"][:OLD]}
    full["annotations"] = [a for a in full["annotations"] if a["image_id"] not in old_ids or a["category_id"] != 18]
    old = {**full, "images": full["images"][:OLD], "annotations": [a for a in full["annotations"]
                                                                   if a["image_id"] in old_ids],
           "categories": [c for c in full["categories"] if c["id"] != CATEGORY_IDS[-1]]}
    (root / "old.json").write_text(json.dumps(old))
    (root / "full.json").write_text(json.dumps(full))
    rows = [{"image": im["file_name"], "id": im["id"], "size": [im["width"], im["height"]]} for im in full["images"]]
    (root / "rows_old.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:OLD]))
    (root / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {"root": root}


def _argv_for(source: str):
    def argv(fmt: str, root: Path, out: Path, *more) -> list:
        layout = ("--samples-per-shard", "2") if fmt == "records" else ("--commit-every", "2")
        grown = "--append" in more
        file = {"coco": ("full.json" if grown else "old.json"),
                "manifest": ("rows.jsonl" if grown else "rows_old.jsonl")}[source]
        return [f"to-{fmt}", str(root), str(out), f"--{source}", str(root / file), "--workers", "0", *layout,
                *map(str, more)]

    return argv


_coco_argv, _manifest_argv = _argv_for("coco"), _argv_for("manifest")


def _samples(out: Path, **kw) -> list:
    r = open_reader(out, **kw)
    try:
        return [(k, bytes(rec.data)) for k, rec in zip(r.keys, (r.read(i) for i in range(len(r))))] \
            + [("extra", r.manifest.extra)]
    finally:
        r.close()


def _builder(files, root: Path, argv):
    done: dict[str, tuple] = {}

    def get(fmt: str) -> tuple[Path, Path, list]:
        if fmt not in done:
            v1 = _out(root / fmt, fmt, "v1")
            (root / fmt).mkdir(parents=True, exist_ok=True)
            r = run_packer(*argv(fmt, files["root"], v1))
            assert r.returncode == 0, r.stderr
            ref = _copy(v1, root / fmt / "ref")
            r = run_packer(*argv(fmt, files["root"], ref, "--append"))
            assert r.returncode == 0, r.stderr
            done[fmt] = (files["root"], v1, _samples(ref))
        return done[fmt]

    return get


@pytest.fixture(scope="module")
def built(files, tmp_path_factory):
    """``built(fmt) -> (root, v1, reference)`` of the COCO files, made once per format."""
    return _builder(files, tmp_path_factory.mktemp("append-coco-built"), _coco_argv)


@pytest.fixture(scope="module")
def built_rows(files, tmp_path_factory):
    """The same for the JSONL manifest."""
    return _builder(files, tmp_path_factory.mktemp("append-rows-built"), _manifest_argv)


POINTS = ["add:3", "journal:2", pytest.param("add:1", marks=pytest.mark.slow),
          pytest.param("journal:3", marks=pytest.mark.slow)]


@pytest.mark.parametrize("point", POINTS)
@pytest.mark.parametrize("fmt", FMTS)
def test_a_coco_append_killed_while_packing_keeps_the_last_version_and_completes(fmt, point, built, tmp_path):
    assert killed_then_completed(fmt, built, tmp_path, point, argv=_coco_argv, samples=_samples)


@pytest.mark.parametrize("fmt", ["lmdb", pytest.param("records", marks=pytest.mark.slow),
                                 pytest.param("hdf5", marks=pytest.mark.slow)])
def test_a_manifest_append_killed_while_packing_completes(fmt, built_rows, tmp_path):
    assert killed_then_completed(fmt, built_rows, tmp_path, "journal:2", argv=_manifest_argv, samples=_samples)


@pytest.mark.parametrize("fmt", [f if f == "lmdb" else pytest.param(f, marks=pytest.mark.slow) for f in FMTS])
def test_a_coco_append_killed_at_each_step_of_its_publish_completes(fmt, built, tmp_path):
    steps = 0
    while killed_then_completed(fmt, built, tmp_path, f"publish:{steps + 1}", resume=steps % 2 == 1,
                                argv=_coco_argv, samples=_samples):
        steps += 1
        assert steps < 40
    assert steps >= 4


@pytest.mark.parametrize("fmt", ["records", pytest.param("lmdb", marks=pytest.mark.slow),
                                 pytest.param("hdf5", marks=pytest.mark.slow)])
def test_a_dataset_opened_before_a_coco_append_reads_only_its_version(fmt, built, tmp_path):
    """Every field of every sample read over and over while the append runs in another process:
    version 1's or OutputChanged; after the publish still version 1's, its categories too."""
    root, v1, reference = built(fmt)
    out = _copy(v1, tmp_path)
    ds = packer.PackedDataset(out, decode="bytes", masks="rle")
    before = [repr(ds[i]) for i in range(len(ds))]
    categories = ds.categories
    proc = subprocess.Popen(packer_cmd(*_coco_argv(fmt, root, out, "--append")), env=packer_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    passes = 0
    while True:
        running = proc.poll() is None
        for i, want in enumerate(before):
            try:
                got = repr(ds[i])
            except OutputChanged:
                continue
            assert got == want, f"sample {i} is not version 1's"
        passes += 1
        if not running:
            break
    _, err = proc.communicate()
    assert proc.returncode == 0, err
    assert passes >= 1 and len(ds) == OLD and ds.categories == categories
    assert _samples(out) == reference and len(packer.PackedDataset(out)) == ALL_IMAGES

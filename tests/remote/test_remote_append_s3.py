"""``--append`` to an output at an S3 URL (moto's S3 server through s3fs): the output grows by new
objects and a swapped manifest, reads like one pack of all the inputs, keeps its shard objects
byte for byte; a reader opened before reads its version or ``OutputChanged``; an append
interrupted at any upload (or killed in staging) leaves the earlier version readable and
verified at the URL, and a rerun completes it (packer.remote.append)."""
from __future__ import annotations

import contextlib
import hashlib
import os
import shutil

import pytest
from click.testing import CliRunner

import packer
from packer.cli import main
from packer.commands.pack_images import pack_images
from packer.conversion.options import RunOptions
from packer.errors import OutputChanged, UsageError
from packer.formats import open_reader as open_local
from packer.formats.sidecars import KEYS_FILE
from packer.remote import RemoteOptions, RemoteSource, open_reader
from packer.remote.append import staged_append
from packer.remote.source import SUMS_NAME, parse_sums
from packer.remote.url import url_filesystem
from tests.support.inputs import write_image_folder
from tests.support.killing import packer_env, run_packer

pytestmark = pytest.mark.xdist_group("s3")  # one moto server for the S3 tests

LAYOUT = ("--samples-per-shard", 4, "--workers", 0)


@pytest.fixture(scope="module")
def trees(tmp_path_factory):
    """12 images in 3 classes, and 5 late ones (a fourth class, sorting last)."""
    root = tmp_path_factory.mktemp("grow")
    return {"old": write_image_folder(root / "old", count=12, classes=3, size=(24, 32)),
            "late": write_image_folder(root / "late", count=5, classes=1, size=(24, 32), seed=4) / "class_0"}


def _cli(*args):
    return CliRunner().invoke(main, list(map(str, args)))


def _src(tmp_path, trees):
    src = tmp_path / "src"
    shutil.copytree(trees["old"], src, copy_function=shutil.copy2)
    return src


def _grow(src, trees):
    shutil.copytree(trees["late"], src / "class_3", copy_function=shutil.copy2)


def _samples(reader):
    return [(k, bytes(r.data), r.label, r.fmt) for k, r in zip(reader.keys, (reader.read(i) for i in range(len(reader))))]


def _remote(url, s3, cache):
    return open_reader(url, remote=RemoteOptions(storage_options=s3.storage_options, cache_dir=cache))


def _objects(url, s3):
    """sha256 of every object under the output's URL, by name."""
    fs, base = url_filesystem(url, s3.storage_options)
    fs.invalidate_cache()  # (a listing is cached in the shared filesystem object)
    return {p[len(base) + 1:]: hashlib.sha256(fs.cat_file(p)).hexdigest() for p in fs.find(base)}


def _reference(src, tmp_path):
    ref = tmp_path / "ref.records"
    packer.pack(src, ref, format="records", samples_per_shard=4, workers=0)
    return _samples(open_local(ref))


def test_append_at_s3_reads_like_one_run_and_keeps_every_object(bucket, tmp_path, s3, trees):
    src, url = _src(tmp_path, trees), f"{bucket}/grow.records"
    assert _cli("to-records", src, url, *LAYOUT).exit_code == 0
    before_objects = _objects(url, s3)
    old = _remote(url, s3, tmp_path / "c-old")
    before = _samples(old)
    _grow(src, trees)
    r = _cli("to-records", src, url, *LAYOUT, "--append")
    assert r.exit_code == 0, r.output
    assert "version 2: 5 samples added" in r.output and "uploaded" in r.output, r.output
    new = _remote(url, s3, tmp_path / "c-new")
    assert new.manifest.version == 2 and new.manifest.parent == 1
    assert _samples(new) == _reference(src, tmp_path)  # keys, bytes, labels: one run of all 17
    after = _objects(url, s3)
    shards = [n for n in before_objects if ".tfrecord" in n]
    assert len(shards) == 6 and {n: after[n] for n in shards} == {n: before_objects[n] for n in shards}
    assert {"versions/1.json", "versions/2.json", "train-00003.tfrecord", "train-00004.tfrecord.idx"} <= set(after)
    listed = parse_sums(url_filesystem(url, s3.storage_options)[0].cat_file(f"{url}/{SUMS_NAME}").decode())
    assert "train-00004.tfrecord" in listed and "train-00000.tfrecord.idx" in listed and KEYS_FILE not in listed
    for i, sample in enumerate(before):  # the reader opened before keeps its version
        assert _samples_at(old, i) == sample
    crossed = _remote(url, s3, tmp_path / "c-old")  # opening v2 in its cache: the old reader is cut off
    assert len(crossed) == 17
    for i, sample in enumerate(before):
        try:
            assert _samples_at(old, i) == sample
        except OutputChanged:
            pass
    r = _cli("verify", url)
    assert r.exit_code == 0 and "OK (17 samples checked)" in r.output, r.output
    r = _cli("to-records", src, url, *LAYOUT, "--append")
    assert r.exit_code == 0 and "nothing to append" in r.output, r.output
    assert _objects(url, s3) == after  # nothing uploaded again


def _samples_at(reader, i):
    rec = reader.read(i)
    return (reader.keys[i], bytes(rec.data), rec.label, rec.fmt)


class _Stop(BaseException):
    """The upload stops here, as under a kill (nothing after it runs)."""


@pytest.mark.parametrize("stop", ["train-00003.tfrecord", SUMS_NAME, KEYS_FILE])
def test_an_append_stopped_between_uploads_leaves_v1_and_a_rerun_completes(bucket, tmp_path, s3, trees, stop):
    src, url = _src(tmp_path, trees), f"{bucket}/cut.records"
    assert _cli("to-records", src, url, *LAYOUT).exit_code == 0
    v1 = _samples(_remote(url, s3, tmp_path / "c1"))
    opened = RemoteSource(url, RemoteOptions(storage_options=s3.storage_options, cache_dir=tmp_path / "c0"))
    opened.refresh_manifest()  # a reader's open: manifest, then the hash list, then the files
    opened.sums = parse_sums(opened.optional_text(SUMS_NAME))
    _grow(src, trees)
    staged = staged_append(url)  # what packer.api does, in this process, to stop the upload
    pack_images(src, staged.local, format="records", writer_options={"samples_per_shard": 4},
                run_options=RunOptions(workers=0, append=True))

    def stop_at(name):
        if name == stop:
            raise _Stop

    with pytest.raises(_Stop):
        staged.upload(on_file=stop_at)
    mid = _remote(url, s3, tmp_path / "c2")  # opened now: version 1, as it was
    assert mid.manifest.version == 1 and _samples(mid) == v1
    r = _cli("verify", url)
    assert r.exit_code == 0 and "OK (12 samples checked)" in r.output, r.output
    if stop != "train-00003.tfrecord":  # keys.json off the hash list, or rewritten: never another version's
        with pytest.raises(OutputChanged) if stop == KEYS_FILE else contextlib.nullcontext():
            opened.fetch(KEYS_FILE)
    r = _cli("to-records", src, url, *LAYOUT, "--append")
    assert r.exit_code == 0 and "uploaded" in r.output, r.output
    done = _remote(url, s3, tmp_path / "c3")
    assert done.manifest.version == 2 and _samples(done) == _reference(src, tmp_path)
    assert not staged.local.exists()  # the staging mirror goes once the version is up


def test_a_kill_in_staging_leaves_v1_and_a_rerun_completes(bucket, tmp_path, s3, trees):
    src, url = _src(tmp_path, trees), f"{bucket}/killed.records"
    assert _cli("to-records", src, url, *LAYOUT).exit_code == 0
    v1 = _samples(_remote(url, s3, tmp_path / "c1"))
    _grow(src, trees)
    aws = {k: os.environ[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL",
                                      "AWS_DEFAULT_REGION", "PACKER_CACHE_DIR", "PACKER_STAGING_DIR")}
    args = ("to-records", src, url, *LAYOUT, "--append")
    killed = run_packer(*args, env=packer_env("publish:2", **aws))  # SIGKILL in the version's publish
    assert killed.returncode == -9, killed.stderr.decode()
    mid = _remote(url, s3, tmp_path / "c2")
    assert mid.manifest.version == 1 and _samples(mid) == v1
    r = _cli(*args)
    assert r.exit_code == 0 and "uploaded" in r.output, r.output
    assert _samples(_remote(url, s3, tmp_path / "c3")) == _reference(src, tmp_path)


def test_what_an_append_at_a_url_may_not_do_is_refused(bucket, tmp_path, s3, trees):
    src = _src(tmp_path, trees)
    r = _cli("to-records", src, f"{bucket}/new.records", *LAYOUT, "--append")  # nothing there: a plain pack
    assert r.exit_code == 0 and "uploaded" in r.output, r.output
    _grow(src, trees)
    r = _cli("to-records", src, f"{bucket}/new.records", "--samples-per-shard", 5, "--workers", 0, "--append")
    assert r.exit_code != 0 and "--samples-per-shard: 4 -> 5" in r.output, r.output
    assert f"{bucket}/new.records: cannot append" in r.output and "staging" not in r.output
    for fmt, name in (("lmdb", "img.lmdb"), ("hdf5", "img.h5")):  # one object each: refused before any work
        r = _cli(f"to-{fmt}", src, f"{bucket}/{name}", "--workers", 0, "--append")
        assert r.exit_code != 0 and f"not supported yet for {fmt} outputs" in r.output, r.output
    assert _cli("to-lmdb", trees["old"], f"{bucket}/img.lmdb", "--workers", 0).exit_code == 0
    r = _cli("to-records", src, f"{bucket}/img.lmdb", *LAYOUT, "--append")  # what is there decides
    assert r.exit_code != 0 and "not supported yet for lmdb outputs" in r.output, r.output
    assert _remote(f"{bucket}/new.records", s3, tmp_path / "c").manifest.version == 1


def _appended_in_staging(src, url, trees):
    """``url`` packed from ``src``, the tree grown, and the append made in its staging mirror,
    not uploaded yet (``staged.upload()`` does that)."""
    assert _cli("to-records", src, url, *LAYOUT).exit_code == 0
    _grow(src, trees)
    staged = staged_append(url)
    pack_images(src, staged.local, format="records", writer_options={"samples_per_shard": 4},
                run_options=RunOptions(workers=0, append=True))
    return staged


def test_an_output_replaced_under_the_append_is_not_overwritten(bucket, tmp_path, s3, trees, monkeypatch):
    src, url = _src(tmp_path, trees), f"{bucket}/raced.records"
    staged = _appended_in_staging(src, url, trees)
    other = write_image_folder(tmp_path / "other", count=6, classes=2, size=(24, 32), seed=9)
    with monkeypatch.context() as host:  # another host (its own staging folder) replaces the output
        host.setenv("PACKER_STAGING_DIR", str(tmp_path / "other-host"))
        assert packer.pack(other, url, format="records", samples_per_shard=4, workers=0, overwrite=True).count == 6
    with pytest.raises(UsageError, match="no longer the version this append continues"):
        staged.upload()
    assert len(_remote(url, s3, tmp_path / "c")) == 6  # the other writer's output, as it published it


def test_a_manifest_swapped_in_after_the_last_check_is_not_overwritten(bucket, tmp_path, s3, trees, monkeypatch):
    """Another writer's manifest landing between the append's last re-read and its own swap: S3
    refuses the append's conditional write (If-Match on the ETag it read), so the other
    version stays as published, and the append says so instead of overwriting it."""
    from packer.remote import upload

    src, url = _src(tmp_path, trees), f"{bucket}/swapped.records"
    staged = _appended_in_staging(src, url, trees)
    fs, base = url_filesystem(url, s3.storage_options)
    theirs = fs.cat_file(f"{base}/packer.json").replace(b'"count"', b'"count" ', 1)  # same data, other bytes
    put = upload._Uploader.put

    def swapped_first(self, name, path, *args, **kw):
        if name == "packer.json":
            fs.pipe_file(f"{base}/packer.json", theirs)
        return put(self, name, path, *args, **kw)

    monkeypatch.setattr(upload._Uploader, "put", swapped_first)
    with pytest.raises(UsageError, match="another writer replaced it"):
        staged.upload()
    fs.invalidate_cache()
    assert fs.cat_file(f"{base}/packer.json") == theirs


def test_a_conditional_swap_retried_after_it_landed_succeeds(bucket, tmp_path, s3, trees, monkeypatch):
    """The swap's write lands but its answer is lost, and the retry is refused by S3 (the ETag is
    now the append's own): the append reads its own manifest there and goes on."""
    from packer.remote import upload

    src, url = _src(tmp_path, trees), f"{bucket}/retried.records"
    assert _cli("to-records", src, url, *LAYOUT).exit_code == 0
    _grow(src, trees)
    put_if, lost = upload._Uploader._put_if, []

    def answer_lost(self, name, data, etag):
        put_if(self, name, data, etag)
        if not lost:
            lost.append(name)
            raise ConnectionResetError("the answer was lost")

    monkeypatch.setattr(upload._Uploader, "_put_if", answer_lost)
    r = _cli("to-records", src, url, *LAYOUT, "--append")
    assert r.exit_code == 0, r.output
    assert lost == ["packer.json"] and _remote(url, s3, tmp_path / "c").manifest.version == 2


def test_a_coco_pack_at_s3_grows_with_its_annotation_file(bucket, tmp_path, s3):
    """A field pack (COCO) at a URL takes --append as an image pack does: its grown annotation
    file's new images go up as new objects, the manifest last; it reads like one pack of the
    grown file, every field of every sample, and its old shard objects stay byte for byte."""
    pytest.importorskip("pycocotools")
    from tests.commands.test_pack_fields_append import dicts
    from tests.support.coco import make_coco

    files = make_coco(tmp_path / "coco", n_images=8)
    full = files["instances"]
    import json

    doc = json.loads(full.read_text())
    keep = {im["id"] for im in doc["images"][:6]}
    old = tmp_path / "old.json"
    old.write_text(json.dumps({**doc, "images": doc["images"][:6],
                               "annotations": [a for a in doc["annotations"] if a["image_id"] in keep]}))
    root, url = tmp_path / "coco", f"{bucket}/coco.records"
    assert _cli("to-records", root, url, "--coco", old, *LAYOUT).exit_code == 0
    before = _objects(url, s3)
    r = _cli("to-records", root, url, "--coco", full, *LAYOUT, "--append")
    assert r.exit_code == 0 and "version 2: 2 samples added" in r.output, r.output
    ref = tmp_path / "ref.records"
    packer.pack(root, ref, format="records", coco=full, samples_per_shard=4, workers=0)
    local = tmp_path / "mirror.records"
    fs, base = url_filesystem(url, s3.storage_options)
    fs.get(base, str(local), recursive=True)
    assert dicts(local) == dicts(ref)
    after = _objects(url, s3)
    assert {n: after[n] for n in before if ".tfrecord" in n} == {n: v for n, v in before.items() if ".tfrecord" in n}
    assert len(_remote(url, s3, tmp_path / "c")) == 8

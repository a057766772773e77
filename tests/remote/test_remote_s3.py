"""Writing to and reading from S3 (moto's standalone S3 server through s3fs): conversions to a
URL, an upload interrupted and resumed, and ``packer merge`` of remote parts."""
from __future__ import annotations


import pytest
from click.testing import CliRunner

from packer.cli import main
from packer.commands.pack_images import pack_images
from packer.data import PackedDataset
from packer.errors import PackerError
from packer.remote import open_reader
from packer.remote import RemoteOptions
from packer.remote.upload import remote_exists, staged_output
from packer.conversion.options import RunOptions
from tests.support.inputs import write_image_folder

# xdist: these tests share one worker, so the moto S3 server (a session fixture) starts once
pytestmark = pytest.mark.xdist_group("s3")


def _all(ds):
    return [ds[i] for i in range(len(ds))]


def _cli(*args):
    return CliRunner().invoke(main, list(map(str, args)))


def test_convert_to_s3_then_read_inspect_verify(bucket, tmp_path, s3):
    src = write_image_folder(tmp_path / "src", count=30)
    url = f"{bucket}/ds"
    r = _cli("to-records", src, url, "--samples-per-shard", 8, "--workers", 0)
    assert r.exit_code == 0, r.output
    assert "uploaded" in r.output
    local = tmp_path / "local"
    pack_images(src, local, format="records", writer_options={"samples_per_shard": 8},
                run_options=RunOptions(workers=0))
    opts = RemoteOptions(storage_options=s3.storage_options, cache_dir=tmp_path / "c")
    assert _all(PackedDataset(url, decode="bytes", remote=opts)) == _all(PackedDataset(local, decode="bytes"))
    r = _cli("verify", url)
    assert r.exit_code == 0 and "OK (30 samples checked)" in r.output, r.output
    r = _cli("to-records", src, url, "--workers", 0)
    assert r.exit_code != 0 and "already there" in r.output
    r = _cli("to-records", src, url, "--samples-per-shard", 8, "--workers", 0, "--resume")
    assert r.exit_code == 0 and "nothing to do" in r.output, r.output


@pytest.mark.parametrize("fmt", ["hdf5", "lmdb"])
def test_hdf5_and_lmdb_to_s3_and_back(bucket, tmp_path, s3, fmt):
    src = write_image_folder(tmp_path / "src", count=10)
    url = f"{bucket}/img.{'h5' if fmt == 'hdf5' else 'lmdb'}"
    r = _cli(f"to-{fmt}", src, url, "--workers", 0)
    assert r.exit_code == 0, r.output
    local = tmp_path / f"local.{fmt}"
    pack_images(src, local, format=fmt, run_options=RunOptions(workers=0))
    got = PackedDataset(url, decode="bytes", remote=RemoteOptions(storage_options=s3.storage_options,
                                                                  cache_dir=tmp_path / "c"))
    assert _all(got) == _all(PackedDataset(local, decode="bytes"))


def test_interrupted_upload_is_never_a_dataset_and_resume_finishes_it(bucket, tmp_path, s3):
    src = write_image_folder(tmp_path / "src", count=40)
    url = f"{bucket}/cut"
    staged = staged_output(url)
    pack_images(src, staged.local, format="records", writer_options={"samples_per_shard": 5},
                run_options=RunOptions(workers=0))
    done = []

    def killed_after_three(name):
        done.append(name)
        if len(done) == 3:
            raise KeyboardInterrupt  # the upload stops here, as under Ctrl-C or a kill

    with pytest.raises(KeyboardInterrupt):
        staged.upload(on_file=killed_after_three)
    assert not remote_exists(url, s3.storage_options)  # no manifest: not a dataset
    with pytest.raises(PackerError):
        open_reader(url, remote=RemoteOptions(storage_options=s3.storage_options, cache_dir=tmp_path / "c"))
    r = _cli("to-records", src, url, "--samples-per-shard", 5, "--workers", 0)
    assert r.exit_code != 0 and "--resume" in r.output  # the staging copy is there
    r = _cli("to-records", src, url, "--samples-per-shard", 5, "--workers", 0, "--resume")
    assert r.exit_code == 0, r.output
    assert "3 already there" in r.output
    local = tmp_path / "local"
    pack_images(src, local, format="records", writer_options={"samples_per_shard": 5},
                run_options=RunOptions(workers=0))
    remote = PackedDataset(url, decode="bytes", remote=RemoteOptions(storage_options=s3.storage_options,
                                                                     cache_dir=tmp_path / "c2"))
    assert _all(remote) == _all(PackedDataset(local, decode="bytes"))


def test_merge_remote_parts_into_a_remote_output(bucket, tmp_path, s3):
    src = write_image_folder(tmp_path / "src", count=30)
    for i in range(2):
        r = _cli("to-records", src, f"{bucket}/part{i}", "--num-shards", 2, "--shard-index", i,
                 "--samples-per-shard", 6, "--workers", 0)
        assert r.exit_code == 0, r.output
    r = _cli("merge", f"{bucket}/part1", f"{bucket}/part0", f"{bucket}/merged")
    assert r.exit_code == 0, r.output
    assert "merged 2 parts, 30 samples" in r.output
    whole = tmp_path / "whole"
    pack_images(src, whole, format="records", writer_options={"samples_per_shard": 6},
                run_options=RunOptions(workers=0))
    merged = PackedDataset(f"{bucket}/merged", decode="bytes",
                           remote=RemoteOptions(storage_options=s3.storage_options, cache_dir=tmp_path / "c"))
    assert _all(merged) == _all(PackedDataset(whole, decode="bytes"))
    assert merged.keys == PackedDataset(whole).keys


def test_finished_shards_go_up_while_the_conversion_runs(bucket, tmp_path, s3):
    from packer.formats.sample import Sample
    from packer.formats.records import RecordsWriter
    from packer.remote.upload import ShardUploader

    import s3fs

    url = f"{bucket}/live"
    staged = staged_output(url)
    writer = RecordsWriter(staged.local, classes=["a"], samples_per_shard=4)
    writer.open()
    samples = [Sample(f"k{i}", bytes([i]) * 100, "jpeg", 0, 1, 1, 3) for i in range(10)]
    uploader = ShardUploader(staged)
    for s in samples[:5]:  # the fifth sample completes shard 0
        writer.add(s)
    uploader.scan()
    fs = s3fs.S3FileSystem(**s3.storage_options, skip_instance_cache=True)
    names = sorted(p.rsplit("/", 1)[-1] for p in fs.ls(url[len("s3://"):], refresh=True))
    assert names == ["train-00000.tfrecord", "train-00000.tfrecord.idx"]  # no manifest yet
    for s in samples[5:]:
        writer.add(s)
    writer.close()
    report = staged.upload()
    assert "train-00000.tfrecord" in report.skipped and "train-00000.tfrecord" not in report.uploaded
    reader = open_reader(url, remote=RemoteOptions(storage_options=s3.storage_options, cache_dir=tmp_path / "c"))
    assert [reader.read(i).data for i in range(10)] == [s.data for s in samples]


def test_s3_credentials_never_appear_in_errors_or_logs(s3, tmp_path, caplog):
    import logging

    s3.make_bucket("packer-creds")  # (the test's own boto3 call: before the capture starts)
    caplog.set_level(logging.DEBUG)
    opts = RemoteOptions(storage_options=s3.storage_options, cache_dir=tmp_path / "c")
    with pytest.raises(PackerError, match="not found") as e:
        open_reader("s3://packer-creds/nothing-here", remote=opts)
    assert "s3://packer-creds/nothing-here" in str(e.value)
    assert "packer-creds" in caplog.text  # the libraries' debug lines were captured
    for text in (str(e.value), caplog.text, repr(opts)):
        assert s3.storage_options["key"] not in text and s3.storage_options["secret"] not in text


@pytest.mark.slow
def test_sigkill_during_the_upload_then_resume(bucket, tmp_path, s3):
    import json
    import os

    from tests.support.killing import packer_cmd, packer_env, run_and_kill

    from packer.remote.url import cache_key

    src = write_image_folder(tmp_path / "src", count=60)
    url = f"{bucket}/killed"
    journal = tmp_path / "staging" / cache_key(url) / ".killed.upload.json"

    def five_files_up() -> bool:
        try:
            return len(json.loads(journal.read_text())) >= 5
        except (OSError, ValueError):
            return False

    env = packer_env(**{k: os.environ[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL",
                                                   "AWS_DEFAULT_REGION", "PACKER_CACHE_DIR", "PACKER_STAGING_DIR")})
    args = ("to-records", src, url, "--samples-per-shard", 2, "--workers", 0)
    assert run_and_kill(packer_cmd(*args), five_files_up, env=env), "finished before the kill: nothing tested"
    assert not remote_exists(url, s3.storage_options)  # killed mid-upload: no manifest, not a dataset
    r = _cli(*args, "--resume")
    assert r.exit_code == 0, r.output
    skipped = int(r.output.split(" already there")[0].rsplit(", ", 1)[-1])
    assert skipped >= 5
    local = tmp_path / "local"
    pack_images(src, local, format="records", writer_options={"samples_per_shard": 2},
                run_options=RunOptions(workers=0))
    remote = PackedDataset(url, decode="bytes", remote=RemoteOptions(storage_options=s3.storage_options,
                                                                     cache_dir=tmp_path / "c"))
    assert _all(remote) == _all(PackedDataset(local, decode="bytes"))

"""The library API writes URL outputs as the CLI does: ``packer.pack(src, "s3://...")`` and an
``http(s)://`` OUT (nginx WebDAV) are staged, uploaded and readable back; an unreachable URL is
one error line before any work, and never a local folder named after the scheme."""
from __future__ import annotations

import socket

import pytest
from click.testing import CliRunner

import packer
from packer.cli import main
from packer.data import PackedDataset
from packer.errors import PackerError
from packer.remote.upload import remote_exists

from tests.support.inputs import write_image_folder

pytestmark = pytest.mark.xdist_group("s3")  # one moto server for the S3 tests


@pytest.fixture
def env(monkeypatch, tmp_path):
    """Cache and staging under tmp_path; the working directory too (where an 's3:' folder would go)."""
    monkeypatch.setenv("PACKER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PACKER_STAGING_DIR", str(tmp_path / "staging"))
    work = tmp_path / "cwd"
    work.mkdir(exist_ok=True)
    monkeypatch.chdir(work)
    return work


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the socket is: nothing listens there


def _all(ds):
    return [ds[i] for i in range(len(ds))]


@pytest.mark.parametrize("fmt", ["records", "lmdb"])
def test_library_pack_to_s3_uploads_like_the_cli(env, bucket, tmp_path, s3, fmt):
    src = write_image_folder(tmp_path / "src", count=20)
    report = packer.pack(src, f"{bucket}/lib", format=fmt, workers=0)
    assert report.upload is not None and report.upload.uploaded, report.summary()
    r = CliRunner().invoke(main, [f"to-{fmt}", str(src), f"{bucket}/cli", "--workers", "0"])
    assert r.exit_code == 0, r.output
    assert remote_exists(f"{bucket}/lib", s3.storage_options)
    assert f"uploaded {len(report.upload.uploaded)} files" in r.output, r.output  # the same upload
    lib = PackedDataset(f"{bucket}/lib", decode="bytes")
    cli = PackedDataset(f"{bucket}/cli", decode="bytes")
    local = PackedDataset(packer.pack(src, tmp_path / f"local.{fmt}", format=fmt, workers=0).out, decode="bytes")
    assert _all(lib) == _all(cli) == _all(local)
    assert list(env.iterdir()) == []  # nothing written in the working directory ("s3:" before)
    again = packer.pack(src, f"{bucket}/lib", format=fmt, workers=0, resume=True)
    assert again.status == "uploaded" and "nothing to do" in again.summary()


def test_library_pack_to_http_webdav(nginx, tmp_path, env):
    src = write_image_folder(tmp_path / "src", count=20)
    report = packer.pack(src, nginx.url("api-ds", "dav"), format="records", workers=0, samples_per_shard=8)
    assert report.upload is not None and len(report.upload.uploaded) >= 4
    assert (nginx.root / "api-ds" / "packer.json").is_file()
    served = PackedDataset(nginx.url("api-ds"), decode="bytes")
    local = PackedDataset(packer.pack(src, tmp_path / "local", format="records", workers=0,
                                      samples_per_shard=8).out, decode="bytes")
    assert _all(served) == _all(local)
    assert list(env.iterdir()) == []


@pytest.mark.parametrize("scheme", ["http", "s3"])
def test_unreachable_url_is_one_line_before_any_work(tmp_path, env, monkeypatch, scheme):
    src = write_image_folder(tmp_path / "src", count=5)
    port = _closed_port()
    if scheme == "s3":
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
        monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
        url = "s3://nobucket/ds"
    else:
        url = f"http://127.0.0.1:{port}/dav/ds"
    with pytest.raises(PackerError) as e:
        packer.pack(src, url, format="records", workers=0)
    message = str(e.value)
    assert "\n" not in message and "cannot use the storage" in message and "nothing was written" in message
    assert list(env.iterdir()) == []
    assert not any((tmp_path / "staging").glob("*/ds*"))  # no conversion ran
    r = CliRunner().invoke(main, ["to-records", str(src), url, "--workers", "0"])
    assert r.exit_code == 1
    assert r.output.strip().count("\n") == 0 and "cannot use the storage" in r.output, r.output

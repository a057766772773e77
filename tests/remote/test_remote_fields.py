"""Field packs at URLs, every format: a COCO pack written to S3 (moto) or over HTTP (nginx
WebDAV) reads back from its URL, with ``PackedDataset`` and ``StreamingDataset``, as the same
dicts as the pack written locally; ``verify`` and ``inspect`` take the URL; a field pack merged
from remote parts into a remote output equals the local merge."""
from __future__ import annotations

import numpy as np
import pytest

import packer
from packer.data import PackedDataset, StreamingDataset
from packer.formats import FORMATS
from packer.remote import RemoteOptions

pytest.importorskip("pycocotools")

ALL = sorted(FORMATS)


def _name(fmt: str, name: str) -> str:
    return f"{name}.h5" if FORMATS[fmt][0].single_file else name


def _plain(sample: dict) -> dict:
    return {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in sample.items()}


def _dicts(ds) -> list[dict]:
    return [_plain(ds[i]) for i in range(len(ds))]


@pytest.fixture(scope="module")
def coco(tmp_path_factory) -> dict:
    from tests.support.coco import make_coco

    root = tmp_path_factory.mktemp("coco")
    src = make_coco(root, n_images=6)
    local = {}
    for fmt in ALL:
        local[fmt] = root / "local" / _name(fmt, fmt)
        local[fmt].parent.mkdir(exist_ok=True)
        packer.pack(root, local[fmt], format=fmt, coco=src["instances"], workers=0)
    return {"root": root, "instances": src["instances"], "local": local}


def _check_url(url: str, local, remote: RemoteOptions) -> None:
    """The pack at ``url`` reads as the local one, random access and streamed, and verify and
    inspect take the URL."""
    want = _dicts(PackedDataset(local, decode="bytes", masks="decode"))
    assert _dicts(PackedDataset(url, decode="bytes", masks="decode", remote=remote)) == want
    streamed = [_plain(s) for s in StreamingDataset(url, decode="bytes", shuffle=False, remote=remote)]
    assert sorted(streamed, key=lambda s: s["image_id"]) == sorted(_dicts(PackedDataset(local, decode="bytes")),
                                                                  key=lambda s: s["image_id"])
    assert packer.verify(url).checked == len(want)
    info = packer.inspect(url)
    assert info["fields"]["boxes"] == "ndarray:float32:*,4" and info["categories"][0]["id"] == 1


@pytest.mark.xdist_group("s3")  # one moto server for the S3 tests
@pytest.mark.parametrize("fmt", ALL)
def test_a_field_pack_written_to_s3_reads_back_from_its_url(bucket, s3, coco, tmp_path, fmt):
    url = f"{bucket}/{_name(fmt, 'coco')}"
    report = packer.pack(coco["root"], url, format=fmt, coco=coco["instances"], workers=0)
    assert report.upload is not None and report.upload.uploaded, report.summary()
    _check_url(url, coco["local"][fmt], RemoteOptions(storage_options=s3.storage_options, cache_dir=tmp_path / "c"))


@pytest.mark.xdist_group("nginx")  # nginx (a session fixture) starts once
@pytest.mark.parametrize("fmt", ALL)
def test_a_field_pack_written_over_http_reads_back_from_its_url(nginx, coco, tmp_path, monkeypatch, fmt):
    monkeypatch.setenv("PACKER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PACKER_STAGING_DIR", str(tmp_path / "staging"))
    name = _name(fmt, f"fields-{fmt}")
    report = packer.pack(coco["root"], nginx.url(name, "dav"), format=fmt, coco=coco["instances"], workers=0)
    assert report.upload is not None and report.upload.uploaded, report.summary()
    _check_url(nginx.url(name), coco["local"][fmt], RemoteOptions(cache_dir=tmp_path / "c"))


@pytest.mark.xdist_group("s3")
@pytest.mark.parametrize("fmt", ALL)
def test_remote_field_parts_merge_into_a_remote_output(bucket, s3, coco, tmp_path, fmt):
    parts = [f"{bucket}/{_name(fmt, f'part{k}')}" for k in range(2)]
    for k, url in enumerate(parts):
        packer.pack(coco["root"], url, format=fmt, coco=coco["instances"], workers=0, num_shards=2, shard_index=k)
    merged = f"{bucket}/{_name(fmt, 'merged')}"
    packer.merge(parts, merged)
    remote = RemoteOptions(storage_options=s3.storage_options, cache_dir=tmp_path / "c")
    assert _dicts(PackedDataset(merged, decode="bytes", remote=remote)) == \
        _dicts(PackedDataset(coco["local"][fmt], decode="bytes"))

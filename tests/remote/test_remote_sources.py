"""WebDataset shards in object storage packed into object storage: ``packer.pack("s3://.../
shard-{000000..000002}.tar", "s3://.../out")`` fetches the shards through the node cache, uploads
the output, and reads back as packing the local shards into a local folder does."""
from __future__ import annotations

import pytest

import packer
from packer.data import PackedDataset
from tests.support.inputs import write_image_folder
from tests.support.sources import write_shards

pytestmark = pytest.mark.xdist_group("s3")  # one moto server for the S3 tests
pytest.importorskip("webdataset")


def test_shards_in_s3_pack_into_s3(bucket, tmp_path, s3):
    import fsspec

    tree = write_image_folder(tmp_path / "tree", count=20)
    shards = write_shards(tree, tmp_path / "wds", per_shard=8, cls=True, extra=True)
    fs = fsspec.filesystem("s3", **s3.storage_options)
    for shard in shards:
        fs.put_file(str(shard), f"{bucket.removeprefix('s3://')}/wds/{shard.name}")
    report = packer.pack(f"{bucket}/wds/shard-{{000000..000002}}.tar", f"{bucket}/out", workers=0)
    assert report.failed == 0 and report.upload is not None and report.upload.uploaded
    local = packer.pack(tmp_path / "wds", tmp_path / "local.lmdb", workers=0)
    remote, here = PackedDataset(f"{bucket}/out", decode="bytes"), PackedDataset(local.out, decode="bytes")
    assert len(remote) == len(here) == 20
    for i in range(len(here)):
        a, b = remote[i], here[i]
        assert a.keys() == b.keys() and all(
            (a[k] == b[k]).all() if hasattr(a[k], "all") else a[k] == b[k] for k in a)
    again = packer.pack(f"{bucket}/wds/shard-{{000000..000002}}.tar", f"{bucket}/out", workers=0, resume=True)
    assert again.status == "uploaded"

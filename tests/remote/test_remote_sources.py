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


def test_a_shard_replaced_at_its_url_refuses_the_resume(bucket, tmp_path, s3):
    """A URL shard's version (its size, ETag and modification time, recorded beside the cached
    copy) is what the resume compares: a shard replaced between two runs refuses a --resume
    that would otherwise call the output complete (the cached copies had no file identity)."""
    import fsspec

    from packer.errors import ResumeRefused

    tree = write_image_folder(tmp_path / "tree", count=12)
    shards = write_shards(tree, tmp_path / "wds", per_shard=6, cls=True)
    other = write_shards(write_image_folder(tmp_path / "tree2", count=12, seed=7), tmp_path / "wds2",
                         per_shard=6, cls=True)
    fs = fsspec.filesystem("s3", **s3.storage_options)
    prefix = f"{bucket.removeprefix('s3://')}/moving"
    for shard in shards:
        fs.put_file(str(shard), f"{prefix}/{shard.name}")
    src = f"{bucket}/moving/shard-{{000000..000001}}.tar"
    packer.pack(src, tmp_path / "out.lmdb", workers=0)
    assert packer.pack(src, tmp_path / "out.lmdb", workers=0, resume=True).status == "complete"
    fs.put_file(str(other[1]), f"{prefix}/{shards[1].name}")  # the second shard replaced, same keys
    with pytest.raises(ResumeRefused, match="made differently"):
        packer.pack(src, tmp_path / "out.lmdb", workers=0, resume=True)

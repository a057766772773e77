"""Video packs (``pack-videos``) read by URL: over nginx and moto's S3 server, whole shards and
range access, ``PackedVideoDataset`` returns the local pack's clips, frame for frame (and they are
frames of the sequential decode of the stored stream); a pack republished at its URL under an open
reader raises OutputChanged, never a clip of the new version."""
from __future__ import annotations

import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("av")

import packer  # noqa: E402
from packer.codecs.video_pack import decode_all  # noqa: E402
from packer.data.video import ClipSampling, PackedVideoDataset  # noqa: E402
from packer.errors import OutputChanged  # noqa: E402
from packer.remote import RemoteOptions  # noqa: E402
from tests.support.numbered_video import check_clips  # noqa: E402

VIDEOS = Path(__file__).resolve().parents[1] / "fixtures" / "videos"
SAMPLINGS = {"dense": ClipSampling(clip_len=16, frame_interval=2, test_mode=True),
             "tsn": ClipSampling(clip_len=1, num_clips=8)}


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("rvp") / "src"
    for cls, name in (("a", "mmaction2_test.mp4"), ("b", "decord_flipping_a_pancake.mkv"), ("b", "mmaction2_test.avi")):
        (root / cls).mkdir(parents=True, exist_ok=True)
        shutil.copy(VIDEOS / name, root / cls / name)
    return root


@pytest.fixture(scope="module")
def local(src, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("rvp") / "videos.rec"
    report = packer.pack_videos(src, out, to="records", max_frames=48, gop=8, workers=0)
    assert report.videos == 3 and not report.failures
    return out


def same_clips(remote: PackedVideoDataset, local_ds: PackedVideoDataset) -> int:
    """Every clip of two epochs equal between the two datasets, and each frame the frame of the
    sequential decode of the remote's stored stream that its index names."""
    assert len(remote) == len(local_ds) and remote.keys == local_ds.keys
    refs = [decode_all(remote.reader.read(remote._videos[i][0]).data) for i in range(len(remote))]
    checked = 0
    for epoch in range(2):
        remote.set_epoch(epoch)
        local_ds.set_epoch(epoch)
        for i in range(len(remote)):
            inds = remote.clip_indices(i)
            assert np.array_equal(inds, local_ds.clip_indices(i))
            (a, la), (b, lb) = remote[i], local_ds[i]
            assert la == lb and torch.equal(a, b)
            for k, j in enumerate(inds.tolist()):
                assert np.array_equal(a[k].permute(1, 2, 0).numpy(), refs[i][j])
                checked += 1
    return checked


@pytest.mark.parametrize("access", ["shard", "range"])
@pytest.mark.parametrize("name", sorted(SAMPLINGS))
def test_video_pack_over_http_gives_the_local_clips(nginx, local, tmp_path, access, name):
    served = nginx.root / f"vp-{tmp_path.name}"
    shutil.copytree(local, served)
    opts = RemoteOptions(cache_dir=tmp_path / "cache", access=access)
    remote = PackedVideoDataset(nginx.url(served.name), sampling=SAMPLINGS[name], seed=5, remote=opts)
    assert same_clips(remote, PackedVideoDataset(local, sampling=SAMPLINGS[name], seed=5)) > 0


def test_video_pack_on_s3_gives_the_local_clips(bucket, src, local, tmp_path, s3):
    s3fs = pytest.importorskip("s3fs")
    fs = s3fs.S3FileSystem(**s3.storage_options)
    name = bucket[len("s3://"):]
    for f in sorted(p for p in local.iterdir() if p.is_file()):  # the local pack, uploaded as is
        fs.put_file(str(f), f"{name}/copy/{f.name}")
    for access in ("shard", "range"):
        remote = PackedVideoDataset(f"{bucket}/copy", sampling=SAMPLINGS["dense"], seed=2,
                                    remote=RemoteOptions(cache_dir=tmp_path / f"c-{access}", access=access))
        assert same_clips(remote, PackedVideoDataset(local, sampling=SAMPLINGS["dense"], seed=2)) > 0
    # packed straight to S3 (uploaded as it is written): the same videos, frames as their stored stream
    report = packer.pack_videos(src, f"{bucket}/packed", to="records", max_frames=48, gop=8, workers=0)
    assert report.videos == 3 and not report.failures
    packed = PackedVideoDataset(f"{bucket}/packed", sampling=SAMPLINGS["tsn"], seed=2,
                                remote=RemoteOptions(cache_dir=tmp_path / "c-packed"))
    assert packed.keys == PackedVideoDataset(local).keys
    assert [packed._video(i)[0] for i in range(3)] == [PackedVideoDataset(local)._video(i)[0] for i in range(3)]
    refs = [decode_all(packed.reader.read(packed._videos[i][0]).data) for i in range(3)]
    assert check_clips(packed, refs, numbers=False) > 0


def _republish(served: Path, built: Path) -> None:
    """Copy ``built`` over ``served`` file by file, the manifest last (as a careful publisher)."""
    names = sorted(p.name for p in built.iterdir() if p.is_file())
    for name in [n for n in names if n != "packer.json"] + ["packer.json"]:
        shutil.copyfile(built / name, served / name)


@pytest.fixture
def republish(nginx, src, local, tmp_path):
    """(url, publish()) of a served copy of ``local``; publish() puts a different pack (--gop 4)
    of the same videos at the same URL."""
    served = nginx.root / f"vp-re-{tmp_path.name}"
    shutil.copytree(local, served)
    other = tmp_path / "other.rec"
    packer.pack_videos(src, other, to="records", max_frames=48, gop=4, workers=0)
    yield nginx.url(served.name), lambda: _republish(served, other)
    shutil.rmtree(served, ignore_errors=True)


def test_a_republished_video_pack_under_a_range_reader_is_output_changed(republish, tmp_path):
    url, publish = republish
    ds = PackedVideoDataset(url, clip_len=8, test_mode=True,
                            remote=RemoteOptions(cache_dir=tmp_path / "c", access="range"))
    ds[0]
    time.sleep(1.1)  # nginx's ETag and Last-Modified have one-second resolution
    publish()
    for i in range(len(ds)):  # no clip of the new version, none mixed
        with pytest.raises(OutputChanged):
            ds[i]


def test_a_video_shard_fetched_after_a_republish_is_output_changed(republish, tmp_path):
    url, publish = republish
    ds = PackedVideoDataset(url, clip_len=8, test_mode=True, remote=RemoteOptions(cache_dir=tmp_path / "c"))
    publish()  # the reader holds the old manifest; the shard is fetched only now
    with pytest.raises(OutputChanged, match="republished"):
        ds[0]
    again = PackedVideoDataset(url, clip_len=8, test_mode=True, remote=RemoteOptions(cache_dir=tmp_path / "c"))
    assert again.reader.manifest.videos[0]["gop"] == 4  # opened again: the new version, whole
    clip, _ = again[0]
    assert clip.shape[0] == 8

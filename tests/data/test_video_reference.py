"""A ``PackedVideoDataset`` clip holds the reference's pixels: what decord's ``get_batch`` (the
reader of mmaction2's ``VideoDataset``) returns for the same frame indices of the same MP4,
bit for bit, with every sampler; for ``pack-videos --to files`` and for the same re-encoded
streams kept in a pack (decord reads the MP4 bytes the pack stores). Both convert 4:2:0 to RGB
through FFmpeg's swscale (docs/video.md, "Colour").
"""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("av")
decord = pytest.importorskip("decord")

from packer.api import pack_videos  # noqa: E402
from packer.codecs.video_pack import unpack_stream  # noqa: E402
from packer.data.video import PackedVideoDataset  # noqa: E402
from tests.support.numbered_video import SAMPLERS  # noqa: E402

VIDEOS = Path(__file__).resolve().parents[1] / "fixtures" / "videos"
# real colour footage: a 4:3 and a wide one (width 170 and 226 at short side 128: not multiples of 8 or 16)
SOURCES = ("mmaction2_test.mp4", "decord_flipping_a_pancake.mkv")


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("ref") / "src"
    for k, name in enumerate(SOURCES):
        (root / f"c{k}").mkdir(parents=True)
        shutil.copy(VIDEOS / name, root / f"c{k}" / name)
    return root


@pytest.fixture(scope="module", params=["files", "lmdb"])
def packed(request, src, tmp_path_factory) -> tuple[Path, list[Path]]:
    """(the output, per video the MP4 decord reads): the files themselves, or a pack's stored MP4 bytes."""
    work = tmp_path_factory.mktemp(f"ref-{request.param}")
    out = work / ("videos" if request.param == "files" else "videos.lmdb")
    report = pack_videos(src, out, to=request.param, short_side=128, max_frames=80, gop=8, workers=0)
    assert report.videos == len(SOURCES) and not report.failures
    ds = PackedVideoDataset(out)
    if request.param == "files":
        return out, [out / v["file"] for v in ds.reader.manifest.videos]
    mp4s = []
    for i in range(len(ds)):
        mp4, _ = unpack_stream(ds.reader.read(ds._videos[i][0]).data)
        mp4s.append(work / f"stream_{i}.mp4")
        mp4s[-1].write_bytes(bytes(mp4))
    return out, mp4s


@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_clips_equal_decords_get_batch(packed, name):
    out, mp4s = packed
    ds = PackedVideoDataset(out, sampling=SAMPLERS[name], seed=7)
    readers = [decord.VideoReader(str(p)) for p in mp4s]
    assert [len(r) for r in readers] == [ds._video(i)[0] for i in range(len(ds))]
    for epoch in range(2):
        ds.set_epoch(epoch)
        for i in range(len(ds)):
            inds = ds.clip_indices(i)
            clip, _ = ds[i]
            ours = clip.permute(0, 2, 3, 1).numpy()
            ref = readers[i].get_batch(inds.tolist()).asnumpy()
            diff = np.abs(ours.astype(np.int16) - ref)
            assert np.array_equal(ours, ref), (f"video {i} epoch {epoch}: mean |diff| {diff.mean():.3f}, "
                                               f"max {diff.max()}")

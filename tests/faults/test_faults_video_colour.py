"""Faults: a fast colour conversion that gives other pixels than the reference's (issue 43).

A clip of a video pack must hold what decord's ``get_batch`` (mmaction2's reader) returns for the
same frames of the same stream, bit for bit: FFmpeg's swscale conversion, which honours the
stream's colour matrix and range. OpenCV's I420 conversion (packer's for yuv420p until 8071554)
assumes BT.601 limited range whatever the stream says and rounds its own way. Sources with the
tags phones and HD cameras write (BT.709, full range; and none), of saturated colour blocks, kept
as coded by ``pack-videos --copy`` (decord reads the source file) and re-encoded by a plain
``pack-videos`` (decord reads the stored MP4); two samplers' clips over two epochs. Before the
fix (dense clips): the kept BT.709 stream off by up to 23 levels (5.8 on average), the kept
untagged one by 5, every re-encoded one by 10-12; the full-range ones (yuvj420p, already
converted by swscale) were right.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

av = pytest.importorskip("av")
decord = pytest.importorskip("decord")

import packer  # noqa: E402
from packer.codecs.video_pack import unpack_stream  # noqa: E402
from packer.data.video import PackedVideoDataset  # noqa: E402
from tests.support.numbered_video import SAMPLERS  # noqa: E402
from tests.support.tagged_video import TAGS, write_tagged  # noqa: E402

@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("colour") / "src"
    for name, tags in TAGS.items():
        write_tagged(root / name / f"{name}.mp4", *tags)
    return root


@pytest.mark.parametrize("copy", [True, False], ids=["copy", "re-encoded"])
def test_clips_hold_decords_pixels_whatever_the_colour_tags(src, tmp_path, copy):
    out = tmp_path / "pack.lmdb"
    report = packer.pack_videos(src, out, to="lmdb", copy=copy, short_side=None, gop=8, workers=0)
    assert report.videos == len(TAGS) and not report.failures
    for sampler in ("tsn-train", "dense-sample"):
        ds = PackedVideoDataset(out, sampling=SAMPLERS[sampler], seed=1)
        for i, v in enumerate(ds.reader.manifest.videos):
            if copy:
                path = Path(v["source"])
            else:  # the re-encoded stream, as decord reads it
                path = tmp_path / f"{i}.mp4"
                path.write_bytes(bytes(unpack_stream(ds.reader.read(ds._videos[i][0]).data)[0]))
            reader = decord.VideoReader(str(path))
            for epoch in range(2):
                ds.set_epoch(epoch)
                inds = ds.clip_indices(i)
                ours = ds[i][0].permute(0, 2, 3, 1).numpy()
                ref = reader.get_batch(inds.tolist()).asnumpy()
                worst = int(np.abs(ours.astype(np.int16) - ref).max())
                assert np.array_equal(ours, ref), f"{v['key']} ({sampler}, epoch {epoch}): off by up to {worst}"

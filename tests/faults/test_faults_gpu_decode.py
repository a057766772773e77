"""Faults: the GPU decode's colour conversion given a stream whose matrix it does not have.

``GpuClipDecode`` converts NV12 to RGB on the device with BT.601 or BT.709 coefficients, the
matrix read from each frame's tags. swscale, which gives the CPU path's (and decord's) pixels,
also has BT.2020, SMPTE 240M, FCC and YCgCo. A stream kept as coded (``pack-videos --copy``) may
be tagged with any of them; before the fix every matrix other than BT.709 was read as BT.601, and
a BT.2020-tagged clip came out a few levels off everywhere, with no error. Now such a clip is
handed to the CPU path and equals the CPU dataset's bit for bit. FFmpeg's software decoder stands
in for NVDEC (the device path on the CPU, as tests/data/test_gpu.py runs it).
"""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("av")

import packer  # noqa: E402
from packer.data import GpuClipDecode, PackedVideoDataset  # noqa: E402
from tests.support.numbered_video import SAMPLERS  # noqa: E402
from tests.support.tagged_video import write_tagged  # noqa: E402

# AVColorSpace values swscale converts with coefficients of their own: SMPTE 240M, BT.2020 (non-constant)
OTHER_MATRICES = {"smpte240m": 7, "bt2020": 9}


@pytest.mark.parametrize("name", sorted(OTHER_MATRICES))
def test_a_matrix_the_device_conversion_lacks_takes_the_cpu_path(tmp_path, name):
    write_tagged(tmp_path / "src" / "c" / f"{name}.mp4", "yuv420p", OTHER_MATRICES[name], 1)
    out = tmp_path / "kept.lmdb"
    report = packer.pack_videos(tmp_path / "src", out, to="lmdb", copy=True, short_side=None, gop=8, workers=0)
    assert report.videos == 1 and not report.failures
    decoder = GpuClipDecode(device="cpu", nvdec=True, hwaccel=None)
    cpu = PackedVideoDataset(out, sampling=SAMPLERS["tsn-train"], seed=2)
    gpu = PackedVideoDataset(out, sampling=SAMPLERS["tsn-train"], seed=2, decode_on="gpu")
    for epoch in range(2):
        cpu.set_epoch(epoch)
        gpu.set_epoch(epoch)
        assert torch.equal(decoder([gpu[0][0]])[0], cpu[0][0]), f"{name}, epoch {epoch}"
    assert decoder.fallbacks == 2  # each clip handed to the CPU path

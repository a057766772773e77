"""GPU decode (packer.data.gpu): nvJPEG for image packs, NVDEC for video packs, and their CPU fallback.

On a machine without CUDA (CI) every test here names ``device="cpu"``: the fallback must give the
CPU transforms' and datasets' own output bit for bit, and the device-side code (crop and resize
of decoded images, NV12 -> RGB, clip layout, decoder reuse across runs) runs on the CPU with a
real CPU decoder standing in for the GPU's (a full libjpeg decode for nvJPEG, FFmpeg's software
H.264 decoder for NVDEC). The CUDA tests at the end run where a GPU is present
(``scripts/device_check.sh``).
"""
from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st
from PIL import Image
from torch.utils.data import DataLoader

av = pytest.importorskip("av")

from packer.api import decode_frames, pack_videos  # noqa: E402
from packer.codecs import image as imaging  # noqa: E402
from packer.codecs.video_pack import to_rgb  # noqa: E402
from packer.commands.pack_images import pack_images  # noqa: E402
from packer.data import Loader, PackedDataset, PackedVideoDataset  # noqa: E402
from packer.data.decode import DecodeRandomResizedCrop, DecodeResizeCrop, PilRandomResizedCrop, PilResizeCrop  # noqa: E402
from packer.data.gpu import (GpuClipDecode, GpuImageDecode, nv12_to_rgb, nvdec_available,  # noqa: E402
                             nvjpeg_available)
from packer.data.video import ClipRequest, collate_clips  # noqa: E402
from packer.errors import CorruptData, UsageError  # noqa: E402
from packer.synth import natural_image  # noqa: E402
from tests.support.jpeg_layouts import Layout, build  # noqa: E402
from tests.support.numbered_video import SAMPLERS, SYNTH_H, SYNTH_W, read_number, write_numbered  # noqa: E402
from tests.support.tagged_video import TAGS as STREAM_TAGS, write_tagged  # noqa: E402

pytestmark = pytest.mark.xdist_group("video_packs")  # the video packs below take seconds to build

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "videos"
CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs CUDA")

# The device path's pixels against the reference's (measured on these images; docs/loading.md and
# docs/video.md): images, the mean absolute difference per channel value from the Pillow reference
# with the same box; video, NV12 -> RGB against swscale's x86 rounding, and the crop's bilinear
# resize against OpenCV's INTER_AREA.
IMAGE_MEAN_TOL, VIDEO_RGB_MAX, VIDEO_MEAN_TOL = 0.5, 3, 1.5


def jpeg(arr: np.ndarray, **kw) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "JPEG", quality=90, **kw)
    return buf.getvalue()


def png(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def images() -> dict[str, object]:
    """One of each kind an image pack holds: the device takes the first three, the CPU the rest."""
    rng = np.random.default_rng(5)
    photo = lambda h, w: natural_image(rng, h, w)  # noqa: E731
    return {
        "baseline": jpeg(photo(300, 400)),
        "progressive": jpeg(photo(280, 210), progressive=True),
        "grey": jpeg(photo(200, 260)[:, :, 0]),
        "exif-rotated": build(Layout(mode="RGB", height=120, width=180, orientation=6)),
        "cmyk": build(Layout(mode="CMYK", height=150, width=100)),
        "png": png(photo(90, 130)),
        "raw": photo(160, 120),
    }


class CpuStandIn:
    """A full CPU JPEG decode (libjpeg-turbo through packer's decoder) in nvJPEG's place: what the
    device decoder returns, 3 x H x W uint8, for each JPEG it is handed; records what it got."""

    def __init__(self, refuse: tuple[bytes, ...] = ()):
        self.got: list[bytes] = []
        self.refuse = refuse

    def __call__(self, datas: list) -> list:
        if any(bytes(d) in self.refuse for d in datas):
            raise RuntimeError("nvjpeg: corrupt data")  # what torchvision raises for the batch
        self.got += [bytes(d) for d in datas]
        return [torch.from_numpy(np.ascontiguousarray(imaging.decode(d).transpose(2, 0, 1))) for d in datas]


TRANSFORMS = {
    "random-resized-crop": (lambda: DecodeRandomResizedCrop(64, seed=7), lambda: PilRandomResizedCrop(64, seed=7)),
    "resize-center-crop": (lambda: DecodeResizeCrop(72, 64), lambda: PilResizeCrop(72, 64)),
}


@pytest.mark.parametrize("name", sorted(TRANSFORMS))
def test_without_a_gpu_decoder_the_batch_is_the_cpu_transforms_output(images, name):
    make, _ = TRANSFORMS[name]
    batch = list(images.values()) * 3
    gpu = GpuImageDecode(make(), device="cpu")
    assert not gpu.on_device and not nvjpeg_available(torch.device("cpu"))
    cpu = make()
    for _ in range(2):  # two batches: the generator carries on as the CPU transform's does
        got = gpu(batch)
        assert got.dtype == torch.uint8 and got.device.type == "cpu"
        assert torch.equal(got, torch.stack([cpu(x) for x in batch]))


@pytest.mark.parametrize("name", sorted(TRANSFORMS))
def test_the_device_path_keeps_the_boxes_and_routes_what_it_cannot_promise(images, name):
    make, make_reference = TRANSFORMS[name]
    batch = list(images.values()) * 2
    decoder = CpuStandIn()
    gpu = GpuImageDecode(make(), device="cpu", decoder=decoder)
    assert gpu.on_device
    got = gpu(batch)
    device_kinds = {"baseline", "progressive", "grey"}
    assert sorted(set(decoder.got)) == sorted(images[k] for k in device_kinds)
    cpu, reference = make(), make_reference()
    for k, x in enumerate(batch):
        kind = list(images)[k % len(images)]
        want_cpu, want_ref = cpu(x), reference(x)  # both draw the same box: one generator state each
        if kind in device_kinds:
            diff = (got[k].int() - want_ref.int()).abs().float()
            assert diff.mean() <= IMAGE_MEAN_TOL, (kind, float(diff.mean()))
        else:
            assert torch.equal(got[k], want_cpu), kind  # the CPU transform's own route, the same box
    if name == "random-resized-crop":  # the same number of draws: the next batch's boxes agree too
        assert gpu.transform.generator().random() == cpu.generator().random()


def test_a_jpeg_the_device_refuses_takes_the_cpu_route_with_its_box(images):
    bad = images["baseline"][: len(images["baseline"]) // 2]  # cut short: libjpeg's rules decide
    good = [images["baseline"], images["progressive"]]
    decoder = CpuStandIn(refuse=(bad,))
    gpu = GpuImageDecode(DecodeRandomResizedCrop(48, seed=1), device="cpu", decoder=decoder)
    with pytest.raises(ValueError):  # a truncated JPEG is a ValueError on the CPU path too
        gpu([good[0], bad, good[1]])
    decoder = CpuStandIn(refuse=(images["progressive"],))  # refused, yet readable by libjpeg
    gpu = GpuImageDecode(DecodeRandomResizedCrop(48, seed=1), device="cpu", decoder=decoder)
    got = gpu(good)
    cpu = DecodeRandomResizedCrop(48, seed=1)
    first = cpu(good[0])
    assert torch.equal(got[1], cpu(good[1]))  # the refused one: the CPU route, the second box
    assert gpu.refused == 1
    assert (got[0].int() - first.int()).abs().float().mean() < 4
    assert decoder.got == [good[0]]  # retried alone after the batch failed


def test_a_header_that_lies_about_the_size_takes_the_cpu_route(images):
    class Smaller(CpuStandIn):
        def __call__(self, datas):
            return [t[:, :-8] for t in super().__call__(datas)]

    gpu = GpuImageDecode(DecodeResizeCrop(72, 64), device="cpu", decoder=Smaller())
    assert torch.equal(gpu([images["baseline"]])[0], DecodeResizeCrop(72, 64)(images["baseline"]))


def test_nothing_gpu_only_is_imported_until_a_gpu_decode_is_asked_for():
    code = ("import sys, torch, packer, packer.data, packer.data.gpu\n"
            "from packer.data import GpuImageDecode, DecodeResizeCrop\n"
            "GpuImageDecode(DecodeResizeCrop(), device='cpu')\n"
            "print([m for m in ('torchvision', 'av') if m in sys.modules], torch.cuda.is_initialized())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["[]", "False"]


def test_only_the_fast_transforms_geometry_is_kept():
    with pytest.raises(UsageError):
        GpuImageDecode(PilResizeCrop(72, 64), device="cpu")


@pytest.fixture(scope="module")
def image_pack(tmp_path_factory, images) -> Path:
    src = tmp_path_factory.mktemp("gpu-images") / "src"
    for k, (kind, data) in enumerate(images.items()):
        if kind == "raw":
            continue
        (src / f"c{k % 2}").mkdir(parents=True, exist_ok=True)
        for r in range(3):
            (src / f"c{k % 2}" / f"{kind}{r}.{'png' if kind == 'png' else 'jpg'}").write_bytes(data)
    out = tmp_path_factory.mktemp("gpu-pack") / "images.lmdb"
    pack_images(src, out, format="lmdb")
    return out


def test_workers_read_bytes_and_the_batch_is_decoded_after_them(image_pack):
    ds = PackedDataset(image_pack, decode="bytes")
    cpu_ds = PackedDataset(image_pack, decode=DecodeRandomResizedCrop(56, seed=4))
    want = torch.stack([cpu_ds[i][0] for i in range(len(ds))])  # main process: default_rng(4), in order
    gpu = GpuImageDecode(DecodeRandomResizedCrop(56, seed=4), device="cpu")
    loader = DataLoader(ds, batch_size=5, num_workers=2)
    got = torch.cat([gpu(data) for data, _ in loader])
    assert torch.equal(got, want)
    gpu = GpuImageDecode(DecodeRandomResizedCrop(56, seed=4), device="cpu")
    got = torch.cat([gpu(data) for data, _ in Loader(ds, batch_size=5, num_threads=2)])
    assert torch.equal(got, want)


# -- video ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def video_pack(tmp_path_factory) -> Path:
    """Two synthetic videos whose frames draw their numbers (H.264 with B-frames), packed with GOP 8."""
    src = tmp_path_factory.mktemp("gpu-video") / "src"
    for name, frames in (("a", 90), ("b", 61)):
        write_numbered(src / name / f"{name}.mp4", frames)
    out = tmp_path_factory.mktemp("gpu-video-pack") / "numbers.lmdb"
    report = pack_videos(src, out, to="lmdb", gop=8, workers=0)
    assert report.videos == 2 and not report.failures
    return out


def clips_both_ways(pack: Path, sampler, decoder: GpuClipDecode, **kw):
    """(clip from the CPU dataset, clip from packets + ``decoder``, the frame numbers) per video and epoch."""
    cpu = PackedVideoDataset(pack, sampling=sampler, seed=3, **kw)
    gpu = PackedVideoDataset(pack, sampling=sampler, seed=3, decode_on="gpu", **kw)
    for epoch in range(2):
        cpu.set_epoch(epoch)
        gpu.set_epoch(epoch)
        for i in range(len(cpu)):
            want, label = cpu[i]
            packets, target = gpu[i]
            assert target == label
            yield want, decoder([packets])[0], cpu.clip_indices(i)


@pytest.mark.parametrize("crop", [None, 112])
@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_cpu_fallback_clips_equal_the_cpu_datasets(video_pack, name, crop):
    decoder = GpuClipDecode(device="cpu")
    assert not decoder.nvdec
    for want, got, _ in clips_both_ways(video_pack, SAMPLERS[name], decoder, crop_size=crop):
        assert got.device.type == "cpu" and torch.equal(got, want)


def frames_of(clip: torch.Tensor, layout: str) -> torch.Tensor:
    """A clip's frames in clip order, ``T x C x H x W``, whatever its layout."""
    if layout == "TCHW":
        return clip
    if clip.dim() == 4:  # one clip: C x T x H x W
        return clip.transpose(0, 1)
    return clip.permute(0, 2, 1, 3, 4).reshape(-1, *clip.shape[1:2], *clip.shape[-2:])


@pytest.mark.parametrize("layout", ["TCHW", "CTHW"])
@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_the_device_path_gives_every_samplers_frames(video_pack, name, layout):
    """NV12 -> RGB, crops and layout on the device (here the CPU), fed by a software decoder that
    is made once and flushed between runs, as NVDEC's is: the same frame numbers as the CPU path,
    pixels within the conversion's tolerance."""
    decoder = GpuClipDecode(device="cpu", nvdec=True, hwaccel=None)
    for crop in (None, 96):
        for want, got, inds in clips_both_ways(video_pack, SAMPLERS[name], decoder, crop_size=crop, layout=layout):
            assert got.shape == want.shape and got.dtype == torch.uint8
            diff = (got.int() - want.int()).abs()
            if crop is None:
                assert int(diff.max()) <= VIDEO_RGB_MAX, name
                frames = frames_of(got, layout)
                assert [read_number(f.permute(1, 2, 0).numpy()) for f in frames] == inds.tolist()
            assert float(diff.float().mean()) <= VIDEO_MEAN_TOL, (name, crop)
    assert len(decoder._local.contexts) == 1  # one decoder for both videos' streams, reused
    assert decoder.fallbacks == 0


def test_multigrid_requests_take_their_own_clip_shape(video_pack):
    """A multigrid sampler's ``ClipRequest`` keys (frames, interval, crop per sample, the epoch):
    the packets path draws and shapes each clip as the CPU path does."""
    cpu = PackedVideoDataset(video_pack, clip_len=8, frame_interval=2, crop_size=112, seed=9)
    gpu = PackedVideoDataset(video_pack, clip_len=8, frame_interval=2, crop_size=112, seed=9, decode_on="gpu")
    for decoder in (GpuClipDecode(device="cpu"), GpuClipDecode(device="cpu", nvdec=True, hwaccel=None)):
        for req in (ClipRequest(0, 4, 4, 64, 1), ClipRequest(1, 16, 1, 96, 2), ClipRequest(1)):
            want, got = cpu[req][0], decoder([gpu[req][0]])[0]
            assert got.shape == want.shape
            if not decoder.nvdec:
                assert torch.equal(got, want)
            else:
                assert float((got.int() - want.int()).abs().float().mean()) <= VIDEO_MEAN_TOL


def test_clip_packets_batch_through_loader_workers(video_pack):
    sampler = SAMPLERS["tsn-train"]
    ds = PackedVideoDataset(video_pack, sampling=sampler, seed=5, decode_on="gpu", crop_size=64)
    loader = DataLoader(ds, batch_size=2, num_workers=2, collate_fn=collate_clips)
    decoder = GpuClipDecode(device="cpu")
    (packets, labels), = list(loader)
    got = decoder(packets)
    cpu = PackedVideoDataset(video_pack, sampling=sampler, seed=5, crop_size=64)
    assert got.shape == (2, 8, 3, 64, 64)
    assert torch.equal(got, torch.stack([cpu[0][0], cpu[1][0]]))
    assert labels.tolist() == [cpu[0][1], cpu[1][1]]
    got = [GpuClipDecode(device="cpu")(p) for p, _ in Loader(ds, batch_size=2, num_threads=2, collate=collate_clips)]
    assert torch.equal(got[0], torch.stack([cpu[0][0], cpu[1][0]]))


def test_a_stream_that_is_not_what_its_entry_says_is_corrupt_data_naming_the_video(video_pack):
    ds = PackedVideoDataset(video_pack, clip_len=4, decode_on="gpu")
    packets, _ = ds[0]
    wrong = type(packets)(**{**packets.__dict__, "size": (SYNTH_H, SYNTH_W + 2)})
    for decoder in (GpuClipDecode(device="cpu"), GpuClipDecode(device="cpu", nvdec=True, hwaccel=None)):
        with pytest.raises(CorruptData, match="numbers.lmdb video"):
            decoder([wrong])
    cut = type(packets)(**{**packets.__dict__, "packets": packets.packets[:-1] + (packets.packets[-1][:9],)})
    with pytest.raises(CorruptData):
        GpuClipDecode(device="cpu", nvdec=True, hwaccel=None)([cut])


def test_gpu_decoding_is_for_video_streams(video_pack, tmp_path):
    with pytest.raises(UsageError, match="decode_on"):
        PackedVideoDataset(video_pack, decode_on="tpu")
    with pytest.raises(UsageError, match="transform"):
        PackedVideoDataset(video_pack, decode_on="gpu", transform=lambda x: x)
    with pytest.raises(UsageError, match="CUDA"):  # NVDEC decodes onto a CUDA device only
        GpuClipDecode(device="cpu", nvdec=True)
    src = tmp_path / "src"
    write_numbered(src / "n" / "n.mp4", 12)
    frames = tmp_path / "frames.lmdb"
    assert not decode_frames(src, frames, to="lmdb", workers=0).failures
    PackedVideoDataset(frames)  # a frame pack: its JPEG frames decode on the CPU
    with pytest.raises(UsageError, match="frame packs"):
        PackedVideoDataset(frames, decode_on="gpu")


@pytest.mark.parametrize("copy", [True, False], ids=["copy", "re-encoded"])
def test_the_device_path_reads_each_streams_colour_tags(tmp_path, copy):
    """Streams tagged BT.709, full range, both and neither, kept as coded and re-encoded: the
    device path converts each with its own matrix and range (a wrong one is off by 10-20 levels)."""
    src = tmp_path / "src"
    for name, tags in STREAM_TAGS.items():
        write_tagged(src / name / f"{name}.mp4", *tags)
    out = tmp_path / "pack.lmdb"
    report = pack_videos(src, out, to="lmdb", copy=copy, short_side=None, gop=8, workers=0)
    assert report.videos == len(STREAM_TAGS) and not report.failures
    decoder = GpuClipDecode(device="cpu", nvdec=True, hwaccel=None)
    worst = 0
    for want, got, _ in clips_both_ways(out, SAMPLERS["dense-sample"], decoder):
        worst = max(worst, int((got.int() - want.int()).abs().max()))
    assert worst <= VIDEO_RGB_MAX + 1 and decoder.fallbacks == 0


def test_the_device_path_turns_a_kept_rotated_stream_upright(tmp_path):
    """A ``--copy`` stream with a container rotation (a phone's 90-degree .mov): its frames are
    turned upright on the device as ``rotate_upright`` turns them on the CPU."""
    src = tmp_path / "src" / "c"
    src.mkdir(parents=True)
    (src / "r.mov").write_bytes((FIXTURES / "decord_video_90.mov").read_bytes())
    out = tmp_path / "rotated.lmdb"
    report = pack_videos(tmp_path / "src", out, to="lmdb", copy=True, workers=0)
    assert report.videos == 1 and not report.failures
    assert PackedVideoDataset(out)._rotation[0] in (90, 270)
    decoder = GpuClipDecode(device="cpu", nvdec=True, hwaccel=None)
    for want, got, _ in clips_both_ways(out, SAMPLERS["tsn-train"], decoder):
        assert got.shape == want.shape and want.shape[-2] > want.shape[-1]  # upright: taller than wide
        diff = (got.int() - want.int()).abs()  # a turn the wrong way round is off by tens of levels
        assert int(diff.max()) <= VIDEO_RGB_MAX + 1 and float(diff.float().mean()) <= VIDEO_MEAN_TOL
    assert decoder.fallbacks == 0


# -- NV12 -> RGB against swscale (what the CPU path uses) ------------------------------------------
TAGS = {"bt601-limited": (5, 1), "untagged": (2, 0), "bt709-limited": (1, 1), "bt601-full": (5, 2),
        "bt709-full": (1, 2)}


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), tag=st.sampled_from(sorted(TAGS)), h=st.integers(1, 12), w=st.integers(1, 12))
def test_nv12_to_rgb_is_swscales_conversion_within_its_rounding(seed, tag, h, w):
    rng = np.random.default_rng(seed)
    h, w = 4 * h, 2 * w  # 4:2:0: even sides (and whole rows of chroma in from_ndarray's layout)
    y = rng.integers(0, 256, (h, w), dtype=np.uint8)
    u, v = (rng.integers(0, 256, (h // 2, w // 2), dtype=np.uint8) for _ in range(2))
    frame = av.VideoFrame.from_ndarray(np.vstack([y, u.reshape(-1, w), v.reshape(-1, w)]), format="yuv420p")
    space, rng_tag = TAGS[tag]
    frame.colorspace, frame.color_range = space, rng_tag
    want = to_rgb(frame).astype(int)
    matrix = "bt709" if space == 1 else "bt601"
    got = nv12_to_rgb(torch.from_numpy(y), torch.from_numpy(np.stack([u, v], -1)), matrix=matrix,
                      full_range=rng_tag == 2)
    diff = np.abs(got.permute(1, 2, 0).numpy().astype(int) - want)
    limit = VIDEO_RGB_MAX if rng_tag != 2 else VIDEO_RGB_MAX + 1
    assert diff.max() <= limit, (tag, int(diff.max()))


# -- on a GPU ---------------------------------------------------------------------------------
@needs_cuda
@pytest.mark.parametrize("name", sorted(TRANSFORMS))
def test_cuda_nvjpeg_keeps_the_boxes_within_the_idct_tolerance(images, name):
    make, make_reference = TRANSFORMS[name]
    if not nvjpeg_available(torch.device("cuda")):
        pytest.skip("torchvision with nvJPEG is not installed")
    batch = list(images.values()) * 4
    gpu = GpuImageDecode(make(), device="cuda")
    got = gpu(batch)
    assert got.device.type == "cuda" and gpu.refused == 0
    cpu, reference = make(), make_reference()
    for k, x in enumerate(batch):
        want_cpu, want_ref = cpu(x), reference(x)
        kind = list(images)[k % len(images)]
        if kind in ("baseline", "progressive", "grey"):
            assert (got[k].cpu().int() - want_ref.int()).abs().float().mean() <= IMAGE_MEAN_TOL + 0.5, kind
        else:
            assert torch.equal(got[k].cpu(), want_cpu), kind


@needs_cuda
@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_cuda_nvdec_gives_every_samplers_frames(video_pack, name):
    if not nvdec_available():
        pytest.skip("PyAV has no CUDA device")
    decoder = GpuClipDecode(device="cuda", nvdec=True)
    for want, got, inds in clips_both_ways(video_pack, SAMPLERS[name], decoder):
        assert got.device.type == "cuda" and got.shape == want.shape
        got = got.cpu()
        assert int((got.int() - want.int()).abs().max()) <= VIDEO_RGB_MAX, name
        assert [read_number(f.permute(1, 2, 0).numpy()) for f in got] == inds.tolist()
    assert decoder.fallbacks == 0  # every clip decoded by NVDEC, none handed to the CPU

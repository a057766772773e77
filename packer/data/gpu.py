"""Decoding on the GPU: nvJPEG for image packs, NVDEC for video packs, the CPU path where neither applies.

**Images.** ``GpuImageDecode(transform)`` takes a batch of encoded images (what
``PackedDataset(path, decode="bytes")`` gives, through a ``DataLoader`` whose workers only read
bytes or through ``packer.data.Loader``) and returns one ``N x 3 x H x W`` uint8 tensor on the
device. ``transform`` is the CPU transform whose geometry it keeps: ``DecodeRandomResizedCrop``
(the same boxes and flips for the same seed, drawn in batch order, as sequential calls of the
transform draw them) or ``DecodeResizeCrop`` (torchvision's ``Resize + CenterCrop`` box). Each
JPEG whose header promises the reference's reading (the rule of ``decode_box``'s fast route:
8-bit Huffman, 1 or 3 components, no Adobe transform, upright as stored) is decoded by nvJPEG
(``torchvision.io.decode_jpeg(..., device="cuda")``, the batch at once), then cut and resized
on the device as torchvision does it on tensors (crop, then bilinear with antialiasing; for the
centre crop, resize the whole image, then crop). Everything else (an EXIF orientation, CMYK,
other formats, raw arrays, a JPEG nvJPEG refuses) takes the CPU transform's own route with the
box already drawn, and is copied to the device.

**Video.** ``PackedVideoDataset(path, decode_on="gpu")`` makes its loader workers choose the
clip (frame numbers, crop box: the CPU path's draws) and the packets that decode it
(``packer.codecs.video_pack.plan_runs``, the CPU path's selection) without decoding:
``__getitem__`` returns a ``ClipPackets``. ``GpuClipDecode`` feeds those packets to NVDEC
through PyAV's FFmpeg (``hwaccel="cuda"``, frames kept on the device), converts NV12 to RGB on
the device with the frame's matrix and range, crops and resizes there, and returns the batch
in the dataset's layout. A decoder is made once per stream layout and flushed between runs.

**Falls back cleanly.** Without CUDA, torchvision or PyAV's CUDA device, the same calls run the
CPU path: the images' CPU transform, the clips' CPU decode and assembly, bit for bit what the
CPU datasets return (in this process rather than in loader workers). Nothing here imports
torchvision or touches CUDA until a GPU decode is asked for.

Pixels: the GPU paths are the reference's geometry on another decoder: nvJPEG's IDCT and
NVDEC's frames differ from libjpeg-turbo's and swscale's RGB by a few levels (docs/loading.md,
docs/video.md give the measured tolerances; ``scripts/device_check.py`` checks them).
"""
from __future__ import annotations

import logging
import threading
import warnings
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from packer.codecs import image as imaging
from packer.codecs.jpeg_meta import jpeg_meta
from packer.codecs.video_copy import rotate_upright
from packer.codecs.video_pack import _run, av_packets, feed_run
from packer.data.decode import Box, DecodeRandomResizedCrop, DecodeResizeCrop, decode_box, resized_size, to_chw3
from packer.data.device import resolve_device
from packer.data.video import ClipPackets, assemble_clip
from packer.errors import CorruptData, UsageError

__all__ = ["GpuImageDecode", "GpuClipDecode", "nvjpeg_available", "nvdec_available", "nv12_to_rgb",
           "resize_box", "arrange_clip"]

log = logging.getLogger(__name__)

JpegDecoder = Callable[[list], list]  # encoded JPEGs -> 3 x H x W uint8 tensors on the device


def nvjpeg_available(device: torch.device) -> bool:
    """Whether ``device`` is a CUDA device and torchvision's nvJPEG decode can be imported."""
    if device.type != "cuda":
        return False
    try:
        import torchvision.io
    except Exception:  # not installed, or a build that does not match torch
        return False
    return hasattr(torchvision.io, "decode_jpeg")


def nvdec_available() -> bool:
    """Whether CUDA is present and PyAV's FFmpeg can open a CUDA device for decoding."""
    if not torch.cuda.is_available():
        return False
    try:
        from av.codec.hwaccel import hwdevices_available
    except ImportError:
        return False
    return "cuda" in hwdevices_available()


def _nvjpeg(device: torch.device) -> JpegDecoder:
    from torchvision.io import ImageReadMode, decode_jpeg

    def decode(datas: list) -> list:
        with warnings.catch_warnings():  # bytes are read-only: torchvision only reads them
            warnings.simplefilter("ignore", UserWarning)
            tensors = [torch.frombuffer(d, dtype=torch.uint8) for d in datas]
        return decode_jpeg(tensors, mode=ImageReadMode.RGB, device=device)
    return decode


def resize_box(img: torch.Tensor, box: Box, flip: bool, out_h: int, out_w: int, *,
               short_side: Optional[int] = None) -> torch.Tensor:
    """``3 x H x W`` uint8 (or ``N x 3 x H x W``, every image the same box) -> ``3 x out_h x out_w``
    uint8 (``N x ...``) on its device, as torchvision on tensors: a whole-pixel box
    (RandomResizedCrop's) is cut, then resized; with ``short_side`` the whole image is resized to
    it (``Resize``), then the centre ``out_h x out_w`` is cut (``CenterCrop``). Bilinear with
    antialiasing; mirrored left-right when ``flip``."""
    x = img.float() if img.dim() == 4 else img[None].float()
    if short_side is None:
        top, left, h, w = (int(v) for v in box)
        x = x[:, :, top:top + h, left:left + w]
        if (h, w) != (out_h, out_w):
            x = F.interpolate(x, size=(out_h, out_w), mode="bilinear", antialias=True, align_corners=False)
    else:
        rh, rw = resized_size(img.shape[-2], img.shape[-1], short_side)
        x = F.interpolate(x, size=(rh, rw), mode="bilinear", antialias=True, align_corners=False)
        top, left = int(round((rh - out_h) / 2.0)), int(round((rw - out_w) / 2.0))
        x = x[:, :, top:top + out_h, left:left + out_w]
    if flip:
        x = x.flip(-1)
    x = x.round_().clamp_(0, 255).to(torch.uint8)
    return x if img.dim() == 4 else x[0]


class GpuImageDecode:
    """Decode a batch of encoded images on the GPU with a CPU transform's geometry (module doc).

    Args:
        transform: a ``DecodeRandomResizedCrop`` (its seed, scale, ratio and flip; its generator
            draws the boxes) or a ``DecodeResizeCrop``.
        device: where the batch goes (None: the current CUDA device, else the CPU).
        decoder: what decodes the JPEGs that go to the device (a callable: list of encoded
            JPEGs -> list of ``3 x H x W`` uint8 tensors on ``device``); None: nvJPEG when
            ``device`` is CUDA and torchvision is installed, else every image takes the CPU path.
    """

    def __init__(self, transform: DecodeRandomResizedCrop | DecodeResizeCrop, *,
                 device: str | torch.device | None = None, decoder: Optional[JpegDecoder] = None):
        if not isinstance(transform, (DecodeRandomResizedCrop, DecodeResizeCrop)):
            raise UsageError(f"GpuImageDecode keeps the geometry of a DecodeRandomResizedCrop or "
                             f"DecodeResizeCrop, not {transform!r}")
        self.transform = transform
        self.device = resolve_device(device)
        if decoder is None and nvjpeg_available(self.device):
            decoder = _nvjpeg(self.device)
        self._decode = decoder
        self.refused = 0  # JPEGs sent to the device that took the CPU route after all
        self._short_side = transform.short_side if isinstance(transform, DecodeResizeCrop) else None

    @property
    def on_device(self) -> bool:
        """Whether JPEGs are decoded on the device (False: every image takes the CPU path)."""
        return self._decode is not None

    def __repr__(self) -> str:
        return f"GpuImageDecode({self.transform!r}, device={self.device}, on_device={self.on_device})"

    def __call__(self, batch: Sequence[Any], rng: Optional[np.random.Generator] = None) -> torch.Tensor:
        """``N x 3 x H x W`` uint8 on the device for ``batch`` (encoded images or HxWx3 uint8
        arrays); ``rng`` as the transform's. ValueError for an image no decoder can read."""
        out_h, out_w = self.transform.output_size
        choose = self.transform.chooser(rng)
        out = torch.empty((len(batch), 3, out_h, out_w), dtype=torch.uint8, device=self.device)
        on_device: list[tuple[int, Any, tuple[Box, bool], tuple[int, int]]] = []
        for i, data in enumerate(batch):
            meta = None
            if self._decode is not None and not isinstance(data, np.ndarray) and imaging.sniff_format(data) == "jpeg":
                meta = jpeg_meta(data)
            if meta is not None and meta.fast and meta.orientation == 1:
                # the box is drawn now, in batch order, as the CPU transform would draw it
                on_device.append((i, data, choose(meta.height, meta.width), (meta.height, meta.width)))
            else:
                out[i].copy_(torch.from_numpy(to_chw3(decode_box(data, choose, out_h, out_w))))
        if on_device:
            self._decode_on_device(on_device, out, choose)
        return out

    def _decode_on_device(self, items: list, out: torch.Tensor, choose: Any) -> None:
        out_h, out_w = out.shape[2:]
        try:
            images = self._decode([data for _, data, _, _ in items])
        except RuntimeError:  # one JPEG the device decoder refuses fails the batch: each alone
            images = [self._decode_one(data) for _, data, _, _ in items]
        for (i, data, (box, flip), size), img in zip(items, images):
            if img is None or tuple(img.shape[1:]) != size:
                # refused, or not the header's size: the CPU route decides, with the same box (a
                # new one, as the CPU transform would draw, if the image is not the header's size)
                self.refused += 1
                chw = to_chw3(decode_box(data, _drawn(box, flip, size, choose), out_h, out_w))
                out[i].copy_(torch.from_numpy(chw))
            else:
                out[i] = resize_box(img, box, flip, out_h, out_w, short_side=self._short_side)

    def _decode_one(self, data: Any) -> Optional[torch.Tensor]:
        try:
            return self._decode([data])[0]
        except RuntimeError:
            return None


def _drawn(box: Box, flip: bool, size: tuple[int, int], choose: Any) -> Any:
    """A chooser that gives the box already drawn for an image of ``size``, and draws anew for any
    other size (never a box outside the image)."""
    return lambda h, w: (box, flip) if (h, w) == size else choose(h, w)


# -- video ------------------------------------------------------------------------------------
# BT.601 and BT.709 luma weights (Kr, Kb)
_KRKB = {"bt601": (0.299, 0.114), "bt709": (0.2126, 0.0722)}
# FFmpeg's AVColorSpace values the device conversion takes: BT.709 (1), unspecified (2: BT.601,
# swscale's default), BT.470BG (5) and SMPTE 170M (6), both BT.601
_MATRICES = {1: "bt709", 2: "bt601", 5: "bt601", 6: "bt601"}


def _yuv_matrix(matrix: str, full_range: bool) -> tuple[float, float, float, float, float, float]:
    """(luma offset, luma scale, R from V, G from U, G from V, B from U) for 8-bit YUV -> RGB."""
    kr, kb = _KRKB[matrix]
    kg = 1.0 - kr - kb
    ys, cs = (1.0, 1.0) if full_range else (255.0 / 219.0, 255.0 / 224.0)
    return (0.0 if full_range else 16.0, ys, cs * 2 * (1 - kr), -cs * 2 * (1 - kb) * kb / kg,
            -cs * 2 * (1 - kr) * kr / kg, cs * 2 * (1 - kb))


def nv12_to_rgb(y: torch.Tensor, uv: torch.Tensor, *, matrix: str = "bt601", full_range: bool = False) -> torch.Tensor:
    """NV12 planes (``... x H x W`` luma, ``... x H/2 x W/2 x 2`` interleaved chroma, uint8, any
    device; ``...``: frames, if any) -> ``... x 3 x H x W`` uint8 RGB on the same device, each chroma
    sample over its 2x2 block (the nearest chroma of swscale's unscaled converter, which the CPU
    path uses), rounded to nearest."""
    off, ys, rv, gu, gv, bu = _yuv_matrix(matrix, full_range)
    h, w = y.shape[-2:]
    c = uv.float().sub_(128.0).repeat_interleave(2, dim=-3).repeat_interleave(2, dim=-2)[..., :h, :w, :]
    u, v = c[..., 0], c[..., 1]
    luma = y.float().sub_(off).mul_(ys)
    rgb = torch.stack((luma + rv * v, luma + gu * u + gv * v, luma + bu * u), dim=-3)
    return rgb.round_().clamp_(0, 255).to(torch.uint8)


def arrange_clip(frames: torch.Tensor, order: np.ndarray, *, clip_len: int, layout: str) -> torch.Tensor:
    """Distinct frames (``N x C x H x W``) taken in ``order`` -> the clip in the dataset's layout, as
    ``assemble_clip`` lays it out: ``TCHW`` -> ``(T, C, H, W)``; ``CTHW`` -> ``(clips, C, clip_len,
    H, W)``, or ``(C, clip_len, H, W)`` for one clip."""
    clip = frames[torch.as_tensor(order, dtype=torch.long, device=frames.device)]
    if layout == "TCHW":
        return clip
    t, c, h, w = clip.shape
    clip = clip.reshape(t // clip_len, clip_len, c, h, w).permute(0, 2, 1, 3, 4)
    return clip[0] if clip.shape[0] == 1 else clip


def _frame_matrix(frame: Any) -> tuple[str, bool]:
    """The matrix and range of a decoded frame, as swscale reads its tags (untagged: BT.601
    limited; a yuvj format: full range). ``_NotNV12`` for a matrix the device conversion does not
    have (BT.2020, SMPTE 240M, FCC, YCgCo: swscale has them; the CPU path converts those)."""
    matrix = _MATRICES.get(int(frame.colorspace))
    if matrix is None:
        raise _NotNV12(f"colour matrix {int(frame.colorspace)}")
    return matrix, int(frame.color_range) == 2 or frame.format.name.startswith("yuvj")


class GpuClipDecode:
    """Decode a batch of ``ClipPackets`` on the GPU (NVDEC) into clips on the device (module doc).

    Args:
        device: where the clips go (None: the current CUDA device, else the CPU).
        nvdec: None: NVDEC when ``device`` is CUDA and PyAV's FFmpeg has a CUDA device, else the
            CPU path; True: require it; False: the CPU path (decoded and assembled exactly as
            ``PackedVideoDataset`` does, then copied to ``device``).
        hwaccel: the PyAV hardware device type NVDEC uses (``"cuda"``). ``None`` with
            ``nvdec=True`` decodes in software and converts and crops on ``device``: the device
            path with another decoder, what the CPU tests run.

    Not thread-safe across threads sharing one instance's decoders: each thread gets its own.
    """

    def __init__(self, *, device: str | torch.device | None = None, nvdec: Optional[bool] = None,
                 hwaccel: Optional[str] = "cuda"):
        self.device = resolve_device(device)
        if nvdec is None:
            nvdec = self.device.type == "cuda" and nvdec_available()
        elif nvdec and hwaccel is not None and not (self.device.type == "cuda" and nvdec_available()):
            raise UsageError(f"nvdec=True needs a CUDA device and PyAV with CUDA; device is {self.device}")
        self.nvdec = bool(nvdec)
        self.hwaccel = hwaccel
        self.fallbacks = 0  # clips the device path could not take, decoded on the CPU
        self._local = threading.local()
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"GpuClipDecode(device={self.device}, nvdec={self.nvdec}, hwaccel={self.hwaccel!r})"

    def __call__(self, clips: Sequence[ClipPackets]) -> torch.Tensor:
        """The batch of clips, stacked, uint8 on the device. CorruptData naming the video when a
        stream does not give the frames its index promises."""
        if not (self.nvdec and self.device.type == "cuda"):
            return torch.stack([self.clip(c) for c in clips])
        # FFmpeg's CUDA frames are written on the legacy default stream: convert on it, then
        # have the caller's stream wait for the batch
        caller, default = torch.cuda.current_stream(self.device), torch.cuda.default_stream(self.device)
        with torch.cuda.stream(default):
            out = torch.stack([self.clip(c) for c in clips])
        caller.wait_stream(default)
        return out

    def clip(self, c: ClipPackets) -> torch.Tensor:
        """One clip, uint8 on the device, in its dataset's layout. A stream the device path
        cannot take (a decoder error there, or frames that are not 8-bit 4:2:0) takes the CPU path."""
        import av

        try:
            if self.nvdec:
                try:
                    return self._on_device(c)
                except (av.error.FFmpegError, _NotNV12) as e:
                    self._local.contexts = {}  # a decoder in an unknown state is not reused
                    with self._lock:
                        self.fallbacks += 1
                    if self.fallbacks == 1:
                        log.warning("%s: decoded on the CPU: the device path cannot take it (%s); "
                                    "GpuClipDecode.fallbacks counts such clips", c.where, e)
            return self._on_cpu(c)
        except (ValueError, IndexError) as e:
            raise CorruptData(c.where, str(e)) from e

    # the CPU path: PackedVideoDataset's own decode and assembly
    def _on_cpu(self, c: ClipPackets) -> torch.Tensor:
        decoded: dict[int, np.ndarray] = {}
        for run, packets in c.run_packets():
            _run(c, packets, run, decoded)
        frames = rotate_upright([decoded[f] for f in sorted(decoded)], c.rotation)
        _check_size(frames[0].shape[:2], c.size)
        clip = assemble_clip(frames, c.order, clip_len=c.clip_len, layout=c.layout, crop_size=c.crop_size,
                             box=c.crop)
        return torch.from_numpy(clip).to(self.device)

    # the device path: NVDEC (or software), NV12 -> RGB, crop and resize on the device
    def _on_device(self, c: ClipPackets) -> torch.Tensor:
        ctx = self._context(c.decoder, c.extradata)
        decoded: dict[int, torch.Tensor] = {}
        for run, packets in c.run_packets():
            try:
                for f, frame in feed_run(ctx, av_packets(run, packets), run):
                    decoded[f] = self._planes(frame)
            finally:
                ctx.flush_buffers()  # drained (or abandoned): ready for the next run's keyframe
        planes = [decoded[f] for f in sorted(decoded)]
        if any(p[2:] != planes[0][2:] for p in planes):
            raise _NotNV12("frames of one clip with different colour tags")
        # the clip's distinct frames at once: one conversion, one crop
        frames = nv12_to_rgb(torch.stack([p[0] for p in planes]), torch.stack([p[1] for p in planes]),
                             matrix=planes[0][2], full_range=planes[0][3])
        if c.rotation:
            k = {90: 3, 180: 2, 270: 1}[c.rotation % 360]  # rotate_upright's turns (np.rot90 on H, W)
            frames = torch.rot90(frames, k, dims=(2, 3))
        _check_size(tuple(frames.shape[2:]), c.size)
        if c.crop_size:
            h, w = c.size
            side = min(h, w)
            box = c.crop or ((h - side) // 2, (w - side) // 2, side, side)
            frames = resize_box(frames, box, False, c.crop_size, c.crop_size)
        return arrange_clip(frames, c.order, clip_len=c.clip_len, layout=c.layout)

    def _context(self, decoder: str, extradata: bytes) -> Any:
        """This thread's decoder for streams of this codec and extradata (made once)."""
        import av

        cache = getattr(self._local, "contexts", None)
        if cache is None:
            cache = self._local.contexts = {}
        ctx = cache.get((decoder, extradata))
        if ctx is None:
            hw = None
            if self.hwaccel is not None:
                from av.codec.hwaccel import HWAccel

                index = self.device.index or 0
                hw = HWAccel(self.hwaccel, device=str(index), allow_software_fallback=False, is_hw_owned=True)
            ctx = av.CodecContext.create(decoder, "r", hwaccel=hw)
            if extradata:
                ctx.extradata = extradata
            ctx.thread_count = 1
            cache[(decoder, extradata)] = ctx
        return ctx

    def _planes(self, frame: Any) -> tuple[torch.Tensor, torch.Tensor, str, bool]:
        """A decoded frame's NV12 planes on the device (no copy for a CUDA frame), its matrix and range."""
        matrix, full = _frame_matrix(frame)
        name = frame.format.name
        try:
            planes = frame.planes
            if name in ("yuv420p", "yuvj420p"):  # a software frame: its chroma planes, interleaved here
                y, uv = _plane(planes[0]), torch.stack((_plane(planes[1]), _plane(planes[2])), dim=-1)
            elif name in ("cuda", "nv12"):
                y, uv = _plane(planes[0]), _plane(planes[1])
            else:
                raise _NotNV12(name)
        except (NotImplementedError, ValueError) as e:  # a CUDA frame of another layout
            raise _NotNV12(str(e)) from e
        if y.dtype != torch.uint8 or tuple(uv.shape) != (frame.height // 2, frame.width // 2, 2):
            raise _NotNV12(f"planes {tuple(y.shape)} {y.dtype}, {tuple(uv.shape)}")
        if y.device != self.device:
            y, uv = y.to(self.device), uv.to(self.device)
        return y, uv, matrix, full


class _NotNV12(Exception):
    """A decoded frame the device conversion does not take (not 8-bit 4:2:0)."""


def _plane(plane: Any) -> torch.Tensor:
    """A PyAV frame plane as a tensor on its device, without a copy. The capsule is taken with no
    stream: PyAV refuses the one ``torch.from_dlpack`` passes for CUDA planes; FFmpeg writes its
    CUDA frames on the legacy default stream, where ``GpuClipDecode`` converts them."""
    return torch.from_dlpack(plane.__dlpack__())


def _check_size(got: tuple[int, ...], want: tuple[int, int]) -> None:
    if tuple(got) != tuple(want):
        raise ValueError(f"decoded frames are {got[0]}x{got[1]}, the manifest says {want[0]}x{want[1]}")

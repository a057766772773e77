#!/usr/bin/env python
"""Decode-time crops, per core: region-of-interest decoding against full decode, and fidelity.

Generated photo-like JPEGs (``packer.synth``, quality 90), two sets: ImageNet-size (~500x375,
jittered +-1/8, both orientations) and the same images pre-resized to a 256-px short side (as
``packer resize --short-side 256`` stores them). One process, one thread, every pipeline timed
side by side in interleaved rounds (median of rounds), each fed the same boxes:

* ``RandomResizedCrop(224)`` + flip:
  ``roi``: ``DecodeRandomResizedCrop`` (box from the header, only the box's window decoded
  through TurboJPEG 3, DCT-scaled where the box is >= 2x the output);
  ``full``: the fastest full decode (``packer.codecs.image.decode``) + the same crop and
  resample from the array (what the transform does without region decoding);
  ``torchvision``: Pillow decode + crop + Pillow bilinear (torchvision's PIL path).
* ``Resize(256)+CenterCrop(224)``: ``DecodeResizeCrop`` now, as it was before exact geometry
  (box rounded to whole pixels, whole image decoded), and torchvision's PIL pipeline.

Then the fidelity table (``packer.commands.fidelity``): median PSNR against a full-decode
Lanczos reference and the measured shift, for each fast path beside the torchvision pipeline
and the old ``DecodeResizeCrop``; and the same measure for the pre-resizing paths
(``--short-side 256`` of the pack/resize commands and of ``decode-frames``). Run::

    python scripts/bench_crops.py                  # ~1-2 min on a quiet core
    python scripts/bench_crops.py --count 16 --rounds 2   # smoke run
"""
from __future__ import annotations

import argparse
import io
import statistics
import sys
import time
from typing import Any, Callable

import cv2
import numpy as np
import torch
from PIL import Image

from packer.codecs import jpeg_region
from packer.codecs.resize import ResizeSpec, resize_pixels
from packer.codecs.video import Resize
from packer.codecs.image import DECODER, decode, to_chw
from packer.commands.fidelity import fidelity_rows, format_fidelity, measure_shift, psnr
from packer.data.decode import decode_scaled, jpeg_size
from packer.data.decode import DecodeRandomResizedCrop, PilRandomResizedCrop
from packer.data.decode import resample_box, to_chw3
from packer.data.decode import DecodeResizeCrop, PilResizeCrop, center_box, reduction_factor
from packer.synth import jpeg_bytes, natural_image


def make_sets(count: int, seed: int) -> dict[str, list[bytes]]:
    rng = np.random.default_rng(seed)
    big, small = [], []
    for i in range(count):
        h, w = 375 + int(rng.integers(-46, 47)), 500 + int(rng.integers(-62, 63))
        if i % 4 == 3:
            h, w = w, h  # some portrait images
        arr = natural_image(rng, h, w)
        big.append(jpeg_bytes(arr, 90))
        s = 256 / min(h, w)
        small.append(jpeg_bytes(np.asarray(Image.fromarray(arr).resize(
            (max(256, round(w * s)), max(256, round(h * s))), Image.LANCZOS)), 90))
    return {"ImageNet-size (~500x375)": big, "pre-resized (short side 256)": small}


def old_decode_resize_crop(short_side: int, crop: int) -> Callable[[bytes], torch.Tensor]:
    """``DecodeResizeCrop`` before exact geometry: whole image decoded (DCT-scaled when the
    short side is >= 2x ``short_side``), the centre square rounded to whole pixels, resized."""
    def run(data: bytes) -> torch.Tensor:
        size = jpeg_size(data)
        arr = decode_scaled(data, reduction_factor(*size, short_side) if size else 1)
        h, w = arr.shape[:2]
        scale = short_side / min(h, w)
        side = min(crop / scale, h, w)
        y0, x0, n = int(round((h - side) / 2)), int(round((w - side) / 2)), max(1, int(round(side)))
        out = cv2.resize(arr[y0:y0 + n, x0:x0 + n], (crop, crop), interpolation=cv2.INTER_LINEAR)
        return torch.from_numpy(to_chw(np.ascontiguousarray(out)))
    return run


def old_box(short_side: int, crop: int) -> Callable[[int, int, int], tuple]:
    """The box the old ``DecodeResizeCrop`` actually resized (for its fidelity row): the
    rounded square, in source pixels (exact only when no DCT scaling applies)."""
    def box(h: int, w: int, i: int) -> tuple:
        return center_box(h, w, short_side, crop)
    return box


def timed_rounds(pipelines: dict[str, Callable[[int], Any]], n: int, rounds: int) -> dict[str, float]:
    """Median over rounds of the mean CPU ms per image (``thread_time``: this thread's work,
    not the time other processes on a shared machine take). Each round runs every pipeline
    over all images in turn (as a loader would: one pipeline, image after image), the order
    rotating between rounds."""
    names = list(pipelines)
    per: dict[str, list[float]] = {k: [] for k in names}
    for r in range(rounds):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            fn = pipelines[name]
            t0 = time.thread_time()
            for i in range(n):
                fn(i)
            per[name].append((time.thread_time() - t0) / n * 1e3)
    return {k: statistics.median(v) for k, v in per.items()}


def bench_set(label: str, data: list[bytes], rounds: int, seed: int) -> list[str]:
    n = len(data)
    rrc = DecodeRandomResizedCrop(224, seed=seed)
    pil_rrc = PilRandomResizedCrop(224, seed=seed)
    drc, pil_drc, old = DecodeResizeCrop(256, 224), PilResizeCrop(256, 224), old_decode_resize_crop(256, 224)

    def rng(i: int) -> np.random.Generator:
        return np.random.default_rng([seed, i])

    def full(i: int) -> torch.Tensor:
        arr = decode(data[i])
        box, flip = rrc.sample(arr.shape[0], arr.shape[1], rng(i))
        return torch.from_numpy(to_chw3(resample_box(arr, box, 224, 224, flip=flip)))

    pipes = {
        "rrc roi": lambda i: rrc(data[i], rng=rng(i)),
        "rrc full": full,
        "rrc torchvision": lambda i: pil_rrc(data[i], rng=rng(i)),
        "centre now": lambda i: drc(data[i]),
        "centre before": lambda i: old(data[i]),
        "centre torchvision": lambda i: pil_drc(data[i]),
    }
    for fn in pipes.values():  # warm-up, and the fast paths agree with the reference geometry
        fn(0)
    ms = timed_rounds(pipes, n, rounds)
    rows = [f"### {label}: {n} JPEGs, CPU ms per image on one core (median of {rounds} rounds)", "",
            "| pipeline | CPU ms/image | speed-up |", "|---|---:|---:|"]
    rows.append(f"| RandomResizedCrop(224)+flip: full decode + crop + resize | {ms['rrc full']:.3f} | 1.00x |")
    rows.append(f"| RandomResizedCrop(224)+flip: DecodeRandomResizedCrop (ROI decode) | {ms['rrc roi']:.3f} | "
                f"**{ms['rrc full'] / ms['rrc roi']:.2f}x** |")
    rows.append(f"| RandomResizedCrop(224)+flip: torchvision (PIL) | {ms['rrc torchvision']:.3f} | "
                f"{ms['rrc full'] / ms['rrc torchvision']:.2f}x |")
    rows.append(f"| Resize(256)+CenterCrop(224): DecodeResizeCrop before (rounded box) | {ms['centre before']:.3f} | 1.00x |")
    rows.append(f"| Resize(256)+CenterCrop(224): DecodeResizeCrop now (exact, ROI) | {ms['centre now']:.3f} | "
                f"**{ms['centre before'] / ms['centre now']:.2f}x** |")
    rows.append(f"| Resize(256)+CenterCrop(224): torchvision (PIL) | {ms['centre torchvision']:.3f} | "
                f"{ms['centre before'] / ms['centre torchvision']:.2f}x |")
    fid = fidelity_rows(data, seed=seed, extra=[
        ("DecodeResizeCrop before (rounded box)", "Resize(256)+CenterCrop(224)",
         lambda d, i: old(d), old_box(256, 224))])
    return rows + ["", f"Fidelity on the same {n} images (reference: full decode + Lanczos from the exact box)", "",
                   format_fidelity(fid), ""]


def pre_resize_rows(seed: int, per_size: int = 3) -> list[str]:
    """``--short-side 256`` pre-resizing (``packer resize`` / pack commands: Pillow's DCT draft
    + Lanczos) and ``decode-frames --short-side 256`` (OpenCV ``INTER_AREA`` on decoded frames)
    against a full decode resized with Lanczos to the same size."""
    rng = np.random.default_rng(seed)
    lines = ["### Pre-resizing to a 256-px short side, against full decode + Lanczos to the same size", "",
             "| source | pipeline | PSNR median (dB) | shift max (px) |", "|---|---|---:|---:|"]
    for h, w in [(375, 500), (768, 1024), (1080, 1920), (2000, 3000)]:
        rows: dict[str, tuple[list, list]] = {"packer resize --short-side 256": ([], []),
                                              "decode-frames --short-side 256": ([], [])}
        for _ in range(per_size):
            data = jpeg_bytes(natural_image(rng, h, w), 90)
            full = Image.open(io.BytesIO(data)).convert("RGB")
            outs = {"packer resize --short-side 256": resize_pixels(data, ResizeSpec(short_side=256)),
                    "decode-frames --short-side 256": Resize(short_side=256)(np.asarray(full))}
            for name, out in outs.items():
                ref = np.asarray(full.resize((out.shape[1], out.shape[0]), Image.LANCZOS))
                rows[name][0].append(psnr(out, ref))
                rows[name][1].append(float(np.hypot(*measure_shift(out, ref))))
        for name, (ps, sh) in rows.items():
            lines.append(f"| {w}x{h} | {name} | {statistics.median(ps):.2f} | {max(sh):.3f} |")
    return lines + [""]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--count", type=int, default=96, help="images per set")
    ap.add_argument("--rounds", type=int, default=7, help="interleaved timing rounds")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    cv2.setNumThreads(1)
    torch.set_num_threads(1)
    lib = jpeg_region.library_path()
    print(f"full decoder: {DECODER}; region decoding: {lib or 'unavailable (pip install packer[turbo])'}\n")
    for label, data in make_sets(args.count, args.seed).items():
        print("\n".join(bench_set(label, data, args.rounds, args.seed)))
    print("\n".join(pre_resize_rows(args.seed)))
    if lib is None:
        print("region decoding unavailable: the 'roi' rows decoded whole images")
    return 0


if __name__ == "__main__":
    sys.exit(main())

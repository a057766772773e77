"""Benchmark pre-resizing, side by side in one run (issue 5).

1. Resize throughput on generated ~3000x2000 JPEGs to a short side of 256, one process:
   the DCT-domain fast path (Pillow ``draft`` + Lanczos, ``packer.codecs.resize``) against a full
   decode + resize with Pillow (Lanczos, the slow path) and with OpenCV (``imdecode`` +
   ``INTER_AREA``); OpenCV's own reduced decode (``IMREAD_REDUCED_COLOR_*``) is shown for
   context. PSNR of the fast path against the full-decode Lanczos resize.
2. Loader throughput of a 224-px training pipeline (random-resized crop + flip -> uint8 CHW
   tensor, DataLoader with workers) reading an LMDB of the resized images against an LMDB of
   the original-size images (both packed by ``pack_images``, the resized one with
   ``resize=ResizeSpec(short_side=256)``, i.e. ``packer to-lmdb --short-side 256``).

Usage: python -m scripts.bench.resize pre-resize [--count 8] [--repeat 3] [--loader-images 96] [--batch-size 32]
                                                [--workers 2]
       python -m scripts.bench.resize --quick pre-resize
"""
from __future__ import annotations

import argparse
import io
import os
import random
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import cv2
import numpy as np
from PIL import Image


from packer.commands.pack_images import pack_images
from packer.codecs.resize import DRAFT_GAP, ResizeSpec, plan_resize, resize_image, resize_pixels
from packer.synth import jpeg_bytes, natural_image
from packer.conversion.options import RunOptions
from scripts.bench.common import run_sections, target

cv2.setNumThreads(1)


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float("inf") if mse == 0 else 10 * np.log10(255.0 ** 2 / mse)


def make_large_jpegs(folder: Path, count: int) -> list[Path]:
    """``count`` natural-looking ~3000x2000 JPEGs (cached in ``folder``)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    rng = np.random.default_rng(0)
    for i in range(count):
        p = folder / f"photo_{i:03d}.jpg"
        h, w = 2000 + int(rng.integers(-64, 65)), 3000 + int(rng.integers(-96, 97))
        if not p.exists():
            p.write_bytes(jpeg_bytes(natural_image(np.random.default_rng(100 + i), h, w), quality=90))
        paths.append(p)
    return paths


def opencv_full(data: bytes, size: tuple[int, int]) -> np.ndarray:
    arr = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    return cv2.cvtColor(cv2.resize(arr, size, interpolation=cv2.INTER_AREA), cv2.COLOR_BGR2RGB)


def opencv_reduced(data: bytes, size: tuple[int, int], stored: tuple[int, int]) -> np.ndarray:
    scale = 1
    for s, flag in ((8, cv2.IMREAD_REDUCED_COLOR_8), (4, cv2.IMREAD_REDUCED_COLOR_4),
                    (2, cv2.IMREAD_REDUCED_COLOR_2)):
        if stored[0] // s >= size[0] * DRAFT_GAP and stored[1] // s >= size[1] * DRAFT_GAP:
            scale = s
            break
    flag = {1: cv2.IMREAD_COLOR, 2: cv2.IMREAD_REDUCED_COLOR_2, 4: cv2.IMREAD_REDUCED_COLOR_4,
            8: cv2.IMREAD_REDUCED_COLOR_8}[scale]
    arr = cv2.imdecode(np.frombuffer(data, np.uint8), flag)
    return cv2.cvtColor(cv2.resize(arr, size, interpolation=cv2.INTER_AREA), cv2.COLOR_BGR2RGB)


def time_methods(methods: dict, datas: list[bytes], repeat: int) -> dict[str, float]:
    """Images per second of each method. The methods take turns on every image (after one
    warm-up), so load from other processes on a shared machine hits them all alike."""
    spent = dict.fromkeys(methods, 0.0)
    for fn in methods.values():
        fn(datas[0])
    for _ in range(repeat):
        for d in datas:
            for name, fn in methods.items():
                t = time.perf_counter()
                fn(d)
                spent[name] += time.perf_counter() - t
    return {name: repeat * len(datas) / t for name, t in spent.items()}


def bench_resize(paths: list[Path], short_side: int, repeat: int) -> dict[str, float]:
    datas = [p.read_bytes() for p in paths]
    fast = ResizeSpec(short_side=short_side)
    slow = ResizeSpec(short_side=short_side, draft=False)
    sizes = {}
    for d in datas:
        im = Image.open(io.BytesIO(d))
        sizes[id(d)] = (plan_resize(im.width, im.height, fast).out, im.size)
    methods = {
        "packer fast path (draft + Lanczos)": lambda d: resize_pixels(d, fast),
        "Pillow full decode + Lanczos": lambda d: resize_pixels(d, slow),
        "OpenCV full decode + INTER_AREA": lambda d: opencv_full(d, sizes[id(d)][0]),
        "OpenCV reduced decode + INTER_AREA (context)": lambda d: opencv_reduced(d, *sizes[id(d)]),
        "packer resize_image (fast path + JPEG q90 encode)": lambda d: resize_image(d, fast),
    }
    rates = time_methods(methods, datas, repeat)
    scores = [psnr(resize_pixels(d, fast), resize_pixels(d, slow)) for d in datas]
    cv_scores = [psnr(opencv_full(d, sizes[id(d)][0]), resize_pixels(d, slow)) for d in datas]
    mp = np.mean([s[1][0] * s[1][1] for s in sizes.values()]) / 1e6
    print(f"\n== resize: {len(datas)} JPEGs of ~{mp:.1f} MP (~3000x2000) to short side {short_side}, "
          f"{repeat} passes, one process ==")
    for name, rate in rates.items():
        print(f"  {name:52s} {rate:7.1f} img/s")
    base = rates["packer fast path (draft + Lanczos)"]
    r_pil = base / rates["Pillow full decode + Lanczos"]
    r_cv = base / rates["OpenCV full decode + INTER_AREA"]
    print(f"  fast path / Pillow full decode: {r_pil:.2f}x   fast path / OpenCV full decode: {r_cv:.2f}x"
          f"   (target >= 3x the full-decode path)")
    print(f"  PSNR fast path vs full-decode Lanczos: mean {np.mean(scores):.1f} dB, min {np.min(scores):.1f} dB"
          f"   (OpenCV INTER_AREA vs the same reference: mean {np.mean(cv_scores):.1f} dB)")
    return {"fast_vs_pillow": r_pil, "fast_vs_opencv": r_cv}


# -- loader ----------------------------------------------------------------------------------------
class TrainTransform:
    """A 224-px training transform: random-resized crop (scale 0.08-1, ratio 3/4-4/3) + flip
    -> uint8 CHW tensor (what torchvision's RandomResizedCrop/RandomHorizontalFlip/PILToTensor do)."""

    def __init__(self, size: int = 224):
        self.size = size

    def __call__(self, im: Image.Image):
        import torch

        w, h = im.size
        area = w * h
        for _ in range(10):
            target = area * random.uniform(0.08, 1.0)
            ratio = np.exp(random.uniform(np.log(3 / 4), np.log(4 / 3)))
            cw, ch = int(round((target * ratio) ** 0.5)), int(round((target / ratio) ** 0.5))
            if 0 < cw <= w and 0 < ch <= h:
                x, y = random.randint(0, w - cw), random.randint(0, h - ch)
                break
        else:
            cw = ch = min(w, h)
            x, y = (w - cw) // 2, (h - ch) // 2
        im = im.resize((self.size, self.size), Image.BILINEAR, box=(x, y, x + cw, y + ch))
        if random.random() < 0.5:
            im = im.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        return torch.from_numpy(np.asarray(im).transpose(2, 0, 1).copy())


def loader_rate(path: Path, workers: int, batch: int) -> float:
    from torch.utils.data import DataLoader

    from packer import PackedDataset

    ds = PackedDataset(path, decode="pil", transform=TrainTransform(224))
    loader = DataLoader(ds, batch_size=batch, shuffle=True, num_workers=workers, drop_last=False,
                        persistent_workers=False)
    it = iter(loader)
    next(it)  # start the workers and warm up before timing
    n = 0
    t = time.perf_counter()
    for images, _ in it:
        n += images.shape[0]
    return n / (time.perf_counter() - t)


def bench_loader(paths: list[Path], work: Path, images: int, workers: int, short_side: int, batch: int = 32) -> float:
    src = work / "loader_src"
    if src.exists():
        shutil.rmtree(src)
    for i in range(images):  # an ImageFolder of `images` large JPEGs (copies of the generated ones)
        d = src / f"class_{i % 4}"
        d.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(paths[i % len(paths)], d / f"img_{i:05d}.jpg")
    orig, small = work / "original.lmdb", work / f"resized{short_side}.lmdb"
    t = time.perf_counter()
    pack_images(src, orig, format="lmdb", run_options=RunOptions(workers=workers, overwrite=True))
    t_orig = time.perf_counter() - t
    t = time.perf_counter()
    pack_images(src, small, format="lmdb", resize=ResizeSpec(short_side=short_side),
                run_options=RunOptions(workers=workers, overwrite=True))
    t_small = time.perf_counter() - t
    size = lambda p: sum(f.stat().st_size for f in p.iterdir()) / 1e6  # noqa: E731
    print(f"\n== loader: 224-px training pipeline, {images} images, DataLoader batch {batch}, {workers} workers ==")
    print(f"  packed original LMDB in {t_orig:.1f}s ({size(orig):.0f} MB); resized (short side {short_side}) "
          f"LMDB in {t_small:.1f}s ({images / t_small:.1f} img/s, {size(small):.1f} MB)")
    r_orig = loader_rate(orig, workers, batch)
    r_small = loader_rate(small, workers, batch)
    print(f"  original-size LMDB   {r_orig:8.1f} img/s")
    print(f"  resized LMDB         {r_small:8.1f} img/s")
    print(f"  resized / original: {r_small / r_orig:.1f}x")
    return r_small / r_orig


def resize_main(argv: list[str]) -> dict[str, Any]:
    """The resize fast path against full decode + resize, and the loader on resized vs original LMDBs."""
    ap = argparse.ArgumentParser(prog="resize.py pre-resize")
    ap.add_argument("--count", type=int, default=8, help="distinct generated 3000x2000 JPEGs")
    ap.add_argument("--repeat", type=int, default=3, help="timed passes over them per method")
    ap.add_argument("--short-side", type=int, default=256)
    ap.add_argument("--loader-images", type=int, default=96, help="images in the loader benchmark's LMDBs")
    ap.add_argument("--batch-size", type=int, default=32, help="the loader's batch (the first one is not timed)")
    ap.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--workdir", type=Path, default=Path("bench-out/resize"))
    args = ap.parse_args(argv)
    print(f"machine: {os.cpu_count()} cores, load average at start {os.getloadavg()[0]:.2f} "
          f"(timings are noisy on a shared machine; compare the ratios)")
    paths = make_large_jpegs(args.workdir / "photos", args.count)
    r = bench_resize(paths, args.short_side, args.repeat)
    if args.loader_images <= args.batch_size:
        ap.error("--loader-images must exceed --batch-size: the first batch is not timed")
    loader = bench_loader(paths, args.workdir, args.loader_images, args.workers, args.short_side, args.batch_size)
    print(f"\nload average at end {os.getloadavg()[0]:.2f}")
    return {"targets": [
        target("fast path (draft + Lanczos) vs Pillow full decode + Lanczos, one process", r["fast_vs_pillow"], 3.0),
        target("fast path (draft + Lanczos) vs OpenCV full decode + INTER_AREA, one process", r["fast_vs_opencv"]),
        target(f"training loader over the resized LMDB vs the original-size LMDB, {args.workers} workers", loader)]}


def main(argv: list[str] | None = None) -> int:
    """Run the section named on the command line and write the JSON."""
    return run_sections("resize", __doc__, {"pre-resize": resize_main}, all_sections=("pre-resize",), argv=argv,
                        quick={"pre-resize": ["--count", "2", "--repeat", "1", "--loader-images", "12",
                                              "--batch-size", "4",
                                              "--workdir", "bench-out/resize-quick"]},
                        notes=["One process (and a DataLoader's workers); ratios within one run stand."])


if __name__ == "__main__":
    sys.exit(main())

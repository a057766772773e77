"""Fidelity of the fast decode paths: PSNR against a full-decode Lanczos reference, and shift.

For every image and pipeline the *reference* is the same output geometry computed the slow,
careful way: a full Pillow decode (EXIF applied) resampled with Lanczos straight from the
source box to the output (``Image.resize(..., LANCZOS, box=...)``, fractional box, no
rounding). Each pipeline's output is scored by

* **PSNR** (dB, all channels) against the reference: higher is closer (100 means identical);
* **shift** (output pixels): the sub-pixel translation between the pipeline's output and the
  reference, by Lucas-Kanade registration of the luma planes, reported as its length.
  A correctly placed pipeline measures a few hundredths of a pixel; rounding the crop box to
  whole source pixels measures up to half a source pixel.

Pipelines: ``DecodeResizeCrop`` (fast) and ``PilResizeCrop`` (torchvision's
``Resize + CenterCrop`` on Pillow) for the centre crop; ``DecodeRandomResizedCrop`` and
``PilRandomResizedCrop`` (torchvision's ``RandomResizedCrop`` on Pillow) for the training
crop, both fed the same seeded draws so they cut the same box (flip off).
``packer bench`` prints this table for the dataset it runs on (``--fidelity N`` samples);
``scripts/bench_crops.py`` too.
"""
from __future__ import annotations

import io
import statistics
import warnings
from typing import Any, Callable, Sequence

import cv2
import numpy as np
from PIL import Image

__all__ = ["psnr", "measure_shift", "lanczos_reference", "fidelity_rows", "format_fidelity", "dataset_fidelity"]


PSNR_IDENTICAL = 100.0  # what identical images score (keeps the JSON finite)


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """Peak signal-to-noise ratio of two uint8 images in dB (``PSNR_IDENTICAL`` at most)."""
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return PSNR_IDENTICAL if mse == 0 else min(PSNR_IDENTICAL, 10.0 * np.log10(255.0 ** 2 / mse))


def _luma(a: np.ndarray) -> np.ndarray:
    a = a.astype(np.float64)
    return a[..., 0] * 0.299 + a[..., 1] * 0.587 + a[..., 2] * 0.114


def measure_shift(a: np.ndarray, b: np.ndarray, *, iterations: int = 8) -> tuple[float, float]:
    """(dx, dy): where the content of HxWx3 ``a`` sits relative to ``b``, in pixels.

    Lucas-Kanade on the luma planes: ``b`` is shifted by the current estimate (bicubic) and
    the 2x2 normal equations of the residual against its gradients give the update; a 6-pixel
    border is left out. Blur differences are symmetric and do not bias it (tested on known
    sub-pixel shifts). OpenCV 5's ``phaseCorrelate`` reports (0.5, 0.5) for identical even-sized
    images, so it is not used.
    """
    la, lb = _luma(a), _luma(b)
    m = 6
    dx = dy = 0.0
    for _ in range(iterations):
        warp = np.array([[1.0, 0.0, dx], [0.0, 1.0, dy]])
        sb = cv2.warpAffine(lb, warp, (lb.shape[1], lb.shape[0]), flags=cv2.INTER_CUBIC,
                            borderMode=cv2.BORDER_REFLECT)
        gx = cv2.Sobel(sb, cv2.CV_64F, 1, 0, ksize=3, scale=1 / 8)[m:-m, m:-m]
        gy = cv2.Sobel(sb, cv2.CV_64F, 0, 1, ksize=3, scale=1 / 8)[m:-m, m:-m]
        r = (la - sb)[m:-m, m:-m]
        jtj = np.array([[np.sum(gx * gx), np.sum(gx * gy)], [np.sum(gx * gy), np.sum(gy * gy)]])
        if abs(np.linalg.det(jtj)) < 1e-9:
            break
        ux, uy = np.linalg.solve(jtj, [-np.sum(gx * r), -np.sum(gy * r)])
        dx, dy = dx + ux, dy + uy
        if abs(ux) < 1e-4 and abs(uy) < 1e-4:
            break
    return float(dx), float(dy)


def _upright_pil(data: Any) -> Image.Image:
    from packer.codecs.image import to_rgb_array

    if isinstance(data, np.ndarray):
        return Image.fromarray(data)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Image.fromarray(to_rgb_array(Image.open(io.BytesIO(bytes(data)))))


def lanczos_reference(im: Image.Image, box: Sequence[float], out_h: int, out_w: int) -> np.ndarray:
    """The reference output: ``box`` (top, left, height, width; source pixels, fractional)
    of the full-resolution image resampled with Lanczos to ``out_h x out_w``."""
    top, left, h, w = box
    return np.asarray(im.resize((out_w, out_h), Image.LANCZOS, box=(left, top, left + w, top + h)))


def _hwc(t: Any) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(t).transpose(1, 2, 0))


def _pipelines(short_side: int, crop: int, seed: int) -> list[tuple[str, str, Callable, Callable]]:
    """(name, kind, make_output(data, i), box(height, width, i)) for every pipeline."""
    from packer.data.decode import DecodeRandomResizedCrop, PilRandomResizedCrop
    from packer.data.decode import DecodeResizeCrop, PilResizeCrop, center_box

    fast, pil = DecodeResizeCrop(short_side, crop), PilResizeCrop(short_side, crop)
    rrc, pil_rrc = DecodeRandomResizedCrop(crop, flip=0.0), PilRandomResizedCrop(crop, flip=0.0)

    def centre(h: int, w: int, i: int):
        return center_box(h, w, short_side, crop)

    def rand(h: int, w: int, i: int):
        return rrc.sample(h, w, np.random.default_rng([seed, i]))[0]

    label = f"Resize({short_side})+CenterCrop({crop})"
    return [
        (f"DecodeResizeCrop({short_side}, {crop})", label, lambda d, i: fast(d), centre),
        (f"torchvision {label} (PIL)", label, lambda d, i: pil(d), centre),
        (f"DecodeRandomResizedCrop({crop})", f"RandomResizedCrop({crop})",
         lambda d, i: rrc(d, rng=np.random.default_rng([seed, i])), rand),
        (f"torchvision RandomResizedCrop({crop}) (PIL)", f"RandomResizedCrop({crop})",
         lambda d, i: pil_rrc(d, rng=np.random.default_rng([seed, i])), rand),
    ]


def fidelity_rows(samples: Sequence[Any], *, short_side: int = 256, crop: int = 224, seed: int = 0,
                  extra: Sequence[tuple[str, str, Callable, Callable]] = ()) -> list[dict[str, Any]]:
    """One row per pipeline over ``samples`` (encoded images or HxWx3 arrays): ``pipeline``,
    ``kind``, ``images``, ``psnr_median``, ``psnr_p10``, ``shift_median``, ``shift_max``.

    ``extra`` adds pipelines as ``(name, kind, output(data, index) -> CxHxW, box(height,
    width, index) -> (top, left, height, width))``.
    """
    rows = []
    uprights = [_upright_pil(d) for d in samples]
    for name, kind, make, box_of in [*_pipelines(short_side, crop, seed), *extra]:
        scores, shifts = [], []
        for i, (data, im) in enumerate(zip(samples, uprights)):
            out = _hwc(make(data, i))
            ref = lanczos_reference(im, box_of(im.height, im.width, i), out.shape[0], out.shape[1])
            scores.append(psnr(out, ref))
            shifts.append(float(np.hypot(*measure_shift(out, ref))))
        rows.append({"pipeline": name, "kind": kind, "images": len(samples),
                     "psnr_median": statistics.median(scores), "psnr_p10": sorted(scores)[len(scores) // 10],
                     "shift_median": statistics.median(shifts), "shift_max": max(shifts)})
    return rows


def format_fidelity(rows: Sequence[dict[str, Any]]) -> str:
    """The rows as a markdown table."""
    lines = ["| pipeline | PSNR median (dB) | PSNR p10 (dB) | shift median (px) | shift max (px) |",
             "|---|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['pipeline']} | {r['psnr_median']:.2f} | {r['psnr_p10']:.2f} | "
                     f"{r['shift_median']:.3f} | {r['shift_max']:.3f} |")
    return "\n".join(lines)


def dataset_fidelity(reader: Any, *, count: int, short_side: int, crop: int) -> list[dict[str, Any]]:
    """``fidelity_rows`` over up to ``count`` samples spread across a packed output's reader
    (encoded images as stored; raw samples as pixels)."""
    from packer.data.datasets import raw_record

    n = len(reader)
    samples = []
    for i in range(0, n, max(1, n // max(count, 1)))[:count]:
        rec = reader.read(i)
        samples.append(raw_record(rec, "numpy") if rec.fmt == "raw" else rec.data)
    return fidelity_rows(samples, short_side=short_side, crop=crop) if samples else []

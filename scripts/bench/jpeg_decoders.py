"""Full JPEG decode: the libraries packer can use, each in a FRESH process, one thread.

Every row decodes the same photo-like JPEGs (``packer.synth.natural_image``, 4:2:0, quality 90)
to HxWx3 RGB uint8 and records images/s with the user/system CPU and minor page faults of the
timed window, and whether its pixels equal Pillow's (a digest of every array). Rows whose
library is missing are skipped with a line. ``packer`` is ``packer.codecs.image.decode`` with
the decoder it picks by default (header parsing and EXIF handling included).

    python -m scripts.bench.jpeg_decoders decoders            # ~1 min on 2 cores
    python -m scripts.bench.jpeg_decoders --quick decoders    # smoke run, seconds

PyTurboJPEG needs a libturbojpeg >= 3.0: set ``PACKER_TURBOJPEG`` to one (region decoding does
not: ``packer.codecs.jpeg_region`` uses the libjpeg-turbo inside Pillow's wheel).
"""
from __future__ import annotations

import argparse
import hashlib
import io
import os
import pickle
import sys
import tempfile
import time
from typing import Any, Callable

import numpy as np

from scripts.bench.common import child_row, proc_usage, run_fresh, run_sections, usage_delta

MODULE = "scripts.bench.jpeg_decoders"
DECODERS = ("pillow", "opencv", "simplejpeg", "jpeg4py", "pyturbojpeg", "packer")


def _decoder(name: str) -> Callable[[bytes], np.ndarray]:
    """The decode call of ``name`` (raises ImportError/OSError when it is not usable here)."""
    if name == "pillow":
        from PIL import Image

        return lambda b: np.asarray(Image.open(io.BytesIO(b)).convert("RGB"))
    if name == "opencv":
        import cv2

        cv2.setNumThreads(1)
        flag = cv2.IMREAD_COLOR_RGB | cv2.IMREAD_IGNORE_ORIENTATION
        return lambda b: cv2.imdecode(np.frombuffer(b, np.uint8), flag)
    if name == "simplejpeg":
        import simplejpeg

        return lambda b: simplejpeg.decode_jpeg(b, colorspace="RGB")
    if name == "jpeg4py":
        import jpeg4py

        return lambda b: jpeg4py.JPEG(np.frombuffer(b, np.uint8)).decode()
    if name == "pyturbojpeg":
        from turbojpeg import TJPF_RGB, TurboJPEG  # PyTurboJPEG 2.x needs libturbojpeg >= 3

        tj = TurboJPEG(os.environ.get("PACKER_TURBOJPEG") or None)
        return lambda b: tj.decode(b, pixel_format=TJPF_RGB)
    if name == "packer":
        from packer.codecs import image

        return image.decode
    raise ValueError(name)


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """Decode every image ``spec["rounds"]`` times in this process; the figures of that window."""
    with open(spec["images"], "rb") as f:
        images = pickle.load(f)
    try:
        decode = _decoder(spec["decoder"])
        decode(images[0])  # one warm-up call: library loading is start-up, not decode
    except (ImportError, OSError, RuntimeError) as e:
        return {"skipped": f"{type(e).__name__}: {e}"}
    digest = hashlib.sha256()
    for data in images:
        digest.update(np.ascontiguousarray(decode(data)).tobytes())
    before, t = proc_usage([os.getpid()]), time.perf_counter()
    for _ in range(spec["rounds"]):
        for data in images:
            decode(data)
    wall = time.perf_counter() - t
    window = usage_delta(before, proc_usage([os.getpid()]))
    n = spec["rounds"] * len(images)
    extra = {"decoder": __import__("packer.codecs.image", fromlist=["x"]).DECODER} \
        if spec["decoder"] == "packer" else {}
    return {"images_s": n / wall, "window": window, "per_image": {k: v / n for k, v in window.items()},
            "digest": digest.hexdigest(), **extra}


def decoders_main(argv: list[str]) -> dict[str, Any]:
    """The ``decoders`` section: every decoder row in a fresh process; prints a markdown table."""
    ap = argparse.ArgumentParser(prog="python -m scripts.bench.jpeg_decoders decoders")
    ap.add_argument("--count", type=int, default=300, help="distinct JPEGs (default 300)")
    ap.add_argument("--size", default="475x500", help="HxW of each image (default 475x500)")
    ap.add_argument("--rounds", type=int, default=5, help="passes over the images per row")
    ap.add_argument("--decoders", default=",".join(DECODERS))
    args = ap.parse_args(argv)
    from packer.synth import jpeg_bytes, natural_image

    h, w = (int(v) for v in args.size.split("x"))
    rng = np.random.default_rng(0)
    images = [jpeg_bytes(natural_image(rng, h, w)) for _ in range(args.count)]
    with tempfile.NamedTemporaryFile("wb", suffix=".pkl", delete=False) as f:
        pickle.dump(images, f)
    rows = []
    try:
        for name in args.decoders.split(","):
            r = run_fresh(MODULE, {"images": f.name, "decoder": name, "rounds": args.rounds})
            rows.append({"row": name, **r})
    finally:
        os.unlink(f.name)
    ref = next((r.get("digest") for r in rows if r["row"] == "pillow"), None)
    print(f"{args.count} JPEGs {h}x{w} (4:2:0, quality 90), {args.rounds} rounds, one thread, each row a "
          "fresh process; CPU and minor faults per image of the timed window\n")
    print("| decoder | images/s | user ms | sys ms | faults | pixels |\n|---|---:|---:|---:|---:|---|")
    for r in rows:
        if "images_s" not in r:
            print(f"| {r['row']} | skipped: {r.get('skipped') or r.get('error')} | | | | |")
            continue
        p = r["per_image"]
        same = "n/a" if ref is None else ("Pillow's" if r["digest"] == ref else "DIFFERENT")
        name = r["row"] + (f" ({r['decoder']})" if "decoder" in r else "")
        print(f"| {name} | {r['images_s']:.0f} | {p['user_s'] * 1e3:.2f} | {p['sys_s'] * 1e3:.2f} | "
              f"{p['minflt']:.1f} | {same} |")
    return {"rows": rows}


def main(argv: list[str] | None = None) -> int:
    """``decoders`` (the section) or ``--child SPEC`` (one row, in its fresh process)."""
    argv = sys.argv[1:] if argv is None else argv
    if child_row(argv, child):
        return 0
    return run_sections("jpeg_decoders", __doc__, {"decoders": decoders_main}, all_sections=("decoders",),
                        quick={"decoders": ["--count", "12", "--rounds", "1", "--size", "120x160"]},
                        notes=["Each row a fresh process; images/s is wall-clock, CPU per image is the "
                               "figure to compare on a shared machine."], argv=argv)


if __name__ == "__main__":
    sys.exit(main())

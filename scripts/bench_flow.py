"""Optical flow speed per core at 340x256, per method (TV-L1, Farneback, DIS), side by side.

Frames: the mmaction2 ``test.mp4`` fixture (H.264, 340x256) from tests/fixtures (or
$PACKER_FIXTURES), else a generated 340x256 video with motion. One process, OpenCV held to one thread
(``cv2.setNumThreads(1)``), so frames per CPU-second is frames per core. Two figures per
method: the flow estimate alone, and what ``decode-frames --task flow`` does per flow frame
(estimate + mmaction2 quantization + two grey JPEG encodes). Ratios are against DIS, in the
same run. The target: DIS >= 100 flow frames/s per core.

    python scripts/bench_flow.py [--pairs 40] [--tvl1-pairs 4]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import cv2
import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from packer.codecs.flow import FlowEstimator, encode_grey, quantize, tvl1_available  # noqa: E402
from packer.synth import natural_image  # noqa: E402

FIXTURE = Path(os.environ.get("PACKER_FIXTURES", REPO / "tests" / "fixtures")) / "videos" / "mmaction2_test.mp4"


def grey_frames(n: int) -> tuple[list[np.ndarray], str]:
    """``n`` consecutive grey 340x256 frames and where they came from."""
    if FIXTURE.is_file():
        cap = cv2.VideoCapture(str(FIXTURE))
        frames = []
        while len(frames) < n:
            ok, f = cap.read()
            if not ok:
                break
            if f.shape[:2] != (256, 340):
                f = cv2.resize(f, (340, 256), interpolation=cv2.INTER_AREA)
            frames.append(cv2.cvtColor(f, cv2.COLOR_BGR2GRAY))
        if len(frames) == n:
            return frames, f"{FIXTURE.name} (first {n} frames)"
    rng = np.random.default_rng(0)
    base = cv2.cvtColor(natural_image(rng, 256, 340 + 2 * n), cv2.COLOR_RGB2GRAY)
    return [base[:, 2 * i:2 * i + 340].copy() for i in range(n)], "generated 340x256 frames panning 2 px/frame"


def measure(method: str, frames: list[np.ndarray], full: bool) -> tuple[float, float]:
    """(flow frames per CPU-second, per wall-second) over consecutive pairs."""
    est = FlowEstimator(method)
    est(frames[0], frames[1])  # warm up: allocations, first-call setup
    c0, w0 = time.process_time(), time.perf_counter()
    for a, b in zip(frames, frames[1:]):
        flow = est(a, b)
        if full:
            encode_grey(quantize(flow[:, :, 0]))
            encode_grey(quantize(flow[:, :, 1]))
    n = len(frames) - 1
    return n / (time.process_time() - c0), n / (time.perf_counter() - w0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=40, help="flow frames per method (Farneback, DIS)")
    ap.add_argument("--tvl1-pairs", type=int, default=4, help="flow frames for TV-L1 (about 1 s each)")
    args = ap.parse_args()
    cv2.setNumThreads(1)
    frames, where = grey_frames(args.pairs + 1)
    methods = [m for m in ("dis", "farneback", "tvl1") if m != "tvl1" or tvl1_available()]
    rows = {}
    for m in methods:
        use = frames[: (args.tvl1_pairs if m == "tvl1" else args.pairs) + 1]
        rows[m] = (measure(m, use, False), measure(m, use, True), len(use) - 1)
    print(f"Input: {where}; OpenCV {cv2.__version__}, 1 thread, one process.\n")
    print("| method | flow frames | flow only (frames/CPU-s) | + quantize + 2 JPEG (frames/CPU-s) "
          "| wall (frames/s) | vs DIS |")
    print("|---|---|---|---|---|---|")
    dis = rows["dis"][1][0]
    for m, ((cpu, _), (full, wall), n) in rows.items():
        fmt = (lambda v: f"{v:.2f}" if v < 10 else f"{v:.1f}")  # noqa: E731
        print(f"| {m} | {n} | {fmt(cpu)} | {fmt(full)} | {fmt(wall)} | {full / dis:.4f}x |")
    print(f"\nDIS >= 100 flow frames/s per core (with quantize + encode): "
          f"{'met' if dis >= 100 else 'NOT met'} ({dis:.0f})")
    if "tvl1" not in rows:
        print("TV-L1 skipped: this OpenCV has no contrib optflow module")


if __name__ == "__main__":
    main()

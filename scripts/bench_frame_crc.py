"""What FrameDataset's frame CRC check costs: TSN clips (8 frames) from a ``decode-frames``
output with ``check_crc=True`` (the default) and ``False``, side by side in one run.

The input is the real fixture ``tests/fixtures/videos/mmaction2_test.mp4`` (300 frames,
340x256, H.264) copied into a few class folders. The two settings alternate round by round so
machine load hits both alike; the figure is CPU time per clip (decode included), and the ratio.

    python scripts/bench_frame_crc.py
"""
from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import torch

from packer.commands.decode_frames import decode_frames
from packer.data.video import FrameDataset

REPO = Path(__file__).resolve().parent.parent
VIDEO = REPO / "tests" / "fixtures" / "videos" / "mmaction2_test.mp4"


def per_clip_ms(ds: FrameDataset, clips: int) -> float:
    """CPU milliseconds per clip over ``clips`` clips."""
    t = time.process_time()
    for k in range(clips):
        ds[k % len(ds)]
    return 1000 * (time.process_time() - t) / clips


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--videos", type=int, default=4)
    ap.add_argument("--clips", type=int, default=100, help="clips per setting per round")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src"
        for i in range(args.videos):
            (src / f"class_{i % 2}").mkdir(parents=True, exist_ok=True)
            shutil.copy(VIDEO, src / f"class_{i % 2}" / f"v{i}.mp4")
        out = Path(tmp) / "frames"
        decode_frames(src, out, workers=0)
        sets = {True: FrameDataset(out, clip_len=1, num_clips=8, test_mode=True, check_crc=True),
                False: FrameDataset(out, clip_len=1, num_clips=8, test_mode=True, check_crc=False)}
        for ds in sets.values():
            per_clip_ms(ds, 10)  # warm the page cache and the lazy state
        times = {True: [], False: []}
        for _ in range(args.rounds):
            for check in (False, True):
                times[check].append(per_clip_ms(sets[check], args.clips))
    on, off = sorted(times[True])[args.rounds // 2], sorted(times[False])[args.rounds // 2]
    print(f"{args.videos} x {VIDEO.name} decoded to frame folders; TSN clips of 8 frames; "
          f"median of {args.rounds} rounds x {args.clips} clips, CPU time")
    print()
    print("| FrameDataset | CPU ms per clip | ratio |")
    print("|---|---|---|")
    print(f"| check_crc=False | {off:.2f} | 1.00x |")
    print(f"| check_crc=True (default) | {on:.2f} | {on / off:.3f}x |")


if __name__ == "__main__":
    main()

"""mmaction2's own code over packer's outputs: does mmaction2 read what decode-frames writes,
and does packer read it as mmaction2 does?

On generated videos (two classes, one multi-label list), this script:

1. runs ``packer decode-frames --task both`` (TV-L1 when OpenCV has contrib, else Farneback) to frame
   folders, with a multi-label list too;
2. builds mmaction2 1.2's real ``RawframeDataset`` (RGB and ``modality='Flow'`` with the flow
   list and ``filename_tmpl='{}_{:05d}.jpg'``, and ``multi_class=True``) over those outputs,
   and runs its real ``SampleFrames`` / ``DenseSampleFrames`` + ``RawFrameDecode`` pipeline;
3. compares frame indices, decoded pixels and labels with packer's ``FrameDataset`` and
   ``PackedVideoDataset`` (an LMDB copy) drawing from the same numpy seed;
4. with ``--mmaction2-repo DIR`` (a checkout of open-mmlab/mmaction2), runs that checkout's
   ``tools/misc/flow_extraction.py`` (``extract_dense_flow``, same method) on one video and checks
   that its x/y JPEG files are byte-identical to packer's.

mmaction2 pulls mmengine/mmcv, so it runs in a separate environment (see
scripts/mmaction2_samplers.py for the install line):

    PYTHONPATH=$PWD .venv-bench/bin/python scripts/check_mmaction2.py --mmaction2-repo DIR

Prints one line per check and exits 1 on the first mismatch.
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from packer import FrameDataset, PackedVideoDataset  # noqa: E402
from packer.codecs.flow import tvl1_available  # noqa: E402
from packer.commands.decode_frames import decode_frames  # noqa: E402
from tests.support.inputs import write_video  # noqa: E402


def check(name: str, ok: bool) -> None:
    print(f"{'ok  ' if ok else 'FAIL'} {name}")
    if not ok:
        sys.exit(1)


def mm_dataset(ann: Path, prefix: Path, pipeline: list, **kw):
    from mmaction.datasets import RawframeDataset

    return RawframeDataset(str(ann), pipeline=pipeline, data_prefix=dict(img=str(prefix)), **kw)


def compare(name: str, mm, ours, seeds=range(3), flow: bool = False) -> None:
    """mmaction2 item i after np.random.seed(s) against packer's item i after the same seed."""
    for i in range(len(ours)):
        for s in seeds:
            np.random.seed(s)
            got = mm[i]
            np.random.seed(s)
            clip, label = ours[i]
            np.random.seed(s)
            inds = ours.clip_indices(i)
            imgs = np.stack(got["imgs"])  # T x H x W x C (RGB, or x/y for flow)
            # rawframes count from 1 (start_index=1); packed outputs from 0
            same_inds = (got["frame_inds"] - 1).tolist() == (inds - ours._start_index).tolist()
            same_pixels = np.array_equal(imgs, clip.permute(0, 2, 3, 1).numpy())
            mm_label = got["label"]
            same_label = (mm_label.tolist() == label.tolist()) if hasattr(label, "tolist") else mm_label == label
            if not (same_inds and same_pixels and same_label):
                check(f"{name}: video {i} seed {s} (indices {same_inds}, pixels {same_pixels}, "
                      f"label {same_label})", False)
    check(f"{name}: {len(ours)} videos x {len(list(seeds))} seeds: same indices, pixels and labels", True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mmaction2-repo", type=Path, default=None,
                    help="a checkout of open-mmlab/mmaction2, for tools/misc/flow_extraction.py")
    args = ap.parse_args()
    from mmaction.datasets.transforms.loading import DenseSampleFrames, RawFrameDecode, SampleFrames

    method = "tvl1" if tvl1_available() else "farneback"  # both are in mmaction2's flow_extraction.py
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        src = tmp / "src"
        for c in range(2):
            for k in range(2):
                write_video(src / f"class {c}" / f"v_{c}_{k}.avi", frames=9 + 3 * k, size=(48, 64), seed=c * 2 + k)
        out = tmp / "frames"
        decode_frames(src, out, workers=1, backend="opencv", task="both", flow=method)
        packed = tmp / "frames.lmdb"
        decode_frames(src, packed, to="lmdb", workers=1, backend="opencv",
                      task="both", flow=method)
        print(f"decoded 4 videos with --task both --flow {method}")

        rgb_pipe = [SampleFrames(clip_len=2, frame_interval=2, num_clips=2), RawFrameDecode()]
        ours_kw = dict(clip_len=2, frame_interval=2, num_clips=2)
        compare("RGB SampleFrames", mm_dataset(out / "rawframes.txt", out, rgb_pipe), FrameDataset(out, **ours_kw))
        flow_mm = mm_dataset(out / "rawframes_flow.txt", out, rgb_pipe, modality="Flow", filename_tmpl="{}_{:05d}.jpg")
        compare("Flow SampleFrames (frames)", flow_mm, FrameDataset(out, modality="Flow", **ours_kw))
        compare("Flow SampleFrames (lmdb)", flow_mm, PackedVideoDataset(packed, modality="Flow", **ours_kw))
        dense = [DenseSampleFrames(clip_len=2, frame_interval=1, num_clips=2, sample_range=8), RawFrameDecode()]
        from packer.data.samplers import DenseSampleFrames as OurDense

        compare("RGB DenseSampleFrames", mm_dataset(out / "rawframes.txt", out, dense),
                FrameDataset(out, sampling=OurDense(clip_len=2, num_clips=2, sample_range=8)))

        lst = tmp / "multi.txt"
        lst.write_text("class 0/v_0_0.avi 0 2\nclass 1/v_1_1.avi 1\n")
        multi = tmp / "multi"
        decode_frames(src, multi, list_path=lst, workers=1, backend="opencv")
        check("a multi-label list keeps every label", (multi / "rawframes.txt").read_text().splitlines()[0]
              == "class_0/v_0_0 9 0 2")
        compare("multi-label (multi_class=True, num_classes=3)",
                mm_dataset(multi / "rawframes.txt", multi, rgb_pipe, multi_class=True, num_classes=3),
                FrameDataset(multi, multi_class=True, num_classes=3, **ours_kw))

        if args.mmaction2_repo is not None:
            path = args.mmaction2_repo / "tools" / "misc" / "flow_extraction.py"
            spec = importlib.util.spec_from_file_location("mm_flow_extraction", path)
            tool = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(tool)
            dest = tmp / "mm_flow"
            tool.extract_dense_flow(str(src / "class 0" / "v_0_0.avi"), str(dest), bound=20.0, start_idx=1,
                                    method=method, save_rgb=True)
            ours = out / "class_0" / "v_0_0"
            names = sorted(p.name for p in dest.iterdir())
            same = all((dest / n).read_bytes() == (ours / n).read_bytes() for n in names)
            check(f"mmaction2 flow_extraction.py ({method}) wrote {len(names)} files, byte-identical to "
                  f"packer's: {same}",
                  same and names == sorted(p.name for p in ours.iterdir()))


if __name__ == "__main__":
    main()

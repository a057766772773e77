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
   that its x/y JPEG files are byte-identical to packer's;
5. runs ``packer pack-videos --to files`` (plain MP4s plus ``videos.txt``) and builds mmaction2's
   real ``VideoDataset`` over that list, with ``DecordInit``/``DecordDecode`` and
   ``PyAVInit``/``PyAVDecode`` after ``SampleFrames`` (train and test mode): each item's frame
   count, frame indices and label must equal packer's ``PackedVideoDataset`` over the same output
   (same numpy seed), and its pixels must equal, bit for bit, those frames of a sequential decode
   of the file by the same library (decord's ``next()``, PyAV's ``decode``); packer's own pixels
   are compared with PyAV's and the largest difference printed (different YUV->RGB conversions).
   ``--only-video-list`` runs this step alone.

Prints one line per check and exits 1 on the first mismatch. With ``--record-samplers`` it
instead runs mmaction2 1.2's real samplers (``SampleFrames`` with and without ``target_fps``,
``DenseSampleFrames``, ``UntrimmedSampleFrames``) after ``np.random.seed(seed)`` on a grid of
cases and writes ``tests/reference/mmaction2_samplers.json.gz``, the data the sampler tests hold
packer's samplers to.

mmaction2 pulls mmengine/mmcv, so this runs in a separate environment, not packer's:

    python -m venv .venv-bench
    .venv-bench/bin/pip install --no-deps mmaction2==1.2.0 mmengine==0.10.7 mmcv-lite==2.1.0 \
        addict yapf termcolor rich platformdirs        # plus numpy, torch, opencv
    .venv-bench/bin/pip install scipy packaging pyyaml av decord \
        click pillow lmdb h5py crc32c tqdm pebble      # mmaction2's other imports, step 5, packer's own
    PYTHONPATH=$PWD .venv-bench/bin/python -m scripts.check.mmaction2 --mmaction2-repo DIR
    PYTHONPATH=$PWD .venv-bench/bin/python -m scripts.check.mmaction2 --only-video-list
    PYTHONPATH=$PWD .venv-bench/bin/python -m scripts.check.mmaction2 --record-samplers
"""
from __future__ import annotations

import argparse
import gzip
import importlib.util
import itertools
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

from packer import FrameDataset, PackedVideoDataset
from packer.codecs.flow import tvl1_available
from packer.commands.decode_frames import decode_frames
from packer.commands.decode_frames import FlowOptions, FrameOptions
from scripts.bench.common import REPO, write_video
from packer.commands.pack_videos import VideoPackOptions
from packer.conversion.options import InputOptions, RunOptions


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


# == pack-videos --to files under mmaction2's VideoDataset ===========================================
def sequential_decode(path: Path, library: str) -> list[np.ndarray]:
    """Every frame of a video file in order, RGB, by one library's sequential decode."""
    if library == "decord":
        import decord

        vr = decord.VideoReader(str(path), num_threads=1)
        return [vr.next().asnumpy() for _ in range(len(vr))]
    import av

    with av.open(str(path)) as c:
        return [f.to_rgb().to_ndarray() for f in c.decode(video=0)]


def check_video_list() -> None:
    """mmaction2's VideoDataset over ``pack-videos --to files``: counts, indices, labels, pixels."""
    from mmaction.datasets import VideoDataset
    from mmaction.datasets.transforms.loading import (DecordDecode, DecordInit, PyAVDecode, PyAVInit,
                                                      SampleFrames)

    from packer.commands.pack_videos import pack_videos

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        src = tmp / "src"
        for c in range(2):
            for k in range(2):
                ext = "avi" if k else "mp4"
                write_video(src / f"class {c}" / f"v_{c}_{k}.{ext}", frames=37 + 11 * k + 5 * c,
                            size=(72, 96), seed=c * 2 + k)
        out = tmp / "videos"
        report = pack_videos(src, out, to="files",
                             pack_options=VideoPackOptions(short_side=64, gop=8, backend="opencv"),
                             run_options=RunOptions(workers=1, timeout=600.0))
        check(f"pack-videos --to files: {report.videos} videos, {len(report.failures)} failures",
              report.videos == 4 and not report.failures)
        ann = out / "videos.txt"
        check(f"videos.txt: {ann.read_text().splitlines()[0]!r} ...", ann.exists())
        settings = {"train": dict(clip_len=4, frame_interval=3, num_clips=2),
                    "test": dict(clip_len=8, frame_interval=2, num_clips=3, test_mode=True)}
        libraries = {"decord": (DecordInit, DecordDecode), "pyav": (PyAVInit, PyAVDecode)}  # sequential_decode's names
        refs = {lib: [sequential_decode(out / v["file"], lib) for v in PackedVideoDataset(out).reader.manifest.videos]
                for lib in libraries}
        worst = 0
        for lib, (init, decode) in libraries.items():
            for name, kw in settings.items():
                mm = VideoDataset(str(ann), pipeline=[init(), SampleFrames(**kw), decode()],
                                  data_prefix=dict(video=str(out)), test_mode=kw.get("test_mode", False))
                ours = PackedVideoDataset(out, **kw)
                compared = 0
                for i in range(len(ours)):
                    total = ours._video(i)[0]
                    for seed in range(3):
                        np.random.seed(seed)
                        got = mm[i]
                        np.random.seed(seed)
                        inds = ours.clip_indices(i)
                        np.random.seed(seed)
                        clip, label = ours[i]
                        mm_inds = np.asarray(got["frame_inds"]).reshape(-1)
                        imgs = np.stack(got["imgs"])
                        same_count = got["total_frames"] == total == len(refs[lib][i])
                        same_inds = mm_inds.tolist() == inds.tolist()
                        same_pixels = np.array_equal(imgs, np.stack([refs[lib][i][j] for j in mm_inds]))
                        same_label = int(got["label"]) == int(label)
                        diff = np.abs(imgs.astype(int) - clip.permute(0, 2, 3, 1).numpy().astype(int))
                        worst = max(worst, int(diff.max()))
                        if not (same_count and same_inds and same_pixels and same_label and not diff.any()):
                            check(f"VideoDataset + {lib} {name}: video {i} seed {seed} (frame count "
                                  f"{got['total_frames']} vs {total}: {same_count}, indices {same_inds}, "
                                  f"pixels {same_pixels}, label {same_label}, packer's clip off by up to "
                                  f"{int(diff.max())})", False)
                        compared += len(mm_inds)
                check(f"VideoDataset + {init.__name__}/{decode.__name__} + SampleFrames ({name}): "
                      f"{len(ours)} videos x 3 seeds, {compared} frames: same frame counts, indices, labels "
                      f"and pixels as packer's clips; pixels equal to a sequential {lib} decode of the file", True)
        print(f"info packer's clips vs mmaction2's (decord and PyAV) of the same frames: max |difference| {worst} "
              "(both through swscale's YUV->RGB)")


# == the samplers' reference data ====================================================================
SAMPLERS_OUT = REPO / "tests" / "reference" / "mmaction2_samplers.json.gz"
TOTALS = (1, 7, 33, 65, 301)
SEEDS = (0, 7)


def run(transform, total: int, seed: int, fps=None, start_index: int = 1):
    np.random.seed(seed)
    results = {"total_frames": total, "start_index": start_index}
    if fps is not None:
        results["avg_fps"] = fps
    try:
        return transform(results)["frame_inds"].tolist()
    except Exception as e:  # recorded: packer must refuse the same cases
        return {"error": type(e).__name__}


def cases():
    from mmaction.datasets.transforms.loading import DenseSampleFrames, SampleFrames, UntrimmedSampleFrames

    out = []
    fps_grid = [dict(clip_len=c, frame_interval=i, num_clips=n, test_mode=t, target_fps=30,
                     out_of_bound_opt=o, twice_sample=tw, keep_tail_frames=kt)
                for c, i, n, t, o, tw, kt in itertools.product(
                    (1, 4, 8), (1, 4), (1, 3), (False, True), ("loop", "repeat_last"), (False, True),
                    (False, True))
                if not (tw and not t) and not (kt and t) and not (tw and n == 1 and c > 1)]
    for kw in fps_grid:
        for fps in (None, 29.97, 60.0):
            for total in TOTALS:
                for seed in SEEDS[: 1 if kw["test_mode"] else 2]:
                    out.append({"sampler": "SampleFrames", "kwargs": kw, "total_frames": total, "fps": fps,
                                "seed": seed, "frame_inds": run(SampleFrames(**kw), total, seed, fps)})
    dense_grid = [dict(clip_len=c, frame_interval=i, num_clips=n, test_mode=t, sample_range=r,
                       num_sample_positions=p, out_of_bound_opt=o, temporal_jitter=j)
                  for c, i, n, t, r, p, o, j in itertools.product(
                      (1, 8), (1, 3), (1, 4), (False, True), (32, 64), (10, 3), ("loop", "repeat_last"),
                      (False, True))
                  if not (p != 10 and not t)]
    for kw in dense_grid:
        for total in TOTALS:
            for seed in SEEDS[: 1 if kw["test_mode"] and not kw["temporal_jitter"] else 2]:
                out.append({"sampler": "DenseSampleFrames", "kwargs": kw, "total_frames": total, "fps": None,
                            "seed": seed, "frame_inds": run(DenseSampleFrames(**kw), total, seed)})
    for c, ci, i in itertools.product((1, 2, 5), (1, 16, 32), (1, 3)):
        kw = dict(clip_len=c, clip_interval=ci, frame_interval=i)
        for total in TOTALS:
            out.append({"sampler": "UntrimmedSampleFrames", "kwargs": kw, "total_frames": total, "fps": None,
                        "seed": 0, "frame_inds": run(UntrimmedSampleFrames(**kw), total, 0)})
    return out


def record_samplers() -> None:
    """Write the frame indices mmaction2's own samplers draw on a grid of cases (test data)."""
    import mmaction

    data = {"source": f"mmaction2 {mmaction.__version__}, mmaction/datasets/transforms/loading.py, "
                      "after np.random.seed(seed); start_index 1; written by scripts/check/mmaction2.py --record-samplers",
            "cases": cases()}
    SAMPLERS_OUT.parent.mkdir(parents=True, exist_ok=True)
    SAMPLERS_OUT.write_bytes(gzip.compress((json.dumps(data, separators=(",", ":")) + "\n").encode(), mtime=0))
    print(f"{SAMPLERS_OUT}: {len(data['cases'])} cases")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mmaction2-repo", type=Path, default=None,
                    help="a checkout of open-mmlab/mmaction2, for tools/misc/flow_extraction.py")
    ap.add_argument("--only-video-list", action="store_true",
                    help="run only the pack-videos --to files check (mmaction2's VideoDataset)")
    ap.add_argument("--record-samplers", action="store_true",
                    help=f"instead: write mmaction2's sampler draws to {SAMPLERS_OUT.relative_to(REPO)}")
    args = ap.parse_args()
    if args.record_samplers:
        record_samplers()
        return
    if args.only_video_list:
        check_video_list()
        return
    from mmaction.datasets.transforms.loading import DenseSampleFrames, RawFrameDecode, SampleFrames

    method = "tvl1" if tvl1_available() else "farneback"  # both are in mmaction2's flow_extraction.py
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        src = tmp / "src"
        for c in range(2):
            for k in range(2):
                write_video(src / f"class {c}" / f"v_{c}_{k}.avi", frames=9 + 3 * k, size=(48, 64), seed=c * 2 + k)
        out = tmp / "frames"
        decode_frames(src, out, frame_options=FrameOptions(backend="opencv"),
                      flow_options=FlowOptions(task="both", flow=method),
                      run_options=RunOptions(workers=1, timeout=600.0))
        packed = tmp / "frames.lmdb"
        decode_frames(src, packed, to="lmdb", frame_options=FrameOptions(backend="opencv"),
                      flow_options=FlowOptions(task="both", flow=method),
                      run_options=RunOptions(workers=1, timeout=600.0))
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
        decode_frames(src, multi, frame_options=FrameOptions(backend="opencv"),
                      input_options=InputOptions(list_path=lst), run_options=RunOptions(workers=1, timeout=600.0))
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
    check_video_list()


if __name__ == "__main__":
    main()

"""Optical flow: ``decode-frames --task flow|both`` and ``modality="Flow"`` datasets.

Fidelity is checked against OpenCV run directly (TV-L1 with its defaults, as mmaction2's
``tools/misc/flow_extraction.py``) and the quantization the issue states: clip to
[-bound, bound], ``(f + bound) * 255 / (2 * bound)``, truncated to uint8.
"""
from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from click.testing import CliRunner

from packer import FrameDataset, PackedVideoDataset
from packer.cli import main
from packer.codecs.flow import FlowEstimator, quantize, tvl1_available
from packer.commands.decode_frames import decode_frames
from packer.commands.inspection import verify_dataset
from packer.formats import FORMATS, open_reader
from packer.commands.decode_frames import FlowOptions, FrameOptions
from tests.support.inputs import write_video, write_video_folder
from packer.conversion.options import InputOptions, RunOptions

PACKED = sorted(FORMATS)
needs_tvl1 = pytest.mark.skipif(not tvl1_available(), reason="OpenCV without contrib (cv2.optflow)")


def out_path(tmp_path: Path, to: str) -> Path:
    return tmp_path / (f"{to}.h5" if to in FORMATS and FORMATS[to][0].single_file else to)


def mmaction2_quantize(flow: np.ndarray, bound: float = 20.0) -> np.ndarray:
    """The quantization as stated in the issue and in mmaction2's flow_to_img (float32 steps)."""
    f = np.clip(flow, -bound, bound)
    f += bound
    f *= 255 / float(2 * bound)
    return f.astype(np.uint8)


def opencv_frames(path: Path) -> list[np.ndarray]:
    cap = cv2.VideoCapture(str(path))
    frames = []
    while True:
        ok, f = cap.read()
        if not ok:
            return frames
        frames.append(f)


def test_quantize_known_values():
    f = np.array([[-100, -20, -0.08, 0, 0.07, 0.08, 19.99, 20, 100]], np.float32)
    assert quantize(f).tolist() == [[0, 0, 126, 127, 127, 128, 254, 255, 255]]
    assert quantize(np.array([[0.0]], np.float32), 10.0).tolist() == [[127]]
    assert quantize(f).tolist() == mmaction2_quantize(f).tolist()


@needs_tvl1
def test_tvl1_is_bit_identical_to_opencv_run_directly(tmp_path):
    video = write_video(tmp_path / "v" / "c" / "a.avi", frames=5, size=(40, 56), seed=3)
    out = tmp_path / "flow"
    decode_frames(tmp_path / "v", out, frame_options=FrameOptions(ext="png", backend="opencv"),
                  flow_options=FlowOptions(task="flow", flow="tvl1", flow_tmpl="{}_{:05d}.png"),
                  run_options=RunOptions(workers=1, timeout=600.0))
    grey = [cv2.cvtColor(f, cv2.COLOR_BGR2GRAY) for f in opencv_frames(video)]
    tvl1 = cv2.optflow.DualTVL1OpticalFlow_create()
    for k in range(len(grey) - 1):
        flow = tvl1.calc(grey[k], grey[k + 1], None)
        for c, d in enumerate("xy"):
            stored = cv2.imread(str(out / "c" / "a" / f"{d}_{k + 1:05d}.png"), cv2.IMREAD_UNCHANGED)
            want = mmaction2_quantize(flow[:, :, c])
            assert stored.dtype == np.uint8 and np.array_equal(stored, want), (k, d)
    assert len(list((out / "c" / "a").iterdir())) == 2 * (len(grey) - 1)  # flow only, no RGB


@pytest.mark.parametrize("method", ["tvl1", "farneback", "dis"])
def test_a_static_video_gives_flow_images_of_127_128(tmp_path, method):
    if method == "tvl1" and not tvl1_available():
        pytest.skip("OpenCV without contrib")
    path = tmp_path / "v" / "still.avi"  # MJPG: identical frames decode identically
    path.parent.mkdir(parents=True)
    rng = np.random.default_rng(0)
    frame = cv2.GaussianBlur(rng.integers(0, 255, (48, 64, 3), dtype=np.uint8), (5, 5), 0)
    w = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 25, (64, 48))
    for _ in range(4):
        w.write(frame)
    w.release()
    out = tmp_path / "out"
    decode_frames(tmp_path / "v", out, frame_options=FrameOptions(backend="opencv"),
                  flow_options=FlowOptions(task="flow", flow=method),
                  run_options=RunOptions(workers=1, timeout=600.0))
    images = [cv2.imread(str(p), cv2.IMREAD_GRAYSCALE) for p in sorted(out.glob("*/*.jpg"))]
    assert len(images) == 6
    assert all(set(np.unique(im).tolist()) <= {127, 128} for im in images)


def test_flow_follows_a_moving_pattern(tmp_path):
    # write_video rolls its image 2 pixels right per frame: x flow ~ +2 px -> (22 * 6.375) = 140
    write_video(tmp_path / "v" / "c" / "m.avi", frames=4, size=(64, 96), seed=1)
    out = tmp_path / "out"
    decode_frames(tmp_path / "v", out, frame_options=FrameOptions(backend="opencv", ext="png"),
                  flow_options=FlowOptions(task="flow", flow="farneback", flow_tmpl="{}_{:05d}.png"),
                  run_options=RunOptions(workers=1, timeout=600.0))
    x = cv2.imread(str(out / "c" / "m" / "x_00001.png"), cv2.IMREAD_GRAYSCALE)[16:-16, 16:-16]
    y = cv2.imread(str(out / "c" / "m" / "y_00001.png"), cv2.IMREAD_GRAYSCALE)[16:-16, 16:-16]
    assert 133 <= np.median(x) <= 147 and 124 <= np.median(y) <= 130


@pytest.fixture(scope="module")
def both_outputs(tmp_path_factory):
    """The same two-class dataset decoded with --task both (DIS) to frames and every packed format."""
    base = tmp_path_factory.mktemp("flow")
    src = write_video_folder(base / "src", frames=9)
    outs = {}
    for to in ["frames"] + PACKED:
        outs[to] = out_path(base, to)
        decode_frames(src, outs[to], to=to, frame_options=FrameOptions(short_side=40),
                      flow_options=FlowOptions(task="both", flow="dis"),
                      run_options=RunOptions(workers=1, timeout=600.0))
    return src, outs


def test_both_writes_rgb_and_flow_with_lists_and_manifest(both_outputs):
    _, outs = both_outputs
    root = outs["frames"]
    rgb = (root / "rawframes.txt").read_text().splitlines()
    flow = (root / "rawframes_flow.txt").read_text().splitlines()
    assert rgb[0] == "class_0/clip_0_0 9 0" and flow[0] == "class_0/clip_0_0 8 0"
    assert len(rgb) == len(flow) == 4
    folder = root / "class_0" / "clip_0_0"
    names = sorted(p.name for p in folder.iterdir())
    assert names == sorted([f"img_{i:05d}.jpg" for i in range(1, 10)] + [f"{d}_{i:05d}.jpg" for d in "xy"
                                                                           for i in range(1, 9)])
    manifest = json.loads((root / "packer.json").read_text())
    v = manifest["videos"][0]
    assert (v["rgb_frames"], v["flow_frames"], v["length"]) == (9, 8, 25)
    assert manifest["extra"]["flow_tmpl"] == "{}_{:05d}.jpg"
    assert manifest["created_by"]["options"]["task"] == "both"
    for to, out in outs.items():
        assert verify_dataset(out).ok, to  # every flow image's CRC, decodes, lists match
        r = open_reader(out)
        assert r.manifest.videos[0]["flow_frames"] == 8
        rec = r.read(int(r.manifest.videos[0]["start"]) + 9)  # x_00001
        assert rec.channels == 1 and r.keys[9] == "class_0/clip_0_0.mp4/x/1"


def test_flow_clips_are_equal_in_every_format(both_outputs):
    _, outs = both_outputs
    kw = dict(clip_len=3, num_clips=2, seed=1, modality="Flow")
    ref = FrameDataset(outs["frames"], **kw)
    assert len(ref) == 4
    clip, label = ref[0]
    assert clip.dtype == torch.uint8 and clip.shape == (6, 2, 40, 53) and label == 0
    for to in PACKED:
        ds = PackedVideoDataset(outs[to], **kw)
        for i in range(len(ds)):
            a, b = ref[i], ds[i]
            assert torch.equal(a[0], b[0]) and a[1] == b[1], (to, i)
    # the flow planes are the stored x and y images, in that order
    inds = ref.clip_indices(1)
    folder = outs["frames"] / ref.videos[1].frame_dir
    x = cv2.imread(str(folder / f"x_{inds[0]:05d}.jpg"), cv2.IMREAD_GRAYSCALE)
    y = cv2.imread(str(folder / f"y_{inds[0]:05d}.jpg"), cv2.IMREAD_GRAYSCALE)
    clip, _ = ref[1]
    assert np.array_equal(clip[0, 0].numpy(), x) and np.array_equal(clip[0, 1].numpy(), y)
    # RGB reads of the same output are unchanged by the flow beside them
    rgb = PackedVideoDataset(outs["lmdb" if "lmdb" in outs else PACKED[0]], clip_len=2, seed=0, layout="CTHW")
    assert rgb[0][0].shape == (3, 2, 40, 53)


def test_flow_needs_flow_in_the_output(both_outputs, tmp_path):
    src, _ = both_outputs
    out = tmp_path / "rgb"
    decode_frames(src, out, run_options=RunOptions(workers=1, timeout=600.0))
    with pytest.raises(Exception, match="no Flow frames"):
        PackedVideoDataset(out, modality="Flow")
    with pytest.raises(Exception, match="modality"):
        PackedVideoDataset(out, modality="Depth")


def test_repeated_frames_get_zero_flow_and_a_one_frame_video_fails(tmp_path):
    src = tmp_path / "v"
    write_video(src / "c" / "a.avi", frames=4, fps=10.0)
    write_video(src / "c" / "one.avi", frames=1)
    out = tmp_path / "out"
    report = decode_frames(src, out, frame_options=FrameOptions(backend="opencv", fps=20.0),
                           flow_options=FlowOptions(task="flow", flow="dis"),
                           run_options=RunOptions(workers=1, max_failures=1, timeout=600.0))
    (fail,) = [f for f in report.failures if f.get("stage") != "partial"]
    assert fail["stage"] == "flow" and "one.avi" in fail["key"]
    v = json.loads((out / "packer.json").read_text())["videos"][0]
    n = v["flow_frames"]
    assert n == 7 and v["rgb_frames"] == 0  # 8 frames at 20 fps from 4 at 10 fps
    # every second pair is one source frame twice: no motion
    for k in range(1, n + 1, 2):
        x = cv2.imread(str(out / "c" / "a" / f"x_{k:05d}.jpg"), cv2.IMREAD_GRAYSCALE)
        assert set(np.unique(x).tolist()) == {127}, k
    assert not (out / "rawframes.txt").exists() and (out / "rawframes_flow.txt").exists()


def test_cli_task_and_list_out(tmp_path):
    src = write_video_folder(tmp_path / "src", per_class=1, frames=5)
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["decode-frames", str(src), str(out), "--task", "both", "--flow", "dis",
                                    "--bound", "15", "--list-out", str(tmp_path / "train.txt"),
                                    "--workers", "1"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert (tmp_path / "train.txt").read_text() == (out / "rawframes.txt").read_text()
    assert (tmp_path / "train_flow.txt").read_text() == (out / "rawframes_flow.txt").read_text()
    assert json.loads((out / "packer.json").read_text())["created_by"]["options"]["bound"] == 15.0
    res = CliRunner().invoke(main, ["decode-frames", "--help"])
    assert "--task [rgb|flow|both]" in res.output and "--flow-tmpl" in res.output
    res = CliRunner().invoke(main, ["decode-frames", str(src), str(tmp_path / "o2"), "--task", "flow",
                                    "--flow-tmpl", "flow_{:05d}.jpg"])
    assert res.exit_code != 0 and "direction" in res.output


def test_estimator_validates():
    with pytest.raises(Exception, match="--flow must be one of"):
        FlowEstimator("lucas")
    est = FlowEstimator("dis")
    with pytest.raises(ValueError, match="grey"):
        est(np.zeros((4, 4, 3), np.uint8), np.zeros((4, 4, 3), np.uint8))


def test_flow_does_not_depend_on_how_videos_are_spread_over_jobs(both_outputs, tmp_path):
    """Each video gets a fresh flow estimator: DIS keeps state between calls, so a reused one
    made a video's first flow frame depend on the video decoded before it in that worker."""
    import pickle

    from packer.commands.merge import merge_parts
    from tests.support.outputs import packed_snapshot

    src, outs = both_outputs
    parts = []
    for i in range(2):
        parts.append(tmp_path / f"part{i}")
        decode_frames(src, parts[-1], frame_options=FrameOptions(short_side=40),
                      flow_options=FlowOptions(task="both", flow="dis"),
                      input_options=InputOptions(num_shards=2, shard_index=i),
                      run_options=RunOptions(workers=1, timeout=600.0))
    merge_parts(parts, tmp_path / "merged")
    a, b = packed_snapshot(tmp_path / "merged"), packed_snapshot(outs["frames"])
    assert a["records"] == b["records"] and a["keys"] == b["keys"] and a["videos"] == b["videos"]
    est = FlowEstimator("dis")
    est(np.zeros((16, 16), np.uint8), np.zeros((16, 16), np.uint8))
    assert pickle.loads(pickle.dumps(est)).method == "dis"


@pytest.mark.slow
@pytest.mark.parametrize("to", ["frames", "lmdb"])
def test_a_killed_flow_run_resumes_to_the_same_output(both_outputs, tmp_path, to):
    """SIGKILL before the second journal append (data of the first commits on disk), then
    --resume: the same output as one uninterrupted run, flow images included."""
    from tests.support.outputs import packed_snapshot
    from tests.support.killing import run_packer

    src, outs = both_outputs
    out = out_path(tmp_path, to)
    args = ["decode-frames", src, out, "--to", to, "--short-side", 40, "--task", "both", "--flow", "dis",
            "--workers", 0, "--commit-every", 20]
    killed = run_packer(*args, kill_at="journal:2", timeout=60)
    assert killed.returncode == -9, killed.stderr
    done = run_packer(*args, "--resume", timeout=60)
    assert done.returncode == 0, done.stderr
    a, b = packed_snapshot(out), packed_snapshot(outs[to])
    assert {k: a[k] == b[k] for k in a if k != "extra"} == {k: True for k in a if k != "extra"}

"""``packer pack-videos`` on the command line: exit codes, failure records, flags reaching the encoder."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

pytest.importorskip("av")

from packer.cli import main  # noqa: E402
from packer.data.video import PackedVideoDataset  # noqa: E402
from packer.formats import open_reader  # noqa: E402

VIDEOS = Path(__file__).resolve().parents[1] / "fixtures" / "videos"


@pytest.fixture
def src(tmp_path) -> Path:
    """Two classes: a short H.264 clip and AV1 (which no source decoder here reads)."""
    for cls, name in (("a", "mmaction2_part_0.mp4"), ("b", "torchcodec_av1_video.mkv")):
        (tmp_path / "src" / cls).mkdir(parents=True)
        shutil.copy(VIDEOS / name, tmp_path / "src" / cls / name)
    return tmp_path / "src"


def test_a_failed_video_is_recorded_and_sets_the_exit_status(src, tmp_path):
    out = tmp_path / "v.lmdb"
    r = CliRunner().invoke(main, ["pack-videos", str(src), str(out), "--to", "lmdb", "--workers", "1"])
    assert r.exit_code == 1, r.output
    failures = [json.loads(line) for line in (out / "failures.jsonl").read_text().splitlines()]
    assert [Path(f["source"]).name for f in failures] == ["torchcodec_av1_video.mkv"]
    (v,) = open_reader(out).manifest.videos
    assert v["video_frames"] == 32 and v["gop"] == 8


def test_flags_reach_the_encoder_and_the_dataset_reads_it(src, tmp_path):
    out = tmp_path / "v.rec"
    r = CliRunner().invoke(main, ["pack-videos", str(src), str(out), "--gop", "4", "--short-side", "128",
                                  "--max-frames", "20", "--max-failures", "1", "--workers", "0"])
    assert r.exit_code == 0, r.output
    assert "1 of 2 videos re-encoded" in r.output
    (v,) = open_reader(out).manifest.videos
    assert (v["video_frames"], v["keyframes"], v["height"], v["gop"]) == (20, 5, 128, 4)
    assert v["width"] % 2 == 0
    clip, label = PackedVideoDataset(out, clip_len=8, frame_interval=2, test_mode=True)[0]
    assert tuple(clip.shape) == (8, 3, 128, v["width"]) and label == 0


def test_bad_options_are_usage_errors(src, tmp_path):
    for flags in (["--gop", "0"], ["--crf", "60"], ["--to", "frames"], ["--preset", "warp"],
                  ["--codec", "av1", "--preset", "veryfast"], ["--codec", "av1", "--crf", "64"],
                  ["--copy", "--stride", "2"], ["--copy", "--to", "files"]):
        r = CliRunner().invoke(main, ["pack-videos", str(src), str(tmp_path / "x.rec"), *flags])
        assert r.exit_code == 1 and r.output.startswith("Error: "), (flags, r.output)  # as decode-frames
        assert not (tmp_path / "x.rec").exists()


def test_to_files_writes_mp4_files_and_the_video_list(src, tmp_path):
    out = tmp_path / "videos"
    r = CliRunner().invoke(main, ["pack-videos", str(src), str(out), "--to", "files", "--short-side", "64",
                                  "--max-frames", "12", "--max-failures", "1", "--workers", "0"])
    assert r.exit_code == 0, r.output
    assert (out / "videos.txt").read_text() == "a/mmaction2_part_0.mp4 0\n"
    assert (out / "a" / "mmaction2_part_0.mp4").read_bytes()[4:8] == b"ftyp"
    clip, _ = PackedVideoDataset(out, clip_len=4, test_mode=True)[0]
    assert tuple(clip.shape)[:2] == (4, 3)

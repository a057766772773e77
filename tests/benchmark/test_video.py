"""``packer bench`` on a video pack: video or frames for the user's sampling, on a small real pack.

The report's fields and the advice logic are checked, not the timings (a shared machine's)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

pytest.importorskip("av")

import packer  # noqa: E402
from packer.cli import main  # noqa: E402
from packer.benchmark.fresh import USAGE_FIELDS  # noqa: E402
from packer.benchmark.video import (DEFAULT_SAMPLINGS, ROW_FIELDS, VIDEO_JSON_FIELDS,  # noqa: E402
                                         advise, is_video_pack, samplings)
from packer.errors import UsageError  # noqa: E402

VIDEOS = Path(__file__).resolve().parents[1] / "fixtures" / "videos"
FRAMES = 40  # per video: the bench's frame pack is made from these


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("benchvideo") / "src"
    for cls, name in (("a", "mmaction2_test.mp4"), ("b", "decord_flipping_a_pancake.mkv")):
        (root / cls).mkdir(parents=True)
        shutil.copy(VIDEOS / name, root / cls / name)
    return root


@pytest.fixture(scope="module")
def pack(src, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("benchvideo") / "videos.rec"
    report = packer.pack_videos(src, out, to="records", max_frames=FRAMES, gop=8, workers=0)
    assert report.videos == 2 and not report.failures
    return out


def check_rows(r: dict, names: list[str]) -> None:
    assert set(r) == set(VIDEO_JSON_FIELDS)
    assert r["videos"] == 2 and r["frames"] == 2 * FRAMES == r["frame_pack"]["frames"]
    b = r["bytes"]
    assert 0 < b["video"] < b["frames"] and b["ratio"] == pytest.approx(b["video"] / b["frames"])
    assert b["video_per_video"] == pytest.approx(b["video"] / 2)
    assert [row["name"] for row in r["rows"]] == names
    for row in r["rows"]:
        assert set(row) == set(ROW_FIELDS)
        for which in ("video", "frames"):  # each timed in its own fresh process
            m = row[which]
            assert m["clips_per_s"] > 0 and m["cpu_ms_per_clip"] > 0
            assert set(m["process"]) == set(USAGE_FIELDS) and m["process"]["user_s"] + m["process"]["sys_s"] > 0
        assert row["speed"] == pytest.approx(row["video"]["clips_per_s"] / row["frames"]["clips_per_s"])
        assert row["cpu"] == pytest.approx(row["video"]["cpu_ms_per_clip"] / row["frames"]["cpu_ms_per_clip"])
        assert row["speed_cpu"] == pytest.approx(1 / row["cpu"])
        assert (row["use"], row["reason"]) == advise(row["speed_cpu"], b["ratio"])  # per CPU-second, not wall
    uses = {row["use"] for row in r["rows"]}
    assert r["use"] == (uses.pop() if len(uses) == 1 else "mixed")
    assert r["verdict"].startswith(r["use"])


def test_library_call_makes_the_frame_pack_and_times_tsn_and_dense(pack):
    r = packer.bench(pack, clips=3)
    check_rows(r, ["tsn", "dense"])
    assert r["frame_pack"]["made"] and r["frame_pack"]["path"] is None and r["frame_pack"]["format"] == "records"
    assert [row["sampling"] for row in r["rows"]] == list(DEFAULT_SAMPLINGS.values())


def test_cli_with_the_users_sampling_and_frame_pack(pack, src, tmp_path):
    frames = tmp_path / "frames.lmdb"
    pytest.importorskip("lmdb")
    packer.decode_frames(src, frames, to="lmdb", max_frames=FRAMES, short_side=256, workers=0)
    res = CliRunner().invoke(main, ["bench", str(pack), "--json", "--clips", "3", "--frames", str(frames),
                                    "--clip-len", "4", "--frame-interval", "3", "--test-mode"])
    assert res.exit_code == 0, res.output
    r = json.loads(res.output[res.output.index("{"):])
    check_rows(r, ["custom"])
    assert r["rows"][0]["sampling"] == {"clip_len": 4, "frame_interval": 3, "num_clips": 1, "test_mode": True}
    assert r["frame_pack"] == {"path": str(frames), "made": False, "format": "lmdb", "frames": 2 * FRAMES}
    text = CliRunner().invoke(main, ["bench", str(pack), "--clips", "2", "--frames", str(frames),
                                     "--clip-len", "2", "--train-mode"])
    assert text.exit_code == 0, text.output
    assert "bytes per video" in text.output and "verdict: " in text.output and "custom" in text.output


def test_a_frame_pack_of_other_videos_is_refused(pack, src, tmp_path):
    one = tmp_path / "one"
    (one / "a").mkdir(parents=True)
    shutil.copy(next((src / "a").iterdir()), one / "a")
    frames = tmp_path / "one.rec"
    packer.decode_frames(one, frames, to="records", max_frames=8, workers=0)
    with pytest.raises(UsageError, match="not the same videos"):
        packer.bench(pack, frames=frames, clips=1)
    with pytest.raises(UsageError, match="not a frame pack"):
        packer.bench(pack, frames=pack, clips=1)
    with pytest.raises(UsageError, match="--frames is for a pack-videos output"):
        packer.bench(frames, frames=frames)
    assert is_video_pack(pack) and not is_video_pack(frames) and not is_video_pack(src)


def test_samplings_default_to_tsn_and_dense_else_the_users():
    assert samplings() == DEFAULT_SAMPLINGS
    assert samplings(num_clips=3) == {"custom": {"clip_len": 1, "frame_interval": 1, "num_clips": 3,
                                                 "test_mode": False}}
    with pytest.raises(UsageError):
        samplings(clip_len=0)


@pytest.mark.parametrize("speed, ratio, use, says", [
    (1.3, 0.12, "video", "and the video pack is 8.3x smaller"),  # as fast and smaller
    (0.8, 0.5, "video", ">= 0.8"),  # the threshold itself
    (0.5, 0.2, "video", "read frames only if loading is your bottleneck"),  # slower, much smaller
    (0.5, 0.4, "frames", "only 2.5x smaller"),  # slower and not much smaller
    (0.3, 0.1, "frames", "< 0.4"),  # far slower
])
def test_advice(speed, ratio, use, says):
    got, reason = advise(speed, ratio)
    assert got == use and says in reason

"""``packer decode-frames`` end to end: real videos, real decoders, frame folders and packed shards."""
from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from packer.cli import main
from packer.errors import UsageError
from packer.formats import FORMATS, open_reader
from packer.codecs.image import decode
from packer.commands.inspection import inspect_dataset, verify_dataset
from packer.conversion.diskspace import Estimate, check_space
from packer.conversion.options import RunOptions
from tests.support import FIXTURE_VIDEOS, REPO
from tests.support.inputs import write_video, write_video_folder
from tests.support.killing import checkpoint_at_least, run_and_kill
from scripts.timing import scaled

PACKED = sorted(FORMATS)
ALL_OUTPUTS = ["frames"] + PACKED


def cli(*args: str):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def out_path(tmp_path: Path, to: str, name: str = "out") -> Path:
    single = to in FORMATS and FORMATS[to][0].single_file
    return tmp_path / (f"{name}.h5" if single else name)


def read_lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def mmaction2_rawframe_infos(ann_file: Path, data_prefix: Path) -> list[dict]:
    """mmaction2's RawframeDataset.load_data_list, restated: split on whitespace."""
    infos = []
    with open(ann_file) as fin:
        for line in fin:
            line_split = line.strip().split()
            infos.append({"frame_dir": os.path.join(data_prefix, line_split[0]),
                          "total_frames": int(line_split[1]), "label": int(line_split[2])})
            assert len(line_split) == 3
    return infos


# -- the real fixtures ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def fixture_src(tmp_path_factory):
    src = tmp_path_factory.mktemp("fx") / "src"
    for p in sorted(FIXTURE_VIDEOS.iterdir()):
        cls = "mmaction2" if p.name.startswith("mmaction2") else "other"
        (src / cls).mkdir(parents=True, exist_ok=True)
        shutil.copy(p, src / cls / p.name)
    return src


@pytest.fixture(scope="module")
def fixture_out(fixture_src, tmp_path_factory):
    out = tmp_path_factory.mktemp("fxo") / "frames"
    r = cli("decode-frames", fixture_src, out, "--workers", 2, "--max-failures", 1)
    assert r.exit_code == 0, r.output
    return out, r.output


DOCUMENTED = {  # fixtures README: frames, rows x cols (upright)
    "mmaction2/mmaction2_test": (300, 256, 340),
    "mmaction2/mmaction2_part_0": (32, 256, 340),
    "mmaction2/mmaction2_test_avi": None,  # set below: same stem as the .mp4
    "other/decord_flipping_a_pancake": (310, 240, 426),
    "other/decord_video_90": (3, 568, 320),
    "other/decord_unordered": (4, 50, 50),
    "other/torchcodec_h265_video": (10, 128, 128),
    "other/decord_corrupted": (28, 720, 1280),
}


def test_every_fixture_video(fixture_out):
    out, output = fixture_out
    infos = {Path(i["frame_dir"]).relative_to(out).as_posix(): i
             for i in mmaction2_rawframe_infos(out / "rawframes.txt", out)}
    expected = dict(DOCUMENTED)
    # mmaction2_test.mp4 and mmaction2_test.avi share a stem: both use {stem}_{ext}
    del expected["mmaction2/mmaction2_test"], expected["mmaction2/mmaction2_test_avi"]
    expected["mmaction2/mmaction2_test_mp4"] = (300, 256, 340)
    expected["mmaction2/mmaction2_test_avi"] = (164, 240, 320)
    assert set(infos) == set(expected)
    for frame_dir, (frames, rows, cols) in expected.items():
        info = infos[frame_dir]
        files = sorted(os.listdir(info["frame_dir"]))
        assert info["total_frames"] == frames == len(files), frame_dir
        assert files == [f"img_{i:05d}.jpg" for i in range(1, frames + 1)]  # no holes
        first = decode((Path(info["frame_dir"]) / files[0]).read_bytes())
        assert first.shape == (rows, cols, 3), frame_dir  # the rotated mov comes out 568 x 320
    manifest = json.loads((out / "packer.json").read_text())
    entries = {v["frame_dir"]: v for v in manifest["videos"]}
    rotated = entries["other/decord_video_90"]
    assert rotated["rotation"] == 90 and (rotated["height"], rotated["width"]) == (568, 320)
    corrupted = entries["other/decord_corrupted"]
    assert (corrupted["decoded_frames"], corrupted["container_frames"], corrupted["length"]) == (28, 50, 28)
    for v in manifest["videos"]:
        assert {"fps", "height", "width", "backend", "decoded_frames", "container_frames"} <= set(v)
    failures = {f["key"]: f for f in map(json.loads, read_lines(out / "failures.jsonl"))}
    assert set(failures) == {"other/torchcodec_av1_video.mkv", "other/decord_corrupted.mp4"}
    assert failures["other/torchcodec_av1_video.mkv"]["stage"] == "decode"
    part = failures["other/decord_corrupted.mp4"]
    assert part["stage"] == "partial" and (part["decoded_frames"], part["container_frames"]) == (28, 50)
    assert manifest["failures"] == 1  # the partial decode does not count
    assert "videos ->" in output and "frames/s" in output and "on disk" in output
    assert verify_dataset(out).ok
    info = inspect_dataset(out)
    assert info["format"] == "frames" and info["videos"] == 8 and info["count"] == sum(
        v[0] for v in expected.values())


def test_failures_decide_exit_status_not_the_output(fixture_src, tmp_path):
    r = cli("decode-frames", fixture_src, tmp_path / "a", "--workers", 1, "--max-frames", 2)
    assert r.exit_code == 1 and "1 inputs failed" in r.output  # the AV1 file; the job finished
    assert (tmp_path / "a" / "packer.json").exists()
    r = cli("decode-frames", fixture_src, tmp_path / "b", "--workers", 1, "--max-frames", 40,
            "--strict", "--max-failures", 1)
    assert r.exit_code == 1 and "2 inputs failed" in r.output  # --strict counts the partial decode
    lines = read_lines(tmp_path / "b" / "failures.jsonl")
    assert sorted(json.loads(x)["stage"] for x in lines) == ["decode", "partial"]


# -- generated videos -------------------------------------------------------------------------
def test_mmaction2_list_file_layout(video_folder, tmp_path):
    out = tmp_path / "out"
    r = cli("decode-frames", video_folder, out, "--workers", 0)
    assert r.exit_code == 0, r.output
    assert read_lines(out / "rawframes.txt") == [
        "class_0/clip_0_0 24 0", "class_0/clip_0_1 25 0", "class_1/clip_1_0 24 1", "class_1/clip_1_1 25 1"]
    for info in mmaction2_rawframe_infos(out / "rawframes.txt", out):
        names = sorted(os.listdir(info["frame_dir"]))
        assert names == ["img_{:05}.jpg".format(i) for i in range(1, info["total_frames"] + 1)]
    assert sorted(p.name for p in out.iterdir()) == ["checksums.bin", "class_0", "class_1", "failures.jsonl",
                                                     "packer.json", "rawframes.txt", "sources.bin"]
    assert (out / "failures.jsonl").read_text() == ""


@pytest.mark.parametrize("to", PACKED)
def test_packed_output_holds_the_same_frames(video_folder, tmp_path, to):
    frames = tmp_path / "frames"
    packed = out_path(tmp_path, to)
    assert cli("decode-frames", video_folder, frames, "--workers", 0, "--short-side", 32).exit_code == 0
    r = cli("decode-frames", video_folder, packed, "--to", to, "--workers", 2, "--short-side", 32)
    assert r.exit_code == 0, r.output
    fr, pr = open_reader(frames), open_reader(packed)
    assert pr.keys == fr.keys and pr.keys[:2] == ["class_0/clip_0_0.mp4/1", "class_0/clip_0_0.mp4/2"]
    assert all(pr.read(i).data == fr.read(i).data for i in range(len(fr)))
    strip = lambda vs: [{k: v[k] for k in ("key", "label", "start", "length", "fps", "height", "width")}  # noqa: E731
                        for v in vs]
    assert strip(pr.manifest.videos) == strip(fr.manifest.videos)
    assert pr.manifest.kind == "videos" and verify_dataset(packed).ok


def test_records_frames_carry_video_and_frame_index(tmp_path):
    """Each frame's ``video/index`` is its video's position in the manifest's videos (a failed
    video takes none), also across ``--num-shards`` parts merged into one output."""
    src = write_video_folder(tmp_path / "src", per_class=2, classes=2, frames=4)
    (src / "class_0" / "clip_0_05_broken.mp4").write_text("not a video")  # sorts between two good ones

    def expected(out: Path) -> list[tuple[int, int]]:
        videos = open_reader(out).manifest.videos
        return [(v, f) for v, video in enumerate(videos) for f in range(video["length"])]

    def stored(out: Path) -> list[tuple[int, int]]:
        r = open_reader(out)
        return [(r.sample(i).extra["video_index"], r.sample(i).extra["frame_index"]) for i in range(len(r))]

    whole = tmp_path / "whole"
    assert cli("decode-frames", src, whole, "--to", "records", "--workers", 0, "--max-failures", 1).exit_code == 0
    assert len(open_reader(whole).manifest.videos) == 4 and stored(whole) == expected(whole)
    assert {v for v, _ in stored(whole)} == {0, 1, 2, 3}
    parts = [tmp_path / f"part{k}" for k in range(2)]
    for k, part in enumerate(parts):
        assert cli("decode-frames", src, part, "--to", "records", "--workers", 0, "--max-failures", 1,
                   "--num-shards", 2, "--shard-index", k).exit_code == 0
    assert stored(parts[1])[0] == (0, 0)  # numbered within its part ...
    assert cli("merge", *parts, tmp_path / "merged").exit_code == 0
    assert stored(tmp_path / "merged") == stored(whole)  # ... and renumbered by the merge


def test_same_stem_videos_never_overwrite_each_other(tmp_path):
    src = tmp_path / "src"
    write_video(src / "c" / "a.mp4", frames=12)
    write_video(src / "c" / "a.avi", frames=9)
    r = cli("decode-frames", src, tmp_path / "out", "--workers", 0)
    assert r.exit_code == 0, r.output
    assert read_lines(tmp_path / "out" / "rawframes.txt") == ["c/a_avi 9 0", "c/a_mp4 12 0"]
    assert len(os.listdir(tmp_path / "out" / "c" / "a_avi")) == 9


def test_frame_options(video_folder, tmp_path):
    out = tmp_path / "out"
    lst = tmp_path / "lists" / "train.txt"
    lst.parent.mkdir()
    r = cli("decode-frames", video_folder, out, "--workers", 0, "--size", "32x0", "--stride", 2,
            "--max-frames", 10, "--ext", "png", "--tmpl", "f{:03d}.png", "--start-index", 0,
            "--list-out", lst)
    assert r.exit_code == 0, r.output
    assert read_lines(lst) == read_lines(out / "rawframes.txt")
    assert read_lines(lst)[0] == "class_0/clip_0_0 10 0"
    assert sorted(os.listdir(out / "class_0" / "clip_0_0")) == [f"f{i:03d}.png" for i in range(10)]
    img = decode((out / "class_0" / "clip_0_0" / "f000.png").read_bytes())
    assert img.shape == (24, 32, 3)
    m = open_reader(out).manifest
    assert m.videos[0]["fps"] == 12.5 and m.extra["start_index"] == 0
    r = cli("decode-frames", video_folder, tmp_path / "o2", "--workers", 0, "--fps", 5)
    assert r.exit_code == 0
    assert read_lines(tmp_path / "o2" / "rawframes.txt")[0] == "class_0/clip_0_0 5 0"  # 24 frames at 25 fps


def test_bad_arguments_are_refused_before_work(video_folder, tmp_path):
    for args in (["--fps", 5, "--stride", 2], ["--ext", "png", "--tmpl", "i{:03d}.jpg"], ["--tmpl", "img.jpg"],
                 ["--to", "nope"], ["--to", PACKED[0], "--list-out", tmp_path / "l.txt"],
                 ["--size", "12"], ["--quality", 0]):
        r = cli("decode-frames", video_folder, tmp_path / "x", *args)
        assert r.exit_code == 2 or (r.exit_code == 1 and "Error" in r.output), (args, r.output)
        assert not (tmp_path / "x").exists() and not (tmp_path / "x.partial").exists()
    r = cli("decode-frames", video_folder, tmp_path / "y", "--workers", 0)
    assert r.exit_code == 0
    r = cli("decode-frames", video_folder, tmp_path / "y", "--workers", 0)
    assert r.exit_code == 1 and "already exists" in r.output


def test_resume_on_finished_output_does_nothing(video_folder, tmp_path):
    out = tmp_path / "out"
    assert cli("decode-frames", video_folder, out, "--workers", 0).exit_code == 0
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*")}
    r = cli("decode-frames", video_folder, out, "--workers", 0, "--resume")
    assert r.exit_code == 0 and "complete and verified" in r.output
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*")} == before


def test_kinetics_csv_with_a_missing_download(tmp_path):
    src = tmp_path / "kinetics"
    write_video(src / "abc_000010_000020.mp4", frames=10)
    write_video(src / "plain.mp4", frames=8)
    (tmp_path / "train.csv").write_text("label,youtube_id,time_start,time_end,split\n"
                                        "air drumming,abc,10,20,train\nabseiling,plain,0,10,train\n"
                                        "abseiling,gone,0,10,train\n")
    r = cli("decode-frames", src, tmp_path / "out", "--csv", tmp_path / "train.csv", "--workers", 1,
            "--max-failures", 1)
    assert r.exit_code == 0, r.output
    assert read_lines(tmp_path / "out" / "rawframes.txt") == ["abseiling/plain 8 0",
                                                              "air_drumming/abc_000010_000020 10 1"]
    (failure,) = map(json.loads, read_lines(tmp_path / "out" / "failures.jsonl"))
    assert failure["key"] == "gone_000000_000010.mp4" and failure["stage"] == "read"
    assert open_reader(tmp_path / "out").classes == ["abseiling", "air drumming"]


def test_a_fifo_video_never_reaches_a_decoder(tmp_path):
    """Opening a FIFO blocked the decoder for real (this test once used one as its hanging
    video, costing the timeout); only regular files are inputs now (issue 31): the listing
    records it, no worker opens it. (Real hangs and their timeouts: tests/test_executors.py.)"""
    src = write_video_folder(tmp_path / "src", per_class=1, classes=1, frames=6)
    os.mkfifo(src / "class_0" / "hang.mp4")
    r = cli("decode-frames", src, tmp_path / "out", "--workers", 1, "--timeout", 2, "--max-failures", 1)
    assert r.exit_code == 0, r.output
    (failure,) = map(json.loads, read_lines(tmp_path / "out" / "failures.jsonl"))
    assert failure["key"] == "class_0/hang.mp4" and failure["stage"] == "input"
    assert "named pipe" in failure["reason"]
    assert read_lines(tmp_path / "out" / "rawframes.txt") == ["class_0/clip_0_0 6 0"]


def test_space_estimate_refuses_with_numbers(video_folder, tmp_path):
    r = cli("decode-frames", video_folder, tmp_path / "out", "--size", "65500x65500", "--no-keep-aspect", "--fps", "300")
    assert r.exit_code == 1
    assert "needs about" in r.output and "TB" in r.output and "free" in r.output and "--force" in r.output
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()
    huge = Estimate(bytes=10 ** 18, files=10, frames=10, sampled=1, videos=1)
    with pytest.raises(UsageError, match="needs about"):
        check_space(tmp_path / "x", huge)
    check_space(tmp_path / "x", huge, force=True)  # --force: a warning, then on
    check_space(tmp_path / "x", Estimate(bytes=1000, files=10, frames=10, sampled=1, videos=1))


@pytest.mark.parametrize("ext", ["jpg", "png"])
def test_space_bound_from_headers_is_above_what_is_written(tmp_path, ext):
    """Where it fits, the space check is an upper bound from the containers' headers (nothing
    decoded). Every frame file the run then writes stays under the bound's bytes per file,
    noise (JPEG's and PNG's worst case) at q100 included."""
    import cv2

    from packer.commands.decode_frames import FrameOptions, decode_frames
    from packer.conversion.video_inputs import video_items

    src = tmp_path / "src"
    write_video(src / "a" / "smooth.mp4", frames=12, size=(48, 64))
    (src / "b").mkdir()
    vw = cv2.VideoWriter(str(src / "b" / "noise.avi"), cv2.VideoWriter_fourcc(*"MJPG"), 25, (56, 40))
    for frame in np.random.default_rng(0).integers(0, 256, (12, 40, 56, 3), dtype=np.uint8):
        vw.write(frame)
    vw.release()
    report = decode_frames(src, tmp_path / "out", frame_options=FrameOptions(ext=ext, quality=100),
                           run_options=RunOptions(workers=1, timeout=600.0))
    assert report.failed == 0 and report.count == 24
    assert report.estimate.startswith("at most") and "bounded from the headers of 2 of 2 videos" in report.estimate
    job = FrameOptions(ext=ext, quality=100).job()
    for item in video_items(src)[0]:
        files, per_file = job.bound(item)
        sizes = [p.stat().st_size for p in (tmp_path / "out" / item.frame_dir).iterdir()]
        assert len(sizes) == files == 12 and max(sizes) <= per_file


# -- kill and resume --------------------------------------------------------------------------
def tree(root: Path) -> dict[str, bytes]:
    """Every file below ``root`` by relative path (the manifest without created_by)."""
    files = {}
    for p in sorted(root.rglob("*")):
        if p.is_file():
            data = p.read_bytes()
            if p.name == "packer.json":
                m = json.loads(data)
                m.pop("created_by")
                data = json.dumps(m, sort_keys=True).encode()
            files[p.relative_to(root).as_posix()] = data
    return files


@pytest.mark.slow
@pytest.mark.parametrize("to", ALL_OUTPUTS)
def test_killed_run_resumes_to_the_same_output(tmp_path, to):
    src = write_video_folder(tmp_path / "src", per_class=8, classes=2, frames=40, size=(72, 96))
    (src / "class_1" / "broken.mp4").write_text("not a video")
    shutil.copy(FIXTURE_VIDEOS / "decord_corrupted.mp4", src / "class_0" / "corrupted.mp4")
    killed, whole = out_path(tmp_path, to, "killed"), out_path(tmp_path, to, "whole")
    code = ("import sys; from packer.commands.decode_frames import decode_frames; "
            "from packer.conversion.options import RunOptions; "
            f"decode_frames({str(src)!r}, {str(killed)!r}, to={to!r}, "
            "run_options=RunOptions(workers=1, commit_every=20, max_failures=9, timeout=600.0))")
    writer_cls = FORMATS[to][0] if to in FORMATS else None
    journal = killed.with_name(killed.name + ".partial")
    if writer_cls is not None and writer_cls.single_file:
        journal = journal.with_name(journal.name + ".journal")
    # the converter and its decoding worker, mid-run
    assert run_and_kill([sys.executable, "-c", code], checkpoint_at_least(journal / ".resume.json", 3, "items_done"),
                        timeout=scaled(120)), "the run finished before it could be killed"
    assert not killed.exists()
    r = cli("decode-frames", src, killed, "--to", to, "--workers", 2, "--resume", "--max-failures", 9,
            "--commit-every", 20)
    assert r.exit_code == 0, r.output
    assert cli("decode-frames", src, whole, "--to", to, "--workers", 0, "--max-failures", 9,
               "--commit-every", 20).exit_code == 0
    if to == "frames":
        assert tree(killed) == tree(whole)
        assert not list(killed.rglob(".*"))  # no temporary folders or journals left behind
    else:
        a, b = open_reader(killed), open_reader(whole)
        assert a.keys == b.keys and all(a.read(i).data == b.read(i).data for i in range(len(a)))
        assert a.manifest.videos == b.manifest.videos
        fa, fb = FORMATS[to][0].failures_path(killed), FORMATS[to][0].failures_path(whole)
        assert fa.read_bytes() == fb.read_bytes()


def test_frames_reader_and_verify_catch_damage(video_folder, tmp_path):
    out = tmp_path / "out"
    assert cli("decode-frames", video_folder, out, "--workers", 0).exit_code == 0
    r = open_reader(out)
    assert r.keys[0] == "class_0/clip_0_0.mp4/1" and r.read(0).fmt == "jpeg"
    victim = out / "class_1" / "clip_1_0" / "img_00003.jpg"
    victim.write_bytes(victim.read_bytes()[:-10] + b"\0" * 10)
    (out / "class_0" / "clip_0_1" / "img_00025.jpg").unlink()
    result = verify_dataset(out)
    assert not result.ok
    text = "\n".join(result.problems)
    assert "CRC32C mismatch" in text and "img_00003.jpg" in text
    assert "holds 24 files, the list says 25" in text
    assert cli("verify", out).exit_code == 1
    np.testing.assert_array_equal(decode(r.read(1).data).shape, (48, 64, 3))

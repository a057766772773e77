"""Hostile inputs: every conversion command meets ``..``, absolute paths and newlines in list
files and names, symlink loops, a decompression bomb, a 0-frame video, an audio-only file, a
video whose container over-reports its frames and non-UTF-8 file names. Each gets a recorded
failure (the rest of the job completes; a name or list line that cannot be a key is recorded
with stage ``input`` and never opened), and nothing is ever written outside OUT."""
from __future__ import annotations

import json
import os
import shutil
import struct
import wave
from pathlib import Path

import pytest
from click.testing import CliRunner

from packer.cli import main
from packer.formats import open_reader
from tests.support.faults import CONVERSIONS, Conversion
from tests.support.inputs import bomb_png, write_image_folder, write_video, write_video_folder

IMAGE_CONVS = [c for c in CONVERSIONS if c.source == "images"]
VIDEO_CONVS = [c for c in CONVERSIONS if c.source == "videos"]
TRIED: list[str] = []


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def run_watching(root: Path, out: Path, conv: Conversion, *args):
    """Run ``packer ARGS``; also return every path it created outside OUT (there must be none)."""
    before = set(root.rglob("*"))
    r = cli(*args)
    keep = {out, conv.writer.failures_path(out)}
    new = {str(p) for p in set(root.rglob("*")) - before if not any(p == k or k in p.parents for k in keep)}
    return r, new


# -- recorded failures: the job completes and lists each ------------------------------------
@pytest.fixture(scope="module")
def hostile_images(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile-img")
    src = write_image_folder(root / "src", count=9, classes=3, size=(32, 40))
    bomb_png(src / "class_0" / "bomb.png")
    os.symlink("self.jpg", src / "class_1" / "self.jpg")  # a symlink loop: ELOOP on open
    os.symlink("missing.jpg", src / "class_1" / "dangling.jpg")
    os.symlink("..", src / "class_2" / "loop")  # a folder loop: never entered
    os.symlink(src, src / "class_2" / "loop2")
    expected = {"class_0/bomb.png": "decompression bomb", "class_1/self.jpg": "",
                "class_1/dangling.jpg": ""}
    return src, expected


@pytest.mark.parametrize("conv", IMAGE_CONVS, ids=lambda c: c.id)
def test_image_inputs_that_are_recorded(conv, hostile_images, tmp_path):
    src, expected = hostile_images
    out = conv.out(tmp_path)
    r, outside = run_watching(tmp_path, out, conv, *conv.argv(src, out, "--workers", 0))
    assert r.exit_code == 0, r.output
    assert outside == set()
    failures = {f["key"]: f["reason"] for f in map(json.loads, conv.writer.failures_path(out).open())}
    assert set(failures) == set(expected)
    for key, words in expected.items():
        assert words in failures[key]
    reader = open_reader(out)
    assert len(reader) == 9 and not any("loop" in k for k in reader.keys)
    TRIED.extend(expected)


@pytest.fixture(scope="module")
def hostile_videos(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile-vid")
    src = write_video_folder(root / "src", per_class=1, classes=2, frames=8, size=(32, 40))
    write_video(src / "class_0" / "empty.mp4", frames=0, size=(32, 40))
    with wave.open(str(src / "class_0" / "audio_only.mkv"), "wb") as w:  # an audio stream only
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(8000)
        w.writeframes(struct.pack("<800h", *range(800)))
    over = write_video(src / "class_1" / "overcount.avi", frames=30, size=(32, 40))
    data = over.read_bytes()  # the AVI header still says 30 frames
    over.write_bytes(data[: len(data) * 6 // 10])
    os.symlink("self.mp4", src / "class_1" / "self.mp4")
    return src


@pytest.mark.parametrize("conv", VIDEO_CONVS, ids=lambda c: c.id)
def test_video_inputs_that_are_recorded(conv, hostile_videos, tmp_path):
    out = conv.out(tmp_path)
    r, outside = run_watching(tmp_path, out, conv, *conv.argv(hostile_videos, out, "--workers", 1, "--timeout", 60))
    assert r.exit_code == 0, r.output
    assert outside == set()
    failures = {f["key"]: f for f in map(json.loads, conv.writer.failures_path(out).open())}
    assert {k for k, f in failures.items() if f["stage"] != "partial"} >= {
        "class_0/empty.mp4", "class_0/audio_only.mkv", "class_1/self.mp4"}
    reader = open_reader(out)
    videos = {v["key"]: v for v in reader.manifest.videos}
    assert {"class_0/clip_0_0.mp4", "class_1/clip_1_0.mp4"} <= set(videos)  # the rest completed
    if "class_1/overcount.avi" in videos:  # kept in part: decoded < claimed, recorded as partial
        v = videos["class_1/overcount.avi"]
        assert v["decoded_frames"] < v["container_frames"] == 30
        assert failures["class_1/overcount.avi"]["stage"] == "partial"
    else:
        assert "class_1/overcount.avi" in failures
    assert all(int(v["length"]) > 0 for v in videos.values())
    assert not list(reader.verify())
    TRIED.extend(["empty.mp4", "audio_only.mkv", "overcount.avi", "self.mp4"])


# -- names and list lines that cannot be keys: recorded (stage input), never read ---------------
def _name_with_newline(src: Path) -> str:
    p = src / "class_0" / "new\nline.jpg"
    p.write_bytes((src / "class_0" / "img_0000.jpg").read_bytes())
    return "new\\nline.jpg"


def _class_with_newline(src: Path) -> str:
    (src / "bad\nclass").mkdir()
    (src / "bad\nclass" / "a.jpg").write_bytes((src / "class_0" / "img_0000.jpg").read_bytes())
    return "bad\\nclass"


def _non_utf8_name(src: Path) -> str:
    name = os.fsencode(src / "class_0") + b"/caf\xe9.jpg"  # Latin-1 bytes, not UTF-8
    with open(name, "wb") as f:
        f.write((src / "class_0" / "img_0000.jpg").read_bytes())
    return "caf"


TREE_HAZARDS = {"newline-in-file-name": _name_with_newline, "newline-in-class-name": _class_with_newline,
                "non-utf8-file-name": _non_utf8_name}
LIST_HAZARDS = {"dotdot": "../outside.jpg 0\n", "absolute": "{abs} 0\n", "newline": "class_0/a\nb.jpg 0\n",
                "dotdot-inside": "class_0/../../outside.jpg 0\n"}


def assert_recorded(root: Path, out: Path, conv: Conversion, words: str, *args, line: int = 0) -> None:
    """The hostile entry is a ``failures.jsonl`` record (stage ``input``, the list line when it
    came from a list), nothing is read through it, the rest is packed, nothing lands outside OUT."""
    r, outside = run_watching(root, out, conv, *args, "--max-failures", 9)
    assert r.exit_code == 0, r.output
    assert outside == set()
    bad = [f for f in map(json.loads, conv.writer.failures_path(out).open()) if f["stage"] == "input"]
    assert len(bad) == 1 and words in bad[0]["reason"] and bad[0]["line"] == line, bad
    assert len(open_reader(out)) > 0  # the rest completed


@pytest.mark.parametrize("hazard", TREE_HAZARDS)
@pytest.mark.parametrize("conv", IMAGE_CONVS, ids=lambda c: c.id)
def test_hostile_names_in_a_tree_are_recorded(conv, hazard, tmp_path):
    src = write_image_folder(tmp_path / "src", count=3, classes=1, size=(24, 24))
    words = TREE_HAZARDS[hazard](src)
    out = conv.out(tmp_path)
    assert_recorded(tmp_path, out, conv, words, *conv.argv(src, out, "--workers", 0))
    TRIED.append(hazard)


@pytest.mark.parametrize("hazard", LIST_HAZARDS)
@pytest.mark.parametrize("conv", IMAGE_CONVS, ids=lambda c: c.id)
def test_hostile_list_lines_are_recorded(conv, hazard, tmp_path):
    src = write_image_folder(tmp_path / "data" / "src", count=3, classes=1, size=(24, 24))
    (tmp_path / "data" / "outside.jpg").write_bytes((src / "class_0" / "img_0000.jpg").read_bytes())
    lst = tmp_path / "list.txt"
    lst.write_text("class_0/img_0000.jpg 0\n" + LIST_HAZARDS[hazard].format(abs=src / "class_0" / "img_0001.jpg"))
    out = conv.out(tmp_path)
    # a newline inside a list line splits it: the first half is the unusable line
    words = {"newline": "expected 'relative/path label'"}.get(hazard, "refusing path")
    assert_recorded(tmp_path, out, conv, words, *conv.command, out, "--list", lst, "--root", src,
                    *conv.options, "--workers", 0, line=2)
    TRIED.append(hazard)


@pytest.mark.parametrize("conv", VIDEO_CONVS, ids=lambda c: c.id)
def test_hostile_video_names_are_recorded(conv, tmp_path):
    src = write_video_folder(tmp_path / "src", per_class=1, classes=1, frames=4, size=(24, 24))
    shutil.copy(src / "class_0" / "clip_0_0.mp4", src / "class_0" / "two\nlines.mp4")
    out = conv.out(tmp_path)
    assert_recorded(tmp_path, out, conv, "two\\nlines", *conv.argv(src, out, "--workers", 0, "--overwrite"))
    lst = tmp_path / "videos.txt"
    (src / "class_0" / "two\nlines.mp4").unlink()
    lst.write_text("class_0/clip_0_0.mp4 0\n../../escape.mp4 0\n")
    assert_recorded(tmp_path, out, conv, "refusing path", *conv.argv(src, out, "--list", lst, "--workers", 0,
                                                                      "--overwrite"), line=2)
    shutil.copy(src / "class_0" / "clip_0_0.mp4", os.fsencode(src / "class_0") + b"/v\xe9.mp4")
    assert_recorded(tmp_path, out, conv, "not valid UTF-8", *conv.argv(src, out, "--workers", 0, "--overwrite"))
    TRIED.extend(["newline-in-video-name", "dotdot-in-video-list", "non-utf8-video-name"])

"""Every input line becomes a sample or a failure: each line of ``--list`` and ``--csv`` and each
directory entry outside the documented filters (hidden files, extensions) is either packed or
recorded in ``failures.jsonl`` with stage ``input``, the file, the line number and why; the
summary counts them and ``--max-failures`` applies."""
from __future__ import annotations

import json
import os
import shutil

from packer.formats import open_reader
from tests.support.inputs import folder_past_path_max, write_image_folder, write_video_folder
from tests.support.killing import run_packer


def _failures(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_every_list_line_is_a_sample_or_a_recorded_failure(tmp_path):
    src = write_image_folder(tmp_path / "src", count=6, classes=2, size=(24, 28))
    lines = [
        "class_0/img_0000.jpg 0",
        "class_1/img_0001.jpg 0 2",  # an mmaction2 multi-label line: was dropped silently
        "class_0/img_0002.jpg",  # no label
        "class_1/img_0003.jpg one",  # not an integer
        "class_0/img_0004.jpg -1",  # negative
        "../outside.jpg 1",  # outside the root
        "class_0/img_0000.jpg 1",  # listed twice
        "class_1/notes.txt 1",  # not an image extension
        "",  # blank lines and comments are not inputs
        "# a comment",
        "class_1/img_0005.jpg 1",
    ]
    (tmp_path / "list.txt").write_text("\n".join(lines) + "\n")
    out = tmp_path / "out.lmdb"
    r = run_packer("to-lmdb", src, out, "--list", tmp_path / "list.txt", "--workers", 0, "--max-failures", 7)
    assert r.returncode == 0, r.stderr
    assert "2 samples from 9 inputs (7 input lines or entries unusable), 7 failed" in r.stdout
    assert open_reader(out).keys == ["class_0/img_0000.jpg", "class_1/img_0005.jpg"]
    bad = _failures(out / "failures.jsonl")
    assert [(f["stage"], f["line"]) for f in bad] == [("input", n) for n in (2, 3, 4, 5, 6, 7, 8)]
    assert all(f["file"] == str(tmp_path / "list.txt") and f["reason"] for f in bad)
    assert "several labels" in bad[0]["reason"] and "listed twice" in bad[5]["reason"]
    # --max-failures counts them: one fewer tolerated fails the run (every good sample packed)
    r = run_packer("to-lmdb", src, tmp_path / "o2.lmdb", "--list", tmp_path / "list.txt", "--workers", 0,
                   "--max-failures", 6)
    assert r.returncode == 1 and "7 inputs failed" in r.stderr and (tmp_path / "o2.lmdb").exists()


def test_resumed_run_keeps_input_failures_once(tmp_path):
    src = write_image_folder(tmp_path / "src", count=12, classes=2, size=(24, 28))
    (tmp_path / "list.txt").write_text("".join(f"class_{i % 2}/img_{i:04d}.jpg {i % 2}\n" for i in range(12))
                                       + "class_0/img_0000.jpg\n")
    out = tmp_path / "out.lmdb"
    args = ("to-lmdb", src, out, "--list", tmp_path / "list.txt", "--workers", 0, "--max-failures", 1,
            "--commit-every", 3)
    assert run_packer(*args, kill_at="add:7").returncode < 0
    r = run_packer(*args, "--resume")
    assert r.returncode == 0, r.stderr
    assert [(f["stage"], f["line"]) for f in _failures(out / "failures.jsonl")] == [("input", 13)]


def test_kinetics_csv_rows_are_samples_or_failures(tmp_path):
    src = write_video_folder(tmp_path / "v", per_class=1, classes=1, frames=6, size=(24, 32))
    video = next(src.rglob("*.mp4"))
    shutil.move(video, src / "abc.mp4")
    (tmp_path / "k.csv").write_text("label,youtube_id,time_start,time_end,split\n"
                                    "class_0,abc,0,10,train\n"
                                    "class_0,def,zero,10,train\n"  # not a number
                                    ",ghi,0,10,train\n"  # no label
                                    "class_0,abc,0,10,train\n")  # listed twice
    out = tmp_path / "out"
    r = run_packer("decode-frames", src, out, "--csv", tmp_path / "k.csv", "--workers", 0, "--max-failures", 3)
    assert r.returncode == 0, r.stderr
    bad = _failures(out / "failures.jsonl")
    assert [(f["stage"], f["line"]) for f in bad] == [("input", 3), ("input", 4), ("input", 5)]


def test_a_file_name_that_cannot_be_a_key_is_recorded(tmp_path):
    src = write_image_folder(tmp_path / "src", count=4, classes=2, size=(24, 28))
    good = (src / "class_0" / "img_0000.jpg").read_bytes()
    with open(os.path.join(os.fsencode(src / "class_1"), b"bad\xff.jpg"), "wb") as f:
        f.write(good)  # a Latin-1 name on a UTF-8 system: cannot be a key in keys.json
    (src / "class_1" / ".hidden.jpg").write_bytes(good)  # the documented filters stay silent
    (src / "class_1" / "notes.txt").write_text("x")
    out = tmp_path / "out.lmdb"
    r = run_packer("to-lmdb", src, out, "--workers", 0, "--max-failures", 1)
    assert r.returncode == 0, r.stderr
    bad = _failures(out / "failures.jsonl")
    assert len(bad) == 1 and bad[0]["stage"] == "input" and "UTF-8" in bad[0]["reason"], bad
    assert len(open_reader(out)) == 4


def test_resize_records_unusable_list_lines(tmp_path):
    src = write_image_folder(tmp_path / "src", count=3, classes=1, size=(40, 48))
    (tmp_path / "list.txt").write_text("class_0/img_0000.jpg 0\nclass_0/img_0001.jpg 0 1\nclass_0/img_0002.jpg 0\n")
    out = tmp_path / "out"
    r = run_packer("resize", src, out, "--list", tmp_path / "list.txt", "--short-side", 20, "--workers", 0,
                   "--max-failures", 1)
    assert r.returncode == 0, r.stderr
    assert "3 images: 2 resized" in r.stdout and "1 failed" in r.stdout, r.stdout
    bad = _failures(out / "failures.jsonl")
    assert [(f["stage"], f["line"]) for f in bad] == [("input", 2)]


def test_a_folder_that_cannot_be_listed_is_recorded(tmp_path):
    """A subfolder the listing cannot read (here a path past PATH_MAX; elsewhere a folder without
    read permission, an I/O error) is a recorded input failure naming it: ``os.walk`` alone
    skips such a folder in silence, and its images were neither packed nor counted."""
    src = write_image_folder(tmp_path / "src", count=4, classes=2, size=(24, 28))
    folder_past_path_max(src / "class_1", (src / "class_0" / "img_0000.jpg").read_bytes())
    out = tmp_path / "out.lmdb"
    r = run_packer("to-lmdb", src, out, "--workers", 0, "--max-failures", 1)
    assert r.returncode == 0, r.stderr
    assert "4 samples from 5 inputs (1 input lines or entries unusable), 1 failed" in r.stdout
    bad = _failures(out / "failures.jsonl")
    assert len(bad) == 1 and bad[0]["stage"] == "input", bad
    assert "cannot list this folder" in bad[0]["reason"] and "class_1/deep/" in bad[0]["file"]
    # the default --max-failures 0: every good image packed, and the run fails saying why
    r = run_packer("to-lmdb", src, tmp_path / "o2.lmdb", "--workers", 0)
    assert r.returncode == 1 and "1 inputs failed" in r.stderr


def test_an_image_beside_the_class_folders_is_recorded(tmp_path):
    """An image at the top of an ImageFolder tree belongs to no class: it was left out in silence
    (videos beside class folders were already recorded); now it is a recorded input failure."""
    src = write_image_folder(tmp_path / "src", count=4, classes=2, size=(24, 28))
    shutil.copy(src / "class_0" / "img_0000.jpg", src / "stray.jpg")
    (src / "README.txt").write_text("not an image: outside the extension filter, stays silent")
    out = tmp_path / "out.lmdb"
    r = run_packer("to-lmdb", src, out, "--workers", 0, "--max-failures", 1)
    assert r.returncode == 0, r.stderr
    assert "4 samples from 5 inputs (1 input lines or entries unusable), 1 failed" in r.stdout
    bad = _failures(out / "failures.jsonl")
    assert [(f["stage"], f["key"]) for f in bad] == [("input", "stray.jpg")]
    assert "stray.jpg: an image beside the class folders" in r.stdout + r.stderr


def test_a_video_beside_the_class_folders_is_recorded(tmp_path):
    """The video twin of the case above: ``decode-frames`` records it, naming it in its line."""
    src = write_video_folder(tmp_path / "v", per_class=1, classes=2, frames=6, size=(24, 32))
    shutil.copy(next(src.rglob("*.mp4")), src / "stray.mp4")
    out = tmp_path / "out"
    r = run_packer("decode-frames", src, out, "--workers", 0, "--max-failures", 1)
    assert r.returncode == 0, r.stderr
    bad = _failures(out / "failures.jsonl")
    assert [(f["stage"], f["key"]) for f in bad] == [("input", "stray.mp4")]
    assert "stray.mp4: a video beside the class folders" in r.stdout + r.stderr

"""A split run is one run (issue 31, cases 1 and 2): every part of a ``--num-shards`` run
records the whole listing it was cut from, and ``packer merge`` refuses parts cut from
different listings (inputs added, removed or renamed between the parts' runs move the split
points: an input would be in no part, or in two), naming the parts and their counts. Unusable
input lines are the run's, recorded once: the merged ``failures.jsonl`` and manifest equal a
single run's. For every image format, for decode-frames, and for list inputs."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.support.inputs import write_image_folder, write_video_folder
from tests.support.outputs import packed_snapshot
from packer.commands.decode_frames import decode_frames
from packer.commands.merge import merge_parts, read_failures
from packer.commands.pack_images import pack_images
from packer.errors import ResumeRefused, UsageError
from packer.formats import FORMATS, open_reader
from packer.commands.decode_frames import FrameOptions
from packer.conversion.options import InputOptions, RunOptions

IMAGE_FORMATS = sorted(FORMATS)


def out_path(base: Path, fmt: str, name: str) -> Path:
    base.mkdir(parents=True, exist_ok=True)
    return base / (f"{name}.h5" if FORMATS[fmt][0].single_file else name)


def change(root: Path, how: str) -> None:
    """Change an image tree the way a user might between two parts of a split run."""
    if how == "removed":  # two images in the first part's range: every later split point moves
        (root / "class_0" / "img_0000.jpg").unlink()
        (root / "class_0" / "img_0003.jpg").unlink()
    elif how == "added":
        shutil.copy(root / "class_2" / "img_0002.jpg", root / "class_0" / "img_0000b.jpg")
    elif how == "renamed":  # the same count: only the keys say it is another listing
        (root / "class_1" / "img_0001.jpg").rename(root / "class_1" / "img_0001_renamed.jpg")
    else:
        raise ValueError(how)


@pytest.mark.parametrize("fmt", IMAGE_FORMATS)
@pytest.mark.parametrize("how", ["added", "removed", "renamed"])
def test_parts_cut_from_different_trees_are_refused(tmp_path, fmt, how):
    src = write_image_folder(tmp_path / "src", count=12, classes=3, size=(24, 32))
    p0, p1 = out_path(tmp_path, fmt, "p0"), out_path(tmp_path, fmt, "p1")
    pack_images(src, p0, format=fmt, input_options=InputOptions(num_shards=2, shard_index=0),
                run_options=RunOptions(workers=0))
    change(src, how)
    pack_images(src, p1, format=fmt, input_options=InputOptions(num_shards=2, shard_index=1),
                run_options=RunOptions(workers=0))
    with pytest.raises(UsageError, match="different listings") as err:
        merge_parts([p0, p1], out_path(tmp_path, fmt, "merged"))
    message = str(err.value)
    assert f"part 0 ({p0})" in message and f"part 1 ({p1})" in message
    counts = {"added": (12, 13), "removed": (12, 10), "renamed": (12, 12)}[how]
    assert f"{counts[0]} inputs" in message and f"{counts[1]} inputs" in message
    assert not out_path(tmp_path, fmt, "merged").exists()


@pytest.mark.parametrize("fmt", IMAGE_FORMATS)
def test_unchanged_parts_still_merge_and_name_their_listing(tmp_path, fmt):
    """The check lets a split run over an unchanged tree through, and an unsplit run records
    no listing (its manifest stays as it was)."""
    src = write_image_folder(tmp_path / "src", count=9, classes=3, size=(24, 32))
    single = out_path(tmp_path, fmt, "single")
    pack_images(src, single, format=fmt, run_options=RunOptions(workers=0))
    assert "listing" not in open_reader(single).manifest.created_by["options"]
    parts = [out_path(tmp_path, fmt, f"p{i}") for i in range(3)]
    for i, part in enumerate(parts):
        pack_images(src, part, format=fmt, input_options=InputOptions(num_shards=3, shard_index=i),
                    run_options=RunOptions(workers=0))
    listings = [open_reader(p).manifest.created_by["options"]["listing"] for p in parts]
    assert listings[0] == listings[1] == listings[2] and listings[0]["listed_inputs"] == 9
    merged = out_path(tmp_path, fmt, "merged")
    merge_parts(parts, merged)
    assert packed_snapshot(merged) == packed_snapshot(single)


def write_list(src: Path, path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


def list_lines(src: Path) -> list[str]:
    """A list over the tree's images (label from the class) with two unusable lines in it."""
    lines = [f"{p.relative_to(src).as_posix()} {int(p.parent.name.split('_')[1])}"
             for p in sorted(src.rglob("*.jpg"))]
    lines.insert(2, "class_0/no_label.jpg")
    lines.insert(7, "class_1/img_0004.jpg minus-one")
    return lines


@pytest.mark.parametrize("fmt", IMAGE_FORMATS)
def test_input_line_failures_are_recorded_once_across_parts(tmp_path, fmt):
    """A list with 2 bad lines packed as 3 parts and merged: 2 failure lines and ``failures: 2``,
    the very records of a single run (it was 6, once per part)."""
    src = write_image_folder(tmp_path / "src", count=12, classes=3, size=(24, 32))
    lst = write_list(src, tmp_path / "list.txt", list_lines(src))
    single = out_path(tmp_path, fmt, "single")
    pack_images(src, single, format=fmt, input_options=InputOptions(list_path=lst),
                run_options=RunOptions(workers=0, max_failures=9))
    parts = [out_path(tmp_path, fmt, f"p{i}") for i in range(3)]
    for i, part in enumerate(parts):
        pack_images(src, part, format=fmt, input_options=InputOptions(list_path=lst, num_shards=3, shard_index=i),
                    run_options=RunOptions(workers=0, max_failures=9))
    merged = out_path(tmp_path, fmt, "merged")
    report = merge_parts(parts, merged)
    want = read_failures(open_reader(single))
    assert len(want) == 2 and report.failures == 2
    assert read_failures(open_reader(merged)) == want
    assert open_reader(merged).manifest.failures == open_reader(single).manifest.failures == 2
    assert packed_snapshot(merged) == packed_snapshot(single)


@pytest.mark.parametrize("edit", ["label", "bad line", "comment"])
def test_parts_cut_from_different_lists_are_refused(tmp_path, edit):
    """A list edited between parts: a label changed (same keys, same count), one more
    unusable line (the run's failures would differ), even a comment (the file is not the one
    the first part was cut from)."""
    src = write_image_folder(tmp_path / "src", count=12, classes=3, size=(24, 32))
    lines = list_lines(src)
    lst = write_list(src, tmp_path / "list.txt", lines)
    pack_images(src, tmp_path / "p0", input_options=InputOptions(list_path=lst, num_shards=2, shard_index=0),
                run_options=RunOptions(workers=0, max_failures=9))
    if edit == "label":
        lines[0] = lines[0].rsplit(" ", 1)[0] + " 2"
    elif edit == "bad line":
        lines.append("class_2/img_0005.jpg x")
    else:
        lines.insert(0, "# edited")
    write_list(src, lst, lines)
    pack_images(src, tmp_path / "p1", input_options=InputOptions(list_path=lst, num_shards=2, shard_index=1),
                run_options=RunOptions(workers=0, max_failures=9))
    with pytest.raises(UsageError, match="different listings"):
        merge_parts([tmp_path / "p0", tmp_path / "p1"], tmp_path / "merged")


def test_resuming_a_part_over_a_changed_tree_is_refused(tmp_path):
    """The listing is one of the part's options: ``--resume`` of a finished part over a tree
    that changed since is refused, naming it (what it stores would not match its siblings)."""
    src = write_image_folder(tmp_path / "src", count=9, classes=3, size=(24, 32))
    pack_images(src, tmp_path / "p0", input_options=InputOptions(num_shards=2, shard_index=0),
                run_options=RunOptions(workers=0))
    change(src, "added")
    with pytest.raises(ResumeRefused, match="--listed-inputs: 9 -> 10"):
        pack_images(src, tmp_path / "p0", input_options=InputOptions(num_shards=2, shard_index=0),
                    run_options=RunOptions(workers=0, resume=True))


@pytest.fixture(scope="module")
def videos(tmp_path_factory) -> Path:
    return write_video_folder(tmp_path_factory.mktemp("split-videos") / "src", per_class=2, classes=2,
                              frames=6, size=(24, 32))


@pytest.mark.parametrize("how", ["removed", "renamed", "added"])
def test_decode_frames_parts_cut_from_different_trees_are_refused(videos, tmp_path, how):
    src = tmp_path / "src"
    shutil.copytree(videos, src)
    def part(i: int) -> None:
        decode_frames(src, tmp_path / f"p{i}", to="lmdb", frame_options=FrameOptions(max_frames=2),
                      input_options=InputOptions(num_shards=2, shard_index=i), run_options=RunOptions(workers=0))

    part(0)
    victim = src / "class_0" / "clip_0_0.mp4"
    if how == "removed":
        victim.unlink()
    elif how == "renamed":
        victim.rename(victim.with_name("clip_0_0_renamed.mp4"))
    else:
        shutil.copy(victim, victim.with_name("clip_0_00.mp4"))
    part(1)
    with pytest.raises(UsageError, match="different listings") as err:
        merge_parts([tmp_path / "p0", tmp_path / "p1"], tmp_path / "merged")
    assert "part 0" in str(err.value) and "part 1" in str(err.value)


def test_decode_frames_list_bad_lines_recorded_once(videos, tmp_path):
    """A video list with an unusable line, decoded in 2 parts and merged: one failure line, as
    one run records."""
    lines = [f"{p.relative_to(videos).as_posix()} {int(p.parent.name.split('_')[1])}"
             for p in sorted(videos.rglob("*.*")) if p.suffix in (".mp4", ".avi")]
    lines.insert(1, lines[0])  # listed twice: an unusable line
    lst = write_list(videos, tmp_path / "videos.txt", lines)
    run, frames = RunOptions(workers=0, max_failures=9, timeout=600.0), FrameOptions(max_frames=2)
    decode_frames(videos, tmp_path / "single", to="lmdb", frame_options=frames,
                  input_options=InputOptions(list_path=str(lst)), run_options=run)
    for i in range(2):
        decode_frames(videos, tmp_path / f"p{i}", to="lmdb", frame_options=frames,
                      input_options=InputOptions(list_path=str(lst), num_shards=2, shard_index=i), run_options=run)
    merge_parts([tmp_path / "p0", tmp_path / "p1"], tmp_path / "merged")
    want = read_failures(open_reader(tmp_path / "single"))
    assert len(want) == 1 and read_failures(open_reader(tmp_path / "merged")) == want
    merged = json.loads((tmp_path / "merged" / "packer.json").read_text())
    assert merged["failures"] == 1

"""Video inputs: UCF-101/HMDB51/Kinetics class folders, classInd.txt, the Kinetics CSV, mmaction2 lists."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from packer.errors import UsageError
from packer.conversion.video_inputs import read_class_index, video_items


def touch(root, *rels):
    for rel in rels:
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"x")
    return root


def test_ucf_style_class_folders(tmp_path):
    touch(tmp_path, "YoYo/v_YoYo_g01_c01.avi", "ApplyEyeMakeup/v_ApplyEyeMakeup_g01_c02.avi",
          "ApplyEyeMakeup/v_ApplyEyeMakeup_g01_c01.avi", "ApplyEyeMakeup/notes.txt", ".hidden/x.avi")
    with pytest.raises(UsageError, match="part of the classes of UCF-101"):  # 2 of 101: a subset
        video_items(tmp_path)
    items, classes = video_items(tmp_path, class_index="ucf101")
    assert (len(classes), classes[0], classes[100]) == (101, "ApplyEyeMakeup", "YoYo")
    assert [(it.key, it.label, it.frame_dir) for it in items] == [
        ("ApplyEyeMakeup/v_ApplyEyeMakeup_g01_c01.avi", 0, "ApplyEyeMakeup/v_ApplyEyeMakeup_g01_c01"),
        ("ApplyEyeMakeup/v_ApplyEyeMakeup_g01_c02.avi", 0, "ApplyEyeMakeup/v_ApplyEyeMakeup_g01_c02"),
        ("YoYo/v_YoYo_g01_c01.avi", 100, "YoYo/v_YoYo_g01_c01"),
    ]


def test_class_index_sets_labels(tmp_path):
    src = touch(tmp_path / "src", "b/1.avi", "a/2.avi")
    (tmp_path / "classInd.txt").write_text("1 b\n2 a\n3 c\n")
    items, classes = video_items(src, class_index=tmp_path / "classInd.txt")
    assert classes == ["b", "a", "c"]
    assert [(it.key, it.label) for it in items] == [("b/1.avi", 0), ("a/2.avi", 1)]
    (tmp_path / "bad.txt").write_text("1 b\n3 a\n")
    with pytest.raises(UsageError, match="without gaps"):
        read_class_index(tmp_path / "bad.txt")
    (tmp_path / "short.txt").write_text("1 b\n")
    with pytest.raises(UsageError, match="classes not in"):
        video_items(src, class_index=tmp_path / "short.txt")


def test_same_stem_in_one_class_uses_stem_ext_for_both(tmp_path):
    touch(tmp_path, "c/a.mp4", "c/a.avi", "c/b.mp4", "d/a.mp4")
    items, _ = video_items(tmp_path)
    assert {it.key: it.frame_dir for it in items} == {
        "c/a.avi": "c/a_avi", "c/a.mp4": "c/a_mp4", "c/b.mp4": "c/b", "d/a.mp4": "d/a"}


def test_whitespace_never_reaches_a_frame_dir(tmp_path):
    # mmaction2 splits list lines on whitespace (Kinetics class names have spaces)
    touch(tmp_path, "air drumming/x y.mp4")  # (one Kinetics class: numbered by the label map)
    items, classes = video_items(tmp_path, class_index="kinetics400")
    assert classes[items[0].label] == "air drumming" and items[0].frame_dir == "air_drumming/x_y"
    touch(tmp_path, "air drumming/x_y.mp4")
    with pytest.raises(UsageError, match="both map to frame folder"):
        video_items(tmp_path, class_index="kinetics400")


KINETICS_CSV = """label,youtube_id,time_start,time_end,split
air drumming,abc123,10,20,train
abseiling,zzz999,0,10,train
abseiling,plain01,5,15,train
abseiling,gone000,1,11,train
"""


@pytest.mark.parametrize("nested", [False, True])
def test_kinetics_csv_flat_or_class_folders(tmp_path, nested):
    src = tmp_path / "videos"
    prefix = "abseiling/" if nested else ""
    touch(src, f"{'air drumming/' if nested else ''}abc123_000010_000020.mp4",
          f"{prefix}zzz999_000000_000010.mp4", f"{prefix}plain01.mp4")
    (tmp_path / "k.csv").write_text(KINETICS_CSV)
    items, classes = video_items(src, csv_path=tmp_path / "k.csv")
    assert classes == ["abseiling", "air drumming"]
    got = [(it.key, it.label, it.frame_dir) for it in items]
    assert got == sorted([
        ("gone000_000001_000011.mp4", 0, "abseiling/gone000_000001_000011"),  # missing: fails at read
        (f"{prefix}plain01.mp4", 0, "abseiling/plain01"),
        (f"{prefix}zzz999_000000_000010.mp4", 0, "abseiling/zzz999_000000_000010"),
        (f"{'air drumming/' if nested else ''}abc123_000010_000020.mp4", 1, "air_drumming/abc123_000010_000020"),
    ], key=lambda e: (e[1], e[0]))  # in (label, key) order
    assert not (src / "gone000_000001_000011.mp4").exists()


def test_kinetics_csv_errors(tmp_path):
    (tmp_path / "v").mkdir()
    (tmp_path / "k.csv").write_text("label,time_start,time_end,split\na,0,10,test\n")
    with pytest.raises(UsageError, match="Kinetics header"):
        video_items(tmp_path / "v", csv_path=tmp_path / "k.csv")
    # the test split has no label column: label -1, as mmaction2's list builder gives it
    (tmp_path / "k.csv").write_text("youtube_id,time_start,time_end,split\nabc,0,10,test\n")
    items, classes = video_items(tmp_path / "v", csv_path=tmp_path / "k.csv")
    assert [(it.key, it.label, it.frame_dir) for it in items] == [("abc_000000_000010.mp4", -1,
                                                                   "abc_000000_000010")]
    assert classes == []
    (tmp_path / "k.csv").write_text("label,youtube_id,time_start,time_end,split\na,abc,x,10,test\n")
    with pytest.raises(UsageError, match=r"k.csv:2"):
        video_items(tmp_path / "v", csv_path=tmp_path / "k.csv")


def test_mmaction2_video_list(tmp_path):
    touch(tmp_path, "some/dir/v1.mp4", "v2.avi")
    (tmp_path / "list.txt").write_text("some/dir/v1.mp4 3\n\nv2.avi 0\n")
    items, classes = video_items(tmp_path, list_path=tmp_path / "list.txt")
    assert [(it.key, it.label, it.frame_dir) for it in items] == [("some/dir/v1.mp4", 3, "some/dir/v1"),
                                                                   ("v2.avi", 0, "v2")]
    assert classes == ["0", "1", "2", "3"]
    with pytest.raises(UsageError):
        video_items(tmp_path, list_path=tmp_path / "list.txt", csv_path=tmp_path / "list.txt")


def test_frame_folder_never_nests_in_another(tmp_path):
    touch(tmp_path, "x/v.mp4", "x/v/w.mp4")
    (tmp_path / "list.txt").write_text("x/v.mp4 0\nx/v/w.mp4 0\n")
    with pytest.raises(UsageError, match="inside the frame folder"):
        video_items(tmp_path, list_path=tmp_path / "list.txt")


@given(st.lists(st.tuples(st.sampled_from(["a", "b", "a b", "a_b"]),
                          st.sampled_from(["mp4", "avi", "MP4", "mkv"])), min_size=1, max_size=8, unique=True))
def test_frame_dirs_unique_or_refused(tmp_path_factory, names):
    root = tmp_path_factory.mktemp("h")
    touch(root, *(f"c/{stem}.{ext}" for stem, ext in names))
    try:
        items, _ = video_items(root)
    except UsageError as e:
        assert "both map to frame folder" in str(e)
        return
    dirs = [it.frame_dir for it in items]
    assert len(set(dirs)) == len(dirs) and not any(" " in d for d in dirs)

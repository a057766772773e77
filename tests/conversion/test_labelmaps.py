"""The label maps packer ships (``packer.conversion.labelmaps``): each is its dataset's own
numbering, checked against what the dataset's files say (classInd.txt lines, the Something-
Something v2 ids, mmaction2's sort of the Kinetics training CSV), and ``identify`` tells a
tree of one of them from a part of one and from a tree of its own."""
from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from tests.support import REPO
from packer.conversion.labelmaps import KNOWN, class_key, identify, known_map
from packer.conversion.lists import read_class_index
from packer.errors import UsageError

COUNTS = {"ucf101": 101, "hmdb51": 51, "kinetics400": 400, "kinetics600": 600, "kinetics700": 700, "sthv2": 174}

# lines of UCF-101's own classInd.txt (UCF101TrainTestSplits-RecognitionTask.zip), 1-based
CLASSIND = {1: "ApplyEyeMakeup", 34: "Haircut", 35: "Hammering", 36: "HammerThrow", 37: "HandstandPushups",
            46: "JugglingBalls", 47: "JumpingJack", 48: "JumpRope", 49: "Kayaking", 101: "YoYo"}
# ids of something-something-v2-labels.json
STHV2 = {0: "Approaching something with your camera", 16: "Holding something",
         27: "Lifting something up completely without letting it drop down",
         28: "Lifting something up completely, then letting it drop down",
         135: "Something falling like a rock", 151: "Throwing something"}


def test_every_map_has_its_dataset_s_classes_once():
    assert {name: len(m.classes) for name, m in KNOWN.items()} == COUNTS
    for m in KNOWN.values():
        keys = [class_key(c) for c in m.classes]
        assert len(set(keys)) == len(keys), m.name  # matching folders to names is unambiguous
        assert all(c == c.strip() and c for c in m.classes)
        assert m.path.read_bytes().endswith(b"\n") and b"\r" not in m.path.read_bytes()


def test_ucf101_is_classind_not_byte_order():
    classes = KNOWN["ucf101"].classes
    assert {i + 1: c for i, c in enumerate(classes) if i + 1 in CLASSIND} == CLASSIND
    assert classes == sorted(classes, key=str.lower) != sorted(classes)  # classInd sorts ignoring case


def test_kinetics_maps_are_mmaction2_s_sort_of_the_training_classes():
    # parse_kinetics_splits: sorted({convert_label(row[0])}), convert_label removing '"' and
    # making spaces '_'; the label map lists the same classes with their spaces
    for name in ("kinetics400", "kinetics600", "kinetics700"):
        classes = KNOWN[name].classes
        assert [c.replace('"', "").replace(" ", "_") for c in classes] == \
            sorted({c.replace('"', "").replace(" ", "_") for c in classes})
    assert KNOWN["kinetics400"].classes[:3] == ["abseiling", "air drumming", "answering questions"]
    assert KNOWN["hmdb51"].classes == sorted(KNOWN["hmdb51"].classes)  # os.listdir sorted


def test_sthv2_is_the_labels_json_ids():
    classes = KNOWN["sthv2"].classes
    assert {i: classes[i] for i in STHV2} == STHV2


def test_the_maps_are_package_data():
    data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    patterns = data["packer.conversion.labelmaps"]
    for m in KNOWN.values():
        assert any(Path(m.path.name).match(p) for p in patterns)


def test_identify_tells_a_dataset_from_a_part_of_one():
    ucf = KNOWN["ucf101"].classes
    found = identify(reversed(ucf))
    assert found.equal is known_map("ucf101") and found.label_of["Hammering"] == 34
    folders = [c.replace(" ", "_") for c in KNOWN["kinetics400"].classes]  # rename_classnames.sh
    assert identify(folders).equal is known_map("kinetics400")
    part = identify(folders[:1] + folders[3:])
    assert part.equal is None and [m.name for m, _ in part.within][0] == "kinetics400"
    assert dict((m.name, lacks) for m, lacks in part.within)["kinetics400"] == ("air drumming", "answering questions")
    mixed = identify(ucf + ["Misc"])
    assert (mixed.equal, mixed.within, mixed.closest) == (None, (), (known_map("ucf101"), ("Misc",)))
    assert identify(["class_0", "class_1"]) == identify([])
    # a copy of UCF-101 that spells HandStandPushups is UCF-101
    assert identify([c if c != "HandstandPushups" else "HandStandPushups" for c in ucf]).equal is known_map("ucf101")


def test_class_index_takes_a_built_in_name(tmp_path, monkeypatch):
    index = read_class_index("kinetics700")
    assert (index.classes, index.base, index.source) == (KNOWN["kinetics700"].classes, 0, "kinetics700")
    assert index.label_of("HandStandPushups") is None
    assert read_class_index("ucf101").label_of("HandStandPushups") == 36
    monkeypatch.chdir(tmp_path)
    Path("ucf101").write_text("a\nb\n")
    with pytest.raises(UsageError, match="write ./ucf101 for the file"):
        read_class_index("ucf101")
    assert read_class_index("./ucf101").classes == ["a", "b"]
    with pytest.raises(UsageError, match="does not exist.*ucf101, hmdb51"):
        read_class_index("ucf-101")

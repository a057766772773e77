"""List and label files: class indexes, label maps, list lines (``packer.conversion.lists``)."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from packer.conversion.lists import (mmaction2_name, mmaction2_order, parse_list_line, read_class_index)
from packer.errors import UsageError


def test_class_index_forms(tmp_path):
    (tmp_path / "classInd.txt").write_bytes(b"1 ApplyEyeMakeup\r\n2 ApplyLipstick\r\n3 Archery\r\n")
    idx = read_class_index(tmp_path / "classInd.txt")
    assert (idx.classes, idx.base, idx.kind) == (["ApplyEyeMakeup", "ApplyLipstick", "Archery"], 1, "index")
    (tmp_path / "zero.txt").write_text("0 b\n1 a\n")
    assert read_class_index(tmp_path / "zero.txt").base == 0
    # mmaction2's label_map_k400.txt: one name per line, spaces and parentheses kept, BOM dropped
    (tmp_path / "map.txt").write_bytes("\ufeffabseiling\r\nair drumming\r\npassing American football "
                                       "(in game)\r\n\r\n".encode())
    idx = read_class_index(tmp_path / "map.txt")
    assert idx.classes == ["abseiling", "air drumming", "passing American football (in game)"]
    assert (idx.base, idx.kind) == (0, "names")
    assert idx.label_of("air_drumming") == 1 and idx.label_of("passing American football (in game)") == 2
    assert idx.label_of("nope") is None
    # a training CSV names the classes in mmaction2's order
    (tmp_path / "train.csv").write_text("label,youtube_id,time_start,time_end,split\n"
                                        "zumba,a,0,10,train\n\"a b\",b,0,10,train\na(b),c,0,10,train\n")
    assert read_class_index(tmp_path / "train.csv").classes == ["a(b)", "a b", "zumba"]


@pytest.mark.parametrize("text, match", [("1 a\n3 b\n", "without gaps"), ("1 a\n2 a\n", "repeats"),
                                          ("a\nb\na\n", "listed twice"), ("", "empty")])
def test_bad_class_indexes(tmp_path, text, match):
    (tmp_path / "c.txt").write_text(text)
    with pytest.raises(UsageError, match=match):
        read_class_index(tmp_path / "c.txt")


def test_mmaction2_order_sorts_with_spaces_as_underscores():
    # a plain sort puts "a b" first (space < "("); mmaction2 compares "a_b" with "a(b)"
    assert sorted(["a b", "a(b)"]) == ["a b", "a(b)"]
    assert mmaction2_order(["a b", "a(b)", "a(b)"]) == ["a(b)", "a b"]
    assert mmaction2_name('say "hi" now') == "say_hi_now"


def test_list_lines():
    assert parse_list_line("ApplyEyeMakeup/v_ApplyEyeMakeup_g08_c01.avi 1", "w") == \
        parse_list_line("ApplyEyeMakeup/v_ApplyEyeMakeup_g08_c01.avi 1", "w")
    line = parse_list_line("ApplyEyeMakeup/v_ApplyEyeMakeup_g08_c01.avi", "w")
    assert (line.path, line.labels) == ("ApplyEyeMakeup/v_ApplyEyeMakeup_g08_c01.avi", ())
    line = parse_list_line("my videos/clip 1.mp4  0 2 5", "w")
    assert (line.path, line.labels) == ("my videos/clip 1.mp4", (0, 2, 5))
    line = parse_list_line("7", "w")  # the path keeps at least one field
    assert (line.path, line.labels) == ("7", ())


@given(path=st.lists(st.text(st.characters(whitelist_categories=("L", "N"), whitelist_characters="_-./()"),
                             min_size=1, max_size=8), min_size=1, max_size=3).map(" ".join),
       labels=st.lists(st.integers(-1, 999), max_size=4), sep=st.sampled_from([" ", "  ", "\t"]))
def test_list_line_round_trip(path, labels, sep):
    if path.split()[-1].lstrip("+-").isdigit():
        return  # a path whose last field is a number reads as a label: keep the ambiguity out
    text = sep.join([path, *map(str, labels)])
    line = parse_list_line(text, "w")
    assert (line.path, list(line.labels)) == (path, labels)

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from packer.errors import UsageError
from packer.conversion.inputs import Item, image_folder, list_file, parse_exts, partition


def touch(p, data=b"x"):
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)


def test_image_folder_order_labels_filters(tmp_path):
    for rel in ["b/2.JPG", "b/1.png", "a/z/deep.jpeg", "a/x.webp", "a/.hidden.jpg", "a/readme.txt",
                ".git/c.jpg", "c d/ü ñ.jpg"]:
        touch(tmp_path / rel)
    items, classes = image_folder(tmp_path, parse_exts(None))
    assert classes == ["a", "b", "c d"]
    assert [(i.key, i.label) for i in items] == [
        ("a/x.webp", 0), ("a/z/deep.jpeg", 0), ("b/1.png", 1), ("b/2.JPG", 1), ("c d/ü ñ.jpg", 2)]


def test_image_folder_ignores_symlink_loops(tmp_path):
    touch(tmp_path / "a" / "1.jpg")
    (tmp_path / "a" / "loop").symlink_to(tmp_path / "a", target_is_directory=True)
    items, _ = image_folder(tmp_path, ("jpg",))
    assert [i.key for i in items] == ["a/1.jpg"]


def test_list_file_keeps_order_and_spaces(tmp_path):
    lst = tmp_path / "train.txt"
    lst.write_text("dir/with space.jpg 2\n# comment\n\nb.png 0\n")
    items, classes = list_file(lst, tmp_path)
    assert items == [Item("dir/with space.jpg", str(tmp_path / "dir/with space.jpg"), 2),
                     Item("b.png", str(tmp_path / "b.png"), 0)]
    assert classes == ["0", "1", "2"]


@pytest.mark.parametrize("line", ["../escape.jpg 0", "/etc/passwd 0", "a.jpg x", "lonely", "a.jpg -1"])
def test_list_file_refuses_bad_lines(tmp_path, line):
    lst = tmp_path / "l.txt"
    lst.write_text(line + "\n")
    with pytest.raises(UsageError, match="l.txt:1"):
        list_file(lst, tmp_path)


def test_missing_inputs_are_usage_errors(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        image_folder(tmp_path / "nope")
    with pytest.raises(UsageError, match="no class folders"):
        image_folder(tmp_path)


@given(st.integers(0, 200), st.integers(1, 17))
def test_partition_covers_exactly_once(n, shards):
    items = [Item(str(i), str(i), 0) for i in range(n)]
    parts = [partition(items, shards, i) for i in range(shards)]
    assert [x for p in parts for x in p] == items
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
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


def test_list_file_with_a_byte_order_mark(tmp_path):
    """A list saved "UTF-8 with BOM" (Windows editors): the mark is not part of the first path,
    which used to fail as a missing file with an invisible character in its name."""
    lst = tmp_path / "train.txt"
    lst.write_bytes("\ufeffa.jpg 1\r\nb.jpg 0\r\n".encode("utf-8"))
    items, _ = list_file(lst, tmp_path)
    assert [(it.key, it.label) for it in items] == [("a.jpg", 1), ("b.jpg", 0)]


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


_names = st.lists(st.one_of(
    st.text(st.characters(blacklist_characters="/\x00", blacklist_categories=("Cs",)), min_size=1, max_size=6),
    st.sampled_from(["a\tb", "c\nd", "x\x1f", "é", "sub/x", "sub/y", "deep/er/z"]),
    st.binary(min_size=1, max_size=4).filter(lambda b: b"/" not in b and b"\0" not in b)),
    min_size=1, max_size=8)


@settings(max_examples=60, deadline=None)
@given(names=_names)
@example(names=["."])  # no file can be made: an empty class folder
def test_class_files_keys_equal_safe_key_of_each_name(tmp_path_factory, names):
    """The whole-folder check (``_plain_names``) gives every file the key ``safe_key`` gives it
    one by one, and a name that cannot be a key is still a recorded failure, never dropped."""
    import os

    from packer.conversion.inputs import class_files, safe_key, walk_files

    root = tmp_path_factory.mktemp("r")
    (root / "cls").mkdir()  # (a class folder exists even when no name could be made in it)
    made = set()
    for name in names:
        raw = name if isinstance(name, bytes) else os.fsencode(name)
        if raw.startswith(b".") or b"/." in raw or raw in made:
            continue
        path = os.path.join(os.fsencode(root), b"cls", raw + b".jpg")
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(b"x")
        except OSError:  # a name the file system refuses (too long, an existing folder's name)
            continue
        made.add(raw)
    expected, bad = [], 0
    for rel in sorted(walk_files(root / "cls")):
        try:
            expected.append((safe_key(f"cls/{rel}", str(root)), rel))
        except UsageError:
            bad += 1
    failures: list = []
    assert list(class_files(root, "cls", ("jpg",), failures)) == expected
    assert len(failures) == bad


@settings(max_examples=300, deadline=None)
@given(names=st.lists(st.text(alphabet="aJ.pPgGİΣσς_x", max_size=8), max_size=12),
       exts=st.lists(st.sampled_from(["jpg", "png", "JPG", "g", "σ", "tar.gz", "jp"]), min_size=1, max_size=3))
def test_the_listing_extension_filter_is_has_ext(names, exts):
    """The listing's one-call extension filter keeps exactly the names ``has_ext`` keeps."""
    from packer.conversion.inputs import _with_ext, has_ext

    exts = parse_exts(exts)
    assert _with_ext(names, exts) == [n for n in names if has_ext(n, exts)]

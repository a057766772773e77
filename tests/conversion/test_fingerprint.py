"""The fingerprint's input digests: the fast row encoding gives exactly the documented lines
(``json.dumps(row, ensure_ascii=False)`` per input), so a resume of a partial made by an
earlier version compares equal."""
from __future__ import annotations

import hashlib
import json
import os

import pytest
from hypothesis import given, settings, strategies as st

from packer.conversion.fingerprint import Fingerprint, input_stats
from packer.formats.writer import _json_str
from packer.conversion.options import RunOptions


def _reference(rows):
    h = hashlib.sha256()
    for row in rows:
        h.update(json.dumps(row, ensure_ascii=False).encode("utf-8", "surrogateescape") + b"\n")
    return h.hexdigest()


_label = st.one_of(st.integers(-5, 10**12), st.lists(st.integers(0, 999), max_size=4), st.booleans())
_row = st.tuples(st.text(), _label, st.integers(-1, 10**15), st.integers(-1, 10**19)).map(list)


@settings(max_examples=300, deadline=None)
@given(st.lists(_row, max_size=30))
def test_input_digests_equal_the_documented_json_lines(rows):
    fp = Fingerprint(format="lmdb", classes=["a"], options={}, stats=rows)
    assert fp.inputs["files_sha256"] == _reference(rows)
    assert fp.inputs["sha256"] == _reference(row[:2] for row in rows)
    assert fp.inputs["count"] == len(rows)


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_keys_journal_lines_are_json_strings(key):
    assert _json_str(key) == json.dumps(key)
    assert json.loads(_json_str(key)) == key


@pytest.mark.parametrize("fmt,check,workers", [("lmdb", "header", 0), ("lmdb", "full", 2), ("records", "header", 0),
                                               ("records", "header", 2), ("hdf5", "full", 2)])
def test_a_fresh_runs_fingerprint_equals_one_from_stating_every_input_first(tmp_path, fmt, check, workers):
    """A fresh run takes each input's size and mtime from its own read (or a stat when it packs
    it): the finished manifest's fingerprint is the one a stat pass before the run gives, on
    every plan, a failed input included, so ``--resume`` of the finished output compares equal."""
    from tests.support.inputs import write_image_folder

    from packer.commands.pack_images import pack_images
    from packer.conversion.inputs import image_items
    from packer.formats import open_reader

    src = write_image_folder(tmp_path / "src", count=12, classes=2)
    (src / "class_1" / "img_0005.jpg").write_bytes(b"not a jpeg")
    os.utime(src / "class_0" / "img_0002.jpg", ns=(5, 1_700_000_000_123_456_789))
    out = tmp_path / f"out.{fmt}"
    report = pack_images(src, out, format=fmt, check=check, run_options=RunOptions(workers=workers))
    assert report.failed == 1
    items, _ = image_items(src)
    expected = Fingerprint(format=fmt, classes=["class_0", "class_1"], options={}, stats=input_stats(items))
    assert open_reader(out).manifest.fingerprint["inputs"] == expected.inputs
    again = pack_images(src, out, format=fmt, check=check, run_options=RunOptions(workers=workers, resume=True))
    assert again.status == "complete"


def _interrupt(tmp_path, count=10):
    """A fresh to-lmdb run (commits of 3) stopped by a KeyboardInterrupt at its 7th sample."""
    from tests.support.inputs import write_image_folder

    from packer.commands.pack_images import pack_images
    from packer.formats.lmdb.writer import LmdbWriter

    src = write_image_folder(tmp_path / "src", count=count, classes=2)
    out = tmp_path / "out.lmdb"
    real, calls = LmdbWriter._write, {"n": 0}

    def stop_at_seven(self, index, sample):
        calls["n"] += 1
        if calls["n"] == 7:
            raise KeyboardInterrupt
        return real(self, index, sample)

    LmdbWriter._write = stop_at_seven
    try:
        with pytest.raises(KeyboardInterrupt):
            pack_images(src, out, format="lmdb", check="header", run_options=RunOptions(workers=0, commit_every=3))
    finally:
        LmdbWriter._write = real
    return src, out


def test_an_interrupted_fresh_run_keeps_the_stats_of_what_it_stored(tmp_path):
    """The per-input table of a fresh partial: keys and labels of every input, and the size and
    mtime of each input up to the last durable point, from the stat journal."""
    from packer.conversion.fingerprint import load_inputs
    from packer.conversion.inputs import image_items
    from packer.formats.sidecars import partial_path

    src, out = _interrupt(tmp_path)
    table = load_inputs(partial_path(out))
    items, _ = image_items(src)
    full = input_stats(items)
    assert [row[:2] for row in table] == [row[:2] for row in full]
    done = json.loads((partial_path(out) / ".resume.json").read_text())["items_done"]
    assert done >= 3
    assert table[:done] == full[:done] and all(len(row) == 2 for row in table[done:])


def test_a_damaged_stat_journal_refuses_the_resume_and_a_torn_tail_does_not(tmp_path):
    """Stored inputs whose size and mtime the journal lost cannot be compared: the resume is
    refused with the reason, never taken as unchanged; a torn last entry (a kill mid-append,
    past the checkpoint) is ignored and the resume ends as an uninterrupted run."""
    from packer.commands.pack_images import pack_images
    from packer.conversion.fingerprint import INPUT_STATS_NAME
    from packer.errors import ResumeRefused
    from packer.formats import open_reader
    from packer.formats.sidecars import partial_path

    src, out = _interrupt(tmp_path / "a")
    journal = partial_path(out) / INPUT_STATS_NAME
    journal.write_bytes(journal.read_bytes()[:16])  # one entry left of the durable ones
    with pytest.raises(ResumeRefused, match="no size and mtime for .* stored inputs"):
        pack_images(src, out, format="lmdb", check="header",
                    run_options=RunOptions(workers=0, commit_every=3, resume=True))

    src, out = _interrupt(tmp_path / "b")
    journal = partial_path(out) / INPUT_STATS_NAME
    with open(journal, "ab") as f:
        f.write(b"\x01\x02\x03")  # a torn entry behind the fsync'ed ones
    done = pack_images(src, out, format="lmdb", check="header",
                       run_options=RunOptions(workers=0, commit_every=3, resume=True))
    assert done.status == "resumed" and open_reader(out).manifest.count == 10


@settings(max_examples=100, deadline=None)
@given(st.lists(_row, max_size=20))
def test_with_files_equals_a_fingerprint_of_the_full_rows(rows):
    start = Fingerprint(format="lmdb", classes=["a"], options={"x": 1}, stats=[row[:2] for row in rows])
    assert start.inputs["files_sha256"] is None or not rows
    done = start.with_files(rows)
    assert done.to_dict() == Fingerprint(format="lmdb", classes=["a"], options={"x": 1}, stats=rows).to_dict()


def test_a_full_table_over_a_stale_stat_journal_reads_as_itself(tmp_path):
    """A resumed run writes its full table before it drops the first run's stat journal: a kill
    between the two leaves both, and the journal adds nothing to full rows."""
    from packer.conversion import fingerprint as fpm

    fpm.save_inputs(tmp_path, [["a.jpg", 0], ["b.jpg", 1]])
    fpm.append_input_stats(tmp_path, [11, 111, 22, 222])
    new = [["a.jpg", 0, 13, 133], ["b.jpg", 1, 24, 244]]
    fpm.atomic_write_bytes(tmp_path / fpm.INPUTS_NAME, json.dumps(new).encode())  # save_inputs' first step
    assert fpm.load_inputs(tmp_path) == new
    fpm.save_inputs(tmp_path, new)
    assert fpm.load_inputs(tmp_path) == new and not (tmp_path / fpm.INPUT_STATS_NAME).exists()


def test_file_stats_equal_file_stat_of_each_path(tmp_path):
    from packer.conversion.fingerprint import file_stat, file_stats

    paths = []
    for i in range(3):
        p = tmp_path / f"{i}.bin"
        p.write_bytes(b"x" * i)
        paths.append(str(p))
    paths.insert(1, str(tmp_path / "gone.bin"))
    got = file_stats(paths)
    assert got.shape == (4, 2) and str(got.dtype) == "int64"
    assert [tuple(row) for row in got.tolist()] == [file_stat(p) for p in paths]
    assert tuple(got[1]) == (-1, -1)
    assert file_stats([]).shape == (0, 2)

"""Whole-file reads (``packer.fileio``): every byte, exactly, for regular files and pipes."""
from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packer.fileio import read_file, read_file_stat


@settings(max_examples=60, deadline=None)
@given(data=st.binary(max_size=5000))
def test_reads_equal_open_read(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("f") / "x.bin"
    path.write_bytes(data)
    assert read_file(path) == data == path.read_bytes()


def test_large_file_read_whole(tmp_path):
    data = os.urandom(3 << 20)  # past the 1 MiB chunk a short read continues with
    path = tmp_path / "big.bin"
    path.write_bytes(data)
    assert read_file(path) == data


@pytest.mark.timeout(30)
@pytest.mark.parametrize("writer", [False, True])
def test_a_pipe_is_refused_not_waited_on(tmp_path, writer):
    """Only regular files are inputs: a FIFO is refused at once (open never waits for a writer;
    the open file's fstat says what it is), with or without a writer and bytes in it."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    held = os.open(fifo, os.O_RDWR) if writer else None  # a writer end, without blocking
    try:
        if held is not None:
            os.write(held, b"x" * 1000)
        with pytest.raises(OSError, match="named pipe"):
            read_file(fifo)
    finally:
        if held is not None:
            os.close(held)


def test_the_stat_is_the_open_files(tmp_path):
    path = tmp_path / "x.bin"
    path.write_bytes(b"abc")
    os.utime(path, ns=(1, 1_234_567_891_011))
    expected = (3, 1_234_567_891_011)
    assert read_file_stat(path) == (b"abc", expected)


def test_missing_file_raises_oserror(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_file(tmp_path / "nope")


def test_a_folder_that_cannot_be_listed_is_reported_not_skipped(tmp_path):
    """``visible_files`` hands every folder it cannot list to its caller (``os.walk`` alone would
    skip it in silence); an upload of an output with one stops, naming it."""
    from tests.support.inputs import folder_past_path_max

    from packer.errors import UsageError
    from packer.fileio import visible_files
    from packer.remote.upload import _files

    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.bin").write_bytes(b"x")
    (tmp_path / ".hidden").write_bytes(b"h")
    folder_past_path_max(tmp_path / "a", b"y")
    errors: list[OSError] = []
    assert visible_files(tmp_path, errors.append) == [os.path.join("a", "x.bin")]
    assert len(errors) == 1 and str(tmp_path / "a" / "deep") in errors[0].filename
    with pytest.raises(UsageError, match="cannot list this folder of the output"):
        _files(tmp_path)

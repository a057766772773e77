"""packer.writeback: starting a file's writeback early changes no byte and never fails a write."""
from __future__ import annotations

import os

import pytest

from packer.writeback import WRITE_BUFFER, Writeback, start_writeback


def test_appends_through_the_buffer_with_writeback_keep_every_byte(tmp_path):
    path = tmp_path / "f.bin"
    chunks = [bytes([i % 251]) * (1000 + 37 * i) for i in range(200)]
    wb = Writeback(every=16 << 10)  # starts many times over the ~1 MB written
    size = 0
    with open(path, "wb", buffering=WRITE_BUFFER) as f:
        for chunk in chunks:
            f.write(chunk)
            size += len(chunk)
            wb.wrote(f, size)
        f.flush()
        os.fsync(f.fileno())
    assert path.read_bytes() == b"".join(chunks)


def test_a_reopened_file_starts_from_what_it_holds(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(b"x" * 5000)
    wb = Writeback(every=4096)
    wb.reset(5000)
    with open(path, "ab", buffering=WRITE_BUFFER) as f:
        f.write(b"y" * 3000)
        wb.wrote(f, 8000)  # 3,000 new bytes: not yet
        assert f.tell() == 8000 and path.stat().st_size == 5000  # still in the buffer
        f.write(b"z" * 2000)
        wb.wrote(f, 10000)  # past 4,096 new bytes: flushed, then started
        assert path.stat().st_size == 10000
        f.write(b"w" * 10)
        wb.wrote(f, 10010, last=True)  # the file is complete: whatever gathered goes
        assert path.stat().st_size == 10010
    assert path.read_bytes() == b"x" * 5000 + b"y" * 3000 + b"z" * 2000 + b"w" * 10


def test_files_without_writeback_are_left_alone(tmp_path):
    r, w = os.pipe()  # sync_file_range refuses a pipe (ESPIPE): nothing happens, nothing raises
    try:
        os.write(w, b"abc")
        start_writeback(w, 0, 3)
        assert os.read(r, 3) == b"abc"
    finally:
        os.close(r)
        os.close(w)
    fd = os.open(tmp_path, os.O_RDONLY)  # a folder, nothing to write: no call at all
    try:
        start_writeback(fd, 0, 0)
    finally:
        os.close(fd)


def test_every_must_be_positive():
    with pytest.raises(ValueError):
        Writeback(every=0)

"""Disk full and write errors: every conversion under a file-size limit (RLIMIT_FSIZE, SIGXFSZ
ignored so a write fails with EFBIG) and into a read-only directory stops with a one-line error
naming the path, leaves nothing a reader would accept, and a rerun with ``--resume`` after the
space is back ends identical to an uninterrupted run."""
from __future__ import annotations

import signal
import stat

import pytest

from packer.errors import PackerError
from packer.formats import open_reader
from tests.support.faults import CONVERSIONS, Conversion, leftovers, one_fast, snapshot
from tests.support.killing import run_packer
from tests.support.limits import file_size_limit, run_readonly


def assert_clean_failure(conv: Conversion, r, out) -> None:
    """Exit status 1, one ``Error:`` line naming the output, no traceback, nothing at ``out``."""
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, r.stderr
    assert out.name in errors[0], errors[0]
    assert not out.exists()  # nothing a reader would accept as the dataset
    with pytest.raises(PackerError):
        open_reader(out)


def assert_resumes_to_reference(conv: Conversion, src, out, reference) -> None:
    r = run_packer(*conv.argv(src, out, "--workers", 0, "--resume"))
    assert r.returncode == 0, r.stderr
    assert snapshot(conv, out) == reference
    assert leftovers(conv, out) == []


@pytest.mark.parametrize("conv", CONVERSIONS, ids=lambda c: c.id)
def test_file_size_limit_fails_cleanly_then_resumes(conv, sources, references, tmp_path):
    reference, biggest = references(conv)
    src, out = sources[conv.source], conv.out(tmp_path)
    r = run_packer(*conv.argv(src, out, "--workers", 0), preexec_fn=file_size_limit(biggest // 2))
    assert_clean_failure(conv, r, out)
    assert_resumes_to_reference(conv, src, out, reference)


def test_a_workers_part_file_past_the_size_limit_fails_cleanly_then_resumes(sources, references, tmp_path):
    """to-hdf5 --workers 2: the workers store the samples in part files of their own, which hit the
    limit before the output does (a part holds all a segment's bytes); the writer's process
    reports it in one line, and a resume in this process ends identical to the reference."""
    conv = next(c for c in CONVERSIONS if c.id == "to-hdf5")
    reference, biggest = references(conv)
    src, out = sources[conv.source], conv.out(tmp_path)
    r = run_packer(*conv.argv(src, out, "--workers", 2), preexec_fn=file_size_limit(biggest // 2))
    assert_clean_failure(conv, r, out)
    assert "write failed" in r.stderr, r.stderr
    assert_resumes_to_reference(conv, src, out, reference)


@pytest.mark.parametrize("conv", one_fast(CONVERSIONS))
def test_read_only_output_directory(conv, sources, references, tmp_path):
    reference, _ = references(conv)
    src, parent = sources[conv.source], tmp_path / "ro"
    parent.mkdir()
    out = conv.out(parent)
    # a fresh run into a read-only folder
    parent.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        assert_clean_failure(conv, run_readonly(conv.argv(src, out, "--workers", 0)), out)
    finally:
        parent.chmod(0o755)
    # a killed run whose partial output then turns read-only
    killed = run_packer(*conv.argv(src, out, "--workers", 0), kill_at="journal:3")
    assert killed.returncode == -signal.SIGKILL
    frozen = [parent, *(p for p in parent.rglob("*") if p.is_dir())]
    for p in frozen:
        p.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        assert_clean_failure(conv, run_readonly(conv.argv(src, out, "--workers", 0, "--resume")), out)
    finally:
        for p in frozen:
            p.chmod(0o755)
    assert_resumes_to_reference(conv, src, out, reference)

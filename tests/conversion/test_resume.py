"""Kill a real ``packer to-lmdb`` with SIGKILL at many points; ``--resume`` must end identical."""
from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from packer.formats import open_reader
from packer.formats.sidecars import partial_path
from tests.support.inputs import write_image_folder
from tests.support.killing import checkpoint_at_least, packer_cmd, run_and_kill, run_packer

pytestmark = pytest.mark.slow


def snapshot(out: Path):
    r = open_reader(out)
    values = [r.read(i) for i in range(len(r))]
    return {"keys": r.keys, "values": [(v.data, v.label, v.height, v.width, v.channels) for v in values],
            "checksums": (out / "checksums.bin").read_bytes(),
            "failures": (out / "failures.jsonl").read_text(), "count": r.manifest.count,
            "classes": r.manifest.classes}


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    root = write_image_folder(tmp_path_factory.mktemp("resume") / "src", count=120, classes=3, size=(160, 200))
    (root / "class_1" / "img_0050.jpg").write_bytes(b"broken")  # one bad input mid-way
    return root


@pytest.fixture(scope="module")
def reference(src, tmp_path_factory):
    out = tmp_path_factory.mktemp("ref") / "ref.lmdb"
    done = run_packer("to-lmdb", src, out, "--workers", 0, "--max-failures", 1)
    assert done.returncode == 0, done.stderr
    return snapshot(out)


@pytest.mark.parametrize("at", [0, 8, 40, 100])
@pytest.mark.parametrize("workers", [0, 2])
def test_kill_then_resume_is_identical(src, reference, tmp_path, at, workers):
    out = tmp_path / "out.lmdb"
    state = partial_path(out) / ".resume.json"
    base = ("to-lmdb", src, out, "--workers", workers, "--commit-every", 4, "--max-failures", 1)
    # held past the next commit after `at`: on a busy machine it could otherwise finish between polls
    assert run_and_kill(packer_cmd(*base), checkpoint_at_least(state, at), hold_at=at + 8), \
        "the run ended before the kill"
    assert not out.exists()  # nothing half-written is presented as a dataset
    # kill the resumed run too, once, a little further on: at its 12th sample past the first
    # kill's checkpoint, from inside (polling the checkpoint from here, a run resumed at 100 of
    # 120 small images could finish between two polls)
    resumed = json.loads(state.read_text())["samples"]
    again = run_packer(*base, "--resume", kill_at=f"add:{resumed + 12}")
    assert again.returncode == -signal.SIGKILL, "the resumed run ended before the second kill"
    done = run_packer(*base, "--resume")
    assert done.returncode == 0, done.stderr
    assert snapshot(out) == reference
    assert not partial_path(out).exists()
    leftovers = [p.name for p in out.iterdir() if p.name.startswith(".")]
    assert leftovers == []


def test_resume_on_finished_output_does_nothing(src, reference, tmp_path):
    out = tmp_path / "out.lmdb"
    assert run_packer("to-lmdb", src, out, "--workers", 0, "--max-failures", 1).returncode == 0
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    done = run_packer("to-lmdb", src, out, "--resume", "--max-failures", 1)
    assert done.returncode == 0 and "complete and verified" in done.stdout, done.stderr
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before


def test_resume_refuses_a_changed_input(src, tmp_path):
    out = tmp_path / "out.lmdb"
    state = partial_path(out) / ".resume.json"
    killed = run_and_kill(packer_cmd("to-lmdb", src, out, "--workers", 0, "--commit-every", 4,
                                     "--max-failures", 1), checkpoint_at_least(state, 8))
    assert killed
    other = tmp_path / "other"
    write_image_folder(other, count=5)
    before = {p.name: p.read_bytes() for p in partial_path(out).iterdir() if p.is_file()}
    done = run_packer("to-lmdb", other, out, "--resume")
    assert done.returncode == 2, done.stderr
    assert "inputs changed since the first run" in done.stderr
    assert {p.name: p.read_bytes() for p in partial_path(out).iterdir() if p.is_file()} == before

"""A split append's ``packer merge PARTS... OUT --append`` never costs OUT its version before it.

* A SIGKILL at any point of the merge (mid-batch, during a commit, before each rename or link
  of its publish) leaves OUT readable as version 1 (or, past the manifest's replace, as the whole
  version 2), ``packer verify`` passing; ``merge`` has no ``--resume``: rerunning it completes
  the version to what an uninterrupted one gives (which reads like one ``--append`` of the same
  inputs), with nothing left behind; a rerun after the publish finds it done.
* A reader opened before the merge, reading during and after it (the merge in another process),
  returns only version 1's samples or ``OutputChanged``.
"""
from __future__ import annotations

import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from packer.errors import OutputChanged
from packer.formats import FORMATS, open_reader
from tests.faults.test_faults_append import OLD, _argv, _copy, _leftovers, _out, _samples, _verified
from tests.support.inputs import write_image_folder
from tests.support.killing import packer_cmd, packer_env, run_packer

FMTS = sorted(FORMATS)
N = 2


@pytest.fixture(scope="module")
def split(tmp_path_factory):
    """``split(fmt) -> (v1, parts, reference)``: version 1 of 12 images, the parts of a split
    append of 5 more (a new class) planned against it, and one ``--append``'s result."""
    root, done = tmp_path_factory.mktemp("merge-append"), {}
    old = write_image_folder(root / "old", count=OLD, classes=3, size=(24, 32))
    late = write_image_folder(root / "late", count=5, classes=1, size=(24, 32), seed=5)

    def get(fmt: str) -> tuple[Path, list[Path], list]:
        if fmt not in done:
            src = root / fmt / "src"
            shutil.copytree(old, src, copy_function=shutil.copy2)
            v1 = _out(root / fmt, fmt, "v1")
            assert run_packer(*_argv(fmt, src, v1)).returncode == 0
            shutil.copytree(late / "class_0", src / "class_3", copy_function=shutil.copy2)
            ref = _copy(v1, root / fmt / "ref")
            assert run_packer(*_argv(fmt, src, ref, "--append")).returncode == 0
            parts = [_out(root / fmt, fmt, f"part{i}") for i in range(N)]
            for i, part in enumerate(parts):
                r = run_packer(*_argv(fmt, src, part, "--append-to", v1, "--num-shards", N, "--shard-index", i))
                assert r.returncode == 0, r.stderr
            done[fmt] = (v1, parts, _samples(ref))
        return done[fmt]

    return get


def _killed_then_completed(fmt: str, split, tmp_path: Path, point: str) -> bool:
    """Kill the merge at ``point``; OUT reads as version 1 or 2, whole; rerun it to the end.
    False when the merge finished before the kill point was reached."""
    v1, parts, reference = split(fmt)
    out = _copy(v1, tmp_path / point.replace(":", "-"))
    before = _samples(v1)
    killed = run_packer("merge", *parts, out, "--append", kill_at=point)
    if killed.returncode == 0:
        return False
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert _samples(out) in (before, reference), f"{point}: the output reads as neither version"
    assert _samples(out, version=1) == before
    _verified(out)
    again = run_packer("merge", *parts, out, "--append")
    assert again.returncode == 0, again.stderr
    assert _samples(out) == reference and _samples(out, version=1) == before
    assert open_reader(out).manifest.version == 2
    _verified(out)
    assert _leftovers(out) == []
    return True


@pytest.mark.parametrize("point", ["add:3", "journal:1"])
@pytest.mark.parametrize("fmt", FMTS)
def test_a_merge_append_killed_while_writing_keeps_the_last_version_and_reruns(fmt, point, split, tmp_path):
    assert _killed_then_completed(fmt, split, tmp_path, point)


@pytest.mark.parametrize("fmt", [f if f == "lmdb" else pytest.param(f, marks=pytest.mark.slow) for f in FMTS])
def test_a_merge_append_killed_at_each_step_of_its_publish_reruns(fmt, split, tmp_path):
    """Before every rename and link of the publish in turn, until the merge outlives them all."""
    steps = 0
    while _killed_then_completed(fmt, split, tmp_path, f"publish:{steps + 1}"):
        steps += 1
        assert steps < 40
    assert steps >= 3


@pytest.mark.parametrize("fmt", FMTS)
def test_a_reader_opened_before_a_merge_append_reads_only_its_version(fmt, split, tmp_path):
    v1, parts, reference = split(fmt)
    out = _copy(v1, tmp_path)
    before = _samples(out)
    reader = open_reader(out)
    proc = subprocess.Popen(packer_cmd("merge", *parts, out, "--append"), env=packer_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    while True:
        running = proc.poll() is None
        for i, (_, data, label) in enumerate(before):
            try:
                rec = reader.read(i)
            except OutputChanged:
                continue
            assert (bytes(rec.data), rec.label) == (data, label), f"sample {i} is not version 1's"
        if not running:
            break
    _, err = proc.communicate()
    assert proc.returncode == 0, err
    assert len(reader) == OLD and _samples(out) == reference

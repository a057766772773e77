"""Crash safety: SIGKILL every conversion command at many points (the writer's own, and seeded
random moments from outside), rerun with ``--resume``, and the output is identical to an
uninterrupted run, with no temporary files left and ``packer verify`` passing."""
from __future__ import annotations

import signal
import time

import pytest
from click.testing import CliRunner

from packer.cli import main
from tests.support.faults import CONVERSIONS, Conversion, leftovers, one_fast, snapshot
from tests.support.inputs import write_image_folder
from tests.support.killing import checkpoint_at_least, kill_at_random_moments, packer_cmd, run_and_kill, run_packer

# Where the writer dies: mid-batch, during a commit (data durable, journal not), between the
# two journals of one commit, with every input done before the publish starts, just before the
# final rename, right after it.
FAST_POINTS = ["journal:3"]
SLOW_POINTS = ["close:0", "rename:0", "add:1", "add:25", "journal:1", "journal:8", "renamed:0"]
KILL_POINTS = FAST_POINTS + [pytest.param(p, marks=pytest.mark.slow) for p in SLOW_POINTS]


def finish_and_check(conv: Conversion, src, out, reference, workers: int = 0) -> None:
    r = run_packer(*conv.argv(src, out, "--workers", workers, "--resume"))
    assert r.returncode == 0, r.stderr
    assert snapshot(conv, out) == reference
    assert leftovers(conv, out) == []
    v = CliRunner().invoke(main, ["verify", str(out)])
    assert v.exit_code == 0, v.output


@pytest.mark.parametrize("point", KILL_POINTS)
@pytest.mark.parametrize("conv", CONVERSIONS, ids=lambda c: c.id)
def test_kill_at_a_writer_point_then_resume(conv, point, sources, references, tmp_path):
    src, out = sources[conv.source], conv.out(tmp_path)
    killed = run_packer(*conv.argv(src, out, "--workers", 0), kill_at=point)
    assert killed.returncode == -signal.SIGKILL, f"the run ended before {point}: {killed.stderr}"
    if point != "renamed:0":
        assert not out.exists()  # nothing half-written is presented as a dataset
    finish_and_check(conv, src, out, references(conv)[0])


@pytest.mark.slow
@pytest.mark.parametrize("conv", CONVERSIONS, ids=lambda c: c.id)
def test_kill_from_outside_with_workers_twice_then_resume(conv, sources, references, tmp_path):
    """A user's ``kill -9`` of the whole process group (workers included), twice in a row."""
    src, out = sources[conv.source], conv.out(tmp_path)
    state = conv.state(out)
    field = "samples"
    assert run_and_kill(packer_cmd(*conv.argv(src, out, "--workers", 2)), checkpoint_at_least(state, 4, field))
    assert run_and_kill(packer_cmd(*conv.argv(src, out, "--workers", 2, "--resume")),
                        checkpoint_at_least(state, 16, field)), "the resumed run ended before the second kill"
    # The kill lands between two polls of the checkpoint: a small job can publish in that time,
    # and then OUT is whole. Either way the resume below must end identical to a lone run.
    finish_and_check(conv, src, out, references(conv)[0], workers=2)


@pytest.mark.slow
@pytest.mark.parametrize("conv", [c for c in CONVERSIONS if c.source == "images"], ids=lambda c: c.id)
def test_killed_at_random_moments_then_resumed(conv, tmp_path):
    """A ``kill -9`` at seeded random moments of the run, not only at the writer's points: inside
    a commit, an LMDB or HDF5 flush, a journal write, the publish. Every ``--resume`` ends
    identical to an uninterrupted run, verified, nothing left behind."""
    src = write_image_folder(tmp_path / "src", count=240, classes=3, size=(48, 64))
    ref = conv.out(tmp_path, "ref")
    start = time.monotonic()
    assert run_packer(*conv.argv(src, ref, "--workers", 0)).returncode == 0
    took, reference = time.monotonic() - start, snapshot(conv, ref)

    def run(n: int, until) -> bool:
        out = conv.out(tmp_path, f"t{n}")
        killed = run_and_kill(packer_cmd(*conv.argv(src, out, "--workers", 0)), until)
        finish_and_check(conv, src, out, reference)  # (a run that ended first: resumed as a finished output)
        return killed

    kill_at_random_moments(run, took, seed=0)


@pytest.mark.parametrize("point", ["journal:2", pytest.param("rename:0", marks=pytest.mark.slow),
                                   pytest.param("add:5", marks=pytest.mark.slow)])
@pytest.mark.parametrize("conv", one_fast([c for c in CONVERSIONS if c.source == "images"]))
def test_killed_merge_reruns_to_the_same_output(conv, point, sources, tmp_path):
    """``packer merge`` has no --resume: a killed merge leaves only its partial output, and the
    rerun starts over to the same result."""
    parts = [conv.out(tmp_path, f"part{i}") for i in range(2)]
    for i, part in enumerate(parts):
        r = run_packer(*conv.argv(sources["images"], part, "--workers", 0, "--num-shards", 2, "--shard-index", i))
        assert r.returncode == 0, r.stderr
    ref, out = conv.out(tmp_path, "ref"), conv.out(tmp_path, "out")
    assert run_packer("merge", *parts, ref).returncode == 0
    killed = run_packer("merge", *parts, out, kill_at=point)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert not out.exists()
    r = run_packer("merge", *parts, out)
    assert r.returncode == 0, r.stderr
    assert snapshot(conv, out) == snapshot(conv, ref) and leftovers(conv, out) == []

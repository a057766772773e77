"""An append never costs the version before it, and no reader ever sees a mix of two versions.

* A SIGKILL at any point of an ``--append`` (mid-batch, during a commit, before each rename or
  link of its publish, one by one, and at seeded random moments from outside) leaves the output
  readable as the previous version (or, past the manifest's replace, as the whole new one),
  ``packer verify`` passing; rerunning the ``--append`` (or ``--append --resume``) completes it
  to what an uninterrupted append gives, with nothing left behind.
* A reader opened before an append, reading during and after it (the append in another
  process), returns only its own version's samples or ``OutputChanged``; it goes on reading its
  version after the publish, and a reader opened after reads the new one.
* An append that differs from the interrupted one is started again (``--append``) or refused
  (``--append --resume``), the published version untouched.
"""
from __future__ import annotations

import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from packer.cli import main
from packer.errors import OutputChanged
from packer.formats import FORMATS, open_reader
from tests.support.inputs import write_image_folder
from tests.support.killing import kill_at_random_moments, packer_cmd, packer_env, run_and_kill, run_packer

FMTS = sorted(FORMATS)
OLD, NEW = 12, 5


def _out(root: Path, fmt: str, name: str = "out") -> Path:
    return root / (f"{name}.h5" if fmt == "hdf5" else f"{name}.{fmt}")


def _argv(fmt: str, src: Path, out: Path, *more) -> list:
    layout = ("--samples-per-shard", "2") if fmt == "records" else ("--commit-every", "2")
    return [f"to-{fmt}", str(src), str(out), "--workers", "0", *layout, *map(str, more)]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, Path]:
    """``old``: 12 images in 3 classes; ``late``: 5 more, a fourth class (copied in with mtimes)."""
    root = tmp_path_factory.mktemp("append-faults")
    old = write_image_folder(root / "old", count=OLD, classes=3, size=(24, 32))
    late = write_image_folder(root / "late", count=NEW, classes=1, size=(24, 32), seed=5)
    return {"old": old, "late": late / "class_0"}


@pytest.fixture(scope="module")
def built(inputs, tmp_path_factory):
    """``built(fmt) -> (src, v1, reference)``: the grown source tree, the output of the old
    inputs (version 1) and an uninterrupted append's result, made once per format."""
    root = tmp_path_factory.mktemp("append-built")

    def old(src: Path) -> None:
        shutil.copytree(inputs["old"], src, copy_function=shutil.copy2)

    def grow(src: Path) -> None:
        shutil.copytree(inputs["late"], src / "class_3", copy_function=shutil.copy2)

    return _builder(root, old, grow)


def _builder(root: Path, old: Any, grow: Any) -> Any:
    """``get(fmt) -> (src, v1, reference)``, made once per format: ``old(src)`` makes the source,
    packed as version 1; ``grow(src)`` grows it; the reference is an uninterrupted append."""
    done: dict[str, tuple[Path, Path, list]] = {}

    def get(fmt: str) -> tuple[Path, Path, list]:
        if fmt not in done:
            src = root / fmt / "src"
            old(src)
            v1 = _out(root / fmt, fmt, "v1")
            assert run_packer(*_argv(fmt, src, v1)).returncode == 0
            grow(src)
            ref = _copy(v1, root / fmt / "ref")
            r = run_packer(*_argv(fmt, src, ref, "--append"))
            assert r.returncode == 0, r.stderr
            done[fmt] = (src, v1, _samples(ref))
        return done[fmt]

    return get


def _copy(out: Path, folder: Path) -> Path:
    """A copy of a version 1 output (a folder, or one HDF5 file) in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    dst = folder / out.name
    if out.is_dir():
        shutil.copytree(out, dst, copy_function=shutil.copy2)
    else:
        shutil.copy2(out, dst)
        shutil.copy2(out.with_name(out.name + ".failures.jsonl"), folder / (out.name + ".failures.jsonl"))
    return dst


def _samples(out: Path, **kw) -> list[tuple]:
    r = open_reader(out, **kw)
    try:
        return [(k, bytes(rec.data), rec.label) for k, rec in zip(r.keys, (r.read(i) for i in range(len(r))))]
    finally:
        r.close()


def _verified(out: Path) -> None:
    v = CliRunner().invoke(main, ["verify", str(out)])
    assert v.exit_code == 0, v.output


def _leftovers(out: Path) -> list[str]:
    """Files of an append that a finished one must not leave: the partial, its journals, temporaries."""
    allowed = {out.name, out.name + ".failures.jsonl", out.name + ".parts"}
    extra = [p.name for p in out.parent.iterdir() if p.name.startswith(out.name) and p.name not in allowed]
    extra += [p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}")]
    for folder in (out, out.with_name(out.name + ".parts")):
        if folder.is_dir():
            extra += [p.relative_to(folder).as_posix() for p in folder.rglob("*")
                      if p.name.startswith(".") or ".tmp" in p.name or "place-" in p.name or p.name.endswith(".partial")]
    return extra


def _killed_then_completed(fmt, built, tmp_path: Path, point: str, *, resume: bool = False, argv=None,
                           samples=None) -> bool:
    """Kill an append at ``point``; the output reads as version 1 or 2, whole; rerun it to the
    end. False when the append finished before the kill point was reached. ``argv``,
    ``samples``: the command line and the reading of another kind of output (videos)."""
    argv, samples = argv or _argv, samples or _samples
    src, v1, reference = built(fmt)
    out = _copy(v1, tmp_path / point.replace(":", "-"))
    before = samples(v1)
    killed = run_packer(*argv(fmt, src, out, "--append"), kill_at=point)
    if killed.returncode == 0:
        return False
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    now = samples(out)
    assert now in (before, reference), f"{point}: the output reads as neither version"
    assert samples(out, version=1) == before
    _verified(out)
    again = run_packer(*argv(fmt, src, out, "--append", *(("--resume",) if resume else ())))
    assert again.returncode == 0, again.stderr
    assert samples(out) == reference and samples(out, version=1) == before
    _verified(out)
    assert _leftovers(out) == []
    return True


POINTS = ["add:3", "journal:2", pytest.param("add:1", marks=pytest.mark.slow),
          pytest.param("journal:5", marks=pytest.mark.slow)]


@pytest.mark.parametrize("point", POINTS)
@pytest.mark.parametrize("fmt", FMTS)
def test_an_append_killed_while_packing_keeps_the_last_version_and_completes(fmt, point, built, tmp_path):
    assert _killed_then_completed(fmt, built, tmp_path, point)


@pytest.mark.parametrize("fmt", [f if f == "lmdb" else pytest.param(f, marks=pytest.mark.slow) for f in FMTS])
def test_an_append_killed_at_each_step_of_its_publish_completes(fmt, built, tmp_path):
    """Before every rename and link of the publish in turn, until the append outlives them all."""
    steps = 0
    while _killed_then_completed(fmt, built, tmp_path, f"publish:{steps + 1}", resume=steps % 2 == 1):
        steps += 1
        assert steps < 40
    assert steps >= 4  # data or shards, sidecars, versions/, the manifest (HDF5: parts, head)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FMTS)
def test_an_append_killed_at_random_moments_completes(fmt, tmp_path):
    """A ``kill -9`` at seeded random moments of an append (inside a commit, a flush, the
    publish), not only at its points: the output reads as version 1 or 2, whole, verified, and
    the rerun (``--append``, or ``--append --resume``) ends at an uninterrupted append's result."""
    src = write_image_folder(tmp_path / "src", count=160, classes=3, size=(48, 64))
    v1 = _out(tmp_path, fmt, "v1")
    assert run_packer(*_argv(fmt, src, v1)).returncode == 0
    shutil.copytree(write_image_folder(tmp_path / "late", count=160, classes=1, size=(48, 64), seed=5) / "class_0",
                    src / "class_3", copy_function=shutil.copy2)
    before, ref = _samples(v1), _copy(v1, tmp_path / "ref")
    start = time.monotonic()
    assert run_packer(*_argv(fmt, src, ref, "--append")).returncode == 0
    took, reference = time.monotonic() - start, _samples(ref)

    def run(n: int, until) -> bool:
        out = _copy(v1, tmp_path / f"t{n}")
        killed = run_and_kill(packer_cmd(*_argv(fmt, src, out, "--append")), until)
        assert _samples(out) in (before, reference) and _samples(out, version=1) == before
        _verified(out)
        again = run_packer(*_argv(fmt, src, out, "--append", *(("--resume",) if n % 2 else ())))
        assert again.returncode == 0, again.stderr
        assert _samples(out) == reference and _samples(out, version=1) == before
        _verified(out)
        assert _leftovers(out) == []
        return killed

    kill_at_random_moments(run, took, seed=1)


def test_a_different_append_over_an_interrupted_one(built, tmp_path):
    """``--append`` starts an interrupted append again when this one differs (its inputs
    changed); ``--append --resume`` refuses, naming the difference; the version stays."""
    src, v1, _ = built("lmdb")
    own = tmp_path / "src"
    shutil.copytree(src, own, copy_function=shutil.copy2)
    out = _copy(v1, tmp_path / "o")
    before = _samples(out)
    killed = run_packer(*_argv("lmdb", own, out, "--append"), kill_at="journal:3")
    assert killed.returncode == -signal.SIGKILL
    shutil.copy2(own / "class_3" / "img_0001.jpg", own / "class_3" / "img_0009.jpg")
    refused = run_packer(*_argv("lmdb", own, out, "--append", "--resume"))
    assert refused.returncode == 2 and "1 inputs new, e.g. class_3/img_0009.jpg" in refused.stderr, refused.stderr
    assert _samples(out) == before
    done = run_packer(*_argv("lmdb", own, out, "--append"))
    assert done.returncode == 0, done.stderr
    assert len(open_reader(out)) == OLD + NEW + 1 and _samples(out, version=1) == before
    _verified(out)


@pytest.mark.parametrize("fmt", FMTS)
def test_a_reader_opened_before_an_append_reads_only_its_version(fmt, built, tmp_path):
    """The append runs in another process while this one reads, over and over, every sample of
    a reader opened before it: each read is version 1's sample or OutputChanged, never
    another; after the publish the old reader still reads version 1, a new one version 2."""
    src, v1, reference = built(fmt)
    out = _copy(v1, tmp_path)
    before = _samples(out)
    reader = open_reader(out)
    assert [(k, bytes(reader.read(i).data), reader.read(i).label) for i, k in enumerate(reader.keys)] == before
    proc = subprocess.Popen(packer_cmd(*_argv(fmt, src, out, "--append")), env=packer_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    passes = 0
    while True:
        running = proc.poll() is None
        for i, (key, data, label) in enumerate(before):
            try:
                rec = reader.read(i)
            except OutputChanged:
                continue
            assert (bytes(rec.data), rec.label) == (data, label), f"sample {i} is not version 1's"
        passes += 1
        if not running:
            break
    _, err = proc.communicate()
    assert proc.returncode == 0, err
    assert len(reader) == OLD and [(k, bytes(reader.read(i).data), reader.read(i).label)
                                   for i, k in enumerate(reader.keys)] == before
    assert _samples(out) == reference and passes >= 1
    reopened = open_reader(out, version=1)
    assert [bytes(reopened.read(i).data) for i in range(OLD)] == [d for _, d, _ in before]


def test_an_unfinished_rewrite_beside_the_output_is_not_taken_for_an_append(built, tmp_path):
    """A killed ``--overwrite`` left its partial beside OUT: ``--append`` refuses it, naming it,
    instead of discarding it, and leaves both as they are."""
    src, v1, _ = built("records")
    out = _copy(v1, tmp_path)
    killed = run_packer(*_argv("records", src, out, "--overwrite"), kill_at="journal:2")
    assert killed.returncode == -signal.SIGKILL
    partial = out.with_name(out.name + ".partial")
    before = sorted(p.name for p in partial.iterdir())
    r = run_packer(*_argv("records", src, out, "--append"))
    assert r.returncode == 1 and "is an unfinished run that rewrites the output, not an append" in r.stderr, r.stderr
    assert sorted(p.name for p in partial.iterdir()) == before and len(open_reader(out)) == OLD


@pytest.fixture(scope="module")
def built_shards(inputs, tmp_path_factory):
    """``built`` for a WebDataset source grown by a shard: ``(src, v1, reference)`` per format."""
    pytest.importorskip("webdataset")
    from tests.support.sources import write_shards

    root = tmp_path_factory.mktemp("append-shards")
    tree = root / "tree"
    shutil.copytree(inputs["old"], tree, copy_function=shutil.copy2)
    shutil.copytree(inputs["late"], tree / "class_3", copy_function=shutil.copy2)
    shards = write_shards(tree, root / "all", per_shard=6, cls=True)  # 17 samples: 3 shards

    def old(src: Path) -> None:
        src.mkdir(parents=True)
        for s in shards[:2]:
            shutil.copy2(s, src / s.name)

    return _builder(root, old, lambda src: shutil.copy2(shards[2], src / shards[2].name))


@pytest.mark.parametrize("point", ["add:3", "close:0", pytest.param("journal:2", marks=pytest.mark.slow),
                                   pytest.param("publish:2", marks=pytest.mark.slow)])
@pytest.mark.parametrize("fmt", FMTS)
def test_a_source_append_killed_keeps_the_last_version_and_completes(fmt, point, built_shards, tmp_path):
    """The same for a dataset source grown by a tar shard (its samples told by the shard's stat)."""
    assert _killed_then_completed(fmt, built_shards, tmp_path, point)

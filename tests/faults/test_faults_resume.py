"""``--resume`` never mixes two datasets and never calls unchecked output checked.

* An interrupted run resumed with any option that changes the stored bytes, or over changed
  inputs, is refused before any work: exit 2, one line naming each difference, and the partial
  output left byte for byte as it was.
* ``--resume`` of a finished output verifies every checksum and the fingerprint in its manifest:
  each kind of damage, other inputs or other options is refused and the output left untouched;
  an intact output made by the same command is reported "complete and verified".
"""
from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

import pytest

from packer.formats import open_reader
from tests.support.faults import CONVERSIONS, Conversion
from tests.support.killing import run_packer


def _conv(cid: str) -> Conversion:
    return next(c for c in CONVERSIONS if c.id == cid)


def _state_of(out: Path) -> dict[str, bytes]:
    """Every byte of everything the run keeps under ``out``'s name (partial, journal, output;
    not the claim file ``OUT.lock``, which a refused run may take over from a dead one)."""
    found = {}
    for p in sorted(out.parent.iterdir()):
        if p.name.startswith(out.name) and p.name != out.name + ".lock":
            for f in ([p] if p.is_file() else sorted(p.rglob("*"))):
                if f.is_file():
                    found[str(f.relative_to(out.parent))] = f.read_bytes()
    return found


# (conversion, the first run's extra options, the resumed run's, the line the refusal must hold)
IMAGES = ("--short-side", 32)
FRAMES = ()
CHANGED = [
    ("to-lmdb", IMAGES, ("--short-side", 24), "--short-side: 32 -> 24"),
    ("to-lmdb", IMAGES, ("--short-side", 32, "--quality", 50), "--quality: "),
    ("to-lmdb", IMAGES, ("--short-side", 32, "--format", "png"), "--format: "),
    ("to-lmdb", IMAGES, ("--max-side", 32), "--max-side: (unset) -> 32"),
    ("to-lmdb", IMAGES, ("--short-side", 32, "--check", "header"), '--check: "full" -> "header"'),
    ("to-lmdb", IMAGES, ("--short-side", 32, "--ext", "jpg"), "--ext: "),
    ("decode-frames-records", FRAMES, ("--commit-every", 5), "--commit-every: 4 -> 5"),  # a commit is a shard
    ("to-lmdb", IMAGES, ("--short-side", 32, "--shuffle", 3), "--shuffle: (unset) -> 3"),
    ("to-hdf5", IMAGES, ("--size", "24x24"), "--size: (unset) -> [24, 24]"),
    ("to-records", IMAGES, ("--short-side", 32, "--samples-per-shard", 5), "--samples-per-shard: 4 -> 5"),
    ("to-records", IMAGES, ("--short-side", 32, "--name", "val"), '--name: "train" -> "val"'),
    ("to-records", IMAGES, ("--short-side", 32, "--shard-size", "1MB"), "--shard-size: "),
    ("decode-frames-frames", FRAMES, ("--stride", 2), "--stride: (unset) -> 2"),
    ("decode-frames-frames", FRAMES, ("--fps", 5), "--fps: (unset) -> 5"),
    ("decode-frames-frames", FRAMES, ("--max-frames", 4), "--max-frames: (unset) -> 4"),
    ("decode-frames-frames", FRAMES, ("--short-side", 24), "--short-side: (unset) -> 24"),
    ("decode-frames-frames", FRAMES, ("--size", "32x24"), "--size: (unset) -> [32, 24]"),
    ("decode-frames-frames", FRAMES, ("--quality", 80), "--quality: 95 -> 80"),
    ("decode-frames-frames", FRAMES, ("--ext", "png"), '--ext: "jpg" -> "png"'),
    ("decode-frames-frames", FRAMES, ("--tmpl", "f_{:04d}.jpg"), "--tmpl: "),
    ("decode-frames-frames", FRAMES, ("--start-index", 0), "--start-index: 1 -> 0"),
    ("decode-frames-frames", FRAMES, ("--backend", "opencv"), '--backend: "auto" -> "opencv"'),
    ("decode-frames-lmdb", FRAMES, ("--stride", 3), "--stride: (unset) -> 3"),
]


def _interrupted(conv: Conversion, src: Path, out: Path, *first, at: str = "journal:2") -> None:
    killed = run_packer(*conv.argv(src, out, "--workers", 0, *first), kill_at=at)
    assert killed.returncode == -signal.SIGKILL, f"the run ended before the kill: {killed.stderr}"


@pytest.mark.parametrize("cid,first,changed,line", [
    pytest.param(*c, id=f"{c[0]}{''.join(map(str, c[2]))}", marks=() if c[2] in (("--short-side", 24), ("--stride", 2)) else pytest.mark.slow)
    for i, c in enumerate(CHANGED)])
def test_resume_with_a_changed_option_is_refused(cid, first, changed, line, sources, tmp_path):
    conv = _conv(cid)
    src, out = sources[conv.source], conv.out(tmp_path)
    _interrupted(conv, src, out, *first)
    before = _state_of(out)
    # the changed options come last, so they win over the conversion's own
    r = run_packer(*conv.argv(src, out, "--workers", 0, "--resume", *changed))
    assert r.returncode == 2, r.stderr
    assert line in r.stderr and "cannot resume" in r.stderr, r.stderr
    assert _state_of(out) == before  # refused before any work
    done = run_packer(*conv.argv(src, out, "--workers", 0, "--resume", *first))
    assert done.returncode == 0, done.stderr  # the first run's options still resume it


@pytest.mark.parametrize("change", ["touched", "label", "removed", "added"])
def test_resume_over_changed_inputs_names_one(change, tmp_path):
    from tests.support.inputs import write_image_folder

    conv = _conv("to-lmdb")
    src = write_image_folder(tmp_path / "src", count=30, classes=3, size=(40, 52))
    out = conv.out(tmp_path)
    _interrupted(conv, src, out, at="add:9")  # two commits of 4 stored
    victim = src / "class_1" / "img_0004.jpg"
    if change == "touched":  # a file already stored (an input not reached yet may change)
        stored = src / "class_0" / "img_0000.jpg"
        os.utime(stored, ns=(stored.stat().st_atime_ns, stored.stat().st_mtime_ns + 10**9))
        expect = "1 inputs changed since the first run (size or mtime), e.g. class_0/img_0000.jpg"
    elif change == "label":
        shutil.move(victim, src / "class_2" / victim.name)
        expect = "1 inputs gone, e.g. class_1/img_0004.jpg; 1 inputs new, e.g. class_2/img_0004.jpg"
    elif change == "removed":
        victim.unlink()
        expect = "1 inputs gone, e.g. class_1/img_0004.jpg"
    else:
        shutil.copy(victim, src / "class_0" / "new.jpg")
        expect = "1 inputs new, e.g. class_0/new.jpg"
    before = _state_of(out)
    r = run_packer(*conv.argv(src, out, "--workers", 0, "--resume"))
    assert r.returncode == 2 and expect in r.stderr, r.stderr
    assert _state_of(out) == before


def _flip(path: Path, at: float = 0.5) -> None:
    data = bytearray(path.read_bytes())
    data[int(len(data) * at)] ^= 0x55
    path.write_bytes(bytes(data))


def _largest(out: Path, suffix: str = "") -> Path:
    files = [out] if out.is_file() else [p for p in out.rglob("*") if p.is_file() and p.name.endswith(suffix)
                                         and p.name not in ("packer.json", "failures.jsonl", "lock.mdb")]
    return max(files, key=lambda p: p.stat().st_size)


def _damage(kind: str, conv: Conversion, out: Path, src: Path, tmp: Path) -> tuple[Path, str]:
    """Apply one kind of damage or change; return the source to resume from and the expected text."""
    if kind == "checksums":
        sidecar = next((p for p in out.rglob("checksums.bin")), None) or _largest(out, ".idx")
        _flip(sidecar, 0.0)
        return src, "fails verification"
    if kind == "data":  # one byte inside a stored sample (found by its bytes)
        r = open_reader(out)
        sample = r.read(len(r) // 2).data
        r.close()
        files = [out] if out.is_file() else [p for p in out.rglob("*") if p.is_file()]
        for f in files:
            raw = bytearray(f.read_bytes())
            at = raw.find(sample)
            if at >= 0:
                raw[at + len(sample) // 2] ^= 0x55
                f.write_bytes(bytes(raw))
                return src, "fails verification"
        raise AssertionError("the sample's bytes are not stored as they are")
    if kind == "other-input":
        other = tmp / "other"
        shutil.copytree(src, other)
        victim = sorted(p for p in other.rglob("*") if p.is_file())[0]
        victim.unlink()
        return other, "inputs changed since the first run"
    if kind == "option":
        return src, OTHER_OPTION[conv.id][1]
    raise AssertionError(kind)


OTHER_OPTION = {"to-lmdb": (("--check", "header"), '--check: "full" -> "header"'),
                "to-hdf5": (("--check", "none"), '--check: "full" -> "none"'),
                "to-records": (("--samples-per-shard", 7), "--samples-per-shard: 4 -> 7"),
                "decode-frames-frames": (("--quality", 80), "--quality: 95 -> 80")}


# A single HDF5 file keeps its checksums inside: its sidecar damage is the "data" case.
@pytest.mark.parametrize("cid,kind", [pytest.param(c, k, marks=() if c == "to-lmdb" else pytest.mark.slow)
                                      for c in OTHER_OPTION for k in ("checksums", "data", "other-input", "option")
                                      if not (c == "to-hdf5" and k == "checksums")])
def test_resume_of_a_finished_output_verifies_it(cid, kind, sources, tmp_path):
    conv = _conv(cid)
    src, out = sources[conv.source], conv.out(tmp_path)
    assert run_packer(*conv.argv(src, out, "--workers", 0)).returncode == 0
    ok = run_packer(*conv.argv(src, out, "--workers", 0, "--resume"))
    assert ok.returncode == 0 and "complete and verified" in ok.stdout, ok.stderr
    src2, expect = _damage(kind, conv, out, src, tmp_path)
    before = _state_of(out)
    extra = OTHER_OPTION[cid][0] if kind == "option" else ()
    r = run_packer(*conv.argv(src2, out, "--workers", 0, "--resume", *extra))
    assert r.returncode in (1, 2) and "nothing to do" not in r.stdout, r.stdout
    assert expect in r.stderr, r.stderr
    assert r.returncode == (2 if kind in ("other-input", "option") else 1)
    assert _state_of(out) == before

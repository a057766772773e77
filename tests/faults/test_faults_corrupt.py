"""Corrupt packed data: hypothesis flips, zeroes and truncates bytes of every file of every
packed output (LMDB values, HDF5 files, frame files, packer.json, keys.json, checksums.bin, the
rawframes list). Every reader and ``verify`` either returns the right sample bytes or raises a
``PackerError`` naming the file (and the position) — never another exception, never wrong
bytes, labels, keys or classes returned silently, and ``verify`` never says OK about a damaged
sample."""
from __future__ import annotations

import collections
import dataclasses
import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packer.commands.decode_frames import decode_frames
from packer.errors import PackerError
from packer.formats import FORMATS, VIDEO_FORMATS, open_reader
from packer.formats.lmdb import close_env, lmdb_key, open_env
from packer.commands.inspection import verify_dataset
from packer.commands.pack_images import pack_images
from packer.conversion.options import RunOptions
from tests.support.inputs import write_image_folder, write_video_folder

OPS = ("flip", "zero", "truncate")
STATS: collections.Counter = collections.Counter()  # outcomes; PACKER_FAULT_STATS=FILE writes them


@pytest.fixture(scope="module", autouse=True)
def _write_stats():
    yield
    if os.environ.get("PACKER_FAULT_STATS"):
        with open(os.environ["PACKER_FAULT_STATS"], "a") as f:
            f.write(json.dumps(dict(STATS)) + "\n")


def _build(kind: str, fmt: str, root: Path) -> Path:
    if kind == "images":
        src = write_image_folder(root / "src", count=12, classes=3, size=(32, 40))
        out = root / ("out.h5" if FORMATS[fmt][0].single_file else f"out.{fmt}")
        pack_images(src, out, format=fmt, writer_options={"commit_every": 5}, run_options=RunOptions(workers=0))
    else:
        src = write_video_folder(root / "src", per_class=1, classes=2, frames=6, size=(32, 40))
        out = root / ("out.h5" if fmt == "hdf5" else f"out.{fmt}")
        decode_frames(src, out, to=fmt, run_options=RunOptions(workers=0, timeout=600.0))
    return out


OUTPUTS = [("images", name) for name in FORMATS] + [("videos", name) for name in VIDEO_FORMATS]
# TODO(records): ("images", "records") joins through FORMATS; its targets are the shards and
# their .idx files (picked up by `targets` below since they are files of the output).


@pytest.fixture(scope="module", params=OUTPUTS, ids=lambda p: f"{p[0]}-{p[1]}")
def packed(request, tmp_path_factory):
    kind, fmt = request.param
    out = _build(kind, fmt, tmp_path_factory.mktemp(f"{kind}-{fmt}"))
    r = open_reader(out)
    ref = Reference([r.read(i) for i in range(len(r))], list(r.keys), list(r.classes))
    r.close()
    return out, ref, fmt


@dataclasses.dataclass
class Reference:
    """What an undamaged output returns: every record (bytes, label, ...), the keys, the classes."""

    records: list
    keys: list
    classes: list

    def __len__(self) -> int:
        return len(self.records)


def targets(out: Path) -> list[tuple[str, tuple[int, int] | None]]:
    """The files to damage (relative names) and, for data.mdb, the byte ranges of the values."""
    if out.is_file():
        return [("", None)]
    found = []
    for p in sorted(out.rglob("*")):
        if not p.is_file() or p.name in ("lock.mdb", "failures.jsonl"):
            continue
        rel = p.relative_to(out).as_posix()
        if p.name == "data.mdb":  # LMDB values: flips inside B-tree pages are LMDB's own business
            found += [(rel, r) for r in _lmdb_value_ranges(out)]
        elif p.suffix == ".jpg" and not rel.endswith("/img_00001.jpg"):
            continue  # one frame file per video is enough
        else:
            found.append((rel, None))
    return found


def _lmdb_value_ranges(out: Path) -> list[tuple[int, int]]:
    raw = (out / "data.mdb").read_bytes()
    ranges = []
    with open_env(out).begin() as txn:
        for i in range(txn.stat()["entries"]):
            v = txn.get(lmdb_key(i))
            at = raw.find(v)
            if at >= 0:
                ranges.append((at, at + len(v)))
    close_env(out)
    return ranges


def damage(path: Path, op: str, where: float, n: int, region: tuple[int, int] | None) -> None:
    data = bytearray(path.read_bytes())
    lo, hi = region or (0, len(data))
    if hi <= lo:
        return
    pos = lo + min(hi - lo - 1, int(where * (hi - lo)))
    if op == "flip":
        for k in range(min(n, hi - pos)):
            data[pos + k] ^= 1 << (k % 8)
    elif op == "zero":
        data[pos:min(hi, pos + n)] = bytes(min(hi, pos + n) - pos)
    else:
        del data[pos:]
    path.write_bytes(bytes(data))


def check_reads(out: Path, ref: "Reference") -> bool:
    """Read everything back (samples, labels, keys, classes); True when all came back right.
    Damage may only show as a ``PackerError`` naming the file: any other exception fails the
    test, and so does a wrong value returned silently."""
    try:
        r = open_reader(out)
        n = len(r)
        keys, classes = list(r.keys), list(r.classes)
    except PackerError as e:
        assert str(out) in str(e) or out.name in str(e), e
        return False
    assert n == len(ref), f"{n} samples, {len(ref)} packed: a wrong count returned silently"
    assert keys == ref.keys, "wrong keys returned silently"
    assert classes == ref.classes, "wrong class names returned silently"
    intact = True
    try:
        for i in range(n):
            try:
                rec = r.read(i)
            except PackerError as e:
                assert out.name in str(e), e  # names the file
                intact = False
                continue
            want = ref.records[i]
            assert rec.data == want.data, f"sample {i}: wrong bytes returned silently"
            assert rec.label == want.label, f"sample {i}: wrong label returned silently"
    finally:
        r.close()
    return intact


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(pick=st.integers(0, 10_000), op=st.sampled_from(OPS), where=st.floats(0, 1), n=st.integers(1, 16))
def test_damage_is_caught_or_harmless(packed, pick, op, where, n):
    out, ref, fmt = packed
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / out.name
        (shutil.copy if out.is_file() else shutil.copytree)(out, copy)
        rel, region = (choices := targets(copy))[pick % len(choices)]
        damage(copy / rel if rel else copy, op, where, n, region)
        intact = check_reads(copy, ref)
        result = verify_dataset(copy)  # never raises: problems, or OK
        target = Path(rel).suffix or Path(rel).name or "h5"
        STATS[f"{fmt}:{target}:{op}:{'caught' if not result.ok else 'harmless'}"] += 1
        if result.ok:
            assert intact, f"verify said OK about damaged {rel or copy.name}"
        for p in result.problems:
            assert copy.name in p, p


def test_a_repacked_lmdb_is_not_read_through_the_old_map(tmp_path):
    """Pack, read, re-pack other images into the same path, read again in the same process."""
    out = tmp_path / "out.lmdb"
    pack_images(write_image_folder(tmp_path / "a", count=4, classes=1), out, run_options=RunOptions(workers=0))
    first = open_reader(out).read(0).data
    pack_images(write_image_folder(tmp_path / "b", count=4, classes=1, seed=7), out,
                run_options=RunOptions(workers=0, overwrite=True))
    assert open_reader(out).read(0).data != first

"""``packer export`` under damage, kills and contention: a damaged sample of any format is a
recorded failure naming its position and key, never exported (every other sample is); a real
SIGKILL at any shard boundary or around the final rename, then ``--resume``, gives the same bytes
as an uninterrupted export; a resume of another pack or with other options, and an export into an
output another run holds, are refused."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import packer
from packer.claim import claim_output
from packer.commands.export import load_export
from packer.errors import OutputClaimed
from packer.formats import FORMATS, open_reader
from packer.formats.lmdb.env import close_env
from tests.support.inputs import write_image_folder
from tests.support.killing import run_packer

pytest.importorskip("pyarrow")

ALL = sorted(FORMATS)
TARGETS = ["wds", "parquet"]
DAMAGED = 5  # the position whose stored bytes are flipped


def out_path(root: Path, fmt: str, name: str) -> Path:
    return root / (f"{name}.h5" if FORMATS[fmt][0].single_file else name)


@pytest.fixture(scope="module")
def packs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("export-faults")
    src = write_image_folder(root / "src", count=14, classes=2)
    outs = {}
    for fmt in ALL:
        outs[fmt] = out_path(root, fmt, fmt)
        packer.pack(src, outs[fmt], format=fmt, workers=0, **({"samples_per_shard": 4} if fmt == "records" else {}))
    return outs


def damaged_copy(pack: Path, fmt: str, tmp_path: Path) -> tuple[Path, bytes, str]:
    """A copy of ``pack`` with one bit flipped inside sample DAMAGED's stored image bytes (where
    the format keeps them: data.mdb, the HDF5 file, a TFRecord shard); its bytes and key."""
    copy = tmp_path / pack.name
    (shutil.copytree if pack.is_dir() else shutil.copy2)(pack, copy)
    r = open_reader(copy)
    data, key = bytes(r.read(DAMAGED).data), r.keys[DAMAGED]
    r.close()
    if fmt == "lmdb":
        close_env(copy)
    files = [copy] if copy.is_file() else [p for p in copy.iterdir() if p.is_file()]
    hits = [(p, p.read_bytes().find(data)) for p in files]
    path, at = next((p, at) for p, at in hits if at >= 0)
    raw = bytearray(path.read_bytes())
    raw[at + len(data) // 2] ^= 0x10
    path.write_bytes(bytes(raw))
    return copy, data, key


def exported_bytes(out: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(out.glob("shard-*")))


@pytest.mark.parametrize("to", TARGETS)
@pytest.mark.parametrize("fmt", ALL)
def test_a_damaged_sample_is_recorded_never_exported(packs, tmp_path, fmt, to):
    bad, data, key = damaged_copy(packs[fmt], fmt, tmp_path)
    out = tmp_path / "out"
    with pytest.raises(packer.TooManyFailures) as e:
        packer.export(bad, out, to=to, samples_per_shard=4)
    report = e.value.report
    assert report.count == 13 and report.items == 14 and report.failed == 1
    (failure,) = [json.loads(line) for line in (out / "failures.jsonl").read_text().splitlines()]
    assert failure["key"] == key and failure["position"] == DAMAGED and failure["stage"] == "read"
    assert repr(key) in failure["reason"] and "CRC32C mismatch" in failure["reason"]  # file, place, key
    record = load_export(out)
    assert record["count"] == 13 and record["failures"] == 1
    assert [s["count"] for s in record["shards"]] == [4, 4, 4, 1]  # the damaged one left out
    tail = data[-80:-16]  # its (unflipped, entropy-coded) last bytes are nowhere
    assert tail not in exported_bytes(out)
    good = packer.export(packs[fmt], tmp_path / "good", to=to, samples_per_shard=4)
    assert good.count == 14 and good.failed == 0 and tail in exported_bytes(tmp_path / "good")
    allowed = packer.export(bad, tmp_path / "allowed", to=to, samples_per_shard=4, max_failures=1)
    assert allowed.count == 13 and allowed.failed == 1


@pytest.mark.parametrize("to", TARGETS)
@pytest.mark.parametrize("bad", ["blob", "int", "ndarray", "str", "json"])
def test_a_malformed_field_under_a_good_checksum_is_recorded_never_exported(tmp_path, bad, to):
    """A field pack whose sample 1 was stored malformed (its CRC32C covers the bad bytes): the
    export records it at stage read, naming the field, and exports the other samples."""
    import numpy as np
    from PIL import Image

    from packer.codecs.fields import BLOB_FMT, Schema, encode_blob
    from packer.formats.sample import Sample

    schema = Schema({"image": "image", "id": "int", "box": "ndarray:float32:*,4", "text": "str", "meta": "json"})
    png = tmp_path / "a.png"
    Image.new("RGB", (6, 4), (9, 8, 7)).save(png)
    good = {"image": png.read_bytes(), "id": 7, "box": np.ones((2, 4), np.float32), "text": "ok", "meta": {"a": 1}}
    parts = [f.encode(good[f.name]) for f in schema.fields]
    broken = list(parts)
    if bad == "blob":
        blob = encode_blob(broken)[:-3]  # sizes that do not add up
    else:
        at = schema.names.index({"int": "id", "ndarray": "box", "str": "text", "json": "meta"}[bad])
        broken[at] = {"int": b"\x01\x02\x03", "ndarray": b"\x00" * 10, "str": b"\xff\xfe", "json": b"{oops"}[bad]
        blob = encode_blob(broken)
    pack = tmp_path / "fields"
    writer = FORMATS["lmdb"][0](pack, classes=[])
    writer.schema = schema
    with writer:
        for i, data in enumerate([encode_blob(parts), blob, encode_blob(parts)]):
            writer.add(Sample(f"s{i}.png", data, BLOB_FMT, -1, 4, 6, 3))
        writer.close()
    report = packer.export(pack, tmp_path / "out", to=to, max_failures=1)
    assert report.count == 2 and report.failed == 1
    (failure,) = report.failures
    assert failure["position"] == 1 and failure["key"] == "s1.png" and failure["stage"] == "read"
    assert "malformed field" in failure["reason"] and "'s1.png'" in failure["reason"]
    assert [s["count"] for s in load_export(tmp_path / "out")["shards"]] == [2]


def _files(out: Path) -> dict[str, bytes]:
    """An export's files; its record without ``created_by`` (the command line differs: --resume)."""
    got = {p.name: p.read_bytes() for p in sorted(out.iterdir())}
    record = json.loads(got.pop("export.json"))
    del record["created_by"], record["checksum"]
    return {**got, "export.json": json.dumps(record, sort_keys=True).encode()}


@pytest.fixture(scope="module")
def references(packs, tmp_path_factory) -> dict[str, dict[str, bytes]]:
    root = tmp_path_factory.mktemp("export-refs")
    refs = {}
    for to in TARGETS:
        done = run_packer("export", packs["lmdb"], root / to, "--to", to, "--samples-per-shard", "3")
        assert done.returncode == 0, done.stderr
        refs[to] = _files(root / to)
    return refs


# journal:N dies before the Nth shard is journaled (it is written and renamed, not recorded);
# rename/renamed die before and after the final rename of OUT.partial to OUT
POINTS = ["journal:1", "journal:3", "journal:5", "rename:0", "renamed:0"]


@pytest.mark.parametrize("to", TARGETS)
@pytest.mark.parametrize("point", POINTS)
def test_a_killed_export_resumes_to_the_same_bytes(packs, references, tmp_path, point, to):
    out = tmp_path / "out"
    args = ["export", packs["lmdb"], out, "--to", to, "--samples-per-shard", "3"]
    killed = run_packer(*args, kill_at=point)
    assert killed.returncode != 0
    assert out.exists() == (point == "renamed:0")
    partial = out.with_name("out.partial")
    if point.startswith("journal"):  # a shard cut short by the kill, as a kill mid-write leaves it
        (partial / f".shard-000009{'.tar' if to == 'wds' else '.parquet'}.tmp").write_bytes(b"half a shard")
    resumed = run_packer(*args, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert ("complete and verified" in resumed.stdout) == (point == "renamed:0")
    assert not partial.exists() and _files(out) == references[to]


def test_a_changed_shard_in_the_partial_is_written_again(packs, references, tmp_path):
    out = tmp_path / "out"
    args = ["export", packs["lmdb"], out, "--to", "wds", "--samples-per-shard", "3"]
    assert run_packer(*args, kill_at="journal:4").returncode != 0
    shard = out.with_name("out.partial") / "shard-000001.tar"
    raw = bytearray(shard.read_bytes())
    raw[1000] ^= 0x01
    shard.write_bytes(bytes(raw))
    resumed = run_packer(*args, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert _files(out) == references["wds"]


def test_a_resume_of_another_pack_or_options_is_refused(packs, tmp_path):
    out = tmp_path / "out"
    args = ["export", packs["lmdb"], out, "--to", "wds"]
    assert run_packer(*args, "--samples-per-shard", "3", kill_at="journal:2").returncode != 0
    partial = out.with_name("out.partial")
    before = {p.name: p.read_bytes() for p in partial.iterdir()}
    other = run_packer(*args, "--samples-per-shard", "4", "--resume")
    assert other.returncode == 2 and "samples_per_shard: 3 -> 4" in other.stderr
    moved = run_packer("export", packs["hdf5"], out, "--to", "wds", "--samples-per-shard", "3", "--resume")
    assert moved.returncode == 2 and "source pack: identity" in moved.stderr
    assert {p.name: p.read_bytes() for p in partial.iterdir()} == before
    fresh = run_packer(*args, "--samples-per-shard", "4")  # no --resume: starts again
    assert fresh.returncode == 0 and [s["count"] for s in load_export(out)["shards"]] == [4, 4, 4, 2]


def test_an_output_another_run_holds_is_refused(packs, tmp_path):
    out = tmp_path / "out"
    with claim_output(out, command="another export"):
        with pytest.raises(OutputClaimed, match="already claimed by this process"):
            packer.export(packs["lmdb"], out, to="wds")
        done = run_packer("export", packs["lmdb"], out, "--to", "wds")
        assert done.returncode == 2 and "claimed by another run" in done.stderr
    assert not out.exists() and not out.with_name("out.partial").exists()

"""``packer.formats.hdf5.parts``: the bytes of samples workers stored in part files, read back
exactly (property-tested against the plain concatenation), and any damage refused."""
from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packer.errors import CorruptData
from packer.formats.hdf5.parts import Deleter, PartBytes, part_record, stored_size
from packer.formats.sample import Sample, Stored
from packer.formats.segments import SegmentShard

# a run of samples: each (bytes, which part it was stored in, or None for one held in memory)
RUNS = st.lists(st.tuples(st.binary(min_size=0, max_size=300), st.none() | st.integers(0, 2)),
                min_size=1, max_size=25)


def _stored(tmp: Path, run: list[tuple[bytes, int | None]], gaps: bool) -> list[Sample]:
    """Samples as ``packer.conversion.plans.sharded`` hands them over: a part's samples at their
    offsets in its file (``gaps``: other bytes between them, as when a part's samples are split
    over two commits), the others in memory."""
    files: dict[int, bytearray] = {}
    samples = []
    for i, (data, part) in enumerate(run):
        if part is None:
            samples.append(Sample(f"k{i}", data, "jpeg", 0, 1, 1, 3, prepared=1))
            continue
        buf = files.setdefault(part, bytearray())
        if gaps:
            buf += b"\xaa" * (i % 3)
        offset = len(buf)
        buf += data
        shard = SegmentShard(str(tmp / f"part{part}"), "", 0, 0, "")
        _, crc = part_record(Sample(f"k{i}", data, "jpeg", 0, 1, 1, 3))
        samples.append(Sample(f"k{i}", b"", "jpeg", 0, 1, 1, 3, prepared=Stored(crc, len(data), None, shard, offset)))
    for part, buf in files.items():
        (tmp / f"part{part}").write_bytes(bytes(buf))
    return samples


@settings(max_examples=150, deadline=None)
@given(run=RUNS, gaps=st.booleans())
def test_join_gives_the_samples_bytes_in_order(run, gaps):
    with tempfile.TemporaryDirectory() as tmp:
        samples = _stored(Path(tmp), run, gaps)
        assert [stored_size(s) for s in samples] == [len(d) for d, _ in run]
        with PartBytes() as parts:
            assert bytes(parts.join(samples)) == b"".join(d for d, _ in run)


@settings(max_examples=100, deadline=None)
@given(run=RUNS, pick=st.integers(0, 10_000), bit=st.integers(0, 7))
def test_a_flipped_bit_in_a_part_is_refused_naming_the_sample(run, pick, bit):
    on_disk = [(i, d) for i, (d, part) in enumerate(run) if part is not None and d]
    if not on_disk:
        return
    with tempfile.TemporaryDirectory() as tmp:
        samples = _stored(Path(tmp), run, gaps=False)
        i, data = on_disk[pick % len(on_disk)]
        stored = samples[i].prepared
        path = Path(stored.part.path)
        raw = bytearray(path.read_bytes())
        raw[stored.offset + pick % len(data)] ^= 1 << bit
        path.write_bytes(bytes(raw))
        with PartBytes() as parts, pytest.raises(CorruptData) as e:
            parts.join(samples)
        assert e.value.key == f"k{i}" and e.value.path == str(path)


def test_a_part_cut_short_is_refused(tmp_path):
    samples = _stored(tmp_path, [(b"x" * 100, 0), (b"y" * 100, 0)], gaps=False)
    path = Path(samples[0].prepared.part.path)
    path.write_bytes(path.read_bytes()[:150])
    with PartBytes() as parts, pytest.raises(CorruptData, match="50 bytes short"):
        parts.join(samples)


def test_deleter_removes_the_parts_and_waits(tmp_path):
    paths = [tmp_path / f"p{i}" for i in range(5)]
    for p in paths:
        p.write_bytes(b"x" * 1000)
    d = Deleter()
    d.later([str(p) for p in paths[:3]])
    d.later([str(p) for p in paths[3:]] + [str(tmp_path / "gone already")])
    d.join()
    assert not any(p.exists() for p in paths)

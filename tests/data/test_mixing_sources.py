"""Weighted mixing: several packs (any formats) read as one seeded stream by proportion or
repeat count, split by rank, resumable and elastic mid-epoch."""
from __future__ import annotations

import hashlib
import os
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from tests.support.inputs import write_image_folder
from tests.support.elastic import STAGES, stream_stage
from packer import StreamingDataset
from packer.commands.pack_images import pack_images
from packer.data.sources import mix_counts, mix_stream, source_picks
from packer.errors import UsageError
from packer.formats import open_reader
from packer.conversion.options import RunOptions


@pytest.fixture(scope="module")
def packs(tmp_path_factory) -> list[Path]:
    """Three packs in three formats: 40, 25 and 15 samples, classes in different orders."""
    root = tmp_path_factory.mktemp("mix")
    out = []
    for i, (fmt, name, count) in enumerate([("records", "a", 40), ("lmdb", "b.lmdb", 25), ("hdf5", "c.h5", 15)]):
        src = write_image_folder(root / f"src{i}", count=count, classes=3 + i, size=(8, 8), seed=i)
        opts = {"samples_per_shard": 6} if fmt == "records" else {}
        pack_images(src, root / name, format=fmt, writer_options=opts, run_options=RunOptions(workers=0))
        out.append(root / name)
    return out


def ids_of(paths) -> dict[bytes, tuple[int, int]]:
    """(source, position) by stored bytes (every generated image differs)."""
    table = {}
    for s, p in enumerate(paths):
        reader = open_reader(p)
        table.update({reader.read(i).data: (s, i) for i in range(len(reader))})
    return table


def test_mix_counts_are_exact_and_checked():
    assert mix_counts([40, 25, 15], [0.6, 0.3, 0.1], epoch_size=10_000) == [6000, 3000, 1000]
    assert mix_counts([40, 25, 15], [6, 3, 1], epoch_size=7) == [4, 2, 1]
    assert mix_counts([40, 25], [0.5, 2], by="repeat") == [20, 50]
    with pytest.raises(UsageError, match="weights"):
        mix_counts([4, 4], [1, -1])
    with pytest.raises(UsageError, match="epoch_size"):
        mix_counts([4, 4], [1, 1], by="repeat", epoch_size=5)
    picks = source_picks(np.arange(10, 20), 25, np.random.default_rng(0))
    assert Counter(picks.tolist()) == {**{x: 2 for x in range(10, 20)}, **{x: 3 for x in picks[20:].tolist()}}
    stream = mix_stream([np.arange(3), np.arange(2)], [0, 100], None)
    assert sorted(stream.tolist()) == [0, 1, 2, 100, 101]


def _read(paths, ids, seed, epoch=0, **kw):
    ds = StreamingDataset(dict(zip(map(str, paths), (0.6, 0.3, 0.1))), seed=seed, decode="bytes",
                          epoch_size=10_000, **kw)
    ds.set_epoch(epoch)
    out = []
    digest = hashlib.sha256()
    for image, label, source in ds:
        assert ids[image][0] == source
        out.append(ids[image])
        digest.update(image + bytes([label, source]))
    return out, digest.hexdigest()


def test_three_packs_at_60_30_10_per_epoch_and_bit_identical(packs):
    ids = ids_of(packs)
    for epoch in (0, 1):
        seen, digest = _read(packs, ids, seed=0, epoch=epoch)
        share = Counter(s for s, _ in seen)
        assert len(seen) == 10_000
        for source, want in enumerate((0.6, 0.3, 0.1)):
            assert abs(share[source] / 10_000 - want) < 0.01
        assert _read(packs, ids, seed=0, epoch=epoch)[1] == digest  # same seed: the same bytes, labels, sources
        assert _read(packs, ids, seed=1, epoch=epoch)[1] != digest
        # every sample of every source read about as often (whole passes, then a subset)
        per_source = [Counter(i for s, i in seen if s == k) for k in range(3)]
        assert all(max(c.values()) - min(c.values()) <= 1 for c in per_source)
        assert [len(c) for c in per_source] == [40, 25, 15]
    # shuffled across sources: the first 100 samples already hold all three
    assert len({s for s, _ in seen[:100]}) == 3


def test_ranks_get_equal_shares_of_the_mix(packs):
    ids = ids_of(packs)
    parts = [_read(packs, ids, seed=2, rank=r, world_size=3)[0] for r in range(3)]
    assert len({len(p) for p in parts}) == 1
    whole = _read(packs, ids, seed=2)[0]
    got = Counter(x for p in parts for x in p)
    assert Counter(whole) - got == Counter()  # all of the epoch's stream...
    assert sum((got - Counter(whole)).values()) == 3 * 3334 - 10_000  # ...and the 2 padded repeats


def test_mix_resumes_8_3_5_1_with_workers(packs):
    ids = ids_of(packs)
    paths = {str(p): w for p, w in zip(packs, (0.6, 0.3, 0.1))}
    kw = dict(decode="bytes", seed=5, block_size=10, batch_size=3, epoch_size=120)
    fresh = StreamingDataset(paths, rank=0, world_size=1, **kw)
    fresh.set_epoch(1)
    expected = Counter(fresh.order())  # the epoch's stream: repeats of small sources included
    seen, state = [], None
    for world, steps in STAGES:
        per_rank, states = stream_stage(paths, ids, world, steps, state, kw)
        assert len({len(p) for p in per_rank}) == 1
        seen += [x for p in per_rank for x in p]
        state = states[-1]
    offsets = [0, 40, 65]
    assert Counter(offsets[s] + i for s, i in seen) == expected
    with pytest.raises(UsageError, match="sources"):
        StreamingDataset({**paths, str(packs[2]): 0.2}, **kw).load_state_dict(state)


def test_labels_per_source_or_through_a_label_map(packs):
    paths = {str(packs[0]): 1.0, str(packs[2]): 1.0}
    ds = StreamingDataset(paths, decode="bytes", shuffle=False, mix_by="repeat")  # each source once
    with pytest.raises(UsageError, match="per source"):
        ds.classes
    readers = [open_reader(p) for p in paths]
    own = sorted((s, lab) for _, lab, s in ds)
    assert own == sorted((s, r.read(i).label) for s, r in enumerate(readers) for i in range(len(r)))
    names = sorted(set(readers[0].classes) | set(readers[1].classes))
    label_map = {n: k for k, n in enumerate(names)}
    mapped = StreamingDataset(paths, decode="bytes", shuffle=False, mix_by="repeat", label_map=label_map)
    assert mapped.classes == names
    for _, lab, s in mapped:
        assert lab in range(len(names))
    got = sorted((s, lab) for _, lab, s in mapped)
    want = sorted((s, label_map[r.classes[r.read(i).label]]) for s, r in enumerate(readers) for i in range(len(r)))
    assert got == want
    with pytest.raises(UsageError, match="label_map lacks"):
        StreamingDataset(paths, label_map={"class_0": 0})
    with pytest.raises(UsageError, match="for a mix"):
        StreamingDataset(packs[0], epoch_size=10)


def test_a_mix_refuses_string_weights_fractional_sizes_and_one_pack_spelled_twice(packs, tmp_path):
    a, b = str(packs[0]), str(packs[1])
    for weight in ("0.5", True):
        with pytest.raises(UsageError, match=f"a mix weight must be a number, not {weight!r}"):
            StreamingDataset({a: weight, b: 0.5})
    with pytest.raises(UsageError, match="epoch_size must be an integer"):
        StreamingDataset({a: 0.5, b: 0.5}, epoch_size=10.7)  # (was read as 10)
    link = tmp_path / "link"
    link.symlink_to(packs[0])
    rel = os.path.relpath(packs[0])
    for twice in (a + "/", rel, "./" + rel, str(link), str(packs[0].parent / ".." / packs[0].parent.name / "a")):
        with pytest.raises(UsageError, match="the mix names one pack twice"):
            StreamingDataset({a: 0.5, twice: 0.5, b: 1})
    assert len(StreamingDataset({a: 0.5, b: np.float32(0.5)}, epoch_size=np.int64(10))) == 10

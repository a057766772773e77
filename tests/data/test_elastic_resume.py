"""Elastic resume: a state taken on W ranks resumes on W' != W ranks, the rest of the epoch read
once across the new ranks, every rank the same count; then epochs are a fresh run's on W'.

Ranks are simulated (``rank=``/``world_size=`` arguments), each read through a real DataLoader
with 2 workers (``StreamingDataset``) or the loader's threads (``Loader``).
"""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from packer import Loader, PackedDataset, StreamingDataset
from packer.commands.pack_images import pack_images
from packer.data.streaming import elastic_slots, split_by_rank
from packer.errors import PackerError
from packer.formats import open_reader
from packer.conversion.options import RunOptions
from tests.support.elastic import STAGES, no_collate, stream_stage
from tests.support.inputs import write_image_folder

FORMATS = {"records": "rec", "lmdb": "l.lmdb", "hdf5": "h.h5"}
@pytest.fixture(scope="module")
def packs(tmp_path_factory) -> dict[str, Path]:
    """120 samples (divisible by 8, 3, 5: no padding anywhere) in every format; records in 7-sample shards."""
    root = tmp_path_factory.mktemp("elastic")
    src = write_image_folder(root / "src", count=120, classes=4, size=(8, 8))
    out = {}
    for fmt, name in FORMATS.items():
        opts = {"samples_per_shard": 7} if fmt == "records" else {}
        pack_images(src, root / name, format=fmt, writer_options=opts, run_options=RunOptions(workers=0))
        out[fmt] = root / name
    return out


def ids_of(path) -> dict[bytes, int]:
    reader = open_reader(path)
    return {reader.read(i).data: i for i in range(len(reader))}


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_streaming_resumes_8_3_5_1_within_an_epoch(packs, fmt):
    path, kw = packs[fmt], dict(decode="bytes", seed=3, block_size=10, batch_size=3)
    ids = ids_of(path)
    seen, state = [], None
    for world, steps in STAGES:
        per_rank, states = stream_stage(path, ids, world, steps, state, kw)
        assert len({len(p) for p in per_rank}) == 1  # equal counts: DDP never waits on a rank
        seen += [x for p in per_rank for x in p]
        assert len({json.dumps({k: v for k, v in s.items() if k != "rank"}) for s in states}) == 1
        state = states[-1]  # any rank's state serves: they read the same count
    assert state["resumes"] == [[8, 6], [3, 9], [5, 3]] and state["world_size"] == 1
    assert sorted(seen) == list(range(120))  # every sample exactly once
    # the next epoch is what a fresh run on the last world size reads
    resumed = StreamingDataset(path, rank=0, world_size=1, **kw)
    resumed.load_state_dict(state)
    resumed.set_epoch(2)
    assert resumed.order() == StreamingDataset(path, **{**kw, "seed": 3}).order(2)


def test_fixed_world_resume_is_todays(packs):
    """Same world size: the state has no resumes and each rank continues its own order."""
    path, kw = packs["records"], dict(decode="bytes", seed=3, block_size=10, batch_size=3)
    ids = ids_of(path)
    per_rank, states = stream_stage(path, ids, 4, 2, None, kw)
    for rank in range(4):
        ds = StreamingDataset(path, rank=rank, world_size=4, **kw)
        ds.set_epoch(1)
        full = ds.order()
        ds.load_state_dict(states[rank])
        rest = [ids[b] for b, _ in ds]
        assert states[rank]["resumes"] == [] and per_rank[rank] + rest == full


def test_uneven_resume_pads_equal_counts_and_covers_all(packs):
    """25 of 120 consumed on 7 ranks (padded), resumed on 4: equal counts, every sample read,
    repeats only the padding's (fewer than the ranks of each stage)."""
    path, kw = packs["lmdb"], dict(decode="bytes", seed=9, block_size=6, batch_size=3)
    ids = ids_of(path)
    seen, state = [], None
    for world, steps in [(7, 1), (4, 2), (2, None)]:
        per_rank, states = stream_stage(path, ids, world, steps, state, kw)
        assert len({len(p) for p in per_rank}) == 1
        seen += [x for p in per_rank for x in p]
        state = states[0]
    counts = Counter(seen)
    assert set(counts) == set(range(120)) and len(seen) - 120 < 7 + 4 + 2


def test_drop_last_drops_only_the_uneven_tail():
    stream = np.arange(50)
    first = lambda r, w: split_by_rank(stream, rank=r, world_size=w, drop_last=True)  # noqa: E731
    stages = [(6, 3)]  # 6 x 8 = 48 read-or-planned, 18 read; 30 left over 4 ranks: 7 each, 2 dropped
    parts = [elastic_slots(first, 50, stages, rank=r, world_size=4, drop_last=True) for r in range(4)]
    assert {len(p) for p in parts} == {7}
    read = [x for r in range(6) for x in first(r, 6)[:3]]
    assert len(set(read) | {int(x) for p in parts for x in p}) == 18 + 28


def test_loader_threads_resume_8_3_5_1(packs):
    ds = PackedDataset(packs["hdf5"], decode="bytes")
    ids = ids_of(packs["hdf5"])
    kw = dict(batch_size=3, shuffle=True, seed=5, num_threads=2, collate=no_collate)
    seen, state = [], None
    for world, steps in STAGES:
        per_rank, states = [], []
        for rank in range(world):
            loader = Loader(ds, rank=rank, world_size=world, **kw)
            if state is not None:
                loader.load_state_dict(json.loads(json.dumps(state)))
            loader.set_epoch(1)
            got = []
            it = iter(loader)
            for step, batch in enumerate(it):
                got += [ids[b] for b, _ in batch]
                if steps is not None and step + 1 == steps:
                    break
            it.close()
            per_rank.append(got)
            states.append(loader.state_dict())
        assert len({len(p) for p in per_rank}) == 1
        seen += [x for p in per_rank for x in p]
        state = states[1 % world]
    assert sorted(seen) == list(range(120))
    fresh = Loader(ds, rank=0, world_size=1, **kw)
    after = Loader(ds, rank=0, world_size=1, **kw)
    after.load_state_dict(state)
    after.set_epoch(2)
    assert after.indices().tolist() == fresh.indices(2).tolist()


def test_resumes_that_cannot_be_exact_are_refused(packs):
    path, kw = packs["records"], dict(decode="bytes", seed=3, block_size=10, batch_size=3)
    ds = StreamingDataset(path, rank=0, world_size=8, **kw)
    ds.set_epoch(1)
    state = ds.state_dict(num_samples=6)
    with pytest.raises(PackerError, match="seed"):
        StreamingDataset(path, rank=0, world_size=3, **{**kw, "seed": 4}).load_state_dict(state)
    with pytest.raises(PackerError, match="position must be an integer >= 0"):
        StreamingDataset(path, rank=0, world_size=3, **kw).load_state_dict({**state, "position": -1})
    for world in (8, 3):  # past the rank's 15 (a short last batch counted whole): the pass is done
        done = StreamingDataset(path, rank=0, world_size=world, **kw)
        done.load_state_dict({**state, "position": 16})
        assert list(done) == []
        done.set_epoch(2)  # and the next epoch is a fresh run's
        assert done.order() == StreamingDataset(path, rank=0, world_size=world, **kw).order(2)
    loader = Loader(PackedDataset(path, decode="bytes"), batch_size=3, rank=0, world_size=3, collate=no_collate)
    loader.load_state_dict({**loader.state_dict(), "epoch": 1, "position": 41})
    assert list(loader) == [] and sum(len(b) for b in loader) == 40  # done, then epoch 2 whole
    with pytest.raises(PackerError, match="world-size changes"):
        StreamingDataset(path, rank=0, world_size=3, **kw).load_state_dict(
            {**state, "resumes": [[2, 0], [4, 0]] * 16})
    loader = Loader(PackedDataset(path, decode="bytes"), batch_size=3, rank=0, world_size=2)
    with pytest.raises(PackerError, match="count"):
        loader.load_state_dict({**loader.state_dict(), "count": 7})


def test_a_state_of_another_pack_with_the_same_count_is_refused(tmp_path):
    """The order means nothing for other samples: same count, same options, other data."""
    import shutil

    for seed in (1, 2):
        pack_images(write_image_folder(tmp_path / f"src{seed}", count=12, classes=2, size=(8, 8), seed=seed),
                    tmp_path / f"p{seed}", format="records", run_options=RunOptions(workers=0))
    state = StreamingDataset(tmp_path / "p1", seed=3, rank=0, world_size=1).state_dict(num_samples=4)
    with pytest.raises(PackerError, match="cannot resume: the state was taken on other packs"):
        StreamingDataset(tmp_path / "p2", seed=3, rank=0, world_size=1).load_state_dict(state)
    shutil.copytree(tmp_path / "p1", tmp_path / "copy")  # the same pack elsewhere: resumes
    StreamingDataset(tmp_path / "copy", seed=3, rank=0, world_size=1).load_state_dict(state)
    mixed = {str(tmp_path / "p1"): 1, str(tmp_path / "p2"): 1}
    state = StreamingDataset(mixed, seed=3, rank=0, world_size=1).state_dict(num_samples=4)
    swapped = {str(tmp_path / "p2"): 1, str(tmp_path / "p1"): 1}
    with pytest.raises(PackerError, match="other packs"):
        StreamingDataset(swapped, seed=3, rank=0, world_size=1).load_state_dict(state)


def test_loader_over_video_clips_resumes_3_2_1(tmp_path):
    """The video datasets are map-style: a ``Loader`` over them resumes across world sizes too."""
    import hashlib

    from tests.support.inputs import write_video
    from packer import PackedVideoDataset
    from packer.commands.decode_frames import decode_frames

    for i in range(9):
        write_video(tmp_path / "src" / f"c{i % 2}" / f"v{i}.mp4", frames=6 + i, seed=i)
    decode_frames(tmp_path / "src", tmp_path / "packed", to="lmdb", run_options=RunOptions(workers=0, timeout=600.0))
    ds = PackedVideoDataset(tmp_path / "packed", test_mode=True, clip_len=2)

    def digest(sample) -> str:
        clip = sample[0]
        return hashlib.sha256(np.ascontiguousarray(np.asarray(clip)).tobytes()).hexdigest()

    ids = {digest(ds[i]): i for i in range(len(ds))}
    assert len(ids) == 9
    kw = dict(batch_size=1, shuffle=True, seed=1, num_threads=2, collate=no_collate)
    seen, state = [], None
    for world, steps in [(3, 1), (2, 1), (1, None)]:
        per_rank = []
        for rank in range(world):
            loader = Loader(ds, rank=rank, world_size=world, **kw)
            if state is not None:
                loader.load_state_dict(state)
            it, got = iter(loader), []
            for step, batch in enumerate(it):
                got += [ids[digest(s)] for s in batch]
                if steps is not None and step + 1 == steps:
                    break
            it.close()
            per_rank.append(got)
            after = loader.state_dict()
        assert len({len(p) for p in per_rank}) == 1
        seen += [x for p in per_rank for x in p]
        state = after
    assert sorted(seen) == list(range(9))

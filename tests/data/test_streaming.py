"""StreamingDataset: epoch order, rank/worker splits, set_epoch, mid-epoch resume, real DDP ranks."""
from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as tmp_mp
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from packer import StreamingDataset
from packer.data.mixing import mixing_report
from packer.data.streaming import (DEFAULT_BLOCK_SIZE, DEFAULT_BUFFER_SIZE, StreamOrder, block_shuffle,
                                   epoch_shard_order,
                                   epoch_stream, rank_order, shuffle_buffer, split_by_rank, split_by_worker)
from packer.errors import UsageError
from packer.formats import open_reader
from packer.commands.pack_images import pack_images
from packer.conversion.options import RunOptions
from tests.support.inputs import write_image_folder


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    """25 samples in 7 shards (4 each, the last 1): uneven on purpose."""
    root = tmp_path_factory.mktemp("stream")
    src = write_image_folder(root / "src", count=25, classes=5, size=(12, 16))
    out = root / "rec"
    pack_images(src, out, format="records", writer_options={"samples_per_shard": 4},
                run_options=RunOptions(workers=0))
    return out


def ids_of(path) -> dict[bytes, int]:
    """Sample position by stored bytes (every generated image differs)."""
    reader = open_reader(path)
    table = {reader.read(i).data: i for i in range(len(reader))}
    assert len(table) == len(reader)
    return table


def no_collate(batch):
    return batch


# -- the pieces --------------------------------------------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(st.integers(0, 120), st.integers(1, 8), st.booleans())
def test_split_by_rank_equal_counts_and_coverage(n, world, drop_last):
    stream = np.random.default_rng(n).permutation(n)
    parts = [split_by_rank(stream, rank=r, world_size=world, drop_last=drop_last) for r in range(world)]
    assert len({len(p) for p in parts}) == 1
    seen = Counter(int(x) for p in parts for x in p)
    if drop_last:
        assert sum(seen.values()) == n // world * world and max(seen.values(), default=1) == 1
    else:
        assert set(seen) == set(range(n))
        assert sum(seen.values()) - n < world  # padding: fewer repeats than ranks...
        if n >= world:
            assert max(seen.values(), default=1) <= 2  # ...each repeated at most once
    # rank after rank, the slices are the stream itself (cut, or padded with its start):
    # each rank reads one contiguous stretch of the shard-ordered stream
    joined = np.concatenate(parts) if parts else np.zeros(0)
    expected = stream[: n // world * world] if drop_last else np.resize(stream, len(joined))
    assert joined.tolist() == expected.tolist()


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(), max_size=60), st.integers(1, 20), st.integers(0, 3))
def test_shuffle_buffer_is_a_seeded_permutation(items, size, seed):
    a = list(shuffle_buffer(items, size, random.Random(seed)))
    assert sorted(a) == sorted(items)
    assert a == list(shuffle_buffer(items, size, random.Random(seed)))
    assert list(shuffle_buffer(items, 1, random.Random(seed))) == items


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 50), st.integers(1, 4), st.integers(1, 5))
def test_split_by_worker_matches_dataloader_round_robin(n, workers, batch):
    items = list(range(n))
    shares = [list(split_by_worker(items, w, workers, batch)) for w in range(workers)]
    batches = [[s[i:i + batch] for i in range(0, len(s), batch)] for s in shares]
    merged = [x for j in range(max(map(len, batches))) for b in batches if j < len(b) for x in b[j]]
    assert merged == items


def test_epoch_orders_differ_by_epoch_and_seed_and_cover_all():
    counts = [4, 4, 4, 1]
    orders = {(s, e): rank_order(counts, seed=s, epoch=e, shuffle=True, buffer_size=3, rank=0,
                                 world_size=1, drop_last=False) for s in (0, 1) for e in (0, 1)}
    assert all(sorted(o) == list(range(13)) for o in orders.values())
    assert len({tuple(o) for o in orders.values()}) == 4
    assert epoch_shard_order(4, seed=0, epoch=0, shuffle=False) == [0, 1, 2, 3]
    assert epoch_stream(counts, [3, 0]).tolist() == [12, 0, 1, 2, 3]


# -- the dataset -------------------------------------------------------------------------------------
def test_single_process_epoch_and_set_epoch(shards):
    ids = ids_of(shards)
    ds = StreamingDataset(shards, decode="bytes", buffer_size=6, seed=3)
    assert len(ds) == 25 and ds.classes == [f"class_{i}" for i in range(5)]
    first = [ids[b] for b, _ in ds]
    assert first == ds.order() and sorted(first) == list(range(25))
    assert [ids[b] for b, _ in ds] == first  # same epoch, same order
    ds.set_epoch(1)
    second = [ids[b] for b, _ in ds]
    assert sorted(second) == list(range(25)) and second != first
    plain = StreamingDataset(shards, decode="bytes", shuffle=False)
    assert [ids[b] for b, _ in plain] == list(range(25))
    labels = [lab for _, lab in StreamingDataset(shards, decode="numpy", shuffle=False)]
    assert labels == [open_reader(shards).read(i).label for i in range(25)]


def test_ranks_by_argument_split_evenly(shards):
    ids = ids_of(shards)
    seen = []
    for rank in range(3):
        ds = StreamingDataset(shards, decode="bytes", rank=rank, world_size=3, seed=1)
        got = [ids[b] for b, _ in ds]
        assert len(got) == len(ds) == 9
        seen += got
    counts = Counter(seen)
    assert set(counts) == set(range(25)) and sum(counts.values()) == 27
    with pytest.raises(UsageError):
        StreamingDataset(shards, rank=3, world_size=3)


def test_set_epoch_reaches_persistent_workers(shards):
    ids = ids_of(shards)
    ds = StreamingDataset(shards, decode="bytes", seed=7, buffer_size=5, batch_size=3)
    loader = DataLoader(ds, batch_size=3, num_workers=2, persistent_workers=True, collate_fn=no_collate)
    orders = []
    for epoch in range(3):
        ds.set_epoch(epoch)
        got = [ids[b] for batch in loader for b, _ in batch]
        assert got == ds.order(epoch)  # DataLoader output = this rank's order, in order
        orders.append(got)
    assert len({tuple(o) for o in orders}) == 3


@pytest.mark.parametrize("workers", [0, 2])
def test_state_dict_resumes_with_the_same_remaining_order(shards, workers):
    ids = ids_of(shards)
    kw = dict(decode="bytes", seed=11, buffer_size=8, batch_size=4)
    ds = StreamingDataset(shards, **kw)
    ds.set_epoch(2)
    full = ds.order()
    loader = DataLoader(ds, batch_size=4, num_workers=workers, collate_fn=no_collate)
    taken = []
    for step, batch in enumerate(loader):
        taken += [ids[b] for b, _ in batch]
        if step == 2:
            break
    state = ds.state_dict() if workers == 0 else ds.state_dict(num_samples=len(taken))
    assert state["epoch"] == 2 and state["position"] == 12
    state = json.loads(json.dumps(state))  # a checkpoint is plain JSON

    fresh = StreamingDataset(shards, **kw)
    fresh.load_state_dict(state)
    fresh.set_epoch(2)  # the training loop's usual call keeps the pending resume
    rest = [ids[b] for batch in DataLoader(fresh, batch_size=4, num_workers=workers, collate_fn=no_collate)
            for b, _ in batch]
    assert taken + rest == full
    again = fresh.state_dict(num_samples=len(rest)) if workers else fresh.state_dict()
    assert again["position"] == 25
    fresh.set_epoch(3)  # a new epoch starts from its beginning
    assert sorted(ids[b] for b, _ in fresh) == list(range(25))
    with pytest.raises(UsageError, match="seed"):
        StreamingDataset(shards, **{**kw, "seed": 12}).load_state_dict(state)


def test_any_packed_format_streams(tmp_path, shards):
    src = write_image_folder(tmp_path / "src", count=9, classes=3, size=(12, 16))
    out = tmp_path / "l.lmdb"
    pack_images(src, out, format="lmdb", run_options=RunOptions(workers=0))
    ds = StreamingDataset(out, decode="tensor", buffer_size=4)
    images = [img for img, _ in ds]
    assert len(images) == 9 and images[0].dtype == torch.uint8 and images[0].shape[0] == 3


# -- real torch.distributed: 2 gloo ranks x 2 DataLoader workers -------------------------------------
def _rank_main(rank: int, world: int, path: str, rendezvous: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    try:
        ids = ids_of(path)
        kw = dict(decode="bytes", seed=5, buffer_size=6, batch_size=3)
        ds = StreamingDataset(path, **kw)
        assert (ds.rank, ds.world_size) == (rank, world)
        # fork, as DataLoader does by default on Linux: a rank started by spawn would otherwise
        # spawn its workers too (a fresh interpreter and torch import per worker)
        loader = DataLoader(ds, batch_size=3, num_workers=2, persistent_workers=True, collate_fn=no_collate,
                            multiprocessing_context="fork")
        epochs = {}
        for epoch in range(2):
            ds.set_epoch(epoch)
            epochs[epoch] = [ids[b] for batch in loader for b, _ in batch]
        # equal batch counts on every rank: an all_reduce per batch would not hang
        n = torch.tensor([len(epochs[0])])
        dist.all_reduce(n, op=dist.ReduceOp.MAX)
        # mid-epoch resume of epoch 1 after 2 batches, with fresh workers
        state = ds.state_dict(num_samples=6)
        resumed = StreamingDataset(path, **kw)
        resumed.load_state_dict(state)
        rest = [ids[b] for batch in DataLoader(resumed, batch_size=3, num_workers=2, collate_fn=no_collate,
                                               multiprocessing_context="fork")
                for b, _ in batch]
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(
            {"epochs": epochs, "max_count": int(n), "state": state, "rest": rest, "len": len(ds)}))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_gloo_ranks_two_workers_each(shards, tmp_path):
    tmp_mp.spawn(_rank_main, args=(2, str(shards), str(tmp_path / "rdv"), str(tmp_path)), nprocs=2, join=True)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for epoch in ("0", "1"):
        per_rank = [r["epochs"][epoch] for r in ranks]
        assert [len(p) for p in per_rank] == [13, 13] == [r["len"] for r in ranks]
        counts = Counter(x for p in per_rank for x in p)
        assert set(counts) == set(range(25))  # every sample seen...
        assert sorted(counts.values()) == [1] * 24 + [2]  # ...exactly once, one padded repeat
        assert all(r["max_count"] == 13 for r in ranks)
    assert ranks[0]["epochs"]["0"] != ranks[0]["epochs"]["1"]
    for r in ranks:
        assert r["state"]["epoch"] == 1 and r["state"]["position"] == 6
        assert r["epochs"]["1"][:6] + r["rest"] == r["epochs"]["1"]


# -- the block shuffle: mixing across shards ----------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(st.integers(0, 300), st.integers(1, 64), st.integers(0, 2**32 - 1))
def test_block_shuffle_permutes_within_blocks_of_bounded_size(n, block, seed):
    items = np.arange(n, dtype=np.int64) * 3
    out = block_shuffle(items, block, np.random.default_rng(seed))
    assert sorted(out.tolist()) == items.tolist()
    assert out.tolist() == block_shuffle(items, block, np.random.default_rng(seed)).tolist()
    start = 0  # every element stays inside a block of at most 1.25 x block_size positions
    hi = max(2, int(1.25 * block))
    while start < n:
        for stop in range(start + 1, min(n, start + hi) + 1):
            if sorted(out[start:stop].tolist()) == items[start:stop].tolist():
                break
        else:
            raise AssertionError(f"no block boundary within {hi} positions of {start}")
        start = stop


def test_default_order_mixes_a_class_sorted_pack():
    """200 classes x 300 samples, class-sorted, in 3000-sample shards (the issue's case)."""
    counts = [3000] * 20
    kw = dict(seed=0, epoch=0, shuffle=True, buffer_size=DEFAULT_BUFFER_SIZE, rank=0, world_size=1, drop_last=False)
    old = mixing_report(np.array(rank_order(counts, **kw)) // 300, 256)
    new = mixing_report(np.array(rank_order(counts, block_size=DEFAULT_BLOCK_SIZE, **kw)) // 300, 256)
    assert old["ratio"] < 0.4  # the shuffle buffer: ~48 classes of the ~145 expected
    assert new["ratio"] >= 0.95 and abs(new["iid"] - 144.72) < 0.01
    assert StreamOrder().block_size == DEFAULT_BLOCK_SIZE  # what StreamingDataset uses by default


@pytest.mark.parametrize("workers", [0, 2])
def test_small_blocks_resume_exactly_and_split_evenly(shards, workers):
    ids = ids_of(shards)
    kw = dict(decode="bytes", seed=4, block_size=6, batch_size=3)
    per_rank = []
    for rank in range(2):
        ds = StreamingDataset(shards, rank=rank, world_size=2, **kw)
        ds.set_epoch(1)
        full = ds.order()
        assert len(full) == len(ds) == 13
        loader = DataLoader(ds, batch_size=3, num_workers=workers, collate_fn=no_collate)
        taken = []
        for step, batch in enumerate(loader):
            taken += [ids[b] for b, _ in batch]
            if step == 1:
                break
        state = json.loads(json.dumps(ds.state_dict(num_samples=len(taken))))
        fresh = StreamingDataset(shards, rank=rank, world_size=2, **kw)
        fresh.load_state_dict(state)
        rest = [ids[b] for batch in DataLoader(fresh, batch_size=3, num_workers=workers, collate_fn=no_collate)
                for b, _ in batch]
        assert taken + rest == full
        per_rank.append(full)
    assert set(per_rank[0]) | set(per_rank[1]) == set(range(25))
    with pytest.raises(UsageError, match="block_size"):
        StreamingDataset(shards, **{**kw, "block_size": 7}).load_state_dict(state)
    old_state = {k: v for k, v in state.items() if k != "block_size"}
    with pytest.raises(UsageError, match="predates the block shuffle"):
        StreamingDataset(shards, **kw).load_state_dict(old_state)

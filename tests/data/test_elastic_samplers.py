"""Elastic resume of the video datasets' samplers: ``packer.data.DistributedSampler`` and
``MultigridBatchSampler`` states taken on W ranks resume on W' != W ranks through a plain
``DataLoader(num_workers=2)``, the rest of the epoch read once, every rank the same batches.

Ranks are simulated (``num_replicas=``/``rank=``). The packs are real: 48 synthetic videos
re-encoded by ``pack_videos`` (a video pack) and decoded by ``decode_frames`` (a frame pack),
one class per video, so a sample's label read from the pack names its video.
"""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader
from torch.utils.data import DistributedSampler as TorchDistributedSampler

from packer import Loader, PackedDataset, PackedVideoDataset
from packer.commands.decode_frames import decode_frames
from packer.commands.pack_images import pack_images
from packer.commands.pack_videos import pack_videos
from packer.data import DistributedSampler
from packer.data.multigrid import MultigridBatchSampler, MultigridSchedule
from packer.errors import PackerError
from packer.synth import write_video
from packer.commands.pack_videos import VideoPackOptions
from tests.support.elastic import no_collate
from tests.support.inputs import write_image_folder
from packer.conversion.options import RunOptions

pytestmark = pytest.mark.xdist_group("elastic_samplers")

NUM_VIDEOS = 48
# (world size, batches each rank reads before the next resume; None: to the end). With batch
# size 1 every split is even: 48 -> 24 left (8 a rank of 3) -> 15 (3 a rank of 5) -> 10.
SAMPLER_STAGES = [(8, 3), (3, 3), (5, 1), (1, None)]
# Short cycle [(2, 23 px), (1, 32 px)]: 8 ranks read 2 + 1 -> 24 left (8 a rank of 3), from
# phase 2 = 0 they read 2 + 1 -> 15 (3 a rank of 5), from phase 4 = 0 one batch of 2 -> 5
# left for one rank, from phase 5 = 1: batches of 1, 2, 1 and 1 (short).
MULTIGRID_STAGES = [(8, 2), (3, 2), (5, 1), (1, None)]


def schedule() -> MultigridSchedule:
    return MultigridSchedule(base_batch_size=1, num_frames=4, crop_size=32, lr_steps=[0], max_epoch=4,
                             long_cycle=False, short_cycle_factors=(0.7071,))


@pytest.fixture(scope="module")
def packs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("elastic_samplers")
    for i in range(NUM_VIDEOS):
        write_video(root / "src" / f"c{i:02d}" / f"v{i:02d}.mp4", frames=8 + i % 5, size=(32, 32), seed=i)
    pack_videos(root / "src", root / "videos.records", to="records",
                pack_options=VideoPackOptions(short_side=32, gop=4),
                run_options=RunOptions(workers=0, timeout=600.0))
    decode_frames(root / "src", root / "frames.lmdb", to="lmdb", run_options=RunOptions(workers=0, timeout=600.0))
    return {"video pack": root / "videos.records", "frame pack": root / "frames.lmdb"}


def dataset(path: Path) -> PackedVideoDataset:
    ds = PackedVideoDataset(path, test_mode=True, clip_len=2, frame_interval=2)
    assert len(ds) == NUM_VIDEOS and ds.classes == [f"c{i:02d}" for i in range(NUM_VIDEOS)]
    return ds


def same_but_rank(states: list[dict]) -> bool:
    """The ranks' states differ only in ``rank`` (a multigrid state's index state included)."""
    def strip(state: dict) -> dict:
        return {k: strip(v) if isinstance(v, dict) else v for k, v in state.items() if k != "rank"}

    return len({json.dumps(strip(s), sort_keys=True) for s in states}) == 1


@pytest.mark.parametrize("kind", ["video pack", "frame pack"])
def test_distributed_sampler_resumes_8_3_5_1_over_a_dataloader(packs, kind):
    ds = dataset(packs[kind])
    seen, state = [], None
    for world, steps in SAMPLER_STAGES:
        per_rank, states = [], []
        for rank in range(world):
            sampler = DistributedSampler(ds, num_replicas=world, rank=rank, seed=3)
            if state is not None:
                sampler.load_state_dict(json.loads(json.dumps(state)))
            sampler.set_epoch(1)  # the loop's usual call keeps the pending resume
            got = []
            for step, batch in enumerate(DataLoader(ds, sampler=sampler, batch_size=1, num_workers=2,
                                                    collate_fn=no_collate)):
                if steps is not None and step == steps:
                    break  # the workers have fetched ahead: the sampler cannot count this itself
                got += [label for _, label in batch]
            per_rank.append(got)
            states.append(sampler.state_dict(num_samples=len(got)))
        assert len({len(p) for p in per_rank}) == 1  # equal counts: DDP never waits on a rank
        assert same_but_rank(states)
        seen += [x for p in per_rank for x in p]
        state = states[-1]
    assert state["resumes"] == [[8, 3], [3, 3], [5, 1]] and state["world_size"] == 1
    assert sorted(seen) == list(range(NUM_VIDEOS))  # every video exactly once
    # the next epoch is what a fresh run on the last world size reads: torch's own order
    resumed = DistributedSampler(ds, num_replicas=1, rank=0, seed=3)
    resumed.load_state_dict(state)
    resumed.set_epoch(2)
    fresh = TorchDistributedSampler(ds, num_replicas=1, rank=0, seed=3)
    fresh.set_epoch(2)
    assert list(resumed) == list(fresh) and len(resumed) == NUM_VIDEOS


def multigrid_stage(ds, world, steps, state, **kw):
    """Every rank of one stage through a DataLoader: labels read, batch shapes, one state each."""
    per_rank, shapes, states = [], [], []
    for rank in range(world):
        sampler = MultigridBatchSampler(len(ds), schedule(), seed=5, num_replicas=world, rank=rank, **kw)
        if state is not None:
            sampler.load_state_dict(json.loads(json.dumps(state)))
        sampler.set_epoch(2)
        expected = len(sampler) if steps is None else steps
        got, shape = [], []
        for step, (clips, labels) in enumerate(DataLoader(ds, batch_sampler=sampler, num_workers=2)):
            if step == expected:
                break
            got += labels.tolist()
            shape.append((clips.shape[0], clips.shape[-1]))  # batch size, crop
        assert len(shape) == expected
        per_rank.append(got)
        shapes.append(shape)
        states.append(sampler.state_dict(num_batches=len(shape)))
    return per_rank, shapes, states


@pytest.mark.parametrize("kind", ["video pack", "frame pack"])
def test_multigrid_sampler_resumes_8_3_5_1_with_its_short_cycle(packs, kind):
    ds = dataset(packs[kind])
    phases = [(2, 23), (1, 32)]
    seen, state, batches = [], None, 0
    for world, steps in MULTIGRID_STAGES:
        per_rank, shapes, states = multigrid_stage(ds, world, steps, state)
        assert len({len(s) for s in shapes}) == 1 and len({len(p) for p in per_rank}) == 1
        # the short cycle goes on where the previous ranks stopped
        want = [phases[(batches + k) % 2] for k in range(len(shapes[0]))]
        for shape in shapes:  # the last batch of an epoch may be short
            assert shape[:-1] == want[:-1] and shape[-1][1] == want[-1][1] and shape[-1][0] <= want[-1][0]
        batches += len(shapes[0])
        assert same_but_rank(states) and states[0]["batches"] == batches
        seen += [x for p in per_rank for x in p]
        state = states[-1]
    assert state["indices"]["resumes"] == [[8, 3], [3, 3], [5, 2]]
    assert sorted(seen) == list(range(NUM_VIDEOS))  # every video exactly once
    assert shapes[0] == [(1, 32), (2, 23), (1, 32), (1, 23)]  # from phase 5: 1, 2, 1, then a short 2
    # the next epoch is a fresh run's on one rank, from phase 0
    after = MultigridBatchSampler(NUM_VIDEOS, schedule(), seed=5, num_replicas=1, rank=0)
    after.load_state_dict(state)
    after.set_epoch(3)
    assert list(after) == list(MultigridBatchSampler(NUM_VIDEOS, schedule(), seed=5, epoch=3))


def test_fixed_world_resume_continues_each_ranks_own_batches(packs):
    """Same world size: each rank's batches before the state, then after it, are exactly an
    uninterrupted epoch's (interval jitter included: its draws are advanced, not restarted)."""
    ds = dataset(packs["frame pack"])
    per_rank, _, states = multigrid_stage(ds, 4, 3, None)
    for rank in range(4):
        whole = MultigridBatchSampler(NUM_VIDEOS, schedule(), seed=5, num_replicas=4, rank=rank, epoch=2)
        resumed = MultigridBatchSampler(NUM_VIDEOS, schedule(), seed=5, num_replicas=4, rank=rank)
        resumed.load_state_dict(states[rank])
        resumed.set_epoch(2)
        assert states[rank]["indices"]["resumes"] == [] and len(resumed) == len(whole) - 3
        assert list(whole)[3:] == list(resumed)
        assert [r.index for b in list(whole)[:3] for r in b] == per_rank[rank]
    # a long cycle with interval jitter (stage 0: T=2, intervals drawn from [2, 8])
    jittery = MultigridSchedule(base_batch_size=4, num_frames=8, crop_size=64, lr_steps=[0, 8], max_epoch=12,
                                sampling_rate=2)
    whole = list(MultigridBatchSampler(200, jittery, seed=1, jitter_interval=True, num_replicas=2, rank=1))
    assert len({r.frame_interval for b in whole for r in b}) > 3
    first = MultigridBatchSampler(200, jittery, seed=1, jitter_interval=True, num_replicas=2, rank=1)
    resumed = MultigridBatchSampler(200, jittery, seed=1, jitter_interval=True, num_replicas=2, rank=1)
    resumed.load_state_dict(first.state_dict(num_batches=2))
    assert list(resumed) == whole[2:]
    plain = DistributedSampler(NUM_VIDEOS, num_replicas=4, rank=3, seed=1)
    plain.set_epoch(4)
    again = DistributedSampler(NUM_VIDEOS, num_replicas=4, rank=3, seed=1)
    again.load_state_dict(plain.state_dict(num_samples=5))
    assert list(again) == list(plain)[5:] and len(again) == len(plain) - 5


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 90), drop_last=st.booleans(), shuffle=st.booleans(),
       chain=st.lists(st.tuples(st.integers(1, 9), st.floats(0, 1)), min_size=1, max_size=4))
def test_uneven_chains_keep_equal_counts_and_read_everything(n, drop_last, shuffle, chain):
    """Any world sizes, any stopping points: every rank the same count at every stage; without
    drop_last every index read, a repeat only for padding (fewer than the ranks of each stage);
    with drop_last nothing read twice. After the chain the next epoch is torch's order."""
    seen, state = [], None
    for world, fraction in chain + [(chain[-1][0] % 7 + 1, 1.0)]:
        orders = []
        for rank in range(world):
            s = DistributedSampler(n, num_replicas=world, rank=rank, seed=2, shuffle=shuffle, drop_last=drop_last)
            if state is not None:
                s.load_state_dict(state)
            s.set_epoch(3)
            orders.append((s, list(s)))
        assert len({len(o) for _, o in orders}) == 1 and len(orders[0][0]) == len(orders[0][1])
        take = int(fraction * len(orders[0][1]))
        seen += [i for _, o in orders for i in o[:take]]
        state = orders[0][0].state_dict(num_samples=take)
    counts = Counter(seen)
    if drop_last:
        assert max(counts.values(), default=1) == 1
    else:
        assert set(counts) == set(range(n))
        assert len(seen) - n < sum(w for w, _ in chain) + chain[-1][0] % 7 + 1
    last = chain[-1][0] % 7 + 1
    nxt = DistributedSampler(n, num_replicas=last, rank=last - 1, seed=2, shuffle=shuffle, drop_last=drop_last)
    nxt.load_state_dict(state)
    nxt.set_epoch(4)
    ref = TorchDistributedSampler(range(n), num_replicas=last, rank=last - 1, seed=2, shuffle=shuffle,
                                  drop_last=drop_last)
    ref.set_epoch(4)
    assert list(nxt) == list(ref)


def test_foreign_and_mismatched_states_are_refused(tmp_path):
    s = DistributedSampler(40, num_replicas=4, rank=1, seed=3)
    s.set_epoch(2)
    state = s.state_dict(num_samples=4)
    fresh = lambda **kw: DistributedSampler(40, **{"num_replicas": 3, "rank": 0, "seed": 3, **kw})  # noqa: E731
    with pytest.raises(ValueError, match="seed=3, this sampler 4"):
        fresh(seed=4).load_state_dict(state)
    with pytest.raises(ValueError, match="shuffle=True, this sampler False"):
        fresh(shuffle=False).load_state_dict(state)
    with pytest.raises(ValueError, match="count=40, this sampler 41"):
        DistributedSampler(41, num_replicas=3, rank=0, seed=3).load_state_dict(state)
    for done in (fresh(), DistributedSampler(40, num_replicas=4, rank=0, seed=3)):  # past the 10: the pass is done
        done.load_state_dict({**state, "position": 11})
        assert list(done) == [] and len(done) == 0
    with pytest.raises(ValueError, match="position must be an integer >= 0"):
        fresh().load_state_dict({**state, "position": -1})
    with pytest.raises(ValueError, match=r"the state lacks \['position'\]"):
        fresh().load_state_dict({k: v for k, v in state.items() if k != "position"})
    with pytest.raises(ValueError, match="num_samples must be an integer >= 0"):
        s.state_dict(num_samples=-1)
    # another order's state: a Loader's has the same fields and would resume in the wrong order
    pack_images(write_image_folder(tmp_path / "imgs", count=40, classes=2, size=(8, 8)), tmp_path / "p.lmdb",
                format="lmdb", run_options=RunOptions(workers=0))
    loader = Loader(PackedDataset(tmp_path / "p.lmdb", decode="bytes"), batch_size=4, seed=3, shuffle=True,
                    rank=0, world_size=4)
    with pytest.raises(ValueError, match="the state is a Loader's or StreamingDataset's, not a packer.data.Distri"):
        fresh().load_state_dict(loader.state_dict())
    with pytest.raises(PackerError, match="the state is packer.data.DistributedSampler, this order a Loader's"):
        loader.load_state_dict(state)
    # the multigrid sampler: its own kind, its stage's shapes, a resumable index order
    mg = MultigridBatchSampler(40, schedule(), seed=3, num_replicas=4, rank=1, epoch=2)
    mstate = mg.state_dict(num_batches=2)
    assert mstate["indices"]["position"] == 3 and mstate["batches"] == 2
    with pytest.raises(ValueError, match="not a packer.data.multigrid.MultigridBatchSampler state"):
        mg.load_state_dict(state)
    with pytest.raises(ValueError, match="the state is packer.data.multigrid.MultigridBatchSampler, not"):
        fresh().load_state_dict(mstate)
    other = MultigridSchedule(base_batch_size=2, num_frames=4, crop_size=32, lr_steps=[0], max_epoch=4,
                              long_cycle=False, short_cycle_factors=(0.7071,))
    with pytest.raises(ValueError, match="epoch 2 has shapes"):
        MultigridBatchSampler(40, other, seed=3, num_replicas=2, rank=0).load_state_dict(mstate)
    with pytest.raises(ValueError, match="drop_last=False, this sampler True"):
        MultigridBatchSampler(40, schedule(), seed=3, num_replicas=2, rank=0, drop_last=True).load_state_dict(mstate)
    with pytest.raises(ValueError, match="do not agree"):
        mg.load_state_dict({**mstate, "epoch": 3})
    with pytest.raises(ValueError, match="seed=3, this sampler 4"):
        MultigridBatchSampler(40, schedule(), seed=4, num_replicas=2, rank=0).load_state_dict(mstate)
    past = MultigridBatchSampler(40, schedule(), num_replicas=2, rank=0)  # past the 13: the pass is done
    assert past.state_dict(num_batches=14) == past.state_dict(num_batches=13)
    with pytest.raises(ValueError, match=r"num_batches must be an integer >= 0"):
        past.state_dict(num_batches=-1)
    wrapped = MultigridBatchSampler(TorchDistributedSampler(range(40), num_replicas=2, rank=0), schedule())
    with pytest.raises(ValueError, match="wrapped DistributedSampler has no resumable order"):
        wrapped.state_dict(num_batches=1)
    ours = MultigridBatchSampler(DistributedSampler(40, num_replicas=4, rank=1, seed=3), schedule(), seed=3, epoch=2)
    assert ours.state_dict(num_batches=2) == mstate  # wrapping packer's sampler: the same state
    assert list(ours) == list(mg)

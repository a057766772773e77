"""Every state a documented training loop can save loads, and resumes exactly.

The README's loop saves ``state_dict(num_samples=(step + 1) * B)`` at every step while
DataLoader workers (or ``Loader`` threads) read ahead of the loop. Each case reads an epoch of
a real TFRecord pack with 4 damaged records (``on_corrupt="skip"``, ``max_skipped=4``: every
one of them, not one more) on simulated ranks, saves a state at every step, and resumes from
each state on the same and on another world size:

* every state loads: after a short last batch ``(step + 1) * B`` is past the rank's share,
  which means the pass is done (as torch's ``DistributedSampler`` reads it);
* the state carries exactly the skips before its position, whatever the workers read ahead;
* across the checkpoint every slot of the epoch is read once: every good sample at least once,
  each damaged record replaced by exactly one valid sample, and skipped once, never past the cap;
* a negative or non-integer count is refused with ``UsageError``.
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import DataLoader

from packer import Loader, PackedDataset, StreamingDataset
from packer.commands.pack_images import pack_images
from packer.errors import UsageError
from packer.formats import open_reader
from packer.conversion.options import RunOptions
from tests.support.elastic import no_collate
from tests.support.faults import flip_record_byte
from tests.support.inputs import write_image_folder

PER_SHARD = 15
DAMAGED = [(0, 5), (1, 11), (2, 2), (3, 8)]  # (shard, record) of the 60
CAP = len(DAMAGED)
EPOCH = 1


@dataclass
class Packs:
    damaged: Path  # 60 samples, 4 shards, DAMAGED flipped
    clean: Path  # 12 other samples (the mix's second source)
    ids: dict[tuple[int, bytes], int]  # (source, stored bytes) -> the sample's position in the (mixed) stream
    bad: set[int]  # positions of the damaged records


@pytest.fixture(scope="module")
def packs(tmp_path_factory) -> Packs:
    root = tmp_path_factory.mktemp("resume_states")
    damaged, clean = root / "damaged", root / "clean"
    pack_images(write_image_folder(root / "src", count=60, classes=3, size=(8, 8)), damaged, format="records",
                writer_options={"samples_per_shard": PER_SHARD}, run_options=RunOptions(workers=0))
    pack_images(write_image_folder(root / "src2", count=12, classes=2, size=(8, 8), seed=7), clean,
                format="records", run_options=RunOptions(workers=0))
    shards = sorted(damaged.glob("*.tfrecord"))
    for shard, record in DAMAGED:
        flip_record_byte(shards[shard], record)
    ids, offset = {}, 0
    for source, path in enumerate((damaged, clean)):
        reader = open_reader(path, check_crc=False)
        ids.update({(source, reader.read(i).data): offset + i for i in range(len(reader))})
        offset += len(reader)
    return Packs(damaged, clean, ids, {shard * PER_SHARD + record for shard, record in DAMAGED})


@dataclass
class Pass:
    """One rank's pass: the slots it read from (sample positions, in order), the samples it
    yielded, the state saved after each step and the skips it lists at the end."""

    slots: list[int]
    got: list[int]
    states: list[dict[str, Any]]
    skipped: list[int]


def stream_pass(packs: Packs, how: str, rank: int, world: int, batch: int, state: dict | None) -> Pass:
    """The README's loop on one rank: ``StreamingDataset`` (one pack, or mixed with a clean one)
    through ``DataLoader(num_workers=2)``, or a ``Loader`` with 2 threads."""
    kw = dict(on_corrupt="skip", max_skipped=CAP)
    if how == "loader":
        ds = Loader(PackedDataset(packs.damaged, decode="bytes"), batch_size=batch, shuffle=True, seed=5,
                    num_threads=2, rank=rank, world_size=world, collate=no_collate, **kw)
    else:
        path = {str(packs.damaged): 1, str(packs.clean): 1} if how == "mix" else packs.damaged
        ds = StreamingDataset(path, decode="bytes", seed=5, block_size=8, batch_size=batch, rank=rank,
                              world_size=world, **({"mix_by": "repeat"} if how == "mix" else {}), **kw)
    if state is not None:
        ds.load_state_dict(json.loads(json.dumps(state)))
    ds.set_epoch(EPOCH)  # the loop's usual call keeps the pending resume
    if how == "loader":
        slots, batches = ds.indices().tolist(), ds
    else:
        slots = ds.order()[ds.state_dict()["position"]:]
        batches = DataLoader(ds, batch_size=batch, num_workers=2, collate_fn=no_collate)
    got, states = [], []
    for step, samples in enumerate(batches):
        got += [packs.ids[(s[2] if how == "mix" else 0, s[0])] for s in samples]
        states.append(json.loads(json.dumps(ds.state_dict() if how == "loader"
                                            else ds.state_dict(num_samples=(step + 1) * batch))))
    skipped = [int(r["index"] if how == "loader" else r["position"]) for r in ds.skipped]
    return Pass(slots, got, states, skipped)


def check_epoch(packs: Packs, slots: list[int], got: list[int], skips: list[int]) -> None:
    """Every slot once: ``got`` is each good slot's sample plus one valid substitute per damaged
    slot; ``skips`` is each damaged slot once."""
    good = set(packs.ids.values()) - packs.bad
    need, have = Counter(slots), Counter(got)
    assert set(slots) >= set(range(60)), "a sample of the epoch was never read"
    assert len(got) == len(slots) and set(got) <= good
    assert all(have[g] >= need[g] for g in need if g in good), "a good sample was lost"
    assert sum(have[g] - need[g] for g in have) == sum(need[b] for b in packs.bad), "a sample read twice"
    assert Counter(skips) == Counter(s for s in slots if s in packs.bad), "a damaged record skipped twice or never"


CASES = [  # (reader, world size, batch size)
    ("stream", 1, 4),  # issue 40's case: 2 workers read ahead past damaged records
    ("stream", 3, 8),  # 20 samples a rank: the last batch is short, its state says 24
    ("mix", 3, 5),  # 72 mixed samples, 24 a rank: short last batch too
    ("loader", 1, 4),
    ("loader", 3, 8),
]


@pytest.mark.parametrize("how, world, batch", CASES, ids=[f"{h}-{w}-ranks-batch-{b}" for h, w, b in CASES])
def test_every_step_of_an_epoch_resumes_on_the_same_and_another_world_size(packs, how, world, batch):
    first = [stream_pass(packs, how, r, world, batch, None) for r in range(world)]
    check_epoch(packs, sum((p.slots for p in first), []), sum((p.got for p in first), []),
                sum((p.skipped for p in first), []))
    for step in range(len(first[0].states)):
        for new_world in (world, 2 if world != 2 else 3):
            before_slots, before_got, before_skips = [], [], []
            for p in first:
                state = p.states[step]
                position = state["position"]
                assert position == min((step + 1) * batch, len(p.slots))  # past the end: the pass is done
                before_slots += p.slots[:position]
                before_got += p.got[:position]
                assert Counter(state["skipped"]) == Counter(s for s in p.slots[:position] if s in packs.bad), \
                    f"step {step}: the state carries skips that are not before its position"
                before_skips += state["skipped"]
            after_slots, after_got, after_skips, shares = [], [], [], set()
            for r in range(new_world):  # the same world: each rank its own state; another: rank 0's
                state = (first[r] if new_world == world else first[0]).states[step]
                p = stream_pass(packs, how, r, new_world, batch, state)
                assert len(p.skipped) <= CAP
                own = Counter(p.skipped) - Counter(state["skipped"])
                assert own == Counter(s for s in p.slots if s in packs.bad)
                after_slots += p.slots
                after_got += p.got
                after_skips += own.elements()
                shares.add(len(p.got))
            assert len(shares) == 1  # every rank the same count: DDP never waits on one
            check_epoch(packs, before_slots + after_slots, before_got + after_got, before_skips + after_skips)


@pytest.mark.parametrize("count", [-5, 10.7, True, "8"])
def test_a_negative_or_non_integer_count_is_refused(packs, count):
    stream = StreamingDataset(packs.damaged, decode="bytes", rank=0, world_size=3)
    mix = StreamingDataset({str(packs.damaged): 1, str(packs.clean): 1}, decode="bytes", rank=0, world_size=3)
    loader = Loader(PackedDataset(packs.damaged, decode="bytes"), batch_size=8, rank=0, world_size=3)
    for ds in (stream, mix):
        with pytest.raises(UsageError, match=r"num_samples must be an integer >= 0 \(samples consumed\)"):
            ds.state_dict(num_samples=count)
    for ds in (stream, mix, loader):
        state = ds.state_dict(num_samples=8) if ds is not loader else ds.state_dict()
        with pytest.raises(UsageError, match=r"position must be an integer >= 0 \(samples consumed\)"):
            ds.load_state_dict({**state, "position": count})

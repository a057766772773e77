"""The stages of the elastic-resume tests: a world size and how far each rank reads before
the next resume (tests/data/test_elastic_resume.py, tests/data/test_mixing_sources.py), and
``check_resumes``, a mid-epoch resume on one rank (tests/data/test_*_fields.py)."""
from __future__ import annotations

import json

from torch.utils.data import DataLoader

from packer import StreamingDataset

# (world size, DataLoader steps of 3 samples each rank reads before the next resume; None: to the end)
STAGES = [(8, 2), (3, 3), (5, 1), (1, None)]


def no_collate(batch):
    return batch


def stream_stage(path, ids, world, steps, state, kw):
    """Every rank of one stage: load ``state``, read ``steps`` batches (all: None); the samples
    read per rank and one rank's state afterwards."""
    per_rank, states = [], []
    for rank in range(world):
        ds = StreamingDataset(path, rank=rank, world_size=world, **kw)
        if state is not None:
            ds.load_state_dict(json.loads(json.dumps(state)))
        ds.set_epoch(1)  # the loop's usual call keeps the pending resume
        got = []
        for step, batch in enumerate(DataLoader(ds, batch_size=3, num_workers=2, collate_fn=no_collate)):
            if steps is not None and step == steps:
                break
            got += [ids[sample[0]] for sample in batch]  # (image, label) or a mix's (image, label, source)
        per_rank.append(got)
        states.append(ds.state_dict(num_samples=len(got)))
    return per_rank, states


def check_resumes(open_pass, *, stops=(0, 2)) -> list:
    """A state saved after each step in ``stops`` resumes with exactly the ``image_id``s the
    uninterrupted pass had left. ``open_pass(state)`` starts a pass (resumed from ``state``,
    None: from the start) and returns its batches (dicts with ``image_id``) and ``state_of(step)``,
    the state to save after that step. Returns the uninterrupted pass's ids."""
    def run(state, stop):
        batches, state_of = open_pass(None if state is None else json.loads(json.dumps(state)))
        ids, states = [], []
        for step, batch in enumerate(batches):
            ids += batch["image_id"].tolist()
            states.append(state_of(step))
            if step == stop:
                break
        return ids, states

    whole, _ = run(None, None)
    for stop in stops:
        first, states = run(None, stop)
        rest, _ = run(states[-1], None)
        assert first + rest == whole, f"resumed after step {stop}"
    return whole

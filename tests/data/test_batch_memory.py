"""DataLoader workers stack batches into reused shared-memory buffers (packer.data.batch_memory)."""
from __future__ import annotations

import glob
import os

import pytest
import torch
from torch.utils.data import DataLoader

from packer.data import batch_memory, uint8_collate
from tests.support.batches import batch_dataset, needs_memfd

pytestmark = needs_memfd


@pytest.fixture(scope="module")
def dataset(image_folder, tmp_path_factory):
    return batch_dataset(image_folder, tmp_path_factory.mktemp("bm"))


def reference(dataset, collate=None):
    kw = {"collate_fn": collate} if collate else {}
    return list(DataLoader(dataset, batch_size=8, num_workers=0, **kw))


def memfds(pid: int) -> int:
    """The batch buffers ``pid`` has open (an fd closed between the listing and its readlink,
    such as a pipe of the worker's, is not one)."""
    count = 0
    for f in glob.glob(f"/proc/{pid}/fd/*"):
        try:
            count += "packer-batch" in os.readlink(f)
        except FileNotFoundError:
            pass
    return count


@pytest.mark.parametrize("collate,ctx", [(None, "fork"), (None, "spawn"), (uint8_collate, "fork")],
                         ids=["default_collate-fork", "default_collate-spawn", "uint8_collate-fork"])
def test_workers_reuse_a_few_buffers_and_batches_equal_the_reference(dataset, ctx, collate):
    want = reference(dataset, collate)
    kw = {"collate_fn": collate} if collate else {}
    dl = DataLoader(dataset, batch_size=8, num_workers=2, multiprocessing_context=ctx, **kw)
    it = iter(dl)
    n = 0
    for i, (images, labels) in enumerate(it):
        assert not images.is_shared()  # a mapping of a worker's buffer, not torch's segment
        assert labels.is_shared()  # small tensors go torch's way
        assert torch.equal(images, want[i][0]) and torch.equal(labels, want[i][1])
        n += 1
        if i == len(want) - 2:  # workers still alive: count their buffers (2 fds each: ours, mmap's)
            held = [memfds(w.pid) // 2 for w in it._workers]
    assert n == len(want) == 24
    assert all(1 <= h < batch_memory.MAX_BUFFERS for h in held), held


def test_a_worker_without_the_module_or_turned_off_uses_torchs_segments(dataset, monkeypatch):
    monkeypatch.setenv("PACKER_REUSE_BATCHES", "0")
    want = reference(dataset)
    got = list(DataLoader(dataset, batch_size=8, num_workers=2, multiprocessing_context="fork"))
    assert all(images.is_shared() for images, _ in got)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(got, want))


def test_no_worker_stacks_as_torch_does(dataset):
    images, _ = next(iter(DataLoader(dataset, batch_size=8, num_workers=0)))
    assert type(images) is torch.Tensor and not images.is_shared()
    assert batch_memory.stack([torch.zeros(3, 224, 224, dtype=torch.uint8)] * 8) is None


def test_batches_of_changing_sizes_fit_grow_and_equal_the_reference(dataset):
    sizes = [8, 16, 8, 24, 8, 12, 32, 8, 16, 8, 24, 8] * 2
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    batches = [[i % len(dataset) for i in range(s, s + k)] for s, k in zip(starts, sizes)]
    want = list(DataLoader(dataset, batch_sampler=batches, num_workers=0))
    shared = []
    for i, (images, labels) in enumerate(DataLoader(dataset, batch_sampler=batches, num_workers=2,
                                                    multiprocessing_context="fork")):
        assert torch.equal(images, want[i][0]) and torch.equal(labels, want[i][1])
        shared.append(images.is_shared())
    assert len(shared) == len(sizes) and not any(shared)  # every size found or grew a buffer


def _to_224(image: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.interpolate(image[None].float(), size=(224, 224)).to(torch.uint8)[0]


def test_streaming_dataset_workers_reuse_buffers_too(dataset):
    from packer import StreamingDataset

    path = dataset.dataset.path
    stream = StreamingDataset(path, decode="tensor", transform=_to_224, batch_size=8, shuffle=False)
    want = list(DataLoader(stream, batch_size=8, num_workers=0))
    got = []
    for images, labels in DataLoader(stream, batch_size=8, num_workers=2, multiprocessing_context="fork"):
        got.append((images.is_shared(), images.clone(), labels))
    assert len(got) == len(want)
    assert not any(shared for shared, _, _ in got)
    assert all(torch.equal(g[1], w[0]) and torch.equal(g[2], w[1]) for g, w in zip(got, want))

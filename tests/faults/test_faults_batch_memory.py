"""Reused batch buffers never overwrite a batch someone can still see (packer.data.batch_memory).

Each case keeps batches, views of them or a forked child's copy the way a training loop might,
runs more batches than a worker has buffers, and checks every kept pixel at the end."""
from __future__ import annotations

import os
import select
import signal

import pytest
import torch
from torch.utils.data import DataLoader, default_collate

from packer.data import batch_memory
from tests.support.batches import batch_dataset, needs_memfd

pytestmark = needs_memfd


@pytest.fixture(scope="module")
def dataset(image_folder, tmp_path_factory):
    return batch_dataset(image_folder, tmp_path_factory.mktemp("bm"))


@pytest.fixture(scope="module")
def want(dataset):
    return [images for images, _ in DataLoader(dataset, batch_size=8, num_workers=0)]


def loader(dataset, ctx="fork", **kw):
    return DataLoader(dataset, batch_size=8, num_workers=2, multiprocessing_context=ctx, **kw)


def test_every_batch_kept_by_the_loop_keeps_its_pixels(dataset, want):
    """(Spawned workers send batches the same way: tests/data/test_batch_memory.py.)"""
    assert 24 // 2 > batch_memory.MAX_BUFFERS
    kept = [images for images, _ in loader(dataset)]
    assert not kept[0].is_shared()  # they came by buffer
    assert all(torch.equal(a, b) for a, b in zip(kept, want, strict=True))


def test_views_and_arrays_of_dropped_batches_keep_their_pixels(dataset, want):
    kept = []
    for i, (images, _) in enumerate(loader(dataset)):
        pick = i % 4
        kept.append([images[3:5], images.view(-1)[::7], images.numpy(), images.permute(0, 2, 3, 1)][pick])
        del images  # the batch itself is let go; only the view holds its buffer
    for i, got in enumerate(kept):
        w = want[i]
        ref = [w[3:5], w.view(-1)[::7], w.numpy(), w.permute(0, 2, 3, 1)][i % 4]
        assert torch.equal(torch.as_tensor(got), torch.as_tensor(ref)), i


def _batch_and_a_view(samples):
    images, labels = default_collate(samples)
    return images, labels, images[:, 0]  # the view goes torch's way: a copy, not the buffer


def test_a_view_returned_beside_its_batch_by_a_custom_collate(dataset, want):
    views = [view for _, _, view in loader(dataset, collate_fn=_batch_and_a_view)]
    assert all(torch.equal(v, w[:, 0]) for v, w in zip(views, want, strict=True))


def test_a_batch_kept_across_a_fork_is_never_reused(dataset, want):
    """A forked child of the training process may still read a batch the parent let go."""
    it = iter(loader(dataset))
    first, _ = next(it)
    pixels, expected = first.numpy(), want[0].numpy().tobytes()  # numpy in the child: torch's threads do not survive a fork
    r, w = os.pipe()
    r2, w2 = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: wait until the parent has moved on, then read the inherited batch
        try:
            os.close(w), os.close(r2)
            os.read(r, 1)
            os.write(w2, b"1" if pixels.tobytes() == expected else b"0")
        finally:
            os._exit(0)
    os.close(r), os.close(w2)
    del first, pixels
    for i, (images, _) in enumerate(it, start=1):
        assert torch.equal(images, want[i])
    os.write(w, b"x")
    ready, _, _ = select.select([r2], [], [], 60)
    answer = os.read(r2, 1) if ready else b"timeout"
    os.kill(pid, signal.SIGKILL) if not ready else None
    os.waitpid(pid, 0)
    assert answer == b"1", "the child read another batch's pixels"

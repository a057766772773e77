"""packer.Loader: coverage per rank set, determinism, the buffer contract, clean shutdown, errors."""
from __future__ import annotations

import _thread
import collections
import gc
import json
import threading
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as tmp
from torch.utils.data import DataLoader, DistributedSampler

from packer import DevicePrefetcher, FrameDataset, Loader, PackedDataset, PackedVideoDataset
from packer.errors import UsageError
from packer.data import DecodeResizeCrop, LoaderError, uint8_collate
from packer.formats import FORMATS
from packer.commands.pack_images import pack_images
from packer.conversion.options import RunOptions
from tests.support.inputs import write_image_folder


def loader_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("packer-loader")]


class Indexed(torch.utils.data.Dataset):
    """Sample i: a 3x4x5 uint8 image filled with i % 251, and i (a label that names the sample)."""

    def __init__(self, n: int, *, fail_at: int | None = None, delay: float = 0.0):
        self.n, self.fail_at, self.delay = n, fail_at, delay
        self.keys = [f"k{i}" for i in range(n)]

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if self.delay:
            time.sleep(self.delay)
        if i == self.fail_at:
            raise ValueError("broken sample")
        return torch.full((3, 4, 5), i % 251, dtype=torch.uint8), i


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("loader")
    src = write_image_folder(root / "src", count=30, classes=3)
    out = {}
    for fmt in sorted(f for f in FORMATS if f != "frames"):
        pack_images(src, root / fmt, format=fmt, run_options=RunOptions(workers=0))
        out[fmt] = root / fmt
    return out


# -- order: coverage, equal batches per rank, determinism ---------------------------------------
@pytest.mark.parametrize("n,world,batch,drop_last", [(25, 2, 4, False), (25, 3, 4, True), (7, 2, 3, False),
                                                     (24, 1, 5, False), (24, 4, 5, True)])
def test_every_index_once_per_epoch_and_equal_batches_per_rank(n, world, batch, drop_last):
    ds = Indexed(n)
    seen, batches = collections.Counter(), []
    for rank in range(world):
        loader = Loader(ds, batch_size=batch, shuffle=True, seed=3, num_threads=2, drop_last=drop_last,
                        rank=rank, world_size=world)
        loader.set_epoch(5)
        got = list(loader)
        batches.append(len(got))
        assert len(got) == len(loader)
        for images, labels in got:
            assert torch.equal(images[:, 0, 0, 0], (labels % 251).to(torch.uint8))
            seen.update(labels.tolist())
    assert len(set(batches)) == 1
    if drop_last:
        assert max(seen.values()) == 1 and sum(seen.values()) == world * (n // world // batch) * batch
    else:
        assert set(seen) == set(range(n))
        assert sum(seen.values()) - n < world  # only the padding repeats


def test_order_is_deterministic_and_changes_per_epoch():
    ds = Indexed(40)

    def labels(loader):
        return [b[1].tolist() for b in loader]

    a, b = Loader(ds, batch_size=8, shuffle=True, seed=1), Loader(ds, batch_size=8, shuffle=True, seed=1, num_threads=3)
    first = labels(a)
    assert first == labels(b)  # same seed, any number of threads
    assert sorted(sum(first, [])) == list(range(40))
    second = labels(a)  # the next pass is epoch 1 without set_epoch
    assert second != first
    a.set_epoch(0)
    assert labels(a) == first
    assert labels(Loader(ds, batch_size=8, shuffle=True, seed=2)) != first
    assert labels(Loader(ds, batch_size=8)) == [list(range(i, i + 8)) for i in range(0, 40, 8)]
    assert [x.tolist() for x in np.split(a.indices(0), 5)] == first


def test_sampler_decides_the_order_and_gets_set_epoch():
    ds = Indexed(21)
    sampler = DistributedSampler(ds, num_replicas=2, rank=1, shuffle=True, seed=4)
    loader = Loader(ds, batch_size=4, sampler=sampler)
    loader.set_epoch(2)
    sampler_ref = DistributedSampler(ds, num_replicas=2, rank=1, shuffle=True, seed=4)
    sampler_ref.set_epoch(2)
    assert sum((b[1].tolist() for b in loader), []) == list(sampler_ref)
    assert len(loader) == 3
    with pytest.raises(UsageError, match="not both"):
        Loader(ds, batch_size=4, sampler=sampler, shuffle=True)


# -- output equals the DataLoader + uint8_collate ---------------------------------------------------
@pytest.mark.parametrize("fmt", ["lmdb", "hdf5", "records"])
def test_batches_equal_dataloader_with_uint8_collate(packed, fmt):
    ds = PackedDataset(packed[fmt], decode=DecodeResizeCrop(32, 24))
    loader = Loader(ds, batch_size=7, shuffle=True, seed=9, num_threads=2)
    order = loader.indices(0).tolist()
    ref = DataLoader(ds, batch_size=7, sampler=order, collate_fn=uint8_collate)
    pairs = list(zip(loader, ref))
    assert len(pairs) == len(loader) == 5
    for (images, labels), (ref_images, ref_labels) in pairs:
        assert images.dtype == torch.uint8 and images.shape[1:] == (3, 24, 24)
        assert torch.equal(images, ref_images) and torch.equal(labels, ref_labels)


def test_dict_samples_and_arrays_and_user_collate():
    class Dicts(Indexed):
        def __getitem__(self, i):
            image, label = super().__getitem__(i)
            return {"image": image.permute(1, 2, 0).numpy(), "label": label, "name": f"s{i}"}

    ds = Dicts(10)
    batch = next(iter(Loader(ds, batch_size=4)))
    ref = uint8_collate([ds[i] for i in range(4)])
    assert torch.equal(batch["image"], ref["image"]) and batch["image"].shape == (4, 3, 4, 5)
    assert torch.equal(batch["label"], ref["label"]) and batch["name"] == ["s0", "s1", "s2", "s3"]
    got = list(Loader(ds, batch_size=4, collate=lambda samples: [s["label"] for s in samples]))
    assert got == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


@pytest.mark.parametrize("kind", ["FrameDataset", "PackedVideoDataset"])
def test_video_datasets(tmp_path, kind):
    from tests.support.inputs import write_video
    from packer.commands.decode_frames import decode_frames

    for i in range(5):
        write_video(tmp_path / "src" / f"c{i % 2}" / f"v{i}.mp4", frames=6 + i, seed=i)
    if kind == "FrameDataset":
        decode_frames(tmp_path / "src", tmp_path / "frames", run_options=RunOptions(workers=0, timeout=600.0))
        ds = FrameDataset(tmp_path / "frames", test_mode=True, clip_len=2, crop_size=32)
    else:
        decode_frames(tmp_path / "src", tmp_path / "packed", to="records",
                      run_options=RunOptions(workers=0, timeout=600.0))
        ds = PackedVideoDataset(tmp_path / "packed", test_mode=True, clip_len=2, crop_size=32)
    got = list(Loader(ds, batch_size=2, num_threads=2))
    ref = list(DataLoader(ds, batch_size=2, collate_fn=uint8_collate))
    assert len(got) == len(ref) == 3
    for (clips, labels), (ref_clips, ref_labels) in zip(got, ref):
        assert clips.dim() == 5 and torch.equal(clips, ref_clips) and torch.equal(labels, ref_labels)


def test_shape_mismatch_names_the_sample():
    class Ragged(Indexed):
        def __getitem__(self, i):
            image, label = super().__getitem__(i)
            return (image[:, :3] if i == 6 else image), label

    with pytest.raises(LoaderError, match=r"sample 6 \('k6'\).*shape \(3, 3, 5\)"):
        list(Loader(Ragged(10), batch_size=4, num_threads=2))
    assert loader_threads() == []


# -- the buffer contract --------------------------------------------------------------------------
def test_held_batches_are_never_overwritten_and_dropped_ones_are_reused():
    ds = Indexed(400)
    loader = Loader(ds, batch_size=10, num_threads=2, prefetch=2)
    held = [b for b in loader]  # every batch kept: none may be refilled
    for k, (images, labels) in enumerate(held):
        assert labels.tolist() == list(range(10 * k, 10 * k + 10))
        assert torch.equal(images[:, 0, 0, 0], (labels % 251).to(torch.uint8))
    assert loader.pool.allocated == 40
    del held, images, labels
    loader = Loader(ds, batch_size=10, num_threads=2, prefetch=2)
    for images, labels in loader:  # the previous batch is let go as the next one arrives
        assert torch.equal(images[:, 0, 0, 0], (labels % 251).to(torch.uint8))
    assert loader.pool.allocated <= loader.prefetch + 3


def test_a_numpy_view_or_slice_keeps_the_buffer():
    ds = Indexed(200)
    loader = Loader(ds, batch_size=10, num_threads=2, prefetch=1)
    kept = []
    for k, (images, labels) in enumerate(loader):
        if k % 3 == 0:
            kept.append((k, images.numpy()))  # only a numpy array over the batch survives
        elif k % 3 == 1:
            kept.append((k, images[2:5]))  # only a slice survives
    for k, view in kept:
        start = 10 * k + (2 if k % 3 == 1 else 0)
        assert [int(v) for v in np.asarray(view)[:, 0, 0, 0]] == list(range(start, start + len(view)))


# -- shutdown and errors --------------------------------------------------------------------------
def test_break_exception_and_unstarted_iterators_leave_no_threads():
    loader = Loader(Indexed(200, delay=0.001), batch_size=4, num_threads=3)
    for k, _ in enumerate(loader):
        if k == 2:
            break
    assert loader_threads() == []
    with pytest.raises(RuntimeError, match="in the training step"):
        for _ in loader:
            raise RuntimeError("in the training step")
    assert loader_threads() == []
    it = iter(loader)
    next(it)
    del it
    assert loader_threads() == []
    iter(loader)  # never iterated: starts nothing
    assert loader_threads() == []


def test_a_script_that_exits_with_a_pass_suspended_exits_cleanly(packed):
    """A user's script that takes a few batches and ends (no break, no del: the pass is suspended
    at exit, its threads decoding the next batches) exits 0. Before atexit closed the running
    passes, a thread stopped inside the decoder at shutdown aborted the process (exit 134,
    "FATAL: exception not rethrown")."""
    script = (
        "import packer\n"
        "from packer.data import DecodeResizeCrop\n"
        f"ds = packer.PackedDataset({str(packed['lmdb'])!r}, decode=DecodeResizeCrop(32, 24))\n"
        "it = iter(packer.Loader(ds, batch_size=4, shuffle=True, num_threads=2))\n"
        "images, labels = next(it)\n"
        "print(tuple(images.shape))\n")
    for _ in range(3):
        got = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
        assert got.returncode == 0, got.stderr[-2000:]
        assert got.stdout.strip() == "(4, 3, 24, 24)" and "Exception ignored" not in got.stderr, got.stderr


def test_keyboard_interrupt_shuts_down_cleanly():
    class Interrupting(Indexed):
        def __getitem__(self, i):
            if i == 30:
                _thread.interrupt_main()  # Ctrl-C arrives while the main thread waits for a batch
            return super().__getitem__(i)

    loader = Loader(Interrupting(2000, delay=0.002), batch_size=8, num_threads=2)
    # The interrupt is a pending call: the main thread raises it in whatever Python code it runs
    # next. In a long-lived xdist worker that can be a finalizer (__del__, a weakref callback, a
    # generator's finally) of an earlier test's garbage, collected right then, and an exception
    # there is only printed ("Exception ignored in"): the Ctrl-C was lost, not the loader's doing.
    # Collected before, and no collection while the interrupt is pending.
    # And interrupt_main() does nothing unless Python handles SIGINT: an earlier test in the same
    # process (Ray's in-process start, say) may have left it ignored; Ctrl-C is Python's here.
    gc.collect()
    gc.disable()
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            for _ in loader:
                time.sleep(0.01)
    finally:
        signal.signal(signal.SIGINT, previous)
        gc.enable()
    assert loader_threads() == []


@pytest.mark.parametrize("mode", ["iter_items", "getitems", "one by one"])
def test_errors_name_the_sample(packed, mode):
    class Flaky(PackedDataset):
        def _sample(self, index, rec):
            if self.keys[index].endswith("img_0011.jpg"):
                raise ValueError("cannot decode")
            return super()._sample(index, rec)

    ds = Flaky(packed["lmdb"], decode=DecodeResizeCrop(32, 24))
    if mode != "iter_items":
        ds.iter_items = None  # the DataLoader's __getitems__ path (read all, then find the bad one)
    if mode == "one by one":
        ds.__getitems__ = None
    bad = next(i for i, k in enumerate(ds.keys) if k.endswith("img_0011.jpg"))
    with pytest.raises(LoaderError) as info:
        for _ in Loader(ds, batch_size=5, num_threads=2):
            pass
    msg = str(info.value)
    assert f"sample {bad} ('{ds.keys[bad]}') of {packed['lmdb']}" in msg and "cannot decode" in msg
    assert info.value.index == bad and isinstance(info.value.__cause__, ValueError)
    assert loader_threads() == []


def test_device_prefetcher_takes_it_unchanged(packed):
    ds = PackedDataset(packed["hdf5"], decode=DecodeResizeCrop(32, 24))
    loader = Loader(ds, batch_size=8, num_threads=2)
    ref = DataLoader(ds, batch_size=8, collate_fn=uint8_collate)
    got = list(DevicePrefetcher(loader, device="cpu"))
    want = list(DevicePrefetcher(ref, device="cpu"))
    assert len(got) == len(want) == len(DevicePrefetcher(loader, device="cpu")) == 4
    for (a, la), (b, lb) in zip(got, want):
        assert a.dtype == torch.float32 and torch.equal(a, b) and torch.equal(la, lb)


# -- 2 real gloo ranks ----------------------------------------------------------------------------
def _rank_main(rank: int, world: int, path: str, port: int, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        ds = PackedDataset(path, decode=DecodeResizeCrop(32, 24))
        loader = Loader(ds, batch_size=4, shuffle=True, seed=7, num_threads=2)
        loader.set_epoch(3)
        keys, batches = [], 0
        for _, labels in loader:
            batches += 1
        for i in loader.indices(3):
            keys.append(ds.keys[int(i)])
        counts = torch.tensor([batches])
        dist.all_reduce(counts)
        Path(out, f"rank{rank}.json").write_text(json.dumps({"keys": keys, "batches": batches,
                                                             "total": int(counts)}))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_gloo_ranks_cover_the_dataset_with_equal_batches(packed, tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tmp.spawn(_rank_main, args=(2, str(packed["records"]), port, str(tmp_path)), nprocs=2, join=True)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    ds = PackedDataset(packed["records"], decode="bytes")
    assert ranks[0]["batches"] == ranks[1]["batches"] == 4 and ranks[0]["total"] == 8
    seen = collections.Counter(ranks[0]["keys"] + ranks[1]["keys"])
    assert set(seen) == set(ds.keys) and sum(seen.values()) == 30 and max(seen.values()) == 1

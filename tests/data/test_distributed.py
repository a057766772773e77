"""Training across ranks: 2 gloo ranks x 2 DataLoader workers (real ``torch.distributed`` on the
CPU, ``torch.multiprocessing.spawn``) see, in one epoch, the whole dataset between them, with the
same number of samples on every rank.

One ``DistCase`` per dataset class: how to write its data and how to open it. Map-style datasets
get a ``DistributedSampler``; iterable ones (``sampler=False``) split themselves by rank and worker.
"""
from __future__ import annotations

import collections
import functools
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as tmp
from torch.utils.data import DataLoader, DistributedSampler

from packer import FrameDataset, PackedDataset, PackedVideoDataset, StreamingDataset
from packer.formats import FORMATS
from packer.commands.pack_images import pack_images
from packer.conversion.options import RunOptions
from tests.support.inputs import write_image_folder

# xdist: these tests share one worker, so the 2-rank spawn (a module fixture) runs once
pytestmark = pytest.mark.xdist_group("distributed")

WORLD = 2
WORKERS = 2
EPOCH = 3  # a shuffled epoch other than the first


@dataclass(frozen=True)
class DistCase:
    """A dataset class under test: ``prepare(dir)`` writes its data once, ``make(dir)`` opens it
    (in the test process and in every rank); ``sampler``: map-style, give it a DistributedSampler."""

    prepare: Callable[[Path], None]
    make: Callable[[Path], Any]
    sampler: bool = True


def _pack_images(data: Path, fmt: str) -> None:
    src = write_image_folder(data / "src", count=25, classes=3)  # odd: the sampler pads a rank
    pack_images(src, data / "packed", format=fmt, run_options=RunOptions(workers=0))


def _open_packed(data: Path) -> PackedDataset:
    return PackedDataset(data / "packed", decode="bytes")


def _decode_videos(data: Path) -> None:
    """7 short videos of 6..12 frames in 2 classes, as frame folders and packed into LMDB."""
    from tests.support.inputs import write_video
    from packer.commands.decode_frames import decode_frames

    for i in range(7):
        write_video(data / "src" / f"c{i % 2}" / f"v{i}.mp4", frames=6 + i, seed=i)
    decode_frames(data / "src", data / "frames", run_options=RunOptions(workers=0, timeout=600.0))
    decode_frames(data / "src", data / "packed", to="lmdb", run_options=RunOptions(workers=0, timeout=600.0))


def _frame_dataset(data: Path) -> FrameDataset:
    return FrameDataset(data / "frames", test_mode=True, clip_len=2)


def _packed_video_dataset(data: Path) -> PackedVideoDataset:
    return PackedVideoDataset(data / "packed", test_mode=True, clip_len=2)


CASES: dict[str, DistCase] = {
    f"PackedDataset-{fmt}": DistCase(functools.partial(_pack_images, fmt=fmt), _open_packed)
    for fmt in sorted(FORMATS)
}
CASES["FrameDataset"] = DistCase(_decode_videos, _frame_dataset)
CASES["PackedVideoDataset"] = DistCase(_decode_videos, _packed_video_dataset)
# Every dataset class joins with one line; the iterable StreamingDataset splits itself:
CASES["StreamingDataset"] = DistCase(functools.partial(_pack_images, fmt="records"),
                                     lambda d: StreamingDataset(d / "packed", decode="bytes", shuffle=True),
                                     sampler=False)


def fingerprint(sample: Any) -> str:
    """A stable hash of one sample, whatever its types (bytes, tensors, arrays, numbers, tuples)."""
    h = hashlib.sha1()

    def feed(x: Any) -> None:
        if isinstance(x, (bytes, bytearray, memoryview)):
            h.update(b"b" + bytes(x))
        elif isinstance(x, torch.Tensor):
            feed(x.detach().cpu().numpy())
        elif isinstance(x, np.ndarray):
            h.update(f"a{x.dtype}{x.shape}".encode() + np.ascontiguousarray(x).tobytes())
        elif isinstance(x, (tuple, list)):
            h.update(b"(")
            for y in x:
                feed(y)
            h.update(b")")
        elif isinstance(x, dict):
            for k in sorted(x):
                feed(k)
                feed(x[k])
        else:
            h.update(repr(x).encode())

    feed(sample)
    return h.hexdigest()


def _epoch(case: DistCase, data: Path, rank: int) -> list[str]:
    """What one rank sees of one epoch, through a DataLoader with ``WORKERS`` workers."""
    ds = case.make(data)
    sampler = None
    if case.sampler:
        sampler = DistributedSampler(ds, num_replicas=WORLD, rank=rank, shuffle=True, seed=7)
        sampler.set_epoch(EPOCH)
    elif hasattr(ds, "set_epoch"):
        ds.set_epoch(EPOCH)
    # fork, as DataLoader does by default on Linux: a rank started by spawn would otherwise
    # spawn its workers too (a fresh interpreter and torch import per worker and case)
    loader = DataLoader(ds, batch_size=None, sampler=sampler, num_workers=WORKERS,
                        multiprocessing_context="fork")
    return [fingerprint(s) for s in loader]


def _rank_main(rank: int, jobs: list[tuple[str, str]], init_file: str, result: str) -> None:
    """One rank: every case's epoch in turn, gathered through gloo; rank 0 writes them down."""
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        results = {}
        for case_name, data in jobs:
            try:
                seen: Any = _epoch(CASES[case_name], Path(data), rank)
            except Exception as e:  # reported by that case's test; the ranks stay in step
                seen = {"error": f"rank {rank}: {type(e).__name__}: {e}"}
            everyone: list[Any] = [None] * WORLD
            dist.all_gather_object(everyone, seen)
            results[case_name] = everyone
        if rank == 0:
            Path(result).write_text(json.dumps(results))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def epochs(tmp_path_factory) -> dict[str, Any]:
    """Every case's data and expected samples, and one spawn of 2 ranks that reads them all
    (torch starts once per rank, not once per case)."""
    base = tmp_path_factory.mktemp("dist")
    expected, jobs = {}, []
    for name, case in sorted(CASES.items()):
        data = base / name
        data.mkdir()
        case.prepare(data)
        ds = case.make(data)
        expected[name] = [fingerprint(s) for s in (ds if not case.sampler else (ds[i] for i in range(len(ds))))]
        jobs.append((name, str(data)))
    result = base / "seen.json"
    tmp.spawn(_rank_main, args=(jobs, str(base / "init"), str(result)), nprocs=WORLD, join=True)
    seen = json.loads(result.read_text())
    return {name: (expected[name], seen[name]) for name in CASES}


@pytest.mark.slow
@pytest.mark.parametrize("case_name", sorted(CASES))
def test_ranks_cover_the_dataset_equally(epochs, case_name):
    case = CASES[case_name]
    expected, per_rank = epochs[case_name]
    errors = [r["error"] for r in per_rank if isinstance(r, dict)]
    assert not errors, errors
    assert len(set(expected)) == len(expected)  # samples are distinguishable
    counts = [len(seen) for seen in per_rank]
    assert counts[0] > 0 and len(set(counts)) == 1, f"samples per rank differ: {counts}"
    union = collections.Counter(f for seen in per_rank for f in seen)
    assert set(union) == set(expected), "the ranks together did not see the whole dataset"
    extra = sum(union.values()) - len(expected)  # padding so that every rank gets as many
    assert 0 <= extra < WORLD, f"{extra} samples seen more than once (a worker or rank repeats data)"
    if case.sampler:  # exactly DistributedSampler's split: the DataLoader workers added nothing odd
        want = []
        for r in range(WORLD):
            s = DistributedSampler(range(len(expected)), num_replicas=WORLD, rank=r, shuffle=True, seed=7)
            s.set_epoch(EPOCH)
            want.append([expected[i] for i in s])
        assert per_rank == want

"""Readers during a rewrite (issue 19): a dataset object opened before ``--overwrite`` either
keeps reading the old data or raises ``OutputChanged`` naming the output, for every format
(frame folders read file by file by path, record shards streamed shard by shard included),
never a mix of the old list with new data.

v1 and v2 of each output have the same keys, count and layout but different bytes, so a mix
would pass every count check: each read is compared with v1 and v2 byte for byte.
"""
from __future__ import annotations

import multiprocessing
import os
import pickle
import shutil
import subprocess
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from packer import FrameDataset, PackedDataset, PackedVideoDataset, StreamingDataset
from packer.errors import CorruptData, OutputChanged
from packer.formats import open_reader
from packer.formats.lmdb.env import data_file
from tests.support.inputs import write_image_folder, write_video_folder
from tests.support.killing import run_packer
from scripts.timing import scaled


def _images(tmp_path):
    a = write_image_folder(tmp_path / "a" / "src", count=12, classes=2, size=(40, 52), seed=0)
    b = write_image_folder(tmp_path / "b" / "src", count=12, classes=2, size=(40, 52), seed=1)
    return a, b


def _pack(fmt, src, out, *more):
    argv = [f"to-{fmt}", src, out, "--workers", 0, *more]
    if fmt == "records":
        argv += ["--samples-per-shard", 3]  # several shards: streamed shard by shard
    r = run_packer(*argv)
    assert r.returncode == 0, r.stderr


def _reads(ds, n):
    """Every sample's bytes, or the exception a read raised."""
    out = []
    for i in range(n):
        try:
            out.append(ds.reader.read(i).data)
        except Exception as e:  # noqa: BLE001 - collected and checked by the caller
            out.append(e)
    return out


def _old_or_named_error(got, old, new, path):
    changed = 0
    for i, g in enumerate(got):
        if isinstance(g, Exception):
            assert isinstance(g, OutputChanged), repr(g)
            assert str(path) in str(g)
            changed += 1
        else:
            assert g == old[i], f"sample {i}: {'NEW data under the old manifest' if g == new[i] else 'other bytes'}"
    return changed


@pytest.mark.parametrize("fmt", ["lmdb", "hdf5", "records"])
def test_packed_dataset_opened_before_overwrite(fmt, tmp_path):
    a, b = _images(tmp_path)
    out = tmp_path / ("out.h5" if fmt == "hdf5" else f"out.{fmt}")
    _pack(fmt, a, out)
    r = open_reader(out)
    old = [r.read(i).data for i in range(len(r))]
    r.close()
    lazy = PackedDataset(out, decode="bytes")  # nothing opened yet
    warm = PackedDataset(out, decode="bytes")
    warm[0]  # handles open on the old output
    _pack(fmt, b, out, "--overwrite")
    got_warm, got_lazy = _reads(warm, len(old)), _reads(lazy, len(old))
    r = open_reader(out)  # (in this process, after the old readers: it drops a stale LMDB map)
    new = [r.read(i).data for i in range(len(r))]
    r.close()
    assert len(new) == len(old) and all(x != y for x, y in zip(old, new))
    assert _old_or_named_error(got_lazy, old, new, out) == len(old)  # nothing old left to read
    changed = _old_or_named_error(got_warm, old, new, out)
    if fmt in ("lmdb", "hdf5"):
        assert changed == 0  # an open map / file handle keeps the old file: old data throughout
    # a dataset opened now reads the new version
    assert PackedDataset(out, decode="bytes")[0][0] == new[0]


def test_streaming_records_during_overwrite(tmp_path):
    """StreamingDataset maps record shards one by one: shards first mapped after the overwrite
    are refused (OutputChanged), never read as if the old manifest listed them."""
    a, b = _images(tmp_path)
    out = tmp_path / "out.records"
    _pack("records", a, out)
    old = {PackedDataset(out, decode="bytes").keys[i]: PackedDataset(out, decode="bytes")[i][0] for i in range(12)}
    ds = StreamingDataset(out, shuffle=False, decode="bytes")
    it = iter(ds)
    first = next(it)  # shard 0 mapped
    assert first[0] in old.values()
    _pack("records", b, out, "--overwrite")
    got = [first[0]]
    with pytest.raises(OutputChanged, match="out.records"):
        for image, _ in it:
            got.append(image)
    assert all(g in old.values() for g in got)
    assert len(got) >= 3  # the rest of the mapped shard 0 was still the old data


def _videos(tmp_path):
    src = write_video_folder(tmp_path / "videos", per_class=2, classes=2, frames=10, size=(40, 52))
    return src


@pytest.mark.parametrize("to", ["frames", "lmdb", "records"])
def test_video_datasets_opened_before_overwrite(to, tmp_path):
    """FrameDataset (frame files by path, the issue's case), PackedVideoDataset (any format)."""
    src = _videos(tmp_path)
    out = tmp_path / f"out.{to}"
    run = ["decode-frames", src, out, "--to", to, "--workers", 0]
    assert run_packer(*run, "--quality", 90).returncode == 0
    kw = dict(clip_len=2, num_clips=2, test_mode=True)
    datasets = [PackedVideoDataset(out, **kw)]
    if to == "frames":
        datasets.append(FrameDataset(out, **kw))
    before = [[ds[i][0].clone() for i in range(len(ds))] for ds in datasets]
    fresh = [type(ds)(out, **kw) for ds in datasets]  # opened, never read
    assert run_packer(*run, "--quality", 30, "--overwrite").returncode == 0
    for ds, old in zip(datasets + fresh, before + before):
        for i in range(len(ds)):
            try:
                clip = ds[i][0]
            except OutputChanged as e:
                assert str(out) in str(e)
                continue
            assert np.array_equal(clip.numpy(), old[i].numpy()), f"{type(ds).__name__} video {i}: mixed"
    if to == "frames":  # frame files are opened by path: after the rewrite they are refused
        with pytest.raises(OutputChanged):
            datasets[1][0]


@pytest.mark.parametrize("fmt", ["lmdb", "records"])
def test_reading_while_an_overwrite_runs(fmt, tmp_path):
    """A reader loops over a dataset opened before while a real ``--overwrite`` process runs:
    every read is the old sample or OutputChanged."""
    a, b = _images(tmp_path)
    out = tmp_path / f"out.{fmt}"
    _pack(fmt, a, out)
    r = open_reader(out)
    old = [r.read(i).data for i in range(len(r))]
    r.close()
    ds = PackedDataset(out, decode="bytes")
    from tests.support.killing import packer_cmd, packer_env

    argv = [f"to-{fmt}", b, out, "--workers", 0, "--overwrite"]
    proc = subprocess.Popen(packer_cmd(*argv), env=packer_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    seen = []
    while proc.poll() is None or not seen:
        seen.extend(_reads(ds, len(old)))
        if len(seen) > 20000:
            break
    proc.wait(timeout=scaled(120))
    assert proc.returncode == 0
    assert _old_or_named_error(seen, old * (len(seen) // len(old) + 1), [b""] * len(seen), out) >= 0


class _Guarded(torch.utils.data.Dataset):
    """A dataset's stored bytes by index, or the name and text of the error a read raised (a
    DataLoader worker would otherwise re-raise it as another type)."""

    def __init__(self, ds):
        self.ds = ds

    def __len__(self):
        return len(self.ds)

    def __getitem__(self, i):
        try:
            return self.ds.reader.read(i).data
        except Exception as e:  # noqa: BLE001 - checked by the caller
            return OutputChanged(str(e)) if isinstance(e, OutputChanged) else RuntimeError(repr(e))


def _through_workers(ds, n):
    loader = torch.utils.data.DataLoader(_Guarded(ds), batch_size=None, num_workers=2,
                                         multiprocessing_context="fork", collate_fn=lambda x: x)
    got = list(loader)
    assert len(got) == n
    return got


@pytest.mark.parametrize("fmt", ["lmdb", "hdf5", "records"])
def test_forked_workers_and_pickles_of_a_dataset_opened_before_overwrite(fmt, tmp_path):
    """The guard crosses ``fork`` (DataLoader workers of a dataset opened, and read, in the
    parent) and pickling (``__setstate__`` in another process): each read is the old sample or
    OutputChanged, never the new output under the old manifest."""
    a, b = _images(tmp_path)
    out = tmp_path / ("out.h5" if fmt == "hdf5" else f"out.{fmt}")
    _pack(fmt, a, out)
    warm = PackedDataset(out, decode="bytes")
    old = [warm.reader.read(i).data for i in range(len(warm))]
    lazy = PackedDataset(out, decode="bytes")
    pickled = pickle.dumps(warm)
    _pack(fmt, b, out, "--overwrite")
    for ds in (warm, lazy, pickle.loads(pickled)):
        _old_or_named_error(_through_workers(ds, len(old)), old, [None] * len(old), out)
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as pool:  # unpickled in a fresh interpreter: nothing of the old output open
        got = pool.apply(_read_all_pickled, (pickled, len(old)))
    assert _old_or_named_error(got, old, [None] * len(old), out) == len(old)


def _read_all_pickled(pickled, n):
    ds = _Guarded(pickle.loads(pickled))
    return [ds[i] for i in range(n)]


@pytest.mark.parametrize("swap", ["data.mdb", "every file"])
def test_lmdb_reader_never_maps_a_new_file_given_the_old_identity(swap, tmp_path):
    """A reader opened (unread) on v1 whose data.mdb is deleted and whose inode number the file
    system then gives to another output's data.mdb (size and mtime kept) at the same path: the
    file's identity alone would match, and the new values would be read under v1's manifest
    (silently with check_crc=False). With the whole output swapped file by file the manifest
    says so (OutputChanged); with data.mdb alone, the stored CRCs do (CorruptData)."""
    a, b = _images(tmp_path)
    out, other = tmp_path / "out.lmdb", tmp_path / "other.lmdb"
    _pack("lmdb", a, out)
    _pack("lmdb", b, other)
    r = open_reader(out)
    old = [r.read(i).data for i in range(len(r))]
    r.close()
    lazy = open_reader(out, check_crc=False)
    inode = os.stat(out / "data.mdb").st_ino
    for _ in range(50):  # ext4 hands a freed inode number out again at once, in the same folder
        os.unlink(out / "data.mdb")
        shutil.copy2(other / "data.mdb", out / "data.mdb")
        if os.stat(out / "data.mdb").st_ino == inode:
            break
    if swap == "every file":
        for f in other.iterdir():
            if f.is_file() and f.name != "data.mdb":
                shutil.copy2(f, out / (f.name + ".tmp"))
                os.replace(out / (f.name + ".tmp"), out / f.name)
    # where this file system gave another number, the identity the reader holds is made to
    # match the new file's: exactly what a reused number (with size and mtime) produces
    lazy._mdb = data_file(out)
    got = _reads(SimpleNamespace(reader=lazy), len(old))
    want = OutputChanged if swap == "every file" else CorruptData
    for i, g in enumerate(got):
        assert isinstance(g, want), f"sample {i}: {g!r:.80}"
        assert str(out) in str(g)


def test_lmdb_old_and_new_readers_in_one_process(tmp_path):
    """A reader of the replaced output and one of the new output in one process (a notebook, a
    Loader's threads): the new one reads the new data; the old one, whose environment the new
    open closes, raises OutputChanged (also inside a batched read already under way), never
    CorruptData and never the new data."""
    a, b = _images(tmp_path)
    out = tmp_path / "out.lmdb"
    _pack("lmdb", a, out)
    old_reader = open_reader(out)
    old = [old_reader.read(i).data for i in range(len(old_reader))]
    batch = old_reader.read_many(range(len(old)))
    assert next(batch).data == old[0]  # a read transaction open on the old environment
    _pack("lmdb", b, out, "--overwrite")
    new_reader = open_reader(out)
    new = [new_reader.read(i).data for i in range(len(new_reader))]
    assert all(x != y for x, y in zip(old, new))
    rest = []
    try:
        rest.extend(rec.data for rec in batch)
    except OutputChanged as e:
        rest.append(e)
    _old_or_named_error(rest, old[1:], new[1:], out)
    _old_or_named_error(_reads(SimpleNamespace(reader=old_reader), len(old)), old, new, out)
    assert [new_reader.read(i).data for i in range(len(new))] == new

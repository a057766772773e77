"""Bounded skipping: ``on_corrupt="skip"`` replaces a damaged record by the next valid one, keeps
the per-rank count, reports the keys, and raises past ``max_skipped``; raising stays the default."""
from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
from torch.utils.data import DataLoader

from tests.support.faults import flip_record_byte
from tests.support.inputs import write_image_folder
from packer import Loader, PackedDataset, StreamingDataset
from packer.data import LoaderError
from packer.commands.pack_images import pack_images
from packer.errors import CorruptData, UsageError
from packer.formats import open_reader
from packer.conversion.options import RunOptions

DAMAGED = [(0, 3), (1, 5), (2, 1)]  # (shard, record): 3 records with a flipped byte


@pytest.fixture(scope="module")
def damaged(tmp_path_factory) -> tuple[Path, list[str]]:
    """30 samples in 3 shards of 10, 3 of them with a byte flipped mid-record (CRC mismatch)."""
    root = tmp_path_factory.mktemp("skip")
    src = write_image_folder(root / "src", count=30, classes=3, size=(8, 8))
    out = root / "rec"
    pack_images(src, out, format="records", writer_options={"samples_per_shard": 10},
                run_options=RunOptions(workers=0))
    keys = open_reader(out).keys
    shards = sorted(out.glob("*.tfrecord"))
    bad = []
    for shard_no, record in DAMAGED:
        flip_record_byte(shards[shard_no], record)
        bad.append(keys[shard_no * 10 + record])
    return out, bad


def no_collate(batch):
    return batch


def test_raising_stays_the_default(damaged):
    path, bad = damaged
    with pytest.raises(CorruptData):
        list(StreamingDataset(path, decode="bytes", shuffle=False))


@pytest.mark.parametrize("workers", [0, 2])
def test_skips_three_within_a_cap_of_five_and_reports_them(damaged, workers, caplog):
    path, bad = damaged
    reader = open_reader(path, check_crc=False)
    good = {reader.read(i).data for i in range(30) if reader.keys[i] not in bad}
    ds = StreamingDataset(path, decode="bytes", seed=1, block_size=8, batch_size=3, on_corrupt="skip", max_skipped=5)
    ds.set_epoch(0)
    with caplog.at_level(logging.WARNING, logger="packer.data.streaming"):
        got = [b for batch in DataLoader(ds, batch_size=3, num_workers=workers, collate_fn=no_collate) for b, _ in batch]
    assert len(got) == len(ds) == 30  # the count per rank is kept
    report = ds.skipped
    assert sorted(r["key"] for r in report) == sorted(bad)
    assert all("CRC32C" in r["reason"] for r in report)
    assert len(set(got)) == 27 and set(got) <= good  # the 27 intact ones, 3 of them twice
    if workers == 0:  # (worker processes log in their own process)
        for key in bad:
            assert sum(key in m and "skipping corrupt sample" in m for m in caplog.messages) == 1
    state = json.loads(json.dumps(ds.state_dict(num_samples=30)))
    assert sorted(state["skipped"]) == sorted(r["position"] for r in report)
    resumed = StreamingDataset(path, decode="bytes", seed=1, block_size=8, batch_size=3, on_corrupt="skip",
                               max_skipped=5)
    resumed.load_state_dict(state)
    assert sorted(r["key"] for r in resumed.skipped) == sorted(bad)


def test_cap_of_two_raises_at_the_third_naming_it(damaged):
    path, bad = damaged
    ds = StreamingDataset(path, decode="bytes", shuffle=False, on_corrupt="skip", max_skipped=2)
    with pytest.raises(CorruptData, match="more than max_skipped=2") as e:
        list(ds)
    assert e.value.key == bad[2] and bad[2] in str(e.value)  # in order, the third damaged record
    assert [r["key"] for r in ds.skipped] == bad[:2]
    frac = StreamingDataset(path, decode="bytes", shuffle=False, on_corrupt="skip", max_skipped=0.1)
    assert len(list(frac)) == 30  # 10% of 30: 3 allowed
    with pytest.raises(CorruptData, match=r"max_skipped=0\.05"):
        list(StreamingDataset(path, decode="bytes", shuffle=False, on_corrupt="skip", max_skipped=0.05))


def test_bad_skip_options_are_refused(damaged):
    path, _ = damaged
    for kw, msg in [({"on_corrupt": "ignore"}, "on_corrupt"), ({"max_skipped": 3}, "needs on_corrupt"),
                    ({"on_corrupt": "skip", "max_skipped": 1.5}, "fraction"),
                    ({"on_corrupt": "skip", "max_skipped": -1}, ">= 0")]:
        with pytest.raises(UsageError, match=msg):
            StreamingDataset(path, **kw)


def test_a_mix_skips_with_source_keys(damaged, tmp_path):
    path, bad = damaged
    other = tmp_path / "copy"
    shutil.copytree(path, other)
    ds = StreamingDataset({str(path): 1.0, str(other): 1.0}, mix_by="repeat", decode="bytes", shuffle=False,
                          on_corrupt="skip", max_skipped=6)
    assert len(list(ds)) == 60
    assert sorted(r["key"] for r in ds.skipped) == sorted(f"{p}:{k}" for p in (path, other) for k in bad)


def test_loader_threads_skip_within_the_cap_and_raise_past_it(damaged):
    path, bad = damaged
    ds = PackedDataset(path, decode="bytes")
    loader = Loader(ds, batch_size=4, shuffle=True, seed=2, num_threads=2, collate=no_collate,
                    on_corrupt="skip", max_skipped=5)
    got = [b for batch in loader for b, _ in batch]
    assert len(got) == 30 and len(set(got)) == 27
    assert sorted(r["key"] for r in loader.skipped) == sorted(bad)
    assert all("CRC32C" in r["reason"] for r in loader.skipped)
    state = json.loads(json.dumps(loader.state_dict()))
    assert sorted(state["skipped"]) == sorted(int(r["index"]) for r in loader.skipped)
    strict = Loader(ds, batch_size=4, num_threads=1, collate=no_collate, on_corrupt="skip", max_skipped=2)
    with pytest.raises(LoaderError, match="more than max_skipped=2") as e:
        list(strict)
    assert bad[2] in str(e.value) and [r["key"] for r in strict.skipped] == bad[:2]
    with pytest.raises(LoaderError, match="CRC32C"):
        list(Loader(ds, batch_size=4, num_threads=2, collate=no_collate))  # raising stays the default

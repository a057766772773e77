"""StreamingDataset over field packs: dict samples with PackedDataset's options through real
DataLoader workers, padded batches, mixes of field packs, and the README's mid-epoch resume."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import packer
from packer.errors import UsageError
from tests.support.coco import make_coco
from tests.support.elastic import check_resumes

pytest.importorskip("pycocotools")

N = 10


def no_collate(batch):
    return batch


def assert_same(a: dict, b: dict) -> None:
    """Two field dicts hold the same fields and values (arrays, tensors, RLE lists, numbers)."""
    assert list(a) == list(b)
    for k in a:
        x, y = a[k], b[k]
        if isinstance(x, (np.ndarray, torch.Tensor)):
            assert type(x) is type(y) and x.shape == y.shape and (x == y).all(), k
        else:
            assert x == y, k


@pytest.fixture(scope="module")
def packs(tmp_path_factory):
    root = tmp_path_factory.mktemp("coco_stream")
    src = make_coco(root, n_images=N)
    out = {"lmdb": root / "out.lmdb", "records": root / "out.records"}
    packer.pack(root, out["lmdb"], coco=src["instances"], workers=0)
    packer.pack(root, out["records"], format="records", coco=src["instances"], workers=0, samples_per_shard=3)
    return out


@pytest.mark.parametrize("fmt", ["lmdb", "records"])
def test_dataloader_workers_yield_what_packed_dataset_reads(packs, fmt):
    ref = packer.PackedDataset(packs[fmt], decode="numpy", masks="decode")
    ds = packer.StreamingDataset(packs[fmt], decode="numpy", masks="decode", seed=3, block_size=4, batch_size=2)
    got = [s for batch in DataLoader(ds, batch_size=2, num_workers=2, collate_fn=no_collate) for s in batch]
    order = ds.order()
    assert sorted(order) == list(range(N)) and len(got) == N
    for position, sample in zip(order, got):
        assert_same(sample, ref[position])


def test_selected_fields_in_padded_batches_through_workers(packs):
    fields = ["image_id", "boxes", "labels", "masks"]
    ref = packer.PackedDataset(packs["records"], decode="bytes", fields=fields)
    ds = packer.StreamingDataset(packs["records"], fields=fields, shuffle=False, batch_size=4)
    assert ds.variable_fields == ["boxes", "labels", "masks"]
    loader = DataLoader(ds, batch_size=4, num_workers=2, collate_fn=ds.collate_fn(pad=True))
    position = 0
    for batch in loader:
        assert list(batch) == ["image_id", "boxes", "boxes_count", "labels", "labels_count", "masks", "masks_count"]
        for i, image_id in enumerate(batch["image_id"].tolist()):
            want = ref[position]
            n = len(want["boxes"])
            assert image_id == want["image_id"] and int(batch["boxes_count"][i]) == n == int(batch["masks_count"][i])
            assert np.array_equal(batch["boxes"][i, :n].numpy(), want["boxes"])
            assert not batch["boxes"][i, n:].any() and not batch["labels"][i, n:].any()
            assert batch["masks"][i] == want["masks"]  # RLE dicts cannot be padded: a list, with their counts
            position += 1
    assert position == N


@pytest.mark.parametrize("fmt", ["lmdb", "records"])
def test_a_mid_epoch_state_resumes_the_rest_of_the_epoch(packs, fmt):
    """The README's loop, with dict samples: a state saved at a step continues with exactly the
    samples the uninterrupted epoch had left."""
    def open_pass(state):
        ds = packer.StreamingDataset(packs[fmt], decode="bytes", fields=["image_id", "boxes"], seed=1,
                                     block_size=4, batch_size=2)
        if state is not None:
            ds.load_state_dict(state)
        ds.set_epoch(1)
        loader = DataLoader(ds, batch_size=2, num_workers=2, collate_fn=ds.collate_fn())
        return loader, lambda step: ds.state_dict(num_samples=(step + 1) * 2)

    assert len(set(check_resumes(open_pass))) == N


def test_a_mix_of_field_packs_adds_the_source_before_transform(packs):
    ref = {0: packer.PackedDataset(packs["lmdb"], decode="bytes", fields=["image_id", "labels"]),
           1: packer.PackedDataset(packs["records"], decode="bytes", fields=["image_id", "labels"])}
    ids = {s: {ref[s][i]["image_id"]: i for i in range(N)} for s in ref}
    ds = packer.StreamingDataset({str(packs["lmdb"]): 1, str(packs["records"]): 3}, decode="bytes",
                                 fields=["image_id", "labels"], epoch_size=12, seed=2, batch_size=3,
                                 transform=lambda s: {**s, "seen": s["source"]})
    got = [s for b in DataLoader(ds, batch_size=3, num_workers=2, collate_fn=no_collate) for s in b]
    assert len(got) == 12 and sorted(s["source"] for s in got) == [0] * 3 + [1] * 9
    for s in got:
        assert s["seen"] == s["source"]
        assert_same({k: s[k] for k in ("image_id", "labels")}, ref[s["source"]][ids[s["source"]][s["image_id"]]])


def test_field_options_that_do_not_apply_are_refused(packs, image_folder, tmp_path):
    packer.pack(image_folder, tmp_path / "img.lmdb", workers=0)
    with pytest.raises(UsageError, match="not both"):
        packer.StreamingDataset({str(packs["lmdb"]): 1, str(tmp_path / "img.lmdb"): 1})
    with pytest.raises(UsageError, match="label_map and target_transform"):
        packer.StreamingDataset({str(packs["lmdb"]): 1, str(packs["records"]): 1}, label_map={"cat1": 0})
    with pytest.raises(UsageError, match="target_transform"):
        packer.StreamingDataset(packs["lmdb"], target_transform=int)
    with pytest.raises(UsageError, match="apply to field packs"):
        packer.StreamingDataset(tmp_path / "img.lmdb", fields=["image"])
    with pytest.raises(UsageError, match="collate_fn is for field packs"):
        packer.StreamingDataset(tmp_path / "img.lmdb").collate_fn()

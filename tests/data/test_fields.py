"""Field packs on the training side: dict samples, field selection, masks, collate (lists and
padding), workers."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import packer
from packer.data.fields import collate_field, collate_fields, decode_masks
from packer.errors import UsageError
from tests.support.coco import make_coco

pytest.importorskip("pycocotools")


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    root = tmp_path_factory.mktemp("coco")
    src = make_coco(root, n_images=6)
    out = root / "out.lmdb"
    packer.pack(root, out, coco=src["instances"], workers=0, resize=packer.ResizeSpec(size=(32, 24), fit="stretch"))
    return out


def test_only_the_selected_fields_are_returned_in_their_order(pack):
    ds = packer.PackedDataset(pack, decode="tensor", fields=["labels", "image"])
    s = ds[1]
    assert list(s) == ["labels", "image"] and s["image"].shape == (3, 24, 32)
    with pytest.raises(UsageError, match="no field 'nope'"):
        packer.PackedDataset(pack, fields=["nope"])


def test_masks_decoded_one_per_box_also_for_no_boxes(pack):
    ds = packer.PackedDataset(pack, decode="bytes", fields=["boxes", "masks"], masks="decode")
    for s in ds:
        assert s["masks"].shape == (len(s["boxes"]), 24, 32) and s["masks"].dtype == np.uint8
    assert any(len(s["boxes"]) == 0 for s in ds)


@pytest.mark.parametrize("height, width, n", [(1, 1, 1), (3, 5, 2), (48, 64, 6), (7, 1, 3), (1, 9, 1)])
def test_decoded_masks_are_pycocotools_masks_in_c_order(height, width, n):
    from pycocotools import mask as mask_util

    masks = (np.random.default_rng(n).random((n, height, width)) < 0.4).astype(np.uint8)
    out = decode_masks([mask_util.encode(np.asfortranarray(m)) for m in masks], height, width)
    assert out.shape == (n, height, width) and out.flags.c_contiguous and np.array_equal(out, masks)


def test_collate_stacks_fixed_fields_and_lists_variable_ones(pack):
    ds = packer.PackedDataset(pack, decode="tensor", fields=["image", "image_id", "orig_size", "boxes", "masks"])
    batch = collate_fields([ds[i] for i in range(4)])
    assert batch["image"].shape == (4, 3, 24, 32) and batch["image_id"].dtype == torch.int64
    assert batch["orig_size"].shape == (4, 2)
    assert isinstance(batch["boxes"], list) and len(batch["boxes"]) == 4
    assert isinstance(batch["masks"], list)


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_dataloader_workers_read_field_packs(pack, context):
    ds = packer.PackedDataset(pack, decode="tensor", fields=["image", "image_id", "boxes"])
    loader = torch.utils.data.DataLoader(ds, batch_size=3, num_workers=2, collate_fn=collate_fields,
                                         multiprocessing_context=context)
    ids = [int(v) for batch in loader for v in batch["image_id"]]
    assert ids == [ds[i]["image_id"] for i in range(len(ds))]


def test_a_transform_takes_the_dict_and_image_packs_refuse_field_options(pack, image_folder, tmp_path):
    ds = packer.PackedDataset(pack, decode="bytes", fields=["boxes"], transform=lambda s: len(s["boxes"]))
    assert isinstance(ds[1], int)
    with pytest.raises(UsageError, match="target_transform"):
        packer.PackedDataset(pack, target_transform=int)
    packer.pack(image_folder, tmp_path / "img.lmdb", workers=0)
    with pytest.raises(UsageError, match="field packs"):
        packer.PackedDataset(tmp_path / "img.lmdb", fields=["image"])


def test_padded_batches_hold_each_sample_and_its_count(pack):
    ds = packer.PackedDataset(pack, decode="tensor", masks="decode")
    samples = [ds[i] for i in range(4)]
    batch = ds.collate_fn(pad=True)(samples)
    n = [len(s["boxes"]) for s in samples]
    assert batch["boxes"].shape == (4, max(n), 4) and batch["boxes"].dtype == torch.float32
    assert batch["boxes_count"].tolist() == n and batch["masks_count"].tolist() == n
    assert batch["masks"].shape == (4, max(n), 24, 32)  # one image size: masks pad too
    for i, s in enumerate(samples):
        for name in ("boxes", "labels", "iscrowd", "masks"):
            assert np.array_equal(batch[name][i, :n[i]].numpy(), s[name])
            assert not batch[name][i, n[i]:].any()
    valid = torch.arange(max(n)) < batch["boxes_count"][:, None]  # the mask the docs give
    assert int(valid.sum()) == sum(n)


def test_variable_fields_stay_lists_even_when_a_batch_agrees(pack):
    ds = packer.PackedDataset(pack, decode="bytes", fields=["boxes", "orig_size"])
    same = [ds[0], ds[0]]
    assert isinstance(ds.collate_fn()(same)["boxes"], list)
    assert ds.collate_fn()(same)["orig_size"].shape == (2, 2)
    assert collate_fields(same)["boxes"].shape == (2, 3, 4)  # without variable=: decided by the values
    assert list(ds.collate_fn(pad=True)(same)) == ["boxes", "boxes_count", "orig_size"]


def test_numbers_stack_exactly_and_a_count_never_replaces_a_field():
    batch = collate_fields([{"x": 0.1, "n": 2**40, "b": True}, {"x": 1 / 3, "n": -1, "b": False}])
    assert batch["x"].dtype == torch.float64 and batch["x"].tolist() == [0.1, 1 / 3]
    assert batch["n"].dtype == torch.int64 and batch["n"].tolist() == [2**40, -1]
    assert batch["b"].dtype == torch.bool
    with pytest.raises(UsageError, match="boxes_count"):
        collate_fields([{"boxes": np.zeros((1, 4)), "boxes_count": 1}, {"boxes": np.zeros((2, 4)), "boxes_count": 2}],
                       pad=True)


@given(st.lists(st.integers(0, 5), min_size=1, max_size=6), st.sampled_from(["float32", "int64", "uint8"]),
       st.booleans())
def test_padding_keeps_every_row_and_zeroes_the_rest(lengths, dtype, as_list):
    rng = np.random.default_rng(sum(lengths))
    values = [rng.integers(1, 100, (n, 3)).astype(dtype) for n in lengths]
    if as_list and dtype == "int64":  # a label list (the ``labels`` type) pads as int64
        values = [v[:, 0].tolist() for v in values]
    padded, count = collate_field(values, variable=True, pad=True)
    assert count.tolist() == lengths and padded.shape[:2] == (len(lengths), max(lengths))
    for i, v in enumerate(values):
        assert np.array_equal(padded[i, :lengths[i]].numpy(), np.asarray(v, dtype=dtype))
        assert not padded[i, lengths[i]:].any()

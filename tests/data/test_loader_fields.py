"""packer.Loader over field packs: image fields in reused buffers when a batch shares one size,
else lists of CHW uint8 tensors; other fields as collate_fields batches them; exact resume."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import packer
from packer.data.fields import collate_fields
from tests.support.coco import make_coco
from tests.support.elastic import check_resumes

pytest.importorskip("pycocotools")

N = 9


@pytest.fixture(scope="module")
def packs(tmp_path_factory):
    root = tmp_path_factory.mktemp("coco_loader")
    src = make_coco(root, n_images=N)
    out = {"sizes": root / "sizes.lmdb", "fixed": root / "fixed.records"}
    packer.pack(root, out["sizes"], coco=src["instances"], workers=0)  # images of several sizes
    packer.pack(root, out["fixed"], format="records", coco=src["instances"], workers=0, samples_per_shard=4,
                resize=packer.ResizeSpec(size=(32, 24), fit="stretch"))
    return out


def assert_batch(batch: dict, want: dict) -> None:
    assert list(batch) == list(want)
    for k, v in want.items():
        got = batch[k]
        if isinstance(v, torch.Tensor):
            assert isinstance(got, torch.Tensor) and got.dtype == v.dtype and torch.equal(got, v), k
        else:
            assert isinstance(got, list) and len(got) == len(v), k
            for g, w in zip(got, v):
                assert (np.array_equal(g, w) if isinstance(w, (np.ndarray, torch.Tensor)) else g == w), k


@pytest.mark.parametrize("decode", ["tensor", "pil"])
def test_images_of_one_size_fill_reused_buffers_and_fields_batch_as_collate_fields(packs, decode):
    ds = packer.PackedDataset(packs["fixed"], decode=decode, masks="decode")
    ref = packer.PackedDataset(packs["fixed"], decode="tensor", masks="decode")
    loader = packer.Loader(ds, batch_size=4, num_threads=2, pin_memory=False)
    for epoch in range(3):
        for k, batch in enumerate(loader):
            idx = range(4 * k, min(4 * k + 4, N))
            assert_batch(batch, collate_fields([ref[i] for i in idx], variable=ref.variable_fields))
            assert batch["image"].shape == (len(idx), 3, 24, 32)
            assert isinstance(batch["boxes"], list) and isinstance(batch["masks"], list)
    assert loader.pool.allocated <= loader.prefetch + 4  # buffers let go are reused, not reallocated


@pytest.mark.parametrize("decode", ["tensor", "numpy", "pil"])
def test_images_of_several_sizes_are_a_list_of_chw_uint8_tensors(packs, decode):
    ds = packer.PackedDataset(packs["sizes"], decode=decode)
    ref = packer.PackedDataset(packs["sizes"], decode="tensor")
    batches = list(packer.Loader(ds, batch_size=4, num_threads=3, chunk=1, pin_memory=False))
    got = [img for b in batches for img in b["image"]]
    assert len(got) == N
    for i, img in enumerate(got):
        assert img.dtype == torch.uint8 and torch.equal(img, ref[i]["image"])
    assert [int(v) for b in batches for v in b["image_id"]] == [ref[i]["image_id"] for i in range(N)]


def test_a_user_collate_gets_the_dicts(packs):
    ds = packer.PackedDataset(packs["sizes"], decode="bytes", fields=["image_id", "boxes"])
    batches = list(packer.Loader(ds, batch_size=4, num_threads=2, collate=ds.collate_fn(pad=True)))
    assert [list(b) for b in batches] == [["image_id", "boxes", "boxes_count"]] * 3
    assert sum(int(b["boxes_count"].sum()) for b in batches) == sum(len(ds[i]["boxes"]) for i in range(N))


def test_a_mid_epoch_state_resumes_the_rest_of_the_epoch(packs):
    ds = packer.PackedDataset(packs["sizes"], decode="tensor", fields=["image", "image_id", "boxes"])

    def open_pass(state):
        loader = packer.Loader(ds, batch_size=2, shuffle=True, seed=4, num_threads=2, pin_memory=False)
        if state is not None:
            loader.load_state_dict(state)
        loader.set_epoch(1)
        return loader, lambda step: loader.state_dict()

    assert sorted(check_resumes(open_pass)) == sorted(ds[i]["image_id"] for i in range(N))

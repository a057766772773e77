"""``tv_tensors=True``: torchvision's ``transforms.v2`` move boxes and masks with the pixels.

torchvision's wheels are built for one torch release, and none installs beside the main
environment's torch: the tests that need it skip there, naming why, and run in a venv with a
matching pair (docs/fields.md, "tv_tensors", says how). The error without torchvision is tested
where it is missing. The pack is ``pack_box_coco``'s: each box is a white rectangle on black, so
a transformed box can be checked against the transformed pixels.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import packer
from packer.data import DecodeResizeCrop
from packer.errors import UsageError
from tests.support.coco import BOX_IMAGES, pack_box_coco

pytest.importorskip("pycocotools")

try:
    from torchvision import tv_tensors
    from torchvision.transforms import v2
    MISSING = None
except (ImportError, RuntimeError) as e:  # RuntimeError: a torchvision built for another torch
    MISSING = (f"torchvision is not importable beside torch {torch.__version__} ({type(e).__name__}: {e}); "
               "run this file in a venv with torch and a matching torchvision (docs/fields.md, tv_tensors)")
needs_torchvision = pytest.mark.skipif(MISSING is not None, reason=MISSING or "")


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    return pack_box_coco(tmp_path_factory.mktemp("boxes"))


@pytest.mark.skipif(MISSING is None, reason="torchvision is installed here")
def test_without_torchvision_tv_tensors_is_a_usage_error_naming_it(pack):
    with pytest.raises(UsageError, match="tv_tensors=True needs torchvision"):
        packer.PackedDataset(pack, tv_tensors=True)
    with pytest.raises(UsageError, match="tv_tensors=True needs torchvision"):
        packer.StreamingDataset(pack, tv_tensors=True)


def test_tv_tensors_options_that_cannot_hold_are_refused(pack, image_folder, tmp_path):
    with pytest.raises(UsageError, match="decode='bytes'"):
        packer.PackedDataset(pack, decode="bytes", tv_tensors=True)
    with pytest.raises(UsageError, match="leave masks unset"):
        packer.PackedDataset(pack, masks="rle", tv_tensors=True)
    packer.pack(image_folder, tmp_path / "img.lmdb", workers=0)
    with pytest.raises(UsageError, match="apply to field packs"):
        packer.PackedDataset(tmp_path / "img.lmdb", tv_tensors=True)


def white_inside(image: torch.Tensor, box: torch.Tensor, margin: int = 2) -> bool:
    x0, y0, x1, y1 = (int(round(float(v))) for v in box)
    if x1 - x0 <= 2 * margin or y1 - y0 <= 2 * margin:  # (a box cropped to a sliver: nothing inside)
        return True
    return bool((image[:, y0 + margin:y1 - margin, x0 + margin:x1 - margin] > 200).all())


def dark_outside(image: torch.Tensor, boxes: torch.Tensor, margin: int = 2) -> bool:
    outside = torch.ones(image.shape[-2:], dtype=torch.bool)
    for x0, y0, x1, y1 in boxes.tolist():
        outside[max(0, int(y0) - margin):int(np.ceil(y1)) + margin, max(0, int(x0) - margin):int(np.ceil(x1)) + margin] = False
    return bool((image[:, outside] < 50).all())


@needs_torchvision
def test_samples_are_image_bounding_boxes_and_mask(pack):
    ds = packer.PackedDataset(pack, tv_tensors=True)
    for i, (w, h, boxes) in enumerate(BOX_IMAGES):
        s = ds[i]
        assert type(s["image"]) is tv_tensors.Image and s["image"].shape == (3, h, w)
        assert type(s["boxes"]) is tv_tensors.BoundingBoxes and s["boxes"].canvas_size == (h, w)
        assert s["boxes"].format == tv_tensors.BoundingBoxFormat.XYXY
        assert s["boxes"].tolist() == [list(map(float, b[:4])) for b in boxes]
        assert type(s["masks"]) is tv_tensors.Mask and s["masks"].shape == (len(boxes), h, w)
        assert s["labels"].dtype == torch.int64 and isinstance(s["image_id"], int)
        assert dark_outside(s["image"], s["boxes"]) and all(white_inside(s["image"], b) for b in s["boxes"])


@needs_torchvision
def test_a_horizontal_flip_flips_boxes_and_masks_with_the_image(pack):
    ds = packer.PackedDataset(pack, tv_tensors=True)
    flip = v2.RandomHorizontalFlip(p=1)
    for i, (w, h, boxes) in enumerate(BOX_IMAGES):
        s = ds[i]
        f = flip(s)
        assert torch.equal(f["image"], s["image"].flip(-1))
        assert torch.equal(f["masks"], s["masks"].flip(-1))
        want = [[w - x1, y0, w - x0, y1] for x0, y0, x1, y1, _ in boxes]
        assert type(f["boxes"]) is tv_tensors.BoundingBoxes and f["boxes"].tolist() == want
        assert torch.equal(f["labels"], s["labels"]) and f["image_id"] == s["image_id"]
        assert dark_outside(f["image"], f["boxes"]) and all(white_inside(f["image"], b) for b in f["boxes"])


@needs_torchvision
def test_a_random_resized_crop_crops_boxes_and_masks_with_the_image(pack):
    ds = packer.PackedDataset(pack, tv_tensors=True, transform=v2.RandomResizedCrop((40, 40), scale=(0.3, 1.0)))
    sanitize = v2.SanitizeBoundingBoxes()
    checked = 0
    for seed in range(8):
        for i in range(len(ds)):
            torch.manual_seed(seed)
            s = ds[i]
            assert s["image"].shape == (3, 40, 40) and s["boxes"].canvas_size == (40, 40)
            assert dark_outside(s["image"], s["boxes"])
            kept = sanitize(s)  # boxes cut to nothing dropped, with their masks and labels
            assert len(kept["boxes"]) == len(kept["masks"]) == len(kept["labels"]) <= len(s["boxes"])
            for box, mask in zip(s["boxes"], s["masks"]):
                assert white_inside(s["image"], box)
                ys, xs = torch.nonzero(mask, as_tuple=True)
                if len(xs):  # the mask's extent is the box's (nearest-neighbour resize: within a pixel or two)
                    extent = torch.tensor([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1], dtype=torch.float32)
                    assert torch.allclose(extent, box, atol=3.0), (seed, i, extent, box)
                    checked += 1
    assert checked > 20


@needs_torchvision
def test_streaming_workers_and_the_loader_carry_tv_tensors(pack):
    sd = packer.StreamingDataset(pack, tv_tensors=True, transform=v2.RandomHorizontalFlip(p=1), shuffle=False,
                                 batch_size=2)
    loader = DataLoader(sd, batch_size=2, num_workers=2, collate_fn=sd.collate_fn())
    got = [b for batch in loader for b in batch["boxes"]]
    assert all(type(b) is tv_tensors.BoundingBoxes for b in got)
    assert [b.tolist() for b in got] == [[[w - x1, y0, w - x0, y1] for x0, y0, x1, y1, _ in boxes]
                                         for w, h, boxes in BOX_IMAGES]
    ds = packer.PackedDataset(pack, tv_tensors=True, transform=v2.Resize((32, 32)))
    batches = list(packer.Loader(ds, batch_size=3, num_threads=2))
    assert batches[0]["image"].shape == (3, 3, 32, 32)  # one size: the reused uint8 buffer
    assert all(type(b) is tv_tensors.BoundingBoxes and b.canvas_size == (32, 32) for b in batches[0]["boxes"])


@needs_torchvision
def test_a_decode_that_changes_the_size_is_refused_naming_why(pack):
    ds = packer.PackedDataset(pack, tv_tensors=True, decode=DecodeResizeCrop(32, 32))
    with pytest.raises(UsageError, match="boxes and masks are in the stored pixels"):
        ds[0]

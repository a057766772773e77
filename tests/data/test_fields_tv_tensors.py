"""``tv_tensors=True``: torchvision's ``transforms.v2`` move boxes, masks and keypoints with the pixels.

torchvision's wheels are built for one torch release, and none installs beside the main
environment's torch: the tests that need it skip there, naming why, and run in a venv with a
matching pair (docs/fields.md, "tv_tensors", says how). The error without torchvision is tested
where it is missing. The pack is ``pack_box_coco``'s: each box is a white rectangle on black, so
a transformed box can be checked against the transformed pixels; in its keypoints variant each
object's keypoints are its box's corners, so they can be checked against the transformed boxes.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import packer
from packer.data import DecodeResizeCrop
from packer.errors import UsageError
from tests.support.coco import BOX_IMAGES, BOX_KEYPOINT_CATEGORIES, pack_box_coco

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


@pytest.fixture(scope="module")
def keypoints_pack(tmp_path_factory):
    return pack_box_coco(tmp_path_factory.mktemp("keypoints"), keypoints=True)


def corners(boxes: torch.Tensor) -> torch.Tensor:
    """The four corners of each xyxy box as keypoints: (N, 4, 2)."""
    x0, y0, x1, y1 = boxes.unbind(-1)
    return torch.stack([torch.stack(p, -1) for p in ((x0, y0), (x1, y0), (x1, y1), (x0, y1))], 1)


@needs_torchvision
def test_keypoints_are_tv_keypoints_on_the_image_canvas_with_their_visibility(keypoints_pack):
    ds = packer.PackedDataset(keypoints_pack, tv_tensors=True)
    for i, (w, h, boxes) in enumerate(BOX_IMAGES):
        s = ds[i]
        kp, vis = s["keypoints"], s["keypoints_visibility"]
        assert type(kp) is tv_tensors.KeyPoints and kp.canvas_size == (h, w) and kp.shape == (len(boxes), 5, 2)
        assert vis.dtype == torch.int64 and vis.shape == (len(boxes), 5)
        for k, (*_, cat) in enumerate(boxes):
            named = cat in BOX_KEYPOINT_CATEGORIES  # category 18 names none: zeros, not labelled
            assert vis[k].tolist() == ([2, 2, 2, 2, 0] if named else [0] * 5)
            want = corners(s["boxes"][k:k + 1].as_subclass(torch.Tensor))[0] if named else torch.zeros(4, 2)
            assert torch.equal(kp[k, :4].as_subclass(torch.Tensor), want) and not kp[k, 4].any()
        assert s["num_keypoints"].tolist() == [4 if b[4] in BOX_KEYPOINT_CATEGORIES else 0 for b in boxes]
    assert "keypoints_visibility" in ds.variable_fields
    plain = packer.PackedDataset(keypoints_pack, decode="tensor")[0]["keypoints"]  # without tv_tensors: x, y, v
    assert type(plain) is np.ndarray and plain.shape == (3, 5, 3) and plain.dtype == np.float32


@needs_torchvision
def test_a_resize_and_a_flip_move_keypoints_with_the_boxes(keypoints_pack):
    """A resize scales keypoints by the boxes' factors, exactly; a horizontal flip takes a box's
    x to ``W - x`` and a keypoint's to ``W - 1 - x`` (torchvision's convention: a keypoint is a
    pixel's position, a box edge the boundary between pixels)."""
    ds = packer.PackedDataset(keypoints_pack, tv_tensors=True)
    resize, flip = v2.Resize((30, 50)), v2.RandomHorizontalFlip(p=1)
    checked = 0
    for i, (w, h, boxes) in enumerate(BOX_IMAGES):
        s = ds[i]
        named = torch.tensor([b[4] in BOX_KEYPOINT_CATEGORIES for b in boxes], dtype=torch.bool)
        r = resize(s)
        assert type(r["keypoints"]) is tv_tensors.KeyPoints and r["keypoints"].canvas_size == (30, 50)
        assert torch.equal(r["keypoints"][named, :4].as_subclass(torch.Tensor),
                           corners(r["boxes"][named].as_subclass(torch.Tensor)))
        assert torch.equal(r["keypoints_visibility"], s["keypoints_visibility"])
        f = flip(s)
        fb = f["boxes"].as_subclass(torch.Tensor)
        assert fb.tolist() == [[w - x1, y0, w - x0, y1] for x0, y0, x1, y1, _ in boxes]
        got = f["keypoints"][named, :4].as_subclass(torch.Tensor)
        want = corners(fb[named])[:, [1, 0, 3, 2]] - torch.tensor([1.0, 0.0])  # left and right corners swap
        assert torch.equal(got, want)
        checked += int(named.sum())
    assert checked >= 5


@needs_torchvision
def test_padded_batches_carry_keypoints_and_their_visibility(keypoints_pack):
    ds = packer.PackedDataset(keypoints_pack, tv_tensors=True, fields=["image", "boxes", "keypoints"])
    batch = next(iter(DataLoader(ds, batch_size=len(BOX_IMAGES), collate_fn=ds.collate_fn(pad=True))))
    n = [len(b[2]) for b in BOX_IMAGES]
    assert batch["keypoints"].shape == (len(n), max(n), 5, 2) and batch["keypoints_count"].tolist() == n
    assert batch["keypoints_visibility"].shape == (len(n), max(n), 5)
    assert batch["keypoints_visibility_count"].tolist() == n
    for i in range(len(n)):
        assert torch.equal(batch["keypoints"][i, :n[i]], ds[i]["keypoints"].as_subclass(torch.Tensor))
        assert not batch["keypoints"][i, n[i]:].any()

"""``packer inspect``'s contact sheet of a detection field pack: each box outlined where it lies
on its thumbnail, in its label's colour, and nothing drawn anywhere else."""
from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from packer.commands.inspection import BOX_COLOURS, render_grid
from tests.support.coco import BOX_IMAGES, CATEGORY_IDS, pack_box_coco

pytest.importorskip("pycocotools")

TILE, CAPTION, COLS = 160, 28, 3  # render_grid's tile and caption heights; 3 columns for 5 samples


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    return pack_box_coco(tmp_path_factory.mktemp("boxes"))


def sheet(pack, path, **kw) -> np.ndarray:
    assert render_grid(pack, path, count=len(BOX_IMAGES), **kw) == list(range(len(BOX_IMAGES)))
    return np.asarray(Image.open(path).convert("RGB"))


def outlines():
    """(sample, label, the outline's sheet pixels) of every box, placed independently of
    render_grid: each thumbnail centred in its tile, shrunk only when larger than the tile
    (320 x 200 -> 160 x 100), each box's edge pixels scaled with it."""
    for k, (w, h, boxes) in enumerate(BOX_IMAGES):
        s = min(1.0, TILE / max(w, h))
        ax = (k % COLS) * TILE + (TILE - int(w * s)) // 2
        ay = (k // COLS) * (TILE + CAPTION) + (TILE - int(h * s)) // 2
        for x0, y0, x1, y1, cat in boxes:
            left, top = ax + int(x0 * s), ay + int(y0 * s)
            right, bottom = ax + int(x1 * s) - 1, ay + int(y1 * s) - 1
            ys = np.r_[np.arange(top, bottom + 1), np.arange(top, bottom + 1), [top] * (right - left + 1),
                       [bottom] * (right - left + 1)]
            xs = np.r_[[left] * (bottom - top + 1), [right] * (bottom - top + 1), np.arange(left, right + 1),
                       np.arange(left, right + 1)]
            yield k, CATEGORY_IDS.index(cat), (ys, xs)


def test_the_sheet_outlines_each_box_where_it_lies_and_nowhere_else(pack, tmp_path):
    drawn = sheet(pack, tmp_path / "drawn.png")
    plain = sheet(pack, tmp_path / "plain.png", boxes=False)
    changed = (drawn != plain).any(-1)
    expected = np.zeros(changed.shape, dtype=bool)
    count = 0
    for _, label, ring in outlines():
        assert changed[ring].all()  # every edge pixel drawn over the (white) box
        assert (drawn[ring] == BOX_COLOURS[label % len(BOX_COLOURS)]).all()
        expected[ring] = True
        count += 1
    assert count == sum(len(b) for _, _, b in BOX_IMAGES) and not (changed & ~expected).any()


def test_labels_are_written_inside_their_boxes_tiles(pack, tmp_path):
    boxes = sheet(pack, tmp_path / "boxes.png")
    named = sheet(pack, tmp_path / "named.png", labels=True)
    changed = (boxes != named).any(-1)
    assert changed.any()
    rows = np.nonzero(changed.any(1))[0]
    assert all((r % (TILE + CAPTION)) < TILE for r in rows)  # on the thumbnails, never in the captions


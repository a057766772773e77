"""``packer demo``: the main job end to end on generated images, no download needed."""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from packer.commands.pack_images import pack_images
from packer.conversion.options import RunOptions
from packer.synth import make_image_folder

__all__ = ["run_demo"]


def run_demo(workdir: str | os.PathLike, *, count: int = 200, workers: int | None = None) -> dict[str, Any]:
    """Generate an ImageFolder of ``count`` JPEGs, pack it to LMDB, read it back with
    ``PackedDataset`` in a DataLoader, and return what was made and the read throughput."""
    from torch.utils.data import DataLoader

    from packer.data.datasets import PackedDataset

    workdir = Path(workdir)
    src = workdir / "images"
    out = workdir / "images.lmdb"
    if not src.exists():
        make_image_folder(src, count=count, classes=4, seed=0)
    report = pack_images(src, out, format="lmdb", run_options=RunOptions(workers=workers, overwrite=True))
    ds = PackedDataset(out, decode="tensor")
    loader = DataLoader(ds, batch_size=32, num_workers=0, collate_fn=lambda batch: batch)
    t = time.perf_counter()
    n = sum(len(b) for b in loader)
    rate = n / (time.perf_counter() - t)
    image, label = ds[0]
    return {"source": str(src), "output": str(out), "samples": report.count, "classes": ds.classes,
            "pack": report.summary(), "read_samples_per_s": rate,
            "first": {"key": ds.keys[0], "shape": list(image.shape), "dtype": str(image.dtype),
                      "label": label}}

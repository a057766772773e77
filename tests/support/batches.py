"""The dataset the batch-buffer tests read (``packer.data.batch_memory``)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from torch.utils.data import Subset

from packer import PackedDataset
from packer.commands.pack_images import pack_images
from packer.data import DecodeResizeCrop
from packer.conversion.options import RunOptions

#: the batch-buffer tests need Linux's memfd_create
needs_memfd = pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="needs memfd_create (Linux)")


def batch_dataset(image_folder: Path, root: Path) -> Subset:
    """The 24 fixture images packed as LMDB and read 8 times as 224x224 uint8 tensors: batches
    of 8 are 1.2 MB (above ``batch_memory.MIN_BYTES``), 24 of them, 12 per worker of 2 (more
    than a worker's ``MAX_BUFFERS``)."""
    out = root / "ds"
    pack_images(image_folder, out, format="lmdb", run_options=RunOptions(workers=0))
    return Subset(PackedDataset(out, decode=DecodeResizeCrop(256, 224)), list(range(24)) * 8)

"""``packer index PATH...``: DALI ``.idx`` files for TFRecord files, each PATH under a claim."""
from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Sequence

from packer.claim import claim_output
from packer.formats.records import index_path, index_tfrecords

__all__ = ["index_paths"]


def index_paths(paths: Sequence[str | os.PathLike], *, break_lock: bool = False) -> list[tuple[Path, int]]:
    """Index every TFRecord file of ``paths`` (see ``index_tfrecords``) while holding a claim on
    each: a folder is claimed as a whole (``FOLDER.lock``, the claim ``to-records`` takes on
    it), a file through its index (``FILE.idx.lock``). Indexes are rebuilt from scratch, so a
    dead holder's claim is taken over; a live one only with ``break_lock``."""
    with contextlib.ExitStack() as stack:
        for p in map(Path, paths):
            stack.enter_context(claim_output(p if p.is_dir() else index_path(p), takeover=True,
                                             break_lock=break_lock))
        return index_tfrecords(paths)

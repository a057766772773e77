"""The per-sample request a batch sampler may send to a dataset instead of a plain index.

``MultigridBatchSampler`` yields lists of ``ClipRequest``; the video datasets
(``FrameDataset``, ``PackedVideoDataset``) accept either an ``int`` or a ``ClipRequest`` in
``__getitem__`` and then sample ``num_frames`` frames ``frame_interval`` apart and crop to
``crop_size`` (random-resized crop in training), so one plain ``DataLoader(dataset,
batch_sampler=...)`` yields batches whose shape changes batch by batch.

``epoch`` travels with the request because a ``DataLoader`` with ``persistent_workers=True``
keeps its workers' copies of the dataset for the whole run: ``dataset.set_epoch()`` in the
main process never reaches them, so a seeded dataset would draw the same clips (offsets and
crops) every epoch. The sampler knows the epoch; with it in the key, the draws of a seeded
dataset follow the sampler's ``set_epoch`` whatever the workers.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

__all__ = ["ClipRequest", "split_request"]


class ClipRequest(NamedTuple):
    """Fetch sample ``index`` as a clip of ``num_frames`` x ``crop_size``^2 (None = dataset default);
    ``epoch`` (None = the dataset's own ``set_epoch``) picks a seeded dataset's draws."""

    index: int
    num_frames: Optional[int] = None
    frame_interval: Optional[int] = None
    crop_size: Optional[int] = None
    epoch: Optional[int] = None


def split_request(key: "int | ClipRequest") -> ClipRequest:
    """Normalise a dataset key: an int becomes a request with every field left to the dataset."""
    if isinstance(key, ClipRequest):
        return key
    if isinstance(key, tuple) and len(key) in (4, 5):  # DataLoader may hand tuples back as tuples
        return ClipRequest(*key)
    return ClipRequest(int(key))

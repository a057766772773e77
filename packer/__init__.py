"""packer: pre-decode, pre-resize and pack datasets offline; stream them back fast."""
from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__", "PackedDataset", "StreamingDataset", "PackerError", "FrameDataset",
           "PackedVideoDataset", "DevicePrefetcher", "Loader"]

from packer.errors import PackerError


def __getattr__(name: str):
    # The training-side classes import torch; load them on first use so the CLI starts fast.
    if name == "PackedDataset":
        from packer.data.datasets import PackedDataset

        return PackedDataset
    if name == "StreamingDataset":
        from packer.data.streaming import StreamingDataset

        return StreamingDataset
    if name in ("FrameDataset", "PackedVideoDataset"):
        from packer.data import video_datasets as video

        return getattr(video, name)
    if name == "Loader":
        from packer.data.loader import Loader

        return Loader
    if name == "DevicePrefetcher":
        from packer.data.prefetch import DevicePrefetcher

        return DevicePrefetcher
    raise AttributeError(f"module 'packer' has no attribute {name!r}")

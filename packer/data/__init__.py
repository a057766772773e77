"""Training side: datasets over packed outputs. Never imports the conversion side."""
from .datasets import PackedDataset
from .video import FrameDataset, PackedVideoDataset

__all__ = ["PackedDataset", "FrameDataset", "PackedVideoDataset"]

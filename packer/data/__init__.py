"""Training side: datasets over packed outputs. Never imports the conversion side."""
from .datasets import PackedDataset
from .streaming import StreamingDataset
from .video import FrameDataset, PackedVideoDataset

__all__ = ["PackedDataset", "StreamingDataset", "FrameDataset", "PackedVideoDataset"]

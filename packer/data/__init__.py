"""Training side: datasets over packed outputs. Never imports the conversion side."""
from .datasets import PackedDataset
from .streaming import StreamingDataset

__all__ = ["PackedDataset", "StreamingDataset"]

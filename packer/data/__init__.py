"""Training side: datasets over packed outputs. Never imports the conversion side."""
from .datasets import PackedDataset
from .prefetch import DevicePrefetcher, uint8_collate

__all__ = ["PackedDataset", "DevicePrefetcher", "uint8_collate"]

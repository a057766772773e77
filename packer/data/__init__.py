"""Training side: datasets over packed outputs. Never imports the conversion side."""
from .datasets import PackedDataset

__all__ = ["PackedDataset"]

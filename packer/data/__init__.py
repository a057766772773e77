"""Training side: datasets over packed outputs. Never imports the conversion side."""
from .cache import DeviceCache
from .datasets import PackedDataset
from .loader import Loader, LoaderError
from .normalize import IMAGENET_MEAN, IMAGENET_STD
from .prefetch import DevicePrefetcher, uint8_collate
from .streaming import StreamingDataset
from .transforms import DecodeResizeCrop, PilResizeCrop
from .video import FrameDataset, PackedVideoDataset

__all__ = ["PackedDataset", "Loader", "LoaderError", "StreamingDataset", "FrameDataset", "PackedVideoDataset", "DevicePrefetcher",
           "DeviceCache", "uint8_collate", "DecodeResizeCrop", "PilResizeCrop", "IMAGENET_MEAN",
           "IMAGENET_STD"]
